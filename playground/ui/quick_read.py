"""A share link that reads at once: the session's text in the first HTML the server sends.

A Gradio page shows nothing until its frontend has loaded, fetched the page's configuration,
built every component and run the page-load event (about three seconds on a 2-core machine
before a replay can even start). A share link is how a class receives a comparison, so for
``/?session=<id>`` the HTML of the page itself carries a plain reading of the session — title,
prompt, the comparison strip and every lane's decoder, knobs, coloured text and stats line —
laid over the app while it loads. The page's own replay takes its place as soon as the app
says "Replaying" (or could not open the session); a reader may also close it sooner.

:class:`QuickRead` is an ASGI middleware in front of the app: it buffers only the HTML answer
to a ``GET /`` that names a session, and inserts the block after ``<body>``. Everything else
passes untouched. A blind comparison gets no block (the page has no owner key here, and its
decoders must stay hidden until a vote), nor does an unknown or malformed id: the app's own
message says why. Token text is escaped by ``visualizers.tokens`` and every other string here.
"""

from __future__ import annotations

import html
import re
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs

from anyio import to_thread

import visualizers
from playground import blind
from playground.core.errors import PlaygroundError
from playground.store import Store, default_store

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BLOCK_ID = "pg-quick-read"
MAX_SID = 64  # characters of a session id worth looking up (ids are short hex strings)
MAX_HTML = 8 * 1024 * 1024  # a page answer larger than this passes through unchanged
_SID = re.compile(r"[A-Za-z0-9_-]{1,64}")

_CSS = f"""
#{BLOCK_ID} {{ position: fixed; inset: 0; z-index: 2147483000; overflow: auto; background: Canvas; color: CanvasText;
  font-family: system-ui, -apple-system, "Segoe UI", sans-serif; line-height: 1.45; padding: 18px 16px 40px; }}
#{BLOCK_ID} .qr-wrap {{ max-width: 1200px; margin: 0 auto; }}
#{BLOCK_ID} h1 {{ font-size: 1.35em; margin: 0 0 4px; }}
#{BLOCK_ID} .qr-meta, #{BLOCK_ID} .qr-knobs, #{BLOCK_ID} .qr-stats {{ opacity: 0.75; font-size: 0.9em; }}
#{BLOCK_ID} .qr-bar {{ display: flex; gap: 12px; align-items: center; justify-content: space-between; }}
#{BLOCK_ID} .qr-bar button {{ font: inherit; padding: 4px 12px; border-radius: 6px; border: 1px solid #9ca3af;
  background: transparent; color: inherit; cursor: pointer; }}
#{BLOCK_ID} .qr-prompt {{ white-space: pre-wrap; background: rgba(128,128,128,0.08); padding: 8px 10px;
  border-radius: 6px; margin: 8px 0; }}
#{BLOCK_ID} .qr-lanes {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(320px, 1fr)); gap: 12px; }}
#{BLOCK_ID} .qr-lane {{ background: rgba(128,128,128,0.08); border-radius: 8px; padding: 10px 12px; min-width: 0; }}
#{BLOCK_ID} .qr-lane h2 {{ font-size: 1.05em; margin: 0 0 2px; }}
#{BLOCK_ID} .tok-output {{ font-family: ui-monospace, SFMono-Regular, Menlo, monospace; margin: 8px 0 4px;
  overflow-wrap: anywhere; }}
"""

# Hide the block once the app has taken over: its status line says it is replaying (or why it
# could not), which happens in the same frame that fills the lanes. The button closes it sooner.
_SCRIPT = f"""
(function () {{
  var box = document.getElementById('{BLOCK_ID}');
  if (!box) return;
  window.pgQuickReadShown = performance.now();
  function done() {{ if (box.parentNode) box.parentNode.removeChild(box); }}
  box.querySelector('button').addEventListener('click', done);
  (function tick() {{
    var s = document.querySelector('#status .pg-status');
    if (s && /Replaying|Could not open/.test(s.textContent)) {{ done(); return; }}
    if (box.parentNode) setTimeout(tick, 50);
  }})();
}})();
"""


def _knobs(trace: dict[str, Any]) -> str:
    params = trace.get("params") if isinstance(trace.get("params"), dict) else {}
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"


def lane_card(trace: dict[str, Any], lane: int) -> str:
    """One lane as the page's card shows it: decoder, knobs, coloured text, legend and stats."""
    metric = visualizers.auto_metric(trace)
    return (f'<section class="qr-lane" data-lane="{lane}">'
            f'<h2>Lane {lane + 1}: {html.escape(str(trace.get("decoder", "?")))}</h2>'
            f'<div class="qr-knobs">{html.escape(_knobs(trace))}</div>'
            f'{visualizers.tokens_html(trace, metric, lane=lane)}'
            f'{visualizers.legend_html(metric)}'
            f'<div class="qr-stats">{visualizers.stats_line(trace) or "—"}</div></section>')


def quick_read_block(session: dict[str, Any]) -> str:
    """The reading of a loaded session (``Store.load_session``) laid over the loading page."""
    runs = [r for r in session.get("runs") or [] if isinstance(r, dict)]
    title = str(session.get("title") or "Decoder Playground session")
    meta = [f"model {session.get('model', '?')}", f"{len(runs)} lanes"]
    if session.get("created"):
        meta.append(f"stored {str(session['created'])[:16].replace('T', ' ')} UTC")
    strip = visualizers.divergence_html(runs) if len(runs) > 1 else ""
    lanes = "".join(lane_card(t, j) for j, t in enumerate(runs))
    return (f'<div id="{BLOCK_ID}" role="region" aria-label="Shared session"><style>{_CSS}</style>'
            f'<div class="qr-wrap"><div class="qr-bar"><h1>{html.escape(title)}</h1>'
            f'<button type="button">Open the interactive page</button></div>'
            f'<div class="qr-meta">{html.escape(" · ".join(meta))} — the interactive page with every plot '
            f'is loading underneath.</div>'
            f'<div class="qr-prompt">{html.escape(str(session.get("prompt") or ""))}</div>'
            f'{strip}<div class="qr-lanes">{lanes}</div></div>'
            f'<script>{_SCRIPT}</script></div>')


def session_id_of(query: bytes | str) -> str | None:
    """The ``session`` parameter of a query string when it is a plausible id, else None."""
    text = query.decode("latin-1") if isinstance(query, bytes) else query
    if len(text) > 4 * MAX_SID + 512:
        return None
    values = parse_qs(text).get("session") or []
    sid = values[0] if values else ""
    return sid if _SID.fullmatch(sid) else None


def block_for(store: Store, sid: str) -> str:
    """The block for session ``sid``, or "" when it does not exist or is blind."""
    try:
        if not blind.readable(store, sid, None):
            return ""
        return quick_read_block(store.load_session(sid))
    except PlaygroundError:
        return ""


def insert_block(page: bytes, block: str) -> bytes:
    """``page`` with ``block`` right after its ``<body ...>`` tag (unchanged without one)."""
    m = re.search(rb"<body[^>]*>", page, re.I)
    if m is None or not block:
        return page
    return page[: m.end()] + block.encode("utf-8") + page[m.end():]


class QuickRead:
    """The middleware; ``store`` gives the store to read (the app's default store)."""

    def __init__(self, app: ASGIApp, store: Callable[[], Store] = default_store) -> None:
        self.app, self.store = app, store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "GET" or not _is_root(scope):
            await self.app(scope, receive, send)
            return
        sid = session_id_of(scope.get("query_string", b""))
        if sid is None:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []
        size = 0
        passing = False  # not an HTML page (or too large): forward as it comes

        async def held(message: Message) -> None:
            nonlocal start, size, passing
            if passing:
                await send(message)
                return
            if message["type"] == "http.response.start":
                headers = dict((k.lower(), v) for k, v in message.get("headers") or [])
                is_html = headers.get(b"content-type", b"").startswith(b"text/html")
                if message.get("status") != 200 or not is_html or headers.get(b"content-encoding"):
                    passing = True
                    await send(message)
                    return
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_HTML:
                passing = True
                await send(start)
                await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if message.get("more_body", False):
                return
            block = await to_thread.run_sync(block_for, self.store(), sid)
            body = insert_block(b"".join(chunks), block)
            headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, held)


def _is_root(scope: Scope) -> bool:
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", "") or "").rstrip("/")
    return path in ("", "/") or path == root + "/" or path == root
