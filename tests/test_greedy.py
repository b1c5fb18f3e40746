"""Greedy decoding equals transformers' generate(do_sample=False), token for token."""

from __future__ import annotations

import pytest
import torch

from playground.engine import prepare

PROMPTS = ["ROMEO: But soft", "JULIET: O", "To be, or not to be", "Tomorrow, and tomorrow"]


def hf_greedy(handle, prompt_ids, n, eos=None):
    ids = torch.tensor([prompt_ids])
    out = handle.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=n, min_new_tokens=0, eos_token_id=eos,
                                pad_token_id=handle.tokenizer.pad_token_id)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("which", ["llama_handle", "gpt2_handle"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_generate(request, which, prompt):
    handle = request.getfixturevalue(which)
    run = prepare(model=handle, decoder="greedy", prompt=prompt, max_new_tokens=24)
    # no stop token: compare full length
    run.ctx.stop_ids = set()
    trace = run.finish()
    ref = hf_greedy(handle, trace.prompt_ids, 24, eos=None)
    assert trace.output_ids == ref


@pytest.mark.parametrize("which", ["llama_handle", "gpt2_handle"])
def test_greedy_stops_on_stop_token(request, which):
    handle = request.getfixturevalue(which)
    prompt = PROMPTS[0]
    free = prepare(model=handle, decoder="greedy", prompt=prompt, max_new_tokens=20)
    free.ctx.stop_ids = set()
    tokens = free.finish().output_ids
    stop = tokens[5]  # a token the model really produces, as the stop token
    run = prepare(model=handle, decoder="greedy", prompt=prompt, max_new_tokens=20)
    run.ctx.stop_ids = {stop}
    trace = run.finish()
    ref = hf_greedy(handle, trace.prompt_ids, 20, eos=stop)
    assert trace.output_ids == ref
    assert trace.output_ids[-1] == stop
    assert trace.stats["finish_reason"] == "stop"


def test_forward_counts_are_measured(llama_handle):
    calls = {"n": 0}
    orig = llama_handle.model.forward

    def counting(*a, **k):
        calls["n"] += 1
        return orig(*a, **k)

    llama_handle.model.forward = counting
    try:
        run = prepare(model=llama_handle, decoder="greedy", prompt="ROMEO:", max_new_tokens=10)
        run.ctx.stop_ids = set()
        trace = run.finish()
    finally:
        del llama_handle.model.forward
    assert trace.stats["target_forwards"] == calls["n"] == 10
    assert [s.target_forwards for s in trace.steps] == list(range(1, 11))
    committed = [t for s in trace.steps for t in s.committed]
    assert committed == trace.output_ids
