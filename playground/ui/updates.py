"""Pure functions from traces to the Compare page's updates: inspector headers, plot slots, the
comparison strip's figures. No state and no handlers; the inspector, the alignment and the
replay build their frames from these.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

import visualizers
from playground.ui.html import esc


def compare_updates(plots: list[Any], traces: list[dict[str, Any]]) -> dict[Any, Any]:
    """The compare strip's figures over all lanes (``visualizers.COMPARE_PLOTS``, in order)."""
    return {comp: fn(traces) for comp, (_title, fn) in zip(plots, visualizers.COMPARE_PLOTS)}


def slot_updates(html_comp: Any, plots: list[Any], figs: list[tuple[str, Any]]) -> dict[Any, Any]:
    """Fill an inspector column's HTML block and plot slots with ``figs`` (title, figure/HTML)."""
    up: dict[Any, Any] = {}
    htmls = [(t, f) for t, f in figs if isinstance(f, str)]
    plots_in = [(t, f) for t, f in figs if not isinstance(f, str)]
    if htmls:
        body = "".join(f'<div class="insp-block"><div class="insp-title">{esc(t)}</div>{f}</div>' for t, f in htmls)
        up[html_comp] = gr.update(value=body, visible=True)
    else:
        up[html_comp] = gr.update(value="", visible=False)
    for j, comp in enumerate(plots):
        if j < len(plots_in):
            up[comp] = gr.update(value=plots_in[j][1], visible=True, label=plots_in[j][0])
        else:
            up[comp] = gr.update(visible=False)
    return up


def pending_header(k: int, decoder: str) -> str:
    """Lane ``k``'s inspector header while its run streams: the plots follow when it ends."""
    return (f'<div class="lane-title"><span class="lane-dot lane-dot-{k}"></span>Lane {k} · {esc(decoder or "?")}'
            f'<span class="insp-where insp-pending">plots when the run ends — or scrub / click a token'
            f'</span></div>')


CLEARED = "cleared"  # key of the empty trace that stands for a lane set up anew since its run


def is_cleared(trace: Any) -> bool:
    """Whether ``trace`` stands for a lane changed since its run (nothing of that run is shown;
    ``lane_reset`` makes them)."""
    return isinstance(trace, dict) and bool(trace.get(CLEARED))


def cleared_header(k: int, decoder: str = "") -> str:
    """Lane ``k``'s inspector header while it has not run under its present setup."""
    dec = f" · {esc(decoder)}" if decoder else ""
    return (f'<div class="lane-title"><span class="lane-dot lane-dot-{k}"></span>Lane {k}{dec}'
            f'<span class="insp-where">press Run</span></div>')


def insp_header(k: int, trace: dict[str, Any], step: int, count: int) -> str:
    """The header of lane ``k``'s inspector column: decoder, step and step kind."""
    if is_cleared(trace):
        return cleared_header(k, trace.get("decoder") or "")
    dec = esc(trace.get("decoder") or "?")
    where = f"step {step} of {count - 1}" if count else "no steps"
    kind = ""
    steps = trace.get("steps") or []
    if count and 0 <= step < len(steps) and isinstance(steps[step], dict):
        kind = f" · {esc(steps[step].get('kind', ''))} step"
    return (f'<div class="lane-title"><span class="lane-dot lane-dot-{k}"></span>Lane {k} · {dec}'
            f'<span class="insp-where">{where}{kind}</span></div>')
