"""The Python API, mirroring the CLI: ``playground.generate(...) -> dict``."""

from __future__ import annotations

from typing import Any

from playground.engine import prepare
from playground.presets import load_preset


def generate(model: str, decoder: str, prompt: str, max_new_tokens: int = 64, seed: int = 0,
             draft: str | None = None, stop: list[str] | None = None, chat: bool = False,
             **params: Any) -> dict[str, Any]:
    """Run one decoder and return its trace as a JSON-ready dict (the CLI's ``--json``).

    Models are loaded once and cached in the process. Knobs go in ``params`` by name, e.g.
    ``generate(model="tiny-shakespeare", decoder="top_p", prompt="ROMEO:", p=0.9)``.
    Bad input raises :class:`playground.PlaygroundError` with a one-line message.
    """
    run = prepare(model=model, decoder=decoder, prompt=prompt, max_new_tokens=max_new_tokens,
                  seed=seed, draft=draft, params=params, stop=stop, chat=chat)
    return run.finish().to_dict()


def compare(preset: str | dict[str, Any], **overrides: Any) -> list[dict[str, Any]]:
    """Run every lane of a preset (a name or a preset dict) and return their traces."""
    p = dict(load_preset(preset) if isinstance(preset, str) else preset)
    p.update({k: v for k, v in overrides.items() if v is not None})
    traces = []
    for lane in p["lanes"]:
        run = prepare(model=lane.get("model") or p["model"], decoder=lane["decoder"], prompt=p["prompt"],
                      max_new_tokens=int(lane.get("max_new_tokens") or p["max_new_tokens"]),
                      seed=int(p["seed"]), draft=lane.get("draft"), params=lane.get("params", {}))
        traces.append(run.finish().to_dict())
    return traces
