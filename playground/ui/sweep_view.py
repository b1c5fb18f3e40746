"""The Sweep tab: one decoder over a grid of one or two knobs, the page's face of ``playground sweep``.

Every cell runs the decoder on the same prompt with the same seed (``repeats`` seeds per cell
give the spread), scored by the model itself; each run is stored as a session of this browser
(:func:`playground.sweep.run_sweep`), so any cell opens as a normal comparison by its link. The
tab draws the chosen metric as a heatmap over two knobs or a line over one
(:func:`visualizers.sweep.sweep_figure`) and the grid of outputs, each cell with its metric,
the start of its text and its link.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

import playground.ui.rules as st
from playground import inputs
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.hosting import gpu, model_event_settings
from playground.ownership import owner_id
from playground.store import default_store
from playground.study import DEFAULT_PROMPTS, read_prompts
from playground.sweep import MAX_REPEATS, MAX_VALUES_TEXT, METRICS, SWEEP_LINK, SweepRequest, aggregate, parse_knob, \
    run_sweep, sweep_sessions
from playground.ui.compare import ComparePage
from playground.ui.exports import ExportLinks
from playground.ui.html import esc, one_line, status_html
from playground.ui.layout import model_choices
from playground.ui.sessions_view import EXPORT_ROUTE, safe_filename
from visualizers._common import empty_figure
from visualizers.sweep import sweep_figure

NO_KNOB = "(none)"
SWEEPABLE = ("int", "float", "choice", "bool")
METRIC_CHOICES = [(title, key) for key, title, _ in METRICS]
METRIC_NAMES = {key: title for key, title, _ in METRICS}
DIGITS = {key: d for key, _, d in METRICS}
SNIPPET = 80  # characters of a cell's text in the grid


def decoder_choices() -> list[str]:
    """Every decoder a sweep can run (a draft-model decoder takes the tab's draft)."""
    return sorted(st.decoder_specs())


def knob_choices(decoder: Any) -> list[str]:
    """The knobs of ``decoder`` a sweep can vary: numbers, choices and switches."""
    spec = st.decoder_specs().get(str(decoder)) if isinstance(decoder, str) else None
    if spec is None:
        return []
    return [k for k, p in spec["params"].items() if p["type"] in SWEEPABLE]


def _knob(name: Any, values: Any, which: str) -> tuple[str, list[str]] | None:
    """One swept knob from the boxes, or None when the knob is left at *(none)*."""
    if name in (None, "", NO_KNOB):
        return None
    name = inputs.text(f"the {which} knob", name, 100)
    text = inputs.text(f"the {which} knob's values", values, MAX_VALUES_TEXT)
    if not text.strip():
        raise PlaygroundError(f"give the {which} knob's values: 0.3,0.6,0.9 or 0.3:1.5:0.3")
    return parse_knob(f"{name}={text}")


def _fmt(cell: dict[str, Any], metric: str) -> str:
    m, sd = cell.get(metric), cell.get(metric + "_spread")
    if m is None:
        return "—"
    d = DIGITS[metric]
    return f"{m:.{d}f}" + (f" ± {sd:.{d}f}" if (cell.get("repeats") or 0) > 1 and sd else "")


def _label(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _cell_html(cell: dict[str, Any] | None, metric: str) -> str:
    if cell is None:
        return "<td></td>"
    text = (cell.get("texts") or [""])[0]
    short = text if len(text) <= SNIPPET else text[: SNIPPET - 1] + "…"
    sid = (cell.get("sessions") or [""])[0]
    return (f'<td class="sweep-cell" data-index="{",".join(str(i) for i in cell["index"])}">'
            f'<div class="sweep-value">{esc(METRIC_NAMES[metric])} {esc(_fmt(cell, metric))}</div>'
            f'<div class="sweep-text">{esc(short)}</div>'
            f'<a href="?session={esc(sid)}" target="_blank" rel="noopener">open as a comparison</a></td>')


def grid_html(agg: dict[str, Any], metric: str) -> str:
    """The outputs as a grid (rows: the first knob's values; columns: the second's), each cell
    with ``metric``, the start of its first repeat's text and the link of its session."""
    knobs = agg.get("knobs") or []
    at = {tuple(c["index"]): c for c in agg.get("cells") or []}
    if not knobs:
        return ""
    rows_knob = knobs[0]
    cols = knobs[1]["values"] if len(knobs) == 2 else [None]
    head = (f'<tr><th>{esc(rows_knob["name"])} \\ {esc(knobs[1]["name"])}</th>'
            + "".join(f"<th>{esc(_label(v))}</th>" for v in cols) + "</tr>") if len(knobs) == 2 else \
        f'<tr><th>{esc(rows_knob["name"])}</th><th>output</th></tr>'
    body = []
    for i, v in enumerate(rows_knob["values"]):
        cells = [at.get((i, j) if len(knobs) == 2 else (i,)) for j in range(len(cols))]
        body.append(f"<tr><th>{esc(_label(v))}</th>" + "".join(_cell_html(c, metric) for c in cells) + "</tr>")
    greedy = agg.get("greedy")
    ref = (f'<p class="lane-info">The reference run (greedy; for a diffusion decoder one token per step), '
           f'which agreement is measured against: '
           f'<a href="?session={esc(greedy["session"])}" target="_blank" rel="noopener">open</a></p>') if greedy else ""
    return f'<table class="sweep-grid">{head}{"".join(body)}</table>{ref}'


def sweep_status(agg: dict[str, Any]) -> str:
    """One line about a finished sweep."""
    cells = agg.get("cells") or []
    repeats = max((int(c.get("repeats") or 0) for c in cells), default=0)
    return (f"{agg.get('decoder')}: {len(cells)} cell{'s' if len(cells) != 1 else ''} × {repeats} "
            f"seed{'s' if repeats != 1 else ''} on {agg.get('model')}, each stored as a session (open any cell by its "
            f"link); perplexity under {agg.get('scorer')}.")


def _sweep_impl(req: SweepRequest, owner: str | None, progress: Any) -> str:
    """Run the sweep into the page's store (the model work, under the hosting's GPU wrapper)."""
    return run_sweep(default_store(), req, owner=owner, exclusive=False,
                     on_run=lambda done, total: progress((done, total), desc="running the cells", unit="runs"))


# ZeroGPU wants its functions decorated when the app starts, not per request.
sweep_run = gpu(_sweep_impl)


class SweepView:
    """The tab's components and handlers; ``page`` gives the browser's owner key, ``exports``
    the app's download links (the Sessions tab's), which serve the whole sweep as one page."""

    def __init__(self, page: ComparePage, exports: ExportLinks | None = None) -> None:
        self.page = page
        self.exports = exports if exports is not None else ExportLinks()

    def build(self) -> None:
        """Create the components (call inside the Sweep tab)."""
        gr.Markdown("Sweep one decoder over one or two knobs: every cell decodes the same prompt with the same seed, "
                    "so cells differ by their knobs, not their luck; more seeds give each cell its spread. Values: "
                    "`0.3,0.6,0.9` or a range `0.3:1.5:0.3` (both ends included). Every run is stored as a session.",
                    elem_classes=["lane-info"])
        first = "top_p"
        knobs = knob_choices(first)
        with gr.Row(equal_height=True):
            self.decoder = gr.Dropdown(decoder_choices(), value=first, label="Decoder", elem_id="sweep-decoder", scale=2)
            self.model = gr.Dropdown(model_choices(), value=st.DEFAULT_MODEL, label="Model", allow_custom_value=True,
                                     elem_id="sweep-model", scale=2)
            self.draft = gr.Dropdown(model_choices(), value=st.DEFAULT_DRAFT, label="Draft model (speculative decoders)",
                                     elem_id="sweep-draft", scale=2, visible=st.needs_draft(first))
        with gr.Row(equal_height=True):
            self.knob1 = gr.Dropdown(knobs, value="temperature", label="First knob (rows)", elem_id="sweep-knob1", scale=1)
            self.values1 = gr.Textbox("0.3:1.5:0.4", label="its values", elem_id="sweep-values1", scale=2, max_lines=1)
            self.knob2 = gr.Dropdown([NO_KNOB, *knobs], value="p", label="Second knob (columns)", elem_id="sweep-knob2",
                                     scale=1)
            self.values2 = gr.Textbox("0.5,0.9,1.0", label="its values", elem_id="sweep-values2", scale=2, max_lines=1)
        with gr.Row(equal_height=True):
            self.prompt = gr.Textbox(read_prompts(DEFAULT_PROMPTS)[0][1], label="Prompt", lines=2, elem_id="sweep-prompt",
                                     scale=4)
            self.seed = gr.Number(0, precision=0, label="Seed", elem_id="sweep-seed", scale=1, min_width=90)
            self.repeats = gr.Number(1, precision=0, minimum=1, maximum=MAX_REPEATS, label="Seeds per cell",
                                     elem_id="sweep-repeats", scale=1, min_width=90)
            self.max_new = gr.Number(24, precision=0, minimum=1, label="Max new tokens", elem_id="sweep-max-new",
                                     scale=1, min_width=90)
        with gr.Row(equal_height=True):
            self.run_btn = gr.Button("Run sweep", variant="primary", elem_id="sweep-run", scale=1)
            self.metric = gr.Dropdown(METRIC_CHOICES, value="perplexity", label="Metric", elem_id="sweep-metric", scale=1)
            self.status = gr.HTML("", elem_id="sweep-status")
        self.plot = gr.Plot(elem_id="sweep-plot", show_label=False)
        self.grid = gr.HTML("", elem_id="sweep-grid")
        with gr.Row(equal_height=True):
            self.export_btn = gr.Button("Export the sweep as one HTML page", elem_id="sweep-export", scale=1)
            self.export_file = gr.HTML("", elem_id="sweep-export-file")
        self.agg = gr.State(None)

    def wire(self, demo: gr.Blocks) -> None:
        """Attach the events (hidden from the public API); Run takes its place in the model-work group."""
        self.decoder.change(self.on_decoder, [self.decoder], [self.knob1, self.knob2, self.draft], show_progress="hidden")
        self.run_btn.click(self.on_run, [self.decoder, self.model, self.draft, self.knob1, self.values1, self.knob2,
                                         self.values2, self.prompt, self.seed, self.repeats, self.max_new, self.metric,
                                         self.page.owner_key],
                           [self.agg, self.status, self.plot, self.grid], **model_event_settings())
        self.metric.change(self.on_metric, [self.agg, self.metric], [self.plot, self.grid], show_progress="hidden")
        self.export_btn.click(self.on_export, [self.agg], [self.export_file], show_progress="hidden")

    def on_export(self, agg: Any) -> str:
        """A download link (ten minutes) for every run of the shown sweep as one offline HTML page:
        the reference and each cell with its text, scrubber and plots."""
        fp = agg.get("fingerprint") if isinstance(agg, dict) else None
        if not isinstance(fp, str) or not fp:
            return status_html("run a sweep first: the export holds the sweep shown here", "error")
        name = f"sweep-{safe_filename(str(agg.get('decoder') or 'sweep'))[: -len('.json')]}.html"
        token = self.exports.issue(SWEEP_LINK + fp, name)
        return (f'<a class="pg-export-link" href="{EXPORT_ROUTE}/{token}" download="{esc(name)}">'
                f'⇩ Download {esc(name)} (every cell, opens offline)</a>')

    def on_decoder(self, decoder: Any) -> list[Any]:
        """A decoder was picked: its sweepable knobs, and the draft box where it needs one."""
        knobs = knob_choices(decoder)
        return [gr.update(choices=knobs, value=knobs[0] if knobs else None),
                gr.update(choices=[NO_KNOB, *knobs], value=NO_KNOB),
                gr.update(visible=st.needs_draft(decoder if isinstance(decoder, str) else None))]

    def request(self, decoder: Any, model: Any, draft: Any, knob1: Any, values1: Any, knob2: Any, values2: Any,
                prompt: Any, seed: Any, repeats: Any, max_new: Any) -> SweepRequest:
        """The sweep the boxes ask for, every box checked (one line for the first refused)."""
        name = inputs.text("the decoder", decoder, 100)
        if name not in st.decoder_specs():
            raise PlaygroundError(f"unknown decoder {name!r}")
        first = _knob(knob1, values1, "first")
        if first is None:
            raise PlaygroundError("pick the knob to sweep")
        knobs = [first] + ([k] if (k := _knob(knob2, values2, "second")) is not None else [])
        draft_name = inputs.text("the draft model", draft, 1000, optional=True) if st.needs_draft(name) else None
        if st.needs_draft(name) and not draft_name:
            raise PlaygroundError(f"{name} needs a draft model: pick one")
        n_seeds = inputs.seed(repeats, "seeds per cell")
        if not 1 <= n_seeds <= MAX_REPEATS:
            raise PlaygroundError(f"seeds per cell must be between 1 and {MAX_REPEATS}, got {n_seeds}")
        budget = inputs.seed(max_new, "max new tokens")
        if not 1 <= budget <= limits().max_new_tokens:
            raise PlaygroundError(f"max new tokens must be between 1 and {limits().max_new_tokens} on this instance")
        return SweepRequest(decoder=name, knobs=knobs, prompt=inputs.text("the prompt", prompt, limits().max_prompt_chars),
                            draft=draft_name, model=inputs.text("the model", model, 1000, optional=True) or None,
                            seed=inputs.seed(seed), repeats=n_seeds, max_new_tokens=budget)

    def on_run(self, decoder: Any, model: Any, draft: Any, knob1: Any, values1: Any, knob2: Any, values2: Any,
               prompt: Any, seed: Any, repeats: Any, max_new: Any, metric: Any, owner_key: Any = None,
               progress: gr.Progress = gr.Progress()) -> list[Any]:
        """Check the sweep, run the cells not yet stored, and show the figure and the grid."""
        try:
            if limits().no_models:
                raise PlaygroundError("a sweep runs the model, and model loading is disabled on this instance "
                                      "(replay only); open a stored sweep's cells by their links")
            req = self.request(decoder, model, draft, knob1, values1, knob2, values2, prompt, seed, repeats, max_new)
            fp = sweep_run(req, owner_id(owner_key), progress)
            agg = {**aggregate(sweep_sessions(default_store(), fp)), "fingerprint": fp}
        except PlaygroundError as e:
            return [gr.skip(), status_html(one_line(str(e)), "error"), gr.skip(), gr.skip()]
        metric = metric if metric in METRIC_NAMES else "perplexity"
        return [agg, status_html(sweep_status(agg), "ok"), sweep_figure(agg, metric, METRIC_NAMES[metric]),
                grid_html(agg, metric)]

    def on_metric(self, agg: Any, metric: Any) -> list[Any]:
        """Another metric: redraw the figure and the grid from the shown sweep."""
        if not isinstance(agg, dict) or metric not in METRIC_NAMES:
            return [empty_figure("run a sweep first", "Sweep"), ""]
        return [sweep_figure(agg, metric, METRIC_NAMES[metric]), grid_html(agg, metric)]
