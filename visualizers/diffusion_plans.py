"""Views of the second-wave diffusion plans: what each rule saw and why it committed.

Each plan writes its own evidence field on its ``denoise`` steps and gets one step plot and
one whole-run plot here: ``ete`` (explore vs exploit, bits per round, cascades), ``r2``
(which rule committed, windows, stability counters), ``leap`` (anchors and their zones),
``adablock`` (look-ahead window, delimiter candidates, the block that moves) and
``schedule`` (ASS: the ascending step sizes beside the even ones) and ``apd`` (the small
causal helper's and the dLLM's probability of each proposal, the accepted prefix) and
``dingo`` (the DP lattice over positions × automaton states and its best path). Positions
are relative to the generated part, as on the canvas.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from visualizers._common import (
    ACCEPTED, CHOSEN, CORRECTION, ENTROPY, FINAL, INK, MASK, REJECTED, at, base_layout, empty_figure, fmt, ints, num,
    pick_step, plot_text, token_text, visible, wrong_kind,
)
from visualizers.canvas import canvas_of, denoise_steps, unmasked_of
from visualizers.registry import run_plot, step_plot

NOT_NOW = "not committed"
ZONE = "rgba(34,165,91,0.12)"
BAND = "rgba(99,102,241,0.14)"


# ---------------------------------------------------------------------- shared builders
def _masked_at(trace: dict[str, Any], s: dict[str, Any]) -> list[int]:
    """Positions masked when step ``s`` began (those with a confidence at that step)."""
    return [p for p, c in enumerate(s.get("confidence") or []) if num(c) is not None]


def _hover(trace: dict[str, Any], s: dict[str, Any], p: int, group: str) -> str:
    pred = at(s.get("predicted"), p)
    c = num(at(s.get("confidence"), p))
    b = -math.log2(c) if c and c > 0 else None
    return (f"position {p} · {group}<br><b>{plot_text(visible(token_text(trace, pred)))}</b>"
            f" · confidence {fmt(c)} · {fmt(b, 2)} bits<br>entropy {fmt(at(s.get('entropy'), p), 2)} nats")


def _group_bars(trace: dict[str, Any], s: dict[str, Any], groups: list[tuple[str, list[int], str]],
                value: Callable[[int], float | None]) -> go.Figure:
    """Bars of ``value(p)`` at the step's masked positions, one trace per group (the first
    group a position is in wins; the rest are ``not committed``), so the legend explains."""
    masked = _masked_at(trace, s)
    seen: set[int] = set()
    fig = go.Figure()
    for name, members, colour in groups + [(NOT_NOW, masked, MASK)]:
        sel = [p for p in members if p in masked and p not in seen]
        seen.update(sel)
        if sel:
            fig.add_bar(x=sel, y=[value(p) for p in sel], name=name, marker_color=colour,
                        hovertext=[_hover(trace, s, p, name) for p in sel], hoverinfo="text")
    return fig


def _spans(fig: go.Figure, spans: list[Any], colour: str, **kw: Any) -> None:
    for sp in spans:
        if isinstance(sp, (list, tuple)) and len(sp) == 2 and all(isinstance(v, int) for v in sp):
            fig.add_vrect(x0=sp[0] - 0.5, x1=sp[1] - 0.5, fillcolor=colour, line_width=0, layer="below", **kw)


def _hline(fig: go.Figure, y: Any, text: str, colour: str = INK, **kw: Any) -> None:
    if num(y) is not None:
        fig.add_hline(y=num(y), line={"color": colour, "width": 1, "dash": "dash"},
                      annotation_text=plot_text(text), annotation_position="top left",
                      annotation_font={"size": 10, "color": colour}, **kw)


def _evidence(trace: dict[str, Any], step: int, key: str, title: str) -> tuple[int, dict[str, Any] | None, Any]:
    """(index, step, the step's ``key`` evidence) or a figure explaining why there is none."""
    i, s = pick_step(trace, step)
    if s is None:
        return i, None, empty_figure("no steps yet", title)
    if s.get("kind") != "denoise":
        return i, None, wrong_kind(i, s, "denoise", title)
    ev = s.get(key)
    if not isinstance(ev, dict):
        return i, None, empty_figure(f"step {i} has no {key} evidence", f"{title} · step {i}")
    return i, s, ev


def _rows(trace: dict[str, Any], key: str) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(step index, step, evidence) of every denoise step carrying dict evidence ``key``."""
    out = []
    for s in denoise_steps(trace):
        ev = s.get(key)
        if isinstance(ev, dict) and isinstance(s.get("i"), int):
            out.append((s["i"], s, ev))
    return out


def _width(trace: dict[str, Any]) -> int:
    steps = denoise_steps(trace)
    return max([len(canvas_of(s)) for s in steps] + [0])


def _markers(fig: go.Figure, trace: dict[str, Any], rows: list[tuple[int, dict[str, Any], dict[str, Any]]],
             groups: list[tuple[str, str, str, str]], **where: Any) -> None:
    """Per group (name, evidence list key, colour, symbol): a marker at (position, step) of
    every position that group committed, hover naming its token."""
    for name, key, colour, symbol in groups:
        xs, ys, hv = [], [], []
        for i, s, ev in rows:
            for p in ints(ev.get(key)):
                xs.append(p)
                ys.append(i)
                hv.append(f"step {i} · {name}<br>" + _hover(trace, s, p, name))
        if xs:
            fig.add_scatter(x=xs, y=ys, mode="markers", name=name, hovertext=hv, hoverinfo="text",
                            marker={"color": colour, "symbol": symbol, "size": 8,
                                    "line": {"width": 0.5, "color": "white"}}, **where)


# ---------------------------------------------------------------------- ETE
@step_plot("denoise", "Explore vs exploit", needs="ete", order=30)
def ete_step_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Bits (``-log2 p``) of each masked position's proposal at one round: exploit commits
    (confident, few bits), explore commits (uncertain, many bits), the rest; the line is the
    exploit threshold in bits, the shaded span where exploration may reach."""
    title = "Explore vs exploit"
    i, s, ev = _evidence(trace, step, "ete", title)
    if s is None:
        return ev
    def b(p: int) -> float | None:
        c = num(at(s.get("confidence"), p))
        return -math.log2(c) if c and c > 0 else None
    fig = _group_bars(trace, s, [("exploit", ints(ev.get("exploit")), ACCEPTED),
                                 ("explore", ints(ev.get("explore")), CORRECTION)], b)
    _spans(fig, [ev.get("explore_reach")], "rgba(240,122,26,0.08)")
    thr = num(ev.get("threshold"))
    if thr and thr > 0:
        _hline(fig, -math.log2(thr), f"exploit above confidence {fmt(thr)}", ACCEPTED)
    cascade = ev.get("cascade")
    sub = (f"{fmt(ev.get('bits'), 2)} bits this round (exploit {fmt(ev.get('bits_exploit'), 2)}, "
           f"explore {fmt(ev.get('bits_explore'), 2)}) · budget {fmt(ev.get('budget'), 2)}"
           + (f" · cascade {cascade}" if isinstance(cascade, int) else ""))
    return base_layout(fig, f"{title} · round {i}", subtitle=plot_text(sub), barmode="overlay",
                       xaxis_title="position in the canvas", yaxis={"title": "bits (−log2 p)", "rangemode": "tozero"})


@run_plot("Bits per round", evidence="ete", order=110)
def ete_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Top: bits committed per round, exploit and explore stacked, and the cascade (confident
    commits in the round after an exploration). Bottom: the unmasking map with explore and
    exploit commits marked."""
    title = "Bits per round"
    rows = _rows(trace, "ete")
    if not rows:
        return empty_figure("no ETE rounds yet", title)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.4, 0.6], vertical_spacing=0.12)
    xs = [i for i, _s, _e in rows]
    fig.add_bar(x=xs, y=[num(e.get("bits_exploit")) or 0 for _i, _s, e in rows], name="exploit bits",
                marker_color=ACCEPTED, row=1, col=1)
    fig.add_bar(x=xs, y=[num(e.get("bits_explore")) or 0 for _i, _s, e in rows], name="explore bits",
                marker_color=CORRECTION, row=1, col=1)
    cx = [i for i, _s, e in rows if isinstance(e.get("cascade"), int)]
    cy = [e["cascade"] for _i, _s, e in rows if isinstance(e.get("cascade"), int)]
    if cx:
        fig.add_scatter(x=cx, y=cy, mode="markers+lines", name="cascade (confident commits next round)",
                        line={"color": FINAL, "width": 1, "dash": "dot"}, marker={"size": 7}, row=1, col=1)
    _markers(fig, trace, rows, [("exploit", "exploit", ACCEPTED, "circle"),
                                ("explore", "explore", CORRECTION, "diamond")], row=2, col=1)
    total = sum(num(e.get("bits")) or 0 for _i, _s, e in rows)
    explored = sum(len(ints(e.get("explore"))) for _i, _s, e in rows)
    base_layout(fig, title, subtitle=plot_text(f"{len(rows)} rounds · {total:.1f} bits in all · "
                                               f"{explored} explored"), height=520, barmode="stack")
    fig.update_yaxes(title_text="bits · cascade", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="round", autorange="reversed", row=2, col=1)
    fig.update_xaxes(title_text="round", row=1, col=1)
    fig.update_xaxes(title_text="position in the canvas", range=[-0.5, _width(trace) - 0.5], row=2, col=1)
    return fig


# ---------------------------------------------------------------------- R²-dLLM
R2_GROUPS = [("threshold", "threshold", ACCEPTED, "circle"), ("spatial (window)", "spatial", FINAL, "square"),
             ("temporal (stable)", "temporal", CHOSEN, "diamond")]


@step_plot("denoise", "Which rule committed", needs="r2", order=40)
def r2_step_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Confidence of each masked position coloured by the R² rule that committed it, the
    windows that fired shaded, and each position's stability counter (steps its proposal
    has held) as a line on the right axis."""
    title = "Which rule committed"
    i, s, ev = _evidence(trace, step, "r2", title)
    if s is None:
        return ev
    fig = _group_bars(trace, s, [(n, ints(ev.get(k)), c) for n, k, c, _m in R2_GROUPS],
                      lambda p: num(at(s.get("confidence"), p)))
    _spans(fig, ev.get("windows") or [], "rgba(99,102,241,0.10)")
    stab = s.get("stability") or []
    masked = _masked_at(trace, s)
    if masked:
        fig.add_scatter(x=masked, y=[num(at(stab, p)) for p in masked], name="stable for (steps)", yaxis="y2",
                        mode="markers+lines", line={"color": ENTROPY, "width": 1, "dash": "dot"},
                        marker={"size": 5})
    _hline(fig, (s.get("plan") or {}).get("threshold"), "threshold", ACCEPTED)
    _hline(fig, ev.get("window_threshold"), "window mean", FINAL)
    need = ev.get("stable_steps")
    sub = (f"{len(ev.get('windows') or [])} windows fired · stable after {need} steps at mean "
           f"confidence {fmt(ev.get('stable_threshold'))}")
    return base_layout(fig, f"{title} · step {i}", subtitle=plot_text(sub), barmode="overlay",
                       xaxis_title="position in the canvas", yaxis={"title": "confidence", "range": [0, 1.05]},
                       yaxis2={"title": "stable for (steps)", "overlaying": "y", "side": "right", "showgrid": False,
                               "rangemode": "tozero"})


@run_plot("Stability counters", evidence="r2", order=120)
def r2_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Position × step: how many steps each masked position's proposal had held (darker =
    more stable), with each commit marked by the rule that made it."""
    title = "Stability counters"
    rows = _rows(trace, "r2")
    if not rows:
        return empty_figure("no R² steps yet", title)
    n = _width(trace)
    z = [[num(at(s.get("stability"), p)) for p in range(n)] for _i, s, _e in rows]
    z = [[math.nan if v is None else v for v in r] for r in z]
    fig = go.Figure()
    fig.add_heatmap(x=list(range(n)), y=[i for i, _s, _e in rows], z=z, colorscale="Purples", zmin=0,
                    name="stable for", hovertemplate="position %{x} · step %{y}<br>stable for %{z} steps<extra></extra>",
                    colorbar={"title": {"text": "stable for", "side": "right"}, "thickness": 12, "len": 0.85})
    _markers(fig, trace, rows, R2_GROUPS)
    counts = {n_: sum(len(ints(e.get(k))) for _i, _s, e in rows) for n_, k, _c, _m in R2_GROUPS}
    sub = " · ".join(f"{k} {v}" for k, v in counts.items())
    return base_layout(fig, f"{title} · position × step", subtitle=plot_text(sub),
                       xaxis_title="position in the canvas", yaxis={"title": "step", "autorange": "reversed"})


# ---------------------------------------------------------------------- LocalLeap
@step_plot("denoise", "Anchors and leap zones", needs="leap", order=50)
def leap_step_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Confidence of each masked position: anchors (above τ_hi), leaps (inside a zone, above
    τ_lo) and the rest, with the zones shaded and both thresholds drawn."""
    title = "Anchors and leap zones"
    i, s, ev = _evidence(trace, step, "leap", title)
    if s is None:
        return ev
    fig = _group_bars(trace, s, [("anchor", ints(ev.get("anchors")), ACCEPTED),
                                 ("leap", ints(ev.get("leap")), "#7dd3a0")],
                      lambda p: num(at(s.get("confidence"), p)))
    _spans(fig, ev.get("zones") or [], ZONE)
    _hline(fig, ev.get("tau_hi"), "τ_hi (anchor)", ACCEPTED)
    _hline(fig, ev.get("tau_lo"), "τ_lo (in a zone)", "#3f9f6a")
    sub = (f"{len(ints(ev.get('anchors')))} anchors · {len(ints(ev.get('leap')))} leaps · radius "
           f"{ev.get('radius')}" + (" · no anchor: the most confident position" if ev.get("fallback") else ""))
    return base_layout(fig, f"{title} · step {i}", subtitle=plot_text(sub), barmode="overlay",
                       xaxis_title="position in the canvas", yaxis={"title": "confidence", "range": [0, 1.05]})


@run_plot("Anchors over the run", evidence="leap", order=130)
def leap_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Position × step: the leap zones of each step shaded, anchors and leaps marked."""
    title = "Anchors over the run"
    rows = _rows(trace, "leap")
    if not rows:
        return empty_figure("no LocalLeap steps yet", title)
    n = _width(trace)
    z = []
    for _i, _s, e in rows:
        r = [math.nan] * n
        for sp in e.get("zones") or []:
            if isinstance(sp, list) and len(sp) == 2:
                for p in range(max(0, sp[0]), min(n, sp[1])):
                    r[p] = 1.0
        z.append(r)
    fig = go.Figure()
    fig.add_heatmap(x=list(range(n)), y=[i for i, _s, _e in rows], z=z, showscale=False, zmin=0, zmax=1,
                    colorscale=[[0, "rgba(34,165,91,0.0)"], [1, "rgba(34,165,91,0.22)"]], name="zone",
                    hovertemplate="position %{x} · step %{y}: inside a leap zone<extra></extra>")
    _markers(fig, trace, rows, [("anchor", "anchors", ACCEPTED, "circle"), ("leap", "leap", "#7dd3a0", "diamond")])
    a = sum(len(ints(e.get("anchors"))) for _i, _s, e in rows)
    lp = sum(len(ints(e.get("leap"))) for _i, _s, e in rows)
    return base_layout(fig, f"{title} · position × step", subtitle=plot_text(f"{a} anchors · {lp} leaps"),
                       xaxis_title="position in the canvas", yaxis={"title": "step", "autorange": "reversed"})


# ---------------------------------------------------------------------- AdaBlock
@step_plot("denoise", "Adaptive block", needs="adablock", order=60)
def adablock_step_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Confidence of each masked position with the current block shaded; on a block's first
    step also the look-ahead window, the delimiter candidates (stars) and the boundary."""
    title = "Adaptive block"
    i, s, ev = _evidence(trace, step, "adablock", title)
    if s is None:
        return ev
    fig = _group_bars(trace, s, [("committed", unmasked_of(s), ACCEPTED)],
                      lambda p: num(at(s.get("confidence"), p)))
    _spans(fig, [s.get("block")], BAND)
    delims = [d for d in ev.get("delimiters") or [] if isinstance(d, list) and len(d) == 2]
    if delims:
        fig.add_scatter(x=[d[0] for d in delims], y=[num(d[1]) for d in delims], mode="markers",
                        name="delimiter predicted", marker={"symbol": "star", "size": 12, "color": CHOSEN},
                        hovertext=[_hover(trace, s, d[0], "delimiter candidate") for d in delims], hoverinfo="text")
    win = ev.get("window")
    if isinstance(win, list) and len(win) == 2:
        fig.add_vrect(x0=win[0] - 0.5, x1=win[1] - 0.5, line={"color": CHOSEN, "width": 1, "dash": "dot"},
                      fillcolor="rgba(0,0,0,0)")
    _hline(fig, ev.get("delimiter_threshold"), "delimiter threshold", CHOSEN)
    blk = s.get("block") if isinstance(s.get("block"), list) else [None, None]
    if ev.get("new_block"):
        chosen = ev.get("chosen")
        why = (f"ends after the delimiter at {chosen}" if isinstance(chosen, int)
               else f"no delimiter confident enough: default end {ev.get('default_end')}")
        sub = f"new block {blk[0]}–{blk[1]} · {why}"
    else:
        sub = f"block {blk[0]}–{blk[1]} (set at its first step)"
    return base_layout(fig, f"{title} · step {i}", subtitle=plot_text(sub), barmode="overlay",
                       xaxis_title="position in the canvas", yaxis={"title": "confidence", "range": [0, 1.05]})


@run_plot("Blocks over the run", evidence="adablock", order=140)
def adablock_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Position × step: the block each step worked in (the band moves, and its size varies),
    commits marked, and the delimiter that ended each adaptive block starred."""
    title = "Blocks over the run"
    rows = _rows(trace, "adablock")
    if not rows:
        return empty_figure("no AdaBlock steps yet", title)
    n = _width(trace)
    z = []
    for _i, s, _e in rows:
        r = [math.nan] * n
        b = s.get("block")
        if isinstance(b, list) and len(b) == 2:
            for p in range(max(0, b[0]), min(n, b[1])):
                r[p] = 1.0
        z.append(r)
    fig = go.Figure()
    fig.add_heatmap(x=list(range(n)), y=[i for i, _s, _e in rows], z=z, showscale=False, zmin=0, zmax=1,
                    colorscale=[[0, "rgba(99,102,241,0.0)"], [1, "rgba(99,102,241,0.25)"]], name="block",
                    hovertemplate="position %{x} · step %{y}: in the block<extra></extra>")
    xs, ys = [], []
    for i, s, _e in rows:
        for p in unmasked_of(s):
            xs.append(p)
            ys.append(i)
    fig.add_scatter(x=xs, y=ys, mode="markers", name="committed", marker={"color": ACCEPTED, "size": 7})
    dx = [(e["chosen"], i) for i, _s, e in rows if isinstance(e.get("chosen"), int)]
    if dx:
        fig.add_scatter(x=[d[0] for d in dx], y=[d[1] for d in dx], mode="markers", name="delimiter ends block",
                        marker={"symbol": "star", "size": 13, "color": CHOSEN})
    sizes = []
    for _i, s, e in rows:
        if e.get("new_block") and isinstance(s.get("block"), list):
            sizes.append(s["block"][1] - s["block"][0])
    return base_layout(fig, f"{title} · position × step", subtitle=plot_text("block sizes " + ", ".join(map(str, sizes))),
                       xaxis_title="position in the canvas", yaxis={"title": "step", "autorange": "reversed"})


# ---------------------------------------------------------------------- ASS
@run_plot("Step-size schedule", evidence="schedule", order=150)
def schedule_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Commits per step: the ascending schedule that was planned, what was committed, and
    the even schedule LLaDA would use with the same number of steps, for comparison."""
    title = "Step-size schedule"
    steps = [s for s in denoise_steps(trace) if isinstance(s.get("schedule"), dict)]
    if not steps:
        return empty_figure("no scheduled steps yet", title)
    xs = [s.get("i") for s in steps]
    planned = [at(ints(s["schedule"].get("planned")), s["schedule"].get("index", 0)) for s in steps]
    even = [at(ints(s["schedule"].get("even")), s["schedule"].get("index", 0)) for s in steps]
    done = [len(unmasked_of(s)) for s in steps]
    fig = go.Figure()
    fig.add_bar(x=xs, y=done, name="committed", marker_color=ACCEPTED)
    fig.add_scatter(x=xs, y=planned, name="ascending plan", mode="lines+markers", line={"color": CORRECTION, "width": 2})
    fig.add_scatter(x=xs, y=even, name="even plan (LLaDA)", mode="lines", line={"color": INK, "width": 1, "dash": "dash"})
    g = num(steps[0]["schedule"].get("growth"))
    return base_layout(fig, f"{title} · {len(steps)} steps", subtitle=plot_text(f"growth {fmt(g, 2)} per step"),
                       xaxis_title="step", yaxis={"title": "positions per step", "rangemode": "tozero"})


# ---------------------------------------------------------------------- APD
def _token(trace: dict[str, Any], t: Any) -> str:
    return plot_text(visible(token_text(trace, t)))


@step_plot("denoise", "Helper vs dLLM", needs="apd", order=70)
def apd_step_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """At each position of the pass's window: the dLLM's probability of its proposal (bars,
    green where accepted), the helper's probability of the same token and the mixture's, and
    a cross where the mixture's coupled draw differed from the proposal (the first one ends
    the accepted prefix)."""
    title = "Helper vs dLLM"
    i, s, ev = _evidence(trace, step, "apd", title)
    if s is None:
        return ev
    win = ev.get("window") if isinstance(ev.get("window"), list) and len(ev["window"]) == 2 else [0, 0]
    xs = list(range(int(win[0]), int(win[1])))
    k = ev.get("accepted") if isinstance(ev.get("accepted"), int) else 0
    prop = ints(ev.get("proposed"))
    def hov(j: int, who: str) -> str:
        return (f"position {xs[j]} · {who}<br><b>{_token(trace, at(prop, j))}</b>"
                f" · dLLM {fmt(at(ev.get('p_dllm'), j))} · helper {fmt(at(ev.get('p_helper'), j))}"
                f" · mixture {fmt(at(ev.get('p_mixture'), j))}")
    fig = go.Figure()
    for name, sel, colour in (("accepted", range(min(k, len(xs))), ACCEPTED),
                              ("not accepted", range(min(k, len(xs)), len(xs)), MASK)):
        js = list(sel)
        if js:
            fig.add_bar(x=[xs[j] for j in js], y=[num(at(ev.get("p_dllm"), j)) for j in js], name=f"dLLM p · {name}",
                        marker_color=colour, hovertext=[hov(j, name) for j in js], hoverinfo="text")
    fig.add_scatter(x=xs, y=[num(at(ev.get("p_helper"), j)) for j in range(len(xs))], name="helper p",
                    mode="markers+lines", line={"color": FINAL, "width": 1, "dash": "dot"}, marker={"size": 7})
    fig.add_scatter(x=xs, y=[num(at(ev.get("p_mixture"), j)) for j in range(len(xs))], name="mixture p",
                    mode="markers", marker={"color": CHOSEN, "symbol": "diamond", "size": 7})
    agree = ev.get("agree") if isinstance(ev.get("agree"), list) else []
    off = [j for j, a in enumerate(agree) if a is False and j < len(xs)]
    if off:
        fig.add_scatter(x=[xs[j] for j in off], y=[1.02] * len(off), mode="markers", name="mixture draws another token",
                        marker={"color": REJECTED, "symbol": "x", "size": 8},
                        hovertext=[hov(j, "mixture draws " + _token(trace, at(ints(ev.get("mixture")), j)))
                                   for j in off], hoverinfo="text")
    sub = f"{k} of {len(xs)} accepted · weight w = {fmt(ev.get('weight'))} on the dLLM"
    return base_layout(fig, f"{title} · step {i}", subtitle=plot_text(sub), barmode="overlay",
                       xaxis_title="position in the canvas",
                       yaxis={"title": "probability of the proposal", "range": [0, 1.06]})


@run_plot("Parallel length per step", evidence="apd", order=160)
def apd_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Tokens committed per pass (bars) against the window the dLLM proposed (line), and the
    share of each window's proposals (after the first) that the mixture's draw agreed with."""
    title = "Parallel length per step"
    rows = _rows(trace, "apd")
    if not rows:
        return empty_figure("no APD steps yet", title)
    xs = [i for i, _s, _e in rows]
    # "committed" (masked cells the pass filled) where recorded: "accepted" also counts the fixed
    # cells a pass moved past, which were never the dLLM's to commit
    acc = [next((e[k] for k in ("committed", "accepted") if isinstance(e.get(k), int)), 0) for _i, _s, e in rows]
    size = [len(ints(e.get("proposed"))) for _i, _s, e in rows]
    share = []
    for _i, _s, e in rows:
        a = [v for v in (e.get("agree") or [])[1:] if isinstance(v, bool)]
        share.append(sum(a) / len(a) if a else None)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_bar(x=xs, y=acc, name="accepted", marker_color=ACCEPTED, secondary_y=False)
    fig.add_scatter(x=xs, y=size, name="proposed (window)", mode="lines", line={"color": INK, "dash": "dash"},
                    secondary_y=False)
    fig.add_scatter(x=xs, y=share, name="helper agrees (share)", mode="markers+lines",
                    line={"color": FINAL, "width": 1, "dash": "dot"}, secondary_y=True)
    total = sum(acc)
    base_layout(fig, f"{title} · {len(rows)} passes",
                subtitle=plot_text(f"{total} tokens · {total / len(rows):.2f} per pass"), xaxis_title="step")
    fig.update_yaxes(title_text="tokens", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="agreement", range=[0, 1.05], secondary_y=True, showgrid=False)
    return fig


# ---------------------------------------------------------------------- DINGO
@step_plot("denoise", "DP lattice", needs="dingo", order=80)
def dingo_step_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Positions × automaton states: the best log-probability of a regex-valid prefix that
    ends in each state after each position (blank: unreachable), the best path through the
    lattice drawn, positions committed at this step marked on it."""
    title = "DP lattice"
    i, s, ev = _evidence(trace, step, "dingo", title)
    if s is None:
        return ev
    lat = ev.get("lattice") if isinstance(ev.get("lattice"), list) else []
    if not lat:
        return empty_figure(f"step {i} has no lattice", f"{title} · step {i}")
    n_s = max(len(r) for r in lat)
    z = [[math.nan if num(at(r, q)) is None else num(at(r, q)) for r in lat] for q in range(n_s)]
    done = ev.get("done_state")
    names = [("done (EOS)" if q == done else f"state {q}") + (" ✓" if q in ints(ev.get("accepting")) else "")
             for q in range(n_s)]
    fig = go.Figure()
    fig.add_heatmap(x=list(range(len(lat))), y=names, z=z, colorscale="Viridis", name="best log p",
                    hovertemplate="after %{x} tokens · %{y}<br>best log p %{z:.2f}<extra></extra>",
                    colorbar={"title": {"text": "log p", "side": "right"}, "thickness": 12, "len": 0.85})
    path = ints(ev.get("path"))
    best = ints(ev.get("best"))
    if path:
        hv = [f"after {k} tokens · {names[q] if q < n_s else q}" + (f"<br>next {_token(trace, at(best, k))}"
                                                                   if k < len(best) else "")
              for k, q in enumerate(path)]
        fig.add_scatter(x=list(range(len(path))), y=[names[q] if q < n_s else q for q in path], mode="lines+markers",
                        name="best path", line={"color": "white", "width": 2}, marker={"size": 6},
                        hovertext=hv, hoverinfo="text")
        now = [k + 1 for k in unmasked_of(s) if k + 1 < len(path)]
        if now:
            fig.add_scatter(x=now, y=[names[path[k]] for k in now], mode="markers", name="committed now",
                            marker={"color": ACCEPTED, "size": 11, "symbol": "square-open", "line": {"width": 2}})
    sub = (f"{n_s} states · best log p {fmt(ev.get('log_prob'), 2)} vs unconstrained "
           f"{fmt(ev.get('unconstrained_log_prob'), 2)} · {len(ints(ev.get('differs')))} positions differ")
    return base_layout(fig, f"{title} · step {i}", subtitle=plot_text(sub), xaxis_title="tokens read (position + 1)",
                       yaxis={"title": "automaton state", "type": "category"})


@run_plot("Constrained vs unconstrained", evidence="dingo", order=170)
def dingo_run_figure(trace: dict[str, Any]) -> go.Figure:
    """Per step: the log-probability of the best regex-valid canvas and of the per-position
    argmax (what the model would write unconstrained), and how many positions the two differ at."""
    title = "Constrained vs unconstrained"
    rows = _rows(trace, "dingo")
    if not rows:
        return empty_figure("no DINGO steps yet", title)
    xs = [i for i, _s, _e in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=xs, y=[num(e.get("log_prob")) for _i, _s, e in rows], name="best regex-valid canvas",
                    mode="lines+markers", line={"color": ACCEPTED}, secondary_y=False)
    fig.add_scatter(x=xs, y=[num(e.get("unconstrained_log_prob")) for _i, _s, e in rows], name="unconstrained argmax",
                    mode="lines+markers", line={"color": INK, "dash": "dash"}, secondary_y=False)
    fig.add_bar(x=xs, y=[len(ints(e.get("differs"))) for _i, _s, e in rows], name="positions that differ",
                marker_color="rgba(229,72,77,0.35)", secondary_y=True)
    regex = next((e.get("regex") for _i, _s, e in rows if isinstance(e.get("regex"), str)), "")
    base_layout(fig, f"{title} · {len(rows)} steps", subtitle=plot_text(f"regex {regex}"), xaxis_title="step")
    fig.update_yaxes(title_text="log p of the canvas", secondary_y=False)
    fig.update_yaxes(title_text="positions", rangemode="tozero", secondary_y=True, showgrid=False)
    return fig


__all__ = ["ete_step_figure", "ete_run_figure", "r2_step_figure", "r2_run_figure", "leap_step_figure",
           "leap_run_figure", "adablock_step_figure", "adablock_run_figure", "schedule_run_figure",
           "apd_step_figure", "apd_run_figure", "dingo_step_figure", "dingo_run_figure"]
