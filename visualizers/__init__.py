"""Visualizers: pure functions from trace dicts to plotly figures or escaped HTML.

The page calls :func:`step_figures` (the plots of one step, chosen by the step's kind),
:func:`run_figures` (whole-run plots), :func:`step_count`, and the token/compare
functions; so a new trace kind plugs in here without changes to the UI. A visualizer module
registers its own plots with :func:`step_plot` / :func:`run_plot` (decorators); every module of
this package is imported at the end of this file, so a new one needs no list entry. Every function
accepts an empty or partial trace (a live snapshot with no steps yet, a trace missing an
optional field) and returns a figure with a note instead of raising. None of them
touches a model: a stored trace replays with every plot.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import importlib
import pkgutil

import plotly.graph_objects as go

from playground.core.trace import STEP_KINDS
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
from visualizers.search import (draft_canvas_html, frontier_figure, handover_figure, mbr_figure, surprisal_figure,
                                trials_figure)
from visualizers.smc import ess_figure, particles_figure
from visualizers.tokens import METRICS, legend_html, stats_line, tokens_html
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
              ("Constraint", constraint_figure, "constraint"),
              ("Rollouts", trials_figure, "trials")],
    "draft": [("Draft tree", draft_tree_figure, None), ("Diffusion draft canvas", draft_canvas_html, "draft_canvas"),
              ("Correction distribution", distribution_figure, "correction_dist"),
              ("Constraint", constraint_figure, "constraint")],
    "denoise": [("Canvas", canvas_html, None), ("Per-position metrics", position_metrics_figure, None)],
    "beam": [("Beam tree", beam_tree_figure, None), ("Particles", particles_figure, "smc"),
             ("Constraint", constraint_figure, "constraint"), ("Frontier and pops", frontier_figure, "frontier"),
             ("MBR utilities", mbr_figure, "mbr")],
    "jacobi": [("Jacobi grid", jacobi_grid_figure, None)],
}
MAX_STEP_PLOTS = 3  # the page has this many slots per lane for step plots
# When a step has more plots than slots, a plot gives its slot up to one that shows what it
# shows and more: the paired distributions' first row is the model's own distribution; the
# sampler chain's first stages are the constraint's bias and mask, with its blocked and kept tokens.
YIELDS_TO = {"Distribution": "Paired distributions", "Constraint": "Sampler chain"}
# Plot functions that return HTML (their fallback on a bug is an HTML note, not a figure).
HTML_PLOTS: set[Callable[..., Any]] = {canvas_html, candidates_html, watermark_tokens_html, draft_canvas_html}
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
    "uid": [("Surprisal curve", surprisal_figure)],
    "handover": [("Who wrote each token", handover_figure)],
    "watermark": [("Watermark z-score", watermark_z_figure)],
    "smc": [("Effective sample size", ess_figure)],
    "forced": [("Forced tokens", forced_figure)],
    "constraint": [("Constraint over the run", constraint_run_figure)],
}


# Plots across lanes (functions of the list of traces), drawn in the comparison strip.
COMPARE_PLOTS: list[tuple[str, Callable[[list[dict[str, Any]]], go.Figure]]] = [
    ("Divergence between lanes", divergence_figure),
]


# The token colouring a lane gets under "auto", by the step kinds its trace holds (first match).
KIND_METRICS: dict[str, str] = {"denoise": "unmask_step", "draft": "acceptance", "jacobi": "acceptance"}
# ... and else by an evidence field (a dict) some step carries (first match).
EVIDENCE_METRICS: dict[str, str] = {"watermark": "watermark"}


def step_plot(kind: str, title: str, *, needs: str | None = None, html: bool = False,
              metric: str | None = None) -> Callable[[Callable[..., Plot]], Callable[..., Plot]]:
    """Decorator: draw ``fn(trace, step)`` for steps of ``kind`` (only steps carrying evidence
    ``needs``, when given). ``html``: it returns HTML, not a figure. ``metric``: the token
    colouring (one of ``visualizers.tokens.METRICS``) that suits lanes with steps of this kind.

    ``kind`` need not be declared yet: visualizers never import decoders, and a new kind is
    declared by the decoder module that yields it (``tests/test_extend.py`` checks that every
    kind with a plot is declared once the decoders are imported)."""
    if metric is not None and metric not in METRICS:
        raise ValueError(f"unknown token metric {metric!r}; one of {', '.join(METRICS)}")

    def add(fn: Callable[..., Plot]) -> Callable[..., Plot]:
        STEP_PLOTS.setdefault(kind, []).append((title, fn, needs))
        if html:
            HTML_PLOTS.add(fn)
        if metric is not None:
            KIND_METRICS.setdefault(kind, metric)
        return fn

    return add


def run_plot(title: str, *, kind: str | None = None, evidence: str | None = None, metric: str | None = None,
             ) -> Callable[[Callable[[dict[str, Any]], go.Figure]], Callable[[dict[str, Any]], go.Figure]]:
    """Decorator: draw ``fn(trace)`` once per run, for traces with steps of ``kind`` or with
    some step carrying evidence field ``evidence`` (exactly one of the two). ``metric``: the
    token colouring that suits lanes with that evidence (see :func:`step_plot`)."""
    if (kind is None) == (evidence is None):
        raise ValueError("a run plot is registered for a step kind or for an evidence field, not both")
    if metric is not None and metric not in METRICS:
        raise ValueError(f"unknown token metric {metric!r}; one of {', '.join(METRICS)}")

    def add(fn: Callable[[dict[str, Any]], go.Figure]) -> Callable[[dict[str, Any]], go.Figure]:
        table = RUN_PLOTS if kind is not None else RUN_EVIDENCE_PLOTS
        key = str(kind if kind is not None else evidence)
        table.setdefault(key, []).append((title, fn))
        if metric is not None:
            (KIND_METRICS if kind is not None else EVIDENCE_METRICS).setdefault(key, metric)
        return fn

    return add


def unregister(fn: Callable[..., Any]) -> None:
    """Remove a plot function from every table (for tests that register one of their own)."""
    for table in (STEP_PLOTS, RUN_PLOTS, RUN_EVIDENCE_PLOTS):
        for key in list(table):
            table[key] = [entry for entry in table[key] if entry[1] is not fn]
            if not table[key]:
                del table[key]
    HTML_PLOTS.discard(fn)


def auto_metric(trace: dict[str, Any], metric: str = "auto") -> str:
    """The token colouring for a lane: ``metric``, or under ``auto`` the one its step kinds suit
    (:data:`KIND_METRICS`), else the one its evidence suits (:data:`EVIDENCE_METRICS`), first
    match, else the probability of each token."""
    if metric != "auto":
        return metric
    kinds = set(kinds_in(trace))
    for k, m in KIND_METRICS.items():
        if k in kinds:
            return m
    steps = steps_of(trace)
    return next((m for f, m in EVIDENCE_METRICS.items() if any(isinstance(s.get(f), dict) for s in steps)),
                "probability")


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
    "STEP_PLOTS", "RUN_PLOTS", "RUN_EVIDENCE_PLOTS", "KIND_METRICS", "COMPARE_PLOTS", "step_plot", "run_plot",
    "unregister", "auto_metric", "EVIDENCE_METRICS", "divergence_figure", "forced_figure", "step_count", "step_figures", "run_figures",
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
