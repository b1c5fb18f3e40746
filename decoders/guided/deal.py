"""``deal``: decoding-time alignment as a reward-guided tree search (DeAL, Huang et al. 2024).

Each search node is a partial hypothesis. At every expansion the ``top_k`` most probable next
tokens of each kept node are its candidate children; a candidate is extended by a greedy
lookahead of ``lookahead`` tokens and scored by

    score = log p(hypothesis) + lam * R(candidate + lookahead)

with ``R`` a programmatic reward (the keyword, length or regex potentials of ``smc``, each at
most 0). With ``search=beam`` the ``num_beams`` best candidates stay in the search (beam
search's rules, so that ``lam = 0`` with no lookahead is exactly the ``beam`` decoder); with
``search=astar`` a priority queue of partial hypotheses ordered by ``f = g + h`` (``g = log p``,
``h = lam * R`` of the lookahead) is searched best first, ``best_first_beam``'s queue (so that
``lam = 0`` with no lookahead is exactly ``best_first_beam``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from decoders.base import Choice, Context, Decoder, Float, Int, Params, PlaygroundError, Text, register
from decoders.beam_batch import BIG, BatchState, BeamGroup, Hyp, finish_reason_of, hits_stop
from decoders.citation import arxiv
from decoders.guided.smc import Potential, compile_regex, parse_keywords
from decoders.search.best_first import FRONTIER_SHOWN, Entry, take_wave, wave_reader
from decoders.search.rollouts import rollouts
from playground.core.trace import Step

REWARDS = ("keywords", "length", "regex")
SEARCHES = ("beam", "astar")
NEEDS = {"keywords": "keywords", "length": "target_chars", "regex": "match_regex"}


def reward_of(params: dict[str, Any]) -> Potential:
    """The chosen programmatic reward as an ``smc`` :class:`Potential` with that one term set,
    or a one-line PlaygroundError when the knob it reads is empty."""
    kind = str(params.get("reward", "keywords"))
    need = NEEDS.get(kind)
    if need is None:
        raise PlaygroundError(f"unknown reward {kind!r}; choose one of: {', '.join(REWARDS)}")
    if not params.get(need):
        raise PlaygroundError(f"decoder 'deal' with reward={kind} needs the knob {need!r} set")
    if kind == "keywords":
        words = parse_keywords(params["keywords"])
        if not words:
            raise PlaygroundError("decoder 'deal' with reward=keywords needs at least one keyword")
        return Potential(keywords=words)
    if kind == "length":
        return Potential(target_chars=int(params["target_chars"]))
    return Potential(regex=compile_regex(str(params["match_regex"])))


class DealParams(Params):
    """DeAL knobs; validation also builds the reward, so a missing or bad one is refused before the run."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        reward_of(out)
        if out["search"] == "astar" and out["length_penalty"] != self["length_penalty"].default:
            raise PlaygroundError(f"decoder {decoder!r}: length_penalty applies to search=beam only (search=astar "
                                  f"ranks by f = g + h, no length normalisation); leave it at "
                                  f"{self['length_penalty'].default:g}")
        return out


@dataclass
class Candidate:
    """A child of a kept node: its token, LM log-probabilities, lookahead and reward."""

    row: int  # the parent's row in the batch
    token: int
    token_logprob: float
    logprob: float  # summed log-probability of the hypothesis with this token
    finished: bool
    lookahead: list[int]
    reward: float
    score: float = 0.0  # what the search ranks: logprob + lam * reward
    status: str = "pruned"  # beam: kept / finished / pruned; astar: queued / finished


def reward_text(ctx: Context, ids: Sequence[int]) -> str:
    """The generated text a reward reads (a final stop token left out, as ``smc`` does)."""
    ids = list(ids)
    if ids and ids[-1] in ctx.stop_ids:
        ids = ids[:-1]
    return ctx.target.decode(ids)


@register
class Deal(Decoder):
    """DeAL (Huang et al. 2024): decoding as a search guided by a reward of the partial output.

    At each step every kept node (a hypothesis of the current length) proposes its ``top_k``
    most probable next tokens. A candidate that does not end there (stop token, stop string,
    length limit) is rolled out greedily for ``lookahead`` more tokens (one batch per node, as
    ``adadec``'s rollouts), and the reward ``R`` is read on the hypothesis, the candidate and
    its rollout (``finished`` when the rollout reached a stop or the limit). Its score is
    ``log p + lam * R``, ``log p`` the hypothesis's summed log-probability (the rollout's
    tokens are not counted). The search keeps candidates with beam search's rules (the
    ``beam`` decoder's :class:`~decoders.beam_batch.BeamGroup`): the best ``num_beams``
    unfinished ones become the next nodes, the finished ones among the best ``num_beams``
    enter the pool with ``score / len ** length_penalty``, transformers' stopping heuristic
    ends the search, and the output is the best pooled hypothesis. The reward enters as the
    change of ``lam * R`` from parent to child, so a node's accumulated score is
    ``log p + lam * R(node)`` (the reward telescopes, it is not summed along the path). With
    ``lam = 0`` and ``lookahead = 0`` and ``top_k`` at least beam search's own expansion
    (``max(2, 1 + stop tokens) * num_beams``) the run is the ``beam`` decoder's exactly
    (``num_beams = 1``: greedy, until a stop token).
    ``search=astar`` is the paper's A* framing: a priority queue (``best_first_beam``'s
    :class:`~decoders.search.best_first.Entry` queue) holds partial hypotheses ordered by
    ``f = g + h``, ``g`` the summed log-probability (float32, as ``best_first_beam``) and
    ``h = lam * R`` read on the hypothesis and its greedy lookahead of ``lookahead`` tokens
    (the paper's lookahead heuristic; the root's ``h`` is 0, it is popped first whatever it
    is). The best entry is popped and its ``top_k`` children are pushed with their own
    lookaheads; at most ``num_beams`` hypotheses of each length may be popped (the beam
    constraint), later ones of that length are dropped; the first finished hypothesis to
    reach the top is the answer. ``h`` is not admissible (it is at most 0, it is no bound on
    the reward still to come, and it is not monotone: a child's ``f`` may exceed its
    parent's), so this is A*-like as in the paper, not an optimal search. With ``lam = 0``
    ``f = g`` falls as a hypothesis grows and pops come in waves, several per batched forward
    (``best_first_beam``'s :func:`~decoders.search.best_first.take_wave`), so ``lam = 0``,
    ``lookahead = 0`` and ``top_k >= num_beams`` give ``best_first_beam``'s answer exactly;
    with ``lam > 0`` a wave's order would not be settled, so one node is popped per step.
    Each step records the popped nodes, the frontier at the choice (its best entries with
    ``g``, ``h``, ``f``, depth and whether finished) and the children pushed.
    Rewards: ``keywords`` (minus the share of keywords, case-insensitive, not yet in the
    text), ``length`` (minus the relative distance to ``target_chars``; only overshoot
    counts while the text may still grow) and ``regex`` (0 while ``match_regex`` can still
    match, else -1), the potentials of ``smc``.
    Simplifies: programmatic rewards only — no reward model (the paper's harmlessness and
    helpfulness rewards need one); the lookahead is greedy and reads the reward only, not
    the rollout's likelihood; ``search=beam`` is beam-shaped (every node at one depth);
    ``search=astar`` bounds the search by the beam constraint and the length limit (no node
    budget) and runs one lookahead batch per expanded node; no logits processors.
    """

    name = "deal"
    family = "guided"
    kind = "causal"
    step_kind = "beam"
    params = DealParams(
        search=Choice("beam", SEARCHES, "beam: keep the num_beams best candidates per step; astar: best-first "
                                        "over a priority queue by f = g + h (g = log p, h = λ·R of the lookahead)"),
        reward=Choice("keywords", REWARDS, "the programmatic reward R of a partial hypothesis: keywords present, "
                                           "closeness to a target length, or a regex that can still match"),
        lam=Float(5.0, 0.0, 1000.0, "λ: weight of the reward in the score log p + λ·R (0 = beam search)"),
        top_k=Int(8, 1, 256, "candidate next tokens per kept node (the LM's most probable)"),
        num_beams=Int(4, 1, 64, "nodes kept at each step (the beam width); astar: nodes popped per length"),
        lookahead=Int(4, 0, 64, "greedy tokens rolled out after each candidate before its reward is read "
                                "(0 = the reward of the candidate itself)"),
        keywords=Text("", "reward=keywords: comma-separated words the output should contain (case-insensitive)"),
        target_chars=Int(0, 0, 100_000, "reward=length: output length in characters to aim for"),
        match_regex=Text("", "reward=regex: the output must be able to become (finished: be) a full match"),
        length_penalty=Float(1.0, -5.0, 5.0, "search=beam: finished score = score / length^this (as beam search); "
                                                "search=astar has no length normalisation, leave it at 1"),
    )
    reference = "Huang et al. 2024, DeAL: Decoding-time Alignment for Large Language Models"
    papers = (arxiv("Huang et al. 2024, DeAL: Decoding-time Alignment for Large Language Models", "2402.06147"),)
    description = "Tree search over the LM's top-k tokens, scored by log p + λ·reward of a greedy lookahead"
    shows = ("; plus `deal` per step: every candidate child with its LM log-probability, reward, combined "
             "score, lookahead tokens and text, and whether it was kept, finished or pruned (queued with "
             "search=astar) (step plot *DeAL candidates*, run plot *DeAL path: reward vs log-likelihood*); "
             "with search=astar, `astar` per step: the popped nodes and the frontier's best entries with g, h, f, "
             "depth and finished (step plot *DeAL frontier: g and h*)")

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
        if ctx.params["search"] == "astar":
            yield from self._astar(ctx)
            return
        p = ctx.params
        pot = reward_of(p)
        lam, k = float(p["lam"]), int(p["num_beams"])
        top_k, depth = int(p["top_k"]), int(p["lookahead"])
        prompt = list(ctx.prompt_ids)
        grp = BeamGroup(k, len(ctx.stop_ids), float(p["length_penalty"]), False, ctx.max_new_tokens)
        state = BatchState(ctx.target, prompt, k)
        logits = state.first[None].expand(k, -1)
        # per row: the node's summed log-probability and its reward at selection (the root's is 0)
        node_lp = [0.0] * k
        node_r = [0.0] * k
        pooled: dict[tuple[int, ...], tuple[float, float]] = {}
        prev_pos: dict[int, int] = {}
        n_rollouts = expansions = 0
        for t in range(ctx.max_new_tokens):
            ctx.check_cancel()
            logprobs = torch.log_softmax(logits.float(), -1).cpu()
            live = [b for b in range(k) if float(grp.scores[b]) > -BIG / 2]
            expansions += len(live)
            cands: list[Candidate] = []
            for b in live:
                row, n_roll = self._expand(ctx, pot, b, grp.running[b], node_lp[b], logprobs[b], top_k, depth, t)
                cands += row
                n_rollouts += n_roll
            # the reward enters as its change from the parent: a node's running score is log p + lam * R
            table = torch.full_like(logprobs, -BIG)
            for c in cands:
                table[c.row, c.token] = float(logprobs[c.row, c.token]) + lam * (c.reward - node_r[c.row])
                c.score = float(table[c.row, c.token] + grp.scores[c.row])
            by_key = {(c.row, c.token): c for c in cands}
            parents, tokens, fin, fin_par = grp.step(table, t, ctx)
            new_lp, new_r = [0.0] * k, [-BIG] * k
            for j, (par, tok) in enumerate(zip(parents, tokens)):
                c = by_key.get((par, tok))
                if c is not None and float(grp.scores[j]) > -BIG / 2:
                    c.status = "kept"
                    new_lp[j], new_r[j] = c.logprob, c.reward
            ended: list[tuple[Hyp, int]] = []
            for h, par in zip(fin, fin_par):
                c = by_key.get((par, h.ids[-1]))
                if c is None:  # a filler entry (fewer candidates than beam search's expansion): never the output
                    continue
                c.status = "finished"
                pooled[tuple(h.ids)] = (c.logprob, c.reward)
                ended.append((h, par))
            yield Step("beam", [], beams=self._beams(grp, ended, parents, prev_pos, new_lp, new_r, pooled),
                       deal={"lam": lam, "reward": str(p["reward"]), "top_k": top_k, "lookahead": depth,
                             "candidates": [self._show(ctx, c, prev_pos) for c in cands]})
            prev_pos = {j: n for n, j in enumerate(j for j in range(k) if float(grp.scores[j]) > -BIG / 2)}
            if grp.done:
                break
            node_lp, node_r = new_lp, new_r
            state.reorder(parents)
            logits = state.advance(tokens)
        pool = sorted((h for h in grp.pool if tuple(h.ids) in pooled), key=lambda h: -h.score)
        if not pool:  # cancelled before anything finished: the best running node
            pool = [Hyp(list(grp.running[0]), float(grp.scores[0]))]
            pooled[tuple(grp.running[0])] = (node_lp[0], node_r[0])
        best = pool[0]
        lp, r = pooled.get(tuple(best.ids), (0.0, 0.0))
        self.output_override = list(best.ids)
        self.finish_reason = finish_reason_of(ctx, best.ids)
        self.extra_stats.update(
            reward=pot.parts(), output_logprob=round(lp, 5), output_reward=round(r, 5),
            final_reward=round(pot(reward_text(ctx, best.ids), True), 5), best_score=round(best.score, 5),
            rollouts=n_rollouts, expansions=expansions)

    def _astar(self, ctx: Context) -> Iterator[Step]:
        """``search=astar``: best-first over partial hypotheses by ``f = g + h`` (see the class)."""
        p = ctx.params
        pot = reward_of(p)
        lam, k = float(p["lam"]), int(p["num_beams"])
        top_k, depth = int(p["top_k"]), int(p["lookahead"])
        order = itertools.count()
        root = Entry((0.0, next(order)), [], 0.0, False)
        queue = [root]
        node = {root.uid: Candidate(-1, -1, 0.0, 0.0, False, [], 0.0, status="root")}  # uid -> g, reward, lookahead
        pops: Counter[int] = Counter()
        expansions = dropped = waves = n_rollouts = 0
        best: Entry | None = None
        reader = wave_reader(ctx)
        head = {"lam": lam, "reward": str(p["reward"]), "top_k": top_k, "lookahead": depth, "search": "astar"}
        while queue:
            ctx.check_cancel()
            e = queue[0]
            if pops[len(e.ids)] >= k:  # the beam constraint: this length is settled
                heapq.heappop(queue)
                dropped += 1
                continue
            front = [self._entry(x, node[x.uid], lam) for x in heapq.nsmallest(FRONTIER_SHOWN, queue)]
            if e.finished:  # the first finished hypothesis to reach the top is the answer
                heapq.heappop(queue)
                pops[len(e.ids)] += 1
                best = e
                yield Step("beam", [], beams=[self._popped(e, node[e.uid], lam)], deal={**head, "candidates": []},
                           astar=self._evidence(front, [e], pops, expansions, waves, dropped))
                break
            if lam == 0.0:  # f = g only falls along a path: take_wave's order is settled
                wave, n_dropped, _ = take_wave(queue, pops, k)
                dropped += n_dropped
            else:  # a child may outscore its parent: one pop at a time
                wave = [heapq.heappop(queue)]
                pops[len(e.ids)] += 1
            waves += 1
            expansions += len(wave)
            logprobs = reader.read(wave)
            cands: list[Candidate] = []
            for row, w in enumerate(wave):
                # float32 accumulation, as best_first_beam's scores
                acc = logprobs[row] + torch.tensor(node[w.uid].logprob, dtype=torch.float32)
                vals, toks = torch.topk(acc, min(top_k, acc.numel()))
                children = []
                for v, tok in zip(vals.tolist(), toks.tolist()):
                    fin = len(w.ids) + 1 >= ctx.max_new_tokens or hits_stop(ctx, w.ids + [int(tok)])
                    children.append(Candidate(row, int(tok), float(logprobs[row, tok]), float(v), fin, [], 0.0))
                n_rollouts += self._lookahead(ctx, pot, w.ids, children, depth, len(w.ids))
                for c in children:
                    c.score = c.logprob + lam * c.reward
                    c.status = "finished" if c.finished else "queued"
                    child = Entry((-c.score, next(order)), w.ids + [c.token], c.score, c.finished, w.uid)
                    node[child.uid] = c
                    heapq.heappush(queue, child)
                cands += children
            reader.release(pops, k)
            rows = {r: r for r in range(len(wave))}
            yield Step("beam", [], beams=[self._popped(w, node[w.uid], lam) for w in wave],
                       deal={**head, "candidates": [self._show(ctx, c, rows) for c in cands]},
                       astar=self._evidence(front, wave, pops, expansions, waves, dropped))
        if best is None:  # cancelled or nothing left: the best queued hypothesis
            best = min(queue) if queue else root
        c = node[best.uid]
        self.output_override = list(best.ids)
        self.finish_reason = finish_reason_of(ctx, best.ids)
        self.extra_stats.update(
            reward=pot.parts(), output_logprob=round(c.logprob, 5), output_reward=round(c.reward, 5),
            final_reward=round(pot(reward_text(ctx, best.ids), True), 5), best_score=round(best.score, 5),
            rollouts=n_rollouts, expansions=expansions, waves=waves, dropped=dropped)

    @staticmethod
    def _entry(e: Entry, c: Candidate, lam: float) -> dict[str, Any]:
        """A queue entry as frontier evidence (full precision, so the pop recomputes from the record)."""
        return {"id": e.uid, "parent": e.parent, "ids": list(e.ids), "g": c.logprob, "h": lam * c.reward,
                "f": e.score, "reward": c.reward, "depth": len(e.ids), "finished": e.finished}

    @staticmethod
    def _popped(e: Entry, c: Candidate, lam: float) -> dict[str, Any]:
        """A popped node as one of the step's ``beams`` (``score`` is its f)."""
        return {"ids": list(e.ids), "score": round(e.score, 5), "logprob": round(c.logprob, 5),
                "reward": round(c.reward, 5), "h": round(lam * c.reward, 5), "id": e.uid, "parent": None,
                "finished": e.finished, "popped": True}

    @staticmethod
    def _evidence(front: list[dict[str, Any]], popped: list[Entry], pops: Counter[int], expansions: int,
                  waves: int, dropped: int) -> dict[str, Any]:
        """A step's ``astar`` field: the frontier at the choice, what was popped, the counts so far."""
        return {"frontier": front, "popped": [e.uid for e in popped],
                "pops": {str(d): n for d, n in sorted(pops.items())}, "expansions": expansions, "waves": waves,
                "dropped": dropped}

    @staticmethod
    def _expand(ctx: Context, pot: Potential, row: int, ids: list[int], lp: float, logprobs: torch.Tensor,
                top_k: int, depth: int, t: int) -> tuple[list[Candidate], int]:
        """The ``top_k`` children of one node with their lookahead rollouts and rewards, and
        how many rollouts were run."""
        vals, toks = torch.topk(logprobs, min(top_k, logprobs.numel()))
        out = []
        for v, tok in zip(vals.tolist(), toks.tolist()):
            child = ids + [int(tok)]
            fin = t + 1 >= ctx.max_new_tokens or hits_stop(ctx, child)
            out.append(Candidate(row, int(tok), float(v), lp + float(v), fin, [], 0.0))
        return out, Deal._lookahead(ctx, pot, ids, out, depth, t)

    @staticmethod
    def _lookahead(ctx: Context, pot: Potential, ids: list[int], out: list[Candidate], depth: int, t: int) -> int:
        """Roll the unfinished children of the node ``ids`` (at depth ``t``) out greedily for
        ``depth`` tokens and read each child's reward; returns how many rollouts were run."""
        room = ctx.max_new_tokens - (t + 1)
        todo = [c for c in out if not c.finished]
        if depth > 0 and todo:
            seqs, _ = rollouts(ctx, list(ctx.prompt_ids) + ids, [c.token for c in todo], 1 + min(depth, room),
                               lambda i, n, r: int(torch.argmax(r)), False)
            for c, s in zip(todo, seqs):
                c.lookahead = [int(x) for x in s[1:]]
        for c in out:
            full = ids + [c.token] + c.lookahead
            done = c.finished or len(full) >= ctx.max_new_tokens or hits_stop(ctx, full)
            c.reward = float(pot(reward_text(ctx, full), done))
        return len(todo) if depth > 0 else 0

    @staticmethod
    def _show(ctx: Context, c: Candidate, prev_pos: dict[int, int]) -> dict[str, Any]:
        """A candidate as trace evidence (full precision, so the ranking recomputes from the record)."""
        return {"beam": prev_pos.get(c.row, 0), "token": c.token, "token_logprob": c.token_logprob,
                "logprob": c.logprob, "reward": c.reward, "score": c.score, "finished": c.finished,
                "status": c.status, "lookahead": c.lookahead,
                "lookahead_text": ctx.target.decode(c.lookahead) if c.lookahead else ""}

    @staticmethod
    def _beams(grp: BeamGroup, ended: list[tuple[Hyp, int]], parents: list[int], prev_pos: dict[int, int],
               new_lp: list[float], new_r: list[float],
               pooled: dict[tuple[int, ...], tuple[float, float]]) -> list[dict[str, Any]]:
        """The step's ``beams``: the kept nodes (row order) with their log-probability and
        reward (none once the search is done, as beam search records), then the hypotheses that
        finished at this step."""
        out = []
        for j in range(grp.k):
            if grp.done or float(grp.scores[j]) <= -BIG / 2:
                continue
            out.append({"ids": list(grp.running[j]), "score": round(float(grp.scores[j]), 5),
                        "logprob": round(new_lp[j], 5), "reward": round(new_r[j], 5),
                        "parent": prev_pos.get(parents[j]), "finished": False})
        for h, par in ended:
            lp, r = pooled[tuple(h.ids)]
            out.append({"ids": list(h.ids), "score": round(h.score, 5), "logprob": round(lp, 5),
                        "reward": round(r, 5), "parent": prev_pos.get(par), "finished": True})
        return out


__all__ = ["Candidate", "Deal", "SEARCHES", "reward_of", "reward_text"]
