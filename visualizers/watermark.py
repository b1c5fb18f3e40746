"""Watermark views: the output coloured green/red by the watermark's green lists, and the
running z-score over the run.

They read the ``watermark`` evidence of the ``watermark`` decoder's token steps (``green``:
whether the token fell in its green list, ``None`` when it had too little context to be
scored; ``z``: the output's z-score after it; ``green_mass``/``green_mass_biased``: the green
list's probability before and after ``delta``). Nothing here touches a model.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    ACCEPTED, GRID, INK, REJECTED, UNREACHED, base_layout, empty_figure, fmt, html_token, ints, num,
    pick_step, steps_of, token_text, visible,
)
from visualizers.registry import run_plot, step_plot

Z_THRESHOLD = 4.0  # the detector's default verdict line (Kirchenbauer et al. use z = 4)
GREEN_BG = "rgba(34,165,91,0.32)"
RED_BG = "rgba(229,72,77,0.32)"
UNSCORED_BG = "rgba(154,161,171,0.22)"


def watermark_rows(trace: dict[str, Any], upto: int | None = None) -> list[dict[str, Any]]:
    """One row per watermarked token up to step ``upto``: step, token id, green, z, masses."""
    rows: list[dict[str, Any]] = []
    for s in steps_of(trace):
        i = s.get("i") if isinstance(s.get("i"), int) else len(rows)
        if upto is not None and i > upto:
            break
        wm = s.get("watermark")
        toks = ints(s.get("committed"))
        if not isinstance(wm, dict) or not toks:
            continue
        g = wm.get("green")
        rows.append({"step": i, "id": toks[0], "green": g if isinstance(g, bool) else None,
                     "z": num(wm.get("z")), "green_mass": num(wm.get("green_mass")),
                     "green_mass_biased": num(wm.get("green_mass_biased")),
                     "gamma": num(wm.get("gamma"))})
    return rows


@step_plot("token", "Watermark", needs="watermark", html=True, order=60)
def watermark_tokens_html(trace: dict[str, Any], step: int) -> str:
    """The output up to ``step``, each token on green (in its green list), red (not) or grey
    (unscored), the chosen step outlined, under a line with the z-score at that step."""
    i, s = pick_step(trace, step)
    rows = watermark_rows(trace, i if s is not None else None)
    if not rows:
        return '<div class="note">no watermark evidence in this trace (the watermark decoder records it)</div>'
    last = rows[-1]
    scored = [r for r in rows if r["green"] is not None]
    green = sum(1 for r in scored if r["green"])
    gamma = last["gamma"]
    head = (f"step {i} · z = {fmt(last['z'], 2)} · green {green}/{len(scored)}"
            + (f" (expected {100 * gamma:.0f}% without the key)" if gamma is not None else ""))
    parts = []
    for r in rows:
        bg = UNSCORED_BG if r["green"] is None else (GREEN_BG if r["green"] else RED_BG)
        what = "unscored (too little context)" if r["green"] is None else ("green" if r["green"] else "red")
        title = f"step {r['step']} · “{visible(token_text(trace, r['id']))}” #{r['id']} · {what} · z {fmt(r['z'], 2)}"
        if r["green_mass"] is not None:
            title += f" · green mass {fmt(r['green_mass'])} → {fmt(r['green_mass_biased'])}"
        outline = ";outline:1.5px solid #f5a524" if r["step"] == i else ""
        parts.append(f'<span class="tok wm" data-step="{int(r["step"])}" data-green="{str(r["green"]).lower()}" '
                     f'title="{html.escape(title)}" style="background:{bg};border-radius:3px{outline}">'
                     f'{html_token(token_text(trace, r["id"]))}</span>')
    legend = (f'<span style="background:{GREEN_BG};border-radius:3px;padding:0 4px">green</span> '
              f'<span style="background:{RED_BG};border-radius:3px;padding:0 4px">red</span> '
              f'<span style="background:{UNSCORED_BG};border-radius:3px;padding:0 4px">unscored</span>')
    return (f'<div class="wm-view"><div style="font-size:0.9em;margin-bottom:4px">{html.escape(head)}</div>'
            f'<div style="white-space:pre-wrap;word-break:break-word;line-height:1.75">{"".join(parts)}</div>'
            f'<div style="font-size:0.8em;opacity:0.8;margin-top:4px">{legend}</div></div>')


@run_plot("Watermark z-score", evidence="watermark", metric="watermark", order=60)
def watermark_z_figure(trace: dict[str, Any]) -> go.Figure:
    """The output's z-score after each token (markers green/red by the token's colour), with
    the detection line at z = 4 and the green list's mass before and after the bias."""
    title = "Watermark z-score"
    rows = watermark_rows(trace)
    if not rows:
        return empty_figure("no watermark evidence in this trace", title)
    xs = [r["step"] for r in rows]
    fig = go.Figure()
    fig.add_hline(y=Z_THRESHOLD, line={"color": INK, "dash": "dash", "width": 1},
                  annotation_text=f"z = {Z_THRESHOLD:g}", annotation_position="top left")
    fig.add_hline(y=0.0, line={"color": GRID, "width": 1})
    colours = [UNREACHED if r["green"] is None else (ACCEPTED if r["green"] else REJECTED) for r in rows]
    hover = [f"step {r['step']} · “{visible(token_text(trace, r['id']))}” · "
             f"{'unscored' if r['green'] is None else ('green' if r['green'] else 'red')} · z {fmt(r['z'], 2)}"
             for r in rows]
    fig.add_scatter(x=xs, y=[r["z"] for r in rows], mode="lines+markers", name="z-score",
                    line={"color": INK, "width": 1.5}, marker={"color": colours, "size": 7},
                    hovertext=[html.escape(h, quote=False) for h in hover], hoverinfo="text")
    if any(r["green_mass"] is not None for r in rows):
        fig.add_scatter(x=xs, y=[r["green_mass"] for r in rows], mode="lines", name="green mass before δ",
                        yaxis="y2", line={"color": ACCEPTED, "width": 1, "dash": "dot"})
        fig.add_scatter(x=xs, y=[r["green_mass_biased"] for r in rows], mode="lines", name="green mass after δ",
                        yaxis="y2", line={"color": ACCEPTED, "width": 1.2})
    last = rows[-1]
    scored = [r for r in rows if r["green"] is not None]
    green = sum(1 for r in scored if r["green"])
    base_layout(fig, f"{title} · z {fmt(last['z'], 2)} · green {green}/{len(scored)}",
                subtitle="● green token · ● red token · dashed: detection threshold",
                xaxis={"title": "step"}, yaxis={"title": "z"},
                yaxis2={"title": "green mass", "overlaying": "y", "side": "right", "range": [0, 1],
                        "showgrid": False})
    return fig


__all__ = ["watermark_rows", "watermark_tokens_html", "watermark_z_figure"]
