"""Lockstep policies: the order each policy steps lanes in, the cost model, and that a
draft-model lane that is slower per token stops winning once cost or wall time is charged."""

from __future__ import annotations

import threading

import pytest

from playground import policies
from playground.core.models.handle import ModelView
from playground.runner import Runner


class FakeHandle:
    """A model that does nothing: only its forward calls are counted (by the view)."""

    def __init__(self, name: str, num_layers: int = 4) -> None:
        self.name, self.num_layers, self.vocab_size, self.calls = name, num_layers, 50, 0

    def forward(self, ids, cache=None, **kw):
        self.calls += 1


class Clock:
    """A timer the stub runs advance by the seconds their steps are said to take."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Ctx:
    def __init__(self, target: ModelView, draft: ModelView | None) -> None:
        self.target, self.draft, self.cancel = target, draft, threading.Event()


class StubRun:
    """Stands in for engine.Run with given costs: each step runs ``target_tokens`` positions
    through the target in one forward, ``draft_tokens`` one-token draft forwards, takes
    ``seconds`` on ``clock`` and commits ``commits`` tokens, until ``max_tokens`` are out."""

    def __init__(self, name: str, log: list[str], clock: Clock, target: FakeHandle, draft: FakeHandle | None = None,
                 target_tokens: int = 1, draft_tokens: int = 0, seconds: float = 1.0, commits: int = 1,
                 max_tokens: int = 12) -> None:
        self.name, self.log, self.clock = name, log, clock
        self.ctx = Ctx(ModelView(target), ModelView(draft) if draft is not None else None)
        self.target_tokens, self.draft_tokens, self.seconds, self.commits = target_tokens, draft_tokens, seconds, commits
        self.max_tokens, self.tokens, self.done = max_tokens, 0, False

    @property
    def target_forwards(self) -> int:
        return self.ctx.target.forwards

    def step(self):
        self.log.append(self.name)
        for _ in range(self.draft_tokens):
            self.ctx.draft.forward([1])
        self.ctx.target.forward([1] * self.target_tokens)
        self.clock.t += self.seconds
        self.tokens = min(self.tokens + self.commits, self.max_tokens)
        self.done = self.tokens >= self.max_tokens
        return None

    def cancel(self):
        self.done = True

    def snapshot(self):
        return {"decoder": self.name, "tokens": self.tokens, "done": self.done, "stats": {}}


@pytest.fixture()
def models():
    """A target and a draft whose forward times are pinned: the draft costs half the target."""
    target, draft = FakeHandle("target"), FakeHandle("draft")
    policies.set_rate(target, 0.02)
    policies.set_rate(draft, 0.01)
    return target, draft


def race(models, policy: str, clock: Clock, log: list[str], max_tokens: int = 12) -> tuple[Runner, list[StubRun]]:
    target, draft = models
    # greedy: one position per step, 1 s; speculative: 4 draft forwards + a 5-position
    # verification that commits 3 tokens, but 4 s per step (slower per token: 1.33 s vs 1 s)
    greedy = StubRun("greedy", log, clock, target, seconds=1.0, max_tokens=max_tokens)
    spec = StubRun("spec", log, clock, target, draft, target_tokens=5, draft_tokens=4, seconds=4.0, commits=3,
                   max_tokens=max_tokens)
    return Runner([greedy, spec], policy=policy, rate=0, timer=clock), [greedy, spec]


def first_lane_done(runner: Runner, runs: list[StubRun]) -> str:
    while runner.step() is not None:
        finished = [r.name for r in runs if r.done]
        if finished:
            return finished[0]
    raise AssertionError("no lane finished")


@pytest.mark.parametrize("policy,order", [
    ("forwards", ["greedy", "spec"] * 5),
    # costs per step: greedy 1, spec 5 + 4 x 0.5 = 7 target-token units
    ("cost", ["greedy", "spec"] + ["greedy"] * 7 + ["spec"]),
    # own seconds per step: greedy 1, spec 4
    ("wall", ["greedy", "spec", "greedy", "greedy", "greedy", "greedy", "spec", "greedy", "greedy", "greedy"]),
    ("steps", ["greedy", "spec"] * 5),
    ("free", ["greedy", "spec"] * 5),
])
def test_each_policy_steps_lanes_in_its_order(models, policy, order):
    log: list[str] = []
    runner, _ = race(models, policy, Clock(), log, max_tokens=100)
    for _ in range(len(order)):
        runner.step()
    assert log == order


def test_a_slower_draft_lane_wins_only_at_equal_target_forwards(models):
    # speculative uses a third of greedy's target forwards per token, so it wins that race...
    log: list[str] = []
    assert first_lane_done(*race(models, "forwards", Clock(), log)) == "spec"
    # ...but per token it costs more compute and more time, so it loses the honest races
    for policy in ("cost", "wall"):
        assert first_lane_done(*race(models, policy, Clock(), [])) == "greedy", policy


def test_cost_model_charges_tokens_processed_at_each_models_rate():
    target, draft = FakeHandle("t", num_layers=4), FakeHandle("d")
    policies.set_rate(target, 0.04)
    policies.set_rate(draft, 0.01)
    run = StubRun("spec", [], Clock(), target, draft)
    run.ctx.target.forward(list(range(10)))            # a 10-token prefill: 10 units
    run.ctx.target.forward([1, 2, 3, 4, 5])            # a verification of 5 positions: 5 units
    run.ctx.draft.forward([1, 2, 3])                    # 3 draft positions at a quarter: 0.75
    run.ctx.target.forward([1, 2], num_layers=1)       # an early exit: 2 positions x 1/4 of the layers
    assert policies.run_cost(run, ref=0.04) == pytest.approx(10 + 5 + 0.75 + 0.5)
    # against a reference twice as fast, every unit costs twice as much
    assert policies.run_cost(run, ref=0.02) == pytest.approx(2 * (10 + 5 + 0.75 + 0.5))


def test_cost_and_wall_races_stamp_their_steps_and_the_strip_plots_the_stamp(llama_handle):
    from playground.engine import prepare
    from visualizers.compare import progress_figure

    policies.set_rate(llama_handle, 1.0)

    def race(policy: str) -> list[dict]:
        runs = [prepare(llama_handle, d, "ab", max_new_tokens=4, seed=0) for d in ("greedy", "sample")]
        return Runner(runs, policy=policy, rate=0).run_to_end()

    costs = race("cost")
    for tr in costs:
        xs = [s["race_cost"] for s in tr["steps"]]
        assert xs == sorted(xs) and xs[-1] == pytest.approx(tr["stats"]["target_tokens_processed"])
        assert not any("own_s" in s for s in tr["steps"])
    # the progress strip counts what the race equalised, and says so on its axis and title
    fig = progress_figure(costs)
    assert fig.layout.xaxis.title.text == policies.AXES["cost"]
    assert fig.layout.title.text.startswith("Progress at equal cost")
    assert list(fig.data[0].x) == [0.0] + [s["race_cost"] for s in costs[0]["steps"]]

    walls = race("wall")
    for tr in walls:
        own = [s["own_s"] for s in tr["steps"]]
        assert own == sorted(own) and own[-1] > 0 and not any("race_cost" in s for s in tr["steps"])
    fig = progress_figure(walls)
    assert fig.layout.xaxis.title.text == policies.AXES["wall"]
    assert list(fig.data[1].x) == [0.0] + [s["own_s"] for s in walls[1]["steps"]]

    plain = race("forwards")
    assert not any("own_s" in s or "race_cost" in s for tr in plain for s in tr["steps"])
    fig = progress_figure(plain)
    assert fig.layout.xaxis.title.text == policies.AXES["forwards"]
    assert fig.layout.title.text.startswith("Progress at equal target forwards")


def test_measured_rate_is_kept_per_model():
    h = FakeHandle("m")
    first = policies.rate_of(h)
    calls = h.calls
    assert first > 0 and calls == policies.RATE_WARMUP + policies.RATE_REPEATS
    assert policies.rate_of(h) == first and h.calls == calls  # measured once


def test_every_policy_has_a_label_an_axis_and_an_explanation():
    assert policies.label("forwards") == "equal target forwards"
    for name in policies.NAMES:
        assert policies.LABELS[name] and policies.AXES[name] and policies.EXPLAIN[name].endswith(".")
