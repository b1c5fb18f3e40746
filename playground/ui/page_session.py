"""One record per open page, and the one registry that holds them.

A :class:`PageSession` is what the server remembers about one browser page between its events:
the comparison it runs (the runner, so that Stop, a separate unqueued event, reaches it), the
run's token (which the page's script sends with its polls, acknowledgements and Stop), the
frame-flow state of that run, its live feed, the step the user picked while it streams, and
whether the finished run's plots are still being drawn.

:class:`PageSessions` is the registry: created once per app (``build_app``) and passed to
whoever needs it (the Compare page's handlers, the Sessions view, the page's HTTP routes).
Lifetime: a page's record is made on first use (its load, or any event that asks for it) and
ends when the page goes (``demo.unload``) or, for a page that never said goodbye, after
:data:`IDLE_S` without an event while nothing runs.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from playground.core.errors import PlaygroundError
from playground.ui.live_feed import LiveFeed, Render, valid_token

IDLE_S = 6 * 3600.0  # a page with no event for this long (and no run) is forgotten
ENDED_KEPT = 4096  # ended run tokens remembered, so a late poll of one hears "unknown" at once
BUSY_MESSAGE = "a comparison is already running in this page: press Stop first, or wait for it to finish"


class Busy(PlaygroundError):
    """A second comparison was asked for in a page whose first one is still running."""


class FrameFlow:
    """How far the page has drawn one run's frames (acknowledged by the page's script)."""

    def __init__(self) -> None:
        self.drawn = 0  # the newest frame the page has drawn (frames count from 1)
        self._cond = threading.Condition()

    def ack(self, frame: int) -> None:
        """The page drew ``frame``."""
        with self._cond:
            if frame > self.drawn:
                self.drawn = frame
                self._cond.notify_all()

    def wait_drawn(self, frame: int, timeout: float, cancelled: Callable[[], bool]) -> bool:
        """Wait until the page has drawn ``frame`` (True), for at most ``timeout`` seconds, and
        no longer once ``cancelled()`` says the run was stopped (Stop's frame goes out at once)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.drawn < frame:
                rest = deadline - time.monotonic()
                if rest <= 0 or cancelled():
                    return False
                self._cond.wait(min(rest, 0.05))
            return True


@dataclass
class PageSession:
    """What the server holds for one open page (one Gradio session hash)."""

    key: str
    runner: Any = None  # the page's comparison (playground.runner.Runner) until its worker has ended
    token: str | None = None  # the current run's token (None between runs)
    flow: FrameFlow | None = None  # the current run's frame acknowledgements, if the page sends them
    feed: LiveFeed | None = None  # the current run's live feed, if the page reads it
    selected: int | None = None  # the step the user picked while the run streams (None: follow the end)
    # None: no finished run's plots are being drawn; False: they are; True: and the user picked a
    # step meanwhile, so the draw leaves that step's plots alone.
    draw_pending: bool | None = None
    used_at: float = 0.0
    _lock: Any = field(default_factory=threading.RLock, repr=False)

    def running(self) -> Any:
        """The comparison running in this page, or None."""
        runner = self.runner
        return runner if runner is not None and not runner.finished else None

    def claim(self, runner: Any) -> None:
        """Make ``runner`` this page's comparison; :class:`Busy` when one is still running."""
        with self._lock:
            if self.running() is not None:
                raise Busy(BUSY_MESSAGE)
            self.runner = runner

    def release(self, runner: Any) -> None:
        """``runner`` has ended (its worker joined): the page runs nothing."""
        with self._lock:
            if self.runner is runner:
                self.runner = None

    def select_step(self, step: int) -> None:
        """Remember the step the user picked while the run streams (the Done frame keeps it), or
        while its plots are being drawn (the draw leaves it alone)."""
        with self._lock:
            if self.running() is not None:
                self.selected = int(step)
            elif self.draw_pending is not None:
                self.draw_pending = True

    def take_draw(self) -> bool:
        """The chained draw has started: whether the user picked a step meanwhile (the draw is
        no longer pending)."""
        with self._lock:
            picked, self.draw_pending = bool(self.draw_pending), None
            return picked


class PageSessions:
    """The registry of open pages, by session hash, and of their runs, by run token."""

    def __init__(self, idle_s: float = IDLE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s, self.clock = idle_s, clock
        self._lock = threading.RLock()
        self._pages: dict[str, PageSession] = {}
        self._tokens: dict[str, PageSession] = {}  # run token -> the page whose run it names
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()  # the newest ENDED_KEPT

    # ---------------------------------------------------------------- lifetime
    def page(self, key: str) -> PageSession:
        """The page ``key`` (made on first use); each call counts as the page being alive."""
        with self._lock:
            now = self.clock()
            page = self._pages.get(key)
            if page is None:
                self._expire(now)
                page = self._pages[key] = PageSession(key=key)
            page.used_at = now
            return page

    def get(self, key: str) -> PageSession | None:
        """The page ``key`` if the registry has it (nothing is made)."""
        with self._lock:
            return self._pages.get(key)

    def end(self, key: str) -> None:
        """The page ``key`` went away: stop its comparison and forget it."""
        with self._lock:
            page = self._pages.pop(key, None)
            if page is None:
                return
            for tok in [t for t, p in self._tokens.items() if p is page]:
                del self._tokens[tok]
        runner = page.running()
        if runner is not None:
            runner.cancel()
        if page.feed is not None:
            page.feed.close()

    def _expire(self, now: float) -> None:
        for key, page in list(self._pages.items()):
            if now - page.used_at > self.idle_s and page.running() is None and page.token is None:
                del self._pages[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pages)

    # ---------------------------------------------------------------- runs
    def running_runner(self, key: str) -> Any:
        """The comparison running in page ``key``, or None."""
        page = self.get(key)
        return page.running() if page is not None else None

    def open_feed(self, token: str, render: Render, key: str = "local") -> LiveFeed | None:
        """A new live feed for page ``key``'s run ``token``; None when the token is malformed or
        already names a run."""
        with self._lock:
            if not valid_token(token) or token in self._tokens:
                return None
            page = self.page(key)
            feed = LiveFeed(render)
            page.token, page.feed, page.flow = token, feed, None
            self._tokens[token] = page
            return feed

    def name_run(self, key: str, token: str) -> None:
        """Page ``key``'s run goes by ``token`` (a run without a live feed)."""
        with self._lock:
            page = self.page(key)
            page.token, page.feed, page.flow = token, None, None
            self._tokens[token] = page

    def start_flow(self, token: str) -> FrameFlow | None:
        """Frame acknowledgements for run ``token`` (None when no page runs under it)."""
        with self._lock:
            page = self._tokens.get(token)
            if page is None:
                return None
            page.flow = FrameFlow()
            return page.flow

    def end_run(self, token: str) -> None:
        """Run ``token`` has ended: its feed hears ``done``, its acknowledgements and polls are
        no longer served, its picked step is forgotten."""
        with self._lock:
            page = self._tokens.pop(token, None)
            if page is not None:
                self._ended[token] = None
                while len(self._ended) > ENDED_KEPT:
                    self._ended.popitem(last=False)
            feed = None
            if page is not None and page.token == token:
                feed, page.token, page.feed, page.flow = page.feed, None, None, None
        if feed is not None:
            feed.close()

    def close_feed(self, token: str) -> None:
        """End the feed under ``token`` (its page's next poll hears ``unknown``)."""
        self.end_run(token)

    def find_feed(self, value: Any) -> tuple[LiveFeed | None, int]:
        """The feed a poll ``"<run token>:<seq>"`` names and the seq, without waiting: (None, -1)
        for a malformed value or a run that is not (or no longer) registered."""
        token, _, seq = str(value or "")[:100].rpartition(":")
        if not valid_token(token):
            return None, -1
        with self._lock:
            page = self._tokens.get(token)
            feed = page.feed if page is not None and page.token == token else None
        return feed, (int(seq) if seq.isdigit() and len(seq) < 12 else -1)

    def may_start(self, value: Any) -> bool:
        """Whether a poll ``"<run token>:<seq>"`` names a run that is not registered but may be
        about to be (a well-formed token that has not named a run that ended)."""
        token = str(value or "")[:100].rpartition(":")[0]
        with self._lock:
            return valid_token(token) and token not in self._tokens and token not in self._ended

    def poll_feed(self, value: Any) -> dict[str, Any]:
        """The page's poll, ``"<run token>:<seq>"``: the feed's answer.

        ``{"unknown": true}`` at once when there is no such run (it ended, never started, or the
        poll overtook the Run event: the page asks again a moment later). Only a poll of a
        registered run waits (for something new to show), so no request that cannot be served
        ever holds a worker thread."""
        feed, seq = self.find_feed(value)
        if feed is None:
            return {"unknown": True}
        return feed.poll(seq)

    def runner_by_token(self, token: Any) -> Any:
        """The comparison run ``token`` names, or None."""
        with self._lock:
            page = self._tokens.get(str(token or "")) if token else None
            return page.runner if page is not None else None

    def stop_run(self, token: str | None) -> None:
        """Stop the running comparison whose run token is ``token`` (sent by the page's script
        when Stop is pressed); an unknown or ended run's token stops nothing."""
        runner = self.runner_by_token(token)
        if runner is not None:
            runner.cancel()

    def frame_drawn(self, value: str | None) -> None:
        """The page drew frame ``"<run token>:<n>"`` of a run; anything else, or a run that has
        ended, is ignored."""
        tok, _, n = str(value or "").rpartition(":")
        with self._lock:
            page = self._tokens.get(tok)
            flow = page.flow if page is not None and page.token == tok else None
        if flow is not None and n.isdigit():
            flow.ack(int(n))

    def select_step(self, key: str, step: int) -> None:
        """Page ``key``'s user picked ``step`` (see :meth:`PageSession.select_step`)."""
        page = self.get(key)
        if page is not None:
            page.select_step(step)


def session_key(request: Any) -> str:
    """The browser session a request comes from (``"local"`` when called without one)."""
    return str(getattr(request, "session_hash", None) or "local")
