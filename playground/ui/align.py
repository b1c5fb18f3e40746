"""How the inspector lines lanes up: by step (the shared step scrubber) or by token position,
and which lanes it shows (all, or one in focus).

Lanes take steps of different sizes (a speculative step commits several tokens, a diffusion
step fills positions anywhere), so "step 27" is a different token in each lane. Under
"by token position" a second scrubber picks an output position and each lane's inspector
shows the step that produced its token there (:func:`state.aligned_steps`). Focus is
client-side only: the other lanes' inspector columns are hidden, so the focused lane gets
the width, and nothing is recomputed.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

import playground.ui.rules as st
import visualizers
from playground.ui.layout import Layout
from playground.ui.page_js import page_js
from playground.ui.updates import insp_header, slot_updates
from visualizers.canvas import denoise_steps
from visualizers.tokens import canvas_records, token_records


# Hide every inspector column but the focused one (0: show all); plots re-fit on resize. The
# rule lives in a style element keyed by the columns' ids, not in a class on them: Gradio
# rewrites a column's classes whenever a run shows or hides it, and the focus must outlast that.
FOCUS_JS = page_js("focus_lane.js")

# Under position alignment, outline the token at that position in every lane.
POSITION_HIGHLIGHT_JS = page_js("highlight_position.js")


def position_steps(trace: dict[str, Any]) -> list[int]:
    """The step that produced each output position of a lane (diffusion: the step that
    committed it; a position still masked counts at the last step shown)."""
    try:
        recs = canvas_records(trace) if denoise_steps(trace) else token_records(trace)
    except Exception:  # noqa: BLE001 - odd evidence: this lane simply has no positions to align
        return []
    return [int(r.step) for r in recs]


def wire_align(page: Layout, demo: gr.Blocks) -> None:
    """Attach the alignment switch, the position scrubber and the focus picker of ``page``."""
    outs = _outputs(page)
    page.align.input(lambda mode, traces: on_align(page, mode, traces), [page.align, page.traces],
                     outs + [page.step, page.position], show_progress="hidden")
    page.position.input(lambda pos, traces: on_position(page, pos, traces), [page.position, page.traces],
                        outs, show_progress="hidden", trigger_mode="always_last")
    page.position.change(None, [page.position, page.align], None, js=POSITION_HIGHLIGHT_JS)
    # A finished run (or an opened session) fills the traces: the position scrubber's range follows.
    page.on_shown.add(lambda traces: position_range(page, traces), [page.traces], [page.position])
    page.focus.change(None, [page.focus], None, js=FOCUS_JS)


def _outputs(page: Layout) -> list[Any]:
    out: list[Any] = []
    for ui in page.lanes:
        out += [ui.insp_header, ui.step_html, *ui.step_plots]
    return out


def position_range(page: Layout, traces: list[dict[str, Any]] | None) -> dict[Any, Any]:
    """The position scrubber's range for ``traces`` (at the last position)."""
    top = st.scrub_top("position", [], [position_steps(t) for t in traces or []])
    return {page.position: gr.update(minimum=0, maximum=max(top - 1, 1), value=max(top - 1, 0))}


def on_align(page: Layout, mode: str, traces: list[dict[str, Any]] | None) -> dict[Any, Any]:
    """Switch between step and token-position alignment, redrawing every lane at the last
    step / position."""
    traces = list(traces or [])
    by_pos = mode == "position"
    up: dict[Any, Any] = {page.step: gr.update(visible=not by_pos), page.position: gr.update(visible=by_pos)}
    if by_pos:
        rng = position_range(page, traces)[page.position]
        up[page.position] = gr.update(visible=True, **{k: v for k, v in rng.items() if k != "__type__"})
        up.update(aligned_updates(page, traces, int(rng.get("value") or 0), "position"))
    else:
        top = max((visualizers.step_count(t) for t in traces), default=0)
        up.update(aligned_updates(page, traces, max(top - 1, 0), "step"))
    return up


def on_position(page: Layout, pos: float, traces: list[dict[str, Any]] | None) -> dict[Any, Any]:
    """The position scrubber moved: each lane shows the step that produced its token there."""
    return aligned_updates(page, list(traces or []), int(pos or 0), "position")


def at_position(page: Layout, traces: list[dict[str, Any]], pos: int) -> dict[Any, Any]:
    """A token at output position ``pos`` was clicked under position alignment: move the
    position scrubber there and show every lane at the step that produced its token there."""
    return {page.position: gr.update(value=pos), **aligned_updates(page, traces, pos, "position")}


def aligned_updates(page: Layout, traces: list[dict[str, Any]], value: int, mode: str) -> dict[Any, Any]:
    """Every lane's inspector header and step plots at scrubber ``value`` under ``mode``."""
    counts = [visualizers.step_count(t) for t in traces]
    steps = st.aligned_steps(value, mode, counts, [position_steps(t) for t in traces] if mode == "position" else [])
    up: dict[Any, Any] = {}
    for j, ui in enumerate(page.lanes[: len(traces)]):
        header = insp_header(ui.k, traces[j], steps[j], counts[j])
        if mode == "position":
            header = header.replace('<span class="insp-where">', f'<span class="insp-where">token {value} · ', 1)
        up[ui.insp_header] = header
        up.update(slot_updates(ui.step_html, ui.step_plots, visualizers.step_figures(traces[j], steps[j])))
    return up
