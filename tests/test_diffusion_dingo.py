"""DINGO (regex-constrained diffusion decoding): the DP against brute force on a small
vocabulary (also with a fixed cell), every output of the bundled model matching its regex,
commits that never move, fixed words the DP routes through and the ones no match can hold,
the schedule, refusals and the views."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from decoders.diffusion.dingo import check_fixed, compile_regex, pin_rows, satisfiable, token_automaton, viterbi
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
@pytest.mark.parametrize("pinned", [{}, {1: 0}, {0: 2, 2: STOP}, {3: 4}],
                         ids=["free", "a fixed at 1", "ab at 0 and a stop at 2", "c fixed at 3"])
def test_the_dp_finds_the_most_probable_accepted_string(regex, seed, pinned):
    """Brute force over every canvas of 4 tokens: the DP's string is the most probable valid
    one that has the fixed (pinned) tokens at their positions, and says None when there is
    none (what makes dingo refuse such fixed words before decoding)."""
    auto = token_automaton(compile_regex(regex), TEXTS, {STOP})
    gen = torch.Generator().manual_seed(seed)
    n = 4
    logp = torch.log_softmax(torch.randn(n, len(TEXTS), generator=gen, dtype=torch.float64) * 2, -1)
    rows = pin_rows(logp, pinned)
    toks, score, lattice, path = viterbi(auto, rows)
    brute = [(sum(float(logp[i, t]) for i, t in enumerate(seq) if i not in pinned), seq)
             for seq in itertools.product(range(len(TEXTS)), repeat=n)
             if valid(list(seq), regex) and all(seq[q] == t for q, t in pinned.items())]
    assert satisfiable(auto, n, pinned) == bool(brute)
    if not brute:
        assert toks is None and score == float("-inf") and path == []
        return
    best = max(b for b, _s in brute)
    assert toks is not None and valid(toks, regex) and all(toks[q] == t for q, t in pinned.items())
    assert score == pytest.approx(best) == pytest.approx(sum(float(rows[i, t]) for i, t in enumerate(toks)))
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


def test_fixed_tokens_no_match_can_hold_are_named_in_one_line():
    auto = token_automaton(compile_regex("ab|ba"), TEXTS, {STOP})  # 2 tokens: a b, b a, ab ., ba .
    show = TEXTS.__getitem__
    check_fixed(auto, 2, {}, "ab|ba", show)
    check_fixed(auto, 2, {0: 0}, "ab|ba", show)  # "a" first fits
    with pytest.raises(PlaygroundError, match=r"^knob 'fixed': 'c' at position 1 is in no canvas of 2 tokens"):
        check_fixed(auto, 2, {0: 0, 1: 4}, "ab|ba", show)  # the one that cannot fit even alone
    with pytest.raises(PlaygroundError, match=r"^knob 'fixed': no canvas of 2 tokens .* holds all the fixed"):
        check_fixed(auto, 2, {0: 0, 1: 0}, "ab|ba", show)  # each "a" fits alone; "aa" does not
    with pytest.raises(PlaygroundError, match=r"^no canvas of 2 tokens matches regex 'a\{5\}'"):
        check_fixed(token_automaton(compile_regex("a{5}"), TEXTS, {STOP}), 2, {0: 0}, "a{5}", show)
    assert not satisfiable(auto, 2, {0: len(TEXTS)})  # an id past the logits is never allowed


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


FIXED_REGEX = "[A-Z][a-z]+(,? [a-z]+)*[.!?]"


@pytest.mark.parametrize("fixed,n,knobs", [
    ("3: love", 12, {}),
    ("0:But; 5: thee; 6:,", 12, {"steps": 6, "block_length": 6}),
    ("1: my; 2: lord; 3:,", 8, {"steps": 4, "block_length": 4}),  # fills most of the first block
])
def test_fixed_words_are_kept_by_every_dp_and_the_output_still_matches(dllm, fixed, n, knobs):
    trace = run(dllm, n=n, regex=FIXED_REGEX, fixed=fixed, **knobs)
    first = trace.steps[0].evidence
    pins = {q: first["canvas"][q] for q in first["fixed"]}
    assert pins and all(t != dllm.mask_token_id for t in pins.values())
    assert re.fullmatch(FIXED_REGEX, text_of(dllm, trace.output_ids)), text_of(dllm, trace.output_ids)
    assert trace.stats["regex_match"] is True
    assert all(trace.output_ids[q] == t for q, t in pins.items())
    for st in trace.steps:
        ev, dg = st.evidence, st.evidence["dingo"]
        assert ev["fixed"] == sorted(pins)
        assert all(ev["canvas"][q] == dg["best"][q] == t for q, t in pins.items())
        assert not set(ev["unmasked"]) & set(pins)
        assert re.fullmatch(FIXED_REGEX, text_of(dllm, dg["best"]))
    # the schedule spreads each block's masked positions only: every step commits something
    assert all(c > 0 for c in trace.stats["commits_per_step"])
    assert sum(trace.stats["commits_per_step"]) == n - len(pins)
    render_everything(trace.to_dict())


@pytest.mark.parametrize("fixed,msg", [
    ("2: love", "knob 'fixed': ' love' at position 2 is in no canvas of 8 tokens that matches regex '[0-9]+'"),
    ("0:7; 1:7; 2: love", "knob 'fixed': ' love' at position 2 is in no canvas"),
])
def test_fixed_words_that_break_the_regex_are_one_line_before_any_step(dllm, fixed, msg):
    live = prepare(model=dllm, decoder="dingo", prompt=PROMPT, max_new_tokens=8, seed=0,
                   params={"regex": "[0-9]+", "fixed": fixed})
    with pytest.raises(PlaygroundError, match=re.escape(msg)) as e:
        live.step()  # the very first step refuses: nothing was decoded
    assert "\n" not in str(e.value)


def test_a_regex_no_canvas_matches_keeps_its_message_and_a_fitting_fixed_token_stays(dllm):
    """With fixed words, a regex that no canvas of this length matches at all still gets
    dingo's usual message (the fixed words are not to blame); a fixed token that fits stays."""
    with pytest.raises(PlaygroundError, match=re.escape("no canvas of 8 tokens matches regex '[0-9]{200}'")):
        run(dllm, n=8, regex="[0-9]{200}", fixed="1:7")
    seven = dllm.tokenizer.encode("7", add_special_tokens=False)
    trace = run(dllm, n=8, regex="[0-9]+[.]", fixed="0:7")
    assert re.fullmatch("[0-9]+[.]", text_of(dllm, trace.output_ids)) and trace.output_ids[:1] == seven


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
