"""At temperature 1, ``speculative`` and ``spec_tree`` sample the target's own distribution.

Over many fixed seeds, the 3-token continuations they produce are compared with the exact
law of the target (computed by enumerating every continuation under the same sampling
chain: top_k=4, so the support is small) by a chi-square test. Seeds are fixed, so the test
is deterministic; a wrong acceptance or residual rule moves the law far beyond the
threshold (see test_speculative.py for the exact, enumerated check of the rule itself).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from decoders.processors import History, build_chain
from playground.engine import prepare
from playground.models import handle_from_model
from test_speculative import build_varied_llama

PROMPT = "JULIET: O Romeo, Romeo"
N_TOKENS = 3
CHAIN = {"temperature": 1.0, "top_k": 4}


@pytest.fixture(scope="module")
def models(tokenizer):
    target = handle_from_model(build_varied_llama(tokenizer, seed=2), tokenizer, name="t")
    draft = handle_from_model(build_varied_llama(tokenizer, seed=9, noise_from=target.model, noise=0.25),
                              tokenizer, name="d")
    return target, draft


def exact_law(target, prompt_ids):
    """P(continuation) for every 3-token continuation with non-zero probability."""
    chain = build_chain(CHAIN)
    law: dict[tuple[int, ...], float] = {}

    def walk(prefix: list[int], prob: float) -> None:
        if len(prefix) == N_TOKENS:
            law[tuple(prefix)] = prob
            return
        ids = prompt_ids + prefix
        logits = target.forward(ids).logits[0, -1]
        p = chain.probs(logits, History(ids=ids, prompt_len=len(prompt_ids), pos=len(prefix)))
        for t in torch.nonzero(p).flatten().tolist():
            walk(prefix + [t], prob * float(p[t]))

    walk([], 1.0)
    return law


def chi_square_p(counts: Counter, law: dict, n: int) -> float:
    """p-value of Pearson's chi-square, cells with expected count < 5 pooled."""
    stat, cells, rest_obs, rest_exp = 0.0, 0, 0, 0.0
    for key, prob in law.items():
        exp = prob * n
        if exp < 5:
            rest_obs += counts.get(key, 0)
            rest_exp += exp
            continue
        stat += (counts.get(key, 0) - exp) ** 2 / exp
        cells += 1
    if rest_exp > 0:
        stat += (rest_obs - rest_exp) ** 2 / max(rest_exp, 1e-9)
        cells += 1
    assert sum(counts.values()) == n and set(counts) <= set(law), "a continuation the target cannot produce"
    df = cells - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


@pytest.mark.slow
@pytest.mark.parametrize("decoder,knobs", [
    ("speculative", {"gamma": 2}),
    ("spec_tree", {"depth": 2, "topk": 2, "width": 2, "budget": 6}),
])
def test_samples_follow_target_distribution(models, decoder, knobs):
    target, draft = models
    n = 1500
    counts: Counter = Counter()
    accepted = tried = 0
    prompt_ids = None
    for seed in range(n):
        r = prepare(model=target, decoder=decoder, prompt=PROMPT, max_new_tokens=N_TOKENS, draft=draft,
                    seed=seed, params={**CHAIN, **knobs})
        r.ctx.stop_ids = set()
        tr = r.finish()
        prompt_ids = tr.prompt_ids
        counts[tuple(tr.output_ids)] += 1
        accepted += tr.stats["accepted_tokens"]
        tried += tr.stats["verified_tokens"]
    law = exact_law(target, prompt_ids)
    assert 0.1 < accepted / max(tried, 1) < 0.95, "the draft must be rejected sometimes for the test to mean something"
    p = chi_square_p(counts, law, n)
    assert p > 1e-3, f"{decoder}: chi-square p = {p:.2e}"
