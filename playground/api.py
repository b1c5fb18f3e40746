"""The Python API, mirroring the CLI: ``playground.generate(...) -> dict``.

It also holds the request handling that the CLI (``playground compare``, ``list-decoders``)
and the app's ``gradio_client`` endpoints (``playground/ui/api_endpoints.py``) share, so the
three front doors read a comparison the same way: :func:`plan_compare` turns a preset and/or
explicit lanes plus overrides into a :class:`ComparePlan`, :func:`prepare_lanes` validates
every lane before any of them runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import playground.hosting as hosting
import playground.inputs as inputs
from decoders import all_decoders
from decoders.diffusion.fixed import fixed_text, parse_fixed
from playground.core.errors import PlaygroundError
from playground.core.models.chat import check_chat
from playground.core.settings import check_lanes, limits
from playground.engine import prepare
from playground.presets import load_preset
from playground.runner import POLICIES

DEFAULT_MODEL = "tiny-shakespeare"
DEFAULT_MAX_NEW_TOKENS = 64
LANE_FIELDS = ("decoder", "knobs", "draft", "model")
MAX_JSON_CHARS = 100_000  # knobs or lanes as JSON text: a few hundred characters in practice


def generate(model: str, decoder: str, prompt: str, max_new_tokens: int = 64, seed: int = 0,
             draft: str | None = None, stop: list[str] | None = None, chat: bool = False,
             force: Any = None, system_prompt: str | None = None, trust_remote_code: bool = False,
             watch: Any = None, hand: Any = None, **params: Any) -> dict[str, Any]:
    """Run one decoder and return its trace as a JSON-ready dict (the CLI's ``--json``).

    Models are loaded once and cached in the process. Knobs go in ``params`` by name, e.g.
    ``generate(model="tiny-shakespeare", decoder="top_p", prompt="ROMEO:", p=0.9)``.
    ``force=[[5, 1234]]`` makes the run emit token 1234 as its 6th generated token (a branch).
    ``chat=True`` (with an optional ``system_prompt``) sends the prompt through the model's chat
    template; ``trust_remote_code=True`` lets a model's own code run (LLaDA, Dream) where
    :func:`remote_code_allowed`. ``watch=["Romeo", "#42"]``: every token step records these
    tokens' probabilities (see ``playground/watch.py``). A diffusion decoder's ``fixed`` knob
    (infilling) may be given as ``{position: text}`` (``decoders/diffusion/fixed.py``).
    ``hand={"step": 3, "commit": [[5, 1234]]}`` makes a diffusion run commit token 1234 at
    position 5 at its step 3 and go on with its own rule (a canvas branch;
    ``decoders/diffusion/hand.py``). Bad input raises :class:`playground.PlaygroundError` with a one-line message.
    """
    if isinstance(params.get("fixed"), dict):  # knobs are JSON-shaped: the dict becomes its text form
        params["fixed"] = fixed_text(parse_fixed(params["fixed"]))
    run = prepare(model=model, decoder=decoder, prompt=prompt, max_new_tokens=max_new_tokens,
                  seed=seed, draft=draft, params=params, stop=stop, chat=chat, force=force,
                  system_prompt=system_prompt, trust_remote_code=trust_remote_code, watch=watch, hand=hand)
    return run.finish().to_dict()


def remote_code_allowed() -> bool:
    """Whether this instance lets a request opt in to a model's own code (``trust_remote_code``):
    the page shows its remote-code control only where this is true (see
    :func:`playground.hosting.remote_code_allowed`)."""
    return hosting.remote_code_allowed()


def list_decoders(family: str | None = None) -> list[dict[str, Any]]:
    """Every registered decoder's spec (name, family, kind, knobs with defaults, ranges and
    help, flags), optionally of one family: what ``playground list-decoders --json`` prints."""
    return [c.spec() for c in all_decoders() if family in (None, c.family)]


# ---------------------------------------------------------------------- comparisons
@dataclass(frozen=True)
class ComparePlan:
    """A comparison fully resolved: page settings and one entry per lane.

    Each lane is ``{"decoder", "params", "draft", "model", "max_new_tokens"}``; ``model`` and
    ``max_new_tokens`` are None where the lane takes the comparison's. ``chat`` and
    ``system_prompt`` apply to every lane alike (each lane's model uses its own template).
    """

    model: str
    prompt: str
    seed: int
    max_new_tokens: int
    policy: str
    lanes: tuple[dict[str, Any], ...]
    preset: str | None = None
    title: str | None = None
    chat: bool = False
    system_prompt: str | None = None

    def requests(self) -> list[dict[str, Any]]:
        """The keyword arguments of ``engine.prepare`` for each lane, in lane order."""
        return [{"model": lane["model"] or self.model, "decoder": lane["decoder"], "prompt": self.prompt,
                 "max_new_tokens": int(lane["max_new_tokens"] or self.max_new_tokens), "seed": self.seed,
                 "draft": lane["draft"], "params": dict(lane["params"]), "chat": self.chat,
                 "system_prompt": self.system_prompt} for lane in self.lanes]


def whole_number(name: str, value: Any) -> int:
    """``value`` as an int (an integral float or a numeric string is fine), else a one-line error."""
    if isinstance(value, bool):
        raise PlaygroundError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise PlaygroundError(f"{name} must be a whole number, got {value!r}") from None
    if not f.is_integer():
        raise PlaygroundError(f"{name} must be a whole number, got {value!r}")
    return int(f)


def json_value(name: str, value: Any) -> Any:
    """``value`` itself, or parsed when it is JSON text (clients may send either)."""
    if not isinstance(value, str):
        return inputs.json_shape(name, value)
    if len(value) > MAX_JSON_CHARS:
        raise PlaygroundError(f"{name} has {len(value)} characters of JSON; the limit is {MAX_JSON_CHARS}")
    if not value.strip():
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise PlaygroundError(f"{name} is not valid JSON: {e.msg} at character {e.pos}") from None
    except RecursionError:
        raise PlaygroundError(f"{name} nests deeper than {inputs.MAX_JSON_DEPTH} levels") from None
    return inputs.json_shape(name, parsed)


def knob_dict(name: str, value: Any) -> dict[str, Any]:
    """A knob mapping (``{"p": 0.9}``) from a dict, JSON text or None."""
    value = json_value(name, value)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PlaygroundError(f"{name} must be a JSON object of knob values, got {type(value).__name__}")
    return dict(value)


def parse_lanes(value: Any) -> list[dict[str, Any]]:
    """Lanes from a list (or its JSON text) of ``{"decoder", "knobs", "draft", "model"}`` or bare
    decoder names; presets' ``params`` is accepted for ``knobs``. Unknown fields are refused."""
    value = json_value("lanes", value)
    if not isinstance(value, list):
        raise PlaygroundError(f"lanes must be a list of lanes, got {type(value).__name__}")
    out = []
    for j, raw in enumerate(value, start=1):
        if isinstance(raw, str):
            raw = {"decoder": raw}
        if not isinstance(raw, dict):
            raise PlaygroundError(f"lane {j} must be an object with a decoder, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(LANE_FIELDS) - {"params", "max_new_tokens"})
        if unknown:
            raise PlaygroundError(f"lane {j} has unknown field(s) {', '.join(map(repr, unknown))}; "
                                  f"use {', '.join(LANE_FIELDS)}")
        if "knobs" in raw and "params" in raw:
            raise PlaygroundError(f"lane {j} gives both knobs and params; use knobs")
        decoder = raw.get("decoder")
        if not isinstance(decoder, str) or not decoder.strip():
            raise PlaygroundError(f"lane {j} needs a decoder name")
        for key in ("draft", "model"):
            if raw.get(key) is not None and not isinstance(raw[key], str):
                raise PlaygroundError(f"lane {j}: {key} must be a model name, got {raw[key]!r}")
        mnt = raw.get("max_new_tokens")
        out.append({"decoder": decoder.strip(),
                    "params": knob_dict(f"lane {j} knobs", raw.get("knobs", raw.get("params"))),
                    "draft": raw.get("draft") or None, "model": raw.get("model") or None,
                    "max_new_tokens": None if mnt in (None, "") else whole_number(f"lane {j} max_new_tokens", mnt)})
    return out


def plan_compare(preset: str | dict[str, Any] | None = None, lanes: Any = None, *, model: str | None = None,
                 prompt: str | None = None, seed: Any = None, max_new_tokens: Any = None,
                 policy: str | None = None, chat: bool | None = None,
                 system_prompt: str | None = None) -> ComparePlan:
    """Resolve a comparison: a preset (name or dict) and/or lanes, with overrides.

    Given lanes replace the preset's; model, prompt, seed, max new tokens and the lockstep
    policy come from the arguments, else the preset, else the defaults (the bundled model,
    seed 0, 64 tokens, equal compute). A max new tokens given here wins over a lane's own.
    ``chat``/``system_prompt`` (or the preset's) put the prompt through each lane's chat
    template; a system prompt without chat is refused.
    Checks the lane count against this instance's limit and the policy name; everything
    else (knobs, models, prompt, token limits) is checked per lane by :func:`prepare_lanes`.
    """

    if preset in (None, "") and lanes in (None, "", []):
        raise PlaygroundError("a comparison needs a preset or lanes")
    if model is not None:
        inputs.text("model", model, 1000)
    if prompt is not None:
        inputs.text("the prompt", prompt, limits().max_prompt_chars)
    if policy is not None:
        inputs.text("policy", policy, 40)
    p: dict[str, Any] = {}
    if isinstance(preset, dict):
        p = dict(preset)
    elif preset not in (None, ""):
        if not isinstance(preset, str):
            raise PlaygroundError(f"preset must be a preset name, got {preset!r}")
        p = load_preset(preset)
    chosen = parse_lanes(lanes if lanes not in (None, "", []) else p.get("lanes") or [])
    check_lanes(len(chosen))
    pol = policy or p.get("policy") or "forwards"
    if pol not in POLICIES:
        raise PlaygroundError(f"unknown lockstep policy {pol!r}; use one of {', '.join(POLICIES)}")
    if max_new_tokens not in (None, ""):
        mnt = whole_number("max_new_tokens", max_new_tokens)
        chosen = [{**lane, "max_new_tokens": None} for lane in chosen]
    else:
        mnt = whole_number("max_new_tokens", p.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    text = prompt if prompt is not None else p.get("prompt", "")
    if not isinstance(text, str):
        raise PlaygroundError(f"the prompt must be text, got {type(text).__name__}")
    use_chat, system = check_chat(p.get("chat", False) if chat is None else chat,
                              p.get("system_prompt") if system_prompt is None else system_prompt)
    return ComparePlan(model=model or p.get("model") or DEFAULT_MODEL, prompt=text, chat=use_chat,
                       system_prompt=system,
                       seed=inputs.seed(p.get("seed", 0) if seed in (None, "") else seed),
                       max_new_tokens=mnt, policy=pol, lanes=tuple(chosen),
                       preset=p.get("name") if p else None, title=p.get("title") if p else None)


def prepare_lanes(plan: ComparePlan, load_kwargs: dict[str, Any] | None = None, watch: Any = None) -> list[Any]:
    """Prepare every lane's :class:`~playground.engine.Run`, refusing the whole comparison
    with ``lane N: <reason>`` at the first lane that cannot run (nothing has run yet).
    ``watch``: the tokens every lane watches (as :func:`generate`)."""
    runs = []
    for j, req in enumerate(plan.requests(), start=1):
        try:
            runs.append(prepare(**req, load_kwargs=load_kwargs, watch=watch))
        except PlaygroundError as e:
            raise PlaygroundError(f"lane {j} ({req['decoder']}): {e}") from None
    return runs


def compare(preset: str | dict[str, Any] | None = None, lanes: Any = None, *, model: str | None = None,
            prompt: str | None = None, seed: int | None = None, max_new_tokens: int | None = None,
            policy: str | None = None, chat: bool | None = None, system_prompt: str | None = None,
            trust_remote_code: bool = False, watch: Any = None) -> list[dict[str, Any]]:
    """Run every lane of a comparison (a preset name or dict, and/or lanes) and return their
    traces; arguments as :func:`plan_compare`, and ``trust_remote_code``/``watch`` as :func:`generate`.
    Lanes run one after another; each lane's output does not depend on the others, so it
    equals the page's lockstep race."""
    plan = plan_compare(preset, lanes, model=model, prompt=prompt, seed=seed, max_new_tokens=max_new_tokens,
                        policy=policy, chat=chat, system_prompt=system_prompt)
    if not isinstance(trust_remote_code, bool):
        raise PlaygroundError(f"trust_remote_code must be true or false, got {trust_remote_code!r}")
    load = {"trust_remote_code": True} if trust_remote_code else None
    return [run.finish().to_dict() for run in prepare_lanes(plan, load_kwargs=load, watch=watch)]
