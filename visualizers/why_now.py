"""Diffusion lanes: why was this position committed at this step.

Every denoise step records, for each position still masked when it began, the score the plan
ranks positions by (``score``; the model's confidence for most plans) and the plan itself
(``plan``: its name and either a confidence ``threshold`` or a per-step quota ``k``). This
plot draws each position's score over the steps until the step that committed it (a star),
with the plan's threshold as a line where it has one and its quota in the hover where it
ranks: so "why now" reads off one picture — the score crossed the threshold, or was among the
``k`` best of the masked positions at that step.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from visualizers._common import ACCEPTED, INK, at, base_layout, empty_figure, fmt, int_dtick, ints, num
from visualizers.canvas import denoise_steps, unmasked_of
from visualizers.registry import run_plot

TITLE = "Why now"
MAX_LINES = 64  # positions drawn as lines (a longer canvas draws its first 64)


def plan_of(step: dict[str, Any]) -> dict[str, Any]:
    """The step's plan entry (empty when it has none)."""
    p = step.get("plan")
    return p if isinstance(p, dict) else {}


def score_of(step: dict[str, Any], pos: int) -> float | None:
    """Position ``pos``'s score at ``step``: the plan's ranking score, else its confidence."""
    v = num(at(step.get("score"), pos))
    return v if v is not None else num(at(step.get("confidence"), pos))


def position_paths(trace: dict[str, Any]) -> dict[int, dict[str, list[Any]]]:
    """Per position: the steps it was scored at while masked (``x``), its score there (``y``)
    and the steps that committed it (``commits``, with the score at each); a remasked position
    starts a new stretch after a gap (None)."""
    paths: dict[int, dict[str, list[Any]]] = {}
    for s in denoise_steps(trace):
        i = s.get("i")
        committed = set(unmasked_of(s))
        remasked = set(ints(s.get("remasked")))
        scores = s.get("score") if isinstance(s.get("score"), list) else s.get("confidence")
        n = len(scores) if isinstance(scores, list) else 0
        for pos in range(n):
            v = score_of(s, pos)
            if v is None:
                continue
            path = paths.setdefault(pos, {"x": [], "y": [], "commits": []})
            path["x"].append(i)
            path["y"].append(v)
            if pos in committed:
                path["commits"].append((i, v))
        for pos in remasked:
            if pos in paths:  # a gap: the next stretch is a new decision
                paths[pos]["x"].append(None)
                paths[pos]["y"].append(None)
    return paths


def commit_reason(plan: dict[str, Any], score: float) -> str:
    """Why the plan committed a position with ``score``, in the hover's words."""
    t = num(plan.get("threshold"))
    if t is not None:
        return f"above the threshold {t:g}" if score > t else f"none crossed {t:g}: the step's best"
    if isinstance(plan.get("k"), int):
        return f"among the step's {plan['k']} best"
    return f"plan {plan.get('plan', '?')}"


@run_plot(TITLE, kind="denoise", order=30)
def why_now_figure(trace: dict[str, Any], step: int | None = None) -> go.Figure:
    """Each position's score over the steps until it was committed (★), the plan's threshold
    per step where it has one, and its per-step quota in the hover."""
    steps = denoise_steps(trace)
    if not steps:
        return empty_figure("no denoise steps yet", TITLE)
    paths = position_paths(trace)
    if not paths:
        return empty_figure("these steps record no per-position scores", TITLE)
    plans = {s.get("i"): plan_of(s) for s in steps}
    fig = go.Figure()
    shown = sorted(paths)[:MAX_LINES]
    for pos in shown:
        p = paths[pos]
        hover = [None if x is None else f"position {pos} · step {x}<br>score {fmt(y)}"
                 + (f"<br>plan commits the {plans[x]['k']} best" if isinstance(plans.get(x, {}).get("k"), int) else "")
                 for x, y in zip(p["x"], p["y"])]
        fig.add_scatter(x=p["x"], y=p["y"], mode="lines", name=f"position {pos}", showlegend=False,
                        line={"width": 1, "color": "rgba(99,102,241,0.35)"}, hovertext=hover, hoverinfo="text",
                        connectgaps=False)
    cx = [x for pos in shown for x, _ in paths[pos]["commits"]]
    cy = [y for pos in shown for _, y in paths[pos]["commits"]]
    ct = [f"position {pos} committed at step {x}<br>score {fmt(y)}<br>{commit_reason(plans.get(x, {}), y)}"
          for pos in shown for x, y in paths[pos]["commits"]]
    fig.add_scatter(x=cx, y=cy, mode="markers", name="committed", marker={"symbol": "star", "size": 9,
                    "color": ACCEPTED}, hovertext=ct, hoverinfo="text")
    tx = [s.get("i") for s in steps if num(plan_of(s).get("threshold")) is not None]
    ty = [num(plan_of(s).get("threshold")) for s in steps if num(plan_of(s).get("threshold")) is not None]
    if tx:
        fig.add_scatter(x=tx, y=ty, mode="lines", name="threshold", line={"color": INK, "dash": "dash", "width": 2})
    names = sorted({str(plan_of(s).get("plan")) for s in steps if plan_of(s).get("plan")})
    more = f" (first {MAX_LINES} of {len(paths)} positions)" if len(paths) > MAX_LINES else ""
    base_layout(fig, f"{TITLE}: score until commit · plan {', '.join(names) or '?'}{more}", xaxis_title="step",
                yaxis={"title": "score", "rangemode": "tozero"})
    if len(steps) <= 40:
        fig.update_xaxes(dtick=int_dtick(len(steps) - 1, 10))
    if step is not None and isinstance(step, int):
        fig.add_vline(x=step, line={"color": INK, "width": 1, "dash": "dot"})
    return fig


__all__ = ["MAX_LINES", "TITLE", "commit_reason", "plan_of", "position_paths", "score_of", "why_now_figure"]
