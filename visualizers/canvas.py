"""Denoise steps (masked diffusion): the canvas, when each position was committed, per-position
confidence/entropy/margin, and commits per step.

A denoise step carries ``canvas`` (the generated region, the mask id where a position is
still masked; ``mask_id`` names it), ``unmasked``/``remasked`` (positions changed this
step), per-position ``confidence``/``entropy``/``margin`` (lists that may hold nulls) and
``block`` (the semi-autoregressive block, an index or a ``[start, end)`` pair).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    ACCEPTED, CHOSEN, ENTROPY, FINAL, INK, MASK, REJECTED, at, base_layout, empty_figure, fmt, html_token,
    int_dtick, ints, num, pick_step, plot_text, steps_of, token_text, visible, wrong_kind,
)
from visualizers.registry import run_plot, step_plot

MASK_GLYPH = "▒▒"
STATE_COLOURS = {"committed this step": ACCEPTED, "remasked this step": REJECTED,
                 "filled earlier": "rgba(99,102,241,0.45)", "masked": MASK}


def denoise_steps(trace: Any) -> list[dict[str, Any]]:
    """The denoise steps of a trace, in order."""
    return [s for s in steps_of(trace) if s.get("kind") == "denoise"]


def mask_id_of(trace: dict[str, Any], step: dict[str, Any] | None) -> int | None:
    """The mask token id: from the step, else the trace, else None (no masks detectable)."""
    for src in (step, trace):
        if isinstance(src, dict):
            m = src.get("mask_id")
            if isinstance(m, int) and not isinstance(m, bool):
                return m
    return None


def canvas_of(step: dict[str, Any] | None) -> list[Any]:
    """The step's canvas (ids; a non-int entry counts as masked)."""
    c = step.get("canvas") if isinstance(step, dict) else None
    return list(c) if isinstance(c, list) else []


def unmasked_of(step: dict[str, Any]) -> list[int]:
    """Positions a denoise step committed (``unmasked``, else ``committed``)."""
    u = step.get("unmasked")
    return ints(u) if isinstance(u, list) else ints(step.get("committed"))


def is_masked(tok: Any, mask_id: int | None) -> bool:
    """Whether a canvas entry is a mask."""
    return not isinstance(tok, int) or isinstance(tok, bool) or (mask_id is not None and tok == mask_id)


@dataclass
class CommitState:
    """When each position was (last) committed, as of some step, and the remask events."""

    step: dict[int, int] = field(default_factory=dict)       # position -> step index
    confidence: dict[int, float | None] = field(default_factory=dict)
    entropy: dict[int, float | None] = field(default_factory=dict)
    remasks: list[tuple[int, int]] = field(default_factory=list)  # (step index, position)


def commit_state(trace: dict[str, Any], upto: int | None = None) -> CommitState:
    """Replay ``unmasked``/``remasked`` up to step index ``upto`` (inclusive; None = all)."""
    st = CommitState()
    for s in denoise_steps(trace):
        i = s.get("i")
        if upto is not None and isinstance(i, int) and i > upto:
            break
        for p in ints(s.get("remasked")):
            st.step.pop(p, None)
            st.confidence.pop(p, None)
            st.entropy.pop(p, None)
            st.remasks.append((i, p))
        for p in unmasked_of(s):
            st.step[p] = i
            st.confidence[p] = num(at(s.get("confidence"), p))
            st.entropy[p] = num(at(s.get("entropy"), p))
    return st


def _block_range(block: Any, n: int) -> tuple[int, int] | None:
    if isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) for b in block):
        return max(0, block[0]), min(n, block[1])
    if isinstance(block, dict):
        a, b = block.get("start"), block.get("end")
        if isinstance(a, int) and isinstance(b, int):
            return max(0, a), min(n, b)
    return None


@step_plot("denoise", "Canvas", html=True, metric="unmask_step", order=10)
def canvas_html(trace: dict[str, Any], step: int) -> str:
    """The canvas at a denoise step as HTML: filled tokens, visible masks, this step's
    commits outlined green, remasks outlined red; every span carries ``data-step`` (the
    step that committed the position; for a mask, the step shown)."""
    i, s = pick_step(trace, step)
    if s is None:
        return _note("no steps yet")
    if s.get("kind") != "denoise":
        return _note(f"step {i} is a {s.get('kind', '?')} step; the canvas is for denoise steps")
    canvas = canvas_of(s)
    if not canvas:
        return _note(f"step {i} has no canvas")
    mid = mask_id_of(trace, s)
    st = commit_state(trace, i)
    now = set(unmasked_of(s))
    rem = set(ints(s.get("remasked")))
    fixed = set(ints(s.get("fixed")))  # infilling: written before the first step
    blk = _block_range(s.get("block"), len(canvas))
    parts = []
    for p, tok in enumerate(canvas):
        masked = is_masked(tok, mid)
        cls = ["tok"]
        style = []
        if masked:
            cls.append("mask")
            style.append(f"background:rgba(154,161,171,0.28);color:{MASK};border-radius:3px")
            text = MASK_GLYPH
            pred = at(s.get("predicted"), p)
            title = f"position {p}: masked" + (
                f" · the model predicts {visible(token_text(trace, pred))} (#{pred}, confidence "
                f"{fmt(at(s.get('confidence'), p))})" if isinstance(pred, int) else "")
            data_step = i
        elif p in fixed:
            text = html_token(token_text(trace, tok))
            data_step = 0
            cls.append("fixed")
            style.append(f"outline:1.5px dashed {INK};outline-offset:-1.5px;border-radius:3px")
            title = f"position {p}: {visible(token_text(trace, tok))} (#{tok}) · fixed before denoising (infilling)"
        else:
            text = html_token(token_text(trace, tok))
            data_step = st.step.get(p, i)
            title = (f"position {p}: {visible(token_text(trace, tok))} (#{tok}) · committed at step {data_step}"
                     f" · confidence {fmt(st.confidence.get(p))}")
        if p in now and not masked:
            cls.append("new")
            style.append(f"box-shadow:inset 0 0 0 1.5px {ACCEPTED};background:rgba(34,165,91,0.18);border-radius:3px")
        if p in rem:
            cls.append("remasked")
            style.append(f"box-shadow:inset 0 0 0 1.5px {REJECTED};border-radius:3px")
        if blk and blk[0] <= p < blk[1]:
            style.append(f"border-bottom:2px solid {CHOSEN}")
        parts.append(f'<span class="{" ".join(cls)}" data-step="{data_step}" data-pos="{p}" '
                     f'title="{html.escape(title)}" style="{";".join(style)}">{text}</span>')
    masks = sum(1 for t in canvas if is_masked(t, mid))
    head = (f"step {i} · {len(canvas) - masks} of {len(canvas)} positions filled · "
            f"{len(now)} committed this step" + (f" · {len(rem)} remasked" if rem else "")
            + (f" · {len(fixed)} fixed (dashed)" if fixed else "")
            + (f" · block {blk[0]}–{blk[1]}" if blk else (f" · block {s['block']}" if isinstance(s.get("block"), int) else "")))
    return (f'<div class="canvas-view"><div class="canvas-head" style="font-size:0.85em;color:{INK};margin-bottom:4px">'
            f'{html.escape(head)}</div><div class="canvas-body" style="white-space:pre-wrap;line-height:1.7;'
            f'font-family:ui-monospace,SFMono-Regular,Menlo,monospace">{"".join(parts)}</div></div>')


def _note(text: str) -> str:
    return f'<div class="canvas-view note" style="color:{INK}">{html.escape(text)}</div>'


@run_plot("Unmasking heatmap", kind="denoise", order=10)
def unmask_heatmap(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """Position × step: the cell where each position was committed, coloured by its
    confidence; positions already filled in grey; remasks as red crosses."""
    title = "When each position was committed"
    steps = denoise_steps(trace)
    if not steps:
        return empty_figure("no denoise steps yet", title)
    n = max((len(canvas_of(s)) for s in steps), default=0)
    n = max([n] + [p + 1 for s in steps for p in unmasked_of(s)])
    if n == 0:
        return empty_figure("the canvas is empty", title)
    ys = [s.get("i") for s in steps]
    nan = math.nan
    commit = [[nan] * n for _ in steps]
    state = [[nan] * n for _ in steps]
    hover = [[""] * n for _ in steps]
    filled: dict[int, int] = {}
    rx, ry, rtext = [], [], []
    final = canvas_of(steps[-1])
    for r, s in enumerate(steps):
        canvas = canvas_of(s)
        for p in ints(s.get("remasked")):
            filled.pop(p, None)
            if 0 <= p < n:
                rx.append(p)
                ry.append(s.get("i"))
                rtext.append(f"position {p} remasked at step {s.get('i')}")
        for p in unmasked_of(s):
            if not 0 <= p < n:
                continue
            filled[p] = r
            c = num(at(s.get("confidence"), p))
            tok = at(canvas, p)
            commit[r][p] = c if c is not None else nan
            if c is None:
                state[r][p] = 0.75
            hover[r][p] = (f"position {p} · step {s.get('i')}<br>"
                           f"<b>{plot_text(visible(token_text(trace, tok)))}</b> · confidence {fmt(c)}"
                           f"<br>entropy {fmt(at(s.get('entropy'), p), 2)} · margin {fmt(at(s.get('margin'), p))}")
        for p, r0 in filled.items():
            if r0 < r and 0 <= p < n:
                state[r][p] = 0.3
    xs = list(range(n))
    fig = go.Figure()
    fig.add_heatmap(x=xs, y=ys, z=state, name="filled", zmin=0, zmax=1, showscale=False, hoverinfo="skip",
                    colorscale=[[0, "rgba(128,128,128,0.0)"], [1, "rgba(128,128,128,0.9)"]])
    fig.add_heatmap(x=xs, y=ys, z=commit, name="committed", zmin=0, zmax=1, colorscale="Viridis",
                    hovertext=hover, hoverinfo="text",
                    colorbar={"title": {"text": "confidence", "side": "right"}, "thickness": 12, "len": 0.85})
    if rx:
        fig.add_scatter(x=rx, y=ry, mode="markers", name="remasked", hovertext=rtext, hoverinfo="text",
                        marker={"symbol": "x-thin", "size": 9, "line": {"width": 2, "color": REJECTED}})
    still = sum(1 for t in final if is_masked(t, mask_id_of(trace, steps[-1])))
    sub = f" · {still} still masked" if still else ""
    base_layout(fig, f"{title} · position × step{sub}", xaxis_title="position in the canvas",
                yaxis={"title": "step", "autorange": "reversed"})
    if step is not None and isinstance(step, int):
        fig.add_hline(y=step, line={"color": CHOSEN, "width": 1, "dash": "dot"})
    return fig


@step_plot("denoise", "Per-position metrics", order=20)
def position_metrics_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Per position at one denoise step: confidence (bars, coloured by the position's
    state), margin and entropy (lines) — what the remasking policy ranked on. A position
    filled at an earlier step shows the confidence it was committed with. The x axis is the
    canvas, one bar per position, whatever the policy (random remasking commits positions far
    apart)."""
    title = "Per-position confidence, margin, entropy"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    if s.get("kind") != "denoise":
        return wrong_kind(i, s, "denoise", title)
    canvas = canvas_of(s)
    series = {k: s.get(k) if isinstance(s.get(k), list) else [] for k in ("confidence", "entropy", "margin")}
    n = max([len(canvas)] + [len(v) for v in series.values()])
    if n == 0 or not any(num(v) is not None for vs in series.values() for v in vs):
        return empty_figure(f"step {i} has no per-position metrics", f"{title} · step {i}")
    mid = mask_id_of(trace, s)
    now, rem = set(unmasked_of(s)), set(ints(s.get("remasked")))
    xs = list(range(n))
    state = []
    for p in xs:
        tok = at(canvas, p)
        if p in now:
            state.append("committed this step")
        elif p in rem:
            state.append("remasked this step")
        elif p < len(canvas) and is_masked(tok, mid):
            state.append("masked")
        else:
            state.append("filled earlier")
    # A position filled at an earlier step has no score at this one (a policy scores the masked
    # positions): its bar is the confidence it was committed with, at the step that committed it.
    before = commit_state(trace, i - 1) if i > 0 else CommitState()
    conf = [num(at(series["confidence"], p)) for p in xs]
    hover = []
    for p in xs:
        tok = at(canvas, p)
        txt = "mask" if p >= len(canvas) or is_masked(tok, mid) else plot_text(visible(token_text(trace, tok)))
        line = f"confidence {fmt(conf[p])}"
        if state[p] == "filled earlier" and conf[p] is None and before.confidence.get(p) is not None:
            conf[p] = before.confidence[p]
            line = f"confidence {fmt(conf[p])} when committed at step {before.step.get(p)}"
        hover.append(f"position {p}: <b>{txt}</b> ({state[p]})<br>{line}"
                     f"<br>margin {fmt(at(series['margin'], p))}<br>entropy {fmt(at(series['entropy'], p), 2)} nats")
    fig = go.Figure()
    # One bar trace per state, so the legend explains the colours (short names: a lane card's
    # legend has room for about two entries a row). Bars are one position wide whatever the
    # gaps between a state's positions (plotly would widen two far-apart bars to fill the gap).
    for name, colour in STATE_COLOURS.items():
        sel = [p for p in xs if state[p] == name]
        if sel:
            fig.add_bar(x=sel, y=[conf[p] for p in sel], name=name, marker_color=colour, width=0.8,
                        hovertext=[hover[p] for p in sel], hoverinfo="text")
    if any(num(v) is not None for v in series["margin"]):
        fig.add_scatter(x=xs, y=[num(at(series["margin"], p)) for p in xs], name="margin (top1 − top2)",
                        mode="lines+markers", line={"color": FINAL, "width": 1.5}, marker={"size": 4},
                        connectgaps=False, hovertext=hover, hoverinfo="text")
    if any(num(v) is not None for v in series["entropy"]):
        fig.add_scatter(x=xs, y=[num(at(series["entropy"], p)) for p in xs], name="entropy (nats)",
                        mode="lines", yaxis="y2", line={"color": ENTROPY, "width": 1.5, "dash": "dot"},
                        connectgaps=False, hovertext=hover, hoverinfo="text")
    base_layout(fig, f"{title} · step {i}", barmode="overlay",
                xaxis={"title": "position in the canvas", "range": [-0.5, n - 0.5], "dtick": int_dtick(n, 16)},
                yaxis={"title": "confidence (bars) · margin", "range": [0, 1.05]},
                yaxis2={"title": "entropy (nats)", "overlaying": "y", "side": "right", "showgrid": False,
                        "rangemode": "tozero", "tickformat": ".2~f"})
    return fig


@run_plot("Commits per step", kind="denoise", order=20)
def commits_per_step_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """Positions committed (up) and remasked (down) per denoise step, with the running
    count of filled positions."""
    title = "Commits per step"
    steps = denoise_steps(trace)
    if not steps:
        return empty_figure("no denoise steps yet", title)
    xs, up, down, filled = [], [], [], []
    cur: set[int] = set()
    for s in steps:
        u, r = unmasked_of(s), ints(s.get("remasked"))
        cur.difference_update(r)
        cur.update(u)
        xs.append(s.get("i"))
        up.append(len(u))
        down.append(-len(r))
        filled.append(len(cur))
    fig = go.Figure()
    fig.add_bar(x=xs, y=up, name="committed", marker_color=ACCEPTED)
    if any(down):
        fig.add_bar(x=xs, y=down, name="remasked", marker_color=REJECTED)
    fig.add_scatter(x=xs, y=filled, name="filled so far", mode="lines", yaxis="y2", line={"color": INK, "width": 2})
    # Both axes share their zero line, so the filled count never seems to dip below it.
    hi, lo = max(up + [1]) * 1.08, min(down + [0]) * 1.08
    top = max(filled + [1]) * 1.05
    base_layout(fig, f"{title} · {len(steps)} steps", barmode="relative", xaxis_title="step",
                yaxis={"title": "positions", "dtick": int_dtick(max(up + [-d for d in down])), "range": [lo, hi]},
                yaxis2={"title": "filled", "overlaying": "y", "side": "right", "showgrid": False,
                        "range": [top * lo / hi, top], "tickmode": "array",
                        "tickvals": list(range(0, int(top) + 1, max(1, math.ceil(max(filled + [1]) / 6))))})
    if step is not None and isinstance(step, int):
        fig.add_vline(x=step, line={"color": CHOSEN, "width": 1, "dash": "dot"})
    return fig
