"""The Compare page's components: toolbar, lane cards, inspector columns, and their groups.

:class:`Layout` creates every component once (``build``) and names the groups that
handlers read and write (``result_outputs`` …). It holds no behaviour: the handler groups —
lane configuration (``lane_config``), Run/Stop/Share (``run_handlers``), the inspector
(``inspector``), the branch panel (``branch_panel``) — receive it and attach their handlers
to these components.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import gradio as gr

import visualizers
import playground.ui.rules as st
from playground.core.models import list_models
from playground.core.settings import limits
from playground.ui.events import Fanout
from playground.ui.html import empty_output, status_html
from playground.ui.model_options import build_controls as build_model_options
from playground.ui.model_options import option_outputs
from playground.ui.page_js import page_js
from playground.ui.scrubber import Scrubber
from playground.watch import MAX_WATCH

STEP_SLOTS = visualizers.MAX_STEP_PLOTS  # most figures step_figures returns for one step kind
RUN_SLOTS = visualizers.MAX_RUN_PLOTS  # most figures run_figures returns for one trace

# Clicking a token jumps the inspector to its step; the output box follows the newest token.
TOKEN_CLICK_JS = page_js("token_click.js")


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


class Layout:
    """Creates the Compare page's components (inside an open ``gr.Blocks``) and groups them."""

    lanes: list[LaneUI]
    compare_plots: list[Any]

    def build(self, knob_render: Callable[[LaneUI], None], build_branch: Callable[[], None]) -> None:
        """Create the components (call inside ``with gr.Blocks()`` / a tab). ``knob_render``
        renders a lane's knob controls (the lane configuration's), ``build_branch`` creates the
        branch panel's components in their place above the inspector columns."""
        lim = limits()
        self.lanes = []
        self.max_lanes = max(st.MIN_LANES, min(st.MAX_LANES, lim.max_lanes))
        models = model_choices()
        presets = st.preset_choices()

        with gr.Row(elem_id="top-row", equal_height=False):
            with gr.Column(scale=3, min_width=260):
                self.model = gr.Dropdown(models, value=st.DEFAULT_MODEL, label="Model", allow_custom_value=True,
                                         elem_id="model", info="bundled, or found in your Hugging Face cache")
                self.model_path = gr.Textbox(label="…or a local path / hub id", placeholder="/path/to/model or org/name",
                                             elem_id="model-path", max_lines=1)
                self.model_status = gr.HTML("", elem_id="model-status")
                # Chat template, system prompt, remote-code opt-in: playground/ui/model_options.py.
                build_model_options(self)
            with gr.Column(scale=5, min_width=320):
                self.prompt = gr.Textbox(label="Prompt", lines=3, max_lines=8, elem_id="prompt",
                                         value=st.EXAMPLE_PROMPTS[0])
                self.watch = gr.Textbox(label="Watch tokens", max_lines=1, elem_id="watch",
                                        placeholder="e.g. Romeo, #42",
                                        info=f"words or #token ids, comma-separated (at most {MAX_WATCH}): every "
                                             "step of every lane records their probability and rank")
                self.examples = gr.Examples([[p] for p in st.EXAMPLE_PROMPTS], inputs=[self.prompt],
                                            label="Example prompts", examples_per_page=6)
            with gr.Column(scale=3, min_width=260):
                self.preset = gr.Dropdown(presets, value=None, label="Preset", elem_id="preset",
                                          info="a ready comparison: lanes, knobs, prompt")
                self.preset_info = gr.Markdown("", elem_id="preset-info", elem_classes=["preset-info"])
        with gr.Row(elem_id="run-row", equal_height=True):
            self.seed = gr.Number(0, label="Seed", precision=0, elem_id="seed", min_width=80, scale=1)
            # No minimum or maximum of Gradio's own: it would answer a value past them with its
            # raw "Value 5000 is greater than maximum value 1024" error; the Run's check
            # (rules.check_page) gives the page's one line instead.
            self.max_new = gr.Number(48, label="Max new tokens", precision=0, elem_id="max-new-tokens",
                                     min_width=110, scale=1)
            self.policy = gr.Dropdown(st.POLICY_CHOICES, value="forwards", label="Lockstep: who steps next",
                                      info="What the race equalises: target forwards leave draft forwards and "
                                           "long passes free, cost charges every position a model processes at "
                                           "its measured speed, wall time is this machine's clock; equal steps gives "
                                           "each lane one step in turn, free running steps them round robin.",
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
        # Says that a second Run (Shift+Enter while one is going) was not started. Its own element,
        # written by the browser alone: the status line is rewritten by every frame of the run.
        self.notice = gr.HTML("", elem_id="run-notice")
        # The running comparison's token: Run writes it, Stop sends it back (see run_handlers).
        self.run_token = gr.Textbox("", visible=False, elem_id="run-token")
        # The browser's owner key (ownership.py): the page's script fills it in on load; the
        # events that save or change sessions send it.
        self.owner_key = gr.Textbox("", visible=False, elem_id="owner-key")

        self.lane_count = gr.State(3)
        self.traces = gr.State([])
        # Names the traces the page shows; a new name whenever they are replaced (a run ended, a
        # session opened). Listeners that follow the shown run watch this small value, not the
        # traces: Gradio hashes a state with change listeners whole around every frame of every
        # event that writes it, and a run's traces are megabytes.
        self.shown = gr.State("")
        # what follows the shown traces (the panels' lane pickers, the position range): one event
        # for all of them, attached once every tab has added its own (build_app)
        self.on_shown = Fanout()
        self.sid = gr.State(None)
        self.preset_state = gr.State(None)  # the preset the page shows (None: a stored session)

        with gr.Row(elem_id="lanes", equal_height=False):
            for k in range(1, self.max_lanes + 1):
                self.lanes.append(self._build_lane(k, models, knob_render))

        with gr.Row(elem_id="share-row", equal_height=True):
            self.share_btn = gr.Button("Share", elem_id="share", scale=1, min_width=110)
            # an intent for Share, kept across runs: a teacher shares one blind vote after another
            self.blind = gr.Checkbox(False, label="Blind vote", elem_id="blind", scale=1, min_width=120,
                                     info="Share gives a vote link: lanes as letters, decoders shown after the vote")
            self.share_link = gr.Textbox(label="Share link (replays this comparison without a model)",
                                         elem_id="share-link", interactive=False, scale=5, buttons=["copy"],
                                         placeholder="run a comparison, then press Share")

        gr.Markdown("## Inspector", elem_classes=["section-title"])
        with gr.Row(elem_id="scrub-row", equal_height=True):
            self.step = Scrubber(0, 1, value=0, step=1, label="Step (shared by all lanes — click a token to jump)",
                                  elem_id="step", interactive=True, scale=5)
            # Lane alignment and focus: playground/ui/align.py.
            self.position = Scrubber(0, 1, value=0, step=1, visible=False, interactive=True, scale=5,
                                      label="Token position (each lane shows the step that produced it)",
                                      elem_id="position")
            self.align = gr.Radio(st.ALIGN_CHOICES, value="step", label="Align lanes", elem_id="align",
                                  scale=2, min_width=200)
            self.focus = gr.Dropdown(st.focus_choices(self.max_lanes), value=0, label="Inspect",
                                     elem_id="focus", scale=1, min_width=150)
        with gr.Row(equal_height=False, elem_id="compare-strip"):
            self.progress_plot = gr.Plot(label="Progress at what the race equalises", elem_id="progress-plot", scale=3)
            # Figures over all lanes (visualizers.COMPARE_PLOTS), beside the first-divergence marker.
            self.compare_plots = [gr.Plot(label=title, elem_id=compare_plot_id(fn, j), scale=3)
                                  for j, (title, fn) in enumerate(visualizers.COMPARE_PLOTS)]
            with gr.Column(scale=2, min_width=260):
                self.divergence = gr.HTML("", elem_id="divergence", elem_classes=["divergence"])
        build_branch()
        with gr.Row(elem_id="inspector", equal_height=False):
            for lane in self.lanes:
                self._build_inspector(lane)

    def _build_lane(self, k: int, models: list[Any], knob_render: Callable[[LaneUI], None]) -> LaneUI:
        ui = LaneUI(k=k)
        # Output first, settings folded below it: while lanes race, their text is what matters.
        # "hidden", not False: Gradio's page renders the knob controls of a column built
        # invisible once more when it loads (three extra events, each redoing every
        # component's loading status); a hidden one is in the page, out of sight
        with gr.Column(visible=True if k <= 3 else "hidden", elem_id=f"lane-{k}", elem_classes=["lane-card"], min_width=340) as col:
            ui.column = col
            with gr.Row(equal_height=True, elem_classes=["lane-head"]):
                gr.HTML(f'<div class="lane-title"><span class="lane-dot lane-dot-{k}"></span>Lane {k}</div>',
                        min_width=70, elem_classes=["lane-title-box"])
                ui.decoder = gr.Dropdown(st.decoder_choices(), value="greedy", show_label=False, container=False,
                                         elem_id=f"lane-{k}-decoder", filterable=True, scale=4)
            ui.info = gr.Markdown(st.decoder_info_md("greedy"), elem_id=f"lane-{k}-info", elem_classes=["lane-info"])
            ui.stats = gr.HTML('<div class="lane-stats">—</div>', elem_id=f"lane-{k}-stats")
            ui.output = gr.HTML(empty_output(k), elem_id=f"lane-{k}-output", elem_classes=["lane-output"],
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
                knob_render(ui)
        return ui

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
                          self.metric, self.lane_count, self.preset, self.preset_state, self.preset_info, self.add_btn,
                          self.remove_btn, self.watch, self.blind, *option_outputs(self)]
        for ui in self.lanes:
            out += [ui.column, ui.decoder, ui.model, ui.draft, ui.info, ui.knobs, ui.nonce]
        return out

    def result_outputs(self) -> list[Any]:
        """Everything that shows the results of a comparison."""
        out: list[Any] = [self.status, self.traces, self.shown, self.sid, self.share_link, self.step, self.progress_plot,
                          self.divergence, *self.compare_plots]
        for ui in self.lanes:
            out += [ui.output, ui.legend, ui.stats, ui.insp_column, ui.insp_header, ui.step_html, *ui.step_plots,
                    ui.run_html, *ui.run_plots]
        return out

    def comparison_outputs(self) -> list[Any]:
        """What speaks for the whole shown comparison: traces, their name, the session id,
        the share link, the comparison strip, and every lane's inspector column (a lane
        setup change clears or hides them, :mod:`playground.ui.lane_reset`)."""
        return [self.traces, self.shown, self.sid, self.share_link, self.progress_plot, self.divergence,
                *self.compare_plots, *[ui.insp_column for ui in self.lanes]]

    def lane_reset_outputs(self, j: int) -> list[Any]:
        """What clearing lane ``j`` (0-based) writes: its card's output, stats and legend, its
        inspector column's header and slots, and :meth:`comparison_outputs`."""
        ui = self.lanes[j]
        return self.comparison_outputs() + [ui.output, ui.stats, ui.legend, ui.insp_header, ui.step_html,
                                            *ui.step_plots, ui.run_html, *ui.run_plots]

    def run_outputs(self) -> list[Any]:
        """What the Run stream writes: status, state, scrubber, comparison strip, each lane's
        output, legend and stats — no inspector plots. Kept short on purpose: Gradio builds a
        component for every output a frame leaves out, on every frame (the full results list
        was about 90 outputs)."""
        out: list[Any] = [self.status, self.traces, self.shown, self.sid, self.share_link, self.step, self.progress_plot,
                          self.divergence]
        for ui in self.lanes:
            # the header says the plots follow (the previous run's stay below it until then)
            out += [ui.output, ui.legend, ui.stats, ui.insp_header]
        return out

    def draw_outputs(self) -> list[Any]:
        """What drawing a run's inspector writes (the event chained after Run)."""
        out: list[Any] = [self.progress_plot, self.divergence, *self.compare_plots]
        for ui in self.lanes:
            out += [ui.insp_column, ui.insp_header, ui.step_html, *ui.step_plots, ui.run_html, *ui.run_plots]
        return out

    def step_outputs(self) -> list[Any]:
        """What a scrubber move redraws."""
        out: list[Any] = [self.step]
        for ui in self.lanes:
            out += [ui.insp_column, ui.insp_header, ui.step_html, *ui.step_plots]
        return out

    def page_outputs(self) -> list[Any]:
        """Configuration and results together (page load, opening a session)."""
        return self.lane_config_outputs() + self.result_outputs() + [self.run_btn, self.stop_btn]

    def idle_buttons(self) -> dict[Any, Any]:
        """Run enabled, Stop disabled: the page between runs."""
        return {self.run_btn: gr.update(interactive=True), self.stop_btn: gr.update(interactive=False)}


def compare_plot_id(fn: Any, j: int) -> str:
    """The element id of compare-strip figure ``j`` (drawn by ``fn``): the divergence figure
    is ``#divergence-plot``, any other registered one ``#compare-plot-<j>``."""
    return "divergence-plot" if fn is visualizers.divergence_figure else f"compare-plot-{j}"


def model_choices() -> list[Any]:
    """The model dropdown's choices: bundled models that are installed, then cached ones."""
    out: list[Any] = []
    for m in list_models():
        if m["source"] == "bundled" and not m["available"]:
            continue
        # the name alone for a bundled model (the status line below the box says its kind and
        # size); a longer label was cut off by the box
        out.append((m["name"] if m["source"] == "bundled" else f"{m['name']} (cached)", m["name"]))
    if not out:
        out.append((st.DEFAULT_MODEL, st.DEFAULT_MODEL))
    return out
