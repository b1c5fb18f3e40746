"""Models: resolve a spec, load it once, hand out counting views of it.

One job per module:

* :mod:`~playground.core.models.sources` — where a spec points (bundled, local dir, HF cache, hub),
  what this instance allows, what is loadable offline;
* :mod:`~playground.core.models.hub` — hub ids fail fast and in one line (offline, gated, missing,
  unreachable);
* :mod:`~playground.core.models.loading` — :func:`load_model`: config, kind check, tokenizer and
  weights, placement (device, dtype, ``device_map``, 4/8-bit);
* :mod:`~playground.core.models.cache` — the LRU of loaded models and the loads in flight;
* :mod:`~playground.core.models.handle` — :class:`ModelHandle` (the only code that calls
  ``model(...)``) and the per-run :class:`ModelView` that counts forwards;
* :mod:`~playground.core.models.chat` — prompts through a chat template with a system prompt;
* :mod:`~playground.core.models.kinds` — causal or diffusion, diffusion mask ids;
* :mod:`~playground.core.models.info` — :func:`model_info`, from the config only;
* :mod:`~playground.core.models.detok` — per-token display text without broken characters.

Everything public is re-exported here, so ``from playground.core.models import load_model`` and
the like work as before the split. Importing this package does not import transformers.
"""

from __future__ import annotations

from playground.core.models._imports import _weights_lock
from playground.core.models.chat import chat_messages, has_chat_template
from playground.core.models.detok import IncrementalDetokenizer, token_pieces
from playground.core.models.handle import Forward, ModelHandle, ModelView, crop_cache, handle_from_model
from playground.core.models.info import model_info
from playground.core.models.kinds import KINDS, LLADA_MASK_ID, detect_kind, diffusion_meta
from playground.core.models.loading import load_model
from playground.core.models.sources import ASSETS, BUNDLED, BUNDLED_DIR, list_cached_models, list_models, resolve

__all__ = ["ASSETS", "BUNDLED", "BUNDLED_DIR", "Forward", "IncrementalDetokenizer", "KINDS", "LLADA_MASK_ID",
           "ModelHandle", "ModelView", "chat_messages", "crop_cache", "detect_kind", "diffusion_meta",
           "handle_from_model", "has_chat_template", "list_cached_models", "list_models", "load_model",
           "model_info", "resolve", "token_pieces"]
