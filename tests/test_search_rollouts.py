"""cntp and adadec: greedy decoding with entropy-triggered rollouts. The trigger fires exactly
where the entropy crosses the threshold, the trials are the model's own continuations, and
the kept one is the best by the paper's score; with the trigger off both are greedy."""

from __future__ import annotations

import math

import pytest
import torch

from decoders.search.rollouts import ends_clause
from playground.engine import prepare
from test_collab import untied_llama

PROMPTS = ["ROMEO: But soft", "JULIET: O Romeo", "To be, or not to be"]


@pytest.fixture(scope="module")
def model(tokenizer):
    return untied_llama(tokenizer, 3, 2, 64, "rollout-llama")


def run(handle, decoder, prompt, n, params=None, seed=0):
    return prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, params=params or {},
                   seed=seed).finish()


def logprobs_of(handle, context, ids):
    lp = torch.log_softmax(handle.forward(list(context) + list(ids)).logits[0].double(), -1)
    return [float(lp[len(context) - 1 + i, t]) for i, t in enumerate(ids)]


def middle_threshold(handle, prompt, n):
    ents = sorted(s.evidence["dist"]["entropy"] for s in run(handle, "greedy", prompt, n).steps)
    return (ents[len(ents) // 2] + ents[len(ents) // 2 - 1]) / 2


@pytest.mark.parametrize("decoder", ["cntp", "adadec"])
def test_no_trigger_is_greedy(model, decoder):
    for prompt in PROMPTS:
        g = run(model, "greedy", prompt, 10)
        t = run(model, decoder, prompt, 10, {"entropy_threshold": 100.0})
        assert t.output_ids == g.output_ids and t.stats["triggers"] == 0
        assert t.stats["target_forwards"] == g.stats["target_forwards"]


def test_adadec_with_one_candidate_is_greedy(model):
    g = run(model, "greedy", PROMPTS[0], 10)
    t = run(model, "adadec", PROMPTS[0], 10, {"entropy_threshold": 0.0, "top_k": 1})
    assert t.output_ids == g.output_ids and t.stats["triggers"] == 10


def test_adadec_reranks_by_the_lookahead_likelihood(model):
    thr = middle_threshold(model, PROMPTS[1], 12)
    trace = run(model, "adadec", PROMPTS[1], 12, {"entropy_threshold": thr, "top_k": 3, "lookahead": 3})
    ctx = list(trace.prompt_ids)
    fired = 0
    for s in trace.steps:
        ev = s.evidence
        assert ("trials" in ev) == (ev["dist"]["entropy"] > thr)
        if "trials" in ev:
            fired += 1
            items = ev["trials"]["items"]
            top = torch.topk(model.forward(ctx).logits[0, -1], 3).indices.tolist()
            assert [it["ids"][0] for it in items] == top
            for it in items:
                lps = logprobs_of(model, ctx, it["ids"])
                assert it["score"] == pytest.approx(sum(lps) / len(lps), abs=1e-3)
                for j in range(1, len(it["ids"])):  # the lookahead is greedy
                    assert it["ids"][j] == int(torch.argmax(model.forward(ctx + it["ids"][:j]).logits[0, -1]))
            best = max(range(3), key=lambda i: items[i]["score"])
            assert ev["trials"]["chosen"] == best and s.committed == [items[best]["ids"][0]]
        ctx += s.committed
    assert fired >= 2


def test_cntp_keeps_the_least_perplexing_trial(model):
    thr = middle_threshold(model, PROMPTS[2], 12)
    trace = run(model, "cntp", PROMPTS[2], 16, {"entropy_threshold": thr, "num_trials": 4,
                                                "max_trial_tokens": 5}, seed=4)
    ctx = list(trace.prompt_ids)
    fired = 0
    for s in trace.steps:
        ev = s.evidence
        if "trials" in ev:
            fired += 1
            items = ev["trials"]["items"]
            assert len(items) == 4
            for it in items:
                lps = logprobs_of(model, ctx, it["ids"])
                assert it["score"] == pytest.approx(math.exp(-sum(lps) / len(lps)), rel=1e-3)
                ends = [ends_clause(model.decode([t])) for t in it["ids"]]
                assert not any(ends[:-1])  # a trial stops at its first punctuation
                assert len(it["ids"]) <= 5
            best = min(range(4), key=lambda i: items[i]["score"])
            assert ev["trials"]["chosen"] == best
            assert s.committed == items[best]["ids"][:len(s.committed)]  # the whole trial (cut at the budget)
        else:
            assert len(s.committed) == 1
            assert s.committed[0] == int(torch.argmax(model.forward(ctx).logits[0, -1]))
        ctx += s.committed
    assert fired >= 1
    assert len(trace.output_ids) <= 16
