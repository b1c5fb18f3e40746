"""Model handles: the only place in the project that calls ``model(...)``.

A :class:`ModelHandle` owns one loaded model with its tokenizer, kind and placement; each run
gets a :class:`ModelView` of it (``handle.view()``) that counts every forward pass and every
token processed, so the forward-pass numbers in a trace are measured, never reported by a
decoder.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from playground.core.errors import PlaygroundError
from playground.core.models.chat import SYSTEM_NEEDS_CHAT, chat_ids, has_chat_template
from playground.core.models.kinds import KINDS, detect_kind


@dataclass
class Forward:
    """What one forward pass returns: float32 logits (B, T, V), the cache, hidden states."""

    logits: torch.Tensor
    cache: Any = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class ModelHandle:
    """One loaded model with its tokenizer, kind and placement.

    Attributes a decoder may read: ``kind``, ``tokenizer``, ``vocab_size``,
    ``context_length``, ``eos_ids``, ``mask_token_id`` and ``logits_shifted`` (diffusion),
    ``device``, ``dtype``, ``config``, ``num_layers``.
    """

    def __init__(self, name: str, model: torch.nn.Module, tokenizer: Any, kind: str,
                 source: str = "path", mask_token_id: int | None = None,
                 logits_shifted: bool = False) -> None:
        if kind not in KINDS:
            raise PlaygroundError(f"unknown model kind {kind!r}; expected one of {', '.join(KINDS)}")
        self.name, self.model, self.tokenizer, self.kind, self.source = name, model, tokenizer, kind, source
        self.config = model.config
        self.mask_token_id = mask_token_id
        self.logits_shifted = logits_shifted
        self.lock = threading.RLock()
        self.forwards = 0
        self.tokens = 0
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.vocab_size = int(out_emb.weight.shape[0]) if out_emb is not None else int(self.config.vocab_size)
        self.context_length = context_length(self.config, tokenizer)
        # an instruct model often ends its turn with a token only its generation config names
        # (Gemma's <end_of_turn>, Llama 3's <|eot_id|>): chat-mode replies must stop there
        self.eos_ids = eos_ids(self.config, tokenizer) | eos_ids(getattr(model, "generation_config", None), None)
        self.num_layers = int(getattr(self.config, "num_hidden_layers", 0) or 0)

    # ------------------------------------------------------------------ views & counting
    def view(self) -> "ModelView":
        """A per-run view of this model that counts its own forward passes."""
        return ModelView(self)

    def forward(self, ids: torch.Tensor | Sequence[int], cache: Any = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                hidden_states: bool = False, use_cache: bool | None = None,
                num_layers: int | None = None, embeds: torch.Tensor | None = None) -> Forward:
        """Run the model on ``ids`` (1-D or (B, T)); return float32 logits and the cache.

        For a diffusion model whose logits are shifted by one position (Dream), the logits
        are shifted back so that ``logits[:, i]`` always scores the token at position ``i``.
        ``num_layers=k`` runs an *early exit*: only the first k decoder layers, then the
        model's own final norm and LM head (self-speculative drafts such as layer_skip); a
        cache passed along gets entries in those k layers only. A view counts such a call
        as a draft forward.
        ``embeds`` (B, T, H) feeds input embeddings instead of ``ids`` (which is then ignored):
        a superposition of token embeddings (``superposed``) is one position of the cache.
        Prefer calling this through a :class:`ModelView`, which counts the call.
        """
        kwargs: dict[str, Any] = {}
        if embeds is not None:
            kwargs["inputs_embeds"] = embeds.to(self.device, self.dtype)
        else:
            kwargs["input_ids"] = as_batch(ids, self.device)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(self.device)
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(self.device)
        if hidden_states:
            kwargs["output_hidden_states"] = True
        if self.kind == "causal":
            kwargs["use_cache"] = True if use_cache is None else use_cache
            if cache is not None:
                kwargs["cache"] = cache
        with self.lock, torch.inference_mode(), self._first_layers(num_layers):
            out = self.model(**kwargs)
            self.forwards += 1
            fed = embeds.shape[:2] if embeds is not None else kwargs["input_ids"].shape
            self.tokens += int(fed[0] * fed[1])
        logits = out.logits.float()
        if self.logits_shifted:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return Forward(logits=logits, cache=getattr(out, "cache", None) if self.kind == "causal" else None,
                       hidden_states=getattr(out, "hidden_states", None))

    @contextlib.contextmanager
    def _first_layers(self, k: int | None) -> Iterator[None]:
        """While active, the model's decoder-layer list holds only its first ``k`` layers."""
        if k is None or k >= self.num_layers:
            yield
            return
        if k < 1:
            raise PlaygroundError(f"an early exit needs at least 1 layer, got {k}")
        owner, attr = self._layer_list()
        full = getattr(owner, attr)
        setattr(owner, attr, torch.nn.ModuleList(list(full)[:k]))
        try:
            yield
        finally:
            setattr(owner, attr, full)

    def _layer_list(self) -> tuple[torch.nn.Module, str]:
        """The module holding the decoder layers as a ModuleList, and its attribute name."""
        for name, mod in self.model.named_modules():
            for attr, child in mod.named_children():
                if isinstance(child, torch.nn.ModuleList) and len(child) == self.num_layers:
                    return mod, attr
        raise PlaygroundError(f"model {self.name!r}: cannot find its decoder layers for an early exit")

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project hidden states through the final norm and LM head (early-exit drafts, the
        logit lens); float32 logits. Not a forward pass: nothing is counted."""
        with self.lock, torch.inference_mode():
            norm = self.final_norm()
            head = self.model.get_output_embeddings()
            h = hidden.to(head.weight.device)
            h = norm(h.to(next(norm.parameters(), h).device)).to(head.weight.device) if norm is not None else h
            return head(h).float()

    def final_norm(self) -> torch.nn.Module | None:
        """The norm the model applies before its LM head (None if it has none we know of).

        Found by the names transformers uses: ``norm`` (Llama, Mistral, Qwen, ...), ``ln_f``
        (GPT-2, GPT-J, Bloom), ``final_layer_norm`` (GPT-NeoX; OPT under ``decoder``),
        ``norm_f``/``final_norm``; on the base model, so GPT-2's ``transformer`` counts too.
        """
        base = getattr(self.model, "base_model", None) or self.model
        for owner in (base, getattr(base, "decoder", None)):
            for attr in ("norm", "ln_f", "final_layer_norm", "norm_f", "final_norm"):
                mod = getattr(owner, attr, None) if owner is not None else None
                if isinstance(mod, torch.nn.Module):
                    return mod
        return None

    # ------------------------------------------------------------------ caches
    def new_cache(self) -> Any:
        """An empty KV cache for this model (roll back with :func:`crop_cache`)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    # ------------------------------------------------------------------ text
    @functools.cached_property
    def vocab(self) -> dict[str, int]:
        """The tokenizer's token-string -> id table, read once (a model's tokenizer does not
        change; comparing a draft's with its target's table on every run cost ~10 ms)."""
        return dict(self.tokenizer.get_vocab())

    @property
    def has_chat_template(self) -> bool:
        """Whether this model's tokenizer has a chat template (chat mode is possible)."""
        return has_chat_template(self.tokenizer)

    def encode(self, text: str, chat: bool = False, system_prompt: str | None = None) -> list[int]:
        """Token ids of ``text``; with ``chat`` it is a user turn in the tokenizer's chat template,
        after a system turn holding ``system_prompt`` when one is given."""
        if chat:
            return chat_ids(self.tokenizer, self.name, text, system_prompt)
        if system_prompt and system_prompt.strip():
            raise PlaygroundError(SYSTEM_NEEDS_CHAT)
        return [int(x) for x in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (special tokens such as the mask are kept visible)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def token_text(self, ids: Iterable[int]) -> list[str]:
        """The display text of each token on its own (may be partial characters)."""
        return [self.decode([i]) for i in ids]


class ModelView:
    """A per-run window on a :class:`ModelHandle` that counts forwards and tokens.

    Everything but ``forward``/``lm_head`` is delegated to the handle, so a decoder reads
    ``view.tokenizer``, ``view.kind`` and so on as if it held the handle.
    """

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle
        self.forwards = 0
        self.tokens = 0
        # early exits (forward(num_layers=k < all)) are self-speculative drafts: counted apart
        self.draft_forwards = 0
        self.draft_tokens = 0
        # tokens x layers run by early exits: what they cost in the race's cost model
        self.draft_layer_tokens = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def forward(self, ids: torch.Tensor | Sequence[int], cache: Any = None, **kw: Any) -> Forward:
        """Counted forward pass (see :meth:`ModelHandle.forward`); an early exit
        (``num_layers`` below the model's depth) counts in ``draft_forwards``/``draft_tokens``."""
        out = self.handle.forward(ids, cache=cache, **kw)
        if kw.get("embeds") is not None:
            n = int(kw["embeds"].shape[0] * kw["embeds"].shape[1])
        else:
            n = int(ids.numel()) if torch.is_tensor(ids) else token_count(ids)
        k = kw.get("num_layers")
        if k is not None and k < self.handle.num_layers:
            self.draft_forwards += 1
            self.draft_tokens += n
            self.draft_layer_tokens += n * int(k)
        else:
            self.forwards += 1
            self.tokens += n
        return out


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions of a KV cache (transformers 5: ``crop(-n)`` drops the last n)."""
    n = cache.get_seq_length() - int(length)
    if n > 0:
        cache.crop(-n)


def handle_from_model(model: torch.nn.Module, tokenizer: Any, name: str = "custom",
                      kind: str | None = None, mask_token_id: int | None = None,
                      logits_shifted: bool = False) -> ModelHandle:
    """Wrap an already-built model (tests build tiny random ones) in a handle."""
    kind = kind or detect_kind(model.config)
    if kind == "diffusion" and mask_token_id is None:
        mask_token_id = getattr(tokenizer, "mask_token_id", None)
    return ModelHandle(name, model.eval(), tokenizer, kind, source="memory",
                       mask_token_id=mask_token_id, logits_shifted=logits_shifted)


def token_count(ids: Sequence[int] | Sequence[Sequence[int]]) -> int:
    """How many token ids a 1-D or (B, T) sequence holds (without building a tensor)."""
    ids = list(ids)
    nested = bool(ids) and (isinstance(ids[0], (list, tuple)) or (torch.is_tensor(ids[0]) and ids[0].dim() > 0))
    return sum(len(row) for row in ids) if nested else len(ids)


def as_batch(ids: torch.Tensor | Sequence[int], device: Any) -> torch.Tensor:
    """``ids`` as a (B, T) long tensor on ``device`` (a 1-D sequence becomes one row)."""
    t = ids if torch.is_tensor(ids) else torch.tensor(list(ids), dtype=torch.long)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    return t.to(device)


def context_length(config: Any, tokenizer: Any) -> int:
    """The longest sequence the model takes, from its config (else its tokenizer, else 2048)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    v = getattr(tokenizer, "model_max_length", None)
    return int(v) if isinstance(v, int) and 0 < v < 10**7 else 2048


def eos_ids(config: Any, tokenizer: Any) -> set[int]:
    """Every end-of-sequence id the config or the tokenizer names."""
    ids: set[int] = set()
    for v in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return ids
