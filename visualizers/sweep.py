"""A knob sweep's figures: a metric as a heatmap over two knobs, or as a line over one.

Both read the aggregate of ``playground sweep`` (``playground/sweep.py``, :func:`aggregate`):
``{"knobs": [{"name", "values"}], "cells": [{"index", "knobs", "repeats", METRIC,
METRIC + "_spread", ...}], "decoder", "model"}``. The axes are the knob values in the order
they were swept (as categories, so a value given twice keeps its own column); a cell with no
value for the metric (agreement without a greedy run, acceptance of a decoder without drafts)
is left blank and said so in its hover text.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import ACCEPTED, base_layout, empty_figure, plot_text


def _label(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _subtitle(agg: dict[str, Any], metric: str) -> str:
    repeats = max((int(c.get("repeats") or 0) for c in agg.get("cells") or []), default=0)
    parts = [str(agg.get("decoder")), f"model {agg.get('model')}", f"{len(agg.get('cells') or [])} cells"]
    if repeats > 1:
        parts.append(f"mean over {repeats} seeds (± standard deviation)")
    return plot_text(" · ".join(parts))


def _cells(agg: dict[str, Any]) -> dict[tuple[int, ...], dict[str, Any]]:
    return {tuple(c.get("index") or ()): c for c in agg.get("cells") or [] if isinstance(c, dict)}


def sweep_heatmap(agg: dict[str, Any], metric: str, title: str | None = None) -> go.Figure:
    """``metric`` per cell of a two-knob sweep: rows the first knob's values (top down, as the
    printed grid), columns the second's; each cell's text is its mean (± spread over repeats)."""
    name = title or metric.replace("_", " ")
    knobs = agg.get("knobs") or []
    if len(knobs) != 2:
        return empty_figure("a heatmap needs a sweep over two knobs", name)
    at = _cells(agg)
    rows, cols = knobs[0]["values"], knobs[1]["values"]
    z, text, hover = [], [], []
    for i, rv in enumerate(rows):
        zr, tr, hr = [], [], []
        for j, cv in enumerate(cols):
            c = at.get((i, j), {})
            m, sd = c.get(metric), c.get(metric + "_spread")
            zr.append(m)
            tr.append("" if m is None else f"{m:.3g}" + (f" ± {sd:.2g}" if (c.get("repeats") or 0) > 1 and sd else ""))
            what = "no value" if m is None else f"{m:.4g}" + (f" ± {sd:.3g}" if sd else "")
            hr.append(plot_text(f"{knobs[0]['name']}={_label(rv)}, {knobs[1]['name']}={_label(cv)}: {name} {what}"))
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    # categories by position, so a value given twice keeps its own row or column
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(cols))), y=list(range(len(rows))), text=text,
                               texttemplate="%{text}", hovertext=hover, hoverinfo="text", colorscale="Viridis",
                               colorbar={"title": {"text": plot_text(name)}}))
    return base_layout(fig, plot_text(f"{name} over {knobs[0]['name']} × {knobs[1]['name']}"),
                       subtitle=_subtitle(agg, metric),
                       xaxis={"title": plot_text(knobs[1]["name"]), "tickvals": list(range(len(cols))),
                              "ticktext": [plot_text(_label(v)) for v in cols]},
                       yaxis={"title": plot_text(knobs[0]["name"]), "tickvals": list(range(len(rows))),
                              "ticktext": [plot_text(_label(v)) for v in rows], "autorange": "reversed"})


def sweep_line(agg: dict[str, Any], metric: str, title: str | None = None) -> go.Figure:
    """``metric`` over a one-knob sweep's values, with the spread over repeats as error bars."""
    name = title or metric.replace("_", " ")
    knobs = agg.get("knobs") or []
    if len(knobs) != 1:
        return empty_figure("a line needs a sweep over one knob", name)
    at = _cells(agg)
    values = knobs[0]["values"]
    ys = [at.get((i,), {}).get(metric) for i in range(len(values))]
    sds = [at.get((i,), {}).get(metric + "_spread") or 0.0 for i in range(len(values))]
    fig = go.Figure(go.Scatter(x=list(range(len(values))), y=ys, mode="lines+markers", marker_color=ACCEPTED,
                               error_y={"type": "data", "array": sds, "visible": any(sds)}, name=plot_text(name),
                               hovertext=[plot_text(f"{knobs[0]['name']}={_label(v)}: "
                                                    + ("no value" if y is None else f"{y:.4g} ± {sd:.3g}"))
                                          for v, y, sd in zip(values, ys, sds)], hoverinfo="text"))
    return base_layout(fig, plot_text(f"{name} over {knobs[0]['name']}"), subtitle=_subtitle(agg, metric),
                       xaxis={"title": plot_text(knobs[0]["name"]), "tickvals": list(range(len(values))),
                              "ticktext": [plot_text(_label(v)) for v in values]},
                       yaxis={"title": plot_text(name)})


def sweep_figure(agg: dict[str, Any], metric: str, title: str | None = None) -> go.Figure:
    """The sweep's figure of ``metric``: a heatmap over two knobs, a line over one."""
    if len(agg.get("knobs") or []) == 2:
        return sweep_heatmap(agg, metric, title)
    return sweep_line(agg, metric, title)
