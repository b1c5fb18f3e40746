"""What a model's config says about it, without loading weights (the page's status line)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import playground.core.models.cache as cache
from playground.core.models.handle import context_length
from playground.core.models.kinds import REMOTE_CODE_TYPES, detect_kind
from playground.core.models.loading import read_config
from playground.core.models.sources import allowed, local_dir


def model_info(spec: str, trust_remote_code: bool = False) -> dict[str, Any]:
    """What the config says about ``spec``, without loading weights (for a status line).

    Keys: ``name``, ``source``, ``kind``, ``model_type``, ``context_length`` (from the config),
    ``num_layers``, ``vocab_size``, ``parameters`` (exact from local safetensors headers, else an
    estimate from the config's sizes, or None), ``parameters_exact``, ``loaded`` (already in
    the cache), ``remote_code`` (the model needs its repository's own code) and
    ``chat_template`` (True/False from local tokenizer files, None when they are not on this
    machine). A hub id is probed as by :func:`load_model` and fails the same way.
    """
    source, location = allowed(spec, trust_remote_code)
    config = read_config(spec, source, location, trust_remote_code)
    folder = local_dir(source, location)
    exact = _safetensors_parameters(folder)
    mtype = (getattr(config, "model_type", "") or "").lower()
    return {
        "name": Path(location).name if source == "bundled" else spec.strip(),
        "source": source,
        "kind": detect_kind(config),
        "model_type": getattr(config, "model_type", None),
        "context_length": context_length(config, None),
        "num_layers": int(getattr(_text_config(config), "num_hidden_layers", 0) or 0),
        "vocab_size": getattr(_text_config(config), "vocab_size", None),
        "parameters": exact if exact is not None else _estimate_parameters(config),
        "parameters_exact": exact is not None,
        "loaded": cache.is_loaded(location),
        "remote_code": bool(getattr(config, "auto_map", None)) or any(t in mtype for t in REMOTE_CODE_TYPES),
        "chat_template": local_chat_template(folder),
    }


def local_chat_template(folder: Path | None) -> bool | None:
    """Whether the tokenizer files in ``folder`` carry a chat template (None: not on this machine).

    transformers 5 writes the template to ``chat_template.jinja``; older checkpoints keep it
    in ``tokenizer_config.json`` (or ``chat_template.json``).
    """
    if folder is None:
        return None
    if (folder / "chat_template.jinja").exists() or (folder / "chat_template.json").exists():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _safetensors_parameters(folder: Path | None) -> int | None:
    """Parameter count from the safetensors headers in ``folder`` (None unless all are there)."""
    if folder is None:
        return None
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    try:
        if index.exists():
            names = set(json.loads(index.read_text())["weight_map"].values())
            if not all((folder / n).exists() for n in names):
                return None  # a partly downloaded sharded checkpoint
        total = 0
        for f in files:
            with open(f, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(size))
            total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return total or None


def _estimate_parameters(config: Any) -> int | None:
    """A dense-transformer estimate from the config's sizes (embeddings, attention, MLP)."""
    c = _text_config(config)

    def first(*names: str) -> int:
        for n in names:
            v = getattr(c, n, None)
            if isinstance(v, int) and v > 0:
                return v
        return 0

    h, layers, vocab = first("hidden_size", "n_embd", "d_model"), first("num_hidden_layers", "n_layer"), first("vocab_size")
    if not (h and layers and vocab):
        return None
    heads = first("num_attention_heads", "n_head") or 1
    kv = first("num_key_value_heads") or heads
    head_dim = first("head_dim") or h // heads
    inner = first("intermediate_size", "n_inner") or 4 * h
    gated = str(getattr(c, "hidden_act", "")).lower() in ("silu", "swish", "swiglu")
    attn = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    mlp = (3 if gated else 2) * h * inner
    tied = bool(getattr(c, "tie_word_embeddings", getattr(config, "tie_word_embeddings", True)))
    return layers * (attn + mlp) + vocab * h * (1 if tied else 2)
