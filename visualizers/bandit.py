"""BanditSpec's run view: which arm (draft length γ) the bandit pulled each round and the
reward it earned, every arm's pulls over the rounds, and the regret against the arm whose
mean reward is best in hindsight.

It reads the ``bandit`` evidence of ``bandit_spec``'s draft steps (``arms``, ``chosen``,
``gamma``, ``reward``, ``pulls``, ``means``, ``algorithm``, ``reward_kind``).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from visualizers._common import LANE_COLOURS, base_layout, empty_figure, ints, num, plot_text, steps_of
from visualizers.registry import run_plot

TITLE = "Bandit arms over time"


def bandit_rounds(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``bandit`` evidence of every round, in order."""
    return [s["bandit"] for s in steps_of(trace) if isinstance(s.get("bandit"), dict)]


def hindsight_regret(rounds: list[dict[str, Any]]) -> list[float]:
    """Cumulative regret after each round against the best mean reward in hindsight:
    sum over rounds of (best arm's mean over the whole run - the reward earned)."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for r in rounds:
        a, x = r.get("chosen"), num(r.get("reward"))
        if isinstance(a, int) and x is not None:
            sums[a] = sums.get(a, 0.0) + x
            counts[a] = counts.get(a, 0) + 1
    best = max((sums[a] / counts[a] for a in sums), default=0.0)
    out, acc = [], 0.0
    for r in rounds:
        acc += best - (num(r.get("reward")) or 0.0)
        out.append(acc)
    return out


@run_plot(TITLE, evidence="bandit", order=100)
def bandit_figure(trace: dict[str, Any]) -> go.Figure:
    """Top: the γ pulled each round, coloured by its reward; middle: pulls per arm over the
    rounds; bottom: the regret against the best arm in hindsight."""
    rounds = bandit_rounds(trace)
    if not rounds:
        return empty_figure("no bandit rounds yet", TITLE)
    arms = ints(rounds[-1].get("arms"))
    xs = list(range(1, len(rounds) + 1))
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.4, 0.35, 0.25])
    fig.add_scatter(
        x=xs, y=[r.get("gamma") for r in rounds], mode="markers", name="γ pulled", row=1, col=1,
        marker={"size": 11, "color": [num(r.get("reward")) for r in rounds], "colorscale": "Viridis",
                "cmin": 0, "cmax": 1, "colorbar": {"title": "reward", "len": 0.4, "y": 0.8, "thickness": 10}},
        customdata=[[num(r.get("reward")), num(r.get("raw_reward")), r.get("drafted")] for r in rounds],
        hovertemplate="round %{x}: γ = %{y}<br>reward %{customdata[0]:.3f} (raw %{customdata[1]:.3f})"
                      "<br>drafted %{customdata[2]}<extra></extra>")
    for j, g in enumerate(arms):
        pulls = [at_arm(r.get("pulls"), j) for r in rounds]
        fig.add_scatter(x=xs, y=pulls, mode="lines", name=f"γ = {g} pulls", row=2, col=1,
                        line={"color": LANE_COLOURS[j % len(LANE_COLOURS)], "width": 2})
    fig.add_scatter(x=xs, y=hindsight_regret(rounds), mode="lines", name="regret (best arm in hindsight)",
                    row=3, col=1, line={"color": "#7d8590", "dash": "dot"})
    last = rounds[-1]
    means = [num(m) for m in last.get("means") or []]
    best = max(range(len(means)), key=lambda i: means[i] if means[i] is not None else -1.0) if means else None
    sub = f"{plot_text(last.get('algorithm', '?'))} · {plot_text(last.get('reward_kind', '?'))} reward"
    if best is not None and best < len(arms):
        sub += f" · best mean so far: γ = {arms[best]} ({means[best]:.3f})"
    base_layout(fig, f"{TITLE} · {len(rounds)} rounds", subtitle=sub, height=560)
    fig.update_yaxes(title_text="γ", row=1, col=1, tickvals=arms)
    fig.update_yaxes(title_text="pulls", row=2, col=1)
    fig.update_yaxes(title_text="regret", row=3, col=1)
    fig.update_xaxes(title_text="round (verification)", row=3, col=1)
    return fig


def at_arm(pulls: Any, j: int) -> int | None:
    """Arm ``j``'s pull count in a round's ``pulls`` list (None when missing)."""
    p = ints(pulls)
    return p[j] if j < len(p) else None
