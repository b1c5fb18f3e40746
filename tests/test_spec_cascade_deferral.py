"""``spec_cascade`` with ``verify=mixture``: the paper's speculative cascade, whose output follows
the per-position mixture (p where the deferral rule defers, q where it keeps the small model).

Limits (always / never defer at temperature 0 are the large / small model's greedy text), the
recorded decisions recomputed from the recorded rule inputs, the sampled tokens against the
exact mixture (one position in isolation, and the decoder's first token over many seeds), and
one-line refusals of bad knobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from decoders.ar import sample_index
from decoders.collab.cascade import accept_probability, mixture_target, residual
from playground.core.errors import PlaygroundError
from playground.engine import prepare

from test_collab import PROMPTS, greedy_ids, large, run, small  # noqa: F401  (module fixtures)

MIX = {"verify": "mixture"}


# ---------------------------------------------------------------------- limits
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("knobs", [{"rule": "opt", "alpha": -1.0}, {"rule": "always"}, {"rule": "diff", "alpha": -1.0}])
def test_always_deferring_mixture_at_greedy_is_the_large_models_greedy(large, small, prompt, knobs):
    trace = run(large, "spec_cascade", prompt, 12, {**MIX, **knobs, "gamma": 3, "temperature": 0.0}, draft=small)
    assert trace.output_ids == greedy_ids(large, prompt, 12)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("knobs", [{"rule": "opt", "alpha": 1.0}, {"rule": "chow", "alpha": 0.0}])
def test_never_deferring_mixture_at_greedy_is_the_small_models_greedy(large, small, prompt, knobs):
    trace = run(large, "spec_cascade", prompt, 12, {**MIX, **knobs, "gamma": 4, "temperature": 0.0}, draft=small)
    assert trace.output_ids == greedy_ids(small, prompt, 12)
    assert trace.stats["deferred_positions"] == 0
    assert trace.stats["small_share"] == 1.0
    # nothing deferred: every drafted token stands
    assert all(n["accepted"] for s in trace.steps for n in s.evidence["tree"]["nodes"])


def test_the_default_is_the_greedy_verification(large, small):
    a = run(large, "spec_cascade", PROMPTS[1], 16, {"gamma": 3}, draft=small)
    b = run(large, "spec_cascade", PROMPTS[1], 16, {"gamma": 3, "verify": "greedy", "temperature": 0.5}, draft=small)
    assert a.output_ids == b.output_ids
    assert "verify" not in a.stats and "cascade" not in a.steps[0].evidence


# ---------------------------------------------------------------------- recorded evidence
def recompute(rule: str, alpha: float, x: dict) -> bool:
    """The rules written out again, on the recorded numbers only."""
    mq, mp, tv = x["max_q"], x["max_p"], x["tv"]
    return {"always": True, "chow": mq < alpha, "diff": mp - mq > alpha, "opt": mq < mp - alpha * tv}[rule]


@pytest.mark.parametrize("rule,alpha", [("opt", 0.3), ("opt", 0.0), ("chow", 0.2), ("diff", 0.05)])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_recorded_decisions_recompute_from_recorded_quantities(large, small, rule, alpha, temperature):
    seen = deferred = 0
    for seed in range(3):
        trace = run(large, "spec_cascade", PROMPTS[seed], 12,
                    {**MIX, "rule": rule, "alpha": alpha, "gamma": 3, "temperature": temperature},
                    draft=small, seed=seed)
        for s in trace.steps:
            ev = s.evidence["cascade"]
            assert (ev["rule"], ev["alpha"]) == (rule, alpha)
            for pos in ev["positions"]:
                assert 0.0 <= pos["tv"] <= 1.0 + 1e-6 and pos["max_p"] - pos["max_q"] <= pos["tv"] + 1e-6
                assert pos["deferred"] == recompute(rule, alpha, pos)
                if not pos["bonus"]:
                    node = s.evidence["tree"]["nodes"][pos["position"]]
                    assert node["deferred"] == pos["deferred"] and node["token"] == pos["token"]
                    if pos["deferred"]:  # the target is p: accept min(1, p/q)
                        assert pos["accept_prob"] == min(1.0, pos["p_token"] / pos["q_token"])
                        assert node["p"] == round(pos["p_token"], 6) and node["q"] == round(pos["q_token"], 6)
                    else:  # the target is q itself: always accepted
                        assert pos["accept_prob"] == 1.0 and pos["accepted"]
                seen += 1
                deferred += int(pos["deferred"])
        assert sum(len(s.committed) for s in trace.steps) == len(trace.output_ids)
    assert seen > 0
    if (rule, alpha) == ("opt", 0.0):
        assert deferred > 0


def test_greedy_verification_records_the_rule_inputs_too(large, small):
    trace = run(large, "spec_cascade", PROMPTS[0], 12, {"rule": "opt", "alpha": 0.3, "gamma": 3}, draft=small)
    nodes = [n for s in trace.steps for n in s.evidence["tree"]["nodes"] if n["p"] is not None]
    assert nodes and all(n["deferred"] == recompute("opt", 0.3, n) for n in nodes)


# ---------------------------------------------------------------------- the sampled distribution
def one_position(p: torch.Tensor, q: torch.Tensor, rule: str, alpha: float, rng: np.random.Generator) -> int:
    """Draft from q, verify against the mixture target, redraw on rejection: the committed token."""
    target, _ = mixture_target(rule, alpha, p, q)
    x = sample_index(q, float(rng.random()))
    if rng.random() < accept_probability(target, q, x):
        return x
    return sample_index(residual(target, q), float(rng.random()))


@pytest.mark.parametrize("rule,alpha,defer", [("opt", 0.2, True), ("opt", 0.9, False), ("always", 0.0, True),
                                              ("chow", 0.1, False)])
def test_one_position_follows_the_mixture_exactly(rule, alpha, defer):
    q = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10])  # the unsure small model
    p = torch.tensor([0.05, 0.10, 0.60, 0.05, 0.20])  # the surer large model
    target, ev = mixture_target(rule, alpha, p, q)
    assert ev["deferred"] is defer
    rng = np.random.default_rng(7)
    n = 5_000
    counts = np.bincount([one_position(p, q, rule, alpha, rng) for _ in range(n)], minlength=5)
    exact = target.double().numpy() / float(target.double().sum())
    assert chisquare(counts, exact * n).pvalue > 1e-3
    # the empirical TV to the mixture; the q-only distribution is far from it when deferring
    assert 0.5 * np.abs(counts / n - exact).sum() < 0.04


def test_first_token_of_the_decoder_follows_the_mixture(large, small):
    """Over many seeds the decoder's first committed token (drafted and verified, or redrawn)
    follows the first position's mixture target computed from the two models directly."""
    prompt, knobs = PROMPTS[0], {**MIX, "rule": "opt", "alpha": 0.0, "gamma": 1, "temperature": 1.5}
    first = run(large, "spec_cascade", prompt, 2, knobs, draft=small)
    pos = first.steps[0].evidence["cascade"]["positions"][0]
    ids = list(first.prompt_ids)
    T = 1.5
    p = torch.softmax(large.forward(ids).logits[0, -1].float() / T, -1)
    q = torch.softmax(small.forward(ids).logits[0, -1].float()[:p.numel()] / T, -1)
    target, ev = mixture_target("opt", 0.0, p, q)
    assert ev["deferred"] == pos["deferred"] is True  # here the target is p, far from q (D_TV ~ 0.66)
    n = 300
    toks = [run(large, "spec_cascade", prompt, 2, knobs, draft=small, seed=s).output_ids[0] for s in range(n)]
    counts = np.bincount(toks, minlength=p.numel()).astype(float)
    exp = target.double().numpy() * n
    # chi-square on the tokens expected at least 5 times, the rest pooled into one bin
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    assert big.sum() >= 2
    assert chisquare(obs, e * obs.sum() / e.sum()).pvalue > 1e-3
    # and the test has power: the same counts reject the small model's q outright
    eq = q.double().numpy() * n
    obs_q = np.append(counts[big], counts[~big].sum())
    e_q = np.append(eq[big], eq[~big].sum())
    assert chisquare(obs_q, e_q * obs_q.sum() / e_q.sum()).pvalue < 1e-6


# ---------------------------------------------------------------------- bad knobs
@pytest.mark.parametrize("knobs,word", [({"verify": "soft"}, "verify"), ({"alpha": 1.5}, "alpha"),
                                        ({"alpha": -2.0}, "alpha"), ({"temperature": -0.1}, "temperature"),
                                        ({"rule": "token"}, "rule")])
def test_bad_knobs_are_refused_in_one_line(large, small, knobs, word):
    with pytest.raises(PlaygroundError, match=word) as e:
        prepare(model=large, decoder="spec_cascade", prompt="ROMEO:", max_new_tokens=4, params=knobs, draft=small)
    assert "\n" not in str(e.value)
