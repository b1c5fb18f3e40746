"""The lattice of a best-first search with recombination: every expanded hypothesis as a node
(x = its length, labelled with its last token), an edge from its parent, a dashed edge where a
hypothesis was merged into a node of its length that shares its last n tokens, and the
answer's path drawn thick; the title sets paths encoded against nodes expanded.

It reads the ``lattice`` evidence of ``best_first_beam``'s steps (``nodes``, ``merges``,
``answer``, ``n``) and the trace's ``stats`` (``expansions``, ``merges``, ``paths_encoded``).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (ACCEPTED, CORRECTION, INK, UNREACHED, base_layout, empty_figure, label, num,
                                 plot_text, steps_of)
from visualizers.registry import run_plot

TITLE = "Lattice"


def lattice_parts(trace: dict[str, Any]) -> tuple[dict[int, list[Any]], list[list[Any]], list[Any] | None, int]:
    """(nodes by id: [id, parent, depth, token], merges, the answer, n) from the steps."""
    nodes: dict[int, list[Any]] = {}
    merges: list[list[Any]] = []
    answer, n = None, 0
    for s in steps_of(trace):
        ev = s.get("lattice")
        if not isinstance(ev, dict):
            continue
        n = ev.get("n", n)
        for row in ev.get("nodes") or []:
            if isinstance(row, list) and len(row) >= 4 and isinstance(row[0], int):
                nodes[row[0]] = row
        merges += [m for m in ev.get("merges") or [] if isinstance(m, list) and len(m) >= 5]
        if isinstance(ev.get("answer"), list):
            answer = ev["answer"]
    return nodes, merges, answer, int(n or 0)


@run_plot(TITLE, evidence="lattice", order=160)
def lattice_figure(trace: dict[str, Any]) -> go.Figure:
    """The search lattice: nodes by depth, parent edges, merge edges, the answer's path."""
    nodes, merges, answer, n = lattice_parts(trace)
    if not nodes:
        return empty_figure("no lattice yet (set recombine > 0)", TITLE)
    rows: dict[int, int] = {}
    per_depth: dict[int, int] = {}
    for uid in sorted(nodes):
        d = int(nodes[uid][2])
        rows[uid] = per_depth.get(d, 0)
        per_depth[d] = rows[uid] + 1

    def xy(uid: Any) -> tuple[float, float] | None:
        if uid in nodes:
            return float(nodes[uid][2]), float(rows[uid])
        return None

    on_path: set[Any] = set()
    if answer is not None:
        cur = answer[1]
        while cur in nodes and cur not in on_path:
            on_path.add(cur)
            cur = nodes[cur][1]
    fig = go.Figure()
    for name, colour, width, dash, pairs in (
            ("expansion", UNREACHED, 1.0, None, [(r[1], r[0]) for r in nodes.values() if r[0] not in on_path]),
            ("merge", CORRECTION, 1.6, "dash", [(m[1], m[4]) for m in merges]),
            ("answer's path", ACCEPTED, 3.5, None, [(r[1], r[0]) for r in nodes.values() if r[0] in on_path])):
        ex: list[Any] = []
        ey: list[Any] = []
        for a, b in pairs:
            pa, pb = xy(a), xy(b)
            if pb is None:
                continue
            pa = pa or (pb[0] - 1, 0.0)
            ex += [pa[0], pb[0], None]
            ey += [pa[1], pb[1], None]
        if ex:
            fig.add_scatter(x=ex, y=ey, mode="lines", name=name, hoverinfo="skip",
                            line={"color": colour, "width": width, "dash": dash})
    merged_into = {m[4] for m in merges}
    uids = sorted(nodes)
    fig.add_scatter(
        x=[xy(u)[0] for u in uids], y=[xy(u)[1] for u in uids], mode="markers+text", name="node",
        marker={"size": [12 if u in merged_into else 8 for u in uids],
                "color": [CORRECTION if u in merged_into else (ACCEPTED if u in on_path else INK) for u in uids]},
        text=[label(trace, nodes[u][3], 6) for u in uids], textposition="top center", cliponaxis=False,
        hovertext=[plot_text(f"node {u}, length {nodes[u][2]}: …{label(trace, nodes[u][3])}"
                             + (f" · {sum(1 for m in merges if m[4] == u)} hypothesis(es) merged in" if u in merged_into else ""))
                   for u in uids], hoverinfo="text", showlegend=False)
    stats = trace.get("stats") if isinstance(trace.get("stats"), dict) else {}
    paths = num(stats.get("paths_encoded"))
    sub = f"recombine n = {n} · {len(merges)} merges"
    if paths is not None:
        sub += f" · {int(paths)} paths encoded by {len(nodes)} expanded nodes"
    base_layout(fig, f"{TITLE} · {len(nodes)} nodes", subtitle=plot_text(sub),
                height=max(450, min(900, 120 + 22 * max(per_depth.values()))),
                xaxis={"title": "hypothesis length (tokens)", "dtick": 1, "zeroline": False},
                yaxis={"visible": False, "autorange": "reversed"})
    return fig
