"""Plain HTTP routes the Compare page's own script calls while a run streams.

Three small POSTs, each ``{"value": "..."}``: ``live`` (the long poll of a run's live feed),
``ack`` (the page drew a frame) and ``stop`` (Stop, by run token); and one GET, ``export/<token>``
(a session export the Sessions tab made a link for, streamed from the store). They are routes of the app
itself rather than Gradio events on purpose: every request to a Gradio event that comes
without a queue session rebuilds the whole page's component configuration first (measured:
a quarter of the app's CPU while a page polled ten times a second, slowing the decoders it
was showing). :func:`launch` in :mod:`playground.ui` adds them; an app mounted otherwise can
add them with ``FastAPI(routes=page_routes(sessions=...))``. Without them the page still works: lane text
then comes with the Run event's frames and Stop through its Gradio event.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Awaitable, Callable

from anyio import sleep, to_thread
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from playground.core.errors import PlaygroundError
from playground.html_export import session_html, sessions_html
from playground.sweep import SWEEP_LINK, sweep_sessions, sweep_title
from playground.store import default_store
from playground.ui.exports import ExportLinks, content_disposition, export_body
from playground.ui.page_session import PageSessions

PREFIX = "/playground_api"
MAX_BODY = 1024  # every value is a run token with a number or two
# Long polls (and export downloads) one client address may have open at once. A class behind
# one school address shares it, so it is sized for a room, not a browser: each page holds one
# poll, and a poll of a run that is not running never waits at all (live_feed.py).
MAX_PER_CLIENT = 64
# The page's first poll of a run leaves before the Run request does (the page names the run):
# it waits, in the event loop and holding no thread, this long at most for the Run event to
# register the run, so the first text is answered as soon as it is there instead of at the
# page's next retry (which a browser busy drawing the Run's first frame sent late).
EARLY_WAIT_S = 1.0
EARLY_TICK_S = 0.005


class TooLarge(Exception):
    """A request body over :data:`MAX_BODY`."""


async def _value(request: Any) -> str | None:
    """The request's ``{"value": "..."}``, or None when it is not that shape. A body over
    :data:`MAX_BODY` is refused by its Content-Length before anything is read, and while it
    streams in when it has none (or lies): never read whole first."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise TooLarge
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise TooLarge
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return None
    v = data.get("value") if isinstance(data, dict) else None
    return v if isinstance(v, str) else None


class ClientSlots:
    """How many requests each client has open on these routes (bounded per client)."""

    def __init__(self, limit: int = MAX_PER_CLIENT) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def client(request: Any) -> str:
        """Who is asking: the first forwarded address behind a proxy (a Space), else the peer."""
        forwarded = request.headers.get("x-forwarded-for", "")
        if forwarded:
            return forwarded.split(",")[0].strip()[:64]
        peer = getattr(request, "client", None)
        return str(getattr(peer, "host", "") or "?")

    def enter(self, who: str) -> bool:
        """Take a slot for ``who``; False when all of theirs are taken."""
        with self._lock:
            n = self._open.get(who, 0)
            if n >= self.limit:
                return False
            self._open[who] = n + 1
            return True

    def leave(self, who: str) -> None:
        """Give ``who``'s slot back."""
        with self._lock:
            n = self._open.get(who, 0) - 1
            if n > 0:
                self._open[who] = n
            else:
                self._open.pop(who, None)


def _guarded(handler: Callable[[Any], Awaitable[Any]], slots: ClientSlots | None) -> Callable[[Any], Awaitable[Any]]:
    """``handler`` behind the body limit (413 at once) and, with ``slots``, the per-client bound
    (429 at once). Stop and the acknowledgements take no slot: they never wait, and a Stop
    refused because the same address's pages were polling is a Stop lost (seen with five
    pages of one browser)."""
    async def route(request: Any) -> Any:
        if slots is None:
            try:
                return await handler(request)
            except TooLarge:
                return Response(status_code=413)
        who = slots.client(request)
        if not slots.enter(who):
            return Response(status_code=429, headers={"Retry-After": "1"})
        try:
            return await handler(request)
        except TooLarge:
            return Response(status_code=413)
        finally:
            slots.leave(who)

    return route


def feed_routes(sessions: PageSessions) -> tuple[Callable[[Any], Awaitable[Any]], ...]:
    """The ``live``, ``ack`` and ``stop`` handlers, answering from the page registry ``sessions``."""
    async def live(request: Any) -> Any:
        """The page's poll of its run's live feed (see :meth:`PageSessions.poll_feed`).

        A poll for a run that is not registered is answered in the event loop: at once for a run
        that has ended or a malformed token, after up to :data:`EARLY_WAIT_S` for a run that may
        be about to start; only a registered run's poll waits, in a worker thread, for something
        new to show."""
        value = await _value(request)
        feed, seq = sessions.find_feed(value)
        if feed is None and sessions.may_start(value):
            deadline = time.monotonic() + EARLY_WAIT_S
            while feed is None and time.monotonic() < deadline:
                await sleep(EARLY_TICK_S)
                feed, seq = sessions.find_feed(value)
        answer = await to_thread.run_sync(feed.poll, seq) if feed is not None else {"unknown": True}
        return JSONResponse(answer, headers={"Cache-Control": "no-store"})

    async def ack(request: Any) -> Any:
        """The page drew frame ``"<run token>:<n>"`` of a run."""
        sessions.frame_drawn(await _value(request))
        return Response(status_code=204)

    async def stop(request: Any) -> Any:
        """Stop the run whose token the page sends (an unknown token stops nothing)."""
        sessions.stop_run(await _value(request))
        return Response(status_code=204)

    return live, ack, stop


def _export_bytes(sid: str, as_html: bool) -> bytes:
    """Session ``sid`` as its JSON export, or as one self-contained HTML page; a ``sweep:<fingerprint>``
    link (the Sweep tab's) is every session of that sweep in one page."""
    store = default_store()
    if sid.startswith(SWEEP_LINK):
        sessions = sweep_sessions(store, sid[len(SWEEP_LINK):])
        if not sessions:
            raise PlaygroundError("this sweep is no longer stored")
        return sessions_html(sessions, sweep_title(sessions)).encode("utf-8")
    if as_html:
        return session_html(store.load_session(sid)).encode("utf-8")
    return export_body(store.export_session(sid))


def export_route(links: ExportLinks) -> Callable[[Any], Awaitable[Any]]:
    """``GET {PREFIX}/export/<token>``: the session a live export link names, streamed from the
    store as a JSON attachment (nothing is written to disk); 404 for any other token."""
    async def export(request: Any) -> Any:
        hit = links.resolve(request.path_params.get("token"))
        if hit is None:
            return Response("this export link has expired; press Export again", status_code=404,
                            media_type="text/plain")
        sid, filename = hit
        as_html = filename.endswith(".html")
        try:
            # off the event loop: an HTML page draws every plot of the session
            body = await to_thread.run_sync(lambda: _export_bytes(sid, as_html))
        except PlaygroundError as e:
            return Response(str(e), status_code=404, media_type="text/plain")
        return Response(body, media_type="text/html; charset=utf-8" if as_html else "application/json",
                        headers={"Content-Disposition": content_disposition(filename), "Cache-Control": "no-store"})

    return export


def page_routes(*, sessions: PageSessions, exports: ExportLinks | None = None) -> list[Any]:
    """The routes, for ``FastAPI(routes=...)`` (Gradio's ``launch(app_kwargs=...)``); one
    per-client bound for all of them. ``sessions`` is the app's page registry (whose runs the
    routes serve), ``exports`` the Sessions tab's download links (no export route without them)."""
    slots = ClientSlots()
    live, ack, stop = feed_routes(sessions)
    routes = [Route(f"{PREFIX}/live", _guarded(live, slots), methods=["POST"]),
              Route(f"{PREFIX}/ack", _guarded(ack, None), methods=["POST"]),
              Route(f"{PREFIX}/stop", _guarded(stop, None), methods=["POST"])]
    if exports is not None:
        routes.append(Route(f"{PREFIX}/export/{{token}}", _guarded(export_route(exports), slots), methods=["GET"]))
    return routes
