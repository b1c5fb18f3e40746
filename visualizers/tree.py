"""Draft steps (speculative decoding): the draft tree, accepted lengths, acceptance over time.

The tree is laid out here rather than by a graph library: depth on x (the context at 0),
each leaf on its own row and each inner node at the mean row of its children, so a chain
is a straight line and a token tree fans out. Node colours are shared with the output
colouring: accepted green, rejected red, never reached grey; the token the target added
after the accepted prefix is a diamond, orange for a resampled correction and blue for a
bonus token.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from playground.core.trace import FIGURE_NAMES, speculative_figures
from playground.core.trace import accepted_nodes, draft_nodes
from playground.core.trace import draft_counts as trace_draft_counts
from visualizers._common import (
    ACCEPTED, BONUS, CORRECTION, HEIGHT, INK, REJECTED, UNREACHED, base_layout, empty_figure, fmt, int_dtick,
    ints, label, num, pick_step, plot_text, steps_of, visible, token_text, wrong_kind,
)
from visualizers.registry import run_plot, step_plot

STATUS_COLOUR = {"accepted": ACCEPTED, "rejected": REJECTED, "never reached": UNREACHED}
SOURCE_SYMBOL = {"draft-model": "circle", "draft": "circle", "ngram": "square", "lookup": "square",
                 "ngram-pool": "square", "prompt-lookup": "square", "jacobi": "triangle-up",
                 "lookahead": "triangle-up", "mask-probe": "hexagon", "layer": "pentagon",
                 "recycle": "triangle-down"}
SYMBOL_GLYPH = {"circle": "●", "square": "■", "triangle-up": "▲", "hexagon": "⬢", "pentagon": "⬟",
                "triangle-down": "▼"}


def source_symbol(source: Any) -> str:
    """Marker symbol of a draft source (``layer-7`` counts as ``layer``)."""
    src = str(source or "")
    return SOURCE_SYMBOL.get(src) or SOURCE_SYMBOL.get(src.split("-")[0], "circle")


ROOT = "__root__"


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return x is not None


def tree_nodes(tree: Any) -> list[dict[str, Any]]:
    """The well-formed nodes of a ``tree`` evidence dict (each with a hashable ``id``):
    :func:`playground.core.trace.draft_nodes`, the drafted tokens the figures count."""
    return draft_nodes(tree)


def accepted_ids(tree: dict[str, Any]) -> list[Any]:
    """Accepted node ids in path order (``accepted_path``, else nodes flagged accepted)."""
    path = tree.get("accepted_path") if isinstance(tree, dict) else None
    if isinstance(path, list):
        return [p for p in path if _hashable(p)]
    return [n["id"] for n in tree_nodes(tree) if n.get("accepted") is True]


def accepted_length(tree: Any) -> int:
    """How many drafted tokens a step accepted (:func:`playground.core.trace.accepted_nodes`)."""
    return len(accepted_nodes(tree))


def tree_depth(tree: Any) -> int:
    """Depth of the draft tree (the longest drafted chain)."""
    nodes = tree_nodes(tree)
    parent = {n["id"]: n.get("parent") for n in nodes}
    depth: dict[Any, int] = {}

    def d(nid: Any, guard: int = 0) -> int:
        if nid in depth:
            return depth[nid]
        p = parent.get(nid)
        v = 1 if (p not in parent or guard > len(parent)) else d(p, guard + 1) + 1
        depth[nid] = v
        return v

    return max((d(n["id"]) for n in nodes), default=0)


def node_status(tree: dict[str, Any]) -> dict[Any, str]:
    """accepted / rejected / never reached, per node id.

    A node is *rejected* when verification looked at it (its parent is the context or an
    accepted node, and the trace says it was not accepted or gives its accept
    probability); any other unaccepted node was never reached.
    """
    nodes = tree_nodes(tree)
    ids = {n["id"] for n in nodes}
    acc = set(accepted_ids(tree))
    out: dict[Any, str] = {}
    for n in nodes:
        nid, par = n["id"], n.get("parent")
        if nid in acc:
            out[nid] = "accepted"
            continue
        parent_ok = (par not in ids) or (par in acc)
        # A trace that records accept_prob leaves it null for nodes verification never
        # tried (siblings after an accepted one); without the field, False means tried.
        looked = (num(n.get("accept_prob")) is not None if "accept_prob" in n
                  else n.get("accepted") is False)
        out[nid] = "rejected" if parent_ok and looked else "never reached"
    return out


CORR = "__correction__"


def layout_tree(tree: dict[str, Any], correction_parent: Any = None) -> dict[Any, tuple[int, float]]:
    """(depth, row) of every node and of the context root ``ROOT`` (depth 0).

    With ``correction_parent`` the correction/bonus token is laid out too, as ``CORR``,
    the last child of that node, so it gets its own row instead of covering a sibling.
    """
    nodes = tree_nodes(tree)
    ids = [n["id"] for n in nodes]
    idset = set(ids)
    children: dict[Any, list[Any]] = {ROOT: []}
    for n in nodes:
        par = n.get("parent")
        key = par if (par in idset and par != n["id"]) else ROOT
        children.setdefault(key, []).append(n["id"])
    if correction_parent is not None:
        children.setdefault(correction_parent if correction_parent in idset else ROOT, []).append(CORR)
    pos: dict[Any, tuple[int, float]] = {}
    next_row = [0]
    seen: set[Any] = set()

    def place(nid: Any, depth: int) -> float:
        seen.add(nid)
        kids = [k for k in children.get(nid, []) if k not in seen]
        if not kids:
            row = float(next_row[0])
            next_row[0] += 1
        else:
            rows = [place(k, depth + 1) for k in kids]
            row = sum(rows) / len(rows)
        pos[nid] = (depth, row)
        return row

    place(ROOT, 0)
    for nid in ids:  # nodes in a parent cycle: put them on their own rows, never lose them
        if nid not in pos:
            pos[nid] = (1, float(next_row[0]))
            next_row[0] += 1
    return pos


@step_plot("draft", "Draft tree", metric="acceptance", order=10)
def draft_tree_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """The draft tree of one draft step: what was proposed, accepted, rejected, corrected."""
    title = "Draft tree"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    if s.get("kind") != "draft":
        return wrong_kind(i, s, "draft", title)
    tree = s.get("tree")
    nodes = tree_nodes(tree)
    correction = tree.get("correction") if isinstance(tree, dict) else None
    if not nodes and correction is None:
        return empty_figure(f"step {i} drafted nothing", f"{title} · step {i}")
    status = node_status(tree)
    path = accepted_ids(tree)
    ids = {n["id"] for n in nodes}
    corr_parent = path[-1] if path and path[-1] in ids else ROOT
    pos = layout_tree(tree, corr_parent if correction is not None else None)
    kind = tree.get("correction_kind") if isinstance(tree, dict) else None

    fig = go.Figure()
    by_id = {n["id"]: n for n in nodes}
    # Edges: the accepted path thick and green, everything else thin grey.
    for colour, width, name, want in ((UNREACHED, 1.2, "edges", False), (ACCEPTED, 3.5, "accepted path", True)):
        ex: list[Any] = []
        ey: list[Any] = []
        for n in nodes:
            par = n.get("parent")
            par = par if par in by_id else ROOT
            if (status.get(n["id"]) == "accepted") != want:
                continue
            (x0, y0), (x1, y1) = pos[par], pos[n["id"]]
            ex += [x0, x1, None]
            ey += [y0, y1, None]
        if ex:
            fig.add_scatter(x=ex, y=ey, mode="lines", line={"color": colour, "width": width},
                            hoverinfo="skip", showlegend=False, name=name)
    if correction is not None:
        (x0, y0), (x1, y1) = pos[corr_parent], pos[CORR]
        fig.add_scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                        line={"color": BONUS if kind == "bonus" else CORRECTION, "width": 2.5, "dash": "dot"})

    rx, ry = pos[ROOT]
    committed_before = _context_hint(trace, i) or (label(trace, s.get("root"), 10) if s.get("root") is not None else "")
    # The root's label goes under it, centred: to its left it ran off the plot's edge.
    fig.add_scatter(x=[rx], y=[ry], mode="markers+text", name="context",
                    marker={"symbol": "circle", "size": 14, "color": INK},
                    text=[committed_before or "context"], textposition="bottom center", cliponaxis=False,
                    hovertext=[f"context (output so far ends with “{committed_before}”)"],
                    hoverinfo="text", showlegend=False)
    rows_used = max((r for _, r in pos.values()), default=0) + 1
    # Dense trees: labels beside the nodes, where they have the row's height to themselves.
    text_pos = "top center" if rows_used <= 8 else "middle right"
    for st in ("accepted", "rejected", "never reached"):
        group = [n for n in nodes if status[n["id"]] == st]
        if not group:
            continue
        fig.add_scatter(
            x=[pos[n["id"]][0] for n in group], y=[pos[n["id"]][1] for n in group],
            mode="markers+text", name=st,
            marker={"size": 15, "color": STATUS_COLOUR[st], "line": {"width": 1, "color": "rgba(0,0,0,0.35)"},
                    "symbol": [source_symbol(n.get("source")) for n in group]},
            text=[label(trace, n.get("token"), 14 if text_pos == "top center" else 10) for n in group],
            textposition=text_pos, cliponaxis=False,
            customdata=[str(n["id"]) for n in group],
            hovertext=[_node_hover(trace, n, st, pos[n["id"]][0]) for n in group], hoverinfo="text",
        )
    if correction is not None:
        what = "bonus" if kind == "bonus" else ("correction" if kind in (None, "resample") else str(kind))
        colour = BONUS if kind == "bonus" else CORRECTION
        tx = plot_text(visible(token_text(trace, correction)))
        why = ("all drafted tokens accepted; the target adds one more" if kind == "bonus"
               else "sampled by the target from the residual max(0, p − q)")
        fig.add_scatter(
            x=[pos[CORR][0]], y=[pos[CORR][1]], mode="markers+text", name=what,
            marker={"symbol": "diamond", "size": 17, "color": colour, "line": {"width": 1, "color": "rgba(0,0,0,0.35)"}},
            text=[label(trace, correction)], textposition=text_pos,
            hovertext=[f"<b>{tx}</b> (#{correction})<br>{plot_text(what)} token<br>{plot_text(why)}"],
            hoverinfo="text",
        )
    depth = max((d for d, _ in pos.values()), default=1)
    rows = max((r for _, r in pos.values()), default=0)
    extra = {"bonus": " + bonus", "resample": " + correction"}.get(kind or "", " + correction" if correction is not None else "")
    sources = sorted({str(n.get("source")) for n in nodes if n.get("source")})
    src = plot_text("source: " + ", ".join(f"{SYMBOL_GLYPH.get(source_symbol(x), '●')} {x}" for x in sources)) if sources else ""
    base_layout(fig, f"{title} · step {i} · accepted {len(path)} of {len(nodes)} drafted{extra}",
                subtitle=src, height=tree_height(rows + 1),
                # labels beside the deepest nodes need room to the right of them
                xaxis={"title": "depth (tokens ahead)", "dtick": 1,
                       "range": [-0.6, depth + (1.4 if text_pos == "middle right" else 0.6)],
                       "zeroline": False},
                yaxis={"visible": False, "autorange": "reversed", "range": [rows + 0.8, -0.6]})
    return fig


def tree_height(rows: int) -> int:
    """Figure height for a tree of ``rows`` leaf rows: 18 px a row (room for a label)
    beyond what the standard height holds, at most 900 px."""
    return max(HEIGHT, min(900, 150 + 18 * rows))


def _context_hint(trace: dict[str, Any], i: int) -> str:
    """The last few characters of the output before step ``i`` (the tree's root label)."""
    ids: list[int] = []
    for s in steps_of(trace)[:i]:
        if s.get("kind") != "denoise":
            ids.extend(ints(s.get("committed")))
    txt = visible("".join(token_text(trace, t) for t in ids[-4:])) if ids else ""
    return plot_text(("…" + txt[-10:]) if len(txt) > 10 else txt)


def _node_hover(trace: dict[str, Any], n: dict[str, Any], status: str, depth: int) -> str:
    tx = plot_text(visible(token_text(trace, n.get("token"))))
    q, p = num(n.get("q")), num(n.get("p"))
    ap = num(n.get("accept_prob"))
    if ap is None and q and p is not None:
        ap = min(1.0, p / q)
    rules = n.get("rule_probs") if isinstance(n.get("rule_probs"), dict) else {}
    # every rule's acceptance probability for this token, side by side (the trace's nodes carry them)
    side = "".join(f"<br>  {plot_text(r)}: {fmt(v, 3)}" for r, v in rules.items() if r != "strict")
    return (f"<b>{tx}</b> (#{n.get('token')})<br>{status} · depth {depth}<br>"
            f"q (draft) = {fmt(q, 4)}<br>p (target) = {fmt(p, 4)}<br>"
            f"accept prob = {fmt(ap, 3)}" + (f"<br>by rule (strict {fmt(rules.get('strict'), 3)}):{side}" if side else "")
            + f"<br>source: {plot_text(n.get('source') or '–')}")


def _draft_steps(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in steps_of(trace) if s.get("kind") == "draft" and isinstance(s.get("tree"), dict)]


def draft_counts(trace: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """(drafted, accepted, verifications, committed) over the trace's verifications, or None
    when it has none (:func:`playground.core.trace.draft_counts`, the decoders' definition)."""
    return trace_draft_counts(steps_of(trace))


def trace_figures(trace: dict[str, Any]) -> dict[str, float] | None:
    """The speculative figures (acceptance, mean accepted length, tokens per verification)
    of a trace's steps, by the definitions the decoders' stats use; None without drafts."""
    counts = draft_counts(trace)
    return speculative_figures(*counts) if counts else None


@run_plot("Accepted length", kind="draft", order=10)
def accepted_length_histogram(trace: dict[str, Any]) -> go.Figure:
    """How many drafted tokens each verification accepted (0 … tree depth), as counts."""
    title = "Accepted length per verification"
    steps = _draft_steps(trace)
    if not steps:
        return empty_figure("no draft steps yet", title)
    lengths = [accepted_length(s["tree"]) for s in steps]
    top = max(max(lengths), max(tree_depth(s["tree"]) for s in steps))
    xs = list(range(top + 1))
    counts = [lengths.count(x) for x in xs]
    fig = go.Figure()
    fig.add_bar(x=xs, y=counts, marker_color=ACCEPTED, name="verifications",
                hovertext=[f"{c} verification(s) accepted {x} drafted token(s)" for x, c in zip(xs, counts)],
                hoverinfo="text", text=[c or "" for c in counts], textposition="outside", cliponaxis=False)
    f = trace_figures(trace) or {}
    base_layout(fig, f"{title} · {FIGURE_NAMES['mean_accepted_length']} {f.get('mean_accepted_length', 0.0):.2f}"
                f" · {FIGURE_NAMES['tokens_per_verification']} {f.get('tokens_per_verification', 0.0):.2f}",
                xaxis={"title": "accepted drafted tokens", "dtick": 1},
                yaxis={"title": "verifications", "dtick": int_dtick(max(counts)), "range": [0, max(counts) * 1.15]},
                showlegend=False)
    return fig


@run_plot("Acceptance over time", kind="draft", order=20)
def acceptance_timeline(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """Per draft step: accepted tokens plus the correction/bonus token, and the acceptance
    (accepted drafted tokens / drafted tokens) of that step and of the run so far."""
    title = "Acceptance over time"
    steps = _draft_steps(trace)
    if not steps:
        return empty_figure("no draft steps yet", title)
    xs, acc, corr, bonus, rate, running = [], [], [], [], [], []
    tot_a = tot_d = 0
    for s in steps:
        tree = s["tree"]
        a, d = accepted_length(tree), len(tree_nodes(tree))
        k = tree.get("correction_kind")
        has = tree.get("correction") is not None
        xs.append(s.get("i"))
        acc.append(a)
        corr.append(1 if has and k != "bonus" else 0)
        bonus.append(1 if has and k == "bonus" else 0)
        rate.append(a / d if d else None)
        tot_a, tot_d = tot_a + a, tot_d + d
        running.append(tot_a / tot_d if tot_d else None)
    fig = go.Figure()
    fig.add_bar(x=xs, y=acc, name="accepted", marker_color=ACCEPTED)
    if any(corr):
        fig.add_bar(x=xs, y=corr, name="correction", marker_color=CORRECTION)
    if any(bonus):
        fig.add_bar(x=xs, y=bonus, name="bonus", marker_color=BONUS)
    name = FIGURE_NAMES["acceptance_rate"]
    fig.add_scatter(x=xs, y=rate, name=f"{name} this step", mode="markers", yaxis="y2",
                    marker={"color": INK, "size": 5, "symbol": "circle-open"})
    fig.add_scatter(x=xs, y=running, name=f"{name} so far", mode="lines", yaxis="y2",
                    line={"color": INK, "width": 2})
    f = trace_figures(trace) or {}
    top_x = max((x for x in xs if isinstance(x, int)), default=1)
    base_layout(fig, title + (f" · {name} {100 * f['acceptance_rate']:.0f}%" if tot_d and f else ""),
                subtitle=f"{name} = accepted drafted tokens / drafted tokens",
                barmode="stack", xaxis={"title": "step", "dtick": int_dtick(top_x, 12)},
                yaxis={"title": "tokens", "rangemode": "tozero",
                       "dtick": int_dtick(max(a + c + b for a, c, b in zip(acc, corr, bonus)))},
                yaxis2={"title": f"{name} (accepted / drafted)", "overlaying": "y", "side": "right",
                        "range": [0, 1.05], "showgrid": False, "tickformat": ".0%"})
    if step is not None and isinstance(step, int):
        fig.add_vline(x=step, line={"color": INK, "width": 1, "dash": "dot"})
    return fig
