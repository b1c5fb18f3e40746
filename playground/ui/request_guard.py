"""An ASGI guard in front of the whole app: only the public API is callable by name, and no
request body is read past a limit.

Gradio makes every event callable: the page itself runs its events through
``/gradio_api/queue/join`` by index, and ``/gradio_api/call/<name>`` reaches any event by its
name, private or not. The page never uses ``/call/``, so the guard answers 404 there for every
name but the five public endpoints (``api_endpoints.ENDPOINTS``); the events the page does run
check their own inputs as public input (the Sessions tab's ownership, the Study tab's copies,
the limits in ``playground.inputs``).

Bodies: a request whose Content-Length is over :func:`max_body` is refused with 413 before
anything reads it, and one without a length (chunked) is read here up to the limit and
refused as soon as it passes it (the app then gets the body that was read). Uploads (``/gradio_api/upload``) keep Gradio's own limit, the import size.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from playground.core.settings import limits

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CALL_PREFIXES = ("/gradio_api/call/v2/", "/gradio_api/call/")
UPLOAD_PATH = "/gradio_api/upload"


def max_body() -> int:
    """The largest request body the app reads: a longest prompt (4 bytes a character at most)
    in a full comparison's settings, with room to spare."""
    lim = limits()
    return 4 * lim.max_prompt_chars + 1_000_000


def called_name(path: str) -> str | None:
    """The event name a ``/gradio_api/call/...`` path calls, or None for any other path."""
    for prefix in CALL_PREFIXES:
        if path.startswith(prefix):
            return path[len(prefix):].split("/", 1)[0]
    return None


class RequestGuard:
    """The guard; ``public`` are the names callable by ``/call/``."""

    def __init__(self, app: ASGIApp, public: tuple[str, ...]) -> None:
        self.app = app
        self.public = frozenset(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        name = called_name(path)
        if name is not None and name not in self.public:
            await _plain(send, 404, b"no such endpoint")
            return
        if path.rstrip("/") == UPLOAD_PATH:
            await self.app(scope, receive, send)
            return
        cap = max_body()
        length = _content_length(scope)
        if length is not None:
            # the server frames the body by this length: it cannot send more than it declared
            if length > cap:
                await _plain(send, 413, b"request body too large")
                return
            await self.app(scope, receive, send)
            return
        # No length (a chunked body): read it here, up to the cap and no further, then hand
        # the app what was read.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                break  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > cap:
                await _plain(send, 413, b"request body too large")
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers") or []:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return None


async def _plain(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
