"""Acceptance rules side by side: for every drafted token a draft step verified, the
probability with which each acceptance rule would have accepted it (strict speculative
sampling, Cactus, the relaxed and threshold rules), the run's own rule drawn solid.

It reads the ``rule_probs`` of the draft tree's nodes and the step's ``accept_rules``
(``active``, ``rules``, ``lossy``), which every draft-and-verify decoder with the acceptance
knobs records.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (ACCEPTED, REJECTED, base_layout, empty_figure, label, num, pick_step, plot_text,
                                 wrong_kind)
from visualizers.registry import step_plot

TITLE = "Acceptance by rule"
# one colour per rule, the same in every step
RULE_COLOURS = {"strict": "#6366f1", "cactus": "#22a55b", "additive": "#f07a1a", "multiplicative": "#e5484d",
                "typical": "#0ea5e9", "top_m": "#d946ef", "fuzzy": "#a16207", "entropy": "#7d8590"}


def _depths(nodes: list[dict[str, Any]]) -> dict[Any, int]:
    by_id = {n.get("id"): n for n in nodes}
    out: dict[Any, int] = {}
    for n in nodes:
        d, cur, guard = 1, n, 0
        while cur.get("parent") in by_id and guard < 256:
            cur, d, guard = by_id[cur["parent"]], d + 1, guard + 1
        out[n.get("id")] = d
    return out


@step_plot("draft", TITLE, needs="accept_rules", order=50)
def accept_rules_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Grouped bars: per verified drafted token, each rule's acceptance probability."""
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", TITLE)
    if s.get("kind") != "draft":
        return wrong_kind(i, s, "draft", TITLE)
    info = s.get("accept_rules") if isinstance(s.get("accept_rules"), dict) else {}
    tree = s.get("tree") if isinstance(s.get("tree"), dict) else {}
    nodes = [n for n in tree.get("nodes") or [] if isinstance(n, dict)]
    tried = [n for n in nodes if isinstance(n.get("rule_probs"), dict)]
    if not tried:
        return empty_figure(f"step {i} verified no drafted token", f"{TITLE} · step {i}")
    rules = [r for r in info.get("rules") or [] if isinstance(r, str)] or list(tried[0]["rule_probs"])
    active, lossy = info.get("active"), set(info.get("lossy") or [])
    depth = _depths(nodes)
    xs = [f"{depth.get(n.get('id'), 1)}: {label(trace, n.get('token'), 10)} ({n.get('id')})" for n in tried]
    fig = go.Figure()
    for r in rules:
        name = r + (" (lossy)" if r in lossy else "") + (" ← this run" if r == active else "")
        fig.add_bar(x=xs, y=[num(n["rule_probs"].get(r)) for n in tried], name=name,
                    marker={"color": RULE_COLOURS.get(r, "#94a3b8"), "opacity": 1.0 if r == active else 0.45,
                            "line": {"width": 2 if r == active else 0, "color": "rgba(0,0,0,0.5)"}},
                    hovertemplate="%{x}<br>" + plot_text(r) + ": accept with probability %{y:.3f}<extra></extra>")
    fig.add_scatter(x=xs, y=[1.07] * len(tried), mode="markers", name="verdict", cliponaxis=False,
                    marker={"symbol": ["circle" if n.get("accepted") else "x" for n in tried], "size": 11,
                            "color": [ACCEPTED if n.get("accepted") else REJECTED for n in tried]},
                    hovertext=["accepted" if n.get("accepted") else "rejected" for n in tried], hoverinfo="text")
    base_layout(fig, f"{TITLE} · step {i} · rule {plot_text(active or '?')}",
                subtitle=plot_text("each drafted token the target looked at, under every rule; "
                                   "a relaxed rule above strict accepts more, at a cost in fidelity"),
                barmode="group", yaxis={"title": "acceptance probability", "range": [0, 1.12]},
                xaxis={"title": "depth: drafted token (node)"})
    return fig
