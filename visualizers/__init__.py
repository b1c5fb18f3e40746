"""Visualizers: pure functions from trace dicts to plotly figures or escaped HTML.

The page calls :func:`step_figures` (the plots of one step, chosen by the step's kind),
:func:`run_figures` (whole-run plots), :func:`step_count`, and the token/compare
functions; so a new trace kind plugs in here without changes to the UI. A visualizer module
registers its own plots where it defines them, with :func:`step_plot` / :func:`run_plot` /
:func:`compare_plot` (decorators from :mod:`visualizers.registry`, which holds the tables they
fill); every module of this package is imported at the end of this file, so a new one needs no
list entry. Every function accepts an empty or partial trace (a live snapshot with no steps
yet, a trace missing an optional field) and returns a figure with a note instead of raising.
None of them touches a model: a stored trace replays with every plot.
"""

from __future__ import annotations

from typing import Any, Callable

import importlib
import pkgutil

import plotly.graph_objects as go

from visualizers._common import METRICS, empty_figure, kinds_in, pick_step, steps_of
from visualizers.registry import (COMPARE_PLOTS, EVIDENCE_METRICS, HTML_PLOTS, KIND_METRICS, MAX_RUN_PLOTS,
                                  MAX_STEP_PLOTS, RUN_EVIDENCE_PLOTS, RUN_PLOTS, STEP_PLOTS, YIELDS_TO, Plot,
                                  compare_plot, run_plot, step_plot, unregister)
from visualizers.beam import beam_tree_figure
from visualizers.canvas import canvas_html, commits_per_step_figure, position_metrics_figure, unmask_heatmap
from visualizers.compare import divergence_html, progress_figure
from visualizers.contrast import candidates_html, contrast_figure, contrast_run_figure, dola_figure, dola_run_figure
from visualizers.dist import distribution_figure, timeline_figure
from visualizers.divergence import divergence_figure
from visualizers.forced import forced_figure
from visualizers.guided import constraint_figure, constraint_run_figure
from visualizers.jacobi import jacobi_grid_figure
from visualizers.lens import lens_figure, lens_run_figure
from visualizers.search import (draft_canvas_html, frontier_figure, handover_figure, mbr_figure, surprisal_figure,
                                trials_figure)
from visualizers.smc import ess_figure, particles_figure
from visualizers.tokens import legend_html, stats_line, tokens_html
from visualizers.tree import accepted_length_histogram, acceptance_timeline, draft_tree_figure
from visualizers.watermark import watermark_tokens_html, watermark_z_figure

def auto_metric(trace: dict[str, Any], metric: str = "auto") -> str:
    """The token colouring for a lane: ``metric``, or under ``auto`` the one its step kinds suit
    (:data:`KIND_METRICS`), else the one its evidence suits (:data:`EVIDENCE_METRICS`), else the
    probability of each token. Where several suit, the most specific wins: the later in
    ``METRICS`` (a canvas's unmasking order over acceptance over probability), so the choice
    never depends on the order the plots were registered in."""
    if metric != "auto":
        return metric
    kinds = set(kinds_in(trace))
    suited = [m for k, m in KIND_METRICS.items() if k in kinds]
    if not suited:
        steps = steps_of(trace)
        suited = [m for f, m in EVIDENCE_METRICS.items() if any(isinstance(s.get(f), dict) for s in steps)]
    return max(suited, key=METRICS.index, default="probability")


def step_count(trace: dict[str, Any]) -> int:
    """Number of steps in a trace (0 for an empty or malformed one)."""
    return len(steps_of(trace))


def _safe(title: str, fn: Callable[..., Plot], *args: Any) -> Plot:
    """Call a plot function; a bug on odd evidence becomes a note, not a broken page."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the inspector must never take the page down
        note = f"could not draw this plot: {type(e).__name__}"
        if fn in HTML_PLOTS:
            import html

            return f'<div class="note">{html.escape(note)}</div>'
        return empty_figure(note, title)


def step_figures(trace: dict[str, Any], step: int) -> list[tuple[str, Plot]]:
    """The plots for the kind of step ``step`` (clamped into range): (title, figure or HTML)."""
    i, s = pick_step(trace, step)
    if s is None:
        return [("Step", empty_figure("no steps yet", "Step"))]
    plots = STEP_PLOTS.get(str(s.get("kind")))
    if not plots:
        return [("Step", empty_figure(f"no plot for {s.get('kind')!r} steps yet", "Step"))]
    chosen = [(title, fn) for title, fn, need in plots if need is None or _has(s, need)]
    titles = [t for t, _ in chosen]
    for t, better in YIELDS_TO.items():
        if len(chosen) > MAX_STEP_PLOTS and t in titles and better in titles:
            chosen = [c for c in chosen if c[0] != t]
            titles.remove(t)
    return [(title, _safe(title, fn, trace, i)) for title, fn in chosen[:MAX_STEP_PLOTS]]


def _has(step: dict[str, Any], field: str) -> bool:
    """Whether a step carries evidence ``field`` a plot can draw (a dict, or a non-empty list)."""
    v = step.get(field)
    return isinstance(v, dict) or (isinstance(v, list) and len(v) > 0)


def run_figures(trace: dict[str, Any]) -> list[tuple[str, go.Figure]]:
    """Whole-run plots for the step kinds in the trace (each plot once)."""
    kinds = kinds_in(trace)
    if not kinds:
        return [("Run", empty_figure("no steps yet", "Run"))]
    out: list[tuple[str, go.Figure]] = []
    seen: set[Any] = set()
    for k in kinds:
        for title, fn in RUN_PLOTS.get(k, []):
            if fn in seen:
                continue
            seen.add(fn)
            out.append((title, _safe(title, fn, trace)))
    steps = steps_of(trace)
    for field, plots in RUN_EVIDENCE_PLOTS.items():
        if not any(_has(s, field) for s in steps):
            continue
        for title, fn in plots:
            if fn not in seen:
                seen.add(fn)
                out.append((title, _safe(title, fn, trace)))
    return out[:MAX_RUN_PLOTS] or [("Run", empty_figure("no whole-run plot for this trace", "Run"))]


def _import_modules() -> None:
    """Import every visualizer module, so one that registers its plots needs no list entry."""
    for info in pkgutil.iter_modules(__path__, prefix=__name__ + "."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


_import_modules()

__all__ = [
    "STEP_PLOTS", "RUN_PLOTS", "RUN_EVIDENCE_PLOTS", "KIND_METRICS", "EVIDENCE_METRICS", "COMPARE_PLOTS",
    "HTML_PLOTS", "YIELDS_TO", "MAX_STEP_PLOTS", "MAX_RUN_PLOTS", "METRICS", "Plot",
    "step_plot", "run_plot", "compare_plot", "unregister", "auto_metric",
    "step_count", "step_figures", "run_figures", "divergence_figure", "forced_figure",
    "tokens_html", "legend_html", "stats_line",
    "distribution_figure", "timeline_figure",
    "draft_tree_figure", "accepted_length_histogram", "acceptance_timeline",
    "canvas_html", "unmask_heatmap", "position_metrics_figure", "commits_per_step_figure",
    "beam_tree_figure", "jacobi_grid_figure",
    "progress_figure", "divergence_html",
    "contrast_figure", "contrast_run_figure", "candidates_html", "dola_figure", "dola_run_figure",
    "lens_figure", "lens_run_figure",
    "watermark_tokens_html", "watermark_z_figure", "particles_figure", "ess_figure",
    "constraint_figure", "constraint_run_figure",
]
