"""The inspector's Explain panel: which earlier tokens made the model pick this one?

Click a token (or scrub) to pick a lane and step; *Explain* attributes the token that step
committed to its context — the prompt and the tokens generated before it — by integrated
gradients or gradient × input (:mod:`playground.attribution`), optionally "rather than" another
token of the step's top-K, and draws the result as a heatmap over the text
(:func:`visualizers.attribution.attribution_html`). A result is kept with the stored session
(``settings.explanations``, :meth:`playground.store.Store.add_explanation`) when this browser
made it, so a replay — also on an instance that loads no models — shows it without the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import gradio as gr

from playground import engine
from playground.attribution import METHODS, attribute
from playground.branching import token_choices
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.hosting import gpu, model_event_settings
from playground.ownership import one_user, owner_id
from playground.store import default_store
from playground.ui.events import clicked_token, nothing_is_skip
from playground.ui.html import esc, one_line, status_html
from playground.ui.layout import Layout
from visualizers.attribution import attribution_html

log = logging.getLogger(__name__)

METHOD_CHOICES = [("integrated gradients (32 steps)", "integrated_gradients"), ("gradient × input", "gradient_x_input")]
IG_STEPS = 32
MAX_CONTEXT = 1024  # context tokens one explanation attributes (each costs IG_STEPS forward+backward passes)
HINT = "Click a token in any lane (or scrub) to pick the lane and step to explain."


@dataclass
class Pick:
    """What the panel would explain: a lane (0-based) and its step, or why it cannot."""

    lane: int
    step: int
    problem: str = ""


def pick(traces: list[dict[str, Any]] | None, lane: Any, step: Any) -> Pick:
    """The lane and step to explain: the scrubber's step clamped to the lane's last, with a
    one-line ``problem`` when there is nothing a causal attribution can read."""
    traces = list(traces or [])
    j, s = _int(lane, 0), max(0, _int(step, 0))
    if not traces:
        return Pick(j, s, "nothing to explain yet: run a comparison (or open a session) and let it end")
    if not 0 <= j < len(traces):
        return Pick(j, s, f"the comparison has no lane {j + 1}")
    steps = traces[j].get("steps") or []
    if not steps:
        return Pick(j, s, f"lane {j + 1} made no step")
    s = min(s, len(steps) - 1)
    if any(isinstance(x, dict) and x.get("kind") == "denoise" for x in steps):
        return Pick(j, s, f"lane {j + 1} is a diffusion lane: attribution reads a causal model's context")
    if not steps[s].get("committed"):
        return Pick(j, s, f"lane {j + 1}'s step {s} committed no token")
    return Pick(j, s)


def explanation_key(lane: int, step: int, method: str, contrast: int | None) -> str:
    """Where a result is kept in ``settings.explanations``."""
    return f"{lane}:{step}:{method}:{'-' if contrast is None else contrast}"


def token_label(trace: dict[str, Any], tid: int | None) -> str:
    """A token's text from the trace's own token map (``#id`` when it has none)."""
    return "" if tid is None else (trace.get("tokens") or {}).get(str(tid), f"#{tid}")


class ExplainPanel:
    """The Explain controls of the Compare page's inspector and their handlers."""

    def __init__(self, ui: Layout) -> None:
        self.ui = ui

    # ================================================================== components
    def build(self) -> None:
        """Create the panel (inside the page's inspector section, under the branch panel)."""
        with gr.Accordion("Explain: which earlier tokens made the model pick this one?", open=False,
                          elem_id="explain-panel", elem_classes=["branch-panel"]) as acc:
            self.accordion = acc
            self.where = gr.HTML(f'<div class="branch-where">{esc(HINT)}</div>', elem_id="explain-where")
            with gr.Row(equal_height=True):
                self.lane = gr.Dropdown([(f"Lane {k}", k - 1) for k in range(1, self.ui.max_lanes + 1)], value=0,
                                        label="Lane", elem_id="explain-lane", scale=1, min_width=140)
                self.contrast = gr.Dropdown([], value=None, label="…rather than (optional): the step's top-K",
                                            elem_id="explain-contrast", scale=3, min_width=220)
                self.method = gr.Radio(METHOD_CHOICES, value="integrated_gradients", label="Method",
                                       elem_id="explain-method", scale=2, min_width=220)
                self.button = gr.Button("Explain", variant="primary", elem_id="explain-run", scale=1, min_width=110)
            self.status = gr.HTML("", elem_id="explain-status")
            self.result = gr.HTML("", elem_id="explain-result")

    def pick_outputs(self) -> list[Any]:
        """What picking a lane and step rewrites (the previous result goes: it was another token's)."""
        return [self.where, self.lane, self.contrast, self.result, self.status]

    # ================================================================== events
    def wire(self, demo: gr.Blocks) -> None:
        """Attach token clicks, scrubbing, the lane picker and Explain."""
        page = self.ui
        for ui in page.lanes:
            ui.output.click(nothing_is_skip(self.on_click), [page.traces, self.lane], self.pick_outputs(),
                            show_progress="hidden")
        for trigger in (page.step.input, self.lane.input):
            trigger(self.on_pick, [page.traces, self.lane, page.step], self.pick_outputs(),
                    show_progress="hidden", trigger_mode="always_last")
        page.on_shown.add(self.on_pick, [page.traces, self.lane, page.step], self.pick_outputs())
        self.button.click(self.on_pressed, None, [self.status, self.button], queue=False, show_progress="hidden") \
            .then(self.on_explain, [page.sid, page.traces, self.lane, page.step, self.contrast, self.method,
                                    page.owner_key],
                  [self.result, self.status, self.button], show_progress="hidden", **model_event_settings())

    # ================================================================== handlers
    def on_pick(self, traces: list[dict[str, Any]] | None, lane: Any, step: Any) -> dict[Any, Any]:
        """Say which token Explain would explain, and offer its step's top-K to contrast with."""
        p = pick(traces, lane, step)
        traces = list(traces or [])
        lanes = [(f"Lane {j + 1} · {t.get('decoder') or '?'}", j) for j, t in enumerate(traces[: self.ui.max_lanes])]
        up: dict[Any, Any] = {self.lane: gr.update(choices=lanes or None, value=p.lane) if lanes else gr.update(),
                              self.result: "", self.status: ""}
        if p.problem:
            up[self.where] = f'<div class="branch-where branch-blocked">{esc(p.problem)}</div>'
            up[self.contrast] = gr.update(choices=[], value=None)
            return up
        trace = traces[p.lane]
        tid = int(trace["steps"][p.step]["committed"][0])
        up[self.where] = (f'<div class="branch-where" data-lane="{p.lane}" data-step="{p.step}">Lane {p.lane + 1} · '
                          f'{esc(trace.get("decoder") or "?")}, step {p.step} committed '
                          f'<code>{esc(repr(token_label(trace, tid)))}</code>. Which earlier tokens drove it?</div>')
        up[self.contrast] = gr.update(choices=token_choices(trace, p.step), value=None)
        return up

    def on_click(self, traces: list[dict[str, Any]] | None, lane: Any, evt: gr.EventData) -> dict[Any, Any]:
        """A token was clicked: explain its lane and step."""
        hit = clicked_token(evt)
        if hit is None:
            return {}
        clicked, step = hit
        return self.on_pick(traces, lane if clicked is None else clicked, step)

    def on_pressed(self) -> dict[Any, Any]:
        """Explain was pressed: say so at once and hold the button until the result is shown."""
        return {self.status: status_html("Explaining… (gradients through the lane's model)"),
                self.button: gr.update(interactive=False)}

    def on_explain(self, sid: Any, traces: list[dict[str, Any]] | None, lane: Any, step: Any, contrast: Any,
                   method: Any, owner_key: Any = None) -> dict[Any, Any]:
        """The attribution of the picked token: the stored one when the session keeps it, else
        computed with the lane's model (and kept where this browser may change the session)."""
        done = {self.button: gr.update(interactive=True)}
        try:
            res, note = self.explanation(sid, list(traces or []), lane, step, contrast, method, owner_key)
        except PlaygroundError as e:
            return {self.result: "", self.status: status_html(one_line(str(e)), "error"), **done}
        except Exception as e:  # noqa: BLE001 - a bug is one line in the page; the log has the traceback
            log.exception("explain failed")
            return {self.result: "", self.status: status_html(one_line(f"explain failed: {type(e).__name__}: {e}"),
                                                               "error"), **done}
        return {self.result: attribution_html(res), self.status: status_html(note, "ok"), **done}

    def explanation(self, sid: Any, traces: list[dict[str, Any]], lane: Any, step: Any, contrast: Any,
                    method: Any, owner_key: Any) -> tuple[dict[str, Any], str]:
        """(result, status line) for Explain; PlaygroundError (one line) when it cannot be."""
        p = pick(traces, lane, step)
        if p.problem:
            raise PlaygroundError(p.problem)
        if method not in METHODS:
            raise PlaygroundError(f"unknown attribution method {method!r}; use one of {', '.join(METHODS)}")
        trace = traces[p.lane]
        offered = {tid for _label, tid in token_choices(trace, p.step)}
        if contrast in (None, ""):
            other = None
        elif isinstance(contrast, int) and not isinstance(contrast, bool) and contrast in offered:
            other = contrast
        else:
            raise PlaygroundError("contrast with a token of the step's top-K (or none)")
        key = explanation_key(p.lane, p.step, str(method), other)
        store = default_store()
        if sid:
            try:
                kept = (store.load_session(str(sid)).get("settings") or {}).get("explanations") or {}
            except PlaygroundError:
                kept = {}
            if isinstance(kept, dict) and isinstance(kept.get(key), dict):
                return kept[key], "Stored with the session (no model needed)."
        if limits().no_models:
            raise PlaygroundError("Explain runs the lane's model (gradients), and model loading is disabled on "
                                  "this instance (replay only); only explanations stored with the session show here")
        context = len(trace.get("prompt_ids") or []) + sum(len(s.get("committed") or []) for s in trace["steps"][: p.step])
        if context > MAX_CONTEXT:
            raise PlaygroundError(f"the context is {context} tokens; Explain attributes at most {MAX_CONTEXT}")
        res = explain_run(trace, p.step, other, str(method))
        res.update(lane=p.lane, prompt_tokens=len(trace.get("prompt_ids") or []),
                   target_text=token_label(trace, res["target"]), contrast_text=token_label(trace, other))
        if not sid:
            return res, "Computed (not stored: this comparison is not saved)."
        owner = owner_id(owner_key)
        if owner is None and not one_user():
            return res, "Computed, not stored: this browser sent no owner key."
        try:
            store.add_explanation(str(sid), key, res, owned_by=None if one_user() else owner)
        except PlaygroundError as e:
            return res, f"Computed, not stored with the session: {e}."
        return res, "Computed and stored with the session: its link replays it."


def _explain_impl(trace: dict[str, Any], step: int, contrast: int | None, method: str) -> dict[str, Any]:
    """The attribution with the lane's model, from the engine's model cache."""
    handle = engine.load_model(str(trace.get("model") or ""))
    return attribute(trace, step, None, contrast, method, IG_STEPS, handle)


# ZeroGPU wants its functions decorated when the app starts, not per request.
explain_run = gpu(_explain_impl)


def _int(x: Any, default: int) -> int:
    try:
        return int(x)
    except (TypeError, ValueError, OverflowError):
        return default


__all__ = ["ExplainPanel", "MAX_CONTEXT", "explanation_key", "pick"]
