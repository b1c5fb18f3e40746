"""Checks for values that come from outside (the page, the HTTP API, the CLI, an import file).

On a hosted instance anyone can call any handler with any JSON, so every front door checks
what it is given *before* it does work with it: types first (one line naming the field, never
an ``AttributeError`` from deep inside), then sizes (a prompt's characters before it is
tokenised, a JSON value's depth and size before it is walked), then ranges (a seed the store
and Gradio's serialiser can hold). The engine, the API, the store's import and the page call
these, so the limits are the same wherever a request enters.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from playground.core.errors import PlaygroundError

# Gradio serialises ints through orjson, which refuses anything outside the signed 64-bit
# range; SQLite's INTEGER is signed 64-bit too. A seed at or over 2**63 would be accepted,
# run, saved, and then break every later read of the session.
MAX_SEED = 2**63 - 1
# Knobs and lanes are small objects: a few dozen values, a few levels deep.
MAX_JSON_DEPTH = 32
MAX_JSON_NODES = 10_000


def text(name: str, value: Any, max_chars: int | None = None, *, optional: bool = False) -> str | None:
    """``value`` if it is text of at most ``max_chars`` characters; else one line naming ``name``.

    ``optional`` lets None through (returned as None). The length is checked on the string as
    received, before anything tokenises or copies it.
    """
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise PlaygroundError(f"{name} must be text, got {_kind(value)}")
    if max_chars is not None and len(value) > max_chars:
        raise PlaygroundError(f"{name} has {len(value)} characters; the limit here is {max_chars}")
    return value


def seed(value: Any, name: str = "seed") -> int:
    """A seed as an int in ``0 ≤ seed < 2**63`` (an integral float or numeric text is fine)."""
    n: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif hasattr(value, "__index__") and not isinstance(value, (bool, float, str)):
        n = operator.index(value)  # a numpy integer
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            n = int(value.strip())
        except ValueError:
            try:
                f = float(value)
            except ValueError:
                f = math.nan
            n = int(f) if math.isfinite(f) and f.is_integer() else None
    if n is None:
        raise PlaygroundError(f"{name} must be a whole number, got {_kind(value)}")
    if not 0 <= n <= MAX_SEED:
        raise PlaygroundError(f"{name} must be between 0 and 2^63 - 1")
    return n


def json_shape(name: str, value: Any, max_depth: int = MAX_JSON_DEPTH, max_nodes: int | None = MAX_JSON_NODES) -> Any:
    """``value`` unchanged if it is plain JSON (dicts with text keys, lists, text, numbers,
    booleans, None) no deeper than ``max_depth``, with at most ``max_nodes`` values (None: no
    count limit) and every whole number within 64 bits (what SQLite and Gradio's serialiser hold).

    Walks the value without recursion, so a hostile nesting depth cannot exhaust the stack.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        v, depth = stack.pop()
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            raise PlaygroundError(f"{name} is too large (more than {max_nodes:,} values)")
        if depth > max_depth:
            raise PlaygroundError(f"{name} nests deeper than {max_depth} levels")
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    raise PlaygroundError(f"{name} has a key that is not text")
                stack.append((item, depth + 1))
        elif isinstance(v, (list, tuple)):
            stack.extend((item, depth + 1) for item in v)
        elif isinstance(v, int) and not isinstance(v, bool) and not -MAX_SEED - 1 <= v <= MAX_SEED:
            raise PlaygroundError(f"{name} holds a whole number outside the 64-bit range")
        elif not (v is None or isinstance(v, (str, int, float, bool))):
            raise PlaygroundError(f"{name} holds a {_kind(v)}, which is not a JSON value")
    return value


def _kind(value: Any) -> str:
    """A value's JSON type in words, never the value itself (it may be megabytes, or HTML)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__
