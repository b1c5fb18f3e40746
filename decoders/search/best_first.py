"""``best_first_beam``: beam search's answer from a priority queue, expanding fewer hypotheses."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from decoders.base import Context, Decoder, Int, Params, register
from decoders.search._beam import finish_reason_of, hits_stop
from playground.trace import Step

FRONTIER_SHOWN = 12  # queue entries a step records (the best ones)


@dataclass(order=True)
class Entry:
    """A hypothesis in the queue, ordered best first (``key`` = -score, then insertion)."""

    key: tuple[float, int]
    ids: list[int] = field(compare=False)
    score: float = field(compare=False)
    finished: bool = field(compare=False)

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
    Consecutive pops of the same length are expanded together in one batched forward (a
    *wave*); each step is a wave, showing the popped hypotheses, the queue's best entries
    (``frontier``) and the pop counts per length (``pops``). ``stats.expansions`` counts
    expanded hypotheses (the paper's measure), to set against beam search's
    ``num_beams`` per step. Simplifies: each wave re-reads its hypotheses from the prompt
    without a KV cache (equal lengths batch without padding); no length normalisation (it
    would break the monotone score the method needs).
    """

    name = "best_first_beam"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = Params(num_beams=Int(4, 1, 64, "hypotheses of each length that may be popped (the beam width)"))
    reference = ("Meister, Vieira & Cotterell 2020, Best-First Beam Search (TACL)")
    description = "Beam search's answer from a priority queue: pop the best hypothesis, expand lazily"

    def run(self, ctx: Context) -> Iterator[Step]:
        k = int(ctx.params["num_beams"])
        order = itertools.count()
        queue: list[Entry] = [Entry((0.0, next(order)), [], 0.0, False)]
        pops: Counter[int] = Counter()
        expansions = dropped = waves = 0
        best: Entry | None = None
        while queue:
            ctx.check_cancel()
            if queue[0].finished:
                e = heapq.heappop(queue)
                if pops[len(e.ids)] >= k:
                    dropped += 1
                    continue
                pops[len(e.ids)] += 1
                best = e
                yield Step("beam", [], beams=[{**e.show(), "parent": None, "popped": True}],
                           frontier=[x.show() for x in heapq.nsmallest(FRONTIER_SHOWN, queue)],
                           pops={str(d): c for d, c in sorted(pops.items())}, wave=waves)
                break
            depth = len(queue[0].ids)
            wave: list[Entry] = []
            while queue and not queue[0].finished and len(queue[0].ids) == depth and len(wave) < k:
                e = heapq.heappop(queue)
                if pops[depth] >= k:
                    dropped += 1
                    continue
                pops[depth] += 1
                wave.append(e)
            if not wave:
                continue
            waves += 1
            expansions += len(wave)
            ids = torch.tensor([list(ctx.prompt_ids) + e.ids for e in wave], dtype=torch.long)
            logits = ctx.target.forward(ids, use_cache=False).logits[:, -1]
            logprobs = torch.log_softmax(logits.float(), -1)
            for row, e in enumerate(wave):
                # float32 accumulation, as beam search's running scores
                acc = logprobs[row] + torch.tensor(e.score, dtype=torch.float32)
                vals, toks = torch.topk(acc, min(k, acc.numel()))
                for v, t in zip(vals.tolist(), toks.tolist()):
                    child = e.ids + [int(t)]
                    fin = len(child) >= ctx.max_new_tokens or hits_stop(ctx, child)
                    heapq.heappush(queue, Entry((-v, next(order)), child, v, fin))
            yield Step("beam", [], beams=[{**e.show(), "parent": None, "popped": True} for e in wave],
                       frontier=[x.show() for x in heapq.nsmallest(FRONTIER_SHOWN, queue)],
                       pops={str(d): c for d, c in sorted(pops.items())}, wave=waves)
        if best is None:  # cancelled or nothing left: the best queued hypothesis
            best = min(queue) if queue else Entry((0.0, 0), [], 0.0, False)
        self.output_override = list(best.ids)
        self.finish_reason = finish_reason_of(ctx, best.ids)
        self.extra_stats.update(expansions=expansions, waves=waves, dropped=dropped,
                                best_score=round(best.score, 5))
