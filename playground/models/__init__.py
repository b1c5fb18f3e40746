"""Models: resolve a spec, load it once, hand out counting views of it.

One job per module:

* :mod:`~playground.models.sources` — where a spec points (bundled, local dir, HF cache, hub),
  what this instance allows, what is loadable offline;
* :mod:`~playground.models.hub` — hub ids fail fast and in one line (offline, gated, missing,
  unreachable);
* :mod:`~playground.models.loading` — :func:`load_model`: config, kind check, tokenizer and
  weights, placement (device, dtype, ``device_map``, 4/8-bit);
* :mod:`~playground.models.cache` — the LRU of loaded models and the loads in flight;
* :mod:`~playground.models.handle` — :class:`ModelHandle` (the only code that calls
  ``model(...)``) and the per-run :class:`ModelView` that counts forwards;
* :mod:`~playground.models.chat` — prompts through a chat template with a system prompt;
* :mod:`~playground.models.kinds` — causal or diffusion, diffusion mask ids;
* :mod:`~playground.models.info` — :func:`model_info`, from the config only;
* :mod:`~playground.models.detok` — per-token display text without broken characters.

Everything public is re-exported here, so ``from playground.models import load_model`` and
the like work as before the split. Importing this package does not import transformers.
"""

from __future__ import annotations

from playground.models._imports import _weights_lock
from playground.models.chat import chat_messages, has_chat_template
from playground.models.detok import IncrementalDetokenizer, token_pieces
from playground.models.handle import Forward, ModelHandle, ModelView, crop_cache, handle_from_model
from playground.models.info import model_info
from playground.models.kinds import KINDS, LLADA_MASK_ID, detect_kind, diffusion_meta
from playground.models.loading import load_model
from playground.models.sources import ASSETS, BUNDLED, BUNDLED_DIR, list_cached_models, list_models, resolve

__all__ = ["ASSETS", "BUNDLED", "BUNDLED_DIR", "Forward", "IncrementalDetokenizer", "KINDS", "LLADA_MASK_ID",
           "ModelHandle", "ModelView", "chat_messages", "crop_cache", "detect_kind", "diffusion_meta",
           "handle_from_model", "has_chat_template", "list_cached_models", "list_models", "load_model",
           "model_info", "resolve", "token_pieces"]
