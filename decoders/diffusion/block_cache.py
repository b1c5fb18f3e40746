"""Fast-dLLM's block-wise KV cache (prefix and dual), approximate, for BERT-family masked LMs.

A masked-diffusion model attends in both directions, so no position's keys and values are
final until the whole canvas is: a causal KV cache does not apply. Fast-dLLM (Wu et al.
2025) observes that the keys and values *outside* the block being decoded barely change
during that block's steps, and caches them anyway:

* at the start of each block, one full forward over the canvas keeps every layer's keys
  (rotary applied at their positions) and values;
* during the block's later steps only some positions go through the layers: with the
  **prefix** cache the block and everything after it (the suffix), attending to the cached
  keys/values of the prefix (prompt and earlier blocks); with the **dual** cache the block
  alone, attending to the cached prefix *and* suffix;
* the cache is refreshed at the next block start.

This changes the logits, so a cached run is an approximation of the uncached one (the paper
reports small accuracy losses for large speed-ups on LLaDA and Dream); the knob's help says
so and each step's ``cache`` evidence records what was computed fresh and when the cache was
last refreshed. Positions that were not computed fresh keep the logits of the last full
forward (only the dual cache has such masked positions: the suffix), so their step evidence
(confidence, prediction) is as old as the cache.

Supported: ModernBERT (``ModernBertForMaskedLM``, the bundled ``tiny-shakespeare-diffusion``),
run here layer by layer (embeddings, then per layer attention norm, fused QKV, rotary at the
true positions, attention honouring the local sliding-window layers, output projection,
residual, MLP norm, gated MLP, residual; final norm and head), and BERT / RoBERTa
(post-norm layers, learned absolute positions). Other models (LLaDA and Dream, whose remote
code this module does not reach into; DistilBERT) are refused in one line for ``cache``
other than ``none``. A cached step is counted as one forward pass over the positions it
computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import BertForMaskedLM, ModernBertForMaskedLM, RobertaForMaskedLM

from decoders.base import Choice
from decoders.diffusion._canvas import Layout
from playground.core.errors import PlaygroundError

CACHE_MODES = ("none", "prefix", "dual")


def cache_param() -> Choice:
    """The ``cache`` knob of the block decoders."""
    return Choice("none", CACHE_MODES,
                  "Fast-dLLM's block KV cache, approximate (changes the logits): prefix = reuse the prompt's "
                  "and earlier blocks' keys/values during a block, dual = also the later blocks'; refreshed "
                  "at every block start; ModernBERT, BERT and RoBERTa models only")


@dataclass
class LayerKV:
    """One layer's cached keys (rotary applied) and values, (B, heads, T, head_dim)."""

    keys: torch.Tensor
    values: torch.Tensor


@dataclass
class ModernBertBlockForward:
    """A ModernBERT masked LM run layer by layer, with keys/values kept between calls.

    :meth:`full` runs the whole canvas and keeps each layer's keys and values;
    :meth:`partial` runs only positions ``[lo, hi)`` through the layers, attending to the
    kept keys/values everywhere outside ``[lo, hi)`` and to fresh ones inside. Neither
    touches the model's counters: :class:`BlockCache` counts its calls.
    """

    model: ModernBertForMaskedLM
    kv: list[LayerKV] = field(default_factory=list)

    def __post_init__(self) -> None:
        cfg = self.model.config
        self.heads = int(cfg.num_attention_heads)
        self.head_dim = int(cfg.hidden_size) // self.heads
        # config.sliding_window is the half window: a sliding layer sees |i - j| <= it
        self.half_window = int(cfg.sliding_window)
        self.layer_types = list(cfg.layer_types)

    def _rotary(self, like: torch.Tensor, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        rot = self.model.model.rotary_emb
        pos = positions.unsqueeze(0)
        return {t: rot(like, pos, t) for t in set(self.layer_types)}

    def _layer(self, i: int, h: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
               rope: tuple[torch.Tensor, torch.Tensor], lo: int, hi: int,
               keep: bool) -> torch.Tensor:
        """Layer ``i`` on the hidden states ``h`` of positions ``q_pos`` = ``[lo, hi)``."""
        layer = self.model.model.layers[i]
        attn = layer.attn
        b, n, _ = h.shape
        qkv = attn.Wqkv(layer.attn_norm(h)).view(b, n, 3, self.heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))
        cos, sin = rope
        q, k = _apply_rotary(q, k, cos[:, lo:hi], sin[:, lo:hi])
        keys, values = _keys_values(self.kv, i, k, v, lo, hi, keep)
        mask = None
        if self.layer_types[i] == "sliding_attention":
            mask = (q_pos[:, None] - k_pos[None, :]).abs() <= self.half_window
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.head_dim ** -0.5)
        out = out.transpose(1, 2).reshape(b, n, -1)
        h = h + attn.out_drop(attn.Wo(out))
        return h + layer.mlp(layer.mlp_norm(h))

    def _run(self, ids: torch.Tensor, lo: int, hi: int, keep: bool) -> torch.Tensor:
        m = self.model
        t = ids.shape[1]
        positions = torch.arange(t, device=ids.device)
        h = m.model.embeddings(input_ids=ids[:, lo:hi])
        rope = self._rotary(h, positions)
        if keep:
            self.kv = []
        for i in range(len(m.model.layers)):
            h = self._layer(i, h, positions[lo:hi], positions, rope[self.layer_types[i]], lo, hi, keep)
        return m.decoder(m.head(m.model.final_norm(h)))

    def full(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the whole canvas ``ids`` (B, T); keeps every layer's keys/values."""
        return self._run(ids, 0, ids.shape[1], keep=True)

    def partial(self, ids: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Logits (B, hi - lo, V) of positions ``[lo, hi)`` of ``ids``, computed fresh through
        every layer against the kept keys/values outside ``[lo, hi)``."""
        if not self.kv:
            raise RuntimeError("partial forward before any full forward")
        return self._run(ids, lo, hi, keep=False)


def _keys_values(kv: list[LayerKV], i: int, k: torch.Tensor, v: torch.Tensor, lo: int, hi: int,
                 keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i``'s keys and values over the whole canvas: the fresh ``k``/``v`` of positions
    ``[lo, hi)`` between the cached ones; a full forward (``keep``) stores them instead."""
    if keep:
        kv.append(LayerKV(k, v))
        return k, v
    cached = kv[i]
    return (torch.cat([cached.keys[:, :, :lo], k, cached.keys[:, :, hi:]], dim=2),
            torch.cat([cached.values[:, :, :lo], v, cached.values[:, :, hi:]], dim=2))


@dataclass
class BertBlockForward:
    """A BERT or RoBERTa masked LM run layer by layer, with keys/values kept between calls
    (the interface of :class:`ModernBertBlockForward`).

    Positions enter only through the embeddings (learned, absolute), which are computed for
    the whole canvas and sliced, so RoBERTa's padding-aware position ids stay the model's own.
    Each post-norm layer: query/key/value, attention over every position, output projection,
    residual and norm, then the feed-forward with its residual and norm.
    """

    model: BertForMaskedLM | RobertaForMaskedLM
    kv: list[LayerKV] = field(default_factory=list)

    def __post_init__(self) -> None:
        cfg = self.model.config
        self.heads = int(cfg.num_attention_heads)
        self.head_dim = int(cfg.hidden_size) // self.heads
        self.base = self.model.base_model
        self.head = self.model.cls if isinstance(self.model, BertForMaskedLM) else self.model.lm_head

    def _run(self, ids: torch.Tensor, lo: int, hi: int, keep: bool) -> torch.Tensor:
        h = self.base.embeddings(input_ids=ids)[:, lo:hi]
        if keep:
            self.kv = []
        for i, layer in enumerate(self.base.encoder.layer):
            att = layer.attention.self
            b, n, _ = h.shape
            q, k, v = (proj(h).view(b, n, self.heads, self.head_dim).transpose(1, 2)
                       for proj in (att.query, att.key, att.value))
            keys, values = _keys_values(self.kv, i, k, v, lo, hi, keep)
            out = F.scaled_dot_product_attention(q, keys, values, scale=att.scaling)
            h = layer.attention.output(out.transpose(1, 2).reshape(b, n, -1), h)
            h = layer.output(layer.intermediate(h), h)
        return self.head(h)

    def full(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the whole canvas ``ids`` (B, T); keeps every layer's keys/values."""
        return self._run(ids, 0, ids.shape[1], keep=True)

    def partial(self, ids: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Logits (B, hi - lo, V) of positions ``[lo, hi)``, fresh against the kept keys/values."""
        if not self.kv:
            raise RuntimeError("partial forward before any full forward")
        return self._run(ids, lo, hi, keep=False)


BlockForward = ModernBertBlockForward | BertBlockForward


def block_forward(model: Any) -> BlockForward | None:
    """The layer-by-layer runner for ``model``, or None where the cache does not support it."""
    if isinstance(model, ModernBertForMaskedLM):
        return ModernBertBlockForward(model)
    if isinstance(model, (BertForMaskedLM, RobertaForMaskedLM)) and not model.config.is_decoder:
        return BertBlockForward(model)
    return None


def _apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of (B, H, N, D) queries and keys with (B, N, D) cos/sin (in float32)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    qf, kf = q.float(), k.float()
    return ((qf * cos + _rotate_half(qf) * sin).to(q.dtype),
            (kf * cos + _rotate_half(kf) * sin).to(k.dtype))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The second half of the last dimension negated, then the first half (rotary's pairing)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def supports_cache(view: Any) -> bool:
    """Whether the block KV cache can run on this model (a ModernBERT, BERT or RoBERTa masked
    LM whose logits are not shifted)."""
    return block_forward(getattr(view, "model", None)) is not None and not getattr(view, "logits_shifted", False)


class BlockCache:
    """Fast-dLLM's prefix or dual cache over one run's canvas (see the module docstring).

    :meth:`logits` replaces :func:`decoders.diffusion._canvas.gen_logits` in the sampler: at a
    block's first step it runs the full canvas and refreshes the cache; at its other steps it
    runs the block (dual) or the block and the suffix (prefix) only. Each call is counted on
    the model view as one forward pass over the positions it ran.
    """

    def __init__(self, view: Any, mode: str) -> None:
        if mode not in ("prefix", "dual"):
            raise PlaygroundError(f"cache {mode!r} is not one of: prefix, dual")
        if not supports_cache(view):
            raise PlaygroundError(f"cache={mode} needs a ModernBERT, BERT or RoBERTa masked LM; model "
                                  f"{getattr(view, 'name', '?')!r} is not one (use cache none)")
        self.view, self.mode = view, mode
        self.runner = block_forward(view.model)
        self.stale: torch.Tensor | None = None  # logits of the last full forward, (B, T, V)
        self.refresh_step = -1

    def _count(self, tokens: int) -> None:
        # the view counts what passes through ModelView.forward; a cached call bypasses it
        handle = getattr(self.view, "handle", None)
        for counter in (self.view, handle) if handle is not None and handle is not self.view else (self.view,):
            counter.forwards += 1
            counter.tokens += int(tokens)

    def logits(self, canvas: torch.Tensor, lay: Layout, block: tuple[int, int], refresh: bool,
               step: int, cfg_scale: float = 0.0) -> tuple[torch.Tensor, dict[str, Any]]:
        """Logits of the generated part (gen_length, V), float32 on CPU, and the step's
        ``cache`` evidence: ``mode``, ``refreshed`` (this step ran the full canvas),
        ``refresh_step`` (the step whose full forward the cache holds), ``fresh`` (the
        generated positions ``[start, end)`` computed through the layers this step) and
        ``cached_positions`` (canvas positions, prompt included, read from the cache).

        With ``cfg_scale`` > 0 the canvas is paired with its prompt-masked copy (LLaDA's
        guidance), each with its own cached keys/values, as :func:`gen_logits` pairs them.
        """
        p0, g = lay.prompt_len, lay.gen_length
        x = canvas.unsqueeze(0)
        if cfg_scale > 0:
            un = x.clone()
            un[:, :p0] = lay.mask_id
            x = torch.cat([x, un], 0)
        handle = getattr(self.view, "handle", self.view)
        x = x.to(handle.device)
        t = x.shape[1]
        with handle.lock, torch.inference_mode():
            if refresh or self.stale is None:
                out = self.runner.full(x).float().cpu()
                self.stale, self.refresh_step = out, step
                lo, hi = 0, t
            else:
                lo, hi = p0 + block[0], t if self.mode == "prefix" else p0 + block[1]
                out = self.stale.clone()
                out[:, lo:hi] = self.runner.partial(x, lo, hi).float().cpu()
        self._count(x.shape[0] * (hi - lo))
        logits = out[:, p0:]
        if cfg_scale > 0:
            cond, uncond = logits[:1], logits[1:]
            logits = uncond + (cfg_scale + 1.0) * (cond - uncond)
        ev = {"mode": self.mode, "refreshed": lo == 0 and hi == t, "refresh_step": self.refresh_step,
              "fresh": [max(lo - p0, 0), hi - p0], "cached_positions": t - (hi - lo)}
        return logits[0], ev


def make_cache(view: Any, mode: str) -> BlockCache | None:
    """The run's block cache for the knob value ``mode`` (None for ``none``); one line of error
    for a model the cache does not support."""
    return None if mode == "none" else BlockCache(view, mode)
