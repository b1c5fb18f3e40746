"""The comparison strip across lanes: progress per unit of compute, and where outputs diverge."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    INK, LANE_COLOURS, base_layout, empty_figure, ints, num, plot_text, steps_of, visible,
)
from visualizers.canvas import unmasked_of
from visualizers.tokens import TokenRec, canvas_records, token_records

_DASH = '<span style="opacity:0.6">–</span>'
X_AXES = {"forwards": ("target_forwards", "target forward passes"), "time": ("t", "seconds"),
          "steps": ("i", "steps")}


def lane_name(trace: Any, lane: int) -> str:
    """“k: decoder” for legends and tables."""
    dec = trace.get("decoder") if isinstance(trace, dict) else None
    return f"{lane}: {dec}" if dec else f"lane {lane}"


def progress_points(trace: dict[str, Any]) -> list[tuple[int, float, int, int]]:
    """(target forwards, seconds, tokens so far, step index) after each step, from (0, 0, 0).

    Tokens are output tokens for causal decoders and filled canvas positions for diffusion
    (commits minus remasks), so both count the same thing: positions of text decided.
    """
    pts = [(0, 0.0, 0, -1)]
    tokens = 0
    filled: set[int] = set()
    for s in steps_of(trace):
        if s.get("kind") == "denoise":
            filled.difference_update(ints(s.get("remasked")))
            filled.update(unmasked_of(s))
            tokens = len(filled)
        else:
            tokens += len(ints(s.get("committed")))
        tf = s.get("target_forwards") if isinstance(s.get("target_forwards"), int) else pts[-1][0]
        t = num(s.get("t"))
        pts.append((tf, t if t is not None else pts[-1][1], tokens, s.get("i") if isinstance(s.get("i"), int) else len(pts) - 1))
    # A finished beam search commits its output only at the end (output_override): credit
    # the final output to the last step so the lane does not look empty.
    out = ints(trace.get("output_ids"))
    done = trace.get("done", bool((trace.get("stats") or {}).get("finish_reason")))
    if done and len(pts) > 1 and len(out) > pts[-1][2]:
        tf, t, _, i = pts[-1]
        pts[-1] = (tf, t, len(out), i)
    return pts


def tokens_at(points: list[tuple[int, float, int, int]], forwards: int) -> int:
    """Tokens a lane had when it had spent at most ``forwards`` target forwards."""
    best = 0
    for tf, _, n, _ in points:
        if tf <= forwards:
            best = n
    return best


def progress_figure(traces: list[dict[str, Any]], x: str = "forwards") -> go.Figure:
    """Tokens decided vs target forward passes (or seconds/steps), one line per lane,
    with who is ahead at equal compute in the title."""
    title = "Progress at equal compute"
    traces = [t for t in (traces or []) if isinstance(t, dict)]
    if not traces or not any(steps_of(t) for t in traces):
        return empty_figure("no steps yet", title)
    key, axis = X_AXES.get(x, X_AXES["forwards"])
    fig = go.Figure()
    finals = []
    for lane, tr in enumerate(traces):
        pts = progress_points(tr)
        xs = [p[0] if key == "target_forwards" else (p[1] if key == "t" else p[3] + 1) for p in pts]
        hover = [f"{plot_text(lane_name(tr, lane))}<br>step {p[3]} · {p[2]} tokens<br>"
                 f"{p[0]} target forwards · {p[1]:.2f} s" for p in pts]
        fig.add_scatter(x=xs, y=[p[2] for p in pts], mode="lines", name=plot_text(lane_name(tr, lane)),
                        line={"color": LANE_COLOURS[lane % len(LANE_COLOURS)], "width": 2.5, "shape": "hv"},
                        hovertext=hover, hoverinfo="text")
        finals.append(pts)
    sub = ""
    if key == "target_forwards":
        spent = [p[-1][0] for p in finals if p[-1][0] > 0]
        if len(spent) >= 2:
            f = min(spent)
            at_f = [tokens_at(p, f) for p in finals]
            fig.add_vline(x=f, line={"color": INK, "width": 1, "dash": "dot"})
            sub = f" · at {f} forwards: " + ", ".join(
                f"{plot_text(lane_name(t, k))} {n}" for k, (t, n) in enumerate(zip(traces, at_f)))
    base_layout(fig, title + sub, xaxis_title=axis, yaxis={"title": "tokens decided", "rangemode": "tozero"})
    fig.update_xaxes(rangemode="tozero")
    return fig


def lane_records(trace: dict[str, Any]) -> list[TokenRec]:
    """A lane's output so far: causal tokens, or a diffusion canvas up to its first mask."""
    if any(s.get("kind") == "denoise" for s in steps_of(trace)):
        recs = canvas_records(trace)
        cut = next((k for k, r in enumerate(recs) if r.masked), len(recs))
        return recs[:cut]
    return token_records(trace)


def _oneline(s: str) -> str:
    """Token text for a one-line table cell: newlines and tabs shown as marks."""
    return s.replace("\r", "").replace("\n", "↵").replace("\t", "→")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ, or None if they agree on their common length."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None


def divergence_html(traces: list[dict[str, Any]]) -> str:
    """Where the lanes' outputs first diverge: the shared prefix, then each lane's own
    continuation from the first position where it differs from lane 0."""
    traces = [t if isinstance(t, dict) else {} for t in (traces or [])]
    wrap = '<div class="divergence" data-first="{first}" style="font-size:0.9em;line-height:1.6">{body}</div>'
    if len(traces) < 2:
        return wrap.format(first="", body='<span style="opacity:0.7">one lane: nothing to compare</span>')
    recs = [lane_records(t) for t in traces]
    seqs = [[r.id for r in rs] for rs in recs]
    if not any(seqs):
        return wrap.format(first="", body='<span style="opacity:0.7">no output yet</span>')
    shortest = min(len(s) for s in seqs)
    common = next((k for k in range(shortest) if len({s[k] for s in seqs}) > 1), None)
    agree = common if common is not None else shortest
    prefix = "".join(r.text for r in recs[0][:agree])
    shown = visible(prefix[-60:]) if prefix else ""
    if common is None:
        head = (f"All lanes agree on all {agree} tokens they share"
                + (f": “…{shown}”" if shown else "") + ".")
    elif agree == 0:
        head = "The lanes differ from the first token on."
    else:
        head = f"All lanes agree on the first {agree} tokens" + (f" (“…{shown}”)" if shown else "") + \
            f"; they first diverge at position {agree}."
    rows = []
    for lane, (tr, rs) in enumerate(zip(traces, recs)):
        d = first_divergence(seqs[0], seqs[lane]) if lane else None
        if lane == 0:
            where = "reference"
            start = agree
        elif d is None:
            where = "identical to lane 0 so far" if len(seqs[lane]) and len(seqs[0]) else "no output yet"
            start = min(len(seqs[lane]), len(seqs[0]))
        else:
            where = f"differs from lane 0 at position {d}"
            start = d
        cont = "".join(
            f'<span class="tok" data-lane="{lane}" data-step="{int(r.step)}" '
            f'title="{html.escape(f"step {r.step}")}">{html.escape(_oneline(r.text))}</span>'
            for r in rs[start:start + 12])
        rows.append(f'<tr data-lane="{lane}" data-diverge="{"" if d is None else d}">'
                    f'<td style="padding:2px 10px 2px 0;white-space:nowrap;color:{LANE_COLOURS[lane % len(LANE_COLOURS)]}">'
                    f'{html.escape(lane_name(tr, lane))}</td>'
                    f'<td style="padding:2px 10px 2px 0;opacity:0.8;white-space:nowrap">{html.escape(where)}</td>'
                    f'<td style="white-space:pre">{cont or _DASH}</td></tr>')
    body = f'<div>{html.escape(head)}</div><table style="border-collapse:collapse;margin-top:4px">{"".join(rows)}</table>'
    return wrap.format(first="" if common is None else common, body=body)
