"""``best_of_n``: sample-and-rank by the model's own likelihood."""

from __future__ import annotations

from typing import Any, Iterator

from decoders.base import Context, Decoder, Float, Int, Params, register
from decoders.citation import arxiv
from decoders.beam_batch import finish_reason_of
from decoders.search._parallel import _filter_knobs, iid_chooser, length_normalised, parallel_samples
from playground.core.trace import Step


@register
class BestOfN(Decoder):
    """Sample-and-rank (Adiwardana et al. 2020): draw N samples, return the most likely.

    N independent samples are drawn in one batch through temperature/top-k/top-p/min-p;
    the one with the highest ``log p(y) / |y| ** length_penalty`` under the raw model wins.
    Sample 0 uses the same common random numbers as the ``sample`` decoder, so with N = 1
    it is that decoder's output. Simplifies: the ranker is the model's own likelihood, not a
    separate reward model (best-of-N with a reward model needs one).
    """

    name = "best_of_n"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = Params(
        num_samples=Int(4, 1, 64, "samples drawn in parallel"),
        length_penalty=Float(1.0, 0.0, 2.0, "rank by logprob / length^this (0 = total, 1 = mean)"),
        **_filter_knobs(),
    )
    reference = "Adiwardana et al. 2020, Towards a Human-like Open-Domain Chatbot (sample-and-rank)"
    papers = (
        arxiv("Adiwardana et al. 2020, Towards a Human-like Open-Domain Chatbot "
              "(sample-and-rank)", "2001.09977"),
    )
    description = "Draw N samples in parallel; keep the one the model finds most likely"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        res = yield from parallel_samples(ctx, p["num_samples"], iid_chooser(ctx), commit_first=False)
        scores = [length_normalised(lp, len(s), p["length_penalty"]) for s, lp in zip(res.seqs, res.logp)]
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        self.output_override = list(res.seqs[best])
        self.finish_reason = finish_reason_of(ctx, res.seqs[best])
        self.extra_stats["chosen_sample"] = best
        self.extra_stats["samples"] = [{"ids": s, "logprob": round(lp, 5), "score": round(sc, 5)}
                                       for s, lp, sc in zip(res.seqs, res.logp, scores)]
