"""Deployment limits read from environment variables (hosting on a public Space, say).

Every limit has a generous default for a local install; a public deployment tightens them.
The CLI, the Python API and the UI all check requests against :func:`limits`.

| variable | meaning | default |
|---|---|---|
| ``PLAYGROUND_MAX_NEW_TOKENS`` | most tokens one lane may generate | 1024 |
| ``PLAYGROUND_MAX_LANES`` | most lanes in one comparison | 6 |
| ``PLAYGROUND_MAX_PROMPT_CHARS`` | longest prompt, in characters | 20000 |
| ``PLAYGROUND_MODEL_SOURCES`` | comma list of allowed sources: bundled, cache, path, hub | all four |
| ``PLAYGROUND_ALLOW_REMOTE_CODE`` | 1 lets users opt in to ``trust_remote_code`` | 1 |
| ``PLAYGROUND_NO_MODELS`` | 1 disables model loading (a replay-only instance) | 0 |
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ALL_SOURCES = ("bundled", "cache", "path", "hub")


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Limits:
    """The limits in force for this process."""

    max_new_tokens: int = 1024
    max_lanes: int = 6
    max_prompt_chars: int = 20000
    model_sources: tuple[str, ...] = ALL_SOURCES
    allow_remote_code: bool = True
    no_models: bool = False


def limits() -> Limits:
    """Read the limits from the environment (cheap; read on every request so tests can set them)."""
    raw = os.environ.get("PLAYGROUND_MODEL_SOURCES", "").strip()
    sources = tuple(s.strip() for s in raw.split(",") if s.strip()) if raw else ALL_SOURCES
    return Limits(
        max_new_tokens=_int("PLAYGROUND_MAX_NEW_TOKENS", 1024),
        max_lanes=_int("PLAYGROUND_MAX_LANES", 6),
        max_prompt_chars=_int("PLAYGROUND_MAX_PROMPT_CHARS", 20000),
        model_sources=sources,
        allow_remote_code=_flag("PLAYGROUND_ALLOW_REMOTE_CODE", True),
        no_models=_flag("PLAYGROUND_NO_MODELS", False),
    )
