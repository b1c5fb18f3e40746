"""The Compare page's rules, as plain data: decoder specs, lane configs, presets, sessions.

Nothing here imports Gradio, so the rules behind the page (which widget a knob becomes,
which lanes a preset fills, what a stored session's settings look like, which metric suits
a trace) are unit-tested without a browser.
"""

from __future__ import annotations

import dataclasses
import html
import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import visualizers
from decoders import all_decoders
from decoders.base import get_decoder
from playground import policies
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.presets import list_presets, load_preset
from playground.ui.model_options import check_remote_code
from playground.watch import watch_text


MAX_LANES = 6
MIN_LANES = 2
SAME_MODEL = "(page model)"
NO_DRAFT = "(none)"
DEFAULT_MODEL = "tiny-shakespeare"
DEFAULT_DRAFT = "tiny-shakespeare-draft"
DEFAULT_DIFFUSION = "tiny-shakespeare-diffusion"
# The names alone (the dropdown's info says what each equalises): a label with its explanation
# was cut off by the box at every page width.
POLICY_CHOICES = [(policies.LABELS[name], name) for name in policies.NAMES]
METRIC_CHOICES = [("auto", "auto"), ("probability", "probability"), ("entropy", "entropy"),
                  ("draft acceptance", "acceptance"), ("unmasking / commit step", "unmask_step"),
                  ("watermark green / red", "watermark"), ("none", "none")]
EXAMPLE_PROMPTS = [
    "Romeo.\nBut soft! what light through yonder window breaks?\n",
    "KING HENRY.\nOnce more unto the breach, dear friends, once more,\n",
    "Ham.\nTo be, or not to be,--that is the question:--\n",
    "FIRST CITIZEN.\nBefore we proceed any further, hear me speak.\n",
    "Juliet.\nO Romeo, Romeo! wherefore art thou Romeo?\n",
    "MACBETH.\nIs this a dagger which I see before me,\n",
]


# ---------------------------------------------------------------------- decoders
def decoder_specs() -> dict[str, dict[str, Any]]:
    """Every registered decoder's spec (``Decoder.spec()``), by name."""
    return {c.name: c.spec() for c in all_decoders()}


def decoder_choices() -> list[tuple[str, str]]:
    """(label, name) for the decoder pickers, grouped by family."""
    return [(f"{s['family']} · {name}" + (" (needs draft)" if s["needs_draft"] else ""), name)
            for name, s in decoder_specs().items()]


def decoder_spec(name: str | None) -> dict[str, Any] | None:
    """The spec of decoder ``name``, or None if no such decoder is registered."""
    return decoder_specs().get(name or "")


def knob_summary(name: str | None, knobs: dict[str, Any] | None) -> str:
    """The knobs that differ from their defaults, as ``k=20 · temperature=0.7`` (what the run
    uses: knobs of a decoder picked before are not listed, a refused value is marked)."""
    s = decoder_spec(name)
    if s is None or not knobs:
        return ""
    parts = []
    for k, spec in s["params"].items():
        if k in knobs and knobs[k] != spec["default"]:
            # a value the run would refuse is listed as such, never as if it were used
            bad = knob_error(str(name), k, knobs[k])
            parts.append(_knob_text(k, knobs[k]) + (" (refused)" if bad else ""))
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
    return html.escape(str(text)).replace("*", "\\*").replace("_", "\\_").replace("`", "\\`")


@dataclass(frozen=True)
class KnobWidget:
    """Which Gradio control a knob becomes, and its arguments."""

    widget: str  # slider | number | checkbox | dropdown | textbox
    kwargs: dict[str, Any] = field(default_factory=dict)


def knob_widget(name: str, spec: dict[str, Any], value: Any = None) -> KnobWidget:
    """Map one knob's spec (type, default, min/max/choices, help) to a control.

    Numbers are plain number boxes with the range in their help line, and no minimum,
    maximum or precision: Gradio's slider clamps a typed value when the box loses focus and
    its number box rounds or raises on its own, so the value shown would not be the value
    sent. The page checks what was typed (:func:`check_knobs`) and says why it is refused.
    """
    typ = spec.get("type")
    val = spec.get("default") if value is None else value
    info = knob_info(spec)
    common = {"label": name, "info": info or None}
    if typ == "bool":
        return KnobWidget("checkbox", {**common, "value": bool(val)})
    if typ == "choice":
        return KnobWidget("dropdown", {**common, "choices": list(spec.get("choices") or []), "value": val})
    if typ in ("int", "float"):
        shown = val if isinstance(val, (int, float)) and not isinstance(val, bool) else None
        step = 1 if typ == "int" else _float_step(spec.get("min"), spec.get("max"))
        return KnobWidget("number", {**common, "value": shown, "step": step})
    return KnobWidget("textbox", {**common, "value": "" if val is None else str(val)})


def knob_info(spec: dict[str, Any], error: str | None = None) -> str:
    """A knob control's help line: its help text and range, or the refusal of its value."""
    if error:
        return f"⚠ {error}"
    help_ = str(spec.get("help") or "")
    if spec.get("type") in ("int", "float"):
        rng = knob_range(spec)
        return f"{help_} · {rng}" if help_ else rng
    return help_


def _float_step(lo: Any, hi: Any) -> float:
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi)):
        return 0.01
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


def knob_range(spec: dict[str, Any]) -> str:
    """What a knob accepts, for messages: ``[0, 1]``, ``one of: a, b``, ``true or false``."""
    typ = spec.get("type")
    if typ in ("int", "float"):
        lo, hi = spec.get("min"), spec.get("max")
        fmt = (lambda x: f"{int(x)}") if typ == "int" else (lambda x: f"{x:g}")
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
            return f"[{fmt(lo)}, {fmt(hi)}]"
        return "an integer" if typ == "int" else "a number"
    if typ == "choice":
        return "one of: " + ", ".join(str(c) for c in spec.get("choices") or [])
    if typ == "bool":
        return "true or false"
    if spec.get("items"):
        return "a comma list of: " + ", ".join(spec["items"])
    return "text"


def knob_error(decoder: str, name: str, value: Any) -> str | None:
    """Why ``value`` is refused for knob ``name`` of ``decoder`` (one line naming the knob and
    what it accepts), or None when the run would use exactly this value."""
    params = get_decoder(decoder).params
    if name not in params:
        return f"decoder {decoder!r} has no knob {name!r}"
    spec = params[name]
    allowed = knob_range(spec.to_dict())
    try:
        spec.check(name, value)
    except PlaygroundError as e:
        msg = str(e)
        # The spec's own messages name the range for out-of-range values, not for wrong types.
        return msg if allowed in msg else f"{msg}; allowed: {allowed}"
    except (ArithmeticError, ValueError):
        # Int.check and Float.check refuse inf and nan themselves (decoders/base.py); what still
        # escapes them is float() of an integer too large for a float (OverflowError).
        return f"knob {name!r} must be {'an integer' if spec.type == 'int' else 'a number'}, got {value!r}; " \
               f"allowed: {allowed}"
    return None


def check_knobs(decoder: str, knobs: dict[str, Any] | None, lane: int | None = None) -> dict[str, Any]:
    """The knob values a lane's controls hold, checked by the decoder's own spec
    (``Param.check``, as the CLI and the engine do) and converted to their types.

    A value is never clamped or replaced: a bad one raises a one-line PlaygroundError naming
    the lane, the knob and its range. Knobs the decoder does not have are dropped: they are
    left over from a decoder picked before and no control shows them.
    """
    where = f"lane {lane} ({decoder}): " if lane is not None else ""
    try:
        params = get_decoder(decoder).params
    except PlaygroundError as e:
        raise PlaygroundError(f"lane {lane}: {e}" if lane is not None else str(e)) from None
    out: dict[str, Any] = {}
    for k, v in (knobs or {}).items():
        if k not in params:
            continue
        err = knob_error(decoder, k, v)
        if err:
            raise PlaygroundError(where + err)
        out[k] = params[k].check(k, v)
    return out


def knob_errors(decoder: str, knobs: dict[str, Any] | None) -> dict[str, str]:
    """Every refused knob of ``decoder`` in ``knobs`` with its message (empty when all pass)."""
    s = decoder_spec(decoder)
    if s is None:
        return {}
    return {k: e for k, v in (knobs or {}).items() if k in s["params"] and (e := knob_error(decoder, k, v))}


def coerce_knobs(decoder: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Knob values as the page holds them (sliders give floats for ints) in their types;
    unknown knobs are dropped (they belong to the decoder picked before).

    Never raises and never clamps: a value the spec refuses is kept as given, so the lane's
    check (:func:`check_lane`, before anything loads) refuses it with its message.
    """
    if decoder_spec(decoder) is None:
        return dict(knobs or {})
    params = get_decoder(decoder).params
    out: dict[str, Any] = {}
    for k, v in (knobs or {}).items():
        if k not in params:
            continue
        out[k] = v if knob_error(decoder, k, v) else params[k].check(k, v)
    return out


# ---------------------------------------------------------------------- lanes
@dataclass
class LaneConfig:
    """One lane as the page holds it.

    ``chat``, ``system_prompt`` and ``trust_remote_code`` are the page's model options
    (:mod:`playground.ui.model_options`), the same in every lane; they are stored once per
    session (:func:`session_settings`), not per lane, so :meth:`to_dict` leaves them out.
    """

    decoder: str = "greedy"
    params: dict[str, Any] = field(default_factory=dict)
    draft: str | None = None
    model: str | None = None  # None: the page's model
    chat: bool = False
    system_prompt: str | None = None
    trust_remote_code: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON form of the lane itself (as stored in session settings and presets)."""
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


def model_kind(name: str | None) -> str | None:
    """``causal``/``diffusion`` for the bundled models, None for any other (unknown until loaded)."""
    if name == DEFAULT_DIFFUSION:
        return "diffusion"
    if name in (DEFAULT_MODEL, DEFAULT_DRAFT):
        return "causal"
    return None


def lane_model_for(decoder: str, page_model: str, lane_model: str | None) -> str | None:
    """The model a lane should use when its decoder is picked.

    A diffusion decoder on a causal page model (or the reverse) gets the matching bundled
    model, so picking ``llada`` next to ``greedy`` works without a second click.
    """
    s = decoder_spec(decoder)
    if s is None:
        return lane_model
    page_kind = model_kind(page_model)
    if page_kind is None or s["kind"] == page_kind:
        return None if lane_model in (None, page_model) else lane_model
    return DEFAULT_DIFFUSION if s["kind"] == "diffusion" else DEFAULT_MODEL


# The decoder a new lane starts with, by the kind of model it will run on.
FIRST_DECODER = {"causal": ("greedy",), "diffusion": ("llada", "masked_diffusion", "fast_dllm")}


def decoder_for_kind(kind: str | None) -> str:
    """A decoder that runs on a model of ``kind`` (greedy when the kind is unknown)."""
    specs = decoder_specs()
    for name in FIRST_DECODER.get(kind or "causal", ()):
        if name in specs:
            return name
    return next((n for n, s in specs.items() if s["kind"] == kind), "greedy")


def new_lane(page_model: str, page_kind: str | None = None) -> LaneConfig:
    """The lane "+ Lane" adds: a decoder the page's model can run, at its default knobs.

    ``page_kind`` is the loaded model's kind when the page knows it; bundled models are
    known by name, so a lane added to a diffusion preset gets a diffusion decoder.
    """
    dec = decoder_for_kind(page_kind or model_kind(page_model) or "causal")
    return LaneConfig(decoder=dec, params=default_knobs(dec),
                      draft=DEFAULT_DRAFT if needs_draft(dec) else None)


def add_lane(n: int, max_lanes: int) -> tuple[int, str | None]:
    """The lane count after "+ Lane", and a note when the limit stopped it."""
    n = int(n or 0)
    if n >= max_lanes:
        return max_lanes, f"{max_lanes} lanes is the most this page runs side by side"
    return n + 1, None


def remove_lane(n: int, min_lanes: int = MIN_LANES) -> tuple[int, str | None]:
    """The lane count after "− Lane", and a note when the limit stopped it."""
    n = int(n or 0)
    if n <= min_lanes:
        return max(n, min_lanes), f"a comparison needs at least {min_lanes} lanes"
    return n - 1, None


def lane_buttons(n: int, max_lanes: int, min_lanes: int = MIN_LANES) -> tuple[bool, bool]:
    """Whether "+ Lane" and "− Lane" can do anything at ``n`` lanes."""
    return int(n or 0) < max_lanes, int(n or 0) > min_lanes


def check_lane(cfg: LaneConfig, lane: int | None = None) -> LaneConfig:
    """A lane as it will run: its decoder exists, its knobs are the ones shown (checked,
    never clamped, and together as the engine checks them) and a decoder that needs a draft has one picked. Messages name lane
    ``lane`` (1-based) when given."""
    head = f"lane {lane}: " if lane is not None else ""
    if not cfg.decoder or decoder_spec(cfg.decoder) is None:
        raise PlaygroundError(head + ("pick a decoder" if not cfg.decoder else f"unknown decoder {cfg.decoder!r}"))
    params = check_knobs(cfg.decoder, cfg.params, lane=lane)
    try:  # rules between knobs (num_beams a multiple of num_beam_groups): refused before the run
        get_decoder(cfg.decoder).params.validate(cfg.decoder, params)
    except PlaygroundError as e:
        raise PlaygroundError(head + str(e)) from None
    draft = (cfg.draft or "").strip() or None
    if draft == NO_DRAFT:
        draft = None
    if needs_draft(cfg.decoder) and draft is None:
        if lane is not None:
            raise PlaygroundError(f"lane {lane} ({cfg.decoder}): pick a draft model — this decoder needs one")
        raise PlaygroundError(f"pick a draft model — {cfg.decoder} needs one")
    return dataclasses.replace(cfg, params=params, draft=draft if needs_draft(cfg.decoder) else None)


def with_options(lanes: list[LaneConfig], chat: bool = False, system_prompt: str | None = None,
                 trust_remote_code: bool = False) -> list[LaneConfig]:
    """``lanes`` with the page's model options set alike in every one."""
    return [dataclasses.replace(c, chat=bool(chat), system_prompt=system_prompt if chat else None,
                                trust_remote_code=bool(trust_remote_code)) for c in lanes]


def lane_request(cfg: LaneConfig, page_model: str, prompt: str, seed: int, max_new_tokens: int,
                 lane: int | None = None, watch: list[int | str] | None = None) -> dict[str, Any]:
    """The keyword arguments of ``engine.prepare`` for one lane (checked by :func:`check_lane`),
    with the page's model options and the page's watched tokens (``watch``, items as
    :func:`playground.watch.watch_items` reads them). A model that needs its own code while the
    page did not opt in is refused here in one line that says to tick the opt-in (read from its
    local config, no load)."""
    cfg = check_lane(cfg, lane)
    model = cfg.model or page_model
    try:
        check_remote_code([model, cfg.draft], cfg.trust_remote_code)
    except PlaygroundError as e:
        raise PlaygroundError(f"lane {lane}: {e}" if lane is not None else str(e)) from None
    return {"model": model, "decoder": cfg.decoder, "prompt": prompt,
            "max_new_tokens": int(max_new_tokens), "seed": int(seed), "draft": cfg.draft,
            "params": dict(cfg.params), "chat": bool(cfg.chat),
            "system_prompt": cfg.system_prompt if cfg.chat else None,
            "trust_remote_code": bool(cfg.trust_remote_code), **({"watch": list(watch)} if watch else {})}


def _knob_text(name: str, v: Any) -> str:
    return f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}"


# ---------------------------------------------------------------------- budgets
def new_token_budget(context_length: int, prompt_tokens: int, limit: int | None = None) -> int:
    """How many new tokens a model's context leaves after the prompt (and the hosting limit)."""
    left = max(0, int(context_length) - int(prompt_tokens))
    return min(left, int(limit)) if limit is not None else left


def budget_note(model: str, context_length: int, prompt_tokens: int, limit: int | None = None) -> str:
    """The budget as the max-new-tokens control shows it."""
    b = new_token_budget(context_length, prompt_tokens, limit)
    why = f"{model}: context {context_length} − prompt {prompt_tokens} tokens"
    if limit is not None and b == limit and context_length - prompt_tokens > limit:
        why = f"this instance's limit; {why}"
    return f"up to {b} ({why})"


def check_budget(max_new_tokens: int, model: str, context_length: int, prompt_tokens: int,
                 limit: int | None = None) -> None:
    """Refuse ``max_new_tokens`` beyond what ``model``'s context leaves after the prompt."""
    b = new_token_budget(context_length, prompt_tokens, limit)
    if b < 1:
        raise PlaygroundError(f"the prompt ({prompt_tokens} tokens) fills the {context_length}-token context "
                              f"of {model!r}: shorten it")
    if int(max_new_tokens) > b:
        raise PlaygroundError(f"max new tokens {int(max_new_tokens)} is over the budget of {b}: {model!r} has a "
                              f"{context_length}-token context and the prompt takes {prompt_tokens}")


# What the page learnt about each model it loaded (under the name the page used), so the
# budget under max new tokens and the Run's check need no load of their own. A weak
# reference: an evicted model is not kept alive here; its budget is then unknown and the
# engine checks each lane as before.
_MODELS: "OrderedDict[str, tuple[weakref.ref, str]]" = OrderedDict()
_MODELS_MAX = 32


def remember_model(spec: str, handle: Any) -> None:
    """Note a loaded model (a ``ModelHandle``) under the name the page used for it."""
    _MODELS[spec] = (weakref.ref(handle), str(getattr(handle, "kind", "") or ""))
    _MODELS.move_to_end(spec)
    while len(_MODELS) > _MODELS_MAX:
        _MODELS.popitem(last=False)


def loaded_kind(spec: str) -> str | None:
    """``causal``/``diffusion`` of a model the page loaded or knows by name, else None."""
    hit = _MODELS.get(spec)
    return (hit[1] if hit else None) or model_kind(spec)


def page_budget(spec: str, prompt: str) -> dict[str, Any] | None:
    """``{"model", "prompt", "context", "prompt_tokens"}`` of a loaded model for ``prompt``;
    None when the model is not loaded (any more) or the prompt does not tokenise."""
    hit = _MODELS.get(spec)
    handle = hit[0]() if hit else None
    if handle is None or not (prompt or "").strip():
        return None
    try:
        n = len(handle.encode(prompt))
    except Exception:  # noqa: BLE001 - no budget then; the engine reports a bad prompt itself
        return None
    return {"model": spec, "prompt": prompt, "context": int(handle.context_length), "prompt_tokens": n}


def check_page(model: str, prompt: str, seed: Any, max_new_tokens: Any, lanes: list[LaneConfig],
               budget: dict[str, Any] | None = None) -> tuple[int, int]:
    """Page-level checks before anything loads; returns (seed, max_new_tokens) as ints.

    ``budget`` (``{"model", "prompt", "context", "prompt_tokens"}``, what the page learnt
    when the model loaded or the prompt changed) refuses a max new tokens the model's context
    cannot hold; a budget for another model or prompt is ignored (the engine checks again).
    Without one, the budget of the page's model if it has been loaded (:func:`page_budget`). Lanes are
    checked separately with :func:`check_lanes`.
    """
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
    if budget is None:
        budget = page_budget(model, prompt)
    if budget and budget.get("model") == model and budget.get("prompt") == prompt and budget.get("context"):
        check_budget(int(mnt), model, int(budget["context"]), int(budget.get("prompt_tokens") or 0))
    if not lanes:
        raise PlaygroundError("add at least one lane")
    if len(lanes) > lim.max_lanes:
        raise PlaygroundError(f"{len(lanes)} lanes is over this instance's limit of {lim.max_lanes}")
    return seed_i, int(mnt)


def check_lanes(lanes: list[LaneConfig]) -> tuple[list[LaneConfig], dict[int, str]]:
    """Every lane as it will run, and the refusal of each lane that cannot (1-based lane ->
    one-line message); a refused lane keeps its config as given."""
    out: list[LaneConfig] = []
    errors: dict[int, str] = {}
    for j, cfg in enumerate(lanes, start=1):
        try:
            out.append(check_lane(cfg, j))
        except PlaygroundError as e:
            errors[j] = str(e)
            out.append(cfg)
    return out, errors


# ---------------------------------------------------------------------- presets
def preset_choices() -> list[tuple[str, str]]:
    """(title, name) of every preset, for the preset picker."""
    try:
        return [(p["title"], p["name"]) for p in list_presets()]
    except PlaygroundError:
        return []


def preset_page(name: str) -> dict[str, Any]:
    """A preset as page values: model, prompt, seed, max new tokens, lane configs, title."""
    p = load_preset(name)
    # A preset may set chat and a system prompt (as api.plan_compare reads them), never the
    # remote-code opt-in: that stays the user's own choice.
    chat = bool(p.get("chat"))
    system = p.get("system_prompt") if isinstance(p.get("system_prompt"), str) and chat else None
    page = {"name": p["name"], "title": p["title"], "description": p.get("description", ""),
            "model": p["model"], "prompt": p["prompt"], "seed": int(p["seed"]),
            "max_new_tokens": int(p["max_new_tokens"]),
            "policy": p.get("policy", "forwards"), "chat": chat,
            "lanes": with_options([LaneConfig.from_dict(lane) for lane in p["lanes"]][:MAX_LANES], chat, system)}
    if "system_prompt" in p:
        page["system_prompt"] = system or ""
    return page


# ---------------------------------------------------------------------- sessions
def session_settings(model: str, seed: int, max_new_tokens: int, policy: str, metric: str,
                     lanes: list[LaneConfig], preset: str | None = None,
                     outcome: dict[str, Any] | None = None, watch: list[int | str] | None = None) -> dict[str, Any]:
    """The settings stored with a session (what the page needs to show it again): with chat
    on, ``chat`` and ``system_prompt`` too (the lanes' options, page-wide; the remote-code
    opt-in is not stored, so a replay never opts its viewer in to a model's code); with
    ``outcome`` (``playground.store.run_outcome``: stopped, failed lanes) that too, for the
    Sessions list's markers; with watched tokens, ``watch`` (the items as typed)."""
    out = {"seed": int(seed), "max_new_tokens": int(max_new_tokens), "policy": policy, "metric": metric,
           "preset": preset or None, "lanes": [c.to_dict() for c in lanes], "page_model": model}
    if outcome is not None:
        out["outcome"] = dict(outcome)
    if watch:
        out["watch"] = list(watch)
    chat = next((c for c in lanes if c.chat), None)
    if chat is not None:
        out["chat"] = True
        out["system_prompt"] = chat.system_prompt or None
    return out


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
    # Chat as stored with the settings; sessions saved without it (the API's) by their traces.
    if "chat" in settings:
        chat, system = bool(settings.get("chat")), settings.get("system_prompt")
    else:
        chat = any(isinstance(t, dict) and t.get("chat") is True for t in runs)
        system = next((t.get("system_prompt") for t in runs if isinstance(t, dict) and t.get("system_prompt")), None)
    system = system if chat and isinstance(system, str) and system.strip() else None
    lanes = with_options(lanes, chat, system)
    return {"chat": chat, "system_prompt": system or "", "watch": _stored_watch(settings, runs), "title": session.get("title", ""), "model": settings.get("page_model") or session.get("model", ""),
            "prompt": session.get("prompt", ""), "seed": _int(settings.get("seed"), _int(first.get("seed"), 0)),
            "max_new_tokens": _int(settings.get("max_new_tokens"), max(1, _int((first.get("stats") or {}).get("new_tokens"), 48))),
            "policy": settings.get("policy") if settings.get("policy") in dict(POLICY_CHOICES).values() else "forwards",
            "metric": settings.get("metric") if settings.get("metric") in dict(METRIC_CHOICES).values() else "auto",
            "lanes": lanes[:MAX_LANES], "runs": list(runs)[:MAX_LANES]}


def _stored_watch(settings: dict[str, Any], runs: list[Any]) -> str:
    """The watch field of a stored session: the items its settings keep, else (a session the
    API saved) the token ids its first trace watched."""
    if settings.get("watch"):
        return watch_text(settings["watch"])
    first = runs[0] if runs and isinstance(runs[0], dict) else {}
    entries = first.get("watch") if isinstance(first.get("watch"), list) else []
    return watch_text([e["token"] for e in entries if isinstance(e, dict) and isinstance(e.get("token"), int)])


def _int(x: Any, default: int) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------- inspector
ALIGN_CHOICES = [("by step (each lane's own steps)", "step"), ("by token position", "position")]


def aligned_steps(value: int, mode: str, step_counts: list[int], position_steps: list[list[int]]) -> list[int]:
    """The step each lane's inspector shows for scrubber ``value``.

    ``mode`` "step": ``value`` is a step index, the same in every lane (clamped to the lane's
    last step). ``mode`` "position": ``value`` is an output token position, and each lane
    shows the step that produced its token there (``position_steps[j][p]``), or its last
    step when its output is shorter — so lanes are compared at the same token, not at the
    same count of their own (differently sized) steps.
    """
    v = max(0, int(value or 0))
    out = []
    for j, n in enumerate(step_counts):
        if n <= 0:
            out.append(0)
            continue
        ps = position_steps[j] if mode == "position" and j < len(position_steps) else None
        if ps is None:
            s = v if mode != "position" else n - 1
        else:
            s = ps[v] if v < len(ps) else n - 1
        out.append(max(0, min(int(s), n - 1)))
    return out


def scrub_top(mode: str, step_counts: list[int], position_steps: list[list[int]]) -> int:
    """How many values the scrubber has: the most steps, or the longest output by position."""
    if mode == "position":
        return max((len(p) for p in position_steps), default=0)
    return max(step_counts, default=0)


def position_of_step(position_steps: list[int], step: int) -> int:
    """The first token position a lane's step produced (for a token click under position
    alignment); the last position before it when that step produced none."""
    best = 0
    for p, s in enumerate(position_steps):
        if s == step:
            return p
        if s < step:
            best = p
    return best


def focus_choices(n_lanes: int) -> list[tuple[str, int]]:
    """The inspector's focus picker: every lane side by side, or one lane at full width."""
    return [("all lanes", 0)] + [(f"Lane {k} only", k) for k in range(1, n_lanes + 1)]


# ---------------------------------------------------------------------- display
def auto_metric(trace: dict[str, Any], metric: str) -> str:
    """The colouring for a lane: the chosen one, or under ``auto`` the one its steps suit
    (declared by the visualizers that draw them, see :func:`visualizers.auto_metric`)."""
    return visualizers.auto_metric(trace, metric)


def share_url(root: str, sid: str) -> str:
    """The share link of session ``sid`` on the app at ``root``."""
    return f"{root.rstrip('/')}/?session={sid}"
