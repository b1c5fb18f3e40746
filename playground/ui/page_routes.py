"""Plain HTTP routes the Compare page's own script calls while a run streams.

Three small POSTs, each ``{"value": "..."}``: ``live`` (the long poll of a run's live feed),
``ack`` (the page drew a frame) and ``stop`` (Stop, by run token). They are routes of the app
itself rather than Gradio events on purpose: every request to a Gradio event that comes
without a queue session rebuilds the whole page's component configuration first (measured:
a quarter of the app's CPU while a page polled ten times a second, slowing the decoders it
was showing). :func:`launch` in :mod:`playground.ui` adds them; an app mounted otherwise can
add them with ``FastAPI(routes=page_routes())``. Without them the page still works: lane text
then comes with the Run event's frames and Stop through its Gradio event.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "/playground_api"
MAX_BODY = 1024  # every value is a run token with a number or two


async def _value(request: Any) -> str | None:
    body = await request.body()
    if len(body) > MAX_BODY:
        return None
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return None
    v = data.get("value") if isinstance(data, dict) else None
    return v if isinstance(v, str) else None


async def live(request: Any) -> Any:
    """The page's poll of its run's live feed (see :func:`playground.ui.live_feed.poll_feed`)."""
    from anyio import to_thread
    from starlette.responses import JSONResponse

    from playground.ui.live_feed import poll_feed

    value = await _value(request)
    # the poll waits for the runner (up to a second or two): in a worker thread, not the loop
    answer = await to_thread.run_sync(poll_feed, value) if value is not None else {"unknown": True}
    return JSONResponse(answer, headers={"Cache-Control": "no-store"})


async def ack(request: Any) -> Any:
    """The page drew frame ``"<run token>:<n>"`` of a run."""
    from starlette.responses import Response

    from playground.ui.run_session import on_frame_drawn

    on_frame_drawn(await _value(request))
    return Response(status_code=204)


async def stop(request: Any) -> Any:
    """Stop the run whose token the page sends (an unknown token stops nothing)."""
    from starlette.responses import Response

    from playground.ui.run_session import stop_run

    stop_run(await _value(request))
    return Response(status_code=204)


def page_routes() -> list[Any]:
    """The routes, for ``FastAPI(routes=...)`` (Gradio's ``launch(app_kwargs=...)``)."""
    from starlette.routing import Route

    return [Route(f"{PREFIX}/live", live, methods=["POST"]),
            Route(f"{PREFIX}/ack", ack, methods=["POST"]),
            Route(f"{PREFIX}/stop", stop, methods=["POST"])]
