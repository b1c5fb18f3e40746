"""Clearing lanes whose setup changed, so the page never shows a run under another setup's label.

A lane whose decoder, knobs, lane model or draft change, a lane that ``+ Lane`` brings back,
and every lane of a picked preset or model go back to their "Press Run" state: output, stats,
legend and inspector column. The page's stored traces follow: a cleared lane's trace is
replaced by an empty one marked ``cleared`` (so a scrub or a token click cannot draw the old
lane again), a lane ``− Lane`` hid is dropped, and the comparison strip, the session id and
the share link — which speak for the whole old comparison — are cleared with them.

Pure update builders over the page's components (:class:`~playground.ui.layout.Layout`); the
lane configuration's handlers (``lane_config``) return what these build, one event per change.
"""

from __future__ import annotations

import secrets
from typing import Any

import gradio as gr

import visualizers
from playground.runner import pending_trace
from playground.ui.html import empty_output, stats_html
from playground.ui.layout import LaneUI, Layout
from playground.ui.updates import CLEARED, cleared_header, is_cleared

STRIP_NOTE = '<div class="lane-info">The lanes changed since the last run: press Run to compare them.</div>'


def cleared_trace(decoder: str) -> dict[str, Any]:
    """The empty trace that stands for a lane set up anew (to run ``decoder``) since its run."""
    tr = pending_trace(decoder=decoder or "", reason="not run")
    tr[CLEARED] = True
    return tr


def press_run_lane(ui: LaneUI) -> dict[Any, Any]:
    """Lane ``ui``'s card as before any run: the "Press Run" note, no stats, the default legend."""
    return {ui.output: empty_output(ui.k), ui.stats: stats_html(""),
            ui.legend: visualizers.legend_html("probability")}


def press_run_column(ui: LaneUI, decoder: str = "", visible: bool | None = None,
                     run: bool = True) -> dict[Any, Any]:
    """Lane ``ui``'s inspector column with no run: its header, every plot slot hidden
    (``visible``: the column's visibility, unchanged when None; ``run`` False: the step
    slots only, for a scrub's outputs)."""
    up: dict[Any, Any] = {ui.insp_header: cleared_header(ui.k, decoder),
                          ui.step_html: gr.update(value="", visible=False)}
    slots = list(ui.step_plots)
    if run:
        up[ui.run_html] = gr.update(value="", visible=False)
        slots += ui.run_plots
    for comp in slots:
        up[comp] = gr.update(value=None, visible=False)
    if visible is not None:
        up[ui.insp_column] = gr.update(visible=visible)
    return up


def cleared_results(page: Layout) -> dict[Any, Any]:
    """What speaks for the whole previous comparison, cleared: the session it was stored as,
    its share link and the comparison strip (a new ``shown`` tells the listeners that follow
    the shown run)."""
    up: dict[Any, Any] = {page.shown: secrets.token_hex(8), page.sid: None, page.share_link: "",
                          page.progress_plot: None, page.divergence: STRIP_NOTE}
    up.update({comp: None for comp in page.compare_plots})
    return up


def reset_all(page: Layout, n: int, decoders: list[str] | None = None) -> dict[Any, Any]:
    """Every lane cleared (a preset or a model was picked): ``n`` lanes on the page, lane
    ``j`` set up to run ``decoders[j]``; no traces, the scrubber at its start."""
    decoders = list(decoders or [])
    up = cleared_results(page)
    up.update({page.traces: [], page.step: gr.update(minimum=0, maximum=1, value=0)})
    for j, ui in enumerate(page.lanes):
        up.update(press_run_lane(ui))
        up.update(press_run_column(ui, decoders[j] if j < len(decoders) else "", visible=j < n))
    return up


def reset_lanes(page: Layout, traces: list[dict[str, Any]] | None, changed: dict[int, str],
                n: int) -> dict[Any, Any]:
    """Lanes ``changed`` (0-based lane -> the decoder it is now set up for) cleared on a page
    of ``n`` lanes; the traces keep the unchanged lanes' runs. When a run of the page's traces
    is dropped (a changed lane had one, or a lane beyond ``n`` did), the traces are written
    again and what speaks for the whole comparison is cleared (:func:`cleared_results`)."""
    old = list(traces or [])
    up: dict[Any, Any] = {}
    for j, dec in changed.items():
        ui = page.lanes[j]
        up.update(press_run_lane(ui))
        # before any run the columns stay as the layout has them
        up.update(press_run_column(ui, dec, visible=j < n if old else None))
    new = [cleared_trace(changed[j]) if j in changed else t for j, t in enumerate(old[:n])]
    if old:
        # a lane + Lane brings in has a column (and a trace) like the others
        new += [cleared_trace(changed[j]) for j in range(len(new), n) if j in changed]
    dropped = any(not is_cleared(t) for t in old[n:]) or \
        any(j in changed and not is_cleared(t) for j, t in enumerate(old[:n]))
    if dropped and all(is_cleared(t) for t in new):
        new = []  # no run left to show: the page is as before any run
    if len(new) != len(old) or any(a is not b for a, b in zip(new, old)):
        up[page.traces] = new
    if dropped:
        up.update(cleared_results(page))
        for ui in page.lanes[n:]:
            up[ui.insp_column] = gr.update(visible=False)
    return up
