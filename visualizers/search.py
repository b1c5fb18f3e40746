"""Search and collaboration evidence: best-first's frontier, MBR's utility matrix, the rollouts
of cntp/adadec, the UID surprisal curve, EAD's hand-overs and diffuspec's draft canvas.

Pure functions of trace dicts, tolerant of partial or odd evidence (a note, never a raise).
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    ACCEPTED, BONUS, CHOSEN, ENTROPY, FINAL, RAW, base_layout, empty_figure, html_token, ints, num, pick_step,
    plot_text, steps_of, token_text, visible,
)
from visualizers.canvas import MASK_GLYPH
from visualizers.registry import run_plot, step_plot

LABEL_TOKENS = 4  # the last tokens of a hypothesis shown as its label


def _label(trace: dict[str, Any], ids: Any) -> str:
    toks = ints(ids)
    text = "".join(token_text(trace, t) for t in toks[-LABEL_TOKENS:])
    return ("…" if len(toks) > LABEL_TOKENS else "") + visible(text)


def _field(trace: dict[str, Any], step: int, field: str, title: str) -> tuple[int, dict[str, Any] | None, Any]:
    i, s = pick_step(trace, step)
    if s is None:
        return i, None, empty_figure("no steps yet", title)
    ev = s.get(field)
    if not isinstance(ev, (dict, list)) or not ev:
        return i, None, empty_figure(f"step {i} has no {field} evidence", f"{title} · step {i}")
    return i, s, None


@step_plot("beam", "Frontier and pops", needs="frontier", order=40)
def frontier_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Best-first beam search at one wave: the hypotheses it popped and the queue's best entries."""
    title = "Frontier and pops"
    i, s, note = _field(trace, step, "frontier", title)
    if s is None:
        return note
    popped = [b for b in s.get("beams", []) if isinstance(b, dict)]
    front = [f for f in s.get("frontier", []) if isinstance(f, dict)]
    fig = go.Figure()
    for name, rows, colour in (("popped this step", popped, ACCEPTED), ("queue (best first)", front, RAW)):
        if not rows:
            continue
        fig.add_bar(y=[f"{'✓ ' if r.get('finished') else ''}{plot_text(_label(trace, r.get('ids')))} "
                       f"({len(ints(r.get('ids')))})" for r in rows],
                    x=[num(r.get("score")) for r in rows], orientation="h", name=name, marker={"color": colour},
                    hovertemplate="%{y}<br>log p %{x:.3f}<extra></extra>")
    pops = s.get("pops") if isinstance(s.get("pops"), dict) else {}
    sub = " · ".join(f"len {k}: {v} popped" for k, v in list(pops.items())[-6:])
    base_layout(fig, f"{title} · step {i}", subtitle=plot_text(sub), xaxis_title="summed log-probability",
                yaxis={"autorange": "reversed", "type": "category"}, barmode="overlay")
    return fig


@step_plot("beam", "MBR utilities", needs="mbr", order=50)
def mbr_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """MBR's utility matrix (hypotheses x references) with the chosen hypothesis, or, under
    reference aggregation, each hypothesis's utility against the aggregate."""
    title = "MBR utilities"
    i, s, note = _field(trace, step, "mbr", title)
    if s is None:
        return note
    ev = s["mbr"]
    chosen = ev.get("chosen")
    expected = [num(x) for x in ev.get("expected", [])]
    labels = [f"{'★ ' if j == chosen else ''}h{j} {plot_text(_label(trace, b.get('ids')))}"
              for j, b in enumerate(s.get("beams", [])) if isinstance(b, dict)]
    labels = labels or [f"h{j}" for j in range(len(expected))]
    matrix = ev.get("matrix")
    fig = go.Figure()
    if isinstance(matrix, list) and matrix:
        z = [[num(x) for x in row] if isinstance(row, list) else [] for row in matrix]
        fig.add_heatmap(z=z, y=labels[: len(z)], x=[f"r{j}" for j in range(max(len(r) for r in z))],
                        colorscale="Viridis", zmin=0, zmax=1, colorbar={"title": "utility"},
                        hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>")
        if isinstance(chosen, int) and 0 <= chosen < len(z):
            fig.add_shape(type="rect", xref="paper", x0=0, x1=1, y0=chosen - 0.5, y1=chosen + 0.5,
                          line={"color": CHOSEN, "width": 3})
        xt = "reference"
    else:
        fig.add_bar(y=labels, x=expected, orientation="h", name="utility vs the aggregate",
                    marker={"color": [CHOSEN if j == chosen else FINAL for j in range(len(expected))]})
        xt = "utility against the aggregated references"
    sub = f"{ev.get('utility', '?')} · {ev.get('aggregation', '?')} · references: {ev.get('references', '?')}"
    base_layout(fig, f"{title} · chosen h{chosen}", subtitle=plot_text(sub), xaxis_title=xt,
                yaxis={"autorange": "reversed", "type": "category"})
    return fig


@step_plot("token", "Rollouts", needs="trials", order=80)
def trials_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """The rollouts of a triggered cntp/adadec step, with the one kept."""
    title = "Rollouts"
    i, s, note = _field(trace, step, "trials", title)
    if s is None:
        return note
    ev = s["trials"]
    items = [x for x in ev.get("items", []) if isinstance(x, dict)]
    chosen = ev.get("chosen")
    fig = go.Figure()
    fig.add_bar(y=[f"{'★ ' if j == chosen else ''}{plot_text(visible(''.join(token_text(trace, t) for t in ints(x.get('ids')))))}"
                   for j, x in enumerate(items)],
                x=[num(x.get("score")) for x in items], orientation="h",
                marker={"color": [CHOSEN if j == chosen else RAW for j in range(len(items))]},
                hovertemplate="%{y}<br>score %{x:.4f}<extra></extra>", name="trials")
    sub = (f"entropy {num(ev.get('entropy')) or 0:.2f} > threshold {num(ev.get('threshold')) or 0:.2f} nats · "
           f"{ev.get('score', '')}")
    base_layout(fig, f"{title} ({ev.get('kind', '')}) · step {i}", subtitle=plot_text(sub),
                xaxis_title="score", yaxis={"autorange": "reversed", "type": "category"}, showlegend=False)
    return fig


@run_plot("Surprisal curve", evidence="uid", order=40)
def surprisal_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """UID beam search: the surprisal of each token of the best hypothesis (the final output's
    when the run is done), with its mean: a flat curve is uniform information density."""
    title = "Surprisal curve"
    stats = trace.get("stats") if isinstance(trace.get("stats"), dict) else {}
    ys = [num(x) for x in stats.get("surprisals", [])] if isinstance(stats.get("surprisals"), list) else []
    which = "output"
    if not ys:
        uids = [s.get("uid") for s in steps_of(trace) if isinstance(s.get("uid"), dict)]
        if step is not None and isinstance(step, int):
            uids = [s.get("uid") for s in steps_of(trace)[: step + 1] if isinstance(s.get("uid"), dict)] or uids
        if not uids:
            return empty_figure("no surprisal evidence in this trace", title)
        ys = [num(x) for x in uids[-1].get("surprisals", [])]
        which = "best hypothesis so far"
    ys = [y for y in ys if y is not None]
    if not ys:
        return empty_figure("no surprisals yet", title)
    mean = sum(ys) / len(ys)
    var = sum((y - mean) ** 2 for y in ys) / len(ys)
    fig = go.Figure()
    fig.add_scatter(x=list(range(len(ys))), y=ys, mode="lines+markers", name=f"surprisal ({which})",
                    line={"color": ENTROPY})
    fig.add_hline(y=mean, line={"color": CHOSEN, "dash": "dot"})
    params = trace.get("params") if isinstance(trace.get("params"), dict) else {}
    base_layout(fig, f"{title} · {which}",
                subtitle=plot_text(f"mean {mean:.2f} nats · variance {var:.3f} · λ = {params.get('lam', '?')}"),
                xaxis_title="position", yaxis_title="−log p (nats)")
    return fig


@run_plot("Who wrote each token", evidence="handover", order=50)
def handover_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """EAD: the small model's entropy and rolling mean per step, the threshold, and which model
    wrote each token."""
    title = "Who wrote each token"
    steps = [(s.get("i"), s["handover"]) for s in steps_of(trace)
             if isinstance(s.get("handover"), dict) and s["handover"].get("source") in ("small", "large")]
    if not steps:
        return empty_figure("no hand-over evidence in this trace", title)
    fig = go.Figure()
    for src, colour in (("small", ACCEPTED), ("large", BONUS)):
        xs = [i for i, h in steps if h.get("source") == src]
        fig.add_scatter(x=xs, y=[0.0] * len(xs), mode="markers", name=f"{src} model wrote",
                        marker={"color": colour, "symbol": "square", "size": 9})
    asked = [(i, num(h.get("rolling_entropy"))) for i, h in steps if num(h.get("rolling_entropy")) is not None]
    fig.add_scatter(x=[i for i, _ in asked], y=[y for _, y in asked], mode="lines+markers",
                    name="small model's rolling entropy", line={"color": ENTROPY})
    params = trace.get("params") if isinstance(trace.get("params"), dict) else {}
    thr = num(params.get("entropy_threshold"))
    if thr is not None:
        fig.add_hline(y=thr, line={"color": CHOSEN, "dash": "dot"})
    small = sum(1 for _, h in steps if h.get("source") == "small")
    base_layout(fig, title, subtitle=plot_text(f"{small} of {len(steps)} tokens by the small model · "
                                               f"threshold {thr if thr is not None else '?'} nats"),
                xaxis_title="step", yaxis_title="nats")
    if step is not None and isinstance(step, int):
        fig.add_vline(x=step, line={"color": CHOSEN, "width": 1, "dash": "dot"})
    return fig


@step_plot("draft", "Diffusion draft canvas", needs="draft_canvas", html=True, order=20)
def draft_canvas_html(trace: dict[str, Any], step: int) -> str:
    """diffuspec: the diffusion draft's block after each denoising forward (masked positions
    greyed), above the verified draft tree."""
    i, s = pick_step(trace, step)
    ev = s.get("draft_canvas") if isinstance(s, dict) else None
    if not isinstance(ev, dict) or not isinstance(ev.get("steps"), list):
        return '<div class="note">this step has no diffusion draft canvas</div>'
    rows = []
    for k, c in enumerate(ev["steps"]):
        if not isinstance(c, dict) or not isinstance(c.get("canvas"), list):
            continue
        new = set(ints(c.get("unmasked")))
        cells = []
        for pos, t in enumerate(c["canvas"]):
            if t is None:
                cells.append(f'<span class="tok masked" title="masked">{html.escape(MASK_GLYPH)}</span>')
            else:
                style = ' style="background: rgba(34,165,91,0.30)"' if pos in new else ""
                cells.append(f'<span class="tok" title="#{int(t)}"{style}>{html_token(token_text(trace, t))}</span>')
        rows.append(f'<div class="canvas-row"><b>denoising step {k + 1}</b> {"".join(cells)}</div>')
    if not rows:
        return '<div class="note">the diffusion model drafted nothing at this step</div>'
    return (f'<div class="draft-canvas" data-step="{int(i)}"><div class="note">diffusion draft, step {int(i)}: '
            f"green = unmasked by that forward</div>{''.join(rows)}</div>")
