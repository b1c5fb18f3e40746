"""The vote page of blind comparisons: ``/vote?session=ID`` (one comparison) and ``/vote?study=1``
(every blind prompt of the study stored here, one after another).

A plain page of its own rather than a Gradio view on purpose: the page a reader gets holds no
decoder name anywhere in its DOM until their ballot is stored — the Compare page's lane
configuration, colours and stats would all have to be kept out of a Gradio page's component
tree, which the browser receives whole. The page asks three JSON routes (each
``{"key": reader key, ...}``; the reader key is the browser's owner key, :mod:`playground.ownership`):

* ``POST /playground_api/vote/view`` ``{"session"}`` → the reader's view (:func:`playground.blind.reader_view`);
* ``POST /playground_api/vote/cast`` ``{"session", "ballot", "reason"}`` → the view with the reveal;
* ``POST /playground_api/vote/study`` → the study's blind sessions and which the reader voted on.

Errors come back as ``{"error": one line}`` with status 400 (413 for a body over :data:`MAX_BODY`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from anyio import to_thread
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from playground import blind
from playground.ballots import MAX_REASON_CHARS
from playground.core.errors import PlaygroundError
from playground.store import Store, default_store

PAGE_PATH = Path(__file__).resolve().parent / "vote_page.html"
API = "/playground_api/vote"
# a ballot is a few letters; the reason is at most 500 characters (4 bytes each at most)
MAX_BODY = 4 * MAX_REASON_CHARS + 1024
NO_STORE = {"Cache-Control": "no-store"}


def vote_url(root: str, sid: str) -> str:
    """The vote link of blind session ``sid`` on the app at ``root``."""
    return f"{root.rstrip('/')}/vote?session={sid}"


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _body(request: Any) -> dict[str, Any]:
    """The JSON object the page sent, read no further than :data:`MAX_BODY`."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise _Refused(413, "the vote is too long")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise _Refused(413, "the vote is too long")
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise _Refused(400, "the vote page sent something that is not JSON") from None
    if not isinstance(data, dict):
        raise _Refused(400, "the vote page sends a JSON object")
    return data


def _answer(store_of: Callable[[], Store], work: Callable[[Store, dict[str, Any]], dict[str, Any]]) -> Callable[[Any], Any]:
    """A route running ``work(store, body)`` in a worker thread, its one-line errors as JSON."""
    async def route(request: Any) -> Any:
        try:
            data = await _body(request)
            result = await to_thread.run_sync(lambda: work(store_of(), data))
        except _Refused as e:
            return JSONResponse({"error": str(e)}, status_code=e.status, headers=NO_STORE)
        except PlaygroundError as e:
            return JSONResponse({"error": str(e)}, status_code=400, headers=NO_STORE)
        return JSONResponse(result, headers=NO_STORE)

    return route


def _view(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    return blind.reader_view(store, data.get("session"), data.get("key"))


def _cast(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    return blind.cast(store, data.get("session"), data.get("key"), data.get("ballot"), data.get("reason", ""))


def _study(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    return blind.study_queue(store, data.get("key"))


async def _page(request: Any) -> Any:
    return HTMLResponse(PAGE_PATH.read_text(encoding="utf-8"), headers=NO_STORE)


def vote_routes(store_of: Callable[[], Store] = default_store) -> list[Route]:
    """The page and its three routes; ``store_of`` gives the session store (tests pass their own)."""
    return [Route("/vote", _page, methods=["GET"]),
            Route(f"{API}/view", _answer(store_of, _view), methods=["POST"]),
            Route(f"{API}/cast", _answer(store_of, _cast), methods=["POST"]),
            Route(f"{API}/study", _answer(store_of, _study), methods=["POST"])]
