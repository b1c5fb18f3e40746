"""Views of the layer-reading decoders: Dynamic Focus Decoding's temperature against the
layers' divergence over the run, and Confident Decoding's entropy per layer and chosen layer.

They read ``focus`` (``d``, ``reference``, ``temperature``, ``base``, ``divergence`` per
candidate layer) and ``confident`` (``layers``, ``entropy`` per layer, ``chosen``, ``differs``)
of token steps. Pure functions of trace dicts, tolerant of odd evidence (a note, never a raise).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from visualizers._common import ACCEPTED, CHOSEN, FINAL, INK, REJECTED, base_layout, empty_figure, num, \
    pick_step, plot_text, steps_of
from visualizers.registry import run_plot, step_plot

FOCUS_TITLE = "Focus: temperature vs layer divergence"
CONFIDENT_TITLE = "Entropy per layer (chosen layer)"
CONFIDENT_RUN_TITLE = "Chosen layer per step"


def _rows(trace: dict[str, Any], field: str) -> list[tuple[int, dict[str, Any]]]:
    return [(i, s[field]) for i, s in enumerate(steps_of(trace)) if isinstance(s.get(field), dict)]


@run_plot(FOCUS_TITLE, evidence="focus")
def focus_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Each step's temperature (line) against its divergence d and the running reference."""
    rows = [(i, num(e.get("d")), num(e.get("reference")), num(e.get("temperature"))) for i, e in _rows(trace, "focus")]
    rows = [r for r in rows if None not in r]
    if not rows:
        return empty_figure("no focus evidence in this run", FOCUS_TITLE)
    xs = [r[0] for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=xs, y=[r[3] for r in rows], name="temperature", mode="lines+markers",
                    line={"color": CHOSEN}, secondary_y=False)
    fig.add_scatter(x=xs, y=[r[1] for r in rows], name="divergence d", mode="markers", marker={"color": FINAL},
                    secondary_y=True)
    fig.add_scatter(x=xs, y=[r[2] for r in rows], name="reference (running mean)", mode="lines",
                    line={"color": INK, "dash": "dot"}, secondary_y=True)
    temps = [r[3] for r in rows]
    base_layout(fig, plot_text(FOCUS_TITLE), subtitle=plot_text(
        f"temperature {min(temps):.2f}–{max(temps):.2f} · sharper where the layers disagree more than usual"),
                xaxis_title="step")
    fig.update_yaxes(title_text="temperature", secondary_y=False)
    fig.update_yaxes(title_text="divergence", secondary_y=True)
    return fig


@step_plot("token", CONFIDENT_TITLE, needs="confident", order=26)
def confident_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """One step's entropy of each layer in the window, the chosen layer marked."""
    i, s = pick_step(trace, step)
    ev = (s or {}).get("confident")
    if not isinstance(ev, dict) or not isinstance(ev.get("entropy"), list):
        return empty_figure("no confident-decoding evidence at this step", CONFIDENT_TITLE)
    layers = [str(x) for x in ev.get("layers") or range(len(ev["entropy"]))]
    chosen = str(ev.get("chosen"))
    colours = [ACCEPTED if lay == chosen else INK for lay in layers]
    fig = go.Figure(go.Bar(x=layers, y=[num(e) for e in ev["entropy"]], marker_color=colours,
                           hovertemplate="layer %{x}: entropy %{y:.3f} nats<extra></extra>"))
    note = "its token differs from the final layer's" if ev.get("differs") else "same token as the final layer"
    base_layout(fig, plot_text(f"{CONFIDENT_TITLE} · step {i}"),
                subtitle=plot_text(f"layer {chosen} chosen (green) · {note}"), xaxis_title="hidden-state layer")
    fig.update_yaxes(title_text="entropy (nats)")
    return fig


@run_plot(CONFIDENT_RUN_TITLE, evidence="confident")
def confident_run_figure(trace: dict[str, Any]) -> go.Figure:
    """The layer each token was taken from; red where it differs from the final layer's token."""
    rows = [(i, e.get("chosen"), bool(e.get("differs"))) for i, e in _rows(trace, "confident")
            if isinstance(e.get("chosen"), int)]
    if not rows:
        return empty_figure("no confident-decoding evidence in this run", CONFIDENT_RUN_TITLE)
    fig = go.Figure(go.Scatter(x=[r[0] for r in rows], y=[r[1] for r in rows], mode="markers+lines",
                               marker={"color": [REJECTED if r[2] else ACCEPTED for r in rows], "size": 9},
                               line={"color": INK, "width": 1},
                               hovertemplate="step %{x}: layer %{y}<extra></extra>"))
    changed = sum(r[2] for r in rows)
    base_layout(fig, plot_text(CONFIDENT_RUN_TITLE), subtitle=plot_text(
        f"{changed} of {len(rows)} tokens differ from the final layer's (red)"), xaxis_title="step")
    fig.update_yaxes(title_text="layer", dtick=1)
    return fig
