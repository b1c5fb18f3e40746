"""The Watermark tab: is this text watermarked with these settings?

The page's face of ``playground watermark-detect``: :func:`decoders.guided.watermark.detect_text`
scores the text, and the lane views of ``visualizers/watermark.py`` colour its tokens green/red
and draw the running z-score (the detection is handed to them as a trace-shaped dict). The
settings are the ``watermark`` decoder's knobs, under their names, defaults and ranges; the
text, prompt, model and settings can be taken from a lane of the Compare tab.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

import playground.ui.rules as st
from decoders.base import get_decoder
from decoders.guided.watermark import detect_ids, detect_text
from playground import inputs
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.hosting import model_event_settings
from playground.ui.compare import ComparePage
from playground.ui.html import status_html
from playground.ui.layout import model_choices
from playground.ui.updates import is_cleared
from playground.watermark_cli import summary
from visualizers.watermark import watermark_tokens_html, watermark_z_figure


DECODER = "watermark"
# The detector's settings: the decoder's knobs of the same names (delta only writes the mark).
KNOBS = ("watermark_gamma", "watermark_seeding", "watermark_key", "watermark_context_width")


def knob_specs() -> dict[str, Any]:
    """The ``watermark`` decoder's parameter specs of :data:`KNOBS` (defaults, ranges, help)."""
    params = get_decoder(DECODER).params
    return {name: params[name] for name in KNOBS}


def check_settings(gamma: Any, seeding: Any, key: Any, width: Any) -> dict[str, Any]:
    """The settings as the decoder would take them; a refused value is one line naming the knob."""
    specs = knob_specs()
    raw = dict(zip(KNOBS, (gamma, seeding, key.strip() if isinstance(key, str) else key, width)))
    for name, value in raw.items():
        if value is None or value == "":
            raise PlaygroundError(f"knob {name!r} is empty")
    return {name: specs[name].check(name, raw[name]) for name in KNOBS}


def detection_trace(res: dict[str, Any]) -> dict[str, Any]:
    """A detection result in the shape the watermark views read: one step per token with its
    ``watermark`` evidence (green or not, running z) and the tokens' display texts."""
    steps = [{"i": j, "committed": [int(t["id"])],
              "watermark": {"green": t["green"], "z": t["z"], "gamma": res["gamma"]}}
             for j, t in enumerate(res["tokens"])]
    return {"model": res.get("model"), "steps": steps,
            "tokens": {str(t["id"]): t.get("text", "") for t in res["tokens"]}}


def detect(model: str, text: str, prompt: str, gamma: Any, seeding: Any, key: Any, width: Any,
           lane: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check the settings, then detect (the tokenizer and config are all it loads; CPU green lists).

    ``lane`` is what *From lane* filled in (its text, prompt, model and token ids): while the
    boxes still hold exactly that, the lane's own token ids are scored, so the tab gives the
    lane's own z (re-encoding a sampled text can give other tokens, hence another z)."""
    inputs.text("the text", text, limits().max_detect_chars, optional=True)
    inputs.text("the prompt", prompt, limits().max_prompt_chars, optional=True)
    inputs.text("the model", model, 1000, optional=True)

    s = check_settings(gamma, seeding, key, width)
    model = (model or "").strip()
    if not model:
        raise PlaygroundError("choose the model whose tokenizer wrote the text")
    settings = {"gamma": s["watermark_gamma"], "key": s["watermark_key"], "seeding": s["watermark_seeding"],
                "context_width": s["watermark_context_width"], "device": "cpu"}
    if lane and lane.get("ids") and (lane.get("text"), lane.get("prompt"), lane.get("model")) == (text, prompt or "", model):
        res = detect_ids(model, lane["ids"], lane.get("prompt_ids") or (), **settings)
        for rec in res.get("tokens", []):  # the lane's own texts: a replay needs no tokenizer
            rec.setdefault("text", (lane.get("tokens") or {}).get(str(rec.get("id")), ""))
        return res
    return detect_text(model, text or "", prompt=prompt or "", **settings)


def lane_choices(traces: list[Any] | None) -> list[tuple[str, int]]:
    """The lane picker's choices: each lane of ``traces`` that ran under its present setup
    (numbered from 1 with its decoder), or lane 1 alone when there are none (*From lane* then
    says to run a comparison first)."""
    out = [(f"lane {j + 1} · {t.get('decoder') or '?'}", j + 1) for j, t in enumerate(traces or [])
           if isinstance(t, dict) and not is_cleared(t)]
    return out or [("lane 1", 1)]


class WatermarkView:
    """Builds the Watermark tab; ``page`` is the Compare page (its lanes prefill the text)."""

    def __init__(self, page: ComparePage) -> None:
        self.page = page

    def build(self) -> None:
        """Create the components (call inside the Watermark tab)."""
        specs = knob_specs()
        gr.Markdown("Check a text for the green-list watermark of the `watermark` decoder (Kirchenbauer et al. "
                    "2023, transformers-compatible). Use the settings the text was written with; text written "
                    "without the key scores z near 0.", elem_classes=["lane-info"])
        with gr.Row(equal_height=True):
            # the lanes the shown comparison has (none before a run): see lane_choices
            self.lane = gr.Dropdown(lane_choices([]), value=1, label="Compare lane", elem_id="wm-lane", scale=1)
            self.from_lane = gr.Button("Use this lane's output", elem_id="wm-from-lane", scale=1)
            self.model = gr.Dropdown(model_choices(), value=st.DEFAULT_MODEL, label="Model (its tokenizer)",
                                     allow_custom_value=True, elem_id="wm-model", scale=2)
        self.text = gr.Textbox(label="Text", lines=6, max_lines=16, elem_id="wm-text")
        self.prompt = gr.Textbox(label="Prompt it followed (optional: lets the first tokens be scored)",
                                 lines=1, max_lines=4, elem_id="wm-prompt")
        with gr.Row(equal_height=True):
            g, sd, k, w = (specs[n] for n in KNOBS)
            self.gamma = gr.Number(g.default, label="watermark_gamma", info=g.help, elem_id="wm-gamma")
            self.seeding = gr.Dropdown(list(sd.choices), value=sd.default, label="watermark_seeding",
                                       info=sd.help, elem_id="wm-seeding")
            # text, not a number box: a browser number loses digits of keys above 2**53
            self.key = gr.Textbox(str(k.default), label="watermark_key", info=k.help, max_lines=1,
                                  elem_id="wm-key")
            self.width = gr.Number(w.default, label="watermark_context_width", info=w.help, precision=0,
                                   elem_id="wm-context-width")
        self.detect_btn = gr.Button("Detect", variant="primary", elem_id="wm-detect")
        self.status = gr.HTML('<div class="lane-info">paste a text and press Detect</div>', elem_id="wm-status")
        self.tokens = gr.HTML("", elem_id="wm-tokens")
        self.z_plot = gr.Plot(elem_id="wm-z", show_label=False)
        self.lane_state = gr.State(None)  # what From lane filled in, with the lane's token ids

    def wire(self, demo: gr.Blocks) -> None:
        """Attach the events, hidden from the public API; Detect loads a tokenizer, so it takes
        its place in the model-work concurrency group."""
        # a finished run, an opened session or a lane setup change replaces the shown traces
        self.page.on_shown.add(self.on_lanes, [self.page.traces, self.lane], [self.lane])
        self.from_lane.click(self.on_from_lane, [self.page.traces, self.lane],
                             [self.text, self.prompt, self.model, self.gamma, self.seeding, self.key,
                              self.width, self.status, self.lane_state])
        self.detect_btn.click(self.on_detect, [self.model, self.text, self.prompt, self.gamma, self.seeding,
                                               self.key, self.width, self.lane_state],
                              [self.status, self.tokens, self.z_plot],
                              **model_event_settings())

    # ---------------------------------------------------------------- handlers
    def on_detect(self, model: str, text: str, prompt: str, gamma: Any, seeding: Any, key: Any,
                  width: Any, lane: dict[str, Any] | None = None) -> list[Any]:
        """Detect: the summary line, the tokens coloured green/red, the running z-score (of the
        lane's own tokens while the text is the one *From lane* filled in)."""
        try:
            res = detect(model, text, prompt, gamma, seeding, key, width, lane)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return [status_html(str(e), "error"), "", None]
        trace = detection_trace(res)
        kind = "ok" if res["prediction"] else "info"
        return [status_html(summary(res), kind), watermark_tokens_html(trace, None), watermark_z_figure(trace)]

    def on_lanes(self, traces: list[Any] | None, lane: Any) -> Any:
        """The lane picker offers the lanes of the comparison now shown (the pick kept if it
        still is one)."""
        choices = lane_choices(traces)
        keys = [k for _label, k in choices]
        return gr.update(choices=choices, value=lane if lane in keys else keys[0])

    def on_from_lane(self, traces: list[Any] | None, lane: Any) -> list[Any]:
        """Fill the text (and prompt, model, and a watermark lane's settings) from a Compare lane."""
        try:
            k = int(lane)
        except (TypeError, ValueError):
            k = 1
        runs = list(traces or [])
        tr = runs[k - 1] if 0 < k <= len(runs) else None
        if not isinstance(tr, dict) or not tr.get("text"):
            msg = f"lane {k} has no output yet: run a comparison in the Compare tab first"
            gr.Warning(msg)
            return [gr.skip()] * 7 + [status_html(msg, "error"), None]
        params = tr.get("params") or {}
        marked = tr.get("decoder") == DECODER
        settings = [params.get(n, gr.skip()) if marked else gr.skip() for n in KNOBS]
        if marked and "watermark_key" in params:
            settings[2] = str(params["watermark_key"])
        note = (f"Lane {k} ({tr.get('decoder')}): its output, prompt, model"
                + (" and watermark settings" if marked else "") + " — press Detect.")
        filled = {"text": tr["text"], "prompt": tr.get("prompt", ""), "model": tr.get("model"),
                  "ids": list(tr.get("output_ids") or []), "prompt_ids": list(tr.get("prompt_ids") or []),
                  "tokens": dict(tr.get("tokens") or {})}
        return [tr["text"], tr.get("prompt", ""), tr.get("model") or gr.skip(), *settings, status_html(note), filled]
