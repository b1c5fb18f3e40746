"""Named comparisons stored as JSON data files in ``presets/``.

A preset holds a title, a description of what it shows, the model, prompt, seed, max new
tokens and two to six lanes (decoder, knobs, optional draft model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playground.core.errors import PlaygroundError

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


def list_presets() -> list[dict[str, Any]]:
    """Every preset, sorted by name."""
    out = []
    for p in sorted(PRESET_DIR.glob("*.json")):
        out.append(load_preset(p.stem))
    return out


def load_preset(name: str) -> dict[str, Any]:
    """The preset called ``name`` (its file stem), validated."""
    path = PRESET_DIR / f"{name}.json"
    if not name or "/" in name or not path.exists():
        known = ", ".join(p.stem for p in sorted(PRESET_DIR.glob("*.json"))) or "none"
        raise PlaygroundError(f"unknown preset {name!r} (presets: {known})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PlaygroundError(f"preset {name!r} is not valid JSON: {e}") from None
    data.setdefault("name", name)
    for key in ("title", "model", "prompt", "lanes"):
        if key not in data:
            raise PlaygroundError(f"preset {name!r} has no {key!r}")
    if not 1 <= len(data["lanes"]) <= 6:
        raise PlaygroundError(f"preset {name!r} must have 1 to 6 lanes")
    data.setdefault("seed", 0)
    data.setdefault("max_new_tokens", 48)
    data.setdefault("description", "")
    for lane in data["lanes"]:
        lane.setdefault("params", {})
        lane.setdefault("draft", None)
    return data
