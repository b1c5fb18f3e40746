"""How ``best_first_beam`` reads a wave: next-token log-probs for several hypotheses of mixed
lengths in one batched, counted forward pass."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any, Protocol, Sequence

import torch

from decoders.kv_cache import cache_info, repeat_batch
from decoders.base import Context


class Hypothesis(Protocol):
    """What a reader needs of a queue entry."""

    ids: list[int]
    parent: int

    @property
    def uid(self) -> int: ...


def wave_reader(ctx: Context) -> "PromptCacheReader | HypothesisCacheReader":
    """A per-hypothesis KV cache where every layer is plain full attention (positions and
    padding are then given explicitly); elsewhere (windows, recurrent state) the prompt's
    cache with the continuations re-read, which any causal model runs as it is."""
    info = cache_info(ctx.target)
    if info.kind == "full" and info.layer_types and all(t == "full_attention" for t in info.layer_types):
        return HypothesisCacheReader(ctx)
    return PromptCacheReader(ctx)


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1).cpu()


class PromptCacheReader:
    """Each wave copies the prompt's KV cache to every row and feeds the whole continuations.

    Rows of different lengths are padded on the right: under a causal mask a position never
    sees the padding after it, so each row's last real position reads exactly its own prefix
    at its own positions, no attention mask needed.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.prompt_cache: Any = None

    def read(self, wave: Sequence[Hypothesis]) -> torch.Tensor:
        """(rows, V) log-probs after ``prompt + ids`` of each hypothesis."""
        view = self.ctx.target
        rows = [list(e.ids) for e in wave]
        if self.prompt_cache is None:
            # the root is popped alone, first: this forward is the prompt's prefill
            out = view.forward(list(self.ctx.prompt_ids), cache=view.new_cache())
            self.prompt_cache = out.cache
            return _log_softmax(out.logits[:, -1].expand(len(rows), -1))
        width = max(len(r) for r in rows)
        pad = rows[0][-1]  # any id: nothing reads it
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        cache = copy.deepcopy(self.prompt_cache)
        if len(rows) > 1:
            repeat_batch(cache, len(rows))
        logits = view.forward(ids, cache=cache).logits
        last = torch.tensor([len(r) - 1 for r in rows], dtype=torch.long, device=logits.device)
        return _log_softmax(logits[torch.arange(len(rows), device=logits.device), last])

    def release(self, pops: Counter[int], k: int) -> None:
        """Nothing is kept per hypothesis."""


class HypothesisCacheReader:
    """Each expanded hypothesis keeps its keys and values; a wave feeds one token per row.

    A popped hypothesis is its parent plus one token, so its row is the parent's cache (padded
    on the left to the wave's longest, the padding masked out, positions given) and its last
    token: one new position per row, as beam search feeds. A hypothesis's cache is dropped once
    its children's length is settled (``num_beams`` pops there), so at most the open lengths'
    popped hypotheses hold one.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.kv: dict[int, tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]] = {}  # uid -> (depth, layers)

    def read(self, wave: Sequence[Hypothesis]) -> torch.Tensor:
        """(rows, V) log-probs after ``prompt + ids`` of each hypothesis."""
        view = self.ctx.target
        if len(wave) == 1 and not wave[0].ids:  # the root: the prompt's prefill
            out = view.forward(list(self.ctx.prompt_ids), cache=view.new_cache())
            self._keep(wave, out.cache, [0])
            return _log_softmax(out.logits[:, -1])
        pasts = [self.kv[e.parent][1] for e in wave]
        lens = [layers[0][0].shape[-2] for layers in pasts]
        width = max(lens)
        cache = view.new_cache()
        for i, layer in enumerate(cache.layers):
            keys = torch.stack([_left_pad(p[i][0], width) for p in pasts])
            values = torch.stack([_left_pad(p[i][1], width) for p in pasts])
            layer.update(keys, values)
        mask = torch.tensor([[0] * (width - n) + [1] * (n + 1) for n in lens], dtype=torch.long)
        ids = torch.tensor([[e.ids[-1]] for e in wave], dtype=torch.long)
        positions = torch.tensor([[n] for n in lens], dtype=torch.long)
        out = view.forward(ids, cache=cache, attention_mask=mask, position_ids=positions)
        self._keep(wave, out.cache, [width - n for n in lens])
        return _log_softmax(out.logits[:, -1])

    def _keep(self, wave: Sequence[Hypothesis], cache: Any, starts: list[int]) -> None:
        for row, (e, start) in enumerate(zip(wave, starts)):
            self.kv[e.uid] = (len(e.ids), [(layer.keys[row, :, start:], layer.values[row, :, start:])
                                           for layer in cache.layers])

    def release(self, pops: Counter[int], k: int) -> None:
        """Forget the caches of hypotheses whose children can no longer be popped."""
        for uid in [u for u, (depth, _) in self.kv.items() if pops[depth + 1] >= k]:
            del self.kv[uid]


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """(H, n, D) -> (H, width, D) with zeros before (masked out: their values never count)."""
    n = t.shape[-2]
    if n == width:
        return t
    return torch.cat([t.new_zeros(t.shape[:-2] + (width - n, t.shape[-1])), t], dim=-2)
