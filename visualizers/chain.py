"""The sampler chain stage by stage: which rule removed which token.

A token step of a chain decoder (``sample``, its presets, ``watermark``; any decoder under a
constraint) carries ``chain``: one entry per stage in the order applied (the constraint's bias
and mask first, then the chain's rules), each with ``kept``/``kept_mass``, ``removed`` and the
most probable removed and kept tokens with their probability *entering* that stage
(``top_removed``/``top_kept``, ``[[id, p], ...]``), and, where the lane draws by Gumbel-max,
``gumbel_in``/``gumbel_out``: the token the run's noise draws from the distribution entering and
leaving the stage (see ``decoders/processors.py``, :func:`stage_cut`). ``chain_figure`` draws
one cut-off chart per stage, so a reader sees which rule removed the token plain sampling
would have drawn.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from visualizers._common import (CHOSEN, FINAL, INK, REJECTED, at, base_layout, empty_figure, fmt, label, num,
                                 pick_step, plot_text, token_text, visible)
from visualizers.registry import step_plot

TITLE = "Sampler chain, stage by stage"
MAX_STAGES = 6  # rows one figure holds; further stages are named in the subtitle
ROW_PX = 165


def pairs(xs: Any) -> list[tuple[int, float]]:
    """``[[id, p], ...]`` evidence as (id, p) tuples; malformed entries dropped."""
    out = []
    for x in xs if isinstance(xs, list) else []:
        tid, p = at(x, 0), num(at(x, 1))
        if isinstance(tid, int) and not isinstance(tid, bool) and p is not None:
            out.append((tid, p))
    return out


def pick_of(x: Any) -> tuple[int, float | None] | None:
    """A ``gumbel_in``/``gumbel_out`` entry (``[id, p]``) as (id, p), or None."""
    tid = at(x, 0)
    if isinstance(tid, int) and not isinstance(tid, bool):
        return tid, num(at(x, 1))
    return None


def first_mover(stages: list[dict[str, Any]]) -> int | None:
    """Index of the first stage whose cut moved the Gumbel draw (it removed the token the
    noise picked entering it), or None."""
    for j, st in enumerate(stages):
        a, b = pick_of(st.get("gumbel_in")), pick_of(st.get("gumbel_out"))
        if a and b and a[0] != b[0]:
            return j
    return None


def _stage_title(j: int, st: dict[str, Any], trace: dict[str, Any]) -> str:
    parts = [f"{j + 1}. {st.get('stage', '?')}"]
    removed, kept, mass = st.get("removed"), st.get("kept"), num(st.get("kept_mass"))
    if isinstance(removed, int):
        parts.append(f"removed {removed}")
    if isinstance(kept, int):
        parts.append(f"kept {kept}" + (f" ({100 * mass:.1f}% of raw mass)" if mass is not None else ""))
    a, b = pick_of(st.get("gumbel_in")), pick_of(st.get("gumbel_out"))
    if a and b and a[0] != b[0]:
        parts.append(f"draw moved {label(trace, a[0], 8)} → {label(trace, b[0], 8)}")
    if st.get("emptied"):
        parts.append("would have emptied")
    return ", ".join(parts)


@step_plot("token", "Sampler chain", needs="chain", order=90)
def chain_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """One cut-off chart per stage: the distribution entering it (its most probable kept tokens
    in blue, removed ones in red, a dotted line at the cut), the sampled token outlined, and
    with Gumbel coupling a ★ on the token the noise drew entering the stage and ◆ leaving it."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", TITLE)
    stages = [st for st in s.get("chain") or [] if isinstance(st, dict)] if isinstance(s.get("chain"), list) else []
    if not stages:
        return empty_figure(f"step {i} went through no sampler stage", TITLE)
    shown = stages[:MAX_STAGES]
    dist = s.get("dist") if isinstance(s.get("dist"), dict) else {}
    chosen = dist.get("chosen")
    fig = make_subplots(rows=len(shown), cols=1, vertical_spacing=min(0.5 / len(shown), 0.12),
                        subplot_titles=[plot_text(_stage_title(j, st, trace)) for j, st in enumerate(shown)])
    for j, st in enumerate(shown):
        kept, removed = pairs(st.get("top_kept")), pairs(st.get("top_removed"))
        listed = {t for t, _ in kept + removed}
        gin, gout = pick_of(st.get("gumbel_in")), pick_of(st.get("gumbel_out"))
        # the noise's pick entering the stage, when it is a tail token the top lists miss
        if gin and gin[0] not in listed and gin[1] is not None:
            (removed if gout and gout[0] != gin[0] else kept).append((gin[0], gin[1]))
        bars = [(t, p, True) for t, p in sorted(kept, key=lambda x: -x[1])] + \
               [(t, p, False) for t, p in sorted(removed, key=lambda x: -x[1])]
        xs = list(range(len(bars)))
        ticks = [label(trace, t, 8) for t, _, _ in bars]
        hover = [f"<b>{plot_text(visible(token_text(trace, t)))}</b> (#{t})<br>p entering = {fmt(p, 4)}<br>"
                 f"{'kept' if k else 'removed by this stage'}" for t, p, k in bars]
        fig.add_bar(x=xs, y=[p for _, p, _ in bars], row=j + 1, col=1, showlegend=False,
                    marker={"color": [FINAL if k else REJECTED for _, _, k in bars],
                            "line": {"color": [CHOSEN if t == chosen else "rgba(0,0,0,0)" for t, _, _ in bars],
                                     "width": 3}},
                    hovertext=hover, hoverinfo="text")
        n_kept = sum(1 for b in bars if b[2])
        if 0 < n_kept < len(bars):
            fig.add_vline(x=n_kept - 0.5, line={"color": INK, "dash": "dot"}, row=j + 1, col=1)
        for pick, mark, what in ((gin, "★", "noise's draw entering"), (gout, "◆", "noise's draw leaving")):
            if pick and pick[0] in [t for t, _, _ in bars]:
                x = [t for t, _, _ in bars].index(pick[0])
                y = bars[x][1]
                fig.add_scatter(x=[x], y=[y], mode="text", text=[mark], textposition="top center",
                                row=j + 1, col=1, showlegend=False, hoverinfo="text",
                                hovertext=[f"{what}: {plot_text(visible(token_text(trace, pick[0])))}"])
        fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks, row=j + 1, col=1)
        fig.update_yaxes(title_text="p in" if j == len(shown) // 2 else None, row=j + 1, col=1,
                         rangemode="tozero")
    notes = []
    mover = first_mover(stages)
    if mover is not None:
        notes.append(f"the draw was moved first by {stages[mover].get('stage', '?')}")
    elif any(pick_of(st.get("gumbel_in")) for st in stages):
        notes.append("no stage moved the draw")
    if chosen is not None:
        notes.append(f"sampled {label(trace, chosen)} (outlined)")
    if len(stages) > MAX_STAGES:
        notes.append(f"{len(stages) - MAX_STAGES} more stage(s) not drawn: "
                     + ", ".join(str(st.get('stage', '?')) for st in stages[MAX_STAGES:]))
    notes.append("blue kept, red removed; ★ noise's pick entering, ◆ leaving")
    base_layout(fig, f"{TITLE} · step {i}", height=max(300, 90 + ROW_PX * len(shown)),
                subtitle=plot_text(" · ".join(notes)), bargap=0.15)
    fig.update_annotations(font={"size": 11})
    return fig


__all__ = ["chain_figure", "first_mover", "pairs", "pick_of"]
