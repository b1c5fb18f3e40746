"""Several decoder runs on one prompt, advanced in lockstep, streamed as snapshots.

The :class:`Runner` interleaves :class:`~playground.engine.Run` objects one decoder step at
a time. Which lane steps next is a *policy*:

- ``"forwards"`` (default, "equal target forwards"): the lane that has used the fewest
  target forward passes, ties by lane order;
- ``"cost"`` (equal cost, under the cost model of :mod:`playground.policies`) and ``"wall"``
  (equal time spent in the lane's own steps);
- ``"steps"``: the lane that has taken the fewest steps (equal steps);
- ``"free"``: plain round robin over the lanes still running.
The policies themselves live in :mod:`playground.policies`.

:meth:`Runner.stream` yields a list of lane snapshots (trace dicts as
:meth:`Run.snapshot` makes them) at most ``rate`` times per second, plus one final list
when every lane is done. :meth:`Runner.cancel` (the Stop button, from any thread) stops
every lane within one step and keeps what each produced. A lane that raises
:class:`PlaygroundError` ends with its one-line error while the others carry on.

:meth:`Runner.start` runs the same loop in a worker thread of its own, so decoding never
waits for whoever shows the lanes: the worker publishes a snapshot at the first step boundary
after a reader asks for one (:meth:`Runner.wait`), and at least ``rate`` times per second;
:meth:`Runner.latest` reads the newest. Lanes given as
``Lane(prepare=...)`` are prepared (models loaded) each in its own thread; a lane starts
stepping as soon as it is ready, so one lane's slow or failing draft never delays the
others, and :meth:`Runner.cancel` abandons preparations still pending. The worker also ends
when nobody has read a snapshot for ``abandon_after`` seconds (the page went away).

A started runner keeps ``marks``, the monotonic moments of its way to the first token
(``started``, ``lane_prepared``: the first lane prepared, ``prepared``: every lane prepared or failed, ``first_step``, ``published``: the
first publish after it), which the page's live feed reports (:mod:`playground.ui.live_feed`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import playground.policies as policies
from playground.core.errors import PlaygroundError
from playground.core.trace import SCHEMA

log = logging.getLogger(__name__)

POLICIES = policies.NAMES


def error_trace(message: str, decoder: str = "", model: str = "", prompt: str = "",
                params: dict[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """A valid, empty trace dict for a lane that failed before its first step."""
    return {
        "schema": SCHEMA, "model": model, "decoder": decoder, "params": dict(params or {}),
        "seed": int(seed), "prompt": prompt, "prompt_ids": [], "output_ids": [], "text": "",
        "stats": {"new_tokens": 0, "target_forwards": 0, "draft_forwards": 0,
                  "tokens_per_target_forward": 0.0, "wall_s": 0.0, "first_token_s": None,
                  "finish_reason": "error", "steps": 0, "error": message},
        "steps": [], "tokens": {}, "pieces": [], "done": True,
    }


def pending_trace(decoder: str = "", model: str = "", prompt: str = "", params: dict[str, Any] | None = None,
                  seed: int = 0, reason: str | None = None) -> dict[str, Any]:
    """A valid, empty trace dict for a lane still being prepared (``reason`` None), or one
    stopped before it was ready (``reason`` ``"cancelled"``)."""
    tr = error_trace("", decoder=decoder, model=model, prompt=prompt, params=params, seed=seed)
    tr["stats"].pop("error")
    tr["stats"]["finish_reason"] = reason
    tr["done"] = reason is not None
    tr["preparing"] = reason is None
    return tr


@dataclass
class Lane:
    """One lane: its run (None until prepared, or if it failed before starting), its error
    line if any, and optionally ``prepare``, a callable that builds the run (a worker started
    with :meth:`Runner.start` calls it in a thread of its own)."""

    run: Any = None
    error: str | None = None
    label: str = ""
    stub: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    busy_s: float = 0.0
    prepare: Callable[[], Any] | None = None
    _final: dict[str, Any] | None = None

    @property
    def preparing(self) -> bool:
        """Whether the lane is still waiting for its run to be built."""
        return self.run is None and self.error is None and self.prepare is not None

    @property
    def done(self) -> bool:
        """Whether this lane will take no more steps."""
        if self.preparing:
            return False
        return self.run is None or bool(self.run.done)

    def prepare_now(self) -> None:
        """Build the run in this thread; a failure becomes the lane's one-line error."""
        if not self.preparing:
            return
        run, err = build(self.prepare)  # type: ignore[arg-type]
        self.attach(run, err)

    def attach(self, run: Any, err: BaseException | None) -> None:
        """Take the result of a preparation: the run, or why it could not be built. A lane
        abandoned meanwhile (Stop) cancels the run it no longer wants."""
        if not self.preparing:
            if run is not None:
                run.cancel()
            return
        if err is not None:
            self.fail(err)
        else:
            self.run = run

    def fail(self, e: BaseException) -> None:
        """Record why the lane could not be prepared (one line)."""
        if not isinstance(e, PlaygroundError):
            log.error("lane %s could not be prepared", self.label, exc_info=e)
        msg = str(e) if isinstance(e, PlaygroundError) else \
            " ".join(f"could not start: {type(e).__name__}: {e}".split())[:300]
        self.error = msg
        base = self.stub or pending_trace(self.label)
        self.stub = {**base, "stats": error_trace(msg)["stats"], "done": True, "preparing": False}

    def abandon(self) -> None:
        """Give up a preparation still pending (Stop): the lane ends empty, cancelled."""
        if self.preparing:
            self.prepare = None
            self.stub = {**self.stub, "done": True, "preparing": False,
                         "stats": {**self.stub.get("stats", {}), "finish_reason": "cancelled"}}

    @property
    def target_forwards(self) -> int:
        """Target forward passes used so far."""
        return 0 if self.run is None else int(self.run.target_forwards)

    def snapshot(self) -> dict[str, Any]:
        """The lane's trace so far (cached once the lane is done: it no longer changes)."""
        if self._final is not None:
            return self._final
        if self.preparing:
            return dict(self.stub) if self.stub else pending_trace(self.label)
        if self.run is None:
            snap = dict(self.stub) if self.stub else error_trace(self.error or "not started")
        else:
            snap = self.run.snapshot()
            if self.error:
                snap.setdefault("stats", {})["error"] = self.error
        if self.done:
            self._final = snap
        return snap


def build(prepare: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """Call ``prepare``; return (run, None) or (None, the exception it raised)."""
    try:
        return prepare(), None
    except Exception as e:  # noqa: BLE001 - reported as the lane's error by the caller
        return None, e


class Runner:
    """Advance N runs in lockstep and stream their snapshots at a bounded rate.

    ``lanes`` holds prepared runs, or :class:`Lane` objects (a lane with ``run=None`` and an
    ``error`` stands for one that could not be prepared; one with ``prepare`` is built
    first). ``clock`` is injectable so tests of the rate limit are deterministic;
    ``abandon_after`` (seconds without a :meth:`latest`/:meth:`wait` call) ends a worker whose
    reader went away.
    """

    def __init__(self, lanes: list[Any], policy: str = "forwards", rate: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, abandon_after: float = 60.0,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        if policy not in POLICIES:
            raise PlaygroundError(f"unknown lockstep policy {policy!r}; use one of {', '.join(POLICIES)}")
        if not lanes:
            raise PlaygroundError("a comparison needs at least one lane")
        self.lanes = [x if isinstance(x, Lane) else Lane(run=x) for x in lanes]
        self.policy = policy
        self._policy = policies.Policy(policy)
        self.timer = timer  # times each lane's own steps (the "wall" policy); injectable for tests
        self.interval = 1.0 / rate if rate and rate > 0 else 0.0
        self.clock = clock
        self.abandon_after = abandon_after
        self._cancel = threading.Event()
        self._rr = -1
        self.cancelled = False
        self.abandoned = False
        # The worker: it publishes (version, snapshots); readers wait on the condition.
        self._cond = threading.Condition()
        self._version = 0
        self._published: list[dict[str, Any]] | None = None
        self._finished = threading.Event()
        self._want = threading.Event()  # a reader waits: publish at the next step boundary
        self._thread: threading.Thread | None = None
        self._read_at = time.monotonic()
        self.marks: dict[str, float] = {}  # name -> time.monotonic() when first reached

    def _mark(self, name: str) -> None:
        self.marks.setdefault(name, time.monotonic())

    # ------------------------------------------------------------------ control
    def cancel(self) -> None:
        """Stop every lane at its next step boundary (safe to call from another thread)."""
        self._cancel.set()
        for lane in self.lanes:
            # Setting the decoder's own flag lets a decoder that checks it inside a long
            # step give up early; the generator itself is closed by the stepping thread.
            if lane.run is not None:
                lane.run.ctx.cancel.set()
        with self._cond:
            self._cond.notify_all()  # a worker waiting for a preparation wakes at once

    @property
    def done(self) -> bool:
        """Whether every lane has finished (or failed, or been stopped)."""
        return all(lane.done for lane in self.lanes)

    @property
    def finished(self) -> bool:
        """Whether the worker has ended (every lane done, stopped, or the reader gone)."""
        return self._finished.is_set()

    def next_lane(self) -> int | None:
        """Index of the ready lane the policy steps next, or None when none can step."""
        live = [k for k, lane in enumerate(self.lanes) if not lane.done and lane.run is not None]
        if not live:
            return None
        return self._policy.pick(self.lanes, live)

    def step(self) -> int | None:
        """Advance the chosen lane by one step; return its index (None when none can step)."""
        if self._cancel.is_set():
            self._stop_all()
            return None
        k = self.next_lane()
        if k is None:
            return None
        lane = self.lanes[k]
        step, t0 = None, self.timer()
        try:
            step = lane.run.step()
        except PlaygroundError as e:
            lane.error = str(e)
        except Exception as e:  # noqa: BLE001 - a bug in one decoder must not end the others
            log.exception("lane %d (%s) crashed", k, getattr(lane.run.trace, "decoder", "?"))
            lane.error = f"internal error in {lane.run.trace.decoder}: {type(e).__name__}: {e}".split("\n")[0]
            lane.run.error = lane.error
            if not lane.run.done:
                lane.run._close("error")  # close the trace so what it made is kept
        lane.steps += 1
        self._mark("first_step")
        self._policy.charge(self.lanes, k, step, self.timer() - t0)
        return k

    def _stop_all(self) -> None:
        self.cancelled = True
        with self._cond:
            for lane in self.lanes:
                if lane.preparing:
                    lane.abandon()
                elif lane.run is not None and not lane.run.done:
                    lane.run.cancel()

    def prepare_all(self) -> None:
        """Build every lane still to be prepared, one after another, in this thread."""
        for lane in self.lanes:
            if self._cancel.is_set():
                break
            lane.prepare_now()

    # ------------------------------------------------------------------ output
    def snapshots(self) -> list[dict[str, Any]]:
        """Every lane's trace so far, in lane order."""
        return [lane.snapshot() for lane in self.lanes]

    def stream(self) -> Iterator[list[dict[str, Any]]]:
        """Run to the end in this thread, yielding snapshots: one at once, then at most
        ``rate`` per second, then a final one when every lane is done or the runner was
        cancelled."""
        self.prepare_all()
        last = self.clock()
        yield self.snapshots()
        while True:
            k = self.step()
            if k is None or self.done:
                break
            now = self.clock()
            if now - last >= self.interval:
                last = now
                yield self.snapshots()
        if self._cancel.is_set():
            self._stop_all()
        yield self.snapshots()

    def run_to_end(self) -> list[dict[str, Any]]:
        """Step until done without streaming; return the final snapshots."""
        self.prepare_all()
        while self.step() is not None:
            pass
        if self._cancel.is_set():
            self._stop_all()
        return self.snapshots()

    # ------------------------------------------------------------------ the worker
    def start(self, name: str = "playground-runner") -> "Runner":
        """Run the comparison in a worker thread of its own; read it with :meth:`latest`/:meth:`wait`."""
        if self._thread is not None:
            raise PlaygroundError("this comparison is already running")
        self._read_at = time.monotonic()
        self._mark("started")
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        return self

    @property
    def thread(self) -> threading.Thread | None:
        """The worker thread (None before :meth:`start`)."""
        return self._thread

    def latest(self) -> tuple[int, list[dict[str, Any]]]:
        """The newest published (version, snapshots); the version grows with every publish."""
        with self._cond:
            self._read_at = time.monotonic()
            if self._published is None:
                return 0, [lane.stub or pending_trace(lane.label) for lane in self.lanes]
            return self._version, self._published

    def wait(self, version: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a publish newer than ``version``; True if there is one."""
        with self._cond:
            self._read_at = time.monotonic()
            if self._version <= version:
                self._want.set()
            return self._cond.wait_for(lambda: self._version > version or self._finished.is_set(), timeout) \
                and self._version > version

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker to end; True if it has."""
        return self._finished.wait(timeout)

    def _publish(self) -> None:
        self._want.clear()
        snaps = self.snapshots()
        if "first_step" in self.marks:
            self._mark("published")
        with self._cond:
            self._published = snaps
            self._version += 1
            self._cond.notify_all()

    def _abandoned(self) -> bool:
        return self.abandon_after > 0 and time.monotonic() - self._read_at > self.abandon_after

    def _work(self) -> None:
        preparers = [threading.Thread(target=self._prepare_lane, args=(lane,), daemon=True,
                                      name=f"{threading.current_thread().name}-prepare-{k}")
                     for k, lane in enumerate(self.lanes) if lane.preparing]
        try:
            for t in preparers:
                t.start()
            self._publish()
            last = self.clock()
            while True:
                if self._abandoned():
                    log.warning("nobody reads this comparison any more: stopping it")
                    self.abandoned = True
                    self._cancel.set()
                k = self.step()
                if k is None:
                    if self._cancel.is_set() or not any(lane.preparing for lane in self.lanes):
                        break
                    with self._cond:  # wait for a lane to be prepared, or for Stop
                        self._cond.wait(0.05)
                    if not self._cancel.is_set() and (self._want.is_set() or self.clock() - last >= self.interval):
                        last = self.clock()
                        self._publish()  # show lanes whose preparation failed at once
                    continue
                now = self.clock()
                # On demand (a reader is waiting: it gets the lanes one step old at most) and at
                # least ``rate`` times per second; never for nobody in between.
                if self._want.is_set() or now - last >= self.interval:
                    last = now
                    self._publish()
        except BaseException:  # noqa: BLE001 - a bug in the worker must end the comparison, not hang it
            log.exception("the comparison worker crashed")
            self._cancel.set()
            self._stop_all()
            raise
        finally:
            if self._cancel.is_set():
                self._stop_all()
            try:
                self._publish()
            finally:
                self._finished.set()
                with self._cond:
                    self._cond.notify_all()

    def _prepare_lane(self, lane: Lane) -> None:
        fn = lane.prepare
        if fn is None:
            return
        run, err = build(fn)
        with self._cond:
            if self._cancel.is_set() and lane.preparing:
                lane.abandon()
            lane.attach(run, err)
            self._mark("lane_prepared")
            if not any(x.preparing for x in self.lanes):
                self._mark("prepared")
            self._cond.notify_all()
