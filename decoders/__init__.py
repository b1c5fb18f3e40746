"""Decoders, one module (or subpackage) per family; importing this package registers them all.

Family modules are discovered, not listed, so adding a family means adding a module.
"""

from __future__ import annotations

import importlib
import pkgutil

from decoders.base import REGISTRY, Decoder, all_decoders, get_decoder, register

_HELPERS = {"base", "ar"}


def _import_families() -> None:
    for info in pkgutil.walk_packages(__path__, prefix=__name__ + "."):
        short = info.name.rsplit(".", 1)[-1]
        if short in _HELPERS or short.startswith("_"):
            continue
        importlib.import_module(info.name)


_import_families()

__all__ = ["REGISTRY", "Decoder", "all_decoders", "get_decoder", "register"]
