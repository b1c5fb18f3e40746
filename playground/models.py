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
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from playground.errors import PlaygroundError
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
        """Project hidden states through the final norm and LM head (for early-exit drafts)."""
        with self.lock, torch.inference_mode():
            inner = getattr(self.model, "model", None)
            norm = getattr(inner, "norm", None)
            h = norm(hidden) if norm is not None else hidden
            return self.model.get_output_embeddings()(h).float()

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
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json")
        return isinstance(hit, str)
    except Exception:
        return False


def list_cached_models() -> list[str]:
    """Hub ids of models found in the local Hugging Face cache (found offline)."""
    try:
        from huggingface_hub import constants, scan_cache_dir

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


_cache: "OrderedDict[tuple, ModelHandle]" = OrderedDict()
_cache_lock = threading.Lock()


def load_model(spec: str, kind: str | None = None, device: str = "auto", dtype: str = "auto",
               quantization: str | None = None, device_map: str | None = None,
               trust_remote_code: bool = False) -> ModelHandle:
    """Load (or fetch from the LRU) the model named by ``spec``.

    ``kind`` checks or forces ``causal``/``diffusion``; ``device`` is auto/cpu/cuda/mps;
    ``dtype`` auto/float32/bfloat16/float16; ``quantization`` None/4bit/8bit (CUDA only);
    ``device_map="auto"`` spreads a large model over devices with accelerate;
    ``trust_remote_code`` runs the model repository's own code and stays off unless asked.
    Raises :class:`PlaygroundError` with one line for every way this can fail.
    """
    lim = limits()
    if lim.no_models:
        raise PlaygroundError("model loading is disabled on this instance (replay only)")
    source, location = resolve(spec)
    if source not in lim.model_sources:
        raise PlaygroundError(f"loading {source} models is disabled on this instance "
                              f"(allowed: {', '.join(lim.model_sources) or 'none'})")
    if trust_remote_code and not lim.allow_remote_code:
        raise PlaygroundError("remote code is disabled on this instance")
    if kind is not None and kind not in KINDS:
        raise PlaygroundError(f"unknown model kind {kind!r}; expected causal or diffusion")
    key = (location, device, dtype, quantization, device_map, trust_remote_code)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
    if hit is not None:
        if kind is not None and hit.kind != kind:
            raise PlaygroundError(f"model {spec!r} is a {hit.kind} model, but a {kind} model is needed here")
        return hit
    handle = _load(spec, source, location, kind, device, dtype, quantization, device_map, trust_remote_code)
    with _cache_lock:
        _cache[key] = handle
        while len(_cache) > max(1, _LRU_SIZE):
            _cache.popitem(last=False)
    return handle


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


def _load(spec: str, source: str, location: str, kind: str | None, device: str, dtype: str,
          quantization: str | None, device_map: str | None, trust_remote_code: bool) -> ModelHandle:
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading bars would break the one-line error contract

    offline = source in ("bundled", "path", "cache")
    common: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if offline:
        common["local_files_only"] = True
    try:
        config = AutoConfig.from_pretrained(location, **common)
    except Exception as e:  # noqa: BLE001 - every loader failure becomes one line
        raise PlaygroundError(_load_failure(spec, source, e)) from None
    found = detect_kind(config)
    if kind is not None and kind != found:
        raise PlaygroundError(f"model {spec!r} is a {found} model, but a {kind} model is needed here")
    dev = _pick_device(device)
    torch_dtype = _pick_dtype(dtype, dev)
    kwargs: dict[str, Any] = dict(common, dtype=torch_dtype)
    if quantization:
        if quantization not in ("4bit", "8bit"):
            raise PlaygroundError(f"unknown quantization {quantization!r}; use 4bit or 8bit")
        if not torch.cuda.is_available():
            raise PlaygroundError(f"{quantization} quantization needs a CUDA GPU (bitsandbytes); none is available")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = (
            BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch_dtype,
                               bnb_4bit_quant_type="nf4")
            if quantization == "4bit" else BitsAndBytesConfig(load_in_8bit=True))
        kwargs["device_map"] = device_map or {"": dev.index or 0}
    elif device_map:
        kwargs["device_map"] = device_map
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **common)
        model = _auto_class(config, found, trust_remote_code).from_pretrained(location, **kwargs)
    except PlaygroundError:
        raise
    except torch.cuda.OutOfMemoryError:
        raise PlaygroundError(f"model {spec!r} does not fit in GPU memory; try 4bit/8bit or device_map=auto") from None
    except Exception as e:  # noqa: BLE001
        raise PlaygroundError(_load_failure(spec, source, e)) from None
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
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    if kind == "causal":
        return AutoModelForCausalLM
    mtype = (getattr(config, "model_type", "") or "").lower()
    if "llada" in mtype or "dream" in mtype:
        if not trust_remote_code:
            raise PlaygroundError(f"{mtype} models need their own code: opt in with trust_remote_code")
        return AutoModel
    return AutoModelForMaskedLM


def _load_failure(spec: str, source: str, e: Exception) -> str:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if source == "hub":
        return (f"could not load {spec!r} from the Hugging Face hub (offline, or no such model?): "
                f"{msg[:200]}")
    return f"could not load model {spec!r}: {msg[:200]}"


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
