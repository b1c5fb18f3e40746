"""The plot registry: which plots the page draws, for which steps and runs, in what order.

Each visualizer module registers its own plots where it defines them, with :func:`step_plot`
(one step's plots, by step kind), :func:`run_plot` (whole-run plots, by step kind or by an
evidence field) and :func:`compare_plot` (plots across lanes). The tables below are derived
from those registrations and nothing else writes into them; the page reads them through
``visualizers.step_figures`` / ``run_figures``. This module imports no plot module, so a
plot module imports it without importing the package back.

``order`` places a plot among the plots it is listed with (a kind's step plots, a kind's
run plots, the evidence run plots, the compare plots): lower first. A plot registered
without one comes after those with one, in registration order, so nothing depends on the
order in which the package imports its modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Any, Callable, Union

import plotly.graph_objects as go

from visualizers._common import METRICS

Plot = Union[go.Figure, str]
StepPlotFn = Callable[[dict[str, Any], int], Plot]
RunPlotFn = Callable[[dict[str, Any]], go.Figure]
ComparePlotFn = Callable[[list[dict[str, Any]]], go.Figure]

MAX_STEP_PLOTS = 3  # the page has this many slots per lane for step plots
MAX_RUN_PLOTS = 4  # ... and this many for whole-run plots

# The derived tables (see the module docstring), in the shapes the page, the catalogue and
# the tests read. The plots of one step, by step kind: (title, function(trace, step), evidence
# field the plot needs or None); a plot whose field the step lacks is left out.
STEP_PLOTS: dict[str, list[tuple[str, StepPlotFn, str | None]]] = {}
# Whole-run plots, by the step kinds a trace contains: (title, function(trace)).
RUN_PLOTS: dict[str, list[tuple[str, RunPlotFn]]] = {}
# Whole-run plots, by an evidence field some step of the trace carries (after the kinds' plots).
RUN_EVIDENCE_PLOTS: dict[str, list[tuple[str, RunPlotFn]]] = {}
# Plots across lanes (functions of the list of traces), drawn in the comparison strip.
COMPARE_PLOTS: list[tuple[str, ComparePlotFn]] = []
# Plot functions that return HTML (their fallback on a bug is an HTML note, not a figure).
HTML_PLOTS: set[Callable[..., Any]] = set()
# When a step has more plots than slots, a plot gives its slot up to one that shows what it
# shows and more (title -> the better plot's title).
YIELDS_TO: dict[str, str] = {}
# The token colouring a lane gets under "auto", by the step kinds its trace holds ...
KIND_METRICS: dict[str, str] = {}
# ... and else by an evidence field (a dict) some step carries.
EVIDENCE_METRICS: dict[str, str] = {}


@dataclass(frozen=True)
class _Registration:
    """One registered plot: where it is listed (``table``, ``key``) and what it declares."""

    table: str  # "step", "run", "evidence" or "compare"
    key: str  # the step kind or evidence field it is listed under ("" for compare plots)
    title: str
    fn: Callable[..., Any]
    order: float | None
    seq: int  # registration order, for plots of equal (or no) order
    needs: str | None = None
    html: bool = False
    metric: str | None = None
    yields_to: str | None = None

    def rank(self) -> tuple[int, float, int]:
        """Sort key: plots with an ``order`` first, by it; then registration order."""
        return (0, self.order, self.seq) if self.order is not None else (1, 0.0, self.seq)


_REGISTRATIONS: list[_Registration] = []
_SEQ = count()


def _check_metric(metric: str | None) -> None:
    if metric is not None and metric not in METRICS:
        raise ValueError(f"unknown token metric {metric!r}; one of {', '.join(METRICS)}")


def _rebuild() -> None:
    """Derive every table from the registrations, each list in rank order."""
    for table in (STEP_PLOTS, RUN_PLOTS, RUN_EVIDENCE_PLOTS, YIELDS_TO, KIND_METRICS, EVIDENCE_METRICS):
        table.clear()
    COMPARE_PLOTS.clear()
    HTML_PLOTS.clear()
    for r in sorted(_REGISTRATIONS, key=_Registration.rank):
        if r.table == "step":
            STEP_PLOTS.setdefault(r.key, []).append((r.title, r.fn, r.needs))
        elif r.table == "run":
            RUN_PLOTS.setdefault(r.key, []).append((r.title, r.fn))
        elif r.table == "evidence":
            RUN_EVIDENCE_PLOTS.setdefault(r.key, []).append((r.title, r.fn))
        else:
            COMPARE_PLOTS.append((r.title, r.fn))
        if r.html:
            HTML_PLOTS.add(r.fn)
        if r.yields_to is not None:
            YIELDS_TO.setdefault(r.title, r.yields_to)
        if r.metric is not None:
            (EVIDENCE_METRICS if r.table == "evidence" else KIND_METRICS).setdefault(r.key, r.metric)


def _add(**fields: Any) -> None:
    _REGISTRATIONS.append(_Registration(seq=next(_SEQ), **fields))
    _rebuild()


def step_plot(kind: str, title: str, *, needs: str | None = None, html: bool = False, metric: str | None = None,
              order: float | None = None, yields_to: str | None = None,
              ) -> Callable[[Callable[..., Plot]], Callable[..., Plot]]:
    """Decorator: draw ``fn(trace, step)`` for steps of ``kind`` (only steps carrying evidence
    ``needs``, when given). ``html``: it returns HTML, not a figure. ``metric``: the token
    colouring (one of ``METRICS``) that suits lanes with steps of this kind. ``order``: its
    place among the kind's step plots. ``yields_to``: the title of a plot that shows what
    this one shows and more, which takes this one's slot when the step has more plots than
    the page has slots.

    ``kind`` need not be declared yet: visualizers never import decoders, and a new kind is
    declared by the decoder module that yields it (``tests/test_extend.py`` checks that every
    kind with a plot is declared once the decoders are imported)."""
    _check_metric(metric)

    def add(fn: Callable[..., Plot]) -> Callable[..., Plot]:
        _add(table="step", key=kind, title=title, fn=fn, order=order, needs=needs, html=html, metric=metric,
             yields_to=yields_to)
        return fn

    return add


def run_plot(title: str, *, kind: str | None = None, evidence: str | None = None, metric: str | None = None,
             order: float | None = None) -> Callable[[RunPlotFn], RunPlotFn]:
    """Decorator: draw ``fn(trace)`` once per run, for traces with steps of ``kind`` or with
    some step carrying evidence field ``evidence`` (exactly one of the two). ``metric``: the
    token colouring that suits lanes with that evidence (see :func:`step_plot`). ``order``:
    its place among the kind's run plots, or among all evidence run plots."""
    if (kind is None) == (evidence is None):
        raise ValueError("a run plot is registered for a step kind or for an evidence field, not both")
    _check_metric(metric)

    def add(fn: RunPlotFn) -> RunPlotFn:
        table, key = ("run", kind) if kind is not None else ("evidence", evidence)
        _add(table=table, key=str(key), title=title, fn=fn, order=order, metric=metric)
        return fn

    return add


def compare_plot(title: str, *, order: float | None = None) -> Callable[[ComparePlotFn], ComparePlotFn]:
    """Decorator: draw ``fn(traces)`` over all lanes in the comparison strip. ``order``: its
    place among the compare plots."""

    def add(fn: ComparePlotFn) -> ComparePlotFn:
        _add(table="compare", key="", title=title, fn=fn, order=order)
        return fn

    return add


def unregister(fn: Callable[..., Any]) -> None:
    """Remove a plot function from every table, with what it declared (for tests that register
    one of their own)."""
    _REGISTRATIONS[:] = [r for r in _REGISTRATIONS if r.fn is not fn]
    _rebuild()
