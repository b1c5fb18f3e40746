"""DINGO (regex-constrained diffusion decoding): the DP against brute force on a small
vocabulary, every output of the bundled model matching its regex, commits that never move,
the schedule, refusals and the views."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from decoders.diffusion.dingo import compile_regex, token_automaton, viterbi
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from test_visualizers import render_everything

PROMPT = "ROMEO: But soft, what light"
TEXTS = ["a", "b", "ab", "ba", "c", None, ""]  # None: banned (a mask); the last id is the stop token
STOP = 6


def valid(seq: list[int], regex: str) -> bool:
    """Brute-force reading: text, then only stop tokens; no banned token; the text fullmatches."""
    k = next((j for j, t in enumerate(seq) if t == STOP), len(seq))
    if any(t != STOP for t in seq[k:]) or any(TEXTS[t] is None for t in seq[:k]):
        return False
    return re.fullmatch(regex, "".join(TEXTS[t] for t in seq[:k])) is not None


@pytest.mark.parametrize("regex", ["a+b", "(ab|ba)*c?", "b[ab]{2,3}", "c"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_dp_finds_the_most_probable_accepted_string(regex, seed):
    auto = token_automaton(compile_regex(regex), TEXTS, {STOP})
    gen = torch.Generator().manual_seed(seed)
    n = 4
    logp = torch.log_softmax(torch.randn(n, len(TEXTS), generator=gen, dtype=torch.float64) * 2, -1)
    toks, score, lattice, path = viterbi(auto, logp)
    brute = [(sum(float(logp[i, t]) for i, t in enumerate(seq)), seq)
             for seq in itertools.product(range(len(TEXTS)), repeat=n) if valid(list(seq), regex)]
    best = max(b for b, _s in brute)
    assert toks is not None and valid(toks, regex)
    assert score == pytest.approx(best) == pytest.approx(sum(float(logp[i, t]) for i, t in enumerate(toks)))
    assert len(path) == n + 1 and path[0] == auto.start and bool(auto.accepting[path[-1]])
    assert float(lattice[n].max()) >= score


def test_committed_positions_are_kept_and_impossible_canvases_say_so():
    auto = token_automaton(compile_regex("a+b"), TEXTS, {STOP})
    logp = torch.zeros(3, len(TEXTS), dtype=torch.float64)
    logp[1] = float("-inf")
    logp[1, 2] = 0.0  # position 1 is committed to "ab"
    toks, _score, _lat, _path = viterbi(auto, logp)
    assert toks[1] == 2 and valid(toks, "a+b")
    none, score, _lat, _path = viterbi(token_automaton(compile_regex("a{5}"), TEXTS, {STOP}),
                                       torch.zeros(2, len(TEXTS), dtype=torch.float64))
    assert none is None and score == float("-inf")


@pytest.fixture(scope="module")
def dllm():
    return load_model("tiny-shakespeare-diffusion", device="cpu")


def run(dllm, n=12, prompt=PROMPT, seed=0, **params):
    return prepare(model=dllm, decoder="dingo", prompt=prompt, max_new_tokens=n, seed=seed, params=params).finish()


def text_of(dllm, ids: list[int]) -> str:
    stops = set(dllm.eos_ids) | {dllm.tokenizer.pad_token_id}
    return dllm.tokenizer.decode([t for t in ids if t not in stops])


@pytest.mark.parametrize("regex,n,knobs", [
    ("[A-Z][a-z]+( [a-z]+)*[.!?]", 12, {}),
    ("[0-9]{3}-[0-9]{4}", 12, {"steps": 6}),
    ("(yes|no|never)", 8, {"block_length": 4, "steps": 4}),
    (r"\{\"name\": \"[a-z]+\"\}", 16, {"steps": 8}),
])
def test_every_output_matches_its_regex_and_commits_never_move(dllm, regex, n, knobs):
    trace = run(dllm, n=n, regex=regex, **knobs)
    assert re.fullmatch(regex, text_of(dllm, trace.output_ids)), text_of(dllm, trace.output_ids)
    assert trace.stats["regex_match"] is True
    final = trace.steps[-1].evidence["canvas"]
    assert re.fullmatch(regex, text_of(dllm, final))
    seen: dict[int, int] = {}
    for st in trace.steps:
        ev, dg = st.evidence, st.evidence["dingo"]
        canvas = ev["canvas"]
        for q, t in seen.items():  # a committed token stays, and the DP keeps it
            assert canvas[q] == t and dg["best"][q] == t
        for q in ev["unmasked"]:
            assert canvas[q] == dg["best"][q] == ev["predicted"][q]
            seen[q] = canvas[q]
        # each step's DP canvas is itself regex-valid
        assert re.fullmatch(regex, text_of(dllm, dg["best"]))
    assert len(seen) == n


def test_the_schedule_commits_the_most_confident_dp_tokens_of_the_block(dllm):
    trace = run(dllm, n=12, regex="[a-z ]+[.]", steps=6, block_length=6)
    assert trace.stats["commits_per_step"] == [2] * 6
    for st in trace.steps:
        ev = st.evidence
        lo, hi = ev["block"]
        assert all(lo <= q < hi for q in ev["unmasked"])
        left = [ev["confidence"][q] for q in range(lo, hi) if ev["confidence"][q] is not None and q not in ev["unmasked"]]
        assert not left or min(ev["confidence"][q] for q in ev["unmasked"]) >= max(left)
        want = [c for c in ev["confidence"]]
        assert all((c is None) == (p is None) for c, p in zip(want, ev["predicted"]))


def test_the_constraint_changes_what_the_model_would_write(dllm):
    trace = run(dllm, n=8, regex="[0-9]+")
    first = trace.steps[0].evidence["dingo"]
    assert first["differs"], "the free argmax already matched; pick a stricter regex"
    assert first["log_prob"] <= first["unconstrained_log_prob"] + 1e-6
    assert first["best"] != first["unconstrained"]
    assert math.isfinite(first["log_prob"])


@pytest.mark.parametrize("regex,msg", [("", "needs a regex"), ("(a", "cannot compile"),
                                       (r"(a)\1", "cannot compile"), ("[0-9]{200}", "no canvas of 8 tokens"),
                                       ("a" * 501, "at most 500"), ("[ab]*a[ab]{9}", "1024 automaton states")])
def test_bad_regexes_are_one_line_errors(dllm, regex, msg):
    with pytest.raises(PlaygroundError, match=re.escape(msg)) as e:
        run(dllm, n=8, regex=regex)
    assert "\n" not in str(e.value)


def test_views_draw_the_lattice_and_the_cost_of_the_constraint(dllm):
    import visualizers as V
    from visualizers.diffusion_plans import dingo_run_figure, dingo_step_figure

    d = run(dllm, n=8, regex="[0-9]+", steps=4).to_dict()
    for i, s in enumerate(d["steps"]):
        assert "DP lattice" in dict(V.step_figures(d, i))
        fig = dingo_step_figure(d, i)
        path = next(t for t in fig.data if t.name == "best path")
        assert len(path.x) == 9
        heat = next(t for t in fig.data if t.type == "heatmap")
        assert len(heat.z) == s["dingo"]["n_states"]
    runs = dict(V.run_figures(d))
    diff = next(t for t in runs["Constrained vs unconstrained"].data if t.type == "bar")
    assert list(diff.y) == [len(s["dingo"]["differs"]) for s in d["steps"]]
    assert dingo_step_figure({"steps": []}, 0).layout.annotations
    assert dingo_run_figure({"steps": []}).layout.annotations
    render_everything(d)
