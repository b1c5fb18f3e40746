"""Bradley–Terry strengths from pairwise comparisons, with bootstrap intervals.

Model: item i beats item j with probability π_i / (π_i + π_j). The maximum-likelihood strengths
come from Hunter's (2004) minorise–maximise iteration,

    π_i ← W_i / Σ_{j≠i} n_ij / (π_i + π_j),

where W_i counts i's wins (a tie counts half a win to each side) and n_ij the comparisons of
i with j. Written here rather than taken from ``choix``: the iteration is a few lines, and
``choix`` would add scipy to a project that needs nothing else from it.

Small vote tables are often *separated* (one configuration never lost), where the plain
maximum-likelihood strength is infinite. Every item therefore also plays ``prior`` virtual
games against a fixed reference of strength 1, winning half of them — a weak symmetric
prior (the MAP estimate) that keeps every strength finite and pulls the unmeasured ones to
the reference. ``prior=0`` is the plain MLE, for data that is connected both ways.

With a prior, the MM step alone creeps along the one direction the real games say nothing
about — the common scale of every strength, which only the weak prior pins — and took the
10,000-iteration cap on a two-item table of 400 games (delta still 1e-9). After each MM step
the strengths are therefore rescaled to the posterior's best common scale (a one-dimensional
root, :func:`best_scale`): the games' likelihood does not change under a common scale, so
this step too can only raise the posterior, and the fixed point is the same; the same table
converges in 5 iterations.

Scores are reported on the log scale, centred so their mean is 0 (only differences are
identified). The 95 % interval of each score is a percentile bootstrap over the *ballots*
(resampled with replacement, a fixed seed, so a Results view is the same on every load):
one reader's ballot yields several comparisons and they are resampled together.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Hashable, Sequence

# A comparison: (first item, second item, outcome) with outcome 1.0 when the first won,
# 0.0 when the second won and 0.5 for a tie.
Comparison = tuple[Hashable, Hashable, float]

MAX_ITER = 10_000
TOL = 1e-10


@dataclass(frozen=True)
class Fit:
    """Strengths of a fitted table: ``items`` in a fixed order, their centred log-strengths
    ``scores``, and per item the wins, losses and ties it was in (ties count once each)."""

    items: list[Hashable]
    scores: list[float]
    wins: list[int]
    losses: list[int]
    ties: list[int]
    iterations: int


def _tally(items: list[Hashable], comps: Sequence[Comparison]) -> tuple[list[float], list[list[float]]]:
    """Half-win counts per item and the symmetric comparison counts ``n[i][j]``."""
    index = {it: k for k, it in enumerate(items)}
    w = [0.0] * len(items)
    n = [[0.0] * len(items) for _ in items]
    for a, b, out in comps:
        i, j = index[a], index[b]
        if i == j:
            continue
        w[i] += out
        w[j] += 1.0 - out
        n[i][j] += 1.0
        n[j][i] += 1.0
    return w, n


def fit_strengths(items: list[Hashable], comps: Sequence[Comparison], prior: float = 1.0) -> tuple[list[float], int]:
    """The BT strengths π (geometric mean 1) of ``items`` from ``comps``, and the iterations
    used. ``prior`` virtual games per item against a reference of strength 1, half won.

    Raises ValueError for an outcome outside {0, 0.5, 1}, an unknown item, or (``prior=0``)
    an item with no win or no loss, whose MLE does not exist."""
    if prior < 0:
        raise ValueError("the prior must be ≥ 0")
    known = set(items)
    for a, b, out in comps:
        if out not in (0.0, 0.5, 1.0):
            raise ValueError(f"an outcome is 1, 0 or 0.5, not {out!r}")
        if a not in known or b not in known:
            raise ValueError(f"a comparison names an item not in the table: {a!r} vs {b!r}")
    w, n = _tally(items, comps)
    k = len(items)
    if prior == 0:
        for i in range(k):
            games = sum(n[i])
            if w[i] <= 0 or w[i] >= games:
                raise ValueError(f"{items[i]!r} never won or never lost: its maximum-likelihood strength is infinite")
    p = [1.0] * k
    it = 0
    for it in range(1, MAX_ITER + 1):
        new = []
        for i in range(k):
            denom = sum(n[i][j] / (p[i] + p[j]) for j in range(k) if j != i and n[i][j])
            denom += prior / (p[i] + 1.0)
            num = w[i] + prior / 2.0
            new.append(num / denom if denom > 0 else 1.0)
        if prior == 0:  # only ratios are identified: fix the geometric mean
            g = math.exp(sum(math.log(x) for x in new) / k)
            new = [x / g for x in new]
        else:  # the scale only the prior pins, set at its best at once
            c = best_scale([math.log(x) for x in new])
            new = [x * c for x in new]
        delta = max(abs(math.log(a) - math.log(b)) for a, b in zip(new, p))
        p = new
        if delta < TOL:
            break
    if prior > 0:
        g = math.exp(sum(math.log(x) for x in p) / k)
        p = [x / g for x in p]
    return p, it


def best_scale(logs: list[float]) -> float:
    """The common factor c that maximises the prior's share of the posterior for strengths
    ``exp(logs)``: Σ_i [½ log(c π_i) − log(c π_i + 1)], whose stationary point solves
    Σ_i tanh((log π_i + log c) / 2) = 0 — a strictly increasing function of log c, solved by
    Newton's method from the geometric mean (bisection bounds keep every step inside)."""
    lo, hi = -max(logs) - 40.0, -min(logs) + 40.0  # the root lies between: every tanh at ±1
    t = -sum(logs) / len(logs)
    for _ in range(60):
        th = [math.tanh((x + t) / 2.0) for x in logs]
        g = sum(th)
        if g > 0:
            hi = t
        else:
            lo = t
        slope = sum(0.5 * (1.0 - v * v) for v in th)
        step = t - g / slope if slope > 0 else (lo + hi) / 2.0
        t_next = step if lo < step < hi else (lo + hi) / 2.0
        if abs(t_next - t) < 1e-13:
            t = t_next
            break
        t = t_next
    return math.exp(t)


def fit(comps: Sequence[Comparison], prior: float = 1.0) -> Fit:
    """Fit the table of ``comps`` (items in order of first appearance)."""
    items = list(dict.fromkeys(x for a, b, _ in comps for x in (a, b)))
    if not items:
        return Fit([], [], [], [], [], 0)
    p, it = fit_strengths(items, comps, prior)
    logs = [math.log(x) for x in p]
    mean = sum(logs) / len(logs)
    wins, losses, ties = [0] * len(items), [0] * len(items), [0] * len(items)
    index = {x: i for i, x in enumerate(items)}
    for a, b, out in comps:
        i, j = index[a], index[b]
        if out == 0.5:
            ties[i] += 1
            ties[j] += 1
        elif out == 1.0:
            wins[i] += 1
            losses[j] += 1
        else:
            wins[j] += 1
            losses[i] += 1
    return Fit(items, [x - mean for x in logs], wins, losses, ties, it)


def bootstrap_intervals(ballots: Sequence[Sequence[Comparison]], items: list[Hashable], prior: float = 1.0,
                        reps: int = 200, level: float = 0.95, seed: int = 0) -> dict[Hashable, tuple[float, float]]:
    """Percentile bootstrap intervals of each item's centred log-strength, resampling whole
    ballots. An item absent from a resample is left out of that resample's scores; with fewer
    than two ballots the interval is (−inf, inf): one ballot says nothing about its spread."""
    if len(ballots) < 2:
        return {it: (-math.inf, math.inf) for it in items}
    rng = random.Random(seed)
    draws: dict[Hashable, list[float]] = {it: [] for it in items}
    for _ in range(reps):
        sample = [c for _ in ballots for c in ballots[rng.randrange(len(ballots))]]
        f = fit(sample, prior)
        for it, s in zip(f.items, f.scores):
            if it in draws:
                draws[it].append(s)
    out = {}
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    for it, xs in draws.items():
        if not xs:
            out[it] = (-math.inf, math.inf)
            continue
        xs.sort()
        out[it] = (_quantile(xs, lo_q), _quantile(xs, hi_q))
    return out


def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted ``xs``."""
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def win_probability(score_a: float, score_b: float) -> float:
    """P(a beats b) under the model, from two log-strengths."""
    return 1.0 / (1.0 + math.exp(score_b - score_a))
