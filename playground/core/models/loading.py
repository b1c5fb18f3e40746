"""Loading a model: config first (kind check, hub probe), then tokenizer and weights.

:func:`load_model` resolves a spec, checks it against this instance's limits, reads the
config (no weights) and loads tokenizer and weights with the right Auto class for its kind,
placed by device/dtype, ``device_map="auto"`` or bitsandbytes 4/8-bit. Loads of the same
model share one future (:mod:`playground.core.models.cache`); all weight loading is serialised by
``_weights_lock`` (see :mod:`playground.core.models._imports` for why).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import threading
from pathlib import Path
from typing import Any

import torch

from playground.core.errors import PlaygroundError
import playground.core.models.cache as cache
from playground.core.models._imports import _import, _import_lock, _weights_lock
from playground.core.models.handle import ModelHandle
from playground.core.models.hub import check_hub, first_line
from playground.core.models.kinds import KINDS, REMOTE_CODE_TYPES, detect_kind, diffusion_meta
from playground.core.models.sources import REMOTE_CODE_OFF, allowed
from playground.core.settings import limits


def load_model(spec: str, kind: str | None = None, device: str = "auto", dtype: str = "auto",
               quantization: str | None = None, device_map: str | None = None,
               trust_remote_code: bool = False, cancel: threading.Event | None = None) -> ModelHandle:
    """Load (or fetch from the LRU) the model named by ``spec``.

    ``kind`` checks or forces ``causal``/``diffusion``; ``device`` is auto/cpu/cuda/mps;
    ``dtype`` auto/float32/bfloat16/float16; ``quantization`` None/4bit/8bit (CUDA only);
    ``device_map="auto"`` spreads a large model over devices with accelerate;
    ``trust_remote_code`` runs the model repository's own code and stays off unless asked
    (and is refused where the host disallows it, see :func:`playground.hosting.remote_code_allowed`).
    Safe from any number of threads: one load per model at a time, one object per model.
    ``cancel`` (the Stop button's event) ends the *wait* with :class:`Cancelled`; the load
    itself finishes in the background and fills the cache.
    Raises :class:`PlaygroundError` with one line for every way this can fail.
    """
    source, location = allowed(spec, trust_remote_code)
    if kind is not None and kind not in KINDS:
        raise PlaygroundError(f"unknown model kind {kind!r}; expected causal or diffusion")
    placement = (location, device, dtype, quantization, device_map)
    # An opt-in to remote code changes nothing for a model without code of its own, which is
    # therefore cached once, under "not trusted", whichever way it was asked for.
    handle = cache.cached(placement + (trust_remote_code,)) or (
        cache.cached(placement + (False,)) if trust_remote_code else None)
    if handle is None:
        # The kind is checked from the config, before any weights are read; a hub id is
        # probed here with a short timeout, outside the weights lock, so it delays no one else.
        config = read_config(spec, source, location, trust_remote_code)
        check_kind(spec, detect_kind(config), kind)
        trust = trust_remote_code and bool(getattr(config, "auto_map", None))
        job = functools.partial(_load, spec, source, location, config, device, dtype, quantization,
                                device_map, trust)
        handle = cache.wait(cache.join_or_start(placement + (trust,), spec, job), spec, cancel)
    check_kind(spec, handle.kind, kind)
    return handle


def check_kind(spec: str, found: str, wanted: str | None) -> None:
    """Refuse a model of the wrong kind for the decoder that asked for it."""
    if wanted is not None and found != wanted:
        raise PlaygroundError(f"model {spec!r} is a {found} model, but a {wanted} model is needed here")


def read_config(spec: str, source: str, location: str, trust_remote_code: bool) -> Any:
    """The model's config (no weights); a hub id is first probed with a short timeout."""
    if source == "hub":
        check_hub(spec)
    try:
        (AutoConfig,) = _import("transformers", "AutoConfig")
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if source != "hub":
            kwargs["local_files_only"] = True
        # Remote config code is written into and imported from a shared modules folder; a local
        # config's first read imports its model family's module lazily, so it waits for imports.
        # A hub read waits for neither: a slow hub must not hold up other lanes.
        guard = (_weights_lock if trust_remote_code else
                 _import_lock if source != "hub" else contextlib.nullcontext())
        with guard:
            return AutoConfig.from_pretrained(location, **kwargs)
    except PlaygroundError:
        raise
    except Exception as e:  # noqa: BLE001 - every loader failure becomes one line
        raise PlaygroundError(_load_failure(spec, source, e, trust_remote_code)) from None


def remote_code_needed(spec: str) -> str:
    """The one line for a model that needs its own code when it was not opted in."""
    if not limits().allow_remote_code:
        return f"model {spec!r} needs its own code (trust_remote_code), and {REMOTE_CODE_OFF}"
    return (f"model {spec!r} needs its own code: opt in to remote code (trust_remote_code; "
            f"`--trust-remote-code` on the command line) if you trust its repository")


def _load(spec: str, source: str, location: str, config: Any, device: str, dtype: str,
          quantization: str | None, device_map: str | None, trust_remote_code: bool) -> ModelHandle:
    """Tokenizer and weights of one model: every failure, imports included, is one line."""
    try:
        return _load_unguarded(spec, source, location, config, device, dtype, quantization, device_map,
                               trust_remote_code)
    except PlaygroundError:
        raise
    except torch.cuda.OutOfMemoryError:
        raise PlaygroundError(f"model {spec!r} does not fit in GPU memory; try 4bit/8bit or device_map=auto") from None
    except Exception as e:  # noqa: BLE001
        raise PlaygroundError(_load_failure(spec, source, e, trust_remote_code)) from None


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PlaygroundError("device 'cuda' asked for, but no CUDA GPU is available")
    return torch.device(device)


def _pick_dtype(dtype: str, dev: torch.device) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dtype not in table:
        raise PlaygroundError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return table[dtype]


def _load_unguarded(spec: str, source: str, location: str, config: Any, device: str, dtype: str,
                    quantization: str | None, device_map: str | None, trust_remote_code: bool) -> ModelHandle:
    AutoTokenizer, hf_logging = _import("transformers", "AutoTokenizer", "logging")
    hf_logging.disable_progress_bar()  # loading bars would break the one-line error contract

    common: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if source != "hub":
        common["local_files_only"] = True
    found = detect_kind(config)
    dev = _pick_device(device)
    torch_dtype = _pick_dtype(dtype, dev)
    kwargs: dict[str, Any] = dict(common, config=config, dtype=torch_dtype)
    if quantization:
        if quantization not in ("4bit", "8bit"):
            raise PlaygroundError(f"unknown quantization {quantization!r}; use 4bit or 8bit")
        if not torch.cuda.is_available():
            raise PlaygroundError(f"{quantization} quantization needs a CUDA GPU (bitsandbytes); none is available")
        (BitsAndBytesConfig,) = _import("transformers", "BitsAndBytesConfig")
        kwargs["quantization_config"] = (
            BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch_dtype,
                               bnb_4bit_quant_type="nf4")
            if quantization == "4bit" else BitsAndBytesConfig(load_in_8bit=True))
        kwargs["device_map"] = device_map or {"": dev.index or 0}
    elif device_map:
        kwargs["device_map"] = device_map
    auto = _auto_class(config, found, trust_remote_code)
    with _weights_lock:
        tokenizer = AutoTokenizer.from_pretrained(location, **common)
        model = auto.from_pretrained(location, **kwargs)
    _check_materialised(spec, model)
    if "device_map" not in kwargs:
        try:
            model.to(dev)
        except torch.cuda.OutOfMemoryError:
            raise PlaygroundError(f"model {spec!r} does not fit on {dev}; try 4bit/8bit or device_map=auto") from None
    model.eval()
    mask_id = None
    shifted = False
    if found == "diffusion":
        mask_id, shifted = diffusion_meta(config, tokenizer)
        if mask_id is None:
            raise PlaygroundError(f"diffusion model {spec!r} has no mask token")
    name = Path(location).name if source == "bundled" else spec
    return ModelHandle(name, model, tokenizer, found, source=source, mask_token_id=mask_id,
                       logits_shifted=shifted)


def _check_materialised(spec: str, model: torch.nn.Module) -> None:
    """Refuse a model with a weight or buffer still on the meta device (no data behind it)."""
    left = [n for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
            if t.device.type == "meta"]
    if left:
        raise PlaygroundError(f"model {spec!r} loaded incompletely: {len(left)} weight(s) left on the meta "
                              f"device (first: {left[0]}); its files may be incomplete")


def _auto_class(config: Any, kind: str, trust_remote_code: bool) -> Any:
    AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM = _import(
        "transformers", "AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM")

    if kind == "causal":
        return AutoModelForCausalLM
    mtype = (getattr(config, "model_type", "") or "").lower()
    if any(t in mtype for t in REMOTE_CODE_TYPES):
        if not trust_remote_code:
            raise PlaygroundError(remote_code_needed(getattr(config, "_name_or_path", "") or mtype))
        return AutoModel
    return AutoModelForMaskedLM


_ASKS_REMOTE_CODE = re.compile(r"trust_remote_code|custom code", re.I)


def _load_failure(spec: str, source: str, e: BaseException, trust_remote_code: bool = False) -> str:
    msg = first_line(e)
    if not trust_remote_code and _ASKS_REMOTE_CODE.search(str(e)):
        # transformers' own message is several lines of advice about a keyword argument
        return remote_code_needed(spec)
    if source == "hub":
        return f"could not load {spec!r} from the Hugging Face hub: {msg}"
    return f"could not load model {spec!r}: {msg}"
