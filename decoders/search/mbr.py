"""``mbr``: sampling-based minimum Bayes risk decoding."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from decoders.base import Context, Decoder, Int, Params, register
from decoders.search._beam import finish_reason_of
from decoders.search._parallel import _filter_knobs, iid_chooser, parallel_samples
from playground.trace import Step


def ngram_f1(hyp: Sequence[int], ref: Sequence[int], max_n: int) -> float:
    """Mean over n = 1..max_n of the F1 of clipped n-gram matches (a token-level BLEU/chrF cousin)."""
    from collections import Counter

    total = 0.0
    for n in range(1, max_n + 1):
        h = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
        r = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
        if not h or not r:
            total += 1.0 if not h and not r else 0.0
            continue
        match = sum((h & r).values())
        prec, rec = match / sum(h.values()), match / sum(r.values())
        total += 0.0 if match == 0 else 2 * prec * rec / (prec + rec)
    return total / max_n


@register
class MBR(Decoder):
    """Sampling-based minimum Bayes risk decoding (Eikema & Aziz 2020).

    Draw N samples; each is a hypothesis and, with the others, a pseudo-reference drawn
    from the model. Return the hypothesis with the highest mean utility against the other
    samples, i.e. the sample that agrees most with what the model would say. Utility:
    token n-gram F1 (mean over n = 1..max_n). Simplifies: a token-level utility instead of
    BLEU/chrF/COMET on text, and hypotheses = pseudo-references (no separate sets).
    """

    name = "mbr"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = Params(
        num_samples=Int(8, 2, 64, "samples, each a hypothesis and a pseudo-reference"),
        max_n=Int(2, 1, 4, "utility: mean n-gram F1 for n = 1..max_n"),
        **_filter_knobs(),
    )
    reference = ("Eikema & Aziz 2020, Is MAP Decoding All You Need? The Inadequacy of the Mode "
                 "in Neural Machine Translation (COLING); Kumar & Byrne 2004")
    description = "Draw N samples; return the one with the highest expected utility against the rest"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        n = p["num_samples"]
        res = yield from parallel_samples(ctx, n, iid_chooser(ctx), commit_first=False)
        util = [sum(ngram_f1(res.seqs[i], res.seqs[j], p["max_n"]) for j in range(n) if j != i) / (n - 1)
                for i in range(n)]
        best = max(range(n), key=lambda i: (util[i], -i))
        self.output_override = list(res.seqs[best])
        self.finish_reason = finish_reason_of(ctx, res.seqs[best])
        self.extra_stats["chosen_sample"] = best
        self.extra_stats["samples"] = [{"ids": s, "logprob": round(lp, 5), "utility": round(u, 5)}
                                       for s, lp, u in zip(res.seqs, res.logp, util)]
