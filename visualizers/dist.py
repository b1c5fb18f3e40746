"""Token steps: the top-K distribution of one step, and entropy/probability over the run.

``distribution_figure`` shows, for the K most probable tokens under the model, the raw
probability next to the final one (after the sampler chain), marks the chosen token and
states how much raw mass truncation removed. ``timeline_figure`` shows the run as a whole:
for token steps the entropy and the chosen token's probability per step; for other kinds
the nearest equivalent (mean confidence of commits for denoise steps, scores for beam
steps, the converged prefix for Jacobi steps).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    CHOSEN, ENTROPY, FINAL, RAW, at, base_layout, empty_figure, fmt, int_dtick, ints, label, num,
    pick_step, plot_text, steps_of, token_text, visible, wrong_kind,
)
from visualizers.registry import run_plot, step_plot


def chosen_probs(dist: dict[str, Any]) -> tuple[float | None, float | None]:
    """(raw, final) probability of the chosen token, from a ``dist`` evidence dict."""
    if not isinstance(dist, dict):
        return None, None
    ids = ints(dist.get("top_ids"))
    chosen = dist.get("chosen")
    if chosen not in ids:
        return None, None
    j = ids.index(chosen)
    return num(at(dist.get("raw_probs"), j)), num(at(dist.get("final_probs"), j))


# the paired distributions' first row is the model's own distribution: short of slots, it takes this one's
@step_plot("token", "Distribution", order=10, yields_to="Paired distributions")
@step_plot("draft", "Correction distribution", needs="correction_dist", order=30)
def distribution_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """Top-K bars of raw vs final probability at a token step, chosen token marked.

    Bars are placed by rank (x = 0..K-1) and labelled with the token text, so two tokens
    that display alike still get their own bar.
    """
    title = "Next-token distribution"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    if s.get("kind") == "draft" and isinstance(s.get("correction_dist"), dict):
        # A draft step's correction/bonus token was sampled from this distribution.
        dist = s["correction_dist"]
        kind = (s.get("tree") or {}).get("correction_kind") if isinstance(s.get("tree"), dict) else None
        title = "Bonus-token distribution" if kind == "bonus" else "Correction distribution (residual)"
    elif s.get("kind") != "token":
        return wrong_kind(i, s, "token", title)
    else:
        dist = s.get("dist")
    if not isinstance(dist, dict):
        return empty_figure(f"step {i} has no distribution evidence", title)
    ids = ints(dist.get("top_ids"))
    if not ids:
        return empty_figure(f"step {i} has no top-K tokens", title)
    raw = [num(at(dist.get("raw_probs"), j)) for j in range(len(ids))]
    final = [num(at(dist.get("final_probs"), j)) for j in range(len(ids))]
    # Prefer the trace-wide token map; fall back to the step's own texts.
    texts = []
    for j, t in enumerate(ids):
        own = at(dist.get("top_tokens"), j)
        s_txt = token_text(trace, t)
        texts.append(own if s_txt.startswith("#") and isinstance(own, str) else s_txt)
    ticks = [plot_text(_short(visible(t))) for t in texts]
    xs = list(range(len(ids)))
    hover = [
        f"<b>{plot_text(visible(t))}</b> (#{tid})<br>rank {j}<br>raw p = {fmt(r, 4)}<br>final p = {fmt(f, 4)}"
        for j, (tid, t, r, f) in enumerate(zip(ids, texts, raw, final))
    ]
    fig = go.Figure()
    fig.add_bar(x=xs, y=[r if r is not None else 0 for r in raw], name="raw (model)",
                marker_color=RAW, hovertext=hover, hoverinfo="text")
    fig.add_bar(x=xs, y=[f if f is not None else 0 for f in final],
                name="final (after the chain)" if s.get("kind") == "token" else "sampled from",
                marker_color=FINAL, hovertext=hover, hoverinfo="text")
    chosen = dist.get("chosen")
    if chosen in ids:
        c = ids.index(chosen)
        top = max(v for v in (raw[c], final[c], 0.0) if v is not None)
        fig.add_scatter(x=[c], y=[top], mode="markers+text", name="chosen",
                        marker={"symbol": "star", "size": 16, "color": CHOSEN,
                                "line": {"width": 1, "color": "#7a4a00"}},
                        text=["chosen"], textposition="top center", textfont={"color": CHOSEN},
                        hovertext=[hover[c]], hoverinfo="text", cliponaxis=False)
    kept = num(dist.get("kept_mass"))
    notes = []
    if kept is not None:
        notes.append(f"truncation removed {100 * max(0.0, 1 - kept):.1f}% of the raw mass")
    ent = num(dist.get("entropy"))
    if ent is not None:
        notes.append(f"entropy {ent:.2f} nats")
    rank = dist.get("chosen_rank")
    if isinstance(rank, int):
        notes.append(f"chosen rank {rank}")
    base_layout(fig, f"{title} · step {i}", subtitle=plot_text(" · ".join(notes)), barmode="group",
                yaxis_title="probability", yaxis_range=[0, _ymax(raw, final)])
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks, tickangle=-45 if len(xs) > 10 else 0)
    return fig


def _short(s: str, n: int = 10) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _ymax(*series: list[float | None]) -> float:
    top = max((v for ser in series for v in ser if v is not None), default=1.0)
    # above p = 1 when needed: the chosen marker and its label stay inside the plot area
    return min(1.18, top * 1.18) if top > 0 else 1.0


@run_plot("Entropy and probability", kind="token", order=10)
@run_plot("Beam scores", kind="beam", order=10)
@run_plot("Jacobi convergence", kind="jacobi", order=10)
def timeline_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """The run as a line: entropy and chosen-token probability per step (token steps).

    Denoise traces show the mean confidence and entropy of the positions each step
    committed (drawn on request: the page's denoise run plot is :mod:`visualizers.why_now`,
    every position's score until its commit); beam traces the best and worst beam score; Jacobi traces the converged
    prefix. ``step`` (optional) draws the scrubber's position.
    """
    steps = steps_of(trace)
    if not steps:
        return empty_figure("no steps yet", "Over the run")
    kinds = [s.get("kind") for s in steps]
    if "token" in kinds:
        fig = _token_timeline(trace, steps)
    elif "denoise" in kinds:
        fig = _denoise_timeline(steps)
    elif "beam" in kinds:
        fig = _beam_timeline(trace, steps)
    elif "jacobi" in kinds:
        fig = _jacobi_timeline(steps)
    else:
        fig = _committed_timeline(steps)
    if step is not None and isinstance(step, int):
        fig.add_vline(x=max(0, min(step, len(steps) - 1)), line={"color": CHOSEN, "width": 1, "dash": "dot"})
    if fig.layout.xaxis.dtick is None and len(steps) <= 40:
        fig.update_xaxes(dtick=int_dtick(len(steps) - 1, 10))
    return fig


def _token_timeline(trace: dict[str, Any], steps: list[dict[str, Any]]) -> go.Figure:
    xs, ent, raw_p, fin_p, hover = [], [], [], [], []
    for s in steps:
        if s.get("kind") != "token" or not isinstance(s.get("dist"), dict):
            continue
        d = s["dist"]
        r, f = chosen_probs(d)
        xs.append(s.get("i", len(xs)))
        ent.append(num(d.get("entropy")))
        raw_p.append(r)
        fin_p.append(f)
        hover.append(f"step {s.get('i')}: <b>{label(trace, d.get('chosen'), 24)}</b><br>"
                     f"entropy {fmt(d.get('entropy'), 2)} nats<br>p raw {fmt(r)} · final {fmt(f)}")
    if not xs:
        return empty_figure("no distribution evidence in this trace", "Entropy and probability")
    fig = go.Figure()
    fig.add_scatter(x=xs, y=ent, name="entropy (nats)", mode="lines+markers", line={"color": ENTROPY},
                    marker={"size": 4}, hovertext=hover, hoverinfo="text")
    fig.add_scatter(x=xs, y=raw_p, name="p(chosen), raw", mode="lines+markers", yaxis="y2",
                    line={"color": CHOSEN}, marker={"size": 4}, hovertext=hover, hoverinfo="text")
    if any(f is not None and r is not None and abs(f - r) > 1e-6 for f, r in zip(fin_p, raw_p)):
        fig.add_scatter(x=xs, y=fin_p, name="p(chosen), final", mode="lines", yaxis="y2",
                        line={"color": FINAL, "dash": "dot"}, hovertext=hover, hoverinfo="text")
    base_layout(fig, "Entropy and chosen-token probability", xaxis_title="step",
                yaxis={"title": "entropy (nats)", "rangemode": "tozero"},
                yaxis2={"title": "probability", "overlaying": "y", "side": "right", "range": [0, 1.02],
                        "showgrid": False, "tickformat": ".1f", "dtick": 0.2})
    return fig


def _denoise_timeline(steps: list[dict[str, Any]]) -> go.Figure:
    xs, conf, ent, n = [], [], [], []
    for s in steps:
        if s.get("kind") != "denoise":
            continue
        pos = ints(s.get("unmasked")) or ints(s.get("committed"))
        cs = [num(at(s.get("confidence"), p)) for p in pos]
        es = [num(at(s.get("entropy"), p)) for p in pos]
        cs = [c for c in cs if c is not None]
        es = [e for e in es if e is not None]
        xs.append(s.get("i", len(xs)))
        conf.append(sum(cs) / len(cs) if cs else None)
        ent.append(sum(es) / len(es) if es else None)
        n.append(len(pos))
    fig = go.Figure()
    fig.add_scatter(x=xs, y=conf, name="mean confidence of commits", mode="lines+markers",
                    line={"color": FINAL}, marker={"size": 4},
                    hovertext=[f"step {x}: {k} committed<br>mean confidence {fmt(c)}<br>mean entropy {fmt(e, 2)} nats"
                               for x, k, c, e in zip(xs, n, conf, ent)], hoverinfo="text")
    if any(e is not None for e in ent):
        fig.add_scatter(x=xs, y=ent, name="mean entropy of commits (nats)", mode="lines", yaxis="y2",
                        line={"color": ENTROPY, "dash": "dot"}, hoverinfo="skip")
    base_layout(fig, "Confidence of the committed positions", xaxis_title="step",
                yaxis={"title": "confidence", "range": [0, 1.02]},
                yaxis2={"title": "entropy (nats)", "overlaying": "y", "side": "right", "showgrid": False,
                        "rangemode": "tozero", "tickformat": ".2~f"})
    return fig


def _beam_timeline(trace: dict[str, Any], steps: list[dict[str, Any]]) -> go.Figure:
    from visualizers.beam import SCALE, beam_logprob

    xs, best, worst = [], [], []
    for s in steps:
        beams = s.get("beams") if isinstance(s.get("beams"), list) else []
        scores = [beam_logprob(trace, b) for b in beams if isinstance(b, dict)]
        scores = [x for x in scores if x is not None]
        if s.get("kind") != "beam" or not scores:
            continue
        xs.append(s.get("i", len(xs)))
        best.append(max(scores))
        worst.append(min(scores))
    if not xs:
        return empty_figure("no beam scores in this trace", "Beam log-probability")
    fig = go.Figure()
    fig.add_scatter(x=xs, y=worst, name="worst beam", mode="lines", line={"color": RAW})
    fig.add_scatter(x=xs, y=best, name="best beam", mode="lines+markers", line={"color": FINAL},
                    fill="tonexty", fillcolor="rgba(99,102,241,0.12)", marker={"size": 4})
    return base_layout(fig, "Beam log-probability per step", subtitle=f"every beam on one scale: its {SCALE}",
                       xaxis_title="step", yaxis_title=SCALE)


def _jacobi_timeline(steps: list[dict[str, Any]]) -> go.Figure:
    xs, conv, com = [], [], []
    for s in steps:
        if s.get("kind") != "jacobi":
            continue
        xs.append(s.get("i", len(xs)))
        c = s.get("converged")
        conv.append(c if isinstance(c, int) and not isinstance(c, bool) else None)
        com.append(len(ints(s.get("committed"))))
    fig = go.Figure()
    fig.add_bar(x=xs, y=com, name="tokens committed", marker_color="rgba(34,165,91,0.55)")
    fig.add_scatter(x=xs, y=conv, name="converged prefix", mode="lines+markers", line={"color": FINAL},
                    marker={"size": 4})
    return base_layout(fig, "Jacobi iterations", xaxis_title="step", yaxis_title="tokens")


def _committed_timeline(steps: list[dict[str, Any]]) -> go.Figure:
    xs = [s.get("i", j) for j, s in enumerate(steps)]
    ys = [len(ints(s.get("committed"))) for s in steps]
    fig = go.Figure()
    fig.add_bar(x=xs, y=ys, name="tokens committed", marker_color="rgba(99,102,241,0.6)")
    return base_layout(fig, "Tokens committed per step", xaxis_title="step", yaxis_title="tokens")
