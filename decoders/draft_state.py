"""A draft model's state beside the target: its rolling-back KV cache and the ids it holds
(:class:`DraftState`), and its logits over the target's vocabulary (:func:`fit_logits`).

Shared by every decoder that keeps a second causal model in step with the committed output:
the speculative family's drafts, the collaboration family's small model and the rollouts'
main continuation.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from decoders.kv_cache import CacheInfo, check_rollback, crop_layers, rollback_cache
from playground.core.errors import PlaygroundError


def fit_logits(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits over the target's vocabulary size: models of one family often pad their
    embedding tables to different sizes over one tokenizer (Qwen2.5 0.5B vs 7B), so the two
    are compared on the shared ids; a draft's extra rows are cut and ids only the target has
    get -inf (the draft never proposes them)."""
    n = logits.shape[-1]
    if n == size:
        return logits
    if n > size:
        return logits[..., :size]
    pad = torch.full((*logits.shape[:-1], size - n), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)



class DraftState:
    """A draft model's KV cache and the ids it holds; catches up on newly committed tokens."""

    def __init__(self, view: Any, info: CacheInfo | None = None, decoder: str = "") -> None:
        self.view = view
        # a state that cannot be cut back would keep rejected tokens silently: refuse it
        self.info = info or check_rollback(decoder or "a draft-and-verify decoder", view)
        self.cache = rollback_cache(view, self.info)
        self.ids: list[int] = []
        emb = view.model.get_input_embeddings() if hasattr(view.model, "get_input_embeddings") else None
        self.rows = int(emb.weight.shape[0]) if emb is not None else int(view.vocab_size)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        if length < len(self.ids):
            crop_layers(self.cache, length)
            del self.ids[length:]

    def keep_common(self, committed: Sequence[int]) -> int:
        """Crop the cache to its common prefix with ``committed``, leaving at least the last
        committed token to feed; return the length kept."""
        n = 0
        for a, b in zip(self.ids, committed):
            if a != b:
                break
            n += 1
        n = min(n, len(committed) - 1)
        self.crop(n)
        return n

    def catch_up(self, committed: Sequence[int]) -> torch.Tensor:
        """Feed what the cache lacks of ``committed`` (at least the last token); return the
        draft logits after it (1-D)."""
        n = self.keep_common(committed)
        return self.feed(committed[n:])[-1]

    def feed(self, ids: Sequence[int], **kw: Any) -> torch.Tensor:
        """Feed ``ids`` after the cache; return their logits (len, V)."""
        if ids and max(ids) >= self.rows:
            # a padded id only the target's table has (real checkpoints never pick one)
            raise PlaygroundError(f"the target committed token id {max(ids)}, which draft model "
                                  f"{self.view.name!r} cannot embed ({self.rows} ids)")
        out = self.view.forward(list(ids), cache=self.cache, **kw)
        self.cache = out.cache
        self.ids.extend(int(i) for i in ids)
        return out.logits[0]
