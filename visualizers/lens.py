"""The logit lens: what every layer's hidden state predicts, through the final norm and LM head.

A token step run with ``logit_lens=true`` records ``lens``: per layer (0 = the embeddings,
the last = the model's output) the top tokens and their probabilities, and the chosen
token's probability and rank. ``lens_figure`` draws one step as a layers × top-rank heatmap
(cells coloured by probability, labelled with the token, the chosen token outlined);
``lens_run_figure`` draws the run as a layers × step heatmap of the chosen token's
probability, so one sees at which depth each output token emerges; a run that watches tokens
records them in the lens too (``pinned``), and the figure's menu switches the heatmap to one of
them (a pinned token followed through every layer at every step).

Like every visualizer these accept partial traces and return a figure with a note instead of
raising; token text is escaped.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from visualizers._common import (
    CHOSEN, HEIGHT, at, base_layout, empty_figure, fmt, ints, num, pick_step, plot_text, steps_of, token_text, visible,
)
from visualizers.registry import run_plot, step_plot


def lens_height(rows: int) -> int:
    """Figure height for ``rows`` layers: the shared height, taller for deep models so each
    row keeps room for its token labels."""
    return max(HEIGHT, 160 + 18 * rows)


def layer_name(layer: int, last: int) -> str:
    """Axis label of a hidden-state index: the embeddings, a layer, or the output."""
    if layer == 0:
        return "emb"
    return f"{layer} (out)" if layer == last else str(layer)


def _rows(lens: dict[str, Any]) -> tuple[list[int], list[list[int]], list[list[float | None]]]:
    """(layers, top ids per layer, top probabilities per layer), malformed rows dropped."""
    layers = ints(lens.get("layers"))
    ids = lens.get("top_ids") if isinstance(lens.get("top_ids"), list) else []
    probs = lens.get("top_probs") if isinstance(lens.get("top_probs"), list) else []
    out_l, out_i, out_p = [], [], []
    for r, lay in enumerate(layers):
        row = ints(at(ids, r))
        if not row:
            continue
        ps = at(probs, r)
        out_l.append(lay)
        out_i.append(row)
        out_p.append([num(at(ps, j)) for j in range(len(row))])
    return out_l, out_i, out_p


def _short(s: str, n: int = 8) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@step_plot("token", "Logit lens", needs="lens", order=50)
def lens_figure(trace: dict[str, Any], step: int) -> go.Figure:
    """One step's logit lens: layers (rows, embeddings at the bottom) × top rank (columns),
    each cell the token that layer ranks there and its probability; the chosen token's cells
    outlined."""
    title = "Logit lens"
    i, s = pick_step(trace, step)
    if s is None:
        return empty_figure("no steps yet", title)
    lens = s.get("lens")
    if not isinstance(lens, dict):
        return empty_figure(f"step {i} has no logit lens (run with logit_lens=true)", title)
    layers, ids, probs = _rows(lens)
    if not layers:
        return empty_figure(f"step {i} has no lens rows", title)
    k = max(len(r) for r in ids)
    last = max(layers)
    ys = [layer_name(lay, last) for lay in layers]
    xs = [f"top {j + 1}" for j in range(k)]
    z = [[(p[j] if j < len(p) and p[j] is not None else math.nan) for j in range(k)] for p in probs]
    text, hover = [], []
    chosen = lens.get("chosen")
    cp = lens.get("chosen_probs")
    cr = lens.get("chosen_ranks")
    cx, cy = [], []
    pins = {int(t): v for t, v in (lens.get("pinned") or {}).items()
            if str(t).isdigit() and isinstance(v, dict)} if isinstance(lens.get("pinned"), dict) else {}
    all_layers = ints(lens.get("layers"))
    for r, (lay, row, p) in enumerate(zip(layers, ids, probs)):
        o = all_layers.index(lay)  # the row's index in the evidence (malformed rows were dropped)
        trow, hrow = [], []
        for j in range(k):
            t = at(row, j)
            if t is None:
                trow.append("")
                hrow.append("")
                continue
            txt = visible(token_text(trace, t))
            trow.append(plot_text(_short(txt)))
            hrow.append(f"layer {plot_text(ys[r])} · top {j + 1}<br><b>{plot_text(txt)}</b> (#{t}) · p = {fmt(at(p, j), 4)}"
                        f"<br>chosen token here: p = {fmt(at(cp, o), 4)} · rank {at(cr, o) if at(cr, o) is not None else '–'}"
                        + "".join(f"<br>pinned ‘{plot_text(visible(token_text(trace, pt)))}’: p = "
                                  f"{fmt(at(pv.get('probs'), o), 4)} · rank {at(pv.get('ranks'), o)}"
                                  for pt, pv in pins.items()))
            if t == chosen:
                cx.append(xs[j])
                cy.append(ys[r])
        text.append(trow)
        hover.append(hrow)
    fig = go.Figure()
    fig.add_heatmap(x=xs, y=ys, z=z, text=text, texttemplate="%{text}", textfont={"size": 10},
                    hovertext=hover, hoverinfo="text", colorscale="Viridis", zmin=0, zmax=1,
                    name="probability", colorbar={"title": {"text": "p", "side": "right"}, "thickness": 12, "len": 0.85})
    if cx:
        fig.add_scatter(x=cx, y=cy, mode="markers", name="chosen token", hoverinfo="skip",
                        marker={"symbol": "square-open", "size": 30, "color": CHOSEN, "line": {"width": 3}})
    notes = [f"chosen ‘{visible(token_text(trace, chosen))}’" if chosen is not None else ""]
    final_top = ids[-1][0]
    since = len(layers) - 1
    while since > 0 and ids[since - 1][0] == final_top:
        since -= 1
    notes.append(f"the output's top-1 leads from layer {ys[since]} on")
    base_layout(fig, f"{title} · step {i}", subtitle=plot_text(" · ".join(n for n in notes if n)), height=lens_height(len(ys)),
                xaxis={"title": "rank under the layer", "side": "bottom"},
                yaxis={"title": "layer (emb = embeddings)", "type": "category"})
    return fig


def pinned_ids(trace: dict[str, Any]) -> list[int]:
    """The tokens pinned in the lens (the run's watched tokens), in the order first recorded."""
    out: list[int] = []
    for s in steps_of(trace):
        pins = (s.get("lens") or {}).get("pinned") if isinstance(s.get("lens"), dict) else None
        for t in pins if isinstance(pins, dict) else {}:
            if str(t).isdigit() and int(t) not in out:
                out.append(int(t))
    return out


def _lens_columns(trace: dict[str, Any], token: int | None) -> tuple[list[Any], list[dict[int, tuple]], int]:
    """Per lens step: its index, and per layer (probability, rank, token id) of the chosen
    token (``token`` None) or of pinned token ``token``; and the deepest layer count."""
    xs, cols, depth = [], [], 0
    for s in steps_of(trace):
        lens = s.get("lens")
        if s.get("kind") != "token" or not isinstance(lens, dict):
            continue
        layers = ints(lens.get("layers"))
        if token is None:
            ps, rs, tid = lens.get("chosen_probs"), lens.get("chosen_ranks"), lens.get("chosen")
        else:
            pin = (lens.get("pinned") or {}).get(str(token)) if isinstance(lens.get("pinned"), dict) else None
            pin = pin if isinstance(pin, dict) else {}
            ps, rs, tid = pin.get("probs"), pin.get("ranks"), token
        xs.append(s.get("i", len(xs)))
        cols.append({lay: (num(at(ps, r)), at(rs, r), tid) for r, lay in enumerate(layers)})
        depth = max([depth] + [lay + 1 for lay in layers])
    return xs, cols, depth


@run_plot("Logit lens over the run", evidence="lens", order=30)
def lens_run_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """The run through the lens: layers × step, each cell the probability the layer gives the
    token that step chose — or, picked in the figure's menu, a pinned token's (the run's
    watched tokens: follow one token of your choice through the layers at every step)."""
    title = "Logit lens over the run"
    xs, cols, depth = _lens_columns(trace, None)
    if not xs:
        return empty_figure("no logit lens in this trace (run with logit_lens=true)", title)
    ys = list(range(depth))
    names = [layer_name(lay, depth - 1) for lay in ys]

    def grid(columns: list[dict[int, tuple]]) -> tuple[list[list[float]], list[list[str]]]:
        z = [[c[lay][0] if lay in c and c[lay][0] is not None else math.nan for c in columns] for lay in ys]
        hover = [[f"step {x} · layer {plot_text(names[lay])}<br><b>{plot_text(visible(token_text(trace, c[lay][2])))}</b>"
                  f" · p = {fmt(c[lay][0], 4)} · rank {c[lay][1] if c[lay][1] is not None else '–'}"
                  if lay in c else "" for x, c in zip(xs, columns)] for lay in ys]
        return z, hover

    z, hover = grid(cols)
    fig = go.Figure()
    fig.add_heatmap(x=xs, y=names, z=z, hovertext=hover, hoverinfo="text", colorscale="Viridis", zmin=0, zmax=1,
                    name="p", colorbar={"title": {"text": "p", "side": "right"}, "thickness": 12, "len": 0.85})
    pins = pinned_ids(trace)
    if pins:
        buttons = [{"label": "the chosen token", "method": "update",
                    "args": [{"z": [z], "hovertext": [hover]}, {"title.text": f"{title} · p(chosen token) per layer"}]}]
        for t in pins:
            pz, ph = grid(_lens_columns(trace, t)[1])
            word = plot_text(visible(token_text(trace, t)))
            buttons.append({"label": f"pinned ‘{word}’", "method": "update",
                            "args": [{"z": [pz], "hovertext": [ph]}, {"title.text": f"{title} · p(‘{word}’) per layer"}]})
        fig.update_layout(updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right",
                                        "y": 1.18, "yanchor": "top", "showactive": True}])
    base_layout(fig, f"{title} · p(chosen token) per layer", xaxis_title="step", height=lens_height(len(ys)),
                yaxis={"title": "layer (emb = embeddings)", "type": "category"})
    if step is not None and isinstance(step, int):
        fig.add_vline(x=step, line={"color": CHOSEN, "width": 1, "dash": "dot"})
    return fig


__all__ = ["lens_figure", "lens_run_figure", "layer_name", "pinned_ids"]
