"""``arithmetic``: arithmetic sampling, N stratified samples read from one code line."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Iterator

import torch

from decoders.base import Choice, Context, Decoder, Int, Params, register
from decoders.citation import arxiv
from decoders.beam_batch import finish_reason_of
from decoders.search._parallel import _filter_knobs, _filters_lossy, parallel_samples
from playground.core.trace import Step


def cdf_interval(probs: torch.Tensor, code: Fraction, order: str) -> tuple[int, Fraction, Fraction]:
    """The token whose CDF interval ``[lo, hi)`` holds ``code``, and that interval.

    Tokens are laid out in id order (``order="id"``, the paper's fixed vocabulary order)
    or by descending probability (``"prob"``, ties by id). Interval ends are the float64
    cumulative sums, read as exact rationals, so the search and the rescaling are exact.
    """
    p = probs.detach().double().cpu()
    p = p / p.sum()
    perm = torch.arange(p.numel()) if order == "id" else torch.argsort(-p, stable=True)
    cdf = torch.cumsum(p[perm], 0).clamp_(max=1.0)
    cdf[-1] = 1.0
    j = int(torch.searchsorted(cdf, torch.tensor([float(code)], dtype=torch.float64), right=True).item())
    j = min(j, p.numel() - 1)
    while j > 0 and Fraction(float(cdf[j - 1])) > code:
        j -= 1
    while Fraction(float(cdf[j])) <= code:
        j += 1
    lo = Fraction(float(cdf[j - 1])) if j > 0 else Fraction(0)
    return int(perm[j]), lo, Fraction(float(cdf[j]))


def arithmetic_codes(n: int, offset: float) -> list[Fraction]:
    """``n`` code points evenly spaced in [0, 1) with one shared random offset."""
    u = Fraction(offset)
    return [(Fraction(i) + u) / n for i in range(n)]


@register
class Arithmetic(Decoder):
    """Arithmetic sampling (Vilnis et al. 2023): N parallel samples from evenly spaced codes.

    The language model is read as an arithmetic code book on [0, 1): sample ``i`` owns the
    code ``(i + u) / N`` with one shared uniform offset ``u`` (the common random number
    ``ctx.uniform(0)``). At each step every sample lays its next-token distribution (after
    temperature/top-k/top-p/min-p, as the paper allows) out as CDF intervals in a fixed
    token order, emits the token whose interval holds its code, and rescales the code into
    that interval, ``c <- (c - lo) / (hi - lo)``. Each sample alone is an exact draw from
    the (processed) model, while codes falling in different intervals give different tokens,
    so the N samples are spread out (stratified) instead of independent.
    Codes are exact rationals, so the rescaling loses no precision however long the run.
    Steps are ``beam`` steps showing all N sequences with the code each one read and the
    interval it fell in (the method is the shared code line split among the samples; a
    token view of sample 0 alone would hide it); sample 0 is the output.
    """

    name = "arithmetic"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = Params(
        num_samples=Int(4, 1, 64, "parallel samples (code points)"),
        token_order=Choice("id", ("id", "prob"), "order of the CDF intervals: token id (paper) or probability"),
        **_filter_knobs(),
    )
    reference = ("Vilnis et al. 2023, Arithmetic Sampling: Parallel Diverse Decoding for Large "
                 "Language Models (ICML)")
    papers = (
        arxiv("Vilnis et al. 2023, Arithmetic Sampling: Parallel Diverse Decoding for Large "
              "Language Models (ICML)", "2210.15458"),
    )
    description = "N stratified samples: evenly spaced code points read through the model's CDFs"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return _filters_lossy(params)

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        n = p["num_samples"]
        codes = arithmetic_codes(n, ctx.uniform(0))

        def choose(i: int, t: int, probs: torch.Tensor) -> tuple[int, dict[str, Any]]:
            tok, lo, hi = cdf_interval(probs, codes[i], p["token_order"])
            ev = {"code": float(codes[i]), "interval": [float(lo), float(hi)]}
            codes[i] = (codes[i] - lo) / (hi - lo)
            return tok, ev

        res = yield from parallel_samples(ctx, n, choose, commit_first=True)
        self.finish_reason = finish_reason_of(ctx, res.seqs[0])
        self.extra_stats["samples"] = [{"ids": s, "logprob": round(lp, 5)} for s, lp in zip(res.seqs, res.logp)]
        self.extra_stats["distinct_samples"] = len({tuple(s) for s in res.seqs})
