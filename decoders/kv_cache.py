"""KV caches by kind, for the decoders that cut a cache back or verify a token tree.

transformers builds a model's cache from its config: full-attention layers keep every
position; sliding-window layers (Mistral with a window, Gemma-2/3's local layers, Phi-3
checkpoints) keep only the last ``window - 1`` positions and cannot be cut back once the
window is full; state-space layers (Mamba) keep a recurrent state with no positions at all.
Draft-then-verify decoders feed positions they may have to drop, and tree verification
feeds a 4-D mask the model uses as given, so this module decides per model:

* ``full``: the model's own cache; crop and select positions freely.
* ``windowed``: a cache whose every layer keeps all its positions (the model still applies
  its window through the mask it builds), and a tree mask that applies each layer type's
  window itself (:func:`fit_tree_mask`). Costs the memory of the full context.
* ``recurrent`` / ``other``: no correct rollback here; :func:`check_rollback` refuses the
  decoder in one line.

The crop/select helpers every rollback uses live here too (one place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from playground.core.errors import PlaygroundError

NEG_INF = float("-inf")
WINDOW_TYPES = ("sliding_attention",)
RECURRENT_TYPES = ("linear_attention", "conv", "hybrid", "hybrid_sliding")
PLAIN_TYPES = ("full_attention", "dummy")


@dataclass(frozen=True)
class CacheInfo:
    """What a model's cache is made of: ``kind`` (full | windowed | recurrent | other), the
    attention type of each layer and each layer's window (None for full attention)."""

    kind: str
    layer_types: tuple[str, ...]
    windows: tuple[int | None, ...]
    model_type: str

    def window_of(self, layer_type: str) -> int | None:
        """The window of the layers of ``layer_type`` (None: no window)."""
        for t, w in zip(self.layer_types, self.windows):
            if t == layer_type:
                return w
        return None


def cache_info(view: Any) -> CacheInfo:
    """The cache kind of a model handle or view (from its config, as transformers reads it)."""
    config = view.config
    mtype = str(getattr(config, "model_type", "") or "")
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        text = config.get_text_config(decoder=True)
        types, kwargs = get_layer_types_and_kwargs(text)
    except Exception:  # noqa: BLE001 - an older or custom config: judge by its fields
        types, kwargs = _fallback_types(config)
    types = tuple(str(t) for t in types)
    windows = tuple(kw.get("sliding_window") if t in WINDOW_TYPES else None for t, kw in zip(types, kwargs))
    if any(t in RECURRENT_TYPES for t in types) or _stateful(mtype):
        kind = "recurrent"
    elif any(t not in PLAIN_TYPES + WINDOW_TYPES for t in types):
        kind = "other"
    elif any(w is not None for w in windows):
        kind = "windowed"
    else:
        kind = "full"
    return CacheInfo(kind, types, windows, mtype)


def _fallback_types(config: Any) -> tuple[list[str], list[dict[str, Any]]]:
    n = int(getattr(config, "num_hidden_layers", 0) or 0)
    window = getattr(config, "sliding_window", None)
    t = "sliding_attention" if isinstance(window, int) and window > 0 else "full_attention"
    return [t] * n, [{"sliding_window": window}] * n


def _stateful(model_type: str) -> bool:
    # model families whose transformers code keeps a recurrent state outside the layer table
    return model_type in ("mamba", "mamba2", "rwkv", "recurrent_gemma", "xlstm", "falcon_mamba")


def check_rollback(decoder: str, view: Any, role: str = "model") -> CacheInfo:
    """Refuse, in one line, a decoder that must cut back the cache of a model that cannot be
    cut back (a recurrent state, or layer types this module does not know); else the info."""
    info = cache_info(view)
    if info.kind == "recurrent":
        raise PlaygroundError(
            f"{decoder} cannot run on {role} {view.name!r}: its {info.model_type or 'recurrent'} layers keep a "
            f"recurrent state that cannot be cut back after a rejected draft; use greedy or a sampler")
    if info.kind == "other":
        odd = sorted({t for t in info.layer_types if t not in PLAIN_TYPES + WINDOW_TYPES})
        raise PlaygroundError(
            f"{decoder} cannot run on {role} {view.name!r}: its {', '.join(odd)} cache layers cannot be cut "
            f"back after a rejected draft; use greedy or a sampler")
    return info


def rollback_cache(view: Any, info: CacheInfo | None = None) -> Any:
    """An empty cache that can be cut back to any length for this model (see the module doc)."""
    info = info or cache_info(view)
    cache = view.new_cache()
    if info.kind == "windowed":
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

        # a full layer in place of each windowed one: nothing falls out of the window, and
        # the other layers (shared-KV placeholders, say) stay as the model's config made them
        cache.layers = [DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer
                        for layer in cache.layers]
    return cache


class MaskMap(dict):
    """Attention masks per layer type (the form hybrid models accept in place of one mask);
    ``to(device)`` moves every mask, so it passes wherever a single mask tensor does."""

    def to(self, device: Any) -> "MaskMap":
        """The same masks on ``device``."""
        return MaskMap({k: v.to(device) for k, v in self.items()})


def window_rows(mask: torch.Tensor, q_pos: torch.Tensor, kv_pos: torch.Tensor, window: int) -> torch.Tensor:
    """``mask`` (1, 1, q, kv; 0 = attend) with every key at least ``window`` positions before
    its query blocked, as transformers' sliding-window mask does (``kv > q - window``)."""
    far = (q_pos.view(-1, 1) - kv_pos.view(1, -1)) >= window
    out = mask.clone()
    out[0, 0][far.to(out.device)] = NEG_INF
    return out


def fit_tree_mask(mask: torch.Tensor | None, positions: torch.Tensor | None, past_len: int,
                  info: CacheInfo) -> Any:
    """The mask to pass for a tree whose plain mask is ``mask`` (cache of ``past_len``
    positions 0.., then the fed tokens at ``positions``): unchanged for full attention; the
    windowed mask when every layer has one window; a :class:`MaskMap` per layer type when
    windowed and global layers mix (Gemma-2/3)."""
    if mask is None or info.kind != "windowed":
        return mask
    q_pos = positions.view(-1).cpu()
    kv_pos = torch.cat([torch.arange(past_len), q_pos])
    return masks_by_type(mask, q_pos, kv_pos, info)


def masks_by_type(mask: torch.Tensor, q_pos: torch.Tensor, kv_pos: torch.Tensor, info: CacheInfo) -> Any:
    """One mask per layer type of a windowed model, from the plain mask and the positions of
    its queries and keys; a single tensor when all layers share one."""
    by_type = {}
    for t in dict.fromkeys(info.layer_types):
        w = info.window_of(t)
        by_type[t] = mask if w is None else window_rows(mask, q_pos, kv_pos, int(w))
    if len(by_type) == 1:
        return next(iter(by_type.values()))
    return MaskMap(by_type)


# ---------------------------------------------------------------------- crop & select
def cache_len(cache: Any, layer: int = 0) -> int:
    """Positions held by one layer of a KV cache."""
    if cache is None:
        return 0
    try:
        return int(cache.get_seq_length(layer))
    except TypeError:
        return int(cache.get_seq_length())


def crop_layers(cache: Any, length: int, layers: int | None = None) -> None:
    """Keep the first ``length`` positions of the first ``layers`` layers (all by default).

    Unlike ``DynamicCache.crop`` this looks at each layer's own length, so a cache whose
    first layers hold more positions (an early-exit draft wrote them) is cut correctly.
    """
    for layer in list(cache.layers)[: layers if layers is not None else len(cache.layers)]:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        if layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def select_cache(cache: Any, keep: Sequence[int]) -> None:
    """Keep only the cache positions ``keep`` (in that order), in every layer.

    Used to reduce the cache to the accepted path of a verified tree. Falls back to a crop
    when ``keep`` is a prefix.
    """
    keep = list(keep)
    n = cache_len(cache)
    if keep == list(range(len(keep))):
        crop_layers(cache, len(keep))
        return
    idx = None
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        if layer.keys.shape[-2] != n:
            raise RuntimeError("select_cache: layers of unequal length")
        if idx is None or idx.device != layer.keys.device:
            idx = torch.tensor(keep, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)


def repeat_batch(cache: Any, k: int) -> None:
    """Repeat every batch row of ``cache`` ``k`` times in place (beams, samples, candidates).

    ``Cache.batch_repeat_interleave`` fails on recurrent layers (Mamba's), which have no such
    method in transformers 5.24; their ``reorder_cache`` with repeated row indices does the same.
    """
    for layer in cache.layers:
        if hasattr(layer, "batch_repeat_interleave"):
            layer.batch_repeat_interleave(k)
        else:
            rows, device = _batch_size(layer)
            if rows:
                layer.reorder_cache(torch.arange(rows, device=device).repeat_interleave(k))


def select_rows(cache: Any, rows: Sequence[int]) -> None:
    """Keep the batch rows ``rows`` of ``cache`` (in that order), in place, on every layer kind.

    ``Cache.batch_select_indices`` fails on recurrent layers (Mamba's), which lack it in
    transformers 5.24; their ``reorder_cache`` with the kept row indices does the same.
    """
    for layer in cache.layers:
        if hasattr(layer, "batch_select_indices"):
            dev = layer.keys.device if torch.is_tensor(getattr(layer, "keys", None)) else None
            layer.batch_select_indices(torch.tensor(list(rows), dtype=torch.long, device=dev))
        else:
            n, device = _batch_size(layer)
            if n:
                layer.reorder_cache(torch.tensor(list(rows), dtype=torch.long, device=device))


def _batch_size(layer: Any) -> tuple[int, Any]:
    for states in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)):
        for t in (states or {}).values():
            if torch.is_tensor(t):
                return int(t.shape[0]), t.device
    return 0, None
