"""Several decoder runs on one prompt, advanced in lockstep, streamed as snapshots.

The :class:`Runner` interleaves :class:`~playground.engine.Run` objects one decoder step at
a time. Which lane steps next is a *policy*:

- ``"forwards"`` (default): the lane that has used the fewest target forward passes, ties
  by lane order — lanes race at equal compute, so a speculative lane that commits four
  tokens per forward visibly pulls ahead of greedy;
- ``"steps"``: the lane that has taken the fewest steps (equal steps);
- ``"free"``: plain round robin over the lanes still running.

:meth:`Runner.stream` yields a list of lane snapshots (trace dicts as
:meth:`Run.snapshot` makes them) at most ``rate`` times per second, plus one final list
when every lane is done. :meth:`Runner.cancel` (the Stop button, from any thread) stops
every lane within one step and keeps what each produced. A lane that raises
:class:`PlaygroundError` ends with its one-line error while the others carry on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from playground.errors import PlaygroundError
from playground.trace import SCHEMA

log = logging.getLogger(__name__)

POLICIES = ("forwards", "steps", "free")


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


@dataclass
class Lane:
    """One lane: its run (None if it failed before starting) and its error line, if any."""

    run: Any = None
    error: str | None = None
    label: str = ""
    stub: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    _final: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """Whether this lane will take no more steps."""
        return self.run is None or bool(self.run.done)

    @property
    def target_forwards(self) -> int:
        """Target forward passes used so far."""
        return 0 if self.run is None else int(self.run.target_forwards)

    def snapshot(self) -> dict[str, Any]:
        """The lane's trace so far (cached once the lane is done: it no longer changes)."""
        if self._final is not None:
            return self._final
        if self.run is None:
            snap = dict(self.stub) if self.stub else error_trace(self.error or "not started")
        else:
            snap = self.run.snapshot()
            if self.error:
                snap.setdefault("stats", {})["error"] = self.error
        if self.done:
            self._final = snap
        return snap


class Runner:
    """Advance N runs in lockstep and stream their snapshots at a bounded rate.

    ``lanes`` holds prepared runs, or :class:`Lane` objects (a lane with ``run=None`` and an
    ``error`` stands for one that could not be prepared). ``clock`` is injectable so tests
    of the rate limit are deterministic.
    """

    def __init__(self, lanes: list[Any], policy: str = "forwards", rate: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if policy not in POLICIES:
            raise PlaygroundError(f"unknown lockstep policy {policy!r}; use one of {', '.join(POLICIES)}")
        if not lanes:
            raise PlaygroundError("a comparison needs at least one lane")
        self.lanes = [x if isinstance(x, Lane) else Lane(run=x) for x in lanes]
        self.policy = policy
        self.interval = 1.0 / rate if rate and rate > 0 else 0.0
        self.clock = clock
        self._cancel = threading.Event()
        self._rr = -1
        self.cancelled = False

    # ------------------------------------------------------------------ control
    def cancel(self) -> None:
        """Stop every lane at its next step boundary (safe to call from another thread)."""
        self._cancel.set()
        for lane in self.lanes:
            # Setting the decoder's own flag lets a decoder that checks it inside a long
            # step give up early; the generator itself is closed by the stepping thread.
            if lane.run is not None:
                lane.run.ctx.cancel.set()

    @property
    def done(self) -> bool:
        """Whether every lane has finished (or failed, or been stopped)."""
        return all(lane.done for lane in self.lanes)

    def next_lane(self) -> int | None:
        """Index of the lane the policy steps next, or None when all are done."""
        live = [k for k, lane in enumerate(self.lanes) if not lane.done]
        if not live:
            return None
        if self.policy == "forwards":
            return min(live, key=lambda k: (self.lanes[k].target_forwards, k))
        if self.policy == "steps":
            return min(live, key=lambda k: (self.lanes[k].steps, k))
        after = [k for k in live if k > self._rr]
        self._rr = after[0] if after else live[0]
        return self._rr

    def step(self) -> int | None:
        """Advance the chosen lane by one step; return its index (None when all are done)."""
        if self._cancel.is_set():
            self._stop_all()
            return None
        k = self.next_lane()
        if k is None:
            return None
        lane = self.lanes[k]
        try:
            lane.run.step()
        except PlaygroundError as e:
            lane.error = str(e)
        except Exception as e:  # noqa: BLE001 - a bug in one decoder must not end the others
            log.exception("lane %d (%s) crashed", k, getattr(lane.run.trace, "decoder", "?"))
            lane.error = f"internal error in {lane.run.trace.decoder}: {type(e).__name__}: {e}".split("\n")[0]
            lane.run.error = lane.error
            if not lane.run.done:
                lane.run._close("error")  # close the trace so what it made is kept
        lane.steps += 1
        return k

    def _stop_all(self) -> None:
        self.cancelled = True
        for lane in self.lanes:
            if lane.run is not None and not lane.run.done:
                lane.run.cancel()

    # ------------------------------------------------------------------ output
    def snapshots(self) -> list[dict[str, Any]]:
        """Every lane's trace so far, in lane order."""
        return [lane.snapshot() for lane in self.lanes]

    def stream(self) -> Iterator[list[dict[str, Any]]]:
        """Run to the end, yielding snapshots: one at once, then at most ``rate`` per second,
        then a final one when every lane is done or the runner was cancelled."""
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
        yield self.snapshots()

    def run_to_end(self) -> list[dict[str, Any]]:
        """Step until done without streaming; return the final snapshots."""
        while self.step() is not None:
            pass
        return self.snapshots()
