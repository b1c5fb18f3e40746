"""Small-large collaboration: entropy-adaptive decoding (EAD) and its two limits, source of
every token, and the one-line refusals (no small model, a diffusion model as the target)."""

from __future__ import annotations

import pytest
import torch

from playground.engine import prepare
from playground.errors import PlaygroundError
from playground.models import handle_from_model

PROMPTS = ["ROMEO: But soft", "JULIET: O Romeo", "To be, or not to be"]


@pytest.fixture(scope="module")
def small(tokenizer):
    from conftest import build_llama

    return handle_from_model(build_llama(tokenizer, seed=5, layers=1, hidden=32), tokenizer, name="tiny-small")


def run(handle, decoder, prompt, n, params=None, draft=None, seed=0):
    return prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, params=params or {},
                   draft=draft, seed=seed).finish()


def greedy_ids(handle, prompt, n):
    return run(handle, "greedy", prompt, n).output_ids


def next_argmax(handle, ids) -> int:
    return int(torch.argmax(handle.forward(list(ids)).logits[0, -1]))


# ---------------------------------------------------------------------- EAD
@pytest.mark.parametrize("prompt", PROMPTS)
def test_ead_limits(llama_handle, small, prompt):
    """A threshold above any entropy: the small model's greedy text and no large forward;
    a threshold of 0: the large model's greedy text, every token from it."""
    never = run(llama_handle, "ead", prompt, 12, {"entropy_threshold": 100.0}, draft=small)
    assert never.output_ids == greedy_ids(small, prompt, 12)
    assert never.stats["target_forwards"] == 0 and never.stats["small_share"] == 1.0
    always = run(llama_handle, "ead", prompt, 12, {"entropy_threshold": 0.0, "span": 3}, draft=small)
    assert always.output_ids == greedy_ids(llama_handle, prompt, 12)
    assert always.stats["small_share"] == 0.0
    assert all(s.evidence["source"] == "large" for s in always.steps)


def test_ead_hands_over_for_a_span_and_every_token_is_its_writers_greedy(llama_handle, small):
    entropies = [s.evidence["small_entropy"] for s in run(llama_handle, "ead", PROMPTS[0], 16,
                                                          {"entropy_threshold": 100.0}, draft=small).steps]
    thr = sorted(entropies)[len(entropies) // 2]  # about half the positions trigger
    span = 3
    trace = run(llama_handle, "ead", PROMPTS[0], 16, {"entropy_threshold": thr, "span": span}, draft=small)
    ids = list(trace.prompt_ids)
    left = 0
    sources = set()
    for s in trace.steps:
        ev = s.evidence
        tok = s.committed[0]
        if left == 0:
            assert ev.get("trigger", False) == (ev["rolling_entropy"] > thr)
            if ev.get("trigger"):
                left = span
        expect = "large" if left else "small"
        assert ev["source"] == expect
        sources.add(expect)
        assert tok == next_argmax(llama_handle if left else small, ids)
        assert ev["dist"]["chosen"] == tok
        left = max(0, left - 1)
        ids.append(tok)
    assert sources == {"small", "large"}
    n_small = sum(1 for s in trace.steps if s.evidence["source"] == "small")
    assert trace.stats["small_share"] == pytest.approx(n_small / len(trace.steps), abs=1e-4)
    assert trace.stats["target_forwards"] <= trace.stats["large_tokens"]  # the large model runs only in spans
    assert trace.extra.get("lossy") is True  # flagged: the output is neither model's own greedy text


def test_ead_rolling_window_averages_the_small_models_entropy(llama_handle, small):
    trace = run(llama_handle, "ead", PROMPTS[1], 10, {"entropy_threshold": 100.0, "window": 3}, draft=small)
    hs = [s.evidence["small_entropy"] for s in trace.steps]
    for i, s in enumerate(trace.steps):
        recent = hs[max(0, i - 2): i + 1]
        assert s.evidence["rolling_entropy"] == pytest.approx(sum(recent) / len(recent), abs=1e-4)


# ---------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("decoder", ["ead"])
def test_collab_needs_a_small_model(llama_handle, decoder):
    with pytest.raises(PlaygroundError, match="needs a draft model") as e:
        prepare(model=llama_handle, decoder=decoder, prompt="ROMEO:", max_new_tokens=4)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("decoder", ["ead"])
def test_collab_refuses_a_diffusion_target(small, decoder):
    with pytest.raises(PlaygroundError, match=r"is a diffusion model.*causal") as e:
        prepare(model="tiny-shakespeare-diffusion", decoder=decoder, prompt="ROMEO:", max_new_tokens=4, draft=small)
    assert "\n" not in str(e.value)
