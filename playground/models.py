"""Model handles: the only place in the project that calls ``model(...)``.

:func:`load_model` resolves a model spec (a bundled name, a local directory, a Hugging Face
cache entry, or a hub id), loads it with the right Auto class for its kind (``causal`` or
``diffusion``), places it (device and dtype auto, ``device_map="auto"``, bitsandbytes
4/8-bit) and keeps a small LRU of loaded models.

A :class:`ModelHandle` owns the loaded model; each run gets a :class:`ModelView` of it
(``handle.view()``) that counts every forward pass and every token processed, so the
forward-pass numbers in a trace are measured, never reported by a decoder.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import json
import math
import os
import threading
from collections import OrderedDict
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from playground.errors import Cancelled, PlaygroundError
from playground.settings import limits

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUNDLED_DIR = ASSETS / "models"
BUNDLED = ("tiny-shakespeare", "tiny-shakespeare-draft", "tiny-shakespeare-diffusion")
KINDS = ("causal", "diffusion")
LLADA_MASK_ID = 126336
_LRU_SIZE = int(os.environ.get("PLAYGROUND_MODEL_CACHE", "4"))


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
        self.context_length = _context_length(self.config, tokenizer)
        self.eos_ids = _eos_ids(self.config, tokenizer)
        self.num_layers = int(getattr(self.config, "num_hidden_layers", 0) or 0)

    # ------------------------------------------------------------------ views & counting
    def view(self) -> "ModelView":
        """A per-run view of this model that counts its own forward passes."""
        return ModelView(self)

    def forward(self, ids: torch.Tensor | Sequence[int], cache: Any = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                hidden_states: bool = False, use_cache: bool | None = None,
                num_layers: int | None = None) -> Forward:
        """Run the model on ``ids`` (1-D or (B, T)); return float32 logits and the cache.

        For a diffusion model whose logits are shifted by one position (Dream), the logits
        are shifted back so that ``logits[:, i]`` always scores the token at position ``i``.
        ``num_layers=k`` runs an *early exit*: only the first k decoder layers, then the
        model's own final norm and LM head (self-speculative drafts such as layer_skip); a
        cache passed along gets entries in those k layers only. A view counts such a call
        as a draft forward.
        Prefer calling this through a :class:`ModelView`, which counts the call.
        """
        ids = _as_batch(ids, self.device)
        kwargs: dict[str, Any] = {}
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
            out = self.model(input_ids=ids, **kwargs)
            self.forwards += 1
            self.tokens += int(ids.numel())
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
    def encode(self, text: str, chat: bool = False) -> list[int]:
        """Token ids of ``text``; with ``chat`` the tokenizer's chat template is applied."""
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise PlaygroundError(f"model {self.name!r} has no chat template; run without chat mode")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(x) for x in ids]
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def forward(self, ids: torch.Tensor | Sequence[int], cache: Any = None, **kw: Any) -> Forward:
        """Counted forward pass (see :meth:`ModelHandle.forward`); an early exit
        (``num_layers`` below the model's depth) counts in ``draft_forwards``/``draft_tokens``."""
        out = self.handle.forward(ids, cache=cache, **kw)
        n = int(_as_batch(ids, "cpu").numel()) if not torch.is_tensor(ids) else int(ids.numel())
        k = kw.get("num_layers")
        if k is not None and k < self.handle.num_layers:
            self.draft_forwards += 1
            self.draft_tokens += n
        else:
            self.forwards += 1
            self.tokens += n
        return out


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions of a KV cache (transformers 5: ``crop(-n)`` drops the last n)."""
    n = cache.get_seq_length() - int(length)
    if n > 0:
        cache.crop(-n)


def _as_batch(ids: torch.Tensor | Sequence[int], device: Any) -> torch.Tensor:
    t = ids if torch.is_tensor(ids) else torch.tensor(list(ids), dtype=torch.long)
    if t.dim() == 1:
        t = t.unsqueeze(0)
    return t.to(device)


def _context_length(config: Any, tokenizer: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    v = getattr(tokenizer, "model_max_length", None)
    return int(v) if isinstance(v, int) and 0 < v < 10**7 else 2048


def _eos_ids(config: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for v in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return ids


# ---------------------------------------------------------------------- resolving & loading
def resolve(spec: str) -> tuple[str, str]:
    """Map a model spec to ``(source, location)``; source is bundled, path, cache or hub."""
    spec = (spec or "").strip()
    if not spec:
        raise PlaygroundError("no model given")
    if spec in BUNDLED:
        path = BUNDLED_DIR / spec
        if not (path / "config.json").exists():
            raise PlaygroundError(f"bundled model {spec!r} is missing from {path}; run `playground train-tiny`")
        return "bundled", str(path)
    p = Path(spec).expanduser()
    if p.exists() or spec.startswith((".", "/", "~")):
        if not p.is_dir() or not (p / "config.json").exists():
            raise PlaygroundError(f"model path {spec!r} does not exist or has no config.json")
        return "path", str(p.resolve())
    if _in_hf_cache(spec):
        return "cache", spec
    return "hub", spec


def _in_hf_cache(repo_id: str) -> bool:
    try:
        (try_to_load_from_cache,) = _import("huggingface_hub", "try_to_load_from_cache")
        hit = try_to_load_from_cache(repo_id, "config.json")
        return isinstance(hit, str)
    except Exception:
        return False


def list_cached_models() -> list[str]:
    """Hub ids of models found in the local Hugging Face cache (found offline)."""
    try:
        constants, scan_cache_dir = _import("huggingface_hub", "constants", "scan_cache_dir")
        info = scan_cache_dir(constants.HF_HUB_CACHE)  # read at call time: HF_HUB_CACHE may change
    except Exception:
        return []
    return sorted(r.repo_id for r in info.repos if r.repo_type == "model")


def list_models() -> list[dict[str, Any]]:
    """Every model the playground can load without a network: bundled and HF-cached."""
    out: list[dict[str, Any]] = []
    for name in BUNDLED:
        path = BUNDLED_DIR / name
        kind = "diffusion" if "diffusion" in name else "causal"
        out.append({"name": name, "source": "bundled", "kind": kind,
                    "available": (path / "config.json").exists(), "path": str(path)})
    for repo in list_cached_models():
        out.append({"name": repo, "source": "cache", "kind": None, "available": True, "path": None})
    return out


def detect_kind(config: Any) -> str:
    """``causal`` or ``diffusion`` from a config (explicit ``playground_kind`` wins)."""
    explicit = getattr(config, "playground_kind", None)
    if explicit in KINDS:
        return explicit
    mtype = (getattr(config, "model_type", "") or "").lower()
    archs = " ".join(getattr(config, "architectures", None) or []).lower()
    if "llada" in mtype or "dream" in mtype or "llada" in archs or "dream" in archs:
        return "diffusion"
    if "maskedlm" in archs or mtype in ("bert", "roberta", "modernbert", "distilbert", "xlm-roberta", "electra", "deberta-v2"):
        return "diffusion"
    return "causal"


# ---------------------------------------------------------------------- concurrency
# transformers' from_pretrained swaps process-wide state while it builds a model (torch.nn.init
# functions, PreTrainedModel.init_weights/tie_weights, torch's default dtype), saving and restoring
# the "originals" around each load. Two loads at once, of the same model or not, save each other's
# patched functions as originals and leave the process patched for good: every later load ends
# with weights on the meta device. So all weight loading takes one process-wide lock, while a
# cache hit never waits for it. Each model key has at most one load in flight (a Future that later
# callers wait on); the loading thread removes it from the table whether it succeeds or fails.
_cache: "OrderedDict[tuple, ModelHandle]" = OrderedDict()
_inflight: dict[tuple, Future] = {}
_cache_lock = threading.Lock()  # guards _cache and _inflight; held only for dict operations
_weights_lock = threading.Lock()  # one from_pretrained (tokenizer + weights) at a time, process-wide
# the first import of transformers/huggingface_hub is not thread-safe (their lazy modules raise
# "cannot import name 'AutoConfig'" in a thread that races the one initialising them)
_import_lock = threading.RLock()
_HUB_TIMEOUT = float(os.environ.get("PLAYGROUND_HUB_TIMEOUT", "5"))
_WAIT_POLL_S = 0.1


def _import(module: str, *names: str) -> tuple[Any, ...]:
    """``from module import *names``, serialised so lazy modules initialise in one thread."""
    with _import_lock:
        mod = importlib.import_module(module)
        return tuple(getattr(mod, n) for n in names)


def load_model(spec: str, kind: str | None = None, device: str = "auto", dtype: str = "auto",
               quantization: str | None = None, device_map: str | None = None,
               trust_remote_code: bool = False, cancel: threading.Event | None = None) -> ModelHandle:
    """Load (or fetch from the LRU) the model named by ``spec``.

    ``kind`` checks or forces ``causal``/``diffusion``; ``device`` is auto/cpu/cuda/mps;
    ``dtype`` auto/float32/bfloat16/float16; ``quantization`` None/4bit/8bit (CUDA only);
    ``device_map="auto"`` spreads a large model over devices with accelerate;
    ``trust_remote_code`` runs the model repository's own code and stays off unless asked.
    Safe from any number of threads: one load per model at a time, one object per model.
    ``cancel`` (the Stop button's event) ends the *wait* with :class:`Cancelled`; the load
    itself finishes in the background and fills the cache.
    Raises :class:`PlaygroundError` with one line for every way this can fail.
    """
    source, location = _allowed(spec, trust_remote_code)
    if kind is not None and kind not in KINDS:
        raise PlaygroundError(f"unknown model kind {kind!r}; expected causal or diffusion")
    key = (location, device, dtype, quantization, device_map, trust_remote_code)
    handle = _cached(key)
    if handle is None:
        # The kind is checked from the config, before any weights are read; a hub id is
        # probed here with a short timeout, outside the weights lock, so it delays no one else.
        config = _read_config(spec, source, location, trust_remote_code)
        _check_kind(spec, detect_kind(config), kind)
        job = functools.partial(_load, spec, source, location, config, device, dtype, quantization,
                                device_map, trust_remote_code)
        handle = _wait(_join_or_start(key, spec, job), spec, cancel)
    _check_kind(spec, handle.kind, kind)
    return handle


def _allowed(spec: str, trust_remote_code: bool) -> tuple[str, str]:
    """``resolve(spec)``, refused where this instance's limits forbid it."""
    lim = limits()
    if lim.no_models:
        raise PlaygroundError("model loading is disabled on this instance (replay only)")
    source, location = resolve(spec)
    if source not in lim.model_sources:
        raise PlaygroundError(f"loading {source} models is disabled on this instance "
                              f"(allowed: {', '.join(lim.model_sources) or 'none'})")
    if trust_remote_code and not lim.allow_remote_code:
        raise PlaygroundError("remote code is disabled on this instance")
    return source, location


def _check_kind(spec: str, found: str, wanted: str | None) -> None:
    if wanted is not None and found != wanted:
        raise PlaygroundError(f"model {spec!r} is a {found} model, but a {wanted} model is needed here")


def _cached(key: tuple) -> ModelHandle | None:
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
        return hit


def _join_or_start(key: tuple, spec: str, job: Callable[[], ModelHandle]) -> Future:
    """The future of the load of ``key``: the one in flight, or a new one started here."""
    with _cache_lock:
        fut = _inflight.get(key)
        if fut is not None:
            return fut
        fut = Future()
        hit = _cache.get(key)  # re-checked under the lock: a load may have finished meanwhile
        if hit is not None:
            fut.set_result(hit)
            return fut
        _inflight[key] = fut
    try:
        # a thread of its own, so that every caller (the first included) can stop waiting
        threading.Thread(target=_fill, args=(key, fut, job), name=f"load {spec}", daemon=True).start()
    except BaseException as e:  # noqa: BLE001 - e.g. no more threads: settle the future anyway
        _settle(key, fut, error=e)
    return fut


def _fill(key: tuple, fut: Future, job: Callable[[], ModelHandle]) -> None:
    try:
        handle = job()
    except BaseException as e:  # noqa: BLE001 - the future must settle, or waiters hang forever
        _settle(key, fut, error=e)
    else:
        _settle(key, fut, handle=handle)


def _settle(key: tuple, fut: Future, handle: ModelHandle | None = None,
            error: BaseException | None = None) -> None:
    """Publish a load's outcome: cache it (on success) and leave the in-flight table together."""
    with _cache_lock:
        if handle is not None:
            _cache[key] = handle
            _cache.move_to_end(key)
            while len(_cache) > max(1, _LRU_SIZE):
                _cache.popitem(last=False)
        if _inflight.get(key) is fut:
            del _inflight[key]
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(handle)


def _wait(fut: Future, spec: str, cancel: threading.Event | None) -> ModelHandle:
    while not fut.done():
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"loading {spec!r} was stopped")
        futures.wait([fut], timeout=None if cancel is None else _WAIT_POLL_S)
    try:
        return fut.result()
    except PlaygroundError as e:
        raise PlaygroundError(str(e)) from None  # each waiter gets its own exception object


def _read_config(spec: str, source: str, location: str, trust_remote_code: bool) -> Any:
    """The model's config (no weights); a hub id is first probed with a short timeout."""
    if source == "hub":
        _check_hub(spec)
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
        raise PlaygroundError(_load_failure(spec, source, e)) from None


def _check_hub(spec: str) -> None:
    """Fail in seconds, with one line, when the hub cannot serve ``spec``.

    Left to itself, huggingface_hub waits 10 s per request and retries with backoff, and
    transformers makes several requests: ~70 s on a network that drops packets. One HEAD of
    ``config.json`` with a short timeout and no retries tells the cases apart first.
    """
    try:
        constants, get_hf_file_metadata, hf_hub_url = _import(
            "huggingface_hub", "constants", "get_hf_file_metadata", "hf_hub_url")
        with _import_lock:
            errors = importlib.import_module("huggingface_hub.errors")
    except Exception as e:  # noqa: BLE001
        raise PlaygroundError(f"cannot use the Hugging Face hub for {spec!r}: {_first_line(e)}") from None
    if constants.HF_HUB_OFFLINE:
        raise PlaygroundError(f"could not load {spec!r}: it is not in the local Hugging Face cache, and hub access is "
                              f"off (HF_HUB_OFFLINE is set): download it first or unset HF_HUB_OFFLINE")
    try:
        _within(_HUB_TIMEOUT, lambda: get_hf_file_metadata(hf_hub_url(spec, "config.json"), timeout=_HUB_TIMEOUT))
    except errors.GatedRepoError:
        raise PlaygroundError(f"model {spec!r} is gated on the Hugging Face hub: accept its terms on its "
                              f"page and log in (`hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise PlaygroundError(f"no model {spec!r} on the Hugging Face hub (or it is private: log in "
                              f"with `hf auth login`)") from None
    except errors.EntryNotFoundError:
        raise PlaygroundError(f"{spec!r} on the Hugging Face hub has no config.json; is it a model?") from None
    except errors.HFValidationError:
        raise PlaygroundError(f"{spec!r} is not a bundled model, a local directory or a hub id "
                              f"(owner/name)") from None
    except errors.HfHubHTTPError as e:
        raise PlaygroundError(f"the Hugging Face hub refused {spec!r}: {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - timeouts, DNS, refused connections
        raise PlaygroundError(f"cannot reach the Hugging Face hub for {spec!r} within {_HUB_TIMEOUT:g} s "
                              f"(offline? HF_HUB_OFFLINE=1 uses only the local cache): "
                              f"{_first_line(e)}") from None


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``, or TimeoutError after ``seconds`` (a stuck call finishes alone in the background).

    The request's own timeout applies per phase and per connection attempt, so a dead network
    can take several times longer than it; this bounds the whole call.
    """
    box: Future = Future()

    def run() -> None:
        try:
            box.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.set_exception(e)

    threading.Thread(target=run, name="hub probe", daemon=True).start()
    done, _ = futures.wait([box], timeout=seconds)
    if not done:
        raise TimeoutError("no answer")
    return box.result()


def _first_line(e: BaseException) -> str:
    msg = str(e).strip()
    return (msg.splitlines()[0] if msg else type(e).__name__)[:200]


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
        raise PlaygroundError(_load_failure(spec, source, e)) from None


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


def model_info(spec: str, trust_remote_code: bool = False) -> dict[str, Any]:
    """What the config says about ``spec``, without loading weights (for a status line).

    Keys: ``name``, ``source``, ``kind``, ``model_type``, ``context_length`` (from the config),
    ``num_layers``, ``vocab_size``, ``parameters`` (exact from local safetensors headers, else an
    estimate from the config's sizes, or None), ``parameters_exact`` and ``loaded`` (already in
    the cache). A hub id is probed as by :func:`load_model` and fails the same way.
    """
    source, location = _allowed(spec, trust_remote_code)
    config = _read_config(spec, source, location, trust_remote_code)
    exact = _safetensors_parameters(_local_dir(source, location))
    with _cache_lock:
        loaded = any(k[0] == location for k in _cache)
    return {
        "name": Path(location).name if source == "bundled" else spec.strip(),
        "source": source,
        "kind": detect_kind(config),
        "model_type": getattr(config, "model_type", None),
        "context_length": _context_length(config, None),
        "num_layers": int(getattr(_text_config(config), "num_hidden_layers", 0) or 0),
        "vocab_size": getattr(_text_config(config), "vocab_size", None),
        "parameters": exact if exact is not None else _estimate_parameters(config),
        "parameters_exact": exact is not None,
        "loaded": loaded,
    }


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _local_dir(source: str, location: str) -> Path | None:
    if source in ("bundled", "path"):
        return Path(location)
    if source == "cache":
        try:
            (try_to_load_from_cache,) = _import("huggingface_hub", "try_to_load_from_cache")
            hit = try_to_load_from_cache(location, "config.json")
        except Exception:  # noqa: BLE001 - no count is better than no status line
            return None
        return Path(hit).parent if isinstance(hit, str) else None
    return None


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


def diffusion_meta(config: Any, tokenizer: Any) -> tuple[int | None, bool]:
    """Mask token id and logit shift of a diffusion model, from its config and tokenizer.

    LLaDA uses the fixed id 126336; Dream names its id in the config and predicts position
    ``i`` at index ``i - 1`` (shifted logits, adapted from an AR model); plain masked LMs
    (BERT, RoBERTa, ModernBERT, the bundled model) use the tokenizer's mask token.
    """
    mtype = (getattr(config, "model_type", "") or "").lower()
    mask_id = getattr(tokenizer, "mask_token_id", None)
    shifted = False
    if "llada" in mtype:
        mask_id = LLADA_MASK_ID
    if "dream" in mtype:
        shifted = True
        cfg_id = getattr(config, "mask_token_id", None)
        mask_id = cfg_id if cfg_id is not None else mask_id
    return mask_id, shifted


def _auto_class(config: Any, kind: str, trust_remote_code: bool) -> Any:
    AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM = _import(
        "transformers", "AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM")

    if kind == "causal":
        return AutoModelForCausalLM
    mtype = (getattr(config, "model_type", "") or "").lower()
    if "llada" in mtype or "dream" in mtype:
        if not trust_remote_code:
            raise PlaygroundError(f"{mtype} models need their own code: opt in with trust_remote_code")
        return AutoModel
    return AutoModelForMaskedLM


def _load_failure(spec: str, source: str, e: BaseException) -> str:
    msg = _first_line(e)
    if source == "hub":
        return f"could not load {spec!r} from the Hugging Face hub: {msg}"
    return f"could not load model {spec!r}: {msg}"


def handle_from_model(model: torch.nn.Module, tokenizer: Any, name: str = "custom",
                      kind: str | None = None, mask_token_id: int | None = None,
                      logits_shifted: bool = False) -> ModelHandle:
    """Wrap an already-built model (tests build tiny random ones) in a handle."""
    kind = kind or detect_kind(model.config)
    if kind == "diffusion" and mask_token_id is None:
        mask_token_id = getattr(tokenizer, "mask_token_id", None)
    return ModelHandle(name, model.eval(), tokenizer, kind, source="memory",
                       mask_token_id=mask_token_id, logits_shifted=logits_shifted)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text pieces that are safe to show.

    A piece is released only when the decoded text no longer ends in a replacement
    character (an unfinished UTF-8 sequence) and is decoded with its left context, so a
    word piece gets the spacing it has in the full text.
    """

    def __init__(self, tokenizer: Any, context_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context_ids)[-4:]
        self.prefix = 0
        self.read = len(self.ids)

    def _dec(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes ('' while a character is open)."""
        self.ids.append(int(token_id))
        before = self._dec(self.ids[self.prefix:self.read])
        after = self._dec(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            piece = after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
            return piece
        return ""

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """One display piece per token (joined they equal the text); '' where pending."""
        return [self.push(t) for t in ids]


def token_pieces(tokenizer: Any, ids: Sequence[int], context_ids: Sequence[int] = ()) -> list[str]:
    """Per-token display text for ``ids`` following ``context_ids`` (see IncrementalDetokenizer)."""
    return IncrementalDetokenizer(tokenizer, context_ids).pieces(ids)
