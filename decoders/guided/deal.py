"""``deal``: decoding-time alignment as a reward-guided tree search (DeAL, Huang et al. 2024).

Each search node is a partial hypothesis. At every expansion the ``top_k`` most probable next
tokens of each kept node are its candidate children; a candidate is extended by a greedy
lookahead of ``lookahead`` tokens and scored by

    score = log p(hypothesis) + lam * R(candidate + lookahead)

with ``R`` a programmatic reward (the keyword, length or regex potentials of ``smc``, each at
most 0). The ``num_beams`` best candidates stay in the search (beam search's rules, so that
``lam = 0`` with no lookahead is exactly the ``beam`` decoder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from decoders.base import Choice, Context, Decoder, Float, Int, Params, PlaygroundError, Text, register
from decoders.beam_batch import BIG, BatchState, BeamGroup, Hyp, finish_reason_of, hits_stop
from decoders.citation import arxiv
from decoders.guided.smc import Potential, compile_regex, parse_keywords
from decoders.search.rollouts import rollouts
from playground.core.trace import Step

REWARDS = ("keywords", "length", "regex")
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
    status: str = "pruned"


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
    Rewards: ``keywords`` (minus the share of keywords, case-insensitive, not yet in the
    text), ``length`` (minus the relative distance to ``target_chars``; only overshoot
    counts while the text may still grow) and ``regex`` (0 while ``match_regex`` can still
    match, else -1), the potentials of ``smc``.
    Simplifies: programmatic rewards only — no reward model (the paper's harmlessness and
    helpfulness rewards need one); the lookahead is greedy and reads the reward only, not
    the rollout's likelihood; the search is beam-shaped (every node at one depth) rather
    than a best-first frontier; no logits processors.
    """

    name = "deal"
    family = "guided"
    kind = "causal"
    step_kind = "beam"
    params = DealParams(
        reward=Choice("keywords", REWARDS, "the programmatic reward R of a partial hypothesis: keywords present, "
                                           "closeness to a target length, or a regex that can still match"),
        lam=Float(5.0, 0.0, 1000.0, "λ: weight of the reward in the score log p + λ·R (0 = beam search)"),
        top_k=Int(8, 1, 256, "candidate next tokens per kept node (the LM's most probable)"),
        num_beams=Int(4, 1, 64, "nodes kept at each step (the beam width)"),
        lookahead=Int(4, 0, 64, "greedy tokens rolled out after each candidate before its reward is read "
                                "(0 = the reward of the candidate itself)"),
        keywords=Text("", "reward=keywords: comma-separated words the output should contain (case-insensitive)"),
        target_chars=Int(0, 0, 100_000, "reward=length: output length in characters to aim for"),
        match_regex=Text("", "reward=regex: the output must be able to become (finished: be) a full match"),
        length_penalty=Float(1.0, -5.0, 5.0, "finished score = score / length^this (as beam search)"),
    )
    reference = "Huang et al. 2024, DeAL: Decoding-time Alignment for Large Language Models"
    papers = (arxiv("Huang et al. 2024, DeAL: Decoding-time Alignment for Large Language Models", "2402.06147"),)
    description = "Tree search over the LM's top-k tokens, scored by log p + λ·reward of a greedy lookahead"
    shows = ("; plus `deal` per step: every candidate child with its LM log-probability, reward, combined "
             "score, lookahead tokens and text, and whether it was kept, finished or pruned (step plot *DeAL "
             "candidates*, run plot *DeAL path: reward vs log-likelihood*)")

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
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
        n_rollouts = 0
        for t in range(ctx.max_new_tokens):
            ctx.check_cancel()
            logprobs = torch.log_softmax(logits.float(), -1).cpu()
            live = [b for b in range(k) if float(grp.scores[b]) > -BIG / 2]
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
            rollouts=n_rollouts)

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
        return out, (len(todo) if depth > 0 else 0)

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


__all__ = ["Candidate", "Deal", "reward_of", "reward_text"]
