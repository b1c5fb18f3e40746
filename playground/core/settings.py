"""Deployment limits read from environment variables (hosting on a public Space, say).

Every limit has a generous default for a local install; a public deployment tightens them.
The CLI, the Python API and the UI all check requests against :func:`limits`.
On a Hugging Face Space (``SPACE_ID`` is set) the defaults marked *Space* apply instead, so a
Space deployed without any settings still refuses local paths, hub downloads and remote code.

| variable | meaning | default | Space |
|---|---|---|---|
| ``PLAYGROUND_MAX_NEW_TOKENS`` | most tokens one lane may generate | 1024 | 256 |
| ``PLAYGROUND_MAX_LANES`` | most lanes in one comparison | 6 | 4 |
| ``PLAYGROUND_MAX_PROMPT_CHARS`` | longest prompt, in characters | 20000 | 4000 |
| ``PLAYGROUND_MAX_DETECT_CHARS`` | longest text the watermark detector scores, in characters | 100000 | 10000 |
| ``PLAYGROUND_MODEL_SOURCES`` | comma list of allowed sources: bundled, cache, path, hub | all four | bundled |
| ``PLAYGROUND_ALLOW_REMOTE_CODE`` | 1 lets users opt in to ``trust_remote_code`` | 1 | 0 |
| ``PLAYGROUND_NO_MODELS`` | 1 disables model loading (a replay-only instance) | 0 | 0 |
| ``PLAYGROUND_MAX_IMPORT_BYTES`` | largest session export that may be imported | 20000000 | same |
| ``PLAYGROUND_CONCURRENCY`` | events the Gradio queue runs at once (per event) | 4 | 2 |
| ``PLAYGROUND_MODEL_CONCURRENCY`` | model-running events at once, all together | 2 | 1 |
| ``PLAYGROUND_QUEUE_SIZE`` | most requests waiting in the queue (0 = no limit) | 0 | 32 |
| ``PLAYGROUND_GPU_DURATION`` | seconds a ZeroGPU call may hold the GPU (0 = spaces' default) | 0 | 0 |
| ``PLAYGROUND_LIST_SESSIONS`` | 1: one trusted user, every stored session listed and changeable; 0: owners, each visitor lists and changes only the sessions their browser made (``playground/ownership.py``) | 1 | 0 |
| ``PLAYGROUND_HUB_TIMEOUT`` | seconds a hub id that is not cached may take to answer before it fails with one line | 5 | 5 |
| ``PLAYGROUND_MODEL_CACHE`` | loaded models kept in memory (least recently used dropped first) | 4 | 4 |

A value that is not a number, or a source name that does not exist, is a configuration
mistake: :func:`limits` raises :class:`PlaygroundError` naming the variable rather than
silently falling back to a generous default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from playground.core.errors import PlaygroundError

ALL_SOURCES = ("bundled", "cache", "path", "hub")


def on_space() -> bool:
    """Whether this process runs on a Hugging Face Space (Spaces set ``SPACE_ID``)."""
    return bool(os.environ.get("SPACE_ID", "").strip())


def _int(name: str, default: int, lo: int = 0) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PlaygroundError(f"{name}={raw!r} is not a whole number") from None
    if value < lo:
        raise PlaygroundError(f"{name}={value} must be at least {lo}")
    return value


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise PlaygroundError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise PlaygroundError(f"{name}={raw} must be a positive number of seconds")
    return value


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise PlaygroundError(f"{name}={raw!r} is not a flag; use 1 or 0")


def _sources(default: tuple[str, ...]) -> tuple[str, ...]:
    raw = os.environ.get("PLAYGROUND_MODEL_SOURCES")
    if raw is None or not raw.strip():
        return default
    names = tuple(s.strip().lower() for s in raw.split(",") if s.strip())
    if names == ("none",):
        return ()
    bad = [s for s in names if s not in ALL_SOURCES]
    if bad:
        raise PlaygroundError(f"PLAYGROUND_MODEL_SOURCES names unknown source(s) {', '.join(bad)}; "
                              f"use a comma list of {', '.join(ALL_SOURCES)} (or none)")
    return names


@dataclass(frozen=True)
class Limits:
    """The limits in force for this process."""

    max_new_tokens: int = 1024
    max_lanes: int = 6
    max_prompt_chars: int = 20000
    max_detect_chars: int = 100_000
    model_sources: tuple[str, ...] = ALL_SOURCES
    allow_remote_code: bool = True
    no_models: bool = False
    max_import_bytes: int = 20_000_000
    concurrency: int = 4
    model_concurrency: int = 2
    queue_size: int = 0
    gpu_duration: int = 0
    list_sessions: bool = True
    hub_timeout: float = 5.0
    model_cache: int = 4


def limits() -> Limits:
    """Read the limits from the environment (cheap; read on every request so tests can set them)."""
    space = on_space()
    return Limits(
        max_new_tokens=_int("PLAYGROUND_MAX_NEW_TOKENS", 256 if space else 1024, lo=1),
        max_lanes=_int("PLAYGROUND_MAX_LANES", 4 if space else 6, lo=1),
        max_prompt_chars=_int("PLAYGROUND_MAX_PROMPT_CHARS", 4000 if space else 20000, lo=1),
        # scoring costs a forward-free pass over the text's tokens, about 0.3 ms a character on
        # two cores: 10,000 characters keep one request within a few seconds of the model slot
        max_detect_chars=_int("PLAYGROUND_MAX_DETECT_CHARS", 10_000 if space else 100_000, lo=1),
        model_sources=_sources(("bundled",) if space else ALL_SOURCES),
        allow_remote_code=_flag("PLAYGROUND_ALLOW_REMOTE_CODE", not space),
        no_models=_flag("PLAYGROUND_NO_MODELS", False),
        max_import_bytes=_int("PLAYGROUND_MAX_IMPORT_BYTES", 20_000_000, lo=1),
        concurrency=_int("PLAYGROUND_CONCURRENCY", 2 if space else 4, lo=1),
        model_concurrency=_int("PLAYGROUND_MODEL_CONCURRENCY", 1 if space else 2, lo=1),
        queue_size=_int("PLAYGROUND_QUEUE_SIZE", 32 if space else 0),
        gpu_duration=_int("PLAYGROUND_GPU_DURATION", 0),
        # A session id is the key to a session: listing them all to every visitor of a
        # public Space would hand out every key (and the delete button with it), so there each
        # visitor lists and changes only what their own browser made.
        list_sessions=_flag("PLAYGROUND_LIST_SESSIONS", not space),
        hub_timeout=_seconds("PLAYGROUND_HUB_TIMEOUT", 5.0),
        model_cache=_int("PLAYGROUND_MODEL_CACHE", 4, lo=1),
    )


def check_lanes(n: int) -> None:
    """Refuse a comparison with more lanes than this instance allows (or with none)."""
    lim = limits()
    if n < 1:
        raise PlaygroundError("a comparison needs at least one lane")
    if n > lim.max_lanes:
        raise PlaygroundError(f"{n} lanes is over this instance's limit of {lim.max_lanes}")
