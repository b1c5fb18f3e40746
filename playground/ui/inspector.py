"""What the Compare page shows of traces: lane outputs and stats, the step inspector, the
comparison strip (:class:`InspectorHandlers`, built on the pure :mod:`playground.ui.updates`),
and the handlers that redraw them (scrubber, token click, colouring).

:class:`PlotPacer` decides when a streaming run may redraw plots, so drawing never crowds
out decoding.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Callable

import gradio as gr

import visualizers
import playground.ui.rules as st
from playground.ui.align import at_position
from playground.ui.events import nothing_is_skip
from playground.ui.html import empty_output, error_html, stats_html
from playground.ui.lane_reset import press_run_column, press_run_lane
from playground.ui.layout import Layout
from playground.ui.page_js import page_js
from playground.ui.page_session import PageSessions, session_key
from playground.ui.updates import compare_updates, insp_header, is_cleared, slot_updates

PLOT_EVERY_S = 1.0  # plot refresh period while streaming (text streams at the runner's rate)

# Outline the tokens of the scrubbed step in every lane (client-side, no round trip).
HIGHLIGHT_JS = page_js("highlight_step.js")


class InspectorHandlers:
    """Update builders and handlers of the results, over the page's components ``ui``; the
    page registry ``sessions`` says which run a page streams and keeps the step picked meanwhile."""

    def __init__(self, ui: Layout, sessions: PageSessions) -> None:
        self.ui, self.sessions = ui, sessions

    # ================================================================== events
    def wire_inspector(self, demo: gr.Blocks) -> None:
        """Attach the scrubber and token-click events."""
        page = self.ui
        page.step.input(nothing_is_skip(self.on_step), [page.step, page.traces], page.step_outputs(),
                        show_progress="hidden", trigger_mode="always_last")
        page.step.change(None, [page.step], None, js=HIGHLIGHT_JS)
        for lane in page.lanes:
            lane.output.click(nothing_is_skip(self.on_token), [page.traces, page.align],
                              page.step_outputs() + [page.position], show_progress="hidden")

    def wire_metric(self, demo: gr.Blocks) -> None:
        """Attach the colouring picker."""
        self.ui.metric.change(nothing_is_skip(self.on_metric), [self.ui.metric, self.ui.traces],
                              [c for ui in self.ui.lanes for c in (ui.output, ui.legend, ui.stats)],
                              show_progress="hidden")

    # ================================================================== update builders
    def result_updates(self, traces: list[dict[str, Any]], metric: str, step: int | None = None,
                       plots: bool = True, status: str | None = None, sid: Any = None,
                       live: bool = False) -> dict[Any, Any]:
        """Updates that show ``traces`` (lane outputs, stats and, with ``plots``, the inspector)."""
        up: dict[Any, Any] = {self.ui.traces: traces, self.ui.shown: secrets.token_hex(8)}
        if status is not None:
            up[self.ui.status] = status
        if sid is not None:
            up[self.ui.sid] = sid
        for j, ui in enumerate(self.ui.lanes):
            if j >= len(traces):
                continue
            up.update(self.lane_updates(j, traces[j], metric, live=live))
        if plots:
            up.update(self.inspector_updates(traces, step))
        return up

    def legend_updates(self, traces: list[dict[str, Any]], metric: str, shown: dict[int, str]) -> dict[Any, Any]:
        """While a run streams (its lane text comes by the live feed): a lane's legend when its
        colouring is first known or changes (``shown``: lane -> metric, updated)."""
        up: dict[Any, Any] = {}
        for j, tr in enumerate(traces[: len(self.ui.lanes)]):
            m = st.auto_metric(tr, metric)
            if shown.get(j) != m:
                shown[j] = m
                up[self.ui.lanes[j].legend] = visualizers.legend_html(m)
        return up

    def live_lane(self, j: int, trace: dict[str, Any], metric: str) -> tuple[str, str]:
        """Lane ``j``'s streaming output (an open string that grows by appending) and stats,
        as the live feed sends them (empty for a lane the page does not have)."""
        if j >= len(self.ui.lanes):
            return "", ""
        up = self.lane_updates(j, trace, metric, live=True)
        return up[self.ui.lanes[j].output], up[self.ui.lanes[j].stats]

    def lane_updates(self, j: int, trace: dict[str, Any], metric: str, live: bool = False) -> dict[Any, Any]:
        """Output, legend and stats of lane ``j`` (0-based); ``live`` while streaming."""
        ui = self.ui.lanes[j]
        if is_cleared(trace):  # set up anew since its run: nothing of that run is shown
            return press_run_lane(ui)
        m = st.auto_metric(trace, metric)
        if trace.get("preparing"):
            return {ui.output: empty_output(ui.k, "Preparing (loading models if needed)…"),
                    ui.legend: visualizers.legend_html(m), ui.stats: stats_html("")}
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
                ui.stats: stats_html(visualizers.stats_line(trace))}

    def inspector_updates(self, traces: list[dict[str, Any]], step: int | None = None,
                          run_plots: bool = True, follow: bool = True) -> dict[Any, Any]:
        """The scrubber, the comparison strip and every lane's plots at ``step`` (None: last).

        With ``follow`` False (the user picked a step while the run streams) the scrubber's
        range grows but its value stays where the user put it.
        """
        counts = [visualizers.step_count(t) for t in traces]
        top = max(counts, default=0)
        s = top - 1 if step is None else step
        s = max(0, min(int(s), max(top - 1, 0)))
        up: dict[Any, Any] = {self.ui.step: gr.update(minimum=0, maximum=max(top - 1, 1), value=s) if follow
                              else gr.update(minimum=0, maximum=max(top - 1, 1))}
        if run_plots:
            up[self.ui.progress_plot] = visualizers.progress_figure(traces)
            up[self.ui.divergence] = visualizers.divergence_html(traces)
            up.update(compare_updates(self.ui.compare_plots, traces))
        for j, ui in enumerate(self.ui.lanes):
            if j >= len(traces):
                up[ui.insp_column] = gr.update(visible=False)
                continue
            tr = traces[j]
            up[ui.insp_column] = gr.update(visible=True)
            if is_cleared(tr):
                up.update(press_run_column(ui, tr.get("decoder") or "", run=run_plots))
                continue
            up[ui.insp_header] = insp_header(ui.k, tr, min(s, max(counts[j] - 1, 0)), counts[j])
            up.update(slot_updates(ui.step_html, ui.step_plots, visualizers.step_figures(tr, s)))
            if run_plots:
                up.update(slot_updates(ui.run_html, ui.run_plots, visualizers.run_figures(tr)))
        return up

    def strip_updates(self, traces: list[dict[str, Any]], follow: bool = True) -> dict[Any, Any]:
        """The cheap part of the inspector: scrubber range and the comparison strip."""
        top = max((visualizers.step_count(t) for t in traces), default=0)
        rng = {"minimum": 0, "maximum": max(top - 1, 1)}
        return {self.ui.step: gr.update(**rng, value=max(top - 1, 0)) if follow else gr.update(**rng),
                self.ui.progress_plot: visualizers.progress_figure(traces),
                self.ui.divergence: visualizers.divergence_html(traces)}

    def step_updates(self, traces: list[dict[str, Any]], step: int) -> dict[Any, Any]:
        """What a scrubber move changes: each lane's step plots (and its header)."""
        return self.inspector_updates(traces, step, run_plots=False)

    # ================================================================== handlers
    def on_metric(self, metric: str, traces: list[dict[str, Any]]) -> dict[Any, Any]:
        """Recolour every lane's output."""
        up: dict[Any, Any] = {}
        for j, tr in enumerate(traces or []):
            if j < len(self.ui.lanes):
                up.update(self.lane_updates(j, tr, metric))
        return up

    def on_step(self, step: float, traces: list[dict[str, Any]], request: gr.Request) -> dict[Any, Any]:
        """The scrubber moved: redraw each lane's step plots (of the live run while one streams)."""
        return self.step_updates(looked_at(self.sessions, request, traces, int(step or 0)), int(step or 0))

    def on_token(self, traces: list[dict[str, Any]], align: str, evt: gr.EventData,
                 request: gr.Request) -> dict[Any, Any]:
        """A token was clicked: jump the scrubber to the step that produced it (under token
        position alignment, the position scrubber to its position)."""
        data = getattr(evt, "_data", None) or {}
        try:
            step = int(data.get("step"))
        except (TypeError, ValueError):
            return {}
        if align == "position" and isinstance(data.get("pos"), int) and data["pos"] >= 0:
            return at_position(self.ui, list(traces or []), data["pos"])
        return self.step_updates(looked_at(self.sessions, request, traces, step), step)


def looked_at(sessions: PageSessions, request: Any, traces: list[dict[str, Any]] | None,
              step: int) -> list[dict[str, Any]]:
    """The traces the user is looking at: the live snapshots while this page's run streams
    (its traces state is filled in only when it ends; the run's paced redraws now follow
    ``step``), else the stored ``traces``."""
    page = sessions.page(session_key(request))
    page.select_step(step)
    runner = page.running()
    if runner is None:
        return list(traces or [])
    return runner.latest()[1]


class PlotPacer:
    """Decides when a streaming run may redraw plots, so drawing never crowds out decoding.

    Each kind of redraw (today one: "strip", the comparison strip) waits
    at least its base period and at least ``factor`` times what its last redraw cost, which
    keeps plotting under about 1/factor of the time however slow the machine is.
    """

    BASE = {"strip": 2 * PLOT_EVERY_S}

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

        return _T()
