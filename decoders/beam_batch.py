"""Beam search's core, shared by the beam decoders: a batched KV cache of hypotheses and one
group of beams stepped with transformers 5's rules (plus Kasai et al.'s patience and the
uniform-information-density regulariser of ``uid_beam``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, Sequence

import torch

from decoders.ar import constraint_stage
from decoders.base import Choice, Context, Decoder, Float, Int, Params, PlaygroundError
from decoders.constraint import follow_rows, mask_rows
from decoders.kv_cache import repeat_batch, select_rows
from playground.core.trace import Step

BIG = 1.0e9  # transformers' "very large negative" score for excluded candidates


# ---------------------------------------------------------------------- batched model state
class BatchState:
    """A KV cache holding a batch of equally long continuations of one prompt."""

    def __init__(self, view: Any, prompt_ids: Sequence[int], batch: int) -> None:
        self.view = view
        out = view.forward(list(prompt_ids), cache=view.new_cache())
        self.cache = out.cache
        if batch > 1:
            repeat_batch(self.cache, batch)  # every layer kind, recurrent ones included
        self.first = out.logits[0, -1]

    def reorder(self, rows: Sequence[int]) -> None:
        """Make row ``i`` of the cache a copy of old row ``rows[i]`` (beam reordering)."""
        self.cache.reorder_cache(torch.tensor(list(rows), dtype=torch.long))

    def select(self, rows: Sequence[int]) -> None:
        """Keep only these rows (finished samples leave the batch)."""
        select_rows(self.cache, rows)

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
    logprob: float | None = None
    surprisals: list[float] | None = None


@dataclass
class BeamGroup:
    """One group of beams, stepped with transformers 5's beam-search rules.

    Each step takes the top ``max(2, 1 + n_stop) * k`` continuations of all beams by
    accumulated log-probability. The best ``k`` that did not stop become the next beams;
    those among the top ``k`` that stopped (stop token, stop string, or the length limit)
    enter the pool of finished hypotheses with score ``logprob / length ** length_penalty``,
    unless the pool is full and ``early_stopping`` is true, or no running beam can beat the
    worst pooled one any more (the early-stop heuristic). The pool keeps its best ``k``.

    ``patience`` (Kasai et al. 2022) moves the stopping point: the pool counts as full at
    ``need = ceil(patience * k)`` finished hypotheses (and holds ``max(k, need)``), and the
    heuristic compares against the ``need``-th best of them; 1.0 is transformers exactly.
    ``uid_lam`` > 0 ranks hypotheses by ``logprob - lam * var(surprisals)`` (Meister et al.
    2020's UID regulariser) instead of ``logprob``; 0 is plain beam search, bit for bit.
    """

    k: int
    n_stop: int
    length_penalty: float
    early_stopping: Any  # True, False or "never", as transformers
    max_new: int
    group: int = 0
    patience: float = 1.0
    uid_lam: float = 0.0
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
        self.need = max(1, math.ceil(self.patience * self.k - 1e-9))
        self.capacity = max(self.k, self.need)
        # summed log-probability and surprisals of each running beam (``scores`` ranks them)
        self.logp = self.scores.clone()
        self.surprisals: list[list[float]] = [[] for _ in range(self.k)]

    def rank(self, logprobs: torch.Tensor, t: int) -> torch.Tensor:
        """(k, V) ranking scores of every one-token continuation of the running beams."""
        if not self.uid_lam:
            return logprobs + self.scores[:, None]
        acc = logprobs + self.logp[:, None]
        s = -logprobs.double()
        n = t + 1
        s1 = torch.tensor([sum(x) for x in self.surprisals], dtype=torch.float64)[:, None] + s
        s2 = torch.tensor([sum(v * v for v in x) for x in self.surprisals], dtype=torch.float64)[:, None] + s * s
        var = (s2 / n - (s1 / n) ** 2).clamp(min=0.0)
        out = (acc.double() - self.uid_lam * var).float()
        # a dead beam (score -BIG) stays out, whatever its variance says
        return torch.where(self.logp[:, None] <= -BIG / 2, torch.full_like(out, -BIG), out)

    def step(self, logprobs: torch.Tensor, t: int, ctx: Context) -> tuple[list[int], list[int], list[Hyp], list[int]]:
        """Advance by one token given (k, V) log-probs at generated length ``t``.

        Returns (parents, tokens, newly finished hyps, their parents) for the next beams.
        """
        k, vocab = self.k, logprobs.shape[-1]
        # the ranking runs on the CPU beside the beams' scores, whatever device the model is on
        logprobs = logprobs.detach().float().cpu()
        acc = self.rank(logprobs, t).reshape(-1)
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
        blocked = (len(self.pool) >= self.need and self.early_stopping is True) or not self.improvable
        fin_scores = top_vals / ((t + 1) ** self.length_penalty)
        for j in range(min(k, keep)):
            if bool(hit[j]) and not blocked:
                # the summed log-probability travels with the length-normalised score: plots
                # put every beam on that one scale (with uid_lam it is set below)
                finished.append(Hyp(cands[j], float(fin_scores[j]), self.group,
                                    logprob=None if self.uid_lam else float(top_vals[j])))
                fin_parents.append(beam_of[j])
        if finished:
            merged = self.pool + finished
            order = sorted(range(len(merged)), key=lambda i: -merged[i].score)
            self.pool = [merged[i] for i in order[:self.capacity]]
        if self.uid_lam:
            flat_lp = (logprobs + self.logp[:, None]).reshape(-1)
            entered = [j for j in range(min(k, keep)) if bool(hit[j]) and not blocked]
            for h, j in zip(finished, entered):
                b, tok = beam_of[j], token_of[j]
                h.logprob = float(flat_lp[top_idx[j]])
                h.surprisals = self.surprisals[b] + [-float(logprobs[b, tok])]
            self.logp = torch.stack([flat_lp[top_idx[j]] for j in sel])
            self.surprisals = [self.surprisals[beam_of[j]] + [-float(logprobs[beam_of[j], token_of[j]])]
                               for j in sel]
        self.running, self.scores = new_running, new_scores
        # early-stop heuristic and the loop condition, as transformers computes them
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_len = self.max_new
        else:
            best_len = t + 1
        best_possible = float(new_scores[0] / (best_len ** self.length_penalty))
        worst = self.pool[self.need - 1].score if len(self.pool) >= self.need else -BIG
        self.improvable = self.improvable and best_possible > worst
        full = len(self.pool) >= self.need and self.early_stopping is True
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
        patience=Float(1.0, 0.1, 10.0, "Kasai et al. 2022: the search counts as finished at patience x num_beams "
                                       "finished hypotheses (1 = transformers; >1 searches on, <1 stops sooner)"),
    )


class RowScores(Protocol):
    """Per-token scores a beam search ranks by instead of the target's log-probabilities (e.g.
    contrastive decoding's expert-minus-amateur), kept row for row beside the beams."""

    def scores(self, logprobs: torch.Tensor) -> torch.Tensor:
        """(rows, V) scores from the target's (rows, V) log-probabilities at this step."""

    def reorder(self, rows: Sequence[int]) -> None:
        """Follow the beams' reordering: row ``i`` becomes old row ``rows[i]``."""

    def advance(self, tokens: Sequence[int]) -> None:
        """Feed each row's chosen token."""


def group_beam_search(decoder: Decoder, ctx: Context, num_beams: int, groups: int,
                      diversity_penalty: float, uid_lam: float = 0.0, scorer: RowScores | None = None,
                      settings: dict[str, Any] | None = None) -> Iterator[Step]:
    """Beam search over ``groups`` groups of beams in one batch (1 group = plain beam search).

    Group ``g`` sees log-probs lowered by ``diversity_penalty`` times the number of times
    each token was chosen by groups ``0..g-1`` at this same step (Hamming diversity).
    ``uid_lam`` > 0 ranks by the UID-regularised score (see :class:`BeamGroup`); its steps
    then carry each beam's ``logprob`` and a ``uid`` field (the best beam's surprisals).
    ``scorer`` replaces the per-token log-probabilities the beams accumulate (the beam scores
    are then sums of its scores); ``settings`` holds the beam knobs (``length_penalty``,
    ``early_stopping``, ``num_return_sequences``, ``patience``) when ``ctx.params`` does not.
    """
    p = settings if settings is not None else ctx.params
    gs = num_beams // groups
    es = _early_stopping(p["early_stopping"])
    n_stop = len(ctx.stop_ids)
    bank = [BeamGroup(gs, n_stop, p["length_penalty"], es, ctx.max_new_tokens, group=g,
                      patience=float(p.get("patience", 1.0)), uid_lam=uid_lam) for g in range(groups)]
    state = BatchState(ctx.target, ctx.prompt_ids, num_beams)
    logits = state.first[None].expand(num_beams, -1)
    stage = constraint_stage(ctx)  # regex/json_schema/grammar: one matcher state per beam
    crows = [stage.row() for _ in range(num_beams)] if stage else None
    prev_pos: dict[int, int] = {}  # global row -> index in the previous step's beams list
    for t in range(ctx.max_new_tokens):
        ctx.check_cancel()
        # ranking, masks and diversity counts live on the CPU, whatever device the model is on
        logprobs = torch.log_softmax(logits.float(), -1).cpu()
        if scorer is not None:
            logprobs = scorer.scores(logprobs)
        cev = None
        if crows is not None:
            # masked on the log-probs, as transformers' processors: scores stay the model's log-probability
            logprobs, cev = mask_rows(crows, logprobs)
        stepped = [False] * num_beams
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
            stepped[base:base + gs] = [True] * gs
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
                    if uid_lam:
                        running_ev[-1]["logprob"] = round(float(grp.logp[j]), 5)
            for h, par in zip(fin, fin_par):
                finished_ev.append({"ids": list(h.ids), "score": round(h.score, 5),
                                    "logprob": round(float(h.logprob), 5),
                                    "parent": prev_pos.get(base + par), "finished": True, "group": g})
        extra: dict[str, Any] = {}
        if uid_lam:
            extra["uid"] = uid_evidence(bank[0], uid_lam)
        if cev is not None:
            extra["constraint"] = cev
        yield Step("beam", [], beams=running_ev + finished_ev, groups=groups, **extra)
        prev_pos = row_pos
        if all(grp.done for grp in bank):
            break
        state.reorder(rows)
        if crows is not None:
            crows = follow_rows(crows, rows, feed, stepped)
        logits = state.advance(feed)
        if scorer is not None:
            scorer.reorder(rows)
            scorer.advance(feed)
    pool = sorted((h for grp in bank for h in grp.pool), key=lambda h: -h.score)
    if not pool:  # cancelled before anything finished: fall back to the best running beam
        pool = [Hyp(list(bank[0].running[0]), float(bank[0].scores[0]), 0)]
    best = pool[0]
    decoder.output_override = list(best.ids)
    decoder.finish_reason = finish_reason_of(ctx, best.ids)
    decoder.extra_stats["sequences"] = [{"ids": h.ids, "score": round(h.score, 5), "group": h.group}
                                        for h in pool[: p["num_return_sequences"]]]
    if uid_lam and best.surprisals is not None:
        decoder.extra_stats["surprisals"] = [round(x, 5) for x in best.surprisals]
        decoder.extra_stats["surprisal_variance"] = round(surprisal_variance(best.surprisals), 6)


def surprisal_variance(xs: Sequence[float]) -> float:
    """Population variance of a surprisal sequence (0 for fewer than two tokens)."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def uid_evidence(grp: BeamGroup, lam: float) -> dict[str, Any]:
    """The ``uid`` field of a ``uid_beam`` step: the best finished-or-running hypothesis's
    surprisal curve, its variance and the regularised score."""
    best_run = int(torch.argmax(grp.scores)) if grp.scores.numel() else 0
    cand = [(float(grp.scores[best_run]), grp.surprisals[best_run], float(grp.logp[best_run]), False)]
    if grp.pool and grp.pool[0].surprisals is not None:
        h = grp.pool[0]
        cand.append((h.score, h.surprisals, float(h.logprob or 0.0), True))
    score, surps, lp, fin = max(cand, key=lambda c: c[0])
    return {"lam": lam, "surprisals": [round(x, 4) for x in surps], "variance": round(surprisal_variance(surps), 5),
            "logprob": round(lp, 5), "score": round(score, 5), "finished": fin}
