"""The process-wide locks of model loading and the serialised lazy import.

transformers' ``from_pretrained`` swaps process-wide state while it builds a model (the
``torch.nn.init`` functions, ``PreTrainedModel.init_weights``/``tie_weights``, torch's default
dtype), saving and restoring the "originals" around each load. Two loads at once, of the same
model or not, save each other's patched functions as originals and leave the process patched
for good: every later load ends with weights on the meta device. So all tokenizer and weight
loading takes :data:`_weights_lock`; anything else in the process that builds a transformers
model while the page serves should hold it too.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

_weights_lock = threading.Lock()  # one from_pretrained (tokenizer + weights) at a time, process-wide
# the first import of transformers/huggingface_hub is not thread-safe (their lazy modules raise
# "cannot import name 'AutoConfig'" in a thread that races the one initialising them)
_import_lock = threading.RLock()


def _import(module: str, *names: str) -> tuple[Any, ...]:
    """``from module import *names``, serialised so lazy modules initialise in one thread."""
    with _import_lock:
        mod = importlib.import_module(module)
        return tuple(getattr(mod, n) for n in names)
