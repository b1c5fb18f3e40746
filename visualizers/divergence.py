"""How far apart two lanes' next-token distributions are, position by position, while they
still share a prefix: KL both ways and Jensen-Shannon on the recorded top-K, the rest lumped.

A lane's trace records, per token step, the top-K of its distribution (``dist.top_ids`` with
``final_probs``, what the decoder drew from, or ``raw_probs``, the model's own). Two lanes at
the same output position with the same tokens before it are compared on a common partition:
one bucket per token id both recorded, and one bucket holding everything else (each lane's
remaining mass). Lumping can only shrink a divergence (data processing inequality), so the
figure is a lower bound of the full-vocabulary one, exact when the recorded lists hold all the
mass; identical lanes score exactly 0. KL is computed with each bucket floored at ``FLOOR``
(then renormalised), so a token one lane cut and the other kept gives a large finite KL, not
infinity; Jensen-Shannon needs no floor and lies in [0, ln 2].

Pure functions of trace dicts: a stored session replays this plot without a model.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from playground.core.trace import accepted_nodes
from visualizers._common import LANE_COLOURS, base_layout, empty_figure, ints, num, plot_text, steps_of
from visualizers.compare import lane_name
from visualizers.registry import compare_plot

FLOOR = 1e-6
WHICH = {"final": "final_probs", "raw": "raw_probs"}


def _temperature_zero(trace: dict[str, Any]) -> bool:
    """Whether the lane decoded at temperature 0 (its knob says so): each token is then the
    argmax, so the distribution it was drawn from is a point mass on it."""
    params = trace.get("params") if isinstance(trace.get("params"), dict) else {}
    t = num(params.get("temperature"))
    return t is not None and t == 0.0


def _recorded(dist: Any, key: str) -> tuple[list[int], list[float]] | None:
    if not isinstance(dist, dict):
        return None
    ids, probs = ints(dist.get("top_ids")), dist.get(key) or []
    if ids and isinstance(probs, list) and len(ids) == len(probs) and all(num(p) is not None for p in probs):
        return ids, [max(float(p), 0.0) for p in probs]
    return None


def position_dists(trace: dict[str, Any], which: str = "final") -> dict[int, tuple[list[int], list[float]]]:
    """``{output position: (ids, probabilities)}``: the distribution each position was drawn
    from (``final``) or the model's own (``raw``), as far as the trace records it. A partial
    record (one token's probability) is a coarser partition of the same distribution (that
    token, the rest), which :func:`lumped` compares as it is.

    - token steps: the recorded top-K (``dist``);
    - draft steps: an accepted drafted token has the target's probability ``p`` of it (raw;
      final too, since a lossless rule commits each position from the target's distribution,
      and at temperature 0 that is a point mass); the correction or bonus token has its
      recorded ``correction_dist``;
    - Jacobi iterations: final only, a point mass on each committed token (Jacobi decoding is
      greedy: a guess stands only where it is the argmax); no probabilities are recorded;
    - denoise steps: each position's committed token with its confidence when it was
      committed (raw; final too, a point mass at temperature 0), the last commit winning;
    - beam steps: none (see :func:`unrecorded`).
    """
    key = WHICH.get(which, "final_probs")
    final = key == "final_probs"
    zero = _temperature_zero(trace)
    out: dict[int, tuple[list[int], list[float]]] = {}
    pos = 0

    def point(tok: int, p: Any) -> tuple[list[int], list[float]] | None:
        if final and zero:
            return [tok], [1.0]
        q = num(p)
        return ([tok], [max(0.0, min(1.0, q))]) if q is not None else None

    for s in steps_of(trace):
        kind = s.get("kind")
        committed = ints(s.get("committed"))
        if kind == "denoise":
            canvas = s.get("canvas") if isinstance(s.get("canvas"), list) else []
            conf = s.get("confidence") if isinstance(s.get("confidence"), list) else []
            for p in ints(s.get("remasked")):
                out.pop(p, None)
            for p in ints(s.get("unmasked")):
                tok = canvas[p] if p < len(canvas) else None
                if isinstance(tok, int) and not isinstance(tok, bool):
                    d = point(tok, conf[p] if p < len(conf) else None)
                    if d is not None:
                        out[p] = d
            continue
        if kind == "token" and len(committed) == 1:
            d = _recorded(s.get("dist"), key)
            if d is not None:
                out[pos] = d
        elif kind == "draft" and isinstance(s.get("tree"), dict):
            nodes = accepted_nodes(s["tree"])
            for j, n in enumerate(nodes[:len(committed)]):
                tok = n.get("token")
                if isinstance(tok, int) and tok == committed[j]:
                    d = point(tok, n.get("p"))
                    if d is not None:
                        out[pos + j] = d
            if len(committed) > len(nodes):
                d = _recorded(s.get("correction_dist"), key)
                if d is not None:
                    out[pos + len(nodes)] = d
        elif kind == "jacobi" and final:
            for j, tok in enumerate(committed):
                out[pos + j] = ([tok], [1.0])
        pos += len(committed)
    return out


# Why a lane kind has no per-position distribution to compare (said in the plot).
UNRECORDED = {
    "beam": "a search picks whole hypotheses, it draws no position from a distribution",
    "jacobi": "Jacobi records guesses, not probabilities",
}


def unrecorded(trace: dict[str, Any], which: str = "final") -> str | None:
    """Why a lane gives no position a distribution (None when it gives some, or has no steps)."""
    steps = steps_of(trace)
    if not steps or position_dists(trace, which):
        return None
    kinds = {s.get("kind") for s in steps}
    for kind, why in UNRECORDED.items():
        if kind in kinds:
            return why
    return "no probabilities recorded"


def lumped(p: tuple[list[int], list[float]], q: tuple[list[int], list[float]]) -> tuple[list[float], list[float]]:
    """Both distributions on the common partition: the ids both recorded, then the rest."""
    pm, qm = dict(zip(*p)), dict(zip(*q))
    shared = sorted(set(pm) & set(qm))
    a = [pm[i] for i in shared]
    b = [qm[i] for i in shared]
    # probabilities are stored rounded: the lumped rest may come out a hair below 0
    a.append(max(0.0, 1.0 - sum(a)))
    b.append(max(0.0, 1.0 - sum(b)))
    return _normed(a), _normed(b)


def _normed(xs: list[float]) -> list[float]:
    total = sum(xs)
    return [x / total for x in xs] if total > 0 else [1.0 / len(xs)] * len(xs)


def kl(p: list[float], q: list[float], floor: float = FLOOR) -> float:
    """KL(p || q) in nats, each bucket floored at ``floor`` and renormalised."""
    pf = _normed([max(x, floor) for x in p])
    qf = _normed([max(x, floor) for x in q])
    return max(0.0, sum(a * math.log(a / b) for a, b in zip(pf, qf) if a > 0))


def js(p: list[float], q: list[float]) -> float:
    """Jensen-Shannon divergence in nats (0 for identical distributions, at most ln 2)."""
    m = [(a + b) / 2 for a, b in zip(p, q)]

    def part(x: list[float]) -> float:
        return sum(a * math.log(a / c) for a, c in zip(x, m) if a > 0)

    return max(0.0, 0.5 * part(p) + 0.5 * part(q))


def divergence(p: tuple[list[int], list[float]], q: tuple[list[int], list[float]]) -> dict[str, float]:
    """``kl_pq``, ``kl_qp`` and ``js`` of two recorded top-K distributions (rest lumped)."""
    a, b = lumped(p, q)
    return {"kl_pq": kl(a, b), "kl_qp": kl(b, a), "js": js(a, b)}


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two output id lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def lane_divergence(a: dict[str, Any], b: dict[str, Any], which: str = "final") -> list[dict[str, Any]]:
    """Per output position where lanes ``a`` and ``b`` share the prefix before it and both
    recorded a distribution: ``{"position", "kl_ab", "kl_ba", "js"}``, by position.

    Positions run up to and including the first one where the outputs differ (there they still
    shared the prefix; after it they do not). Lanes with different prompts share nothing.
    """
    if ints(a.get("prompt_ids")) != ints(b.get("prompt_ids")):
        return []
    oa, ob = ints(a.get("output_ids")), ints(b.get("output_ids"))
    last = shared_prefix(oa, ob)
    da, db = position_dists(a, which), position_dists(b, which)
    rows = []
    for pos in sorted(set(da) & set(db)):
        if pos > last:
            break
        d = divergence(da[pos], db[pos])
        rows.append({"position": pos, "kl_ab": round(d["kl_pq"], 6), "kl_ba": round(d["kl_qp"], 6),
                     "js": round(d["js"], 6)})
    return rows


@compare_plot("Divergence between lanes", order=10)
def divergence_figure(traces: list[dict[str, Any]], reference: int = 0, which: str = "final") -> go.Figure:
    """Each lane against the reference lane (the first by default): Jensen-Shannon per output
    position (solid), KL(reference ‖ lane) (dotted) and KL(lane ‖ reference) (dashed), while
    they share a prefix; the first position where their outputs differ and forced positions
    are marked."""
    title = "Divergence from lane {}".format(reference + 1)
    traces = [t if isinstance(t, dict) else {} for t in (traces or [])]
    if len(traces) < 2 or not 0 <= reference < len(traces):
        return empty_figure("one lane: nothing to compare", title)
    ref = traces[reference]
    fig = go.Figure()
    drawn = 0
    left_out: list[str] = []
    why_ref = unrecorded(ref, which)
    for lane, tr in enumerate(traces):
        if lane == reference:
            continue
        rows = lane_divergence(ref, tr, which)
        if not rows:
            why = why_ref if why_ref else unrecorded(tr, which)
            if why:
                left_out.append(f"{lane + 1} ({plot_text(str(tr.get('decoder') or 'lane'))}: {why})")
            continue
        drawn += 1
        colour = LANE_COLOURS[lane % len(LANE_COLOURS)]
        xs = [r["position"] for r in rows]
        name = plot_text(lane_name(tr, lane))
        if all(r["js"] == 0 and r["kl_ab"] == 0 and r["kl_ba"] == 0 for r in rows):
            name += " · identical (0)"
        fig.add_trace(go.Scatter(x=xs, y=[r["js"] for r in rows], mode="lines+markers", name=f"{name} JS",
                                 line={"color": colour}, legendgroup=str(lane),
                                 hovertemplate="position %{x}<br>JS %{y:.4f} nats<extra>" + name + "</extra>"))
        for key, dash, label in (("kl_ab", "dot", f"KL({reference + 1}‖{lane + 1})"),
                                 ("kl_ba", "dash", f"KL({lane + 1}‖{reference + 1})")):
            fig.add_trace(go.Scatter(x=xs, y=[r[key] for r in rows], mode="lines", name=label,
                                     line={"color": colour, "dash": dash, "width": 1}, legendgroup=str(lane),
                                     hovertemplate="position %{x}<br>" + label + " %{y:.4f} nats<extra></extra>"))
        split = shared_prefix(ints(ref.get("output_ids")), ints(tr.get("output_ids")))
        if split < min(len(ints(ref.get("output_ids"))), len(ints(tr.get("output_ids")))):
            fig.add_vline(x=split, line={"color": colour, "dash": "dot", "width": 1},
                          annotation={"text": f"{lane + 1} diverges", "font": {"size": 10}})
        forced = sorted({int(p) for t in (ref, tr) for p, _ in (t.get("force") or []) if int(p) <= split})
        if forced:
            fig.add_trace(go.Scatter(x=forced, y=[0.0] * len(forced), mode="markers", name="forced token",
                                     marker={"symbol": "x", "size": 10, "color": colour}, legendgroup=str(lane),
                                     hovertemplate="forced token at position %{x}<extra></extra>"))
    note = ""
    if why_ref:
        note = f"lane {reference + 1} ({plot_text(str(ref.get('decoder') or 'lane'))}) cannot be compared: {why_ref}"
    elif left_out:
        note = "not included: lane " + "; lane ".join(left_out)
    if not drawn:
        return empty_figure(note or "no lane shares a prefix with recorded distributions with the reference", title)
    sub = f"recorded top-K, the rest lumped · {which} probabilities · nats" + (f" · {note}" if note else "")
    return base_layout(fig, title, subtitle=sub,
                       xaxis={"title": "output position"}, yaxis={"title": "nats", "rangemode": "tozero"})
