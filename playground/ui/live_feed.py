"""The page's direct channel for lane text while a run streams.

Every message Gradio streams costs its frontend a fixed amount of work whatever its size (it
revisits every component's loading status and state), so lane text sent through the Run
event's frames could not reach the page more than three or four times a second with six
lanes on a two-core machine. While a run streams, the page's own script (``FLOW_JS`` in
:mod:`playground.ui.run_handlers`) asks this feed instead: a long poll to an unqueued private
handler that answers as soon as the runner has published something newer, with each changed
lane's new token HTML (an append when the lane only grew) and its stats line. The script
patches them into the lane's output and asks again once the browser has drawn them, so the
page reads as fast as it can draw and never queues frames it cannot draw.

This is the only path lane text takes while a run streams. The Run event's frames carry the
status line, legends and the comparison strip, and its last frame every lane whole: a page
without the script (or a hidden tab, whose script waits for the next animation frame before
it asks again) shows the lanes' text at the end, or as soon as it asks again.

The feeds of running comparisons are found by run token in the app's page registry
(:class:`playground.ui.page_session.PageSessions`), which the page's routes answer from.

Where a run's first token waits: the feed keeps the monotonic moments of the run's way to it
(:meth:`LiveFeed.mark`: the Run event entered, the first frame handed to Gradio and the
handler resumed after it, the runner attached, the first poll served), the runner's own
``marks`` (:class:`playground.runner.Runner`: started, the first lane and every lane
prepared, the first step, the first publish after it), the first poll that found a lane to
show (``ready``) and its answer (``answered``). That answer carries them, once, as ``"t":
{"event_ms": <wall clock of the Run event, ms>, "<mark>": <ms after it>, ...}``; the page's
script keeps them beside its own marks (``window.__pgLive``), and ``playground bench --suite
ui`` reads both and reports the first token's time part by part.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable

POLL_WAIT_S = 1.0  # a poll answers after this long at most, with nothing new if need be
# The first answer of a run waits this long at most for a lane with something to show, so the
# page's first patch carries tokens (a patch costs the browser a frame) rather than placeholders.
FIRST_WAIT_S = 0.6
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,64}")

def showable(trace: dict[str, Any]) -> bool:
    """Whether a lane shows more than a placeholder: tokens, a step (a beam's or a diffusion
    canvas's, before any token is final), an error, or its end."""
    return bool(trace.get("output_ids") or trace.get("steps") or trace.get("done")
                or (trace.get("stats") or {}).get("error"))


def lane_signature(trace: dict[str, Any]) -> tuple[Any, ...]:
    """What decides whether a streaming lane's output or stats may have changed."""
    stats = trace.get("stats") or {}
    return (len(trace.get("output_ids") or ()), len(trace.get("steps") or ()), bool(trace.get("done")),
            bool(trace.get("preparing")), stats.get("error"), stats.get("finish_reason"))


Render = Callable[[int, dict[str, Any]], tuple[str, str]]  # (lane index, trace) -> (output, stats)


class LiveFeed:
    """What one run's page has been sent of its lanes, and the long poll that sends the rest.

    ``render`` turns a lane's trace into its output HTML (without the closing tag, so a grown
    lane extends the previous string) and its stats HTML. One page reads one feed; polls are
    served one at a time.
    """

    def __init__(self, render: Render) -> None:
        self._render = render
        self._cond = threading.Condition()
        self._serve = threading.Lock()
        self.runner: Any = None
        self.closed = False
        self.seq = 0  # answers given; the page sends back the last one it applied
        self._sent: dict[int, tuple[str, str]] = {}  # lane -> (output, stats) the page shows
        self._sig: dict[int, tuple[Any, ...]] = {}  # lane -> lane_signature of what was sent
        self.attached_at = 0.0
        self.marks: dict[str, float] = {}  # the run's way to its first token (time.monotonic)
        self.event_wall = time.time()  # the wall clock at marks["event"], to align with the page's
        self._timed = False  # the marks have been sent

    def mark(self, name: str, at: float | None = None) -> None:
        """Record when the run reached ``name`` (now, or monotonic ``at``); the first time counts.
        ``"event"`` (the Run event entered) is the origin of the times the page is sent."""
        at = time.monotonic() if at is None else at
        if name == "event":
            self.event_wall = time.time() - (time.monotonic() - at)
        self.marks.setdefault(name, at)

    @property
    def shown(self) -> bool:
        """Whether the page has been sent a lane to show (the run's first text is on its way)."""
        return self._timed

    def wait_shown(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for :attr:`shown` (or the feed's end); whether it is."""
        with self._cond:
            self._cond.wait_for(lambda: self._timed or self.closed, timeout)
            return self._timed

    def timings(self) -> dict[str, float]:
        """The marks (the feed's and its runner's) in ms after the Run event, with the event's
        wall clock in ms (``event_ms``), as the first answer that shows a lane carries them."""
        marks = {**(getattr(self.runner, "marks", None) or {}), **self.marks}
        origin = marks.get("event", min(marks.values(), default=0.0))
        out = {k: round((v - origin) * 1000.0, 1) for k, v in sorted(marks.items(), key=lambda kv: kv[1])}
        return {"event_ms": round(self.event_wall * 1000.0, 1), **out}

    def attach(self, runner: Any) -> None:
        """The run's runner exists: polls can be answered."""
        with self._cond:
            self.runner = runner
            self.attached_at = time.monotonic()
            self.mark("attached", self.attached_at)
            self._cond.notify_all()

    def close(self) -> None:
        """The run has ended and its last frame is on its way: polls answer ``done``."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def poll(self, seq: int, timeout: float = POLL_WAIT_S) -> dict[str, Any]:
        """Answer a page that has applied answer ``seq``: the lanes that changed since, after
        waiting up to ``timeout`` s for the runner to publish something newer.

        Returns ``{"seq", "lanes": [{"lane", "op", "html", "stats"}], "done"}`` where ``op`` is
        ``"append"`` (add ``html`` at the end of the lane's tokens) or ``"replace"`` (the whole
        output). A page whose ``seq`` is not the last answer (a lost response, a reload) gets
        every lane whole.
        """
        # One poll at a time per feed, and a second one never waits for the first: a worker
        # thread parked on this lock would serve nobody (the page polls one at a time; a
        # second poll is a reload or a stranger).
        if not self._serve.acquire(blocking=False):
            return {"seq": self.seq, "lanes": [], "done": False, "busy": True}
        try:
            return self._poll(seq, timeout)
        finally:
            self._serve.release()

    def _poll(self, seq: int, timeout: float) -> dict[str, Any]:
        self.mark("polled")
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.runner is None and not self.closed:
                rest = deadline - time.monotonic()
                if rest <= 0:
                    return {"seq": self.seq, "lanes": [], "done": False}
                self._cond.wait(rest)
            runner, closed = self.runner, self.closed
        if runner is None:
            return {"seq": self.seq, "lanes": [], "done": True}
        if seq != self.seq:
            self._sent.clear()
            self._sig.clear()
        # Wait for a publish that changes what the page shows, or for the deadline. The
        # first answer writes every lane (the Run event's first frame leaves them alone), as
        # soon as one has tokens, or with placeholders after FIRST_WAIT_S (models loading);
        # after it, a lane is sent again only once it has something to show.
        while True:
            version, traces = runner.latest()
            first = not self._sig
            ready = not first or any(showable(t) for t in traces) or \
                time.monotonic() - self.attached_at >= FIRST_WAIT_S
            changed = [(j, t) for j, t in enumerate(traces)
                       if self._sig.get(j) != lane_signature(t) and (showable(t) or j not in self._sig)] \
                if ready else []
            rest = deadline - time.monotonic()
            if changed or closed or runner.finished or rest <= 0:
                break
            if not ready:  # wake when the placeholders are due, if no token comes first
                rest = min(rest, max(0.001, self.attached_at + FIRST_WAIT_S - time.monotonic()))
            runner.wait(version, rest)
        if any(showable(t) for _j, t in changed):
            self.mark("ready")  # a lane to show: what follows is rendering the answer
        lanes = []
        for j, trace in changed:
            self._sig[j] = lane_signature(trace)
            html, stats = self._render(j, trace)
            before = self._sent.get(j)
            if before == (html, stats):
                continue
            if before is not None and html.startswith(before[0]):
                lanes.append({"lane": j, "op": "append", "html": html[len(before[0]):], "stats": stats})
            else:
                lanes.append({"lane": j, "op": "replace", "html": html, "stats": stats})
            self._sent[j] = (html, stats)
        self.seq += 1
        done = closed or (runner.finished and version == runner.latest()[0])
        answer: dict[str, Any] = {"seq": self.seq, "lanes": lanes, "done": done}
        if not self._timed and any(showable(t) for _j, t in changed):
            self.mark("answered")
            answer["t"] = self.timings()
            with self._cond:
                self._timed = True
                self._cond.notify_all()
        return answer


def valid_token(token: Any) -> bool:
    """Whether ``token`` can name a run (the page makes it: 16 to 64 URL-safe characters)."""
    return isinstance(token, str) and TOKEN_RE.fullmatch(token) is not None
