"""BanditSpec's run view: which arm (a draft length γ, or a drafter with
``arm_kind=drafter``) the bandit pulled each round and the reward it earned, every arm's pulls
over the rounds, and the cumulative regret against the arm whose mean reward is best in
hindsight.

It reads the ``bandit`` evidence of ``bandit_spec``'s draft steps (``arms``, ``chosen``,
``gamma``, ``reward``, ``pulls``, ``means``, ``algorithm``, ``reward_kind``; with drafter
arms also ``arm_kind``, ``drafter`` and ``costs``).
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


def best_mean(rounds: list[dict[str, Any]]) -> float:
    """The best arm's mean reward over the whole run: the largest of the last round's recorded
    ``means`` (what the bandit itself had seen), or, for a trace without them, recomputed from
    the chosen arms and their rewards."""
    recorded = [m for m in (num(x) for x in (rounds[-1].get("means") or [])) if m is not None] if rounds else []
    if recorded:
        return max(recorded)
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for r in rounds:
        a, x = r.get("chosen"), num(r.get("reward"))
        if isinstance(a, int) and x is not None:
            sums[a] = sums.get(a, 0.0) + x
            counts[a] = counts.get(a, 0) + 1
    return max((sums[a] / counts[a] for a in sums), default=0.0)


def hindsight_regret(rounds: list[dict[str, Any]]) -> list[float]:
    """Cumulative regret after each round against the best fixed arm in hindsight:
    regret_t = t · max_i mean_i − (r_1 + … + r_t), with the means of :func:`best_mean`.
    It is measured against the means the bandit observed (a pseudo-regret): how much reward
    pulling the best arm every round would have earned on average, not what it would
    actually have drawn."""
    best = best_mean(rounds)
    out, acc = [], 0.0
    for t, r in enumerate(rounds, start=1):
        acc += num(r.get("reward")) or 0.0
        out.append(t * best - acc)
    return out


def arm_labels(rounds: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """The arms' names and whether they are drafters (else draft lengths γ)."""
    last = rounds[-1]
    raw = last.get("arms") if isinstance(last.get("arms"), list) else []
    if last.get("arm_kind") == "drafter":
        return [str(a) for a in raw], True
    return [str(g) for g in ints(raw)], False


@run_plot(TITLE, evidence="bandit", order=100)
def bandit_figure(trace: dict[str, Any]) -> go.Figure:
    """Top: the arm pulled each round (its γ, or the drafter by name), coloured by its reward;
    middle: pulls per arm over the rounds; bottom: the cumulative regret against the best arm
    in hindsight (:func:`hindsight_regret`)."""
    rounds = bandit_rounds(trace)
    if not rounds:
        return empty_figure("no bandit rounds yet", TITLE)
    arms, by_drafter = arm_labels(rounds)
    xs = list(range(1, len(rounds) + 1))
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.4, 0.35, 0.25])
    # drafters have no numeric value: plot the arm's index and name the ticks
    ys = [r.get("chosen") for r in rounds] if by_drafter else [r.get("gamma") for r in rounds]
    fig.add_scatter(
        x=xs, y=ys, mode="markers", name="drafter pulled" if by_drafter else "γ pulled", row=1, col=1,
        marker={"size": 11, "color": [num(r.get("reward")) for r in rounds], "colorscale": "Viridis",
                "cmin": 0, "cmax": 1, "colorbar": {"title": "reward", "len": 0.4, "y": 0.8, "thickness": 10}},
        customdata=[[num(r.get("reward")), num(r.get("raw_reward")), r.get("drafted"),
                     plot_text(r.get("drafter", "")), r.get("gamma")] for r in rounds],
        hovertemplate=("round %{x}: %{customdata[3]} (γ = %{customdata[4]})" if by_drafter
                       else "round %{x}: γ = %{y}") + "<br>reward %{customdata[0]:.3f} (raw %{customdata[1]:.3f})"
                      "<br>drafted %{customdata[2]}<extra></extra>")
    for j, g in enumerate(arms):
        pulls = [at_arm(r.get("pulls"), j) for r in rounds]
        fig.add_scatter(x=xs, y=pulls, mode="lines", name=f"{plot_text(g) if by_drafter else 'γ = ' + g} pulls",
                        row=2, col=1,
                        line={"color": LANE_COLOURS[j % len(LANE_COLOURS)], "width": 2})
    regret = hindsight_regret(rounds)
    fig.add_scatter(x=xs, y=regret, mode="lines", name="cumulative regret (best arm in hindsight)",
                    row=3, col=1, line={"color": "#7d8590", "dash": "dot"})
    last = rounds[-1]
    means = [num(m) for m in last.get("means") or []]
    best = max(range(len(means)), key=lambda i: means[i] if means[i] is not None else -1.0) if means else None
    sub = f"{plot_text(last.get('algorithm', '?'))} · {plot_text(last.get('reward_kind', '?'))} reward"
    if best is not None and best < len(arms) and means[best] is not None:
        name = plot_text(arms[best]) if by_drafter else f"γ = {arms[best]}"
        sub += f" · best mean so far: {name} ({means[best]:.3f})"
    sub += f" · regret after {len(rounds)} rounds {regret[-1]:.3f}"
    base_layout(fig, f"{TITLE} · {len(rounds)} rounds", subtitle=sub, height=560)
    if by_drafter:
        fig.update_yaxes(title_text="drafter", row=1, col=1, tickvals=list(range(len(arms))),
                         ticktext=[plot_text(a) for a in arms])
    else:
        fig.update_yaxes(title_text="γ", row=1, col=1, tickvals=[int(a) for a in arms])
    fig.update_yaxes(title_text="pulls", row=2, col=1)
    fig.update_yaxes(title_text="regret", row=3, col=1)
    fig.update_xaxes(title_text="round (verification)", row=3, col=1)
    return fig


def at_arm(pulls: Any, j: int) -> int | None:
    """Arm ``j``'s pull count in a round's ``pulls`` list (None when missing)."""
    p = ints(pulls)
    return p[j] if j < len(p) else None
