"""Family ``search``: beam search, diverse (group) beam search and arithmetic sampling.

All three keep several hypotheses in one batched KV cache (batch = hypotheses), so each
step is one forward pass of the model over all of them, and each step is a ``beam`` step
whose ``beams`` list shows every hypothesis with its score and its parent in the
previous step's list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterator, Sequence

import torch

from decoders.base import Choice, Context, Decoder, Float, Int, Params, PlaygroundError, register
from decoders.processors import CHAIN_DEFAULTS, History, build_chain
from playground.trace import Step

BIG = 1.0e9  # transformers' "very large negative" score for excluded candidates


# ---------------------------------------------------------------------- batched model state
class BatchState:
    """A KV cache holding a batch of equally long continuations of one prompt."""

    def __init__(self, view: Any, prompt_ids: Sequence[int], batch: int) -> None:
        self.view = view
        out = view.forward(list(prompt_ids), cache=view.new_cache())
        self.cache = out.cache
        if batch > 1:
            self.cache.batch_repeat_interleave(batch)
        self.first = out.logits[0, -1]

    def reorder(self, rows: Sequence[int]) -> None:
        """Make row ``i`` of the cache a copy of old row ``rows[i]`` (beam reordering)."""
        self.cache.reorder_cache(torch.tensor(list(rows), dtype=torch.long))

    def select(self, rows: Sequence[int]) -> None:
        """Keep only these rows (finished samples leave the batch)."""
        self.cache.batch_select_indices(torch.tensor(list(rows), dtype=torch.long))

    def advance(self, tokens: Sequence[int]) -> torch.Tensor:
        """Feed one token per row; return next-token logits, shape (rows, V)."""
        out = self.view.forward(torch.tensor(list(tokens), dtype=torch.long)[:, None], cache=self.cache)
        self.cache = out.cache
        return out.logits[:, -1]


def hits_stop(ctx: Context, gen: Sequence[int]) -> bool:
    """Whether a continuation just ended on a stop token or a stop string."""
    if gen and gen[-1] in ctx.stop_ids:
        return True
    if ctx.stop_strings:
        tail = ctx.target.decode(list(gen[-32:]))
        return any(s and s in tail for s in ctx.stop_strings)
    return False


def finish_reason_of(ctx: Context, gen: Sequence[int]) -> str:
    """``eos``/``stop``/``length`` for a finished hypothesis."""
    if gen and gen[-1] in ctx.stop_ids:
        return "eos" if gen[-1] in getattr(ctx.target, "eos_ids", set()) else "stop"
    if gen and hits_stop(ctx, gen):
        return "stop"
    return "length"


# ---------------------------------------------------------------------- beam search core
@dataclass
class Hyp:
    """A finished hypothesis in a beam group's pool."""

    ids: list[int]
    score: float
    group: int = 0


@dataclass
class BeamGroup:
    """One group of beams, stepped with transformers 5's beam-search rules.

    Each step takes the top ``max(2, 1 + n_stop) * k`` continuations of all beams by
    accumulated log-probability. The best ``k`` that did not stop become the next beams;
    those among the top ``k`` that stopped (stop token, stop string, or the length limit)
    enter the pool of finished hypotheses with score ``logprob / length ** length_penalty``,
    unless the pool is full and ``early_stopping`` is true, or no running beam can beat the
    worst pooled one any more (the early-stop heuristic). The pool keeps its best ``k``.
    """

    k: int
    n_stop: int
    length_penalty: float
    early_stopping: Any  # True, False or "never", as transformers
    max_new: int
    group: int = 0
    running: list[list[int]] = field(default_factory=list)
    scores: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    pool: list[Hyp] = field(default_factory=list)
    improvable: bool = True
    done: bool = False

    def __post_init__(self) -> None:
        self.running = [[] for _ in range(self.k)]
        # Only beam 0 is live at first: the k copies of the prompt must not all propose the same tokens.
        self.scores = torch.full((self.k,), -BIG, dtype=torch.float32)
        self.scores[0] = 0.0

    def step(self, logprobs: torch.Tensor, t: int, ctx: Context) -> tuple[list[int], list[int], list[Hyp], list[int]]:
        """Advance by one token given (k, V) log-probs at generated length ``t``.

        Returns (parents, tokens, newly finished hyps, their parents) for the next beams.
        """
        k, vocab = self.k, logprobs.shape[-1]
        acc = (logprobs + self.scores[:, None]).reshape(-1)
        keep = min(max(2, 1 + self.n_stop) * k, acc.numel())
        top_vals, top_idx = torch.topk(acc, keep)
        beam_of = (top_idx // vocab).tolist()
        token_of = (top_idx % vocab).tolist()
        cands = [self.running[b] + [tok] for b, tok in zip(beam_of, token_of)]
        hit = torch.tensor([t + 1 >= self.max_new or hits_stop(ctx, c) for c in cands])
        # next running beams: the best continuations that did not stop
        run_scores = top_vals + hit.float() * -BIG
        sel = torch.topk(run_scores, k).indices.tolist()
        parents = [beam_of[j] for j in sel]
        tokens = [token_of[j] for j in sel]
        new_running = [cands[j] for j in sel]
        new_scores = run_scores[sel]
        # finished pool: only candidates ranked in the top k may enter
        finished: list[Hyp] = []
        fin_parents: list[int] = []
        blocked = (len(self.pool) == k and self.early_stopping is True) or not self.improvable
        fin_scores = top_vals / ((t + 1) ** self.length_penalty)
        for j in range(min(k, keep)):
            if bool(hit[j]) and not blocked:
                finished.append(Hyp(cands[j], float(fin_scores[j]), self.group))
                fin_parents.append(beam_of[j])
        if finished:
            merged = self.pool + finished
            order = sorted(range(len(merged)), key=lambda i: -merged[i].score)
            self.pool = [merged[i] for i in order[:k]]
        self.running, self.scores = new_running, new_scores
        # early-stop heuristic and the loop condition, as transformers computes them
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_len = self.max_new
        else:
            best_len = t + 1
        best_possible = float(new_scores[0] / (best_len ** self.length_penalty))
        worst = min(h.score for h in self.pool) if len(self.pool) == k else -BIG
        self.improvable = self.improvable and best_possible > worst
        full = len(self.pool) == k and self.early_stopping is True
        self.done = (not self.improvable) or full or bool(hit.all())
        return parents, tokens, finished, fin_parents


def _early_stopping(value: str) -> Any:
    return {"true": True, "false": False, "never": "never"}[value]


class BeamParams(Params):
    """Beam knobs with the cross-checks: return at most num_beams, groups divide beams."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        if out["num_return_sequences"] > out["num_beams"]:
            raise PlaygroundError(f"decoder {decoder!r}: num_return_sequences ({out['num_return_sequences']}) "
                                  f"must not exceed num_beams ({out['num_beams']})")
        g = out.get("num_beam_groups", 1)
        if out["num_beams"] % g:
            raise PlaygroundError(f"decoder {decoder!r}: num_beams ({out['num_beams']}) must be a multiple "
                                  f"of num_beam_groups ({g})")
        return out


def _beam_knobs(beams_default: int, beams_lo: int) -> dict[str, Any]:
    return dict(
        num_beams=Int(beams_default, beams_lo, 64, "hypotheses kept at each step"),
        length_penalty=Float(1.0, -5.0, 5.0, "finished score = logprob / length^this (>0 favours long)"),
        early_stopping=Choice("false", ("false", "true", "never"),
                              "true: stop when num_beams hypotheses finished; false: transformers' heuristic; "
                              "never: canonical beam search"),
        num_return_sequences=Int(1, 1, 64, "finished hypotheses to return (the best is the output)"),
    )


def group_beam_search(decoder: Decoder, ctx: Context, num_beams: int, groups: int,
                      diversity_penalty: float) -> Iterator[Step]:
    """Beam search over ``groups`` groups of beams in one batch (1 group = plain beam search).

    Group ``g`` sees log-probs lowered by ``diversity_penalty`` times the number of times
    each token was chosen by groups ``0..g-1`` at this same step (Hamming diversity).
    """
    p = ctx.params
    gs = num_beams // groups
    es = _early_stopping(p["early_stopping"])
    n_stop = len(ctx.stop_ids)
    bank = [BeamGroup(gs, n_stop, p["length_penalty"], es, ctx.max_new_tokens, group=g) for g in range(groups)]
    state = BatchState(ctx.target, ctx.prompt_ids, num_beams)
    logits = state.first[None].expand(num_beams, -1)
    prev_pos: dict[int, int] = {}  # global row -> index in the previous step's beams list
    for t in range(ctx.max_new_tokens):
        ctx.check_cancel()
        logprobs = torch.log_softmax(logits.float(), -1)
        rows = list(range(num_beams))
        feed = [0] * num_beams
        chosen = torch.zeros(logprobs.shape[-1], dtype=torch.float32)
        running_ev: list[dict[str, Any]] = []
        finished_ev: list[dict[str, Any]] = []
        row_pos: dict[int, int] = {}
        for g, grp in enumerate(bank):
            base = g * gs
            if grp.done:
                feed[base:base + gs] = [r[-1] if r else 0 for r in grp.running]
                continue
            lp = logprobs[base:base + gs]
            if diversity_penalty and g > 0:
                lp = lp - diversity_penalty * chosen[None, :]
            parents, tokens, fin, fin_par = grp.step(lp, t, ctx)
            for j, (par, tok) in enumerate(zip(parents, tokens)):
                rows[base + j] = base + par
                feed[base + j] = tok
            for tok in tokens:
                chosen[tok] += 1.0
            if not grp.done:
                for j in range(gs):
                    row_pos[base + j] = len(running_ev)
                    running_ev.append({"ids": list(grp.running[j]), "score": round(float(grp.scores[j]), 5),
                                       "parent": prev_pos.get(base + parents[j]), "finished": False,
                                       "group": g})
            for h, par in zip(fin, fin_par):
                finished_ev.append({"ids": list(h.ids), "score": round(h.score, 5),
                                    "parent": prev_pos.get(base + par), "finished": True, "group": g})
        yield Step("beam", [], beams=running_ev + finished_ev, groups=groups)
        prev_pos = row_pos
        if all(grp.done for grp in bank):
            break
        state.reorder(rows)
        logits = state.advance(feed)
    pool = sorted((h for grp in bank for h in grp.pool), key=lambda h: -h.score)
    if not pool:  # cancelled before anything finished: fall back to the best running beam
        pool = [Hyp(list(bank[0].running[0]), float(bank[0].scores[0]), 0)]
    best = pool[0]
    decoder.output_override = list(best.ids)
    decoder.finish_reason = finish_reason_of(ctx, best.ids)
    decoder.extra_stats["sequences"] = [{"ids": h.ids, "score": round(h.score, 5), "group": h.group}
                                        for h in pool[: p["num_return_sequences"]]]


@register
class Beam(Decoder):
    """Beam search with transformers 5's rules (``generate(num_beams=k, do_sample=False)``).

    Implements: top-``max(2, 1 + #stop tokens) * k`` expansion, finished-hypothesis pool with
    length penalty ``logprob / len^length_penalty``, ``early_stopping`` true/false/never and
    transformers' early-stop heuristic; verified token for token against ``generate``.
    The output is the best finished hypothesis; the ``num_return_sequences`` best are in
    ``stats.sequences``. Simplifies: no logits processors inside the search; one prompt.
    """

    name = "beam"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = BeamParams(**_beam_knobs(4, 1))
    reference = "Beam search (Lowerre 1976; Graves 2012; Sutskever et al. 2014); transformers 5 semantics"
    description = "Keep the k best partial sequences; return the best finished one"

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        yield from group_beam_search(self, ctx, p["num_beams"], 1, 0.0)


@register
class DiverseBeam(Decoder):
    """Diverse beam search (Vijayakumar et al. 2018) with Hamming diversity.

    The beams are split into ``num_beam_groups`` groups of equal size, each a beam search
    of its own (transformers' rules, see :class:`Beam`). At every step the groups are
    expanded in order, and group ``g`` has each token's log-probability lowered by
    ``diversity_penalty`` times the number of beams of groups ``0..g-1`` that chose it at
    this step; the penalised scores accumulate, as in the paper's doubly greedy objective
    and transformers 4's group beam search. The output is the best finished hypothesis of
    any group. Simplifies: Hamming diversity only (no n-gram or embedding diversity).
    """

    name = "diverse_beam"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = BeamParams(**_beam_knobs(4, 2),
                        num_beam_groups=Int(2, 1, 64, "groups the beams are split into"),
                        diversity_penalty=Float(1.0, 0.0, 20.0, "penalty per earlier-group choice of a token"))
    reference = ("Vijayakumar et al. 2018, Diverse Beam Search: Decoding Diverse Solutions from "
                 "Neural Sequence Models (AAAI)")
    description = "Beam groups penalised for choosing what earlier groups chose at the same step"

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        yield from group_beam_search(self, ctx, p["num_beams"], p["num_beam_groups"], p["diversity_penalty"])


# ---------------------------------------------------------------------- arithmetic sampling
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


# ---------------------------------------------------------------------- parallel sampling
def _filter_knobs() -> dict[str, Any]:
    return dict(
        temperature=Float(1.0, 0.0, 10.0, "divide logits by this before drawing; 0 = greedy"),
        top_k=Int(0, 0, 1_000_000, "keep the k most probable tokens first; 0 = off"),
        top_p=Float(1.0, 0.0, 1.0, "nucleus filter first; 1 = off"),
        min_p=Float(0.0, 0.0, 1.0, "min-p filter first; 0 = off"),
    )


def _filter_chain(p: dict[str, Any]):
    return build_chain({**CHAIN_DEFAULTS, **{k: p[k] for k in ("temperature", "top_k", "top_p", "min_p")},
                        "order": "top_k,top_p,min_p,temperature"})


def _filters_lossy(p: dict[str, Any]) -> bool:
    return p["temperature"] != 1.0 or p["top_k"] > 0 or p["top_p"] < 1.0 or p["min_p"] > 0


@dataclass
class Samples:
    """N sequences grown in parallel, with their raw-model log-probabilities."""

    seqs: list[list[int]]
    logp: list[float]


Chooser = Any  # (sample index, position, final probs) -> (token, extra beam evidence)


def parallel_samples(ctx: Context, n: int, choose: Chooser, commit_first: bool) -> Iterator[Step]:
    """Grow ``n`` continuations in one batched cache, one ``beam`` step per position.

    ``choose(i, t, probs)`` picks sample ``i``'s token at position ``t`` from its processed
    distribution. A finished sample leaves the batch. With ``commit_first`` the steps commit
    sample 0's tokens (it is the output); otherwise they commit nothing. Returns
    :class:`Samples` (``result = yield from parallel_samples(...)``).
    """
    chain = _filter_chain(ctx.params)
    seqs: list[list[int]] = [[] for _ in range(n)]
    logp = [0.0] * n
    done = [False] * n
    alive = list(range(n))  # sample index of each cache row
    state = BatchState(ctx.target, ctx.prompt_ids, n)
    logits = state.first[None].expand(n, -1)
    prompt = list(ctx.prompt_ids)
    for t in range(ctx.max_new_tokens):
        ctx.check_cancel()
        raw_logp = torch.log_softmax(logits.float(), -1)
        info: dict[int, dict[str, Any]] = {}
        feed: list[int] = []
        for row, i in enumerate(alive):
            h = History(ids=prompt + seqs[i], prompt_len=len(prompt), pos=t, uniform=ctx.uniform)
            tok, info[i] = choose(i, t, chain.probs(logits[row], h))
            seqs[i].append(tok)
            logp[i] += float(raw_logp[row, tok])
            feed.append(tok)
            if t + 1 >= ctx.max_new_tokens or hits_stop(ctx, seqs[i]):
                done[i] = True
        beams = [{"ids": list(seqs[i]), "score": round(logp[i], 5), "parent": i, "finished": done[i],
                  **info.get(i, {})} for i in range(n)]
        yield Step("beam", [seqs[0][-1]] if commit_first and 0 in info else [], beams=beams)
        keep = [row for row, i in enumerate(alive) if not done[i]]
        if not keep:
            break
        if len(keep) < len(alive):
            state.select(keep)
            feed = [feed[r] for r in keep]
            alive = [alive[r] for r in keep]
        logits = state.advance(feed)
    return Samples(seqs, logp)


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


def iid_chooser(ctx: Context) -> Chooser:
    """Independent draws: sample 0 reads the `sample` decoder's common random numbers
    (Gumbel-max on stream ``sample``), sample ``i > 0`` its own stream."""
    from decoders.ar import draw

    def choose(i: int, t: int, probs: torch.Tensor) -> tuple[int, dict[str, Any]]:
        return draw(ctx, t, probs, stream="sample" if i == 0 else f"sample/{i}"), {}

    return choose


def length_normalised(logp: float, length: int, alpha: float) -> float:
    """``logp / length ** alpha`` (alpha 0 = total log-probability, 1 = per-token mean)."""
    return logp / (max(length, 1) ** alpha)


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
