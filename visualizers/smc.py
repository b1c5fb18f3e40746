"""SMC views: the particle population over steps (drawn like the beam tree: x = step,
y = particle, an edge to each particle's parent, marker size = normalised weight) and the
effective sample size over the run with the resampling events.

They read the ``smc`` evidence of the ``smc`` decoder's beam steps (``weights``, ``ess``,
``threshold``, ``resampled``, ``ancestors``, ``potentials``) and the particles in ``beams``.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    CHOSEN, FINAL, GRID, INK, base_layout, empty_figure, fmt, ints, num, pick_step, plot_text,
    steps_of, token_text, visible, wrong_kind,
)
from visualizers.registry import run_plot, step_plot

WINDOW = 16  # steps shown at once, as the beam tree
MAX_MARKER = 26  # px of a particle holding all the weight


def smc_steps(trace: dict[str, Any], upto: int | None = None) -> list[dict[str, Any]]:
    """The steps carrying ``smc`` evidence, up to index ``upto``."""
    out = []
    for s in steps_of(trace):
        i = s.get("i")
        if upto is not None and isinstance(i, int) and i > upto:
            break
        if isinstance(s.get("smc"), dict) and isinstance(s.get("beams"), list):
            out.append(s)
    return out


def _weights(s: dict[str, Any]) -> list[float]:
    sm = s.get("smc") or {}
    w = sm.get("weights") if isinstance(sm.get("weights"), list) else []
    beams = [b for b in s.get("beams") or [] if isinstance(b, dict)]
    vals = [num(x) for x in w] if len(w) == len(beams) else [num(b.get("weight")) for b in beams]
    return [v if v is not None else 0.0 for v in vals]


@step_plot("beam", "Particles", needs="smc", order=20)
def particles_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Particles over the last steps up to ``step``: size = weight, colour = potential,
    edges to parents (crossing edges after a resampling: copies of heavy particles)."""
    title = "Particles"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    if s.get("kind") != "beam":
        return wrong_kind(i, s, "beam", title)
    shown = smc_steps(trace, i)[-WINDOW:]
    if not shown:
        return empty_figure(f"step {i} has no particles", title)
    fig = go.Figure()
    # resampling happens after a step's weights are recorded: shade the gap to the next step
    for k, st in enumerate(shown):
        if (st.get("smc") or {}).get("resampled") is True and isinstance(st.get("i"), int):
            fig.add_vrect(x0=st["i"] + 0.15, x1=st["i"] + 0.85, fillcolor=CHOSEN, opacity=0.12, line_width=0)
    ex: list[Any] = []
    ey: list[Any] = []
    for k in range(1, len(shown)):
        for j, b in enumerate(x for x in shown[k]["beams"] if isinstance(x, dict)):
            par = b.get("parent")
            if isinstance(par, int) and not isinstance(par, bool):
                ex += [shown[k - 1].get("i"), shown[k].get("i"), None]
                ey += [par, j, None]
    if ex:
        fig.add_scatter(x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                        line={"color": GRID, "width": 1.2}, name="ancestry")
    xs, ys, size, col, hov, sym = [], [], [], [], [], []
    for st in shown:
        w = _weights(st)
        for j, b in enumerate(x for x in st["beams"] if isinstance(x, dict)):
            wj = w[j] if j < len(w) else 0.0
            xs.append(st.get("i"))
            ys.append(j)
            size.append(4 + (MAX_MARKER - 4) * math.sqrt(max(wj, 0.0)))
            pot = num(b.get("potential"))
            col.append(pot if pot is not None else 0.0)
            fin = b.get("finished") is True
            sym.append("square" if fin else "circle")
            tail = visible("".join(token_text(trace, t) for t in ints(b.get("ids"))[-10:]))
            hov.append(f"step {st.get('i')} · particle {j + 1}{' · finished' if fin else ''}<br>"
                       f"weight {fmt(wj, 3)} · potential {fmt(pot, 3)} · log-prob {fmt(b.get('logprob'), 2)}"
                       f"<br>…{plot_text(tail[-40:])}")
    fig.add_scatter(x=xs, y=ys, mode="markers", name="particles", hovertext=hov, hoverinfo="text",
                    showlegend=False, cliponaxis=False,
                    marker={"size": size, "symbol": sym, "color": col, "colorscale": "Viridis",
                            "cmin": min(col + [-1.0]), "cmax": 0.0, "showscale": True,
                            "line": {"width": 1, "color": "rgba(0,0,0,0.35)"},
                            "colorbar": {"title": {"text": "potential", "side": "right"}, "thickness": 12,
                                         "len": 0.85}})
    cur = shown[-1].get("smc") or {}
    width = max(len(st["beams"]) for st in shown)
    steps_x = [x for x in xs if isinstance(x, int)] or [0]
    sub = " · resampled after this step" if cur.get("resampled") is True else ""
    base_layout(fig, f"{title} · step {i} · ESS {fmt(cur.get('ess'), 2)} of {width}{sub}",
                subtitle="size: weight · colour: potential (0 = satisfied) · ■ finished · "
                         "shaded: resampling (edges to the copied particle)",
                xaxis={"title": "step", "range": [min(steps_x) - 0.5, max(steps_x) + 0.9]},
                yaxis={"title": "particle", "autorange": "reversed", "tickmode": "array",
                       "tickvals": list(range(width)), "ticktext": [str(r + 1) for r in range(width)],
                       "range": [width - 0.4, -0.8]})
    return fig


@run_plot("Effective sample size", evidence="smc", order=70)
def ess_figure(trace: dict[str, Any]) -> go.Figure:
    """Effective sample size per step, the resampling threshold and the resampling events."""
    title = "Effective sample size"
    steps = smc_steps(trace)
    if not steps:
        return empty_figure("no SMC steps in this trace", title)
    xs = [s.get("i") for s in steps]
    ess = [num((s.get("smc") or {}).get("ess")) for s in steps]
    thr = [num((s.get("smc") or {}).get("threshold")) for s in steps]
    n = max((num((s.get("smc") or {}).get("n")) or 0.0) for s in steps)
    fig = go.Figure()
    fig.add_scatter(x=xs, y=ess, mode="lines+markers", name="ESS", line={"color": FINAL, "width": 2})
    fig.add_scatter(x=xs, y=thr, mode="lines", name="threshold", line={"color": INK, "dash": "dash", "width": 1})
    rx = [x for x, s in zip(xs, steps) if (s.get("smc") or {}).get("resampled") is True]
    ry = [e for e, s in zip(ess, steps) if (s.get("smc") or {}).get("resampled") is True]
    if rx:
        fig.add_scatter(x=rx, y=ry, mode="markers", name="resampled",
                        marker={"color": CHOSEN, "size": 11, "symbol": "diamond"})
    base_layout(fig, f"{title} · {len(rx)} resampling{'s' if len(rx) != 1 else ''}",
                subtitle=f"{int(n)} particles · resampled when ESS falls below the threshold",
                xaxis={"title": "step"}, yaxis={"title": "ESS", "range": [0, max(n, 1.0) * 1.05]})
    return fig


__all__ = ["ess_figure", "particles_figure", "smc_steps"]
