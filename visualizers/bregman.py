"""Bregman top-k views: one step's loss-vs-k curve with the binary search's probes and the
chosen k, and the chosen k over the run.

They read the ``bregman`` evidence of ``bregman_top_k``'s token steps (see
:class:`decoders.processors.BregmanTopK`): ``curve`` (``L(k)`` for ``k = curve_k0, ...``),
``probes`` (``[[k, L(k)], ...]`` in the order the search read them), ``k``, ``kept``,
``k_max``, ``divergence``, ``lambda`` and ``kept_mass``. Pure functions of trace dicts,
tolerant of partial or odd evidence (a note, never a raise).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (CHOSEN, FINAL, INK, RAW, at, base_layout, empty_figure, fmt, int_dtick, num,
                                 pick_step, plot_text, steps_of, wrong_kind)
from visualizers.registry import run_plot, step_plot

TITLE = "Bregman loss vs k"
RUN_TITLE = "Bregman k per step"


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _probes(ev: dict[str, Any]) -> list[tuple[int, float]]:
    out = []
    for p in ev.get("probes") if isinstance(ev.get("probes"), list) else []:
        k, v = _int(at(p, 0)), num(at(p, 1))
        if k is not None and v is not None:
            out.append((k, v))
    return out


@step_plot("token", TITLE, needs="bregman", order=25)
def bregman_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """The objective ``D(q_k, p) + lambda k`` against ``k`` at one step: the curve (convex, so
    its minimum is the only dip), the k values the binary search read, numbered in the order
    read, and the chosen k."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", TITLE)
    if s.get("kind") != "token":
        return wrong_kind(i, s, "token", TITLE)
    ev = s.get("bregman")
    if not isinstance(ev, dict):
        return empty_figure(f"step {i} has no Bregman top-k evidence", f"{TITLE} · step {i}")
    k0 = _int(ev.get("curve_k0")) or 1
    curve = ev.get("curve") if isinstance(ev.get("curve"), list) else []
    xs = [k0 + j for j, v in enumerate(curve) if num(v) is not None]
    ys = [num(v) for v in curve if num(v) is not None]
    fig = go.Figure()
    if xs:
        fig.add_scatter(x=xs, y=ys, mode="lines+markers" if len(xs) <= 64 else "lines", name="L(k)",
                        line={"color": RAW, "width": 2}, marker={"size": 4},
                        hovertemplate="k = %{x}<br>L(k) = %{y:.6g}<extra></extra>")
    probes = _probes(ev)
    if probes:
        fig.add_scatter(x=[k for k, _ in probes], y=[v for _, v in probes], mode="markers+text",
                        name="probes (in order read)", text=[str(j + 1) for j in range(len(probes))],
                        textposition="top center", textfont={"size": 9, "color": INK},
                        marker={"color": FINAL, "size": 9, "symbol": "circle-open", "line": {"width": 2}},
                        hovertemplate="probe %{text}: k = %{x}<br>L(k) = %{y:.6g}<extra></extra>")
    k = _int(ev.get("k"))
    loss = num(ev.get("loss"))
    if k is not None and loss is not None:
        fig.add_scatter(x=[k], y=[loss], mode="markers", name=f"chosen k = {k}",
                        marker={"color": CHOSEN, "size": 14, "symbol": "star"},
                        hovertemplate="chosen k = %{x}<br>L(k) = %{y:.6g}<extra></extra>")
    if not xs and not probes:
        return empty_figure(f"step {i} recorded no loss values", f"{TITLE} · step {i}")
    window = "" if k0 == 1 else f"curve from k = {k0}"
    sub = " · ".join(x for x in (
        f"{ev.get('divergence', '?')}, λ = {fmt(ev.get('lambda'), 4)}",
        f"kept {ev.get('kept', '?')} of {ev.get('live', '?')} (mass {fmt(ev.get('kept_mass'))})",
        f"{len(probes)} probes of k ≤ {ev.get('k_max', '?')}", window) if x)
    top = max(xs + [k for k, _ in probes] + ([k] if k else []), default=1)
    # a long curve reads better on a log k axis; the dip sits at small k
    log_x = top > 64
    base_layout(fig, f"{TITLE} · step {i} · k = {k if k is not None else '?'}", subtitle=plot_text(sub),
                xaxis={"title": "k (tokens kept)", "type": "log" if log_x else "linear",
                       **({} if log_x else {"dtick": int_dtick(top)})},
                yaxis_title="D(q_k, p) + λ·k")
    return fig


@run_plot(RUN_TITLE, evidence="bregman")
def bregman_run_figure(trace: dict[str, Any]) -> go.Figure:
    """The chosen k at every step (and the tokens kept, which tie-keeping can make larger)."""
    xs, ks, kept = [], [], []
    for s in steps_of(trace):
        ev = s.get("bregman")
        if not isinstance(ev, dict) or _int(ev.get("k")) is None:
            continue
        xs.append(s.get("i") if _int(s.get("i")) is not None else len(xs))
        ks.append(ev["k"])
        kept.append(_int(ev.get("kept")))
    if not xs:
        return empty_figure("no Bregman top-k steps yet", RUN_TITLE)
    fig = go.Figure()
    fig.add_scatter(x=xs, y=ks, mode="lines+markers", name="chosen k", line={"color": CHOSEN},
                    hovertemplate="step %{x}: k = %{y}<extra></extra>")
    if any(a is not None and a != b for a, b in zip(kept, ks)):
        fig.add_scatter(x=xs, y=kept, mode="markers", name="kept (ties included)", marker={"color": FINAL})
    mean = sum(ks) / len(ks)
    base_layout(fig, f"{RUN_TITLE} · mean {mean:.2f}", subtitle=plot_text(f"min {min(ks)} · max {max(ks)}"),
                xaxis_title="step", yaxis={"title": "k", "rangemode": "tozero"})
    return fig


__all__ = ["bregman_figure", "bregman_run_figure"]
