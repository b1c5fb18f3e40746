"""The lockstep runner: which lane steps next, Stop, errors in one lane, the snapshot rate."""

from __future__ import annotations

import threading

import pytest

from playground.core.errors import PlaygroundError
from playground.runner import Lane, Runner, error_trace
from playground.core.trace import validate_trace_dict


class FakeCtx:
    def __init__(self) -> None:
        self.cancel = threading.Event()


class FakeRun:
    """Stands in for engine.Run: each step costs ``cost`` target forwards."""

    def __init__(self, name: str, cost: int, steps: int, log: list[str], fail_at: int | None = None) -> None:
        self.name, self.cost, self.left, self.log, self.fail_at = name, cost, steps, log, fail_at
        self.target_forwards = 0
        self.done = False
        self.n = 0
        self.ctx = FakeCtx()
        self.reason = None

    def step(self):
        if self.done:
            return None
        if self.left == 0:
            self.done, self.reason = True, "length"
            return None
        if self.fail_at is not None and self.n == self.fail_at:
            self.done, self.reason = True, "error"
            raise PlaygroundError(f"{self.name} broke")
        self.log.append(self.name)
        self.n += 1
        self.left -= 1
        self.target_forwards += self.cost
        return object()

    def cancel(self):
        self.ctx.cancel.set()
        if not self.done:
            self.done, self.reason = True, "cancelled"

    def snapshot(self):
        return {"decoder": self.name, "n": self.n, "done": self.done, "reason": self.reason,
                "stats": {}}


def test_forwards_policy_steps_the_lane_with_fewest_forwards():
    log: list[str] = []
    # "spec" pays 1 forward per step, "big" pays 3: at equal compute spec steps 3x as often.
    runs = [FakeRun("big", 3, 4, log), FakeRun("spec", 1, 12, log)]
    Runner(runs).run_to_end()
    assert log[:8] == ["big", "spec", "spec", "spec", "big", "spec", "spec", "spec"]
    assert runs[0].target_forwards == runs[1].target_forwards == 12


def test_ties_go_to_lane_order():
    log: list[str] = []
    Runner([FakeRun("a", 1, 2, log), FakeRun("b", 1, 2, log), FakeRun("c", 1, 2, log)]).run_to_end()
    assert log == ["a", "b", "c", "a", "b", "c"]


def test_steps_policy_gives_equal_steps():
    log: list[str] = []
    Runner([FakeRun("big", 3, 3, log), FakeRun("spec", 1, 3, log)], policy="steps").run_to_end()
    assert log == ["big", "spec", "big", "spec", "big", "spec"]


def test_free_policy_is_round_robin_and_skips_finished_lanes():
    log: list[str] = []
    Runner([FakeRun("a", 5, 1, log), FakeRun("b", 1, 3, log), FakeRun("c", 2, 2, log)],
           policy="free").run_to_end()
    assert log == ["a", "b", "c", "b", "c", "b"]


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(PlaygroundError, match="policy"):
        Runner([FakeRun("a", 1, 1, [])], policy="fastest")


def test_cancel_stops_every_lane_within_one_step_and_keeps_output():
    log: list[str] = []
    runs = [FakeRun("a", 1, 100, log), FakeRun("b", 1, 100, log)]
    r = Runner(runs, rate=0)
    seen = 0
    for snaps in r.stream():
        seen += 1
        if seen == 5:
            r.cancel()  # as the Stop button does, between two yields
    assert len(log) == 4  # no step after the cancel
    assert all(run.reason == "cancelled" for run in runs)
    assert all(run.ctx.cancel.is_set() for run in runs)
    assert r.cancelled and r.done
    assert [s["n"] for s in snaps] == [2, 2]  # the final snapshot keeps what was produced


def test_cancel_from_another_thread():
    log: list[str] = []
    runs = [FakeRun("a", 1, 10**6, log), FakeRun("b", 1, 10**6, log)]
    r = Runner(runs, rate=1000)
    t = threading.Timer(0.05, r.cancel)
    t.start()
    final = None
    for final in r.stream():
        pass
    t.join()
    assert r.cancelled and all(run.reason == "cancelled" for run in runs)
    assert final is not None and sum(s["n"] for s in final) == len(log)


def test_a_failing_lane_shows_its_error_and_the_others_continue():
    log: list[str] = []
    runs = [FakeRun("ok", 1, 5, log), FakeRun("bad", 1, 5, log, fail_at=2), FakeRun("ok2", 1, 5, log)]
    r = Runner(runs)
    snaps = r.run_to_end()
    assert r.lanes[1].error == "bad broke"
    assert log.count("ok") == 5 and log.count("ok2") == 5 and log.count("bad") == 2
    assert snaps[1]["stats"]["error"] == "bad broke"


def test_a_lane_that_could_not_start_is_shown_as_an_error_trace():
    log: list[str] = []
    stub = error_trace("unknown decoder 'nope'", decoder="nope", model="m", prompt="p")
    r = Runner([Lane(error="unknown decoder 'nope'", stub=stub), FakeRun("ok", 1, 3, log)])
    snaps = r.run_to_end()
    assert log == ["ok"] * 3
    assert snaps[0]["stats"]["error"] == "unknown decoder 'nope'" and snaps[0]["done"]
    validate_trace_dict(snaps[0])


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.01  # every step (and every read) takes 10 ms
        return self.t


def test_snapshots_are_rate_limited():
    log: list[str] = []
    r = Runner([FakeRun("a", 1, 100, log), FakeRun("b", 1, 100, log)], rate=10, clock=FakeClock())
    yields = list(r.stream())
    # 200 steps of 10 ms = 2 s at 10 per second, plus the first and the final snapshot
    assert 20 <= len(yields) <= 23
    assert [s["n"] for s in yields[-1]] == [100, 100]
    assert all(s["done"] for s in yields[-1])


def test_unlimited_rate_yields_after_every_step():
    log: list[str] = []
    r = Runner([FakeRun("a", 1, 3, log)], rate=0, clock=FakeClock())
    assert len(list(r.stream())) == 1 + 3 + 1


def test_real_runs_in_lockstep(llama_handle):
    from playground.engine import prepare

    runs = [prepare(llama_handle, "greedy", "ROMEO:", max_new_tokens=6, seed=0) for _ in range(2)]
    r = Runner(runs, rate=0)
    frames = list(r.stream())
    final = frames[-1]
    assert all(s["done"] for s in final)
    assert final[0]["output_ids"] == final[1]["output_ids"] and len(final[0]["output_ids"]) == 6
    # lockstep: in every frame the two greedy lanes are at most one token apart
    for fr in frames:
        a, b = (len(s["output_ids"]) for s in fr)
        assert abs(a - b) <= 1
    assert set(final[0]["tokens"]) >= {str(i) for i in final[0]["output_ids"]}


def test_real_cancel_keeps_partial_trace(llama_handle):
    from playground.engine import prepare

    runs = [prepare(llama_handle, "greedy", "ROMEO:", max_new_tokens=50, seed=0) for _ in range(2)]
    r = Runner(runs, rate=0)
    for k, frame in enumerate(r.stream()):
        if k == 6:
            r.cancel()
    assert all(s["stats"]["finish_reason"] == "cancelled" for s in frame)
    assert all(0 < len(s["output_ids"]) < 50 for s in frame)
    for s in frame:
        validate_trace_dict(s)


# ---------------------------------------------------------------------- the worker thread
def _worker_final(r: Runner) -> list[dict]:
    assert r.join(60), "the worker did not end"
    r.thread.join(30)
    assert not r.thread.is_alive()
    return r.latest()[1]


def test_the_worker_steps_in_the_same_lockstep_order_as_the_caller_would():
    log_a: list[str] = []
    Runner([FakeRun("big", 3, 4, log_a), FakeRun("spec", 1, 12, log_a)]).run_to_end()
    log_b: list[str] = []
    r = Runner([FakeRun("big", 3, 4, log_b), FakeRun("spec", 1, 12, log_b)]).start()
    final = _worker_final(r)
    assert log_b == log_a
    assert [s["n"] for s in final] == [4, 12] and all(s["done"] for s in final)
    assert r.finished and not r.cancelled


def test_a_lane_still_preparing_never_delays_the_others():
    """Lane 1's model load hangs; lane 2 decodes to its end meanwhile; then lane 1 starts."""
    log: list[str] = []
    release = threading.Event()
    slow = FakeRun("slow", 1, 3, log)

    def prepare_slow():
        release.wait(60)
        return slow

    r = Runner([Lane(label="slow", prepare=prepare_slow), Lane(label="fast", prepare=lambda: FakeRun("fast", 1, 5, log))],
               rate=0).start()
    version = 0
    while True:  # read as the page does until the fast lane is done
        assert r.wait(version, 30), "no new snapshot"
        version, snaps = r.latest()
        if snaps[1]["done"]:
            break
    assert log == ["fast"] * 5 and snaps[0].get("preparing") and not snaps[0]["done"]
    release.set()
    final = _worker_final(r)
    assert log == ["fast"] * 5 + ["slow"] * 3 and [s["n"] for s in final] == [3, 5]


def test_a_lane_whose_preparation_fails_shows_its_error_and_the_others_run():
    log: list[str] = []

    def bad():
        raise PlaygroundError("draft model 'nope' does not exist")

    r = Runner([Lane(label="bad", prepare=bad, stub=error_trace("", decoder="speculative")),
                Lane(label="ok", prepare=lambda: FakeRun("ok", 1, 4, log))]).start()
    final = _worker_final(r)
    assert final[0]["stats"]["error"] == "draft model 'nope' does not exist" and final[0]["done"]
    assert final[0]["decoder"] == "speculative"
    validate_trace_dict(final[0])
    assert log == ["ok"] * 4


def test_stop_while_a_lane_is_preparing_ends_the_worker_and_cancels_the_late_run():
    log: list[str] = []
    release = threading.Event()
    late = FakeRun("late", 1, 10, log)

    def hang():
        release.wait(60)
        return late

    r = Runner([Lane(label="late", prepare=hang), FakeRun("a", 1, 10**6, log)], rate=0).start()
    assert r.wait(0, 30)
    r.cancel()  # Stop, while lane 1 still loads
    final = _worker_final(r)
    assert r.cancelled
    assert final[0]["stats"]["finish_reason"] == "cancelled" and final[0]["done"]
    assert final[1]["reason"] == "cancelled"
    release.set()  # the load finishes after Stop: its run is cancelled, never stepped
    for _ in range(600):
        if late.done:
            break
        threading.Event().wait(0.05)
    assert late.reason == "cancelled" and "late" not in log


def test_the_worker_ends_when_nobody_reads_it():
    log: list[str] = []
    r = Runner([FakeRun("a", 1, 10**9, log)], rate=10, abandon_after=0.2).start()
    _worker_final(r)
    assert r.abandoned and r.cancelled
    assert 0 < len(log) < 10**9


def test_a_worker_starts_once():
    r = Runner([FakeRun("a", 1, 1, [])]).start()
    with pytest.raises(PlaygroundError, match="already running"):
        r.start()
    _worker_final(r)


def test_real_runs_in_the_worker_match_the_caller_thread(llama_handle):
    from playground.engine import prepare

    def lanes():
        return [Lane(label=d, prepare=lambda d=d: prepare(llama_handle, d, "ROMEO:", max_new_tokens=8, seed=3,
                                                          params=p))
                for d, p in (("greedy", {}), ("sample", {"temperature": 1.0}))]

    here = Runner(lanes()).run_to_end()
    there = _worker_final(Runner(lanes()).start())
    assert [s["output_ids"] for s in there] == [s["output_ids"] for s in here]
    for s in there:
        validate_trace_dict(s)
