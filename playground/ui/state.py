"""What the Compare page knows, as plain data: decoder specs, lane configs, presets, sessions.

Nothing here imports Gradio, so the rules behind the page (which widget a knob becomes,
which lanes a preset fills, what a stored session's settings look like, which metric suits
a trace) are unit-tested without a browser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from playground.errors import PlaygroundError

MAX_LANES = 6
MIN_LANES = 2
SAME_MODEL = "(page model)"
NO_DRAFT = "(none)"
DEFAULT_MODEL = "tiny-shakespeare"
DEFAULT_DRAFT = "tiny-shakespeare-draft"
DEFAULT_DIFFUSION = "tiny-shakespeare-diffusion"
POLICY_CHOICES = [("equal compute (fewest target forwards steps next)", "forwards"),
                  ("equal steps", "steps"), ("free running (round robin)", "free")]
METRIC_CHOICES = [("auto", "auto"), ("probability", "probability"), ("entropy", "entropy"),
                  ("draft acceptance", "acceptance"), ("unmasking / commit step", "unmask_step"),
                  ("none", "none")]
EXAMPLE_PROMPTS = [
    "ROMEO:\nBut soft, what light",
    "KING HENRY:\nOnce more unto the breach, dear friends,",
    "HAMLET:\nTo be, or not to be:",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "JULIET:\nO Romeo, Romeo!",
    "MACBETH:\nIs this a dagger which I see before me,",
]


# ---------------------------------------------------------------------- decoders
def decoder_specs() -> dict[str, dict[str, Any]]:
    """Every registered decoder's spec (``Decoder.spec()``), by name."""
    from decoders import all_decoders

    return {c.name: c.spec() for c in all_decoders()}


def decoder_choices() -> list[tuple[str, str]]:
    """(label, name) for the decoder pickers, grouped by family."""
    return [(f"{s['family']} · {name}" + (" (needs draft)" if s["needs_draft"] else ""), name)
            for name, s in decoder_specs().items()]


def decoder_spec(name: str | None) -> dict[str, Any] | None:
    """The spec of decoder ``name``, or None if no such decoder is registered."""
    return decoder_specs().get(name or "")


def knob_summary(name: str | None, knobs: dict[str, Any] | None) -> str:
    """The knobs that differ from their defaults, as ``k=20 · temperature=0.7``."""
    s = decoder_spec(name)
    if s is None or not knobs:
        return ""
    parts = []
    for k, spec in s["params"].items():
        if k in knobs and knobs[k] != spec["default"]:
            v = knobs[k]
            parts.append(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}")
    return " · ".join(parts)


def decoder_info_md(name: str | None, knobs: dict[str, Any] | None = None) -> str:
    """A short markdown note on a decoder: its description, reference and flags, and the
    knobs set away from their defaults."""
    s = decoder_spec(name)
    if s is None:
        return f"*unknown decoder {_md_escape(name)}*" if name else ""
    summary = knob_summary(name, knobs)
    tail = f"\n\n**{_md_escape(summary)}**" if summary else ""
    flags = []
    if s["lossless"]:
        flags.append("lossless")
    if s["needs_draft"]:
        flags.append("needs a draft model")
    flags.append(f"{s['kind']} model")
    ref = f" — *{_md_escape(s['reference'])}*" if s.get("reference") else ""
    return f"{_md_escape(s['description'])}{ref} ({', '.join(flags)}){tail}"


def _md_escape(text: str) -> str:
    """Neutralise markdown/HTML in text shown through gr.Markdown."""
    import html

    return html.escape(str(text)).replace("*", "\\*").replace("_", "\\_").replace("`", "\\`")


@dataclass(frozen=True)
class KnobWidget:
    """Which Gradio control a knob becomes, and its arguments."""

    widget: str  # slider | number | checkbox | dropdown | textbox
    kwargs: dict[str, Any] = field(default_factory=dict)


def knob_widget(name: str, spec: dict[str, Any], value: Any = None) -> KnobWidget:
    """Map one knob's spec (type, default, min/max/choices, help) to a control."""
    typ = spec.get("type")
    val = spec.get("default") if value is None else value
    common = {"label": name, "info": spec.get("help") or None}
    lo, hi = spec.get("min"), spec.get("max")
    finite = isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and math.isfinite(lo) and math.isfinite(hi)
    if typ == "bool":
        return KnobWidget("checkbox", {**common, "value": bool(val)})
    if typ == "choice":
        return KnobWidget("dropdown", {**common, "choices": list(spec.get("choices") or []), "value": val})
    if typ == "int":
        if finite and hi - lo <= 4096:
            return KnobWidget("slider", {**common, "minimum": lo, "maximum": hi, "step": 1, "value": int(val)})
        return KnobWidget("number", {**common, "precision": 0, "value": int(val),
                                     **({"minimum": lo} if isinstance(lo, (int, float)) and math.isfinite(lo) else {}),
                                     **({"maximum": hi} if isinstance(hi, (int, float)) and math.isfinite(hi) else {})})
    if typ == "float":
        if finite and hi - lo <= 1000:
            step = _float_step(lo, hi)
            return KnobWidget("slider", {**common, "minimum": lo, "maximum": hi, "step": step, "value": float(val)})
        return KnobWidget("number", {**common, "value": float(val),
                                     **({"minimum": lo} if isinstance(lo, (int, float)) and math.isfinite(lo) else {}),
                                     **({"maximum": hi} if isinstance(hi, (int, float)) and math.isfinite(hi) else {})})
    return KnobWidget("textbox", {**common, "value": "" if val is None else str(val)})


def _float_step(lo: float, hi: float) -> float:
    span = hi - lo
    if span <= 0.01:
        return 1e-5
    if span <= 1:
        return 0.001
    if span <= 10:
        return 0.01
    return 0.1


def default_knobs(decoder: str | None) -> dict[str, Any]:
    """Every knob of ``decoder`` at its default ({} for an unknown decoder)."""
    s = decoder_spec(decoder)
    return {k: v["default"] for k, v in s["params"].items()} if s else {}


def coerce_knobs(decoder: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Knob values as the page holds them (sliders give floats for ints) in their types;
    unknown knobs are dropped (they belong to the decoder picked before)."""
    s = decoder_spec(decoder)
    if s is None:
        return dict(knobs or {})
    out: dict[str, Any] = {}
    for k, v in (knobs or {}).items():
        spec = s["params"].get(k)
        if spec is None:
            continue
        if spec["type"] == "int" and isinstance(v, float) and v.is_integer():
            v = int(v)
        out[k] = v
    return out


# ---------------------------------------------------------------------- lanes
@dataclass
class LaneConfig:
    """One lane as the page holds it."""

    decoder: str = "greedy"
    params: dict[str, Any] = field(default_factory=dict)
    draft: str | None = None
    model: str | None = None  # None: the page's model

    def to_dict(self) -> dict[str, Any]:
        """JSON form (as stored in session settings and presets)."""
        d: dict[str, Any] = {"decoder": self.decoder, "params": dict(self.params), "draft": self.draft}
        if self.model:
            d["model"] = self.model
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LaneConfig":
        """From a preset's or stored session's lane entry."""
        return cls(decoder=str(d.get("decoder") or "greedy"), params=dict(d.get("params") or {}),
                   draft=d.get("draft") or None, model=d.get("model") or None)


def needs_draft(decoder: str | None) -> bool:
    """Whether ``decoder`` needs a draft model."""
    s = decoder_spec(decoder)
    return bool(s and s["needs_draft"])


def lane_model_for(decoder: str, page_model: str, lane_model: str | None) -> str | None:
    """The model a lane should use when its decoder is picked.

    A diffusion decoder on a causal page model (or the reverse) gets the matching bundled
    model, so picking ``llada`` next to ``greedy`` works without a second click.
    """
    s = decoder_spec(decoder)
    if s is None:
        return lane_model
    page_kind = "diffusion" if page_model == DEFAULT_DIFFUSION else "causal" if page_model in (DEFAULT_MODEL, DEFAULT_DRAFT) else None
    if page_kind is None or s["kind"] == page_kind:
        return None if lane_model in (None, page_model) else lane_model
    return DEFAULT_DIFFUSION if s["kind"] == "diffusion" else DEFAULT_MODEL


def lane_request(cfg: LaneConfig, page_model: str, prompt: str, seed: int, max_new_tokens: int) -> dict[str, Any]:
    """The keyword arguments of ``engine.prepare`` for one lane."""
    draft = cfg.draft if needs_draft(cfg.decoder) else None
    return {"model": cfg.model or page_model, "decoder": cfg.decoder, "prompt": prompt,
            "max_new_tokens": int(max_new_tokens), "seed": int(seed), "draft": draft,
            "params": coerce_knobs(cfg.decoder, cfg.params)}


def check_page(model: str, prompt: str, seed: Any, max_new_tokens: Any, lanes: list[LaneConfig]) -> tuple[int, int]:
    """Page-level checks before anything loads; returns (seed, max_new_tokens) as ints."""
    from playground.settings import limits

    lim = limits()
    if not (model or "").strip():
        raise PlaygroundError("pick a model first")
    if not prompt or not prompt.strip():
        raise PlaygroundError("the prompt is empty")
    if len(prompt) > lim.max_prompt_chars:
        raise PlaygroundError(f"the prompt has {len(prompt)} characters; the limit here is {lim.max_prompt_chars}")
    try:
        seed_i = int(float(seed))
    except (TypeError, ValueError):
        raise PlaygroundError(f"the seed must be an integer, got {seed!r}") from None
    try:
        mnt = float(max_new_tokens)
    except (TypeError, ValueError):
        raise PlaygroundError(f"max new tokens must be an integer, got {max_new_tokens!r}") from None
    if not mnt.is_integer() or mnt < 1:
        raise PlaygroundError(f"max new tokens must be a positive integer, got {max_new_tokens!r}")
    if mnt > lim.max_new_tokens:
        raise PlaygroundError(f"max new tokens {int(mnt)} is over this instance's limit of {lim.max_new_tokens}")
    if not lanes:
        raise PlaygroundError("add at least one lane")
    if len(lanes) > lim.max_lanes:
        raise PlaygroundError(f"{len(lanes)} lanes is over this instance's limit of {lim.max_lanes}")
    return seed_i, int(mnt)


# ---------------------------------------------------------------------- presets
def preset_choices() -> list[tuple[str, str]]:
    """(title, name) of every preset, for the preset picker."""
    from playground.presets import list_presets

    try:
        return [(p["title"], p["name"]) for p in list_presets()]
    except PlaygroundError:
        return []


def preset_page(name: str) -> dict[str, Any]:
    """A preset as page values: model, prompt, seed, max new tokens, lane configs, title."""
    from playground.presets import load_preset

    p = load_preset(name)
    return {"name": p["name"], "title": p["title"], "description": p.get("description", ""),
            "model": p["model"], "prompt": p["prompt"], "seed": int(p["seed"]),
            "max_new_tokens": int(p["max_new_tokens"]),
            "policy": p.get("policy", "forwards"),
            "lanes": [LaneConfig.from_dict(lane) for lane in p["lanes"]][:MAX_LANES]}


# ---------------------------------------------------------------------- sessions
def session_settings(model: str, seed: int, max_new_tokens: int, policy: str, metric: str,
                     lanes: list[LaneConfig], preset: str | None = None) -> dict[str, Any]:
    """The settings stored with a session (what the page needs to show it again)."""
    return {"seed": int(seed), "max_new_tokens": int(max_new_tokens), "policy": policy, "metric": metric,
            "preset": preset or None, "lanes": [c.to_dict() for c in lanes], "page_model": model}


def session_title(lanes: list[LaneConfig], preset_title: str | None = None) -> str:
    """A title for an automatic save: the preset's, or the decoders side by side."""
    return preset_title or " vs ".join(c.decoder for c in lanes)  # the list shows the decoders anyway


def session_page(session: dict[str, Any]) -> dict[str, Any]:
    """A stored session as page values (lane configs recovered from settings or traces)."""
    settings = session.get("settings") if isinstance(session.get("settings"), dict) else {}
    runs = session.get("runs") or []
    lanes_raw = settings.get("lanes") if isinstance(settings.get("lanes"), list) else None
    if lanes_raw and len(lanes_raw) == len(runs):
        lanes = [LaneConfig.from_dict(x if isinstance(x, dict) else {}) for x in lanes_raw]
    else:
        lanes = [LaneConfig(decoder=str(t.get("decoder", "")), params=dict(t.get("params") or {}),
                            draft=t.get("draft"), model=None if t.get("model") == session.get("model") else t.get("model"))
                 for t in runs]
    first = runs[0] if runs else {}
    return {"title": session.get("title", ""), "model": settings.get("page_model") or session.get("model", ""),
            "prompt": session.get("prompt", ""), "seed": _int(settings.get("seed"), _int(first.get("seed"), 0)),
            "max_new_tokens": _int(settings.get("max_new_tokens"), max(1, _int((first.get("stats") or {}).get("new_tokens"), 48))),
            "policy": settings.get("policy") if settings.get("policy") in ("forwards", "steps", "free") else "forwards",
            "metric": settings.get("metric") if settings.get("metric") in dict(METRIC_CHOICES).values() else "auto",
            "lanes": lanes[:MAX_LANES], "runs": list(runs)[:MAX_LANES]}


def _int(x: Any, default: int) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------- display
def auto_metric(trace: dict[str, Any], metric: str) -> str:
    """The colouring for a lane: the chosen one, or under ``auto`` the one its steps suit."""
    if metric != "auto":
        return metric
    kinds = {s.get("kind") for s in (trace.get("steps") or []) if isinstance(s, dict)}
    if "denoise" in kinds:
        return "unmask_step"
    if "draft" in kinds or "jacobi" in kinds:
        return "acceptance"
    return "probability"


def share_url(root: str, sid: str) -> str:
    """The share link of session ``sid`` on the app at ``root``."""
    return f"{root.rstrip('/')}/?session={sid}"
