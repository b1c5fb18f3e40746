"""The Gradio UI: a Compare page (lanes racing, step inspector, sharing), a Sessions view, a
Study view (a ``playground study`` file's aggregate, drilled down to any prompt), a
Watermark detector, the sampler Sandbox, knob Sweeps and the Results of blind votes; beside them the
blind comparisons' own vote page (:mod:`playground.ui.vote_page`).

``build_app()`` returns the Blocks; ``launch(demo)`` starts it with the page's CSS and the
hosting settings (queue, concurrency, host/port from the environment).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware

import playground.ui.api_endpoints as api_endpoints
import playground.ui.page_routes as routes
from playground.hosting import launch_settings, queue_settings
from playground.ui.api_endpoints import ENDPOINTS
from playground.ui.compare import ComparePage
from playground.ui.exports import CACHE_CLEANUP
from playground.ui.page_session import PageSessions, session_key
from playground.ui.quick_read import QuickRead
from playground.ui.request_guard import RequestGuard
from playground.ui.results_view import ResultsView
from playground.ui.sandbox_view import SandboxView
from playground.ui.sessions_view import SessionsView
from playground.ui.study_view import StudyView
from playground.ui.sweep_view import SweepView
from playground.ui.vote_page import vote_routes
from playground.ui.watermark_view import WatermarkView


CSS_PATH = Path(__file__).resolve().parent / "style.css"

INTRO = (
    "# Decoder Playground\n"
    "Pick decoders for up to six lanes and press **Run**: they decode the same prompt in lockstep, "
    "at equal compute, token by token. Then scrub through the steps — or click any token — to see "
    "the distribution, draft tree or canvas behind it."
)


def css() -> str:
    """The page's stylesheet."""
    return CSS_PATH.read_text(encoding="utf-8")


def build_app() -> gr.Blocks:
    """Build the Gradio Blocks app (Compare, Sessions, Study, Watermark, Sandbox, Sweep and Results tabs) with its public API endpoints
    (``playground/ui/api_endpoints.py``); every UI handler is private to the API."""
    registry = PageSessions()  # one per app: what the server holds for each open page

    # delete_cache: Gradio's copies of served files (exports, uploads) go a minute after they were made
    with gr.Blocks(title="Decoder Playground", fill_width=True, delete_cache=CACHE_CLEANUP) as demo:
        # Registered first so their API names are taken before any UI handler's.
        public = api_endpoints.register()
        gr.Markdown(INTRO, elem_id="intro")
        with gr.Tabs(selected="compare", elem_id="tabs") as tabs:
            with gr.Tab("Compare", id="compare", elem_id="tab-compare"):
                page = ComparePage(registry)
                page.build()
            with gr.Tab("Sessions", id="sessions", elem_id="tab-sessions") as sessions_tab:
                sessions = SessionsView(page, tabs)
                sessions.build()
            with gr.Tab("Study", id="study", elem_id="tab-study"):
                study = StudyView(page, tabs)
                study.build()
            with gr.Tab("Watermark", id="watermark", elem_id="tab-watermark"):
                watermark = WatermarkView(page)
                watermark.build()
            with gr.Tab("Sandbox", id="sandbox", elem_id="tab-sandbox"):
                sandbox = SandboxView(page)
                sandbox.build()
            with gr.Tab("Sweep", id="sweep", elem_id="tab-sweep"):
                sweep = SweepView(page, sessions.exports)
                sweep.build()
            with gr.Tab("Results", id="results", elem_id="tab-results") as results_tab:
                results = ResultsView(page)
                results.build()
        page.wire(demo)
        sessions.wire(demo, sessions_tab)
        study.wire(demo)
        watermark.wire(demo)
        sandbox.wire(demo)
        sweep.wire(demo)
        results.wire(demo, results_tab)
        # every tab has added what follows the shown comparison: one event for all of it
        page.on_shown.wire(page.shown.change, show_progress="hidden")

        def page_gone(request: gr.Request) -> None:
            registry.end(session_key(request))  # the page closed or reloaded: its record (and any run) ends

        demo.unload(page_gone)
    api_endpoints.hide_ui_events(demo, public)
    demo.page_sessions = registry  # type: ignore[attr-defined]  (launch gives it to the page's routes)
    demo.compare_page = page  # type: ignore[attr-defined]  (tests drive the handlers directly)
    demo.sessions_view = sessions  # type: ignore[attr-defined]
    demo.study_view = study  # type: ignore[attr-defined]
    demo.watermark_view = watermark  # type: ignore[attr-defined]
    demo.sandbox_view = sandbox  # type: ignore[attr-defined]
    demo.results_view = results  # type: ignore[attr-defined]
    demo.sweep_view = sweep  # type: ignore[attr-defined]
    return demo


def launch(demo: gr.Blocks, **overrides: object) -> None:
    """Launch with the queue and launch settings hosting decides, and the page CSS."""
    # the page script's own routes (live feed, frame acknowledgements, Stop) come first; the
    # guard lets only the public API be called by name and caps every request body
    settings = {**launch_settings(), "css": css(), "theme": gr.themes.Soft(),
                "app_kwargs": app_kwargs(demo), **overrides}
    demo.queue(**queue_settings()).launch(**settings)


def app_kwargs(demo: gr.Blocks | None = None) -> dict[str, object]:
    """What :func:`launch` gives Gradio's FastAPI app: the page's routes (serving the page
    registry and the Sessions tab's export links of ``demo``, and the blind comparisons' vote page)
    and the request guard; then the share link's quick read (:mod:`playground.ui.quick_read`),
    inside the guard."""
    view = getattr(demo, "sessions_view", None)
    # ``is None``, not ``or``: the page's registry is empty (falsy) until a page opens, and a
    # fresh registry here served no run — every live-feed poll was "unknown" and lane text
    # came only with the Run frames, about once a second (the ui bench: 0.5 updates/s)
    sessions = getattr(demo, "page_sessions", None)
    if sessions is None:
        sessions = PageSessions()
    return {"routes": routes.page_routes(sessions=sessions, exports=getattr(view, "exports", None)) + vote_routes(),
            "middleware": [Middleware(RequestGuard, public=ENDPOINTS), Middleware(QuickRead)]}
