"""``mbr``: sampling-based minimum Bayes risk decoding with separate hypothesis and reference sets."""

from __future__ import annotations

from typing import Any, Iterator

from decoders.base import Choice, Context, Decoder, Float, Int, Params, register
from decoders.citation import Paper, arxiv
from decoders.beam_batch import finish_reason_of
from decoders.search._parallel import _filter_chain, _filter_knobs, iid_chooser, parallel_samples
from decoders.search._utility import UTILITIES, aggregated, ngram_f1, pairwise
from playground.core.trace import Step

SAMPLERS = ("sample", "epsilon")


@register
class MBR(Decoder):
    """Sampling-based minimum Bayes risk decoding (Eikema & Aziz 2020; Freitag et al. 2023).

    Draw ``num_hypotheses`` hypotheses and ``num_references`` pseudo-references from the model,
    each set with its own sampler (``sample``: the temperature/top-k/top-p/min-p knobs;
    ``epsilon``: the same plus epsilon sampling, which Freitag et al. found best for MBR),
    in one batched pass per set. Return the hypothesis with the highest expected utility
    against the references. With ``num_references = 0`` the hypotheses are their own
    references (each against the others). Utilities: token n-gram F1 (mean over n =
    1..max_n), chrF and sentence BLEU from sacrebleu on the decoded text. ``aggregation``:
    ``pairwise`` averages the n x m utility matrix (drawn as a heatmap with the chosen row);
    ``reference`` compares each hypothesis once with the references' averaged n-gram
    statistics (reference aggregation, DeNero et al. 2009; Vamvas & Sennrich 2024), O(n + m)
    utility calls, for every utility: chrF against the mean character n-gram counts, BLEU
    against the mean word n-gram counts and the closest reference length (scored from those
    statistics by sacrebleu's public ``BLEU.compute_bleu``). One hypothesis is returned as is.
    Simplifies: no neural utilities (COMET, BLEURT) and no pruning of the hypothesis set.
    """

    name = "mbr"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = Params(
        num_hypotheses=Int(8, 1, 64, "hypotheses drawn (the candidates)"),
        num_references=Int(0, 0, 64, "pseudo-references drawn; 0 = the hypotheses are their own references"),
        hyp_sampler=Choice("sample", SAMPLERS, "how hypotheses are drawn: sample (the filters below) or epsilon"),
        ref_sampler=Choice("sample", SAMPLERS, "how references are drawn: sample (the filters below) or epsilon"),
        epsilon=Float(0.02, 0.0, 0.5, "epsilon sampler: drop tokens below this probability"),
        utility=Choice("ngram_f1", UTILITIES, "utility: token n-gram F1, chrF or sentence BLEU (sacrebleu)"),
        max_n=Int(2, 1, 4, "ngram_f1: mean n-gram F1 for n = 1..max_n"),
        aggregation=Choice("pairwise", ("pairwise", "reference"),
                           "pairwise: mean utility over the references; reference: against their aggregate (O(n+m))"),
        **_filter_knobs(),
    )
    reference = ("Eikema & Aziz 2020, Is MAP Decoding All You Need? (COLING); Freitag et al. 2023, Epsilon "
                 "Sampling Rocks (Findings of EMNLP); Vamvas & Sennrich 2024, Linear-time Minimum Bayes Risk "
                 "Decoding with Reference Aggregation (ACL); Kumar & Byrne 2004")
    papers = (
        arxiv("Eikema & Aziz 2020, Is MAP Decoding All You Need? The Inadequacy of the Mode in "
              "Neural Machine Translation (COLING)", "2005.10283"),
        arxiv("Freitag et al. 2023, Epsilon Sampling Rocks: Investigating Sampling Strategies "
              "for Minimum Bayes Risk Decoding (Findings of EMNLP)", "2305.09860"),
        arxiv("Vamvas & Sennrich 2024, Linear-time Minimum Bayes Risk Decoding with Reference "
              "Aggregation (ACL)", "2402.04251"),
        Paper("Kumar & Byrne 2004, Minimum Bayes-Risk Decoding for Statistical Machine Translation (NAACL)",
              "https://aclanthology.org/N04-1022/"),
    )
    description = "Draw hypotheses and references; return the hypothesis with the highest expected utility"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        n, m = int(p["num_hypotheses"]), int(p["num_references"])

        def chain(sampler: str):
            return _filter_chain(p, float(p["epsilon"]) if sampler == "epsilon" else 0.0)

        hyps = yield from parallel_samples(ctx, n, iid_chooser(ctx), False, chain(p["hyp_sampler"]), "hypotheses")
        if m:
            refs = yield from parallel_samples(ctx, m, iid_chooser(ctx, "mbr-ref"), False, chain(p["ref_sampler"]),
                                               "references")
            ref_seqs = refs.seqs
        else:
            ref_seqs = hyps.seqs
        decode, util = ctx.target.decode, str(p["utility"])
        matrix: list[list[float | None]] | None = None
        if n == 1 and not m:
            expected = [0.0]  # nothing to compare with: the one hypothesis is the answer
        elif p["aggregation"] == "reference":
            expected = aggregated(util, hyps.seqs, ref_seqs, decode, int(p["max_n"]))
        else:
            matrix = pairwise(util, hyps.seqs, ref_seqs, decode, int(p["max_n"]), skip_self=not m)
            expected = [sum(x for x in row if x is not None) / max(1, sum(x is not None for x in row))
                        for row in matrix]
        best = max(range(n), key=lambda i: (expected[i], -i))
        self.output_override = list(hyps.seqs[best])
        self.finish_reason = finish_reason_of(ctx, hyps.seqs[best])
        self.extra_stats["chosen_sample"] = best
        self.extra_stats["samples"] = [{"ids": s, "logprob": round(lp, 5), "utility": round(u, 5)}
                                       for s, lp, u in zip(hyps.seqs, hyps.logp, expected)]
        if m:
            self.extra_stats["references"] = [{"ids": s, "logprob": round(lp, 5)} for s, lp in zip(refs.seqs, refs.logp)]
        beams = [{"ids": list(s), "score": round(u, 5), "logprob": round(lp, 5), "parent": None, "finished": True,
                  "chosen": i == best} for i, (s, lp, u) in enumerate(zip(hyps.seqs, hyps.logp, expected))]
        ev = {"utility": util, "aggregation": p["aggregation"], "expected": [round(u, 5) for u in expected],
              "chosen": best, "references": "hypotheses" if not m else "separate",
              "matrix": None if matrix is None else [[None if x is None else round(x, 4) for x in row]
                                                     for row in matrix]}
        yield Step("beam", [], beams=beams, mbr=ev)


__all__ = ["MBR", "ngram_f1"]
