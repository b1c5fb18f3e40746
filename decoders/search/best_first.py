"""``best_first_beam``: beam search's answer from a priority queue, expanding fewer hypotheses."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from decoders.base import Context, Decoder, Int, Params, register
from decoders.citation import Paper, arxiv
from decoders.beam_batch import finish_reason_of, hits_stop
from decoders.search._waves import wave_reader
from playground.core.trace import Step

FRONTIER_SHOWN = 12  # queue entries a step records (the best ones)


@dataclass(order=True)
class Entry:
    """A hypothesis in the queue, ordered best first (``key`` = -score, then insertion)."""

    key: tuple[float, int]
    ids: list[int] = field(compare=False)
    score: float = field(compare=False)
    finished: bool = field(compare=False)
    parent: int = field(default=-1, compare=False)  # the insertion number of the entry it extends

    @property
    def uid(self) -> int:
        """The entry's insertion number (unique in one search)."""
        return self.key[1]

    def show(self) -> dict[str, Any]:
        """The entry as trace evidence."""
        return {"ids": list(self.ids), "score": round(self.score, 5), "depth": len(self.ids),
                "finished": self.finished}


@register
class BestFirstBeam(Decoder):
    """Best-first beam search (Meister, Vieira & Cotterell 2020).

    A priority queue holds hypotheses by summed log-probability, a score that only falls as a
    hypothesis grows. The best entry is popped; at most ``num_beams`` hypotheses of each
    length may be popped (the beam constraint), later ones of that length are dropped. A
    popped unfinished hypothesis is expanded (its ``num_beams`` best children are pushed); the
    first finished hypothesis (stop token, stop string or the length limit) to reach the top
    is the answer. Because scores only fall, pops come in score order and each length's
    pops are exactly the hypotheses beam search keeps, so the answer is beam search's with
    ``length_penalty=0`` — reached lazily: beams beam search would still extend after the
    winner is settled are never expanded.
    Several pops share one batched forward (a *wave*): entries are taken best first while
    the order is settled — none deeper than one already taken, and up to the first finished
    one — so each length's pops keep one-at-a-time best-first's order and the answer is
    unchanged (a wave may expand a few hypotheses the one-at-a-time search would never
    reach), and the search needs no more forward passes than beam search's one per length
    (measured on the bundled model and tiny random ones, not proven). Each step is a wave,
    showing the popped hypotheses, the queue's best entries (``frontier``) and the pop
    counts per length (``pops``). ``stats.expansions`` counts expanded hypotheses (the
    paper's measure), to set against beam search's ``num_beams`` per step.
    On full-attention models each expanded hypothesis keeps its keys and values and a wave
    feeds one token per row, as beam search does; on windowed or recurrent models a wave
    re-reads its continuations from the prompt's cache (decoders/search/_waves.py).
    ``recombine`` n > 0 turns the search into Xu et al.'s best-first lattice search with
    hypothesis recombination: a hypothesis about to be expanded whose last n tokens equal
    those of a hypothesis of its length already expanded is merged into it instead — not expanded, and not
    counted against its length's beam slots, its path joining the other's node, whose
    continuations it shares — so the kept slots go to hypotheses that differ, and the explored
    space is a lattice that encodes more paths than it expanded nodes. Each wave records its
    expansions and merges (``lattice``); ``stats`` counts ``merges`` and ``paths_encoded`` (the
    distinct token sequences that reach the lattice's leaves, against ``expansions`` nodes). With no merge the search is
    exactly best-first's.
    Simplifies: no length normalisation (it would break the monotone score the method needs);
    recombination by an exact n-token suffix match (the paper's simplest rule), and the search
    still stops at the first finished hypothesis instead of filling a node budget.
    """

    name = "best_first_beam"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = Params(num_beams=Int(4, 1, 64, "hypotheses of each length that may be popped (the beam width)"),
                    recombine=Int(0, 0, 16, "lattice recombination: merge a hypothesis into an expanded one with the "
                                            "same last n tokens; 0 = off (plain best-first beam search)"))
    reference = ("Meister, Vieira & Cotterell 2020, Best-First Beam Search (TACL); "
                 "Xu, Jonnalagadda & Durrett 2022, Massive-scale Decoding for Text Generation using Lattices (NAACL)")
    papers = (
        Paper("Meister, Vieira & Cotterell 2020, Best-First Beam Search (TACL)",
              "https://doi.org/10.1162/tacl_a_00346"),
        arxiv("Xu, Jonnalagadda & Durrett 2022, Massive-scale Decoding for Text Generation "
              "using Lattices (NAACL; best-first search with recombination, the recombine knob)", "2112.07660"),
    )
    description = "Beam search's answer from a priority queue: pop the best hypothesis, expand lazily"
    shows = ("; with `recombine`, `lattice` per wave: the hypotheses expanded and those merged into a node of "
             "their length sharing their last n tokens (run plot *Lattice*)")

    def run(self, ctx: Context) -> Iterator[Step]:
        k = int(ctx.params["num_beams"])
        order = itertools.count()
        queue: list[Entry] = [Entry((0.0, next(order)), [], 0.0, False)]
        pops: Counter[int] = Counter()
        expansions = dropped = waves = 0
        best: Entry | None = None
        reader = wave_reader(ctx)
        lattice = Lattice(int(ctx.params["recombine"]))
        while queue:
            ctx.check_cancel()
            e = queue[0]
            if pops[len(e.ids)] >= k:  # the beam constraint: this length is settled
                heapq.heappop(queue)
                dropped += 1
                continue
            if e.finished:  # nothing pending can outscore it: beam search's answer
                heapq.heappop(queue)
                pops[len(e.ids)] += 1
                best = e
                yield Step("beam", [], beams=[{**e.show(), "parent": None, "popped": True}],
                           frontier=[x.show() for x in heapq.nsmallest(FRONTIER_SHOWN, queue)],
                           pops={str(d): c for d, c in sorted(pops.items())}, wave=waves,
                           **lattice.evidence([], [], e))
                break
            wave, n_dropped, merged = take_wave(queue, pops, k, lattice.merge_target if lattice.n else None)
            if not wave:  # every candidate of this wave merged: take the next one
                if merged:
                    yield Step("beam", [], beams=[], frontier=[x.show() for x in heapq.nsmallest(FRONTIER_SHOWN, queue)],
                               pops={str(d): c for d, c in sorted(pops.items())}, wave=waves,
                               **lattice.evidence([], merged))
                dropped += n_dropped
                continue
            dropped += n_dropped
            waves += 1
            expansions += len(wave)
            logprobs = reader.read(wave)
            for row, e in enumerate(wave):
                # float32 accumulation, as beam search's running scores
                acc = logprobs[row] + torch.tensor(e.score, dtype=torch.float32)
                vals, toks = torch.topk(acc, min(k, acc.numel()))
                for v, t in zip(vals.tolist(), toks.tolist()):
                    child = e.ids + [int(t)]
                    fin = len(child) >= ctx.max_new_tokens or hits_stop(ctx, child)
                    heapq.heappush(queue, Entry((-v, next(order)), child, v, fin, e.uid))
            reader.release(pops, k)
            yield Step("beam", [], beams=[{**e.show(), "parent": None, "popped": True} for e in wave],
                       frontier=[x.show() for x in heapq.nsmallest(FRONTIER_SHOWN, queue)],
                       pops={str(d): c for d, c in sorted(pops.items())}, wave=waves,
                       **lattice.evidence(wave, merged))
        if best is None:  # cancelled or nothing left: the best queued hypothesis
            best = min(queue) if queue else Entry((0.0, 0), [], 0.0, False)
        self.output_override = list(best.ids)
        self.finish_reason = finish_reason_of(ctx, best.ids)
        self.extra_stats.update(expansions=expansions, waves=waves, dropped=dropped,
                                best_score=round(best.score, 5))
        if lattice.n:
            self.extra_stats.update(merges=lattice.merges, paths_encoded=lattice.paths_encoded(queue, best))


class Lattice:
    """The recombination state of a lattice search: which expanded hypothesis holds each
    (length, n-token suffix), the lattice's edges, and the merges so far.

    A node is an expanded hypothesis (by its insertion number) with an edge from its parent; a
    merged hypothesis adds an edge from its own parent to the node it merged into. Only
    hypotheses of one length merge, so every edge goes one token deeper and the lattice is
    acyclic.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.holder: dict[tuple[int, ...], int] = {}
        self.into: dict[int, list[int]] = {}  # node -> parents of the hypotheses merged into it
        self.parent: dict[int, int] = {}
        self.merges = 0

    def merge_target(self, e: Entry) -> int | None:
        """The node ``e`` merges into, or None, in which case ``e`` becomes a node itself."""
        key = (len(e.ids), *e.ids[-self.n:]) if len(e.ids) >= self.n else None
        into = self.holder.get(key) if key is not None else None
        if into is None:
            if key is not None:
                self.holder[key] = e.uid
            return None
        self.merges += 1
        self.into.setdefault(into, []).append(e.parent)
        return into

    def evidence(self, wave: list[Entry], merged: list[tuple[Entry, int]],
                 answer: Entry | None = None) -> dict[str, Any]:
        """The ``lattice`` field of a step (empty without recombination)."""
        if not self.n:
            return {}
        for e in wave:
            self.parent[e.uid] = e.parent
        ev: dict[str, Any] = {
            "n": self.n,
            # [id, parent id, depth, last token] of each expanded hypothesis
            "nodes": [[e.uid, e.parent, len(e.ids), e.ids[-1] if e.ids else None] for e in wave],
            # [id, parent id, depth, last token, id of the node it merged into]
            "merges": [[e.uid, e.parent, len(e.ids), e.ids[-1], into] for e, into in merged],
        }
        if answer is not None:
            ev["answer"] = [answer.uid, answer.parent, len(answer.ids), answer.ids[-1] if answer.ids else None]
        return {"lattice": ev}

    def paths(self, uid: int, memo: dict[int, int]) -> int:
        """Distinct token sequences from the root to node ``uid`` (1 for the root)."""
        if uid not in self.parent:
            return 1
        if uid not in memo:
            memo[uid] = self.paths(self.parent[uid], memo) + sum(self.paths(p, memo) for p in self.into.get(uid, []))
        return memo[uid]

    def paths_encoded(self, queue: list[Entry], answer: Entry) -> int:
        """Distinct token sequences reaching the lattice's leaves (queued hypotheses and the
        answer): each leaf is reached by as many paths as reach its parent."""
        memo: dict[int, int] = {}
        return sum(self.paths(e.parent, memo) for e in [*queue, answer])


def take_wave(queue: list[Entry], pops: Counter[int], k: int,
              merge: Any = None) -> tuple[list[Entry], int, list[tuple[Entry, int]]]:
    """Pop the hypotheses one batched forward may expand without changing the pop order.

    One-at-a-time best-first pops the best entry, expands it, pops the next best. A wave takes
    entries in score order as long as that order is already settled: an entry whose length is
    not deeper than every entry taken so far cannot be outscored, at its length, by a child of
    those (children are one longer and score no higher than their parent), so it would be
    popped next anyway. A deeper entry is held back (an earlier one's child may still claim its
    length's slot first); a finished entry ends the wave (an earlier one's descendants may
    still outscore it). Entries of a settled length are dropped on the way. ``merge(e)`` (lattice
    recombination) names the node an entry merges into, or None; a merged entry is taken out
    of the queue without a pop. Returns the wave, best first, the count dropped, and the
    merged entries with their nodes; held entries go back to the queue.
    """
    merged: list[tuple[Entry, int]] = []
    wave: list[Entry] = []
    held: list[Entry] = []
    floor = None  # the shallowest length taken so far
    dropped = 0
    while queue:
        e = heapq.heappop(queue)
        depth = len(e.ids)
        if pops[depth] >= k:
            dropped += 1
            continue
        if e.finished:
            held.append(e)
            break
        if floor is not None and depth > floor:
            held.append(e)
            continue
        into = merge(e) if merge is not None else None
        if into is not None:
            merged.append((e, into))
            continue
        pops[depth] += 1
        wave.append(e)
        floor = depth
    for e in held:
        heapq.heappush(queue, e)
    return wave, dropped, merged


# The queue machinery other searches reuse (``deal``'s A* search): the entries, the waves, the
# readers that give a wave its next-token log-probabilities in one counted forward.
__all__ = ["FRONTIER_SHOWN", "BestFirstBeam", "Entry", "Lattice", "take_wave", "wave_reader"]
