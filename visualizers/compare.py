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
DASHES = ("dash", "dot", "dashdot", "longdash", "longdashdot")
# x: (what a point's x is, the axis title); "cost" and "wall" read what the race's policy
# stamped on each step (playground/policies.py: ``race_cost``, ``own_s``)
X_AXES = {"forwards": ("target_forwards", "target forward passes"), "time": ("t", "seconds"),
          "steps": ("i", "steps"), "cost": ("race_cost", "cost (target-token units)"),
          "wall": ("own_s", "seconds in the lane's own steps")}
TITLES = {"forwards": "Progress at equal target forwards", "cost": "Progress at equal cost",
          "wall": "Progress at equal wall time", "steps": "Progress per step", "time": "Progress over time"}


def stamped_x(trace: dict[str, Any], key: str) -> list[float]:
    """``key`` (``race_cost``/``own_s``) after each step, from 0; a step without it keeps the last value."""
    xs = [0.0]
    for s in steps_of(trace):
        v = num(s.get(key))
        xs.append(v if v is not None else xs[-1])
    return xs


def lane_name(trace: Any, lane: int) -> str:
    """“k: decoder” for legends and tables; ``lane`` is the 0-based index, shown from 1 as the
    page numbers its lane cards."""
    dec = trace.get("decoder") if isinstance(trace, dict) else None
    return f"{lane + 1}: {dec}" if dec else f"lane {lane + 1}"


def coinciding(lines: list[list[tuple[Any, int]]]) -> list[list[int]]:
    """Groups (2 or more, 0-based lane indices) of lanes whose lines are identical."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, pts in enumerate(lines):
        if len(pts) > 1:
            groups.setdefault(tuple(pts), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


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


def end_labels(lines: list[list[tuple[Any, int]]], groups: list[list[int]]) -> list[tuple[tuple[Any, int], str, int]]:
    """(end point, label, first lane) for the lane-number labels at the lines' ends.

    Identical lines share one label ("1=4"); lines ending close together (within 3 % of
    the axes' spans) share one too ("1=4, 6"), so labels never print over each other.
    """
    same = {g[0]: g for g in groups}
    inside = {k for g in groups for k in g[1:]}
    ends = [(k, line[-1]) for k, line in enumerate(lines) if len(line) > 1 and k not in inside]
    if not ends:
        return []
    xs = [float(p[0]) for line in lines for p in line]
    ys = [float(p[1]) for line in lines for p in line]
    dx, dy = 0.03 * ((max(xs) - min(xs)) or 1.0), 0.03 * ((max(ys) - min(ys)) or 1.0)
    out: list[tuple[tuple[Any, int], list[str], int]] = []
    for k, (ex, ey) in ends:
        text = "=".join(str(j + 1) for j in same.get(k, [k]))
        near = next((o for o in out if abs(float(o[0][0]) - float(ex)) <= dx and abs(o[0][1] - ey) <= dy), None)
        if near is None:
            out.append(((ex, ey), [text], k))
        else:
            near[1].append(text)
    return [(pt, ", ".join(texts), k) for pt, texts, k in out]


def race_axis(traces: list[dict[str, Any]]) -> str:
    """The x axis a race's traces call for: ``"cost"`` or ``"wall"`` where its steps carry that
    policy's stamp (``race_cost``/``own_s``), else ``"forwards"``."""
    for key, axis in (("race_cost", "cost"), ("own_s", "wall")):
        if any(key in s for t in traces if isinstance(t, dict) for s in steps_of(t)):
            return axis
    return "forwards"


def progress_figure(traces: list[dict[str, Any]], x: str = "auto") -> go.Figure:
    """Tokens decided vs target forward passes (or what another lockstep policy counts:
    ``x`` is ``"cost"``, ``"wall"``, ``"steps"`` or ``"time"``; ``"auto"``, the default, is
    what the race equalised, see :func:`race_axis`), one line per lane, with who is ahead at
    equal target forwards in the subtitle.

    Lanes are numbered from 1, as the page's cards are. Each line ends in its lane number, so
    a line hidden under another still shows where it ends; lanes whose lines are identical
    are drawn dashed over the first one and named in a note."""
    traces = [t for t in (traces or []) if isinstance(t, dict)]
    x = race_axis(traces) if x == "auto" else x
    title = TITLES.get(x, TITLES["forwards"])
    if not traces or not any(steps_of(t) for t in traces):
        return empty_figure("no steps yet", title)
    key, axis = X_AXES.get(x, X_AXES["forwards"])
    fig = go.Figure()
    finals = []
    lines: list[list[tuple[Any, int]]] = []
    for lane, tr in enumerate(traces):
        pts = progress_points(tr)
        xs = stamped_x(tr, key) if key in ("race_cost", "own_s") else \
            [p[0] if key == "target_forwards" else (p[1] if key == "t" else p[3] + 1) for p in pts]
        finals.append(pts)
        lines.append(list(zip(xs, [p[2] for p in pts])))
    groups = coinciding(lines)
    # each further lane of a group gets its own dash, so all of them show on the shared line
    later = {k: DASHES[n % len(DASHES)] for g in groups for n, k in enumerate(g[1:])}
    for lane, (tr, pts, line) in enumerate(zip(traces, finals, lines)):
        colour = LANE_COLOURS[lane % len(LANE_COLOURS)]
        hover = [f"{plot_text(lane_name(tr, lane))}<br>step {p[3]} · {p[2]} tokens<br>"
                 f"{p[0]} target forwards · {p[1]:.2f} s" for p in pts]
        fig.add_scatter(x=[p[0] for p in line], y=[p[1] for p in line], mode="lines",
                        name=plot_text(lane_name(tr, lane)),
                        line={"color": colour, "width": 2 if lane in later else 3, "shape": "hv",
                              "dash": later.get(lane, "solid")},
                        hovertext=hover, hoverinfo="text")
    for (ex, ey), text, first in end_labels(lines, groups):
        fig.add_annotation(x=ex, y=ey, text=text, showarrow=False, xanchor="left", yanchor="middle", xshift=4,
                           font={"size": 12, "color": LANE_COLOURS[first % len(LANE_COLOURS)]})
    notes = []
    for g in groups:
        names = ", ".join(str(k + 1) for k in g[:-1]) + f" and {g[-1] + 1}"
        notes.append(f"lanes {names} coincide (drawn dashed over each other)")
    sub = ""
    if key == "target_forwards":
        spent = [p[-1][0] for p in finals if p[-1][0] > 0]
        if len(spent) >= 2:
            f = min(spent)
            at_f = [tokens_at(p, f) for p in finals]
            fig.add_vline(x=f, line={"color": INK, "width": 1, "dash": "dot"})
            sub = f"tokens at {f} forwards: " + ", ".join(f"lane {k + 1} {n}" for k, n in enumerate(at_f))
    # the page shows this figure in a labelled gr.Plot, whose label covers the top-left corner
    base_layout(fig, title, subtitle=" · ".join([sub] + notes) if sub or notes else "", under_label=True,
                xaxis_title=axis, yaxis={"title": "tokens decided", "rangemode": "tozero"},
                margin={"r": 48})  # room for the lane numbers at the lines' ends
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


def forced_positions(trace: dict[str, Any]) -> list[int]:
    """The output positions a trace was told to emit a given token at (a branch's ``force``)."""
    out = set()
    for pair in trace.get("force") or []:
        try:
            out.add(int(pair[0]))
        except (TypeError, ValueError, IndexError, KeyError):
            continue
    return sorted(out)


def divergence_html(traces: list[dict[str, Any]]) -> str:
    """Where the lanes' outputs first diverge: the shared prefix, then each lane's own
    continuation from the first position where it differs from the first lane. Lanes are
    named from 1, as the page's cards; ``data-lane`` keeps the 0-based index the page uses."""
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
        share = "the one token they share" if agree == 1 else f"all {agree} tokens they share"
        head = f"All lanes agree on {share}" + (f": “…{shown}”" if shown else "") + "."
    elif agree == 0:
        head = "The lanes differ from the first token on."
    else:
        first = "the first token" if agree == 1 else f"the first {agree} tokens"
        head = f"All lanes agree on {first}" + (f" (“…{shown}”)" if shown else "") + \
            f"; they first diverge at position {agree}."
    rows = []
    for lane, (tr, rs) in enumerate(zip(traces, recs)):
        d = first_divergence(seqs[0], seqs[lane]) if lane else None
        if lane == 0:
            where = "reference"
            start = agree
        elif d is None:
            where = "identical to lane 1 so far" if len(seqs[lane]) and len(seqs[0]) else "no output yet"
            start = min(len(seqs[lane]), len(seqs[0]))
        else:
            where = f"differs from lane 1 at position {d}"
            start = d
        forced = forced_positions(tr)
        if forced:
            # a branch's edit: say where the token was put in by hand, not picked by the decoder
            where += f" · forced at position{'s' if len(forced) > 1 else ''} {', '.join(map(str, forced))}"
        cont = "".join(
            f'<span class="tok{" forced" if k in forced else ""}" data-lane="{lane}" data-step="{int(r.step)}" '
            f'title="{html.escape(f"step {r.step}" + (" · forced" if k in forced else ""))}">'
            f'{html.escape(_oneline(r.text))}</span>'
            for k, r in enumerate(rs[start:start + 12], start))
        rows.append(f'<tr data-lane="{lane}" data-diverge="{"" if d is None else d}">'
                    f'<td style="padding:2px 10px 2px 0;white-space:nowrap;color:{LANE_COLOURS[lane % len(LANE_COLOURS)]}">'
                    f'{html.escape(lane_name(tr, lane))}</td>'
                    f'<td style="padding:2px 10px 2px 0;opacity:0.8;white-space:nowrap">{html.escape(where)}</td>'
                    f'<td style="white-space:pre">{cont or _DASH}</td></tr>')
    body = f'<div>{html.escape(head)}</div><table style="border-collapse:collapse;margin-top:4px">{"".join(rows)}</table>'
    return wrap.format(first="" if common is None else common, body=body)
