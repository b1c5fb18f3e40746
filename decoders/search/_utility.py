"""MBR utilities: token n-gram F1, chrF and BLEU (sacrebleu), pairwise and against an
aggregated reference (DeNero et al. 2009; Vamvas & Sennrich 2024)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF

from playground.core.errors import PlaygroundError

UTILITIES = ("ngram_f1", "chrf", "bleu")


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


def _metric(name: str) -> CHRF | BLEU:
    """sacrebleu's sentence-level metric for a utility name (BLEU with effective order, as
    sentence BLEU needs)."""
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
    if name not in UTILITIES:
        raise PlaygroundError(f"utility {name!r} is not one of {', '.join(UTILITIES)}")
    if name == "ngram_f1":
        avg = mean_bags([[token_ngrams(r, n) for n in range(1, max_n + 1)] for r in refs])
        return [ngram_f1_counts(h, avg, max_n) for h in hyps]
    if name == "bleu":
        return _aggregated_bleu(hyps, refs, decode)
    return _aggregated_chrf(hyps, refs, decode)


def mean_bags(bags_per_ref: Sequence[Sequence[Counter]]) -> list[Counter]:
    """Per order, the references' mean n-gram counts (fractional)."""
    m = len(bags_per_ref)
    out: list[Counter] = []
    for k in range(len(bags_per_ref[0]) if m else 0):
        c: Counter = Counter()
        for bags in bags_per_ref:
            for g, v in bags[k].items():
                c[g] += v / m
        out.append(c)
    return out


def char_ngrams(text: str, order: int) -> list[Counter]:
    """chrF's character n-grams of orders 1..``order``, whitespace removed (chrF's default)."""
    line = "".join(text.split())
    return [Counter(line[i:i + n] for i in range(len(line) - n + 1)) for n in range(1, order + 1)]


def chrf_score(hyp_bags: Sequence[Counter], ref_bags: Sequence[Counter], beta: float) -> float:
    """chrF_β (Popović 2015) in [0, 1] of a hypothesis's character n-grams against reference
    counts that may be fractional: precision and recall averaged over the orders both sides
    have, then F_β — the averaging sacrebleu 2.x's CHRF reports, which the test pins on one
    reference through sacrebleu's public ``sentence_score``. Written here because no public
    sacrebleu call scores against an averaged reference."""
    prec = rec = 0.0
    orders = 0
    for h, r in zip(hyp_bags, ref_bags):
        n_hyp, n_ref = sum(h.values()), sum(r.values())
        if n_hyp > 0 and n_ref > 0:
            match = sum(min(c, r.get(g, 0.0)) for g, c in h.items())
            prec, rec, orders = prec + match / n_hyp, rec + match / n_ref, orders + 1
    if not orders:
        return 0.0
    prec, rec = prec / orders, rec / orders
    if prec + rec <= 0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * prec * rec / (b2 * prec + rec)


def _aggregated_chrf(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]], decode) -> list[float]:
    chrf = _metric("chrf")
    mean = mean_bags([char_ngrams(decode(list(r)), chrf.char_order) for r in refs])
    return [chrf_score(char_ngrams(decode(list(h)), chrf.char_order), mean, chrf.beta) for h in hyps]


def _aggregated_bleu(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]], decode) -> list[float]:
    """Sentence BLEU against the references' mean word n-gram counts (the closest reference
    length for the brevity penalty), scored by
    sacrebleu's public ``BLEU.compute_bleu`` from those sufficient statistics (exp smoothing,
    effective order: what ``sentence_score`` uses)."""
    bleu = _metric("bleu")
    order = bleu.max_ngram_order

    def words(ids: Sequence[int]) -> list[str]:
        return bleu.tokenizer(decode(list(ids)).rstrip()).split()

    ref_words = [words(r) for r in refs]
    mean = mean_bags([[token_ngrams(w, n) for n in range(1, order + 1)] for w in ref_words])
    out = []
    for h in hyps:
        w = words(h)
        # the reference length closest to the hypothesis's (shorter on ties), as multi-reference BLEU
        ref_len = min((abs(len(r) - len(w)), len(r)) for r in ref_words)[1] if ref_words else 0
        correct, total = [], []
        for n in range(1, order + 1):
            bag = token_ngrams(w, n)
            correct.append(sum(min(c, mean[n - 1].get(g, 0.0)) for g, c in bag.items()))
            total.append(max(len(w) - n + 1, 0))
        score = BLEU.compute_bleu(correct, total, len(w), ref_len, smooth_method="exp", effective_order=True,
                                  max_ngram_order=order)
        out.append(score.score / 100.0)
    return out
