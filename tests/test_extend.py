"""One place to extend: a decoder of a new family, with a new step kind and its own visualizer,
defined in one module (here: this test) appears everywhere the app lists decoders.

The test decoder is greedy decoding that records, at each step, a "tally" of its top candidate
token ids: a step kind no built-in decoder has. Nothing outside this file names it; the fixture
removes it from every registry afterwards, so other tests see the built-in set only.
"""

from __future__ import annotations

import html
import json
from typing import Any, Iterator

import plotly.graph_objects as go
import pytest
import torch

import visualizers as V
from decoders.base import (FAMILY_INFO, REGISTRY, Context, Decoder, Int, Params, declare_family, family_of,
                           forget_family, register, unregister)
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
    from playground.ui.state import decoder_choices, decoder_spec

    assert NAME in [name for _label, name in decoder_choices()]
    assert decoder_spec(NAME)["params"]["width"]["max"] == 8


def test_bad_knobs_are_one_line(tally, llama_handle):
    from playground.core.errors import PlaygroundError

    with pytest.raises(PlaygroundError, match="out of range"):
        _run(llama_handle, params={"width": 99})


def test_its_trace_runs_stores_exports_imports_and_replays(tally, llama_handle, tmp_path):
    from playground.store import Store
    from playground.ui.state import session_page

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
    from playground.ui.state import auto_metric

    trace = {"steps": steps}
    assert V.auto_metric(trace) == want == auto_metric(trace, "auto")
    assert V.auto_metric(trace, "entropy") == "entropy"
