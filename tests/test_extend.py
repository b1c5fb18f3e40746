"""One place to extend: a decoder of a new family, with a new step kind and its own visualizer,
defined in one module (here: this test) appears everywhere the app lists decoders; a sampler
rule declared in one class (here: this test) joins the sampling chain.

The test decoder is greedy decoding that records, at each step, a "tally" of its top candidate
token ids: a step kind no built-in decoder has; its citation lives on its class. The test rule is
top-a (keep the tokens with p >= a * p_max²). Nothing outside this file names either; the fixtures
remove them from every registry afterwards, so other tests see the built-in set only.
"""

from __future__ import annotations

import html
import json
from typing import Any, Iterator

import plotly.graph_objects as go
import pytest
import torch

import decoders.processors as P
import visualizers as V
from decoders.base import (FAMILY_INFO, REGISTRY, Context, Decoder, Float, Int, Params, declare_family, family_of,
                           forget_family, register, unregister)
from decoders.citation import Paper
from playground.core.trace import STEP_KINDS, Step, Trace, declare_step_kind, forget_step_kind, token_id_keys

NAME, FAMILY, KIND = "tally_greedy", "tally", "tally"


class TallyGreedy(Decoder):
    """Greedy decoding that records its top candidates at every step as a ``tally`` step."""

    name = NAME
    family = FAMILY
    kind = "causal"
    step_kind = KIND
    params = Params(width=Int(3, 1, 8, "candidates recorded per step"))
    reference = "none: a test decoder"
    papers = (Paper("The tally test decoder", "https://example.org/tally"),)
    description = "greedy, recording its top candidates per step"

    def run(self, ctx: Context) -> Iterator[Step]:
        ids = list(ctx.prompt_ids)
        for _ in range(ctx.max_new_tokens):
            ctx.check_cancel()
            logits = ctx.target.forward(ids).logits[0, -1]
            top = torch.topk(logits, ctx.params["width"]).indices.tolist()
            ids.append(top[0])
            # 'candidates_ids' is declared as a token-id key of the kind: a replay shows their text
            yield Step(KIND, [top[0]], tally={"candidate_ids": top, "scores": [round(float(logits[t]), 4) for t in top]})


def tally_html(trace: dict[str, Any], step: int) -> str:
    """The step's candidates as text (escaped: tokens may hold markup)."""
    s = trace["steps"][step]
    texts = [trace.get("tokens", {}).get(str(t), "?") for t in s["tally"]["candidate_ids"]]
    return "<ol>" + "".join(f"<li>{html.escape(t)}</li>" for t in texts) + "</ol>"


def tally_run_figure(trace: dict[str, Any]) -> go.Figure:
    """The top candidate's score at every step."""
    return go.Figure(go.Scatter(y=[s["tally"]["scores"][0] for s in trace["steps"]]))


@pytest.fixture()
def tally():
    """Declare the family, the step kind, the decoder and its plots; remove them all afterwards."""
    import decoders  # noqa: F401 - the built-in families first, as the app has them

    # the family says how its decoders honour forced tokens: playground.force keeps no list
    declare_family(FAMILY, "Tally decoding", primer="Greedy with its candidates kept.", force_mode="view")
    declare_step_kind(KIND, "the top candidates of every step (ids and scores)", id_keys=("candidate_ids",))
    register(TallyGreedy)
    V.step_plot(KIND, "Tally", html=True, metric="probability")(tally_html)
    V.run_plot("Top score over the run", kind=KIND)(tally_run_figure)
    try:
        yield TallyGreedy
    finally:
        V.unregister(tally_html)
        V.unregister(tally_run_figure)
        V.KIND_METRICS.pop(KIND, None)
        unregister(NAME)
        forget_step_kind(KIND)
        forget_family(FAMILY)


def _run(handle: Any, **kw: Any) -> dict[str, Any]:
    from playground.engine import prepare

    return prepare(model=handle, decoder=NAME, prompt="hello there", max_new_tokens=5, **kw).finish().to_dict()


def test_it_is_listed_by_the_cli_the_api_and_the_catalogue(tally, capsys):
    from playground.api import list_decoders
    from playground.catalogue import render
    from playground.cli import main

    assert [s["name"] for s in list_decoders(FAMILY)] == [NAME]
    assert main(["list-decoders", "--json"]) == 0
    specs = {s["name"]: s for s in json.loads(capsys.readouterr().out)}
    assert specs[NAME]["step_kind"] == KIND and specs[NAME]["params"]["width"]["default"] == 3
    assert main(["list-decoders"]) == 0
    assert any(line.split()[:2] == [FAMILY, NAME] for line in capsys.readouterr().out.splitlines())
    doc = render()
    assert f"### {NAME}" in doc
    assert STEP_KINDS[KIND].shows in doc  # what its steps record, from the kind's declaration
    assert "## Tally decoding\n\nGreedy with its candidates kept.\n" in doc  # the family's own declaration
    assert "*Tally*" in doc  # the plot its visualizer registered
    assert "[The tally test decoder](https://example.org/tally)" in doc  # the citation its class carries


def test_its_family_comes_after_the_built_in_ones_in_the_catalogue(tally):
    from playground.catalogue import render

    doc = render()
    built_in = {c.family for c in __import__("decoders").all_decoders()} - {FAMILY}
    assert all(doc.index(f"## {family_of(f).title}\n") < doc.index("## Tally decoding\n") for f in built_in)


def test_every_built_in_family_is_declared_by_its_module_with_a_primer():
    from decoders import all_decoders

    for c in all_decoders():
        fam = family_of(c.family)
        assert c.family in FAMILY_INFO and fam.primer, f"{c.name}: family {c.family!r} is not declared"


def test_it_takes_forced_tokens_as_its_family_declares(tally, llama_handle):
    from playground.force import force_mode

    assert force_mode(TallyGreedy) == "view"
    free = _run(llama_handle)["output_ids"]
    tok = next(t for t in range(5, 50) if t != free[2])
    forced = _run(llama_handle, force=[[2, tok]])
    assert forced["output_ids"][2] == tok and forced["force"] == [[2, tok]]
    assert forced["output_ids"][:2] == free[:2]  # nothing before the forced position moves


def test_a_decoder_that_differs_from_its_family_says_so_in_its_class(tally, llama_handle):
    from playground.core.errors import PlaygroundError
    from playground.force import force_mode

    class Unforceable(TallyGreedy):
        name = "tally_unforceable"
        force_mode = None
        force_refusal = "it keeps its own counsel"

    register(Unforceable)
    try:
        with pytest.raises(PlaygroundError, match="^decoder 'tally_unforceable' cannot take forced tokens: "
                                                  "it keeps its own counsel$"):
            force_mode(Unforceable)
        with pytest.raises(PlaygroundError, match="keeps its own counsel"):
            __import__("playground.engine").engine.prepare(model=llama_handle, decoder=Unforceable.name,
                                                           prompt="hello there", max_new_tokens=5, force=[[1, 5]])
    finally:
        unregister(Unforceable.name)


def test_an_undeclared_family_refuses_forced_tokens_in_one_line():
    from playground.core.errors import PlaygroundError
    from playground.force import force_mode

    class Stray(Decoder):
        name, family = "stray", "no_such_family"

    with pytest.raises(PlaygroundError, match="^decoder 'stray' cannot take forced tokens: it does not declare"):
        force_mode(Stray)


def test_family_declarations_are_checked():
    with pytest.raises(ValueError, match="force_mode"):
        declare_family("tally_bad", "Bad", force_mode="sideways")
    with pytest.raises(ValueError, match="declared differently"):
        declare_family("sampling", "Something else")
    assert "tally_bad" not in FAMILY_INFO


def test_the_page_offers_it_in_every_lane_picker(tally):
    from playground.ui.rules import decoder_choices, decoder_spec

    assert NAME in [name for _label, name in decoder_choices()]
    assert decoder_spec(NAME)["params"]["width"]["max"] == 8


def test_bad_knobs_are_one_line(tally, llama_handle):
    from playground.core.errors import PlaygroundError

    with pytest.raises(PlaygroundError, match="out of range"):
        _run(llama_handle, params={"width": 99})


def test_its_trace_runs_stores_exports_imports_and_replays(tally, llama_handle, tmp_path):
    from playground.store import Store
    from playground.ui.rules import session_page

    tr = _run(llama_handle, params={"width": 4})
    assert [s["kind"] for s in tr["steps"]] == [KIND] * 5
    assert tr["stats"]["new_tokens"] == 5 and tr["stats"]["target_forwards"] == 5
    # the output is greedy's, token for token
    greedy = __import__("playground.engine").engine.prepare(
        model=llama_handle, decoder="greedy", prompt="hello there", max_new_tokens=5).finish()
    assert tr["output_ids"] == greedy.output_ids
    # every candidate id has its display text, found through the declared id key
    cands = {t for s in tr["steps"] for t in s["tally"]["candidate_ids"]}
    assert "candidate_ids" in token_id_keys()
    assert cands - set(tr["output_ids"]) and {str(t) for t in cands} <= set(tr["tokens"])

    with Store(tmp_path / "s.db") as store:
        sid = store.save_session("tally", llama_handle.name, "hello there", {}, [tr])
        exported = json.loads(json.dumps(store.export_session(sid)))
        back = store.load_session(store.import_session(exported))
    replayed = back["runs"][0]
    assert Trace.from_dict(replayed).to_dict()["steps"] == tr["steps"]
    assert replayed["tokens"] == tr["tokens"]
    page = session_page(back)
    assert page["lanes"][0].decoder == NAME

    # the replay draws the kind's own plots, with the candidates' text, and no model
    plots = V.step_figures(replayed, 2)
    assert [t for t, _ in plots] == ["Tally"]
    texts = [tr["tokens"][str(t)] for t in replayed["steps"][2]["tally"]["candidate_ids"]]
    assert plots[0][1] == "<ol>" + "".join(f"<li>{html.escape(t)}</li>" for t in texts) + "</ol>"
    runs = dict(V.run_figures(replayed))
    assert list(runs["Top score over the run"].data[0].y) == [s["tally"]["scores"][0] for s in tr["steps"]]
    assert V.auto_metric(replayed) == "probability"
    lane = V.tokens_html(replayed, V.auto_metric(replayed))
    assert all(html.escape(tr["tokens"][str(t)]) in lane for t in tr["output_ids"])


def test_the_fixture_registers_everything(tally):
    assert REGISTRY[NAME] is TallyGreedy and KIND in STEP_KINDS and KIND in V.STEP_PLOTS


def test_registries_are_clean_without_the_fixture():
    # runs after the tests above: their registrations are gone
    import decoders  # noqa: F401

    assert NAME not in REGISTRY and KIND not in STEP_KINDS and KIND not in V.STEP_PLOTS
    assert KIND not in V.RUN_PLOTS and KIND not in V.KIND_METRICS and tally_html not in V.HTML_PLOTS
    assert family_of(FAMILY).title == "Tally"  # undeclared again: titled by its name


def test_every_step_kind_has_plots_and_every_decoder_a_declared_kind():
    from decoders import all_decoders

    for kind in STEP_KINDS.values():
        assert V.STEP_PLOTS.get(kind.name), f"step kind {kind.name!r} has no step plot"
        assert kind.shows
    for c in all_decoders():
        assert c.step_kind in STEP_KINDS, f"{c.name}: undeclared step kind {c.step_kind!r}"


def test_every_plotted_kind_is_declared_and_undeclared_kinds_are_refused():
    import decoders  # noqa: F401 - a new kind is declared by the decoder module that yields it

    for table in (V.STEP_PLOTS, V.RUN_PLOTS, V.KIND_METRICS):
        assert set(table) <= set(STEP_KINDS), f"plots for undeclared step kinds: {set(table) - set(STEP_KINDS)}"
    with pytest.raises(ValueError, match="unknown step kind"):
        Step("no_such_kind", [1])
    with pytest.raises(ValueError, match="no valid kind"):
        Trace.from_dict({**Trace("m", "greedy", {}, 0, "p", [1]).to_dict(), "steps": [{"kind": "no_such_kind"}]})
    with pytest.raises(ValueError, match="declared differently"):
        declare_step_kind("token", "something else")
    with pytest.raises(ValueError, match="unknown token metric"):
        V.step_plot("token", "X", metric="no_such_metric")


def test_the_page_has_a_slot_for_every_plot_the_visualizers_return():
    from playground.ui.layout import RUN_SLOTS, STEP_SLOTS

    assert STEP_SLOTS >= V.MAX_STEP_PLOTS and RUN_SLOTS >= V.MAX_RUN_PLOTS


@pytest.mark.parametrize("steps, want", [
    ([], "probability"), ([{"kind": "token"}], "probability"), ([{"kind": "draft"}], "acceptance"),
    ([{"kind": "jacobi"}], "acceptance"), ([{"kind": "beam"}], "probability"),
    ([{"kind": "token"}, {"kind": "denoise"}], "unmask_step"), ([{"kind": "token", "watermark": {"green": True}}], "watermark"),
    ([{"kind": "draft", "watermark": {"green": True}}], "acceptance"),
])
def test_auto_colouring_comes_from_the_kinds_and_evidence_the_visualizers_declare(steps, want):
    from playground.ui.rules import auto_metric

    trace = {"steps": steps}
    assert V.auto_metric(trace) == want == auto_metric(trace, "auto")
    assert V.auto_metric(trace, "entropy") == "entropy"


# ---------------------------------------------------------------------- a sampler rule
class TopA(P.Processor):
    """Top-a: keep the tokens whose probability is at least ``a`` times the top one's squared."""

    item = "top_a"
    masks = True
    slot = 85  # after min_p (80), before epsilon (90)
    knobs = dict(top_a=Float(0.0, 0.0, 1000.0, "top-a: keep p >= a * p_max^2; 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["top_a"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> P.Processor:
        return cls(k["top_a"])

    def __init__(self, a: float) -> None:
        self.a = a

    def __call__(self, logits: torch.Tensor, h: P.History) -> torch.Tensor:
        p = logits.softmax(-1)
        return logits.masked_fill(p < self.a * p.max() ** 2, float("-inf"))


BUILT_IN_ITEMS = ("penalties", "dry", "no_repeat_ngram", "top_n_sigma", "top_k", "typical", "top_p", "min_p",
                  "epsilon", "eta", "xtc", "temperature", "mirostat")
SAMPLER = "top_a_sample"


@pytest.fixture()
def top_a():
    """Register the rule (its class is all it takes), then a sampling decoder over the chain as it
    stands; remove both afterwards."""
    from decoders.sampling import ChainDecoder, coupling_param

    P.rule(TopA)

    class TopASample(ChainDecoder):
        """Sampling through the chain, top-a included."""

        name = SAMPLER
        params = P.ChainParams(**P.chain_params(), coupling=coupling_param())
        reference = "none: a test decoder"

    register(TopASample)
    try:
        yield TopASample
    finally:
        unregister(SAMPLER)
        P.forget_rule(TopA)


@pytest.fixture(scope="module")
def shakespeare():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu")


def test_a_rule_declared_in_its_class_joins_the_chain_at_its_slot(top_a):
    assert P.order_items() == BUILT_IN_ITEMS[:8] + ("top_a",) + BUILT_IN_ITEMS[8:]
    specs = P.chain_params()
    assert specs["top_a"] is TopA.knobs["top_a"] and specs["top_a"].default == 0.0
    assert "top_a" in specs["order"].items and specs["order"].default == ",".join(P.order_items())
    assert P.active_items({"top_a": 0.0}) == [] and P.active_items({"top_a": 2.0, "top_k": 5}) == ["top_k", "top_a"]
    chain = P.build_chain({"top_a": 2.0, "top_k": 5, "temperature": 0.5})
    assert chain.labels == ["top_k(k=5)", "top_a(a=2)", "temperature(t=0.5)"]
    # the distribution is the rule's: top-5, then p >= 2 p_max^2 on what top-5 left, then t = 0.5
    logits = torch.tensor([2.0, 1.5, 1.2, 0.4, 0.3, 0.1, -1.0])
    top5 = logits.masked_fill(logits < torch.topk(logits, 5).values[-1], float("-inf"))
    p = top5.softmax(-1)
    want = (top5 / 0.5).masked_fill(p < 2.0 * p.max() ** 2, float("-inf")).softmax(-1)
    got = chain.probs(logits, P.History(ids=[1], prompt_len=1, pos=0))
    assert torch.allclose(got, want) and 0 < int((got > 0).sum()) < 5
    # a user order that leaves it out while its knob is set is refused in one line
    with pytest.raises(__import__("playground.core.errors").core.errors.PlaygroundError,
                       match="top_a are set but missing from 'order'"):
        P.build_chain({"top_a": 2.0, "order": "top_k,temperature"})


@pytest.mark.parametrize("decoder", [SAMPLER, "sample"])
def test_its_knob_is_taken_by_a_sampling_decoder_and_cuts_as_the_rule_says(top_a, shakespeare, decoder):
    """A decoder defined after the rule, and the built-in ``sample`` defined before it: the
    rule's module is all a new rule needs."""
    from playground.core.errors import PlaygroundError
    from playground.engine import prepare

    tr = prepare(model=shakespeare, decoder=decoder, prompt="ROMEO:", max_new_tokens=6, seed=3,
                 params={"top_a": 3.0}).finish().to_dict()
    assert tr["stats"]["new_tokens"] == 6
    cut = 0
    for s in tr["steps"]:
        assert [st["stage"] for st in s["chain"]] == ["top_a(a=3)"]
        d = s["dist"]
        p_max = max(d["raw_probs"])
        for raw, final in zip(d["raw_probs"], d["final_probs"]):
            if abs(raw - 3.0 * p_max ** 2) > 1e-5:  # off the cut's edge, where rounding cannot decide
                assert (final > 0) == (raw >= 3.0 * p_max ** 2)
            if final > 0:  # the kept tokens keep their odds: raw probability over the kept mass
                assert final == pytest.approx(raw / d["kept_mass"], abs=2e-4)
        cut += s["chain"][0]["removed"]
    assert cut > 0  # the rule removed tokens on these steps: the test saw it act
    with pytest.raises(PlaygroundError, match="out of range"):
        prepare(model=shakespeare, decoder=decoder, prompt="ROMEO:", max_new_tokens=2, params={"top_a": -1})


def test_decoders_made_before_the_rule_list_its_knob_where_the_chain_ends(top_a):
    from decoders import get_decoder

    knobs = list(get_decoder("sample").params)
    assert knobs.index("top_a") == knobs.index("order") - 1  # the controls keep their order
    assert get_decoder("sample").params["order"].default == ",".join(P.order_items())
    assert "top_a" in get_decoder("speculative").params  # the speculative chain takes it too


def test_rules_are_checked_when_they_register():
    class Clash(TopA):
        item, slot = "clash", 50  # top_k's slot
        knobs = dict(clash=Float(0.0, 0.0, 1.0, ""))

    class Steals(TopA):
        item, slot = "steals", 86
        knobs = dict(top_k=Float(0.0, 0.0, 1.0, ""))  # a built-in rule's knob

    for cls, needle in ((Clash, "slot 50"), (Steals, "top_k")):
        with pytest.raises(ValueError, match=needle):
            P.rule(cls)
        assert cls not in P.RULES


def test_the_chain_is_built_in_again_without_the_rule():
    from decoders import get_decoder

    assert P.order_items() == BUILT_IN_ITEMS and TopA not in P.RULES
    assert "top_a" not in P.chain_params() and "top_a" not in get_decoder("sample").params
    assert SAMPLER not in REGISTRY
    assert P.build_chain({"top_a": 2.0}).labels == []
