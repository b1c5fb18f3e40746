"""The Bradley–Terry fit: the MM iteration's answer is the likelihood's maximum, ties count half,
the prior keeps separated tables finite, and bootstrap intervals behave."""

from __future__ import annotations

import math
import random

import pytest
import torch

from playground.bradley_terry import best_scale, bootstrap_intervals, fit, fit_strengths, win_probability


def _table(counts: dict[tuple[str, str], int]) -> list[tuple[str, str, float]]:
    return [(a, b, 1.0) for (a, b), n in counts.items() for _ in range(n)]


def _mle_by_gradient(items, comps, prior):
    """The same objective maximised independently (LBFGS on log-strengths)."""
    idx = {x: i for i, x in enumerate(items)}
    theta = torch.zeros(len(items), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([theta], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        ll = theta.new_zeros(())
        for a, b, out in comps:
            d = theta[idx[a]] - theta[idx[b]]
            ll = ll + out * torch.nn.functional.logsigmoid(d) + (1 - out) * torch.nn.functional.logsigmoid(-d)
        # prior games against a reference of log-strength 0, half won
        ll = ll + prior * 0.5 * (torch.nn.functional.logsigmoid(theta) + torch.nn.functional.logsigmoid(-theta)).sum()
        (-ll).backward()
        return -ll

    opt.step(loss)
    t = theta.detach()
    return (t - t.mean()).tolist()


def test_two_items_recover_the_win_rate():
    p, _ = fit_strengths(["a", "b"], _table({("a", "b"): 7, ("b", "a"): 3}), prior=0)
    assert p[0] / (p[0] + p[1]) == pytest.approx(0.7, abs=1e-8)


@pytest.mark.parametrize("prior", [0.0, 1.0])
def test_mm_reaches_the_maximum_found_by_a_different_optimiser(prior):
    counts = {("a", "b"): 6, ("b", "a"): 2, ("a", "c"): 3, ("c", "a"): 4, ("b", "c"): 5, ("c", "b"): 1,
              ("d", "a"): 2, ("a", "d"): 5, ("d", "c"): 3, ("c", "d"): 3, ("b", "d"): 2, ("d", "b"): 2}
    comps = _table(counts) + [("a", "b", 0.5), ("c", "d", 0.5)]
    f = fit(comps, prior=prior)
    ref = _mle_by_gradient(f.items, comps, prior)
    assert f.scores == pytest.approx(ref, abs=1e-6)


def test_known_table_by_hand():
    # a beats b 2-1, b beats c 2-1, a beats c 2-1 (prior 0): the MLE satisfies
    # W_i = Σ_j n_ij π_i/(π_i+π_j); checked at the fitted point
    comps = _table({("a", "b"): 2, ("b", "a"): 1, ("b", "c"): 2, ("c", "b"): 1, ("a", "c"): 2, ("c", "a"): 1})
    items = ["a", "b", "c"]
    p, _ = fit_strengths(items, comps, prior=0)
    pi = dict(zip(items, p))
    wins = {"a": 4, "b": 3, "c": 2}
    for i in items:
        expected = sum(3 * pi[i] / (pi[i] + pi[j]) for j in items if j != i)
        assert expected == pytest.approx(wins[i], abs=1e-8)
    assert pi["a"] > pi["b"] > pi["c"]


def test_a_tie_counts_half_a_win_to_each():
    tied = fit([("a", "b", 0.5)] * 4, prior=0.0001)
    assert tied.scores[0] == pytest.approx(tied.scores[1], abs=1e-9)
    half = fit([("a", "b", 0.5)] * 2 + [("a", "b", 1.0)] + [("a", "b", 0.0)], prior=0.0001)
    assert half.scores[0] == pytest.approx(half.scores[1], abs=1e-6)
    assert tied.ties == [4, 4] and tied.wins == [0, 0]


def test_separated_tables_stay_finite_with_the_prior_and_are_refused_without():
    comps = _table({("a", "b"): 5, ("b", "c"): 5})
    with pytest.raises(ValueError, match="infinite"):
        fit_strengths(["a", "b", "c"], comps, prior=0)
    f = fit(comps, prior=1.0)
    assert all(math.isfinite(s) for s in f.scores)
    assert f.scores[f.items.index("a")] > f.scores[f.items.index("b")] > f.scores[f.items.index("c")]
    assert sum(f.scores) == pytest.approx(0.0, abs=1e-9)


def test_bad_outcomes_are_refused():
    with pytest.raises(ValueError):
        fit([("a", "b", 0.3)])
    with pytest.raises(ValueError):
        fit_strengths(["a"], [("a", "z", 1.0)])


def test_win_probability_of_scores():
    f = fit(_table({("a", "b"): 8, ("b", "a"): 2}), prior=0)
    assert win_probability(f.scores[0], f.scores[1]) == pytest.approx(0.8, abs=1e-8)


def test_bootstrap_interval_covers_the_fit_and_narrows_with_more_ballots():
    rng = random.Random(1)

    def ballots(n):  # a wins 75% of its games against b
        return [[("a", "b", 1.0 if rng.random() < 0.75 else 0.0)] for _ in range(n)]

    few, many = ballots(12), ballots(400)
    ci_few = bootstrap_intervals(few, ["a", "b"])
    ci_many = bootstrap_intervals(many, ["a", "b"])
    f = fit([c for b in many for c in b])
    lo, hi = ci_many["a"]
    assert lo < f.scores[0] < hi and lo > 0  # a is measurably better
    assert (hi - lo) < (ci_few["a"][1] - ci_few["a"][0])
    assert bootstrap_intervals(many, ["a", "b"]) == ci_many  # fixed seed: the same on every load
    assert bootstrap_intervals(few[:1], ["a", "b"])["a"] == (-math.inf, math.inf)


@pytest.mark.parametrize("seed", range(4))
def test_the_fit_is_the_posteriors_stationary_point_in_few_iterations(seed):
    # a lopsided table: the scale only the prior pins used to take the 10,000-iteration cap
    rng = random.Random(seed)
    items = ["a", "b", "c", "d"]
    skill = {"a": 2.0, "b": 0.5, "c": 0.0, "d": -1.5}
    comps = []
    for _ in range(600):
        x, y = rng.sample(items, 2)
        comps.append((x, y, 1.0 if rng.random() < win_probability(skill[x], skill[y]) else 0.0))
    p, iterations = fit_strengths(items, comps, prior=1.0)
    assert iterations < 200
    pi = [x * best_scale([math.log(v) for v in p]) for x in p]  # the MAP's own scale
    index = {it: k for k, it in enumerate(items)}
    grad = [0.5 - v / (v + 1.0) for v in pi]  # one virtual game against the reference, half won
    for a, b, out in comps:
        i, j = index[a], index[b]
        grad[i] += out - pi[i] / (pi[i] + pi[j])
        grad[j] += (1.0 - out) - pi[j] / (pi[i] + pi[j])
    assert max(abs(g) for g in grad) < 1e-6
