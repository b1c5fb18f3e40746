"""Where a model spec points: a bundled model, a local directory, the HF cache or the hub.

Also what this instance allows (``PLAYGROUND_MODEL_SOURCES``, remote code, replay-only) and
the list of models loadable offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playground.core.errors import PlaygroundError
from playground.core.models._imports import _import
from playground.core.settings import limits

ASSETS = Path(__file__).resolve().parents[3] / "assets"
BUNDLED_DIR = ASSETS / "models"
BUNDLED = ("tiny-shakespeare", "tiny-shakespeare-draft", "tiny-shakespeare-diffusion")
REMOTE_CODE_OFF = "remote code is disabled on this instance"


def resolve(spec: str, paths: bool = True) -> tuple[str, str]:
    """Map a model spec to ``(source, location)``; source is bundled, path, cache or hub.

    Without ``paths`` (an instance that loads no local directories) the file system is never
    looked at: a spec written as a path is a ``path`` spec by its spelling alone, so what the
    refusal says cannot tell a visitor whether some directory exists or holds a model."""
    spec = (spec or "").strip()
    if not spec:
        raise PlaygroundError("no model given")
    if spec in BUNDLED:
        path = BUNDLED_DIR / spec
        if not (path / "config.json").exists():
            raise PlaygroundError(f"bundled model {spec!r} is missing from {path}; run `playground train-tiny`")
        return "bundled", str(path)
    if not paths:
        if spec.startswith((".", "/", "~", "\\")):
            return "path", spec
        return ("cache", spec) if _in_hf_cache(spec) else ("hub", spec)
    p = Path(spec).expanduser()
    if p.exists() or spec.startswith((".", "/", "~")):
        if not p.is_dir() or not (p / "config.json").exists():
            raise PlaygroundError(f"model path {spec!r} does not exist or has no config.json")
        return "path", str(p.resolve())
    if _in_hf_cache(spec):
        return "cache", spec
    return "hub", spec


def allowed(spec: str, trust_remote_code: bool) -> tuple[str, str]:
    """``resolve(spec)``, refused where this instance's limits forbid it."""
    lim = limits()
    if lim.no_models:
        raise PlaygroundError("model loading is disabled on this instance (replay only)")
    source, location = resolve(spec, paths="path" in lim.model_sources)
    if source not in lim.model_sources:
        raise PlaygroundError(f"loading {source} models is disabled on this instance "
                              f"(allowed: {', '.join(lim.model_sources) or 'none'})")
    if trust_remote_code and not lim.allow_remote_code:
        raise PlaygroundError(REMOTE_CODE_OFF)
    return source, location


def local_dir(source: str, location: str) -> Path | None:
    """The folder holding a model's files when they are on this machine (None for the hub)."""
    if source in ("bundled", "path"):
        return Path(location)
    if source == "cache":
        try:
            (try_to_load_from_cache,) = _import("huggingface_hub", "try_to_load_from_cache")
            hit = try_to_load_from_cache(location, "config.json")
        except Exception:  # noqa: BLE001 - callers treat "unknown" as "not local"
            return None
        return Path(hit).parent if isinstance(hit, str) else None
    return None


def local_config(folder: Path | None) -> dict[str, Any] | None:
    """The ``config.json`` in a model's local ``folder`` (:func:`local_dir`) as a dict, or None
    when there is no folder, no readable file or no JSON object in it."""
    if folder is None:
        return None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


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
