"""Visualizers: pure functions from trace dicts to plotly figures or escaped HTML.

The page calls :func:`step_figures` (the plots of one step, chosen by the step's kind),
:func:`run_figures` (whole-run plots), :func:`step_count`, and the token/compare
functions; so a new trace kind plugs in here without changes to the UI. Every function
accepts an empty or partial trace (a live snapshot with no steps yet, a trace missing an
optional field) and returns a figure with a note instead of raising. None of them
touches a model: a stored trace replays with every plot.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import plotly.graph_objects as go

from visualizers._common import empty_figure, kinds_in, pick_step, steps_of
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
from visualizers.smc import ess_figure, particles_figure
from visualizers.tokens import legend_html, stats_line, tokens_html
from visualizers.tree import accepted_length_histogram, acceptance_timeline, draft_tree_figure
from visualizers.watermark import watermark_tokens_html, watermark_z_figure

Plot = Union[go.Figure, str]

# The plots of one step, by step kind: (title, function(trace, step), evidence field the
# plot needs or None). A plot whose field the step lacks is left out.
STEP_PLOTS: dict[str, list[tuple[str, Callable[[dict[str, Any], int], Plot], str | None]]] = {
    "token": [("Distribution", distribution_figure, None),
              ("Paired distributions", contrast_figure, "contrast"),
              ("Layer divergence", dola_figure, "dola"),
              ("Candidates", candidates_html, "candidates"),
              ("Logit lens", lens_figure, "lens"),
              ("Watermark", watermark_tokens_html, "watermark"),
              ("Constraint", constraint_figure, "constraint")],
    "draft": [("Draft tree", draft_tree_figure, None), ("Correction distribution", distribution_figure, "correction_dist"),
              ("Constraint", constraint_figure, "constraint")],
    "denoise": [("Canvas", canvas_html, None), ("Per-position metrics", position_metrics_figure, None)],
    "beam": [("Beam tree", beam_tree_figure, None), ("Particles", particles_figure, "smc"),
             ("Constraint", constraint_figure, "constraint")],
    "jacobi": [("Jacobi grid", jacobi_grid_figure, None)],
}
MAX_STEP_PLOTS = 3  # the page has this many slots per lane for step plots
# When a step has more plots than slots, a plot gives its slot up to one that shows what it
# shows and more: the paired distributions' first row is the model's own distribution.
YIELDS_TO = {"Distribution": "Paired distributions"}
# Plot functions that return HTML (their fallback on a bug is an HTML note, not a figure).
HTML_PLOTS: set[Callable[..., Any]] = {canvas_html, candidates_html, watermark_tokens_html}
MAX_RUN_PLOTS = 4  # ... and this many for whole-run plots

# Whole-run plots, by the step kinds a trace contains.
RUN_PLOTS: dict[str, list[tuple[str, Callable[[dict[str, Any]], go.Figure]]]] = {
    "token": [("Entropy and probability", timeline_figure)],
    "draft": [("Accepted length", accepted_length_histogram), ("Acceptance over time", acceptance_timeline)],
    "denoise": [("Unmasking heatmap", unmask_heatmap), ("Commits per step", commits_per_step_figure),
                ("Confidence over steps", timeline_figure)],
    "beam": [("Beam scores", timeline_figure)],
    "jacobi": [("Jacobi convergence", timeline_figure)],
}
# Whole-run plots, by an evidence field some step of the trace carries (after the kinds' plots).
RUN_EVIDENCE_PLOTS: dict[str, list[tuple[str, Callable[[dict[str, Any]], go.Figure]]]] = {
    "contrast": [("Chosen token's rank", contrast_run_figure)],
    "dola": [("Premature layer per step", dola_run_figure)],
    "lens": [("Logit lens over the run", lens_run_figure)],
    "watermark": [("Watermark z-score", watermark_z_figure)],
    "smc": [("Effective sample size", ess_figure)],
    "forced": [("Forced tokens", forced_figure)],
    "constraint": [("Constraint over the run", constraint_run_figure)],
}


# Plots across lanes (functions of the list of traces), drawn in the comparison strip.
COMPARE_PLOTS: list[tuple[str, Callable[[list[dict[str, Any]]], go.Figure]]] = [
    ("Divergence between lanes", divergence_figure),
]


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


__all__ = [
    "STEP_PLOTS", "RUN_PLOTS", "COMPARE_PLOTS", "divergence_figure", "forced_figure", "step_count", "step_figures", "run_figures",
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
