"""MBR utilities: token n-gram F1, chrF and BLEU (sacrebleu), pairwise and against an
aggregated reference (DeNero et al. 2009; Vamvas & Sennrich 2024)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from playground.core.errors import PlaygroundError

UTILITIES = ("ngram_f1", "chrf", "bleu")
AGGREGATABLE = ("ngram_f1", "chrf")


def ngram_f1(hyp: Sequence[int], ref: Sequence[int], max_n: int) -> float:
    """Mean over n = 1..max_n of the F1 of clipped n-gram matches (a token-level BLEU/chrF cousin)."""
    return ngram_f1_counts(hyp, [token_ngrams(ref, n) for n in range(1, max_n + 1)], max_n)


def token_ngrams(ids: Sequence[int], n: int) -> Counter:
    """The n-grams of a token sequence with their counts."""
    return Counter(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))


def ngram_f1_counts(hyp: Sequence[int], refs_by_n: Sequence[Counter], max_n: int) -> float:
    """:func:`ngram_f1` against reference n-gram counts, which may be fractional (an average)."""
    total = 0.0
    for n in range(1, max_n + 1):
        h, r = token_ngrams(hyp, n), refs_by_n[n - 1]
        r_total = sum(r.values())
        if not h or r_total <= 0:
            total += 1.0 if not h and r_total <= 0 else 0.0
            continue
        match = sum(min(c, r.get(g, 0.0)) for g, c in h.items())
        prec, rec = match / sum(h.values()), match / r_total
        total += 0.0 if match <= 0 else 2 * prec * rec / (prec + rec)
    return total / max_n


def _metric(name: str):
    try:
        from sacrebleu.metrics import BLEU, CHRF
    except ImportError:  # pragma: no cover - a dependency of the package
        raise PlaygroundError("the chrf/bleu utilities need sacrebleu (pip install 'sacrebleu>=2.4')") from None
    return CHRF() if name == "chrf" else BLEU(effective_order=True)


def pairwise(name: str, hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]], decode, max_n: int,
             skip_self: bool) -> list[list[float | None]]:
    """The utility matrix ``u[i][j]`` of hypothesis i against reference j, in [0, 1]
    (``None`` on the diagonal when the hypotheses are their own references)."""
    out: list[list[float | None]] = []
    if name == "ngram_f1":
        for i, h in enumerate(hyps):
            out.append([None if skip_self and i == j else ngram_f1(h, r, max_n) for j, r in enumerate(refs)])
        return out
    metric = _metric(name)
    ht, rt = [decode(list(h)) for h in hyps], [decode(list(r)) for r in refs]
    for i, h in enumerate(ht):
        out.append([None if skip_self and i == j else metric.sentence_score(h, [r]).score / 100.0
                    for j, r in enumerate(rt)])
    return out


def aggregated(name: str, hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]], decode,
               max_n: int) -> list[float]:
    """Each hypothesis's utility against the *average* of the references' n-gram statistics:
    one comparison per hypothesis, O(n + m) instead of O(n * m)."""
    if name not in AGGREGATABLE:
        raise PlaygroundError(f"reference aggregation works with the utilities {', '.join(AGGREGATABLE)}, "
                              f"not {name!r}")
    m = len(refs)
    if name == "ngram_f1":
        avg = []
        for n in range(1, max_n + 1):
            c: Counter = Counter()
            for r in refs:
                for g, k in token_ngrams(r, n).items():
                    c[g] += k / m
            avg.append(c)
        return [ngram_f1_counts(h, avg, max_n) for h in hyps]
    from sacrebleu.metrics.helpers import extract_all_char_ngrams

    chrf = _metric("chrf")
    ref_orders = [extract_all_char_ngrams(decode(list(r)), chrf.char_order, chrf.whitespace) for r in refs]
    mean = []
    for k in range(chrf.char_order):
        c = Counter()
        for orders in ref_orders:
            for g, v in orders[k].items():
                c[g] += v / m
        mean.append(c)
    out = []
    for h in hyps:
        stats: list[float] = []
        for hk, rk in zip(extract_all_char_ngrams(decode(list(h)), chrf.char_order, chrf.whitespace), mean):
            stats.extend(chrf._get_match_statistics(hk, rk))
        out.append(chrf._compute_f_score(stats) / 100.0)
    return out
