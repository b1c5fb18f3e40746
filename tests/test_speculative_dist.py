"""At temperature 1, every lossless speculative decoder that samples draws the target's own
distribution.

Over many fixed seeds, the short continuations a decoder produces are compared with the
exact law of the target (computed by enumerating every continuation under the same sampling
chain: temperature 1 with a small top-k, so the support is small) by a chi-square test.
Seeds are fixed, so the test is deterministic; a wrong acceptance or residual rule moves the
law far beyond the threshold (see test_speculative.py for the exact, enumerated check of the
rule itself). Each case also checks that drafts were both accepted and rejected, so the
verification rule really was exercised.

Which decoders: every lossless causal decoder with a ``temperature`` knob, read from the
registry. The lossless decoders without one (``greedy``, ``jacobi``, ``lookahead``) are
greedy-only; they are covered by the exactness tests at temperature 0
(test_speculative.py, test_speculative_bundled.py). ``freedave`` is checked seed by seed
against the decoder it reproduces in test_diffusion.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from decoders.base import all_decoders, get_decoder
from decoders.processors import History, build_chain
from playground.engine import prepare
from playground.core.models import handle_from_model
from test_diffusion import SEED_EXACT_DIFFUSION
from test_speculative import GREEDY_ONLY, LOSSLESS, build_varied_llama


@dataclass(frozen=True)
class Case:
    """One decoder's setup: which models, which prompt, its knobs, how many runs."""

    models: str  # "varied" (random target + noisy draft) or "bundled" (tiny Shakespeare)
    prompt: str
    knobs: dict[str, Any] = field(default_factory=dict)
    top_k: int = 4
    tokens: int = 3
    runs: int = 600


VARIED_PROMPT = "JULIET: O Romeo, Romeo"
# The trained target continues this repetition often, so lookups draft tokens it may accept.
REPEATING = "[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter"
CASES = {
    "speculative": Case("varied", VARIED_PROMPT, {"gamma": 2}, runs=1500),
    # the bandit's γ changes between rounds; UCB tries both arms first, then follows its bounds
    "bandit_spec": Case("varied", VARIED_PROMPT, {"arms": "1,2", "ucb_c": 0.5}, runs=1500),
    "spec_tree": Case("varied", VARIED_PROMPT, {"depth": 2, "topk": 2, "width": 2, "budget": 6}, runs=1500),
    "layer_skip": Case("varied", VARIED_PROMPT, {"exit_layer": 1, "gamma": 2}),
    "mask_probe": Case("varied", VARIED_PROMPT, {"probes": 2, "topk": 2, "budget": 6}),
    "prompt_lookup": Case("bundled", REPEATING, {"num_draft": 3}, top_k=3),
    "ngram_adaptive": Case("bundled", REPEATING, {"depth": 3}, top_k=3),
    "token_recycling": Case("bundled", REPEATING, {"depth": 3}, top_k=3),
    # the bundled masked-diffusion LM drafts for the bundled causal target (issue 14)
    "diffuspec": Case("diffusion", "ROMEO: But soft, what light", {"gamma": 2, "draft_steps": 1}, top_k=3),
    # the draft model's part and the pool's prompt phrases (its own test, test_ouroboros.py, has the pool's)
    "ouroboros": Case("varied", VARIED_PROMPT, {"gamma": 2, "key_len": 1}),
}
SAMPLING_LOSSLESS = sorted(c.name for c in all_decoders()
                           if c.lossless and c.kind == "causal" and "temperature" in c.params)


@pytest.fixture(scope="module")
def varied_models(tokenizer):
    target = handle_from_model(build_varied_llama(tokenizer, seed=2), tokenizer, name="t")
    draft = handle_from_model(build_varied_llama(tokenizer, seed=9, noise_from=target.model, noise=0.25),
                              tokenizer, name="d")
    return target, draft


@pytest.fixture(scope="module")
def bundled_models():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-draft", device="cpu")


@pytest.fixture(scope="module")
def diffusion_models():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-diffusion", device="cpu")


def exact_law(target, prompt_ids: list[int], chain_knobs: dict[str, Any], n_tokens: int) -> dict:
    """P(continuation) for every ``n_tokens`` continuation with non-zero probability."""
    chain = build_chain(chain_knobs)
    law: dict[tuple[int, ...], float] = {}

    def walk(prefix: list[int], prob: float) -> None:
        if len(prefix) == n_tokens:
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


def verified_and_accepted(trace) -> tuple[int, int]:
    """Drafted tokens the target verified, and those it accepted, read from the draft trees."""
    tried = accepted = 0
    for step in trace.steps:
        for node in step.evidence.get("tree", {}).get("nodes", []):
            tried += node.get("accept_prob") is not None
            accepted += bool(node.get("accepted"))
    return tried, accepted


def test_every_lossless_decoder_is_checked_at_temperature_one_or_is_greedy_only():
    """The README's claim, kept true as decoders are added: a lossless decoder that can
    sample has a case here; one that cannot is in the temperature-0 exactness tests."""
    assert sorted(CASES) == SAMPLING_LOSSLESS
    for cls in all_decoders():
        if not cls.lossless or cls.name in CASES:
            continue
        if cls.kind == "diffusion":
            # equal seed by seed to the decoder it reproduces, at temperature 1 too
            assert cls.name in SEED_EXACT_DIFFUSION, f"{cls.name}: no temperature-1 test"
        else:
            assert "temperature" not in cls.params, f"{cls.name} can sample but has no temperature-1 test"
            assert cls.name == "greedy" or cls.name in set(LOSSLESS) & GREEDY_ONLY, f"{cls.name}: no exactness test"


@pytest.mark.slow
@pytest.mark.parametrize("decoder", sorted(CASES))
def test_samples_follow_target_distribution(request, decoder):
    case = CASES[decoder]
    target, draft = request.getfixturevalue(f"{case.models}_models")
    chain = {"temperature": 1.0, "top_k": case.top_k}
    counts: Counter = Counter()
    tried = accepted = 0
    prompt_ids = None
    for seed in range(case.runs):
        r = prepare(model=target, decoder=decoder, prompt=case.prompt, max_new_tokens=case.tokens,
                    draft=draft if get_decoder(decoder).needs_draft else None, seed=seed,
                    params={**chain, **case.knobs})
        r.ctx.stop_ids = set()
        tr = r.finish()
        prompt_ids = tr.prompt_ids
        counts[tuple(tr.output_ids)] += 1
        t, a = verified_and_accepted(tr)
        tried, accepted = tried + t, accepted + a
    assert 0.05 < accepted / max(tried, 1) < 0.95 and accepted >= 50, \
        f"{decoder}: {accepted} of {tried} drafted tokens accepted; the rule must both accept and reject"
    law = exact_law(target, prompt_ids, chain, case.tokens)
    p = chi_square_p(counts, law, case.runs)
    assert p > 1e-3, f"{decoder}: chi-square p = {p:.2e}"
