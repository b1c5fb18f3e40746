"""APD (adaptive parallel decoding): the acceptance rule by hand, the neutral mixture weight
against LLaDA under common random numbers, every pass of a trace against the rule recomputed
with the helper model itself (also with fixed words, which are given context the acceptance
skips), refusals and the views."""

from __future__ import annotations

import pytest
import torch

from decoders.diffusion.apd import accepted_length, mixture_logits, skip_given, window_end
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from test_visualizers import render_everything

PROMPT = "ROMEO: But soft, what light"


@pytest.fixture(scope="module")
def dllm():
    return load_model("tiny-shakespeare-diffusion", device="cpu")


@pytest.fixture(scope="module")
def helper():
    return load_model("tiny-shakespeare-draft", device="cpu")


def run(dllm, helper, n=16, seed=0, prompt=PROMPT, decoder="apd", **params):
    return prepare(model=dllm, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                   draft=helper if decoder == "apd" else None, params=params).finish()


def test_acceptance_is_the_longest_agreeing_prefix_and_never_empty():
    assert accepted_length([5, 6, 7, 8], [5, 6, 7, 8]) == 4
    assert accepted_length([5, 6, 7, 8], [5, 6, 9, 8]) == 2  # stops at the first disagreement
    assert accepted_length([5, 6, 7, 8], [1, 6, 7, 8]) == 4  # the first proposal always stands
    assert accepted_length([5, 6], [1, 2]) == 1
    assert accepted_length([5], [9]) == 1


def test_mixture_weight_one_is_the_dllm_and_zero_the_helper():
    d = torch.tensor([[2.0, 0.0, -1.0]])
    a = torch.tensor([[float("-inf"), 3.0, 0.0]])  # a padded helper id: -inf must not leak at w = 1
    assert torch.equal(mixture_logits(d, a, 1.0), d)
    assert torch.equal(mixture_logits(d, a, 0.0)[:, 1:], a[:, 1:])
    mid = mixture_logits(torch.tensor([[0.0, 2.0]]), torch.tensor([[4.0, 0.0]]), 0.5)
    assert torch.allclose(torch.softmax(mid, -1),  # p_D^w p_AR^(1-w), renormalised
                          torch.softmax(0.5 * torch.log_softmax(torch.tensor([[0.0, 2.0]]), -1)
                                        + 0.5 * torch.log_softmax(torch.tensor([[4.0, 0.0]]), -1), -1))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_neutral_weight_over_the_whole_canvas_is_one_step_of_llada(dllm, helper, temperature):
    """w = 1 leaves the helper no say: every proposal stands, and with the whole canvas as the
    window that is LLaDA committing everything in one step, drawn with the same noise."""
    got = run(dllm, helper, seed=3, mixture_weight=1.0, max_lookahead=0, temperature=temperature)
    ref = run(dllm, helper, seed=3, decoder="llada", steps=1, temperature=temperature)
    assert got.output_ids == ref.output_ids
    assert got.steps[0].evidence["canvas"] == ref.steps[0].evidence["canvas"]
    assert got.stats["commits_per_step"] == [16]
    # with a window of 4, every pass keeps its whole window
    win = run(dllm, helper, seed=3, mixture_weight=1.0, max_lookahead=4, temperature=temperature)
    assert win.stats["commits_per_step"] == [4, 4, 4, 4]
    assert all(s.evidence["apd"]["agree"] == [True] * 4 for s in win.steps)


@pytest.mark.parametrize("weight,temperature", [(0.3, 0.0), (0.0, 0.0), (0.5, 0.9)])
def test_every_pass_follows_the_rule_recomputed_with_the_helper(dllm, helper, weight, temperature):
    trace = run(dllm, helper, n=24, seed=5, mixture_weight=weight, max_lookahead=6, temperature=temperature)
    prompt_ids = list(trace.prompt_ids)
    cur = 0
    for st in trace.steps:
        ev = st.evidence["apd"]
        lo, hi = ev["window"]
        assert lo == cur and hi == min(cur + 6, 24)
        # the helper's view: prompt, committed text, then the proposal
        committed = st.evidence["canvas"][:cur]
        seq = torch.tensor(prompt_ids + committed + ev["proposed"])
        with torch.no_grad():
            logits = helper.model(seq.unsqueeze(0)).logits[0]
        p_help = torch.softmax(logits[len(prompt_ids) + cur - 1:len(prompt_ids) + hi - 1].double(), -1)
        want = [float(p_help[j, t]) for j, t in enumerate(ev["proposed"])]
        assert ev["p_helper"] == pytest.approx(want, abs=2e-4)
        assert ev["agree"] == [m == t for m, t in zip(ev["mixture"], ev["proposed"])]
        k = accepted_length(ev["proposed"], ev["mixture"])
        assert ev["accepted"] == k == len(st.committed)
        assert st.committed == ev["proposed"][:k] and st.evidence["unmasked"] == list(range(cur, cur + k))
        cur += k
    assert cur == 24
    assert trace.stats["commit_step"] == sorted(trace.stats["commit_step"])  # left to right
    assert trace.stats["helper_forwards"] == trace.stats["steps"] == len(trace.steps)


def test_a_window_counts_masked_positions_and_takes_the_fixed_cells_after_it():
    given = [False, False, True, False, False, True, True, False]
    assert skip_given(given, 2) == 3 and skip_given(given, 5) == 7 and skip_given([True], 0) == 1
    assert window_end(given, 0, 2) == 3  # 0, 1 masked, then the fixed 2 rides along
    assert window_end(given, 0, 3) == 4
    assert window_end(given, 3, 2) == 7  # 3, 4 masked, then the fixed 5 and 6
    assert window_end(given, 0, 99) == 8


FIXED = "2: love; 5:,; 6: and; 11: the"


@pytest.mark.parametrize("weight,temperature,look", [(0.3, 0.0, 4), (0.0, 0.0, 3), (0.5, 0.9, 5)])
def test_fixed_cells_are_given_context_that_the_acceptance_skips(dllm, helper, weight, temperature, look):
    n = 16
    trace = run(dllm, helper, n=n, seed=5, mixture_weight=weight, max_lookahead=look, temperature=temperature,
                fixed=FIXED)
    prompt_ids, mask = list(trace.prompt_ids), dllm.mask_token_id
    first = trace.steps[0].evidence
    fixed = {q: first["canvas"][q] for q in first["fixed"]}
    assert sorted(fixed) == [2, 5, 6, 11]
    given = [q in fixed for q in range(n)]
    cur = skip_given(given, 0)
    for st in trace.steps:
        ev = st.evidence["apd"]
        lo, hi = ev["window"]
        assert lo == cur and hi == window_end(given, cur, look)
        assert ev["given"] == [q for q in range(lo, hi) if q in fixed]
        masked = [q for q in range(lo, hi) if q not in fixed]
        assert len(masked) == min(look, sum(not g for g in given[cur:]))
        win = ev["proposed"]
        for q in ev["given"]:  # a fixed cell is read in place, never proposed, drawn or judged
            j = q - lo
            assert win[j] == ev["mixture"][j] == fixed[q]
            assert ev["agree"][j] is None and ev["p_dllm"][j] is None and ev["p_mixture"][j] is None
        # the helper's view: prompt, settled text, then the window with the fixed tokens in place
        settled = st.evidence["canvas"][:cur]
        with torch.no_grad():
            a = helper.model(torch.tensor([prompt_ids + settled + win])).logits[0]
            d = dllm.model(torch.tensor([prompt_ids + settled + [fixed.get(q, mask) for q in range(lo, hi)]])
                           ).logits[0, len(prompt_ids) + lo:]
        p_help = torch.softmax(a[len(prompt_ids) + lo - 1:len(prompt_ids) + hi - 1].double(), -1)
        assert ev["p_helper"] == pytest.approx([float(p_help[j, t]) for j, t in enumerate(win)], abs=2e-4)
        if temperature == 0.0:  # the dLLM read the fixed tokens too: its argmax at the masked cells
            assert [win[q - lo] for q in masked] == d.argmax(-1)[[q - lo for q in masked]].tolist()
        # the acceptance over the masked cells only
        prop = [win[q - lo] for q in masked]
        drawn = [ev["mixture"][q - lo] for q in masked]
        assert [ev["agree"][q - lo] for q in masked] == [t == m for t, m in zip(prop, drawn)]
        k = accepted_length(prop, drawn)
        assert ev["committed"] == k == len(st.committed) and st.committed == prop[:k]
        assert st.evidence["unmasked"] == masked[:k]
        assert ev["accepted"] == (masked[k] if k < len(masked) else hi) - lo
        assert all(st.evidence["canvas"][q] == t for q, t in fixed.items())
        cur = skip_given(given, lo + ev["accepted"])
    assert cur == n
    assert trace.stats["helper_forwards"] == trace.stats["steps"] == len(trace.steps)
    assert all(trace.output_ids[q] == t for q, t in fixed.items())
    render_everything(trace.to_dict())  # the views take windows with fixed cells in them


def test_with_fixed_words_weight_one_keeps_every_window_and_the_whole_canvas_is_llada(dllm, helper):
    fixed = "3: love; 9: the"
    win = run(dllm, helper, n=12, mixture_weight=1.0, max_lookahead=4, fixed=fixed)
    assert win.stats["commits_per_step"] == [4, 4, 2]  # 4 masked per window; fixed 3, 9 ride along
    assert [s.evidence["apd"]["window"] for s in win.steps] == [[0, 5], [5, 10], [10, 12]]
    assert all(a is not False for s in win.steps for a in s.evidence["apd"]["agree"])
    for temperature in (0.0, 0.8):
        got = run(dllm, helper, n=12, seed=3, mixture_weight=1.0, max_lookahead=0, temperature=temperature,
                  fixed=fixed)
        ref = run(dllm, helper, n=12, seed=3, decoder="llada", steps=1, temperature=temperature, fixed=fixed)
        assert got.output_ids == ref.output_ids
        assert got.steps[0].evidence["canvas"] == ref.steps[0].evidence["canvas"]


def test_at_temperature_zero_the_mixture_draw_is_the_mixtures_argmax(dllm, helper):
    trace = run(dllm, helper, n=12, mixture_weight=0.4, max_lookahead=4)
    prompt_ids, cur = list(trace.prompt_ids), 0
    for st in trace.steps:
        ev = st.evidence["apd"]
        lo, hi = ev["window"]
        canvas_in = st.evidence["canvas"][:cur] + [dllm.mask_token_id] * (hi - cur)
        with torch.no_grad():
            d = dllm.model(torch.tensor([prompt_ids + canvas_in])).logits[0, len(prompt_ids) + cur:]
            a = helper.model(torch.tensor([prompt_ids + st.evidence["canvas"][:cur] + ev["proposed"]])).logits[0]
        a = a[len(prompt_ids) + cur - 1:len(prompt_ids) + hi - 1]
        assert ev["proposed"] == d.argmax(-1).tolist()
        assert ev["mixture"] == (0.4 * d + 0.6 * a).argmax(-1).tolist()
        cur += ev["accepted"]


def test_a_helper_that_trusts_less_takes_more_passes(dllm, helper):
    alone = run(dllm, helper, n=24, mixture_weight=1.0, max_lookahead=8)
    helped = run(dllm, helper, n=24, mixture_weight=0.2, max_lookahead=8)
    assert alone.stats["steps"] == 3 < helped.stats["steps"] <= 24
    assert 0.0 <= helped.stats["helper_agreement"] < 1.0 == alone.stats["helper_agreement"]


def test_refusals_are_one_line(dllm, helper):
    with pytest.raises(PlaygroundError, match="needs a draft model") as e:
        prepare(model=dllm, decoder="apd", prompt=PROMPT, max_new_tokens=8)
    assert "\n" not in str(e.value)
    with pytest.raises(PlaygroundError, match="a draft must be causal") as e:
        prepare(model=dllm, decoder="apd", prompt=PROMPT, max_new_tokens=8, draft=dllm)
    assert "\n" not in str(e.value)
    with pytest.raises(PlaygroundError, match="mixture_weight") as e:
        run(dllm, helper, mixture_weight=1.5)
    assert "\n" not in str(e.value)


def test_views_show_the_window_and_the_parallel_length(dllm, helper):
    import visualizers as V
    from visualizers.diffusion_plans import apd_run_figure, apd_step_figure

    d = run(dllm, helper, n=16, mixture_weight=0.3, max_lookahead=6).to_dict()
    for i, s in enumerate(d["steps"]):
        assert "Helper vs dLLM" in dict(V.step_figures(d, i))
        fig = apd_step_figure(d, i)
        acc = next(t for t in fig.data if t.name == "dLLM p · accepted")
        assert list(acc.x) == s["unmasked"]
    runs = dict(V.run_figures(d))
    bars = next(t for t in runs["Parallel length per step"].data if t.name == "accepted")
    assert list(bars.y) == d["stats"]["commits_per_step"]
    assert apd_step_figure({"steps": []}, 0).layout.annotations
    assert apd_run_figure({"steps": []}).layout.annotations
    render_everything(d)
