"""Superposed Decoding's evidence: the k x k candidate grid of a step (drafts x the top-k tokens
of the one superposed distribution) with the kept cells marked, and the superposition weights
of the drafts over the run.

Pure functions of trace dicts, tolerant of partial or odd evidence (a note, never a raise).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    ACCEPTED, CHOSEN, LANE_COLOURS, at, base_layout, empty_figure, fmt, ints, label, num, pick_step, plot_text,
    steps_of, token_text, visible,
)
from visualizers.registry import run_plot, step_plot

TAIL_TOKENS = 3  # the last tokens of a draft shown as its row label


def _rows(trace: dict[str, Any], i: int) -> list[str]:
    """Row labels of step ``i``'s grid: the drafts it extended (the previous step's running
    beams, with the weight each had in the superposition), or the prompt at the first step."""
    steps = steps_of(trace)
    prev = steps[i - 1] if 0 < i <= len(steps) - 1 else None
    if not isinstance(prev, dict) or not isinstance(prev.get("superposed"), dict):
        return ["prompt"]
    beams = [b for b in prev.get("beams", []) if isinstance(b, dict) and not b.get("finished")]
    out = []
    for r, b in enumerate(beams):
        ids = ints(b.get("ids"))
        tail = visible("".join(token_text(trace, t) for t in ids[-TAIL_TOKENS:]))
        out.append(plot_text(f"d{r} {'…' if len(ids) > TAIL_TOKENS else ''}{tail} (w {fmt(b.get('weight'), 2)})"))
    return out


@step_plot("beam", "Candidate grid", needs="superposed", order=30)
def candidate_grid_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """One step's k x k candidates: rows are the drafts, columns the top-k tokens of the
    superposed distribution; colour is the candidate's score (draft score + combined log
    score), ✓ marks the cells kept as next drafts, ■ those that finished on a stop."""
    title = "Candidate grid"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    ev = s.get("superposed")
    if not isinstance(ev, dict) or not isinstance(ev.get("score"), list) or not ev["score"]:
        return empty_figure(f"step {i} has no candidate grid", f"{title} · step {i}")
    toks = ints(ev.get("top_ids"))
    cols = [f"{label(trace, t)} ({fmt(at(ev.get('lm'), j), 3)})" for j, t in enumerate(toks)]
    score = [[num(x) for x in row] if isinstance(row, list) else [] for row in ev["score"]]
    rows = _rows(trace, i)
    rows = (rows + [f"d{r}" for r in range(len(rows), len(score))])[: len(score)]
    prev = ev.get("prev_scores") if isinstance(ev.get("prev_scores"), list) else []
    hover, marks = [], []
    for r, row in enumerate(score):
        h_row, m_row = [], []
        for j in range(len(row)):
            kept = bool(at(at(ev.get("kept"), r), j))
            stop = bool(at(at(ev.get("stopped"), r), j))
            step_score = (row[j] - num(at(prev, r))) if row[j] is not None and num(at(prev, r)) is not None else None
            h_row.append(f"{rows[r]} + {cols[j] if j < len(cols) else '?'}<br>LM p {fmt(at(ev.get('lm'), j), 4)}"
                         f" · n-gram p {fmt(at(at(ev.get('ngram'), r), j), 4)}<br>combined log score "
                         f"{fmt(step_score)} · total {fmt(row[j])}"
                         + ("<br>kept" if kept else "") + ("<br>finished (stop)" if stop else ""))
            m_row.append("✓" if kept else "■" if stop else "")
        hover.append(h_row)
        marks.append(m_row)
    fig = go.Figure()
    width = max((len(r) for r in score), default=0)
    # numbered axes with the labels as tick text: two tokens may look alike
    fig.add_heatmap(z=score, x=list(range(width)), y=list(range(len(score))), text=marks,
                    texttemplate="%{text}", textfont={"size": 16, "color": "white"}, customdata=hover,
                    hovertemplate="%{customdata}<extra></extra>", colorscale="Viridis",
                    colorbar={"title": "score"})
    for r, m_row in enumerate(marks):
        for j, m in enumerate(m_row):
            if m:
                fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=r - 0.5, y1=r + 0.5,
                              line={"color": ACCEPTED if m == "✓" else CHOSEN, "width": 2})
    kept = sum(m == "✓" for row in marks for m in row)
    sub = (f"α = {fmt(ev.get('alpha'), 2)} · {ev.get('mix', '?')} · {len(score)} drafts x {len(toks)} tokens · "
           f"{kept} kept")
    base_layout(fig, f"{title} · step {i}", subtitle=plot_text(sub), xaxis_title="token (LM probability)",
                xaxis={"tickvals": list(range(width)), "ticktext": cols[:width]},
                yaxis={"autorange": "reversed", "tickvals": list(range(len(rows))), "ticktext": rows})
    return fig


@run_plot("Superposition weights", evidence="superposed", order=45)
def weights_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """The weight of each draft (by rank) in the superposed input, step by step; they sum to 1."""
    title = "Superposition weights"
    series = [(s.get("i"), s["superposed"].get("weights")) for s in steps_of(trace)
              if isinstance(s.get("superposed"), dict) and isinstance(s["superposed"].get("weights"), list)]
    series = [(x, [num(w) for w in ws]) for x, ws in series if ws]
    if not series:
        return empty_figure("no superposition weights in this trace", title)
    k = max(len(ws) for _, ws in series)
    fig = go.Figure()
    for r in range(k):
        fig.add_scatter(x=[x for x, _ in series], y=[at(ws, r) for _, ws in series], mode="lines",
                        stackgroup="w", name=f"draft {r}", line={"color": LANE_COLOURS[r % len(LANE_COLOURS)]},
                        hovertemplate=f"draft {r}<br>step %{{x}}: w %{{y:.3f}}<extra></extra>")
    base_layout(fig, title, subtitle=plot_text(f"{k} drafts, ranked by score at each step"),
                xaxis_title="step", yaxis_title="weight", yaxis={"range": [0, 1]})
    return fig
