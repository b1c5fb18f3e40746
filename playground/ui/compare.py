"""The Compare page: decoders side by side, streaming, with the step inspector and sharing.

Element ids are a contract (ARCHITECTURE.md, "UI"): ``#model``, ``#prompt``, ``#seed``,
``#max-new-tokens``, ``#preset``, ``#run``, ``#stop``, ``#lane-<k>`` with
``#lane-<k>-decoder``, ``#lane-<k>-output`` and ``#lane-<k>-stats``, ``#step``, ``#share``,
``#share-link``.

How the page stays light: while a comparison runs, the Run handler (a generator) streams
each lane's coloured text and stats at the runner's rate (about 10 per second, each frame
only appending the new tokens), the comparison strip every few seconds and the per-lane
plots more rarely (:class:`PlotPacer` keeps drawing under about an eighth of the time); the
inspector redraws in full on scrubber moves and when the run ends. Lane knobs are rendered from the decoder's parameter spec with ``gr.render`` and kept
in one ``gr.State`` dict per lane.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterator

import gradio as gr

import visualizers
from playground.errors import PlaygroundError
from playground.ui import state as st

log = logging.getLogger(__name__)

STEP_SLOTS = 3  # most figures step_figures returns for one step kind
RUN_SLOTS = 4  # most figures run_figures returns for one trace
PLOT_EVERY_S = 1.0  # plot refresh period while streaming (text streams at the runner's rate)
STREAM_RATE = 10.0
DEFAULT_PRESETS = ("speculative-showdown", "greedy-beam-sampling")  # what a first visit shows

# Stop buttons reach the running generator through this registry (session hash -> runner):
# the Stop click is a separate event, possibly on another worker thread.
_RUNNERS: dict[str, Any] = {}
_RUNNERS_LOCK = threading.Lock()

TOKEN_CLICK_JS = """
element.addEventListener('click', (ev) => {
  const t = ev.target.closest('.tok[data-step]');
  if (!t || !element.contains(t)) return;
  const step = parseInt(t.dataset.step, 10);
  if (Number.isNaN(step)) return;
  trigger('click', {step: step, lane: parseInt(t.dataset.lane || '0', 10)});
});
"""

# Outline the tokens of the scrubbed step in every lane (client-side, no round trip).
HIGHLIGHT_JS = """
(s) => {
  const v = Number(s);
  document.querySelectorAll('.tok.cur-step').forEach((e) => e.classList.remove('cur-step'));
  if (Number.isFinite(v)) {
    document.querySelectorAll('.tok[data-step="' + String(Math.trunc(v)) + '"]').forEach((e) => e.classList.add('cur-step'));
  }
  return [];
}
"""


def _esc(text: Any) -> str:
    return html.escape(str(text))


def status_html(text: str, kind: str = "info") -> str:
    """The one-line status under the Run button (escaped)."""
    return f'<div class="pg-status pg-status-{kind}">{_esc(text)}</div>'


def error_html(message: str) -> str:
    """A lane's one-line error (escaped)."""
    return f'<div class="lane-error">⚠ {_esc(message)}</div>'


@dataclass
class LaneUI:
    """The components of one lane (controls, output) and of its inspector column."""

    k: int
    column: Any = None
    decoder: Any = None
    model: Any = None
    draft: Any = None
    info: Any = None
    knobs: Any = None  # gr.State dict
    nonce: Any = None  # gr.State: bumping it re-renders the knob controls
    output: Any = None
    legend: Any = None
    stats: Any = None
    insp_column: Any = None
    insp_header: Any = None
    step_html: Any = None
    step_plots: list[Any] = field(default_factory=list)
    run_html: Any = None
    run_plots: list[Any] = field(default_factory=list)


class ComparePage:
    """Builds the Compare tab inside an open ``gr.Blocks`` and wires its events."""

    def __init__(self) -> None:
        self.lanes: list[LaneUI] = []

    # ================================================================== layout
    def build(self) -> None:
        """Create the components (call inside ``with gr.Blocks()`` / a tab)."""
        from playground.settings import limits

        lim = limits()
        self.max_lanes = max(st.MIN_LANES, min(st.MAX_LANES, lim.max_lanes))
        models = _model_choices()
        presets = st.preset_choices()

        with gr.Row(elem_id="top-row", equal_height=False):
            with gr.Column(scale=3, min_width=260):
                self.model = gr.Dropdown(models, value=st.DEFAULT_MODEL, label="Model", allow_custom_value=True,
                                         elem_id="model", info="bundled, or found in your Hugging Face cache")
                self.model_path = gr.Textbox(label="…or a local path / hub id", placeholder="/path/to/model or org/name",
                                             elem_id="model-path", max_lines=1)
                self.model_status = gr.HTML("", elem_id="model-status")
            with gr.Column(scale=5, min_width=320):
                self.prompt = gr.Textbox(label="Prompt", lines=3, max_lines=8, elem_id="prompt",
                                         value=st.EXAMPLE_PROMPTS[0])
                self.examples = gr.Examples([[p] for p in st.EXAMPLE_PROMPTS], inputs=[self.prompt],
                                            label="Example prompts", examples_per_page=6)
            with gr.Column(scale=3, min_width=260):
                self.preset = gr.Dropdown(presets, value=None, label="Preset", elem_id="preset",
                                          info="a ready comparison: lanes, knobs, prompt")
                self.preset_info = gr.Markdown("", elem_id="preset-info", elem_classes=["preset-info"])
        with gr.Row(elem_id="run-row", equal_height=True):
            self.seed = gr.Number(0, label="Seed", precision=0, elem_id="seed", min_width=80, scale=1)
            self.max_new = gr.Number(48, label="Max new tokens", precision=0, minimum=1,
                                     maximum=lim.max_new_tokens, elem_id="max-new-tokens", min_width=110, scale=1)
            self.policy = gr.Dropdown(st.POLICY_CHOICES, value="forwards", label="Lockstep: who steps next",
                                      elem_id="policy", scale=3, min_width=220)
            self.metric = gr.Dropdown(st.METRIC_CHOICES, value="auto", label="Colour tokens by", elem_id="metric",
                                      scale=2, min_width=160)
            with gr.Column(scale=1, min_width=90, elem_classes=["lane-buttons"]):
                self.add_btn = gr.Button("+ Lane", elem_id="add-lane", size="sm")
                self.remove_btn = gr.Button("− Lane", elem_id="remove-lane", size="sm")
            self.run_btn = gr.Button("▶ Run", variant="primary", elem_id="run", scale=2, min_width=120)
            self.stop_btn = gr.Button("■ Stop", variant="stop", elem_id="stop", interactive=False, scale=1,
                                      min_width=90)
        self.status = gr.HTML(status_html("Pick a preset or set up the lanes, then press Run."), elem_id="status")

        self.lane_count = gr.State(3)
        self.traces = gr.State([])
        self.sid = gr.State(None)
        self.preset_state = gr.State(None)

        with gr.Row(elem_id="lanes", equal_height=False):
            for k in range(1, self.max_lanes + 1):
                self.lanes.append(self._build_lane(k, models))

        with gr.Row(elem_id="share-row", equal_height=True):
            self.share_btn = gr.Button("Share", elem_id="share", scale=1, min_width=110)
            self.share_link = gr.Textbox(label="Share link (replays this comparison without a model)",
                                         elem_id="share-link", interactive=False, scale=5, buttons=["copy"],
                                         placeholder="run a comparison, then press Share")

        gr.Markdown("## Inspector", elem_classes=["section-title"])
        self.step = gr.Slider(0, 1, value=0, step=1, label="Step (shared by all lanes — click a token to jump)",
                              elem_id="step", interactive=True)
        with gr.Row(equal_height=False, elem_id="compare-strip"):
            self.progress_plot = gr.Plot(label="Progress at equal compute", elem_id="progress-plot", scale=3)
            self.divergence = gr.HTML("", elem_id="divergence", elem_classes=["divergence"])
        with gr.Row(elem_id="inspector", equal_height=False):
            for lane in self.lanes:
                self._build_inspector(lane)

    def _build_lane(self, k: int, models: list[Any]) -> LaneUI:
        ui = LaneUI(k=k)
        # Output first, settings folded below it: while lanes race, their text is what matters.
        with gr.Column(visible=k <= 3, elem_id=f"lane-{k}", elem_classes=["lane-card"], min_width=340) as col:
            ui.column = col
            with gr.Row(equal_height=True, elem_classes=["lane-head"]):
                gr.HTML(f'<div class="lane-title"><span class="lane-dot lane-dot-{k}"></span>Lane {k}</div>',
                        min_width=70, elem_classes=["lane-title-box"])
                ui.decoder = gr.Dropdown(st.decoder_choices(), value="greedy", show_label=False, container=False,
                                         elem_id=f"lane-{k}-decoder", filterable=True, scale=4)
            ui.info = gr.Markdown(st.decoder_info_md("greedy"), elem_id=f"lane-{k}-info", elem_classes=["lane-info"])
            ui.stats = gr.HTML('<div class="lane-stats">—</div>', elem_id=f"lane-{k}-stats")
            ui.output = gr.HTML(_empty_output(k), elem_id=f"lane-{k}-output", elem_classes=["lane-output"],
                                js_on_load=TOKEN_CLICK_JS, max_height=360, autoscroll=False)
            ui.legend = gr.HTML(visualizers.legend_html("probability"), elem_id=f"lane-{k}-legend",
                                elem_classes=["lane-legend"])
            ui.knobs = gr.State({})
            ui.nonce = gr.State(0)
            with gr.Accordion("Lane settings: model, draft, knobs", open=False, elem_id=f"lane-{k}-settings",
                              elem_classes=["lane-settings"]):
                with gr.Row():
                    ui.model = gr.Dropdown([st.SAME_MODEL] + models, value=st.SAME_MODEL, label="Lane model",
                                           elem_id=f"lane-{k}-model", allow_custom_value=True, min_width=140)
                    ui.draft = gr.Dropdown(models, value=st.DEFAULT_DRAFT, label="Draft model", visible=False,
                                           elem_id=f"lane-{k}-draft", allow_custom_value=True, min_width=140)
                self._knob_render(ui)
        return ui

    def _knob_render(self, ui: LaneUI) -> None:
        k = ui.k

        # One render at a time across lanes: Gradio registers a render's events in a shared
        # table, and a preset re-renders every lane at once (seen: "dictionary changed size
        # during iteration" when six renders ran in parallel).
        @gr.render(inputs=[ui.decoder, ui.knobs], triggers=[ui.nonce.change], show_progress="hidden",
                   concurrency_limit=1, concurrency_id="knob-render")
        def _knobs(decoder: str, knobs: dict[str, Any]) -> None:
            spec = st.decoder_spec(decoder)
            if spec is None or not spec["params"]:
                gr.Markdown("*no knobs*" if spec else "", elem_classes=["lane-info"])
                return
            params = spec["params"]
            with gr.Column(elem_id=f"lane-{k}-knobs"):
                for name, p in params.items():
                    w = st.knob_widget(name, p, (knobs or {}).get(name))
                    comp = _WIDGETS[w.widget](**w.kwargs, elem_id=f"lane-{k}-knob-{name}",
                                              key=f"lane-{k}-{decoder}-{name}", interactive=True)
                    # .input (user edits only): a freshly rendered control reports nothing, so
                    # a re-render never races its predecessor's events.
                    comp.input(partial(_set_knob, name), inputs=[comp, ui.knobs, ui.decoder],
                               outputs=[ui.knobs, ui.info], show_progress="hidden", trigger_mode="always_last")

    def _build_inspector(self, ui: LaneUI) -> None:
        with gr.Column(visible=ui.k <= 3, elem_id=f"inspect-{ui.k}", elem_classes=["inspect-col"],
                       min_width=360) as col:
            ui.insp_column = col
            ui.insp_header = gr.HTML(f'<div class="lane-title">Lane {ui.k}</div>', elem_id=f"inspect-{ui.k}-header")
            ui.step_html = gr.HTML("", elem_id=f"inspect-{ui.k}-step-html", visible=False)
            ui.step_plots = [gr.Plot(elem_id=f"inspect-{ui.k}-step-{j}", visible=j == 0, show_label=False)
                             for j in range(STEP_SLOTS)]
            ui.run_html = gr.HTML("", elem_id=f"inspect-{ui.k}-run-html", visible=False)
            ui.run_plots = [gr.Plot(elem_id=f"inspect-{ui.k}-run-{j}", visible=j == 0, show_label=False)
                            for j in range(RUN_SLOTS)]

    # ================================================================== component groups
    def lane_config_outputs(self) -> list[Any]:
        """Everything that shows a lane configuration (apply a preset or a stored session)."""
        out: list[Any] = [self.model, self.model_path, self.prompt, self.seed, self.max_new, self.policy,
                          self.metric, self.lane_count, self.preset_state, self.preset_info]
        for ui in self.lanes:
            out += [ui.column, ui.decoder, ui.model, ui.draft, ui.info, ui.knobs, ui.nonce]
        return out

    def result_outputs(self) -> list[Any]:
        """Everything that shows the results of a comparison."""
        out: list[Any] = [self.status, self.traces, self.sid, self.share_link, self.step, self.progress_plot,
                          self.divergence]
        for ui in self.lanes:
            out += [ui.output, ui.legend, ui.stats, ui.insp_column, ui.insp_header, ui.step_html, *ui.step_plots,
                    ui.run_html, *ui.run_plots]
        return out

    def step_outputs(self) -> list[Any]:
        """What a scrubber move redraws."""
        out: list[Any] = [self.step]
        for ui in self.lanes:
            out += [ui.insp_column, ui.insp_header, ui.step_html, *ui.step_plots]
        return out

    def page_outputs(self) -> list[Any]:
        """Configuration and results together (page load, opening a session)."""
        return self.lane_config_outputs() + self.result_outputs() + [self.run_btn, self.stop_btn, self.preset]

    # ================================================================== update builders
    def config_updates(self, page: dict[str, Any], preset: str | None = None) -> dict[Any, Any]:
        """Updates that show ``page`` (from :func:`state.preset_page`/:func:`state.session_page`)."""
        lanes: list[st.LaneConfig] = page["lanes"][: self.max_lanes]
        n = max(len(lanes), 1)
        nonce = time.time_ns()
        up: dict[Any, Any] = {
            self.model: gr.update(value=page["model"]), self.model_path: "", self.prompt: page["prompt"],
            self.seed: page["seed"], self.max_new: page["max_new_tokens"],
            self.policy: page.get("policy", "forwards"), self.lane_count: n, self.preset_state: preset,
            self.preset_info: _md_text(page.get("description", "")),
        }
        if "metric" in page:
            up[self.metric] = page["metric"]
        for j, ui in enumerate(self.lanes):
            if j < len(lanes):
                cfg = lanes[j]
                spec = st.decoder_spec(cfg.decoder)
                knobs = {**st.default_knobs(cfg.decoder), **cfg.params}
                up.update({
                    ui.column: gr.update(visible=True),
                    ui.decoder: gr.update(value=cfg.decoder) if spec else gr.update(value=None),
                    ui.model: cfg.model or st.SAME_MODEL,
                    ui.draft: gr.update(value=cfg.draft or st.DEFAULT_DRAFT, visible=st.needs_draft(cfg.decoder)),
                    ui.info: st.decoder_info_md(cfg.decoder, knobs), ui.knobs: knobs, ui.nonce: nonce + j,
                })
            else:
                up[ui.column] = gr.update(visible=False)
        return up

    def result_updates(self, traces: list[dict[str, Any]], metric: str, step: int | None = None,
                       plots: bool = True, status: str | None = None, sid: Any = None,
                       live: bool = False) -> dict[Any, Any]:
        """Updates that show ``traces`` (lane outputs, stats and, with ``plots``, the inspector)."""
        up: dict[Any, Any] = {self.traces: traces}
        if status is not None:
            up[self.status] = status
        if sid is not None:
            up[self.sid] = sid
        for j, ui in enumerate(self.lanes):
            if j >= len(traces):
                continue
            up.update(self.lane_updates(j, traces[j], metric, live=live))
        if plots:
            up.update(self.inspector_updates(traces, step))
        return up

    def lane_updates(self, j: int, trace: dict[str, Any], metric: str, live: bool = False) -> dict[Any, Any]:
        """Output, legend and stats of lane ``j`` (0-based); ``live`` while streaming."""
        ui = self.lanes[j]
        m = st.auto_metric(trace, metric)
        err = (trace.get("stats") or {}).get("error")
        body = visualizers.tokens_html(trace, m, lane=ui.k)
        if err:
            body = error_html(err) + body
        if live and body.endswith("</div>"):
            # Gradio streams a string that extends the previous one as an append; without
            # the closing tag (the browser closes it) a growing output is sent token by
            # token instead of in full ten times a second.
            body = body[: -len("</div>")]
        return {ui.output: body, ui.legend: visualizers.legend_html(m),
                ui.stats: f'<div class="lane-stats">{visualizers.stats_line(trace) or "—"}</div>'}

    def inspector_updates(self, traces: list[dict[str, Any]], step: int | None = None,
                          run_plots: bool = True) -> dict[Any, Any]:
        """The scrubber, the comparison strip and every lane's plots at ``step`` (None: last)."""
        counts = [visualizers.step_count(t) for t in traces]
        top = max(counts, default=0)
        s = top - 1 if step is None else step
        s = max(0, min(int(s), max(top - 1, 0)))
        up: dict[Any, Any] = {self.step: gr.update(minimum=0, maximum=max(top - 1, 1), value=s)}
        if run_plots:
            up[self.progress_plot] = visualizers.progress_figure(traces)
            up[self.divergence] = visualizers.divergence_html(traces)
        for j, ui in enumerate(self.lanes):
            if j >= len(traces):
                up[ui.insp_column] = gr.update(visible=False)
                continue
            tr = traces[j]
            up[ui.insp_column] = gr.update(visible=True)
            up[ui.insp_header] = _insp_header(ui.k, tr, min(s, max(counts[j] - 1, 0)), counts[j])
            up.update(self._slot_updates(ui.step_html, ui.step_plots, visualizers.step_figures(tr, s)))
            if run_plots:
                up.update(self._slot_updates(ui.run_html, ui.run_plots, visualizers.run_figures(tr)))
        return up

    def strip_updates(self, traces: list[dict[str, Any]]) -> dict[Any, Any]:
        """The cheap part of the inspector: scrubber range and the comparison strip."""
        top = max((visualizers.step_count(t) for t in traces), default=0)
        return {self.step: gr.update(minimum=0, maximum=max(top - 1, 1), value=max(top - 1, 0)),
                self.progress_plot: visualizers.progress_figure(traces),
                self.divergence: visualizers.divergence_html(traces)}

    def step_updates(self, traces: list[dict[str, Any]], step: int) -> dict[Any, Any]:
        """What a scrubber move changes: each lane's step plots (and its header)."""
        return self.inspector_updates(traces, step, run_plots=False)

    @staticmethod
    def _slot_updates(html_comp: Any, plots: list[Any], figs: list[tuple[str, Any]]) -> dict[Any, Any]:
        up: dict[Any, Any] = {}
        htmls = [(t, f) for t, f in figs if isinstance(f, str)]
        plots_in = [(t, f) for t, f in figs if not isinstance(f, str)]
        if htmls:
            body = "".join(f'<div class="insp-block"><div class="insp-title">{_esc(t)}</div>{f}</div>' for t, f in htmls)
            up[html_comp] = gr.update(value=body, visible=True)
        else:
            up[html_comp] = gr.update(value="", visible=False)
        for j, comp in enumerate(plots):
            if j < len(plots_in):
                up[comp] = gr.update(value=plots_in[j][1], visible=True, label=plots_in[j][0])
            else:
                up[comp] = gr.update(visible=False)
        return up

    # ================================================================== events
    def wire(self, demo: gr.Blocks) -> None:
        """Attach every event of the page."""
        from playground.hosting import model_event_settings

        self.preset.input(self.on_preset, [self.preset], self.lane_config_outputs() + [self.status])
        self.model.change(self.on_model, [self.model, self.model_path], [self.model_status],
                          show_progress="minimal")
        self.model_path.submit(self.on_model, [self.model, self.model_path], [self.model_status],
                               show_progress="minimal")
        self.add_btn.click(self.on_add, [self.lane_count], [self.lane_count] + [u.column for u in self.lanes],
                           queue=False)
        self.remove_btn.click(self.on_remove, [self.lane_count], [self.lane_count] + [u.column for u in self.lanes],
                              queue=False)
        for ui in self.lanes:
            ui.decoder.input(self.on_decoder, [ui.decoder, self.model, ui.model],
                             [ui.knobs, ui.nonce, ui.draft, ui.info, ui.model], queue=False)

        run_inputs = [self.model, self.model_path, self.prompt, self.seed, self.max_new, self.policy, self.metric,
                      self.lane_count, self.preset_state]
        for ui in self.lanes:
            run_inputs += [ui.decoder, ui.knobs, ui.draft, ui.model]
        self.run_event = self.run_btn.click(
            self.on_run, run_inputs, self.result_outputs() + [self.run_btn, self.stop_btn],
            show_progress="hidden", **model_event_settings())
        self.prompt.submit(self.on_run, run_inputs, self.result_outputs() + [self.run_btn, self.stop_btn],
                           show_progress="hidden", **model_event_settings())
        self.stop_btn.click(self.on_stop, None, None, queue=False)

        self.step.input(self.on_step, [self.step, self.traces], self.step_outputs(), show_progress="hidden",
                        trigger_mode="always_last")
        self.step.change(None, [self.step], None, js=HIGHLIGHT_JS)
        for ui in self.lanes:
            ui.output.click(self.on_token, [self.traces], self.step_outputs(), show_progress="hidden")
        self.metric.change(self.on_metric, [self.metric, self.traces],
                           [c for ui in self.lanes for c in (ui.output, ui.legend, ui.stats)],
                           show_progress="hidden")
        self.share_btn.click(self.on_share, [self.sid], [self.share_link])
        demo.load(self.on_load, None, self.page_outputs(), show_progress="hidden")
        # Warm the model cache as soon as the page opens, so the first Run starts at once.
        demo.load(self.on_model, [self.model, self.model_path], [self.model_status], show_progress="minimal")

    # ---------------------------------------------------------------- handlers
    def on_preset(self, name: str) -> dict[Any, Any]:
        """Apply a preset to the page."""
        try:
            page = st.preset_page(name)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return {self.status: status_html(str(e), "error")}
        up = self.config_updates(page, preset=name)
        missing = [c.decoder for c in page["lanes"] if st.decoder_spec(c.decoder) is None]
        msg = f"Preset “{page['title']}” loaded — press Run."
        if len(page["lanes"]) > self.max_lanes:
            msg += f" (only its first {self.max_lanes} lanes: this instance allows {self.max_lanes})"
        if missing:
            msg += f" (decoders not available here: {', '.join(missing)})"
        up[self.status] = status_html(msg)
        return up

    def on_model(self, model: str, path: str) -> str:
        """Load (or find in the cache) the picked model, showing what it is."""
        from playground.settings import limits

        spec = (path or "").strip() or (model or "").strip()
        if not spec:
            return ""
        if limits().no_models:
            return status_html("Replay-only instance: models are not loaded here; shared sessions still open.", "info")
        try:
            handle = _load(spec)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return status_html(str(e), "error")
        nparams = sum(p.numel() for p in handle.model.parameters())
        return status_html(f"✓ {handle.name} · {handle.kind} · {_human(nparams)} parameters · "
                           f"context {handle.context_length} tokens", "ok")

    def on_add(self, n: int) -> list[Any]:
        """Show one more lane."""
        n = min(int(n or 0) + 1, self.max_lanes)
        return [n] + [gr.update(visible=j < n) for j in range(self.max_lanes)]

    def on_remove(self, n: int) -> list[Any]:
        """Hide the last lane (at least two stay)."""
        n = max(int(n or 0) - 1, 1)
        return [n] + [gr.update(visible=j < n) for j in range(self.max_lanes)]

    def on_decoder(self, decoder: str, page_model: str, lane_model: str) -> list[Any]:
        """A lane's decoder was picked: its default knobs, draft picker and lane model."""
        lm = st.lane_model_for(decoder, page_model, None if lane_model == st.SAME_MODEL else lane_model)
        return [st.default_knobs(decoder), time.time_ns(), gr.update(visible=st.needs_draft(decoder)),
                st.decoder_info_md(decoder), lm or st.SAME_MODEL]

    def on_metric(self, metric: str, traces: list[dict[str, Any]]) -> dict[Any, Any]:
        """Recolour every lane's output."""
        up: dict[Any, Any] = {}
        for j, tr in enumerate(traces or []):
            if j < len(self.lanes):
                up.update(self.lane_updates(j, tr, metric))
        return up

    def on_step(self, step: float, traces: list[dict[str, Any]]) -> dict[Any, Any]:
        """The scrubber moved: redraw each lane's step plots."""
        return self.step_updates(traces or [], int(step or 0))

    def on_token(self, traces: list[dict[str, Any]], evt: gr.EventData) -> dict[Any, Any]:
        """A token was clicked: jump the scrubber to the step that produced it."""
        data = getattr(evt, "_data", None) or {}
        try:
            step = int(data.get("step"))
        except (TypeError, ValueError):
            return {}
        return self.step_updates(traces or [], step)

    def on_stop(self, request: gr.Request) -> None:
        """Stop the running comparison of this browser session (lanes keep what they made).

        It updates nothing itself: the Run stream notices within one step and shows the
        stopped lanes. (Sharing an output with the streaming event was a suspect in a run
        that never showed its last frame.)
        """
        key = _session_key(request)
        with _RUNNERS_LOCK:
            runner = _RUNNERS.get(key)
        if runner is not None:
            runner.cancel()

    def on_share(self, sid: str | None, request: gr.Request) -> str:
        """Show the share link of the current session."""
        if not sid:
            gr.Warning("Run a comparison (or open a session) first: there is nothing to share yet.")
            return ""
        return st.share_url(_root_url(request), sid)

    def on_load(self, request: gr.Request) -> dict[Any, Any]:
        """Page load: replay ``?session=<id>`` if given, else show the default preset."""
        params = dict(getattr(request, "query_params", {}) or {}) if request is not None else {}
        sid = params.get("session")
        if sid is not None:
            return self.open_session(sid)
        return self.default_page()

    def default_page(self) -> dict[Any, Any]:
        """The page as a first visit shows it: the first preset that runs here."""
        up: dict[Any, Any] = {}
        names = [n for _t, n in st.preset_choices()]
        for name in [n for n in DEFAULT_PRESETS if n in names] + names:
            try:
                page = st.preset_page(name)
            except PlaygroundError:
                continue
            if all(st.decoder_spec(c.decoder) for c in page["lanes"]) and 2 <= len(page["lanes"]) <= self.max_lanes \
                    and _models_present(page):
                up = self.config_updates(page, preset=name)
                up[self.preset] = name
                break
        else:
            page = {"model": st.DEFAULT_MODEL, "prompt": st.EXAMPLE_PROMPTS[0], "seed": 0, "max_new_tokens": 48,
                    "lanes": [st.LaneConfig("greedy"), st.LaneConfig("greedy")]}
            up = self.config_updates(page)
        for ui in self.lanes[: up.get(self.lane_count, 2)]:
            up[ui.output] = _empty_output(ui.k)
        up[self.status] = status_html("Press Run to race the lanes. Pick another preset or change any lane.")
        up.update(self._idle_buttons())
        return up

    def open_session(self, sid: Any) -> dict[Any, Any]:
        """Replay a stored session: text, colours, stats, scrubber and every plot, no model."""
        from playground.store import default_store

        try:
            session = default_store().load_session(str(sid))
        except PlaygroundError as e:
            up = self.default_page()
            msg = f"Could not open the shared session: {e}."
            gr.Warning(msg)
            up[self.status] = status_html(msg, "error")
            return up
        page = st.session_page(session)
        up = self.config_updates(page)
        up[self.preset_info] = _md_text(f"Replaying stored session **{st._md_escape(session['title'])}** "
                                        f"({session['created'][:16].replace('T', ' ')} UTC) — no model loaded.")
        runs = page["runs"]
        up.update(self.result_updates(runs, page["metric"], step=None, sid=session["id"],
                                      status=status_html(f"Replaying “{session['title']}”: {len(runs)} lanes, "
                                                         f"stored {session['created'][:10]}. Press Run to run it again.",
                                                         "ok")))
        up.update(self._idle_buttons())
        up[self.share_link] = ""
        return up

    def _idle_buttons(self) -> dict[Any, Any]:
        return {self.run_btn: gr.update(interactive=True), self.stop_btn: gr.update(interactive=False)}

    # ---------------------------------------------------------------- the run
    def on_run(self, request: gr.Request, *args: Any) -> Iterator[dict[Any, Any]]:
        """Run the comparison, streaming text and stats, then plots; autosave at the end.

        ``request`` comes first because Gradio injects it only into positional parameters;
        ``args`` are the values of the Run button's inputs (page settings, then 4 per lane).
        """
        (model, model_path, prompt, seed, max_new, policy, metric, lane_count, preset) = args[:9]
        lane_args = args[9:]
        n = max(1, min(int(lane_count or 2), self.max_lanes))
        lanes = []
        for j in range(n):
            dec, knobs, draft, lmodel = lane_args[4 * j: 4 * j + 4]
            lanes.append(st.LaneConfig(decoder=dec or "", params=st.coerce_knobs(dec or "", knobs or {}),
                                       draft=None if draft in (None, "", st.NO_DRAFT) or not st.needs_draft(dec) else draft,
                                       model=None if lmodel in (None, "", st.SAME_MODEL) else lmodel))
        page_model = (model_path or "").strip() or (model or "").strip()
        try:
            seed_i, mnt = st.check_page(page_model, prompt, seed, max_new, lanes)
            _check_models_allowed()
        except PlaygroundError as e:
            gr.Warning(str(e))
            yield {self.status: status_html(str(e), "error")}
            return
        key = _session_key(request)
        started = time.perf_counter()
        start: dict[Any, Any] = {
            self.status: status_html("Preparing lanes (loading models if needed)…"), self.share_link: "",
            self.sid: "", self.run_btn: gr.update(interactive=False), self.stop_btn: gr.update(interactive=True)}
        for ui in self.lanes[:n]:
            start[ui.output] = _empty_output(ui.k, "Starting…")
            start[ui.stats] = '<div class="lane-stats">—</div>'
        yield start
        pacer = PlotPacer()
        traces: list[dict[str, Any]] = []
        runner = None
        try:
            for kind, payload in compare_stream(page_model, prompt, seed_i, mnt, policy, lanes, key):
                if kind == "errors":
                    for msg in sorted(set(payload.values())):
                        gr.Warning(msg)
                    continue
                if kind == "runner":
                    runner = payload
                    continue
                traces = payload
                if runner is not None and runner.done:
                    continue  # the final frame is drawn in full below
                now = time.perf_counter()
                running = sum(1 for t in traces if not t.get("done"))
                up = self.result_updates(
                    traces, metric, plots=False, live=True,
                    status=status_html(f"Running… {running} of {len(traces)} lanes still decoding "
                                       f"({now - started:.1f} s)"))
                if pacer.due("lanes", now):
                    with pacer.timed("lanes"):
                        up.update(self.inspector_updates(traces, None, run_plots=True))
                elif pacer.due("strip", now):
                    with pacer.timed("strip"):
                        up.update(self.strip_updates(traces))
                yield up
        except PlaygroundError as e:  # a page-level problem (e.g. the model cannot load)
            gr.Warning(str(e))
            yield {self.status: status_html(str(e), "error"), **self._idle_buttons()}
            return
        except Exception as e:  # noqa: BLE001 - a bug shows as one line; the log has the traceback
            log.exception("comparison failed")
            msg = one_line(f"the comparison failed: {type(e).__name__}: {e}")
            gr.Warning(msg)
            yield {self.status: status_html(msg, "error"), **self._idle_buttons()}
            return
        stopped = runner is not None and runner.cancelled
        sid, saved = None, ""
        if traces and any(t.get("steps") for t in traces):
            try:
                from playground.store import default_store

                pre = st.preset_page(preset) if preset else None
                title = st.session_title(lanes, pre["title"] if pre and [c.decoder for c in pre["lanes"]] ==
                                         [c.decoder for c in lanes] else None)
                settings = st.session_settings(page_model, seed_i, mnt, policy, metric, lanes, preset)
                sid = default_store().save_session(title, page_model, prompt, settings, traces)
                saved = " Saved — press Share for a link."
            except PlaygroundError as e:
                gr.Warning(f"could not save the session: {e}")
                saved = f" (not saved: {e})"
        head = "Stopped" if stopped else "Done"
        up = self.result_updates(traces, metric, step=None, plots=True, sid=sid,
                                 status=status_html(f"{head} in {time.perf_counter() - started:.1f} s.{saved}",
                                                    "ok" if not stopped else "info"))
        up.update(self._idle_buttons())
        yield up


# ---------------------------------------------------------------------- plot pacing
class PlotPacer:
    """Decides when a streaming run may redraw plots, so drawing never crowds out decoding.

    Each kind of redraw ("strip": the comparison strip; "lanes": every lane's plots) waits
    at least its base period and at least ``factor`` times what its last redraw cost, which
    keeps plotting under about 1/factor of the time however slow the machine is.
    """

    BASE = {"strip": 2 * PLOT_EVERY_S, "lanes": 8 * PLOT_EVERY_S}

    def __init__(self, factor: float = 8.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.factor, self.clock = factor, clock
        self.last: dict[str, float] = {}
        self.cost: dict[str, float] = {}

    def due(self, kind: str, now: float) -> bool:
        """Whether a redraw of ``kind`` may happen at ``now``."""
        if kind not in self.last:
            self.last[kind] = now  # the first frames show text only; plots follow
            return False
        wait = max(self.BASE[kind], self.factor * self.cost.get(kind, 0.0))
        return now - self.last[kind] >= wait

    def timed(self, kind: str) -> Any:
        """Context manager that records the cost of one redraw of ``kind``."""
        pacer = self

        class _T:
            def __enter__(self) -> None:
                self.t0 = pacer.clock()

            def __exit__(self, *exc: Any) -> None:
                end = pacer.clock()
                pacer.cost[kind] = end - self.t0
                pacer.last[kind] = end
                if kind == "lanes":
                    pacer.last["strip"] = end  # a lanes redraw includes the strip

        return _T()


# ---------------------------------------------------------------------- the model work
def _compare_stream_impl(model: str, prompt: str, seed: int, max_new_tokens: int, policy: str,
                         lanes: list[st.LaneConfig], key: str) -> Iterator[tuple[str, Any]]:
    """Prepare every lane and stream the runner's snapshots.

    Yields ("errors", {lane: message}) once if some lanes could not start, ("runner", runner)
    once, then ("snapshots", [trace dict per lane]) at the runner's rate. Raises
    PlaygroundError when no lane can start for the same page-level reason.
    """
    from playground.engine import prepare
    from playground.runner import Lane, Runner, error_trace

    prepared: list[Lane] = []
    errors: dict[int, str] = {}
    for j, cfg in enumerate(lanes):
        req = st.lane_request(cfg, model, prompt, seed, max_new_tokens)
        try:
            prepared.append(Lane(run=prepare(**req), label=cfg.decoder))
        except Exception as e:  # noqa: BLE001 - a lane that cannot start must not take the page down
            if not isinstance(e, PlaygroundError):
                log.exception("lane %d (%s) could not be prepared", j + 1, cfg.decoder)
            msg = str(e) if isinstance(e, PlaygroundError) else one_line(f"could not start: {type(e).__name__}: {e}")
            errors[j] = msg
            prepared.append(Lane(error=msg, label=cfg.decoder,
                                 stub=error_trace(msg, decoder=cfg.decoder, model=req["model"], prompt=prompt,
                                                  params=cfg.params, seed=seed)))
    if errors and len(errors) == len(lanes) and len(set(errors.values())) == 1:
        raise PlaygroundError(next(iter(errors.values())))
    if errors:
        yield "errors", {j + 1: f"lane {j + 1}: {m}" for j, m in errors.items()}
    runner = Runner(prepared, policy=policy, rate=STREAM_RATE)
    with _RUNNERS_LOCK:
        _RUNNERS[key] = runner
    try:
        yield "runner", runner
        for snaps in runner.stream():
            yield "snapshots", snaps
    finally:
        runner.cancel()  # a closed stream (browser gone) must not leave lanes running
        with _RUNNERS_LOCK:
            if _RUNNERS.get(key) is runner:
                del _RUNNERS[key]


def _gpu_wrapped() -> Callable[..., Iterator[tuple[str, Any]]]:
    from playground.hosting import gpu

    return gpu(_compare_stream_impl)


compare_stream = _gpu_wrapped()


def _load(spec: str) -> Any:
    from playground.models import load_model

    return load_model(spec)


def _check_models_allowed() -> None:
    from playground.settings import limits

    if limits().no_models:
        raise PlaygroundError("model loading is disabled on this instance (replay only): open a shared session instead")


# ---------------------------------------------------------------------- small helpers
def _set_knob(name: str, value: Any, knobs: dict[str, Any] | None, decoder: str) -> tuple[dict[str, Any], str]:
    new = {**(knobs or {}), name: value}
    return new, st.decoder_info_md(decoder, new)


_WIDGETS: dict[str, Callable[..., Any]] = {
    "slider": gr.Slider, "number": gr.Number, "checkbox": gr.Checkbox, "dropdown": gr.Dropdown,
    "textbox": gr.Textbox,
}


def _model_choices() -> list[Any]:
    from playground.models import list_models

    out: list[Any] = []
    for m in list_models():
        if m["source"] == "bundled" and not m["available"]:
            continue
        kind = m.get("kind") or "?"
        out.append((f"{m['name']} ({m['source']}, {kind})", m["name"]))
    if not out:
        out.append((f"{st.DEFAULT_MODEL} (bundled, causal)", st.DEFAULT_MODEL))
    return out


def _models_present(page: dict[str, Any]) -> bool:
    """Whether the bundled models a page names are installed (other specs are assumed loadable)."""
    from playground.models import BUNDLED, BUNDLED_DIR

    names = {page["model"]} | {c.model for c in page["lanes"] if c.model} | {c.draft for c in page["lanes"] if c.draft}
    return all((BUNDLED_DIR / n / "config.json").exists() for n in names if n in BUNDLED)


def _empty_output(k: int, note: str = "Press Run to start this lane.") -> str:
    return f'<div class="tok-output" data-lane="{k}"><span class="tok-empty">{_esc(note)}</span></div>'


def _insp_header(k: int, trace: dict[str, Any], step: int, count: int) -> str:
    dec = _esc(trace.get("decoder") or "?")
    where = f"step {step} of {count - 1}" if count else "no steps"
    kind = ""
    steps = trace.get("steps") or []
    if count and 0 <= step < len(steps) and isinstance(steps[step], dict):
        kind = f" · {_esc(steps[step].get('kind', ''))} step"
    return (f'<div class="lane-title"><span class="lane-dot lane-dot-{k}"></span>Lane {k} · {dec}'
            f'<span class="insp-where">{where}{kind}</span></div>')


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, shortened to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _md_text(text: str) -> str:
    return str(text or "")


def _human(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return str(n)


def _session_key(request: Any) -> str:
    return str(getattr(request, "session_hash", None) or "local")


def _root_url(request: Any) -> str:
    """The public URL of the app, from the request that pressed Share."""
    from gradio import route_utils

    try:
        req = request.request
        return route_utils.get_root_url(req, route_utils.get_api_call_path(req), None)
    except Exception:  # noqa: BLE001 - fall back to the headers the browser sent
        headers = getattr(request, "headers", {}) or {}
        origin = headers.get("origin") or ""
        if origin:
            return origin
        host = headers.get("host") or "localhost:7860"
        return f"http://{host}"
