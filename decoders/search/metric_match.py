"""``metric_match``: metric matching by sampling-importance-resampling (A098).

Draw N samples from the model, score each with a sequence metric, tilt the samples' weights
``w_i ∝ exp(beta · metric_i)`` with ``beta`` solved so the weighted mean metric equals a
target, and resample one output by those weights. The evidence is every sample's metric and
weight, ``beta`` and the effective sample size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from decoders.base import Choice, Context, Decoder, Float, Int, Params, PlaygroundError, register
from decoders.beam_batch import finish_reason_of
from decoders.citation import Paper
from decoders.search._parallel import _filter_knobs, _filters_lossy, iid_chooser, parallel_samples
from playground.core.trace import Step

# name -> what it measures (the knob's help and the plot's axis say the same)
METRICS: dict[str, str] = {
    "length": "tokens generated (a stop token counts)",
    "distinct_2": "distinct token bigrams / bigrams (1 = no bigram repeats; under 2 tokens counts as 1)",
    "surprisal": "mean surprisal under the raw model, nats per token (-log p(y) / |y|)",
}
STREAM = "sir"  # the common-random-number stream of the resampling draw
# bisection on beta in standardised units stops at this bracket width: beta is then exact to
# float64's resolution of the weighted mean, far inside the 1e-6 the moment equation asks for
_BISECT_STEPS = 200
_BRACKET_MAX = 1e6


def sample_metric(name: str, ids: Sequence[int], logp: float) -> float:
    """The metric ``name`` of one sample (token ids ``ids``, raw-model log-probability ``logp``)."""
    if name == "length":
        return float(len(ids))
    if name == "distinct_2":
        pairs = list(zip(ids, ids[1:]))
        # nothing can repeat in fewer than two tokens: count it as fully distinct
        return 1.0 if not pairs else len(set(pairs)) / len(pairs)
    if name == "surprisal":
        return -float(logp) / max(1, len(ids))
    raise PlaygroundError(f"unknown metric {name!r}; choose one of: {', '.join(METRICS)}")


def ess(weights: Sequence[float]) -> float:
    """Effective sample size ``(sum w)^2 / sum w^2`` (0 for no weight at all)."""
    s = math.fsum(weights)
    s2 = math.fsum(w * w for w in weights)
    return 0.0 if s2 <= 0 else s * s / s2


@dataclass
class Tilt:
    """The exponential tilt of N samples towards a target mean metric.

    ``weights`` are normalised (sum 1); ``beta`` is the tilt in the metric's units (None when
    the target lies at or past the samples' range and the tilt is its ``±inf`` limit);
    ``status`` is ``solved``, ``clamped_low``/``clamped_high`` (the target is at or beyond the
    smallest/largest metric: all the weight goes to the samples that have it) or ``flat``
    (every sample has the same metric: nothing to tilt, the weights stay uniform); ``note``
    says so in a sentence when the weighted mean misses the target."""

    beta: float | None
    weights: list[float]
    weighted_mean: float
    status: str
    note: str = ""


def _weights(z: np.ndarray, b: float) -> np.ndarray:
    """Normalised ``exp(b z)`` (shifted by its maximum: no overflow at any b)."""
    e = b * z
    w = np.exp(e - e.max())
    return w / w.sum()


def tilt_to_target(metrics: Sequence[float], target: float) -> Tilt:
    """Weights ``w_i ∝ exp(beta · m_i)`` whose weighted mean of ``m`` is ``target``.

    The weighted mean rises monotonically with ``beta`` (its derivative is the weighted
    variance), from the smallest metric (``beta → -inf``) to the largest (``+inf``), so a
    target strictly inside the samples' range has exactly one ``beta``, found by bisection
    (on standardised metrics, so the bracket does not depend on the metric's scale). A target
    at or outside the range is clamped to the limit tilt, with a note.
    """
    m = np.asarray([float(x) for x in metrics], dtype=np.float64)
    if m.size == 0:
        raise PlaygroundError("metric matching needs at least one sample")
    if not np.isfinite(m).all() or not math.isfinite(target):
        raise PlaygroundError("metric matching needs finite metrics and a finite target")
    lo, hi = float(m.min()), float(m.max())
    spread = hi - lo
    if spread <= 1e-12 * max(1.0, abs(lo)):
        w = np.full(m.size, 1.0 / m.size)
        note = "" if abs(target - lo) <= 1e-6 else (
            f"every sample has metric {lo:.6g}: the weights stay uniform, target {target:.6g} is out of reach")
        return Tilt(0.0, w.tolist(), float(np.dot(w, m)), "flat", note)
    if target <= lo or target >= hi:
        side = "low" if target <= lo else "high"
        edge = lo if side == "low" else hi
        mask = np.isclose(m, edge, rtol=0.0, atol=1e-12 * max(1.0, abs(edge)))
        w = mask / mask.sum()
        note = "" if target == edge else (
            f"target {target:.6g} is outside the samples' range [{lo:.6g}, {hi:.6g}]: all weight on the "
            f"sample(s) with metric {edge:.6g}, the tilt's beta → {'-' if side == 'low' else '+'}inf limit")
        return Tilt(None, w.tolist(), float(np.dot(w, m)), f"clamped_{side}", note)
    mean, sd = float(m.mean()), float(m.std())
    z = (m - mean) / sd
    tz = (target - mean) / sd

    def mu(b: float) -> float:
        return float(np.dot(_weights(z, b), z))

    b_lo, b_hi = -1.0, 1.0
    while mu(b_lo) > tz and b_lo > -_BRACKET_MAX:
        b_lo *= 2.0
    while mu(b_hi) < tz and b_hi < _BRACKET_MAX:
        b_hi *= 2.0
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (b_lo + b_hi)
        if mid in (b_lo, b_hi):  # the bracket is one float wide
            break
        if mu(mid) < tz:
            b_lo = mid
        else:
            b_hi = mid
    # of the bracket's two ends, the one whose mean is closer to the target
    b = min((b_lo, b_hi), key=lambda x: abs(mu(x) - tz))
    w = _weights(z, b)
    return Tilt(b / sd, w.tolist(), float(np.dot(w, m)), "solved")


def resample(weights: Sequence[float], u: float) -> int:
    """The index whose cumulative-weight interval holds ``u * total`` (inverse CDF, u in [0, 1)).

    A zero-weight sample is never picked (rounding at the top end falls back to the last
    sample with weight)."""
    total = math.fsum(weights)
    if not total > 0:
        raise PlaygroundError("cannot resample: no sample has weight")
    x = u * total
    acc = 0.0
    last = 0
    for i, w in enumerate(weights):
        if w <= 0:
            continue
        last = i
        acc += w
        if x < acc:
            return i
    return last


class MetricMatchParams(Params):
    """The decoder's knobs, plus the cross-check of the target against the metric's scale."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        if out["metric"] == "distinct_2" and out["target"] > 1.0:
            raise PlaygroundError(f"decoder {decoder!r}: distinct_2 lies in [0, 1], so knob 'target'="
                                  f"{out['target']:g} can never be matched")
        return out


@register
class MetricMatch(Decoder):
    """Metric matching by sampling-importance-resampling: draw ``num_samples`` continuations
    from the model (the temperature/top-k/top-p/min-p knobs, as ``best_of_n``), weight each
    by ``exp(beta · metric)`` with ``beta`` solved so the weighted mean metric equals
    ``target``, and return one sample drawn by those weights (common random number
    ``uniform(0, "sir")``). As ``num_samples`` grows the output follows the model tilted
    towards the target statistic: ``p(y) exp(beta m(y)) / Z``, the least-KL change of the
    model whose expected metric is the target.

    Metrics: ``length`` (tokens; only varies when samples can stop), ``distinct_2`` (token
    bigram diversity, a repetition measure) and ``surprisal`` (mean nats per token under the
    raw model). A target at or beyond the samples' range puts all weight on the extreme
    samples, with a note in the evidence; one the samples cannot reach at all (equal metrics)
    leaves the weights uniform, with a note.

    Simplifies relative to the paper: one metric instead of an energy over several with
    fitted weights, a target the user gives instead of statistics measured on human text,
    and ``beta`` calibrated per prompt on the same N samples it resamples (a self-normalised
    estimate, biased for small N) rather than once on a held-out set.
    """

    name = "metric_match"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = MetricMatchParams(
        num_samples=Int(8, 2, 64, "samples drawn in parallel (the SIR candidates)"),
        metric=Choice("surprisal", tuple(METRICS), "the matched statistic: " + "; ".join(
            f"{k}: {v}" for k, v in METRICS.items())),
        target=Float(3.5, 0.0, 1e6, "the weighted mean metric to match (in the metric's units)"),
        **_filter_knobs(),
    )
    reference = ("Metric-matching decoding: the model's distribution tilted by a metric energy, calibrated to a "
                 "target, sampled by sampling-importance-resampling (A098)")
    papers = (
        # no title or identifier of the paper is known here: the link searches for the method by name
        Paper("Metric-matching decoding via sampling-importance-resampling: an energy from sequence metrics, "
              "calibrated so expected metrics match human text",
              "https://huggingface.co/papers?q=metric+matching+decoding+importance+resampling"),
    )
    description = "Draw N samples, tilt their weights so the mean metric hits a target, resample one"
    shows = ("; its last step holds `sir`: each sample's metric and weight, beta, the weighted mean and the "
             "effective sample size (plot *SIR weights*)")

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        n, name, target = int(p["num_samples"]), str(p["metric"]), float(p["target"])
        res = yield from parallel_samples(ctx, n, iid_chooser(ctx), commit_first=False)
        metrics = [sample_metric(name, s, lp) for s, lp in zip(res.seqs, res.logp)]
        tilt = tilt_to_target(metrics, target)
        u = ctx.uniform(0, STREAM)
        chosen = resample(tilt.weights, u)
        self.output_override = list(res.seqs[chosen])
        self.finish_reason = finish_reason_of(ctx, res.seqs[chosen])
        self.extra_stats["chosen_sample"] = chosen
        self.extra_stats["ess"] = round(ess(tilt.weights), 4)
        self.extra_stats["samples"] = [{"ids": s, "logprob": round(lp, 5), "metric": round(m, 6),
                                        "weight": round(w, 6)}
                                       for s, lp, m, w in zip(res.seqs, res.logp, metrics, tilt.weights)]
        beams = [{"ids": list(s), "score": round(m, 6), "logprob": round(lp, 5), "parent": None, "finished": True,
                  "chosen": i == chosen, "weight": _sig(w)}
                 for i, (s, lp, m, w) in enumerate(zip(res.seqs, res.logp, metrics, tilt.weights))]
        ev = {"metric": name, "target": target, "beta": None if tilt.beta is None else _sig(tilt.beta),
              "status": tilt.status, "note": tilt.note, "metrics": [_sig(m) for m in metrics],
              "weights": [_sig(w) for w in tilt.weights], "weighted_mean": _sig(tilt.weighted_mean),
              "mean": _sig(sum(metrics) / len(metrics)), "ess": _sig(ess(tilt.weights)), "chosen": chosen,
              "u": _sig(u), "filters_lossy": _filters_lossy(p)}
        yield Step("beam", [], beams=beams, sir=ev)


def _sig(x: float) -> float:
    """A number for the trace: ten significant digits (weights near 0 keep their size)."""
    return float(f"{x:.10g}")


__all__ = ["METRICS", "MetricMatch", "Tilt", "ess", "resample", "sample_metric", "tilt_to_target"]
