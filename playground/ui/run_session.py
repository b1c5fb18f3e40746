"""The streaming session of the Compare page: Run, Stop, Share, and the model work behind them.

A Run checks the page, prepares every lane, registers its :class:`~playground.runner.Runner`
under the browser session (so a Stop click, a separate event, can reach it), streams the
runner's snapshots to the page, and saves the session at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator

import gradio as gr

from playground.errors import PlaygroundError
from playground.ui import state as st
from playground.ui.html import empty_output, one_line, status_html
from playground.ui.inspector import PlotPacer
from playground.ui.layout import PageLayout

log = logging.getLogger(__name__)

STREAM_RATE = 10.0

# Stop buttons reach the running generator through this registry (session hash -> runner):
# the Stop click is a separate event, possibly on another worker thread.
_RUNNERS: dict[str, Any] = {}
_RUNNERS_LOCK = threading.Lock()


class RunSession(PageLayout):
    """Run, Stop and Share handlers (mixed into ``ComparePage``)."""

    # ================================================================== events
    def wire_run(self, demo: gr.Blocks) -> None:
        """Attach Run (button and Enter in the prompt) and Stop."""
        from playground.hosting import model_event_settings

        run_inputs = [self.model, self.model_path, self.prompt, self.seed, self.max_new, self.policy, self.metric,
                      self.lane_count, self.preset_state]
        for ui in self.lanes:
            run_inputs += [ui.decoder, ui.knobs, ui.draft, ui.model]
        self.run_event = self.run_btn.click(
            self.on_run, run_inputs, self.result_outputs() + [self.run_btn, self.stop_btn],
            show_progress="hidden", **model_event_settings())
        self.prompt.submit(self.on_run, run_inputs, self.result_outputs() + [self.run_btn, self.stop_btn],
                           show_progress="hidden", **model_event_settings())
        self.stop_btn.click(self.on_stop, None, None, queue=False)

    def wire_share(self, demo: gr.Blocks) -> None:
        """Attach Share."""
        self.share_btn.click(self.on_share, [self.sid], [self.share_link])

    # ================================================================== handlers
    def on_run(self, request: gr.Request, *args: Any) -> Iterator[dict[Any, Any]]:
        """Run the comparison, streaming text and stats, then plots; autosave at the end.

        ``request`` comes first because Gradio injects it only into positional parameters;
        ``args`` are the values of the Run button's inputs (page settings, then 4 per lane).
        """
        (model, model_path, prompt, seed, max_new, policy, metric, lane_count, preset) = args[:9]
        lane_args = args[9:]
        n = max(1, min(int(lane_count or 2), self.max_lanes))
        lanes = []
        for j in range(n):
            dec, knobs, draft, lmodel = lane_args[4 * j: 4 * j + 4]
            lanes.append(st.LaneConfig(decoder=dec or "", params=st.coerce_knobs(dec or "", knobs or {}),
                                       draft=None if draft in (None, "", st.NO_DRAFT) or not st.needs_draft(dec) else draft,
                                       model=None if lmodel in (None, "", st.SAME_MODEL) else lmodel))
        page_model = (model_path or "").strip() or (model or "").strip()
        try:
            seed_i, mnt = st.check_page(page_model, prompt, seed, max_new, lanes)
            _check_models_allowed()
        except PlaygroundError as e:
            gr.Warning(str(e))
            yield {self.status: status_html(str(e), "error")}
            return
        key = session_key(request)
        started = time.perf_counter()
        start: dict[Any, Any] = {
            self.status: status_html("Preparing lanes (loading models if needed)…"), self.share_link: "",
            self.sid: "", self.run_btn: gr.update(interactive=False), self.stop_btn: gr.update(interactive=True)}
        for ui in self.lanes[:n]:
            start[ui.output] = empty_output(ui.k, "Starting…")
            start[ui.stats] = '<div class="lane-stats">—</div>'
        yield start
        pacer = PlotPacer()
        traces: list[dict[str, Any]] = []
        runner = None
        try:
            for kind, payload in compare_stream(page_model, prompt, seed_i, mnt, policy, lanes, key):
                if kind == "errors":
                    for msg in sorted(set(payload.values())):
                        gr.Warning(msg)
                    continue
                if kind == "runner":
                    runner = payload
                    continue
                traces = payload
                if runner is not None and runner.done:
                    continue  # the final frame is drawn in full below
                now = time.perf_counter()
                running = sum(1 for t in traces if not t.get("done"))
                up = self.result_updates(
                    traces, metric, plots=False, live=True,
                    status=status_html(f"Running… {running} of {len(traces)} lanes still decoding "
                                       f"({now - started:.1f} s)"))
                if pacer.due("lanes", now):
                    with pacer.timed("lanes"):
                        up.update(self.inspector_updates(traces, None, run_plots=True))
                elif pacer.due("strip", now):
                    with pacer.timed("strip"):
                        up.update(self.strip_updates(traces))
                yield up
        except PlaygroundError as e:  # a page-level problem (e.g. the model cannot load)
            gr.Warning(str(e))
            yield {self.status: status_html(str(e), "error"), **self.idle_buttons()}
            return
        except Exception as e:  # noqa: BLE001 - a bug shows as one line; the log has the traceback
            log.exception("comparison failed")
            msg = one_line(f"the comparison failed: {type(e).__name__}: {e}")
            gr.Warning(msg)
            yield {self.status: status_html(msg, "error"), **self.idle_buttons()}
            return
        stopped = runner is not None and runner.cancelled
        sid, saved = None, ""
        if traces and any(t.get("steps") for t in traces):
            try:
                from playground.store import default_store

                pre = st.preset_page(preset) if preset else None
                title = st.session_title(lanes, pre["title"] if pre and [c.decoder for c in pre["lanes"]] ==
                                         [c.decoder for c in lanes] else None)
                settings = st.session_settings(page_model, seed_i, mnt, policy, metric, lanes, preset)
                sid = default_store().save_session(title, page_model, prompt, settings, traces)
                saved = " Saved — press Share for a link."
            except PlaygroundError as e:
                gr.Warning(f"could not save the session: {e}")
                saved = f" (not saved: {e})"
        head = "Stopped" if stopped else "Done"
        up = self.result_updates(traces, metric, step=None, plots=True, sid=sid,
                                 status=status_html(f"{head} in {time.perf_counter() - started:.1f} s.{saved}",
                                                    "ok" if not stopped else "info"))
        up.update(self.idle_buttons())
        yield up

    def on_stop(self, request: gr.Request) -> None:
        """Stop the running comparison of this browser session (lanes keep what they made).

        It updates nothing itself: the Run stream notices within one step and shows the
        stopped lanes. (Sharing an output with the streaming event was a suspect in a run
        that never showed its last frame.)
        """
        key = session_key(request)
        with _RUNNERS_LOCK:
            runner = _RUNNERS.get(key)
        if runner is not None:
            runner.cancel()

    def on_share(self, sid: str | None, request: gr.Request) -> str:
        """Show the share link of the current session."""
        if not sid:
            gr.Warning("Run a comparison (or open a session) first: there is nothing to share yet.")
            return ""
        return st.share_url(root_url(request), sid)


# ---------------------------------------------------------------------- the model work
def _compare_stream_impl(model: str, prompt: str, seed: int, max_new_tokens: int, policy: str,
                         lanes: list[st.LaneConfig], key: str) -> Iterator[tuple[str, Any]]:
    """Prepare every lane and stream the runner's snapshots.

    Yields ("errors", {lane: message}) once if some lanes could not start, ("runner", runner)
    once, then ("snapshots", [trace dict per lane]) at the runner's rate. Raises
    PlaygroundError when no lane can start for the same page-level reason.
    """
    from playground.engine import prepare
    from playground.runner import Lane, Runner, error_trace

    prepared: list[Lane] = []
    errors: dict[int, str] = {}
    for j, cfg in enumerate(lanes):
        try:
            # lane_request refuses a knob out of range or a missing draft: that lane fails, not the page
            req = st.lane_request(cfg, model, prompt, seed, max_new_tokens)
            prepared.append(Lane(run=prepare(**req), label=cfg.decoder))
        except Exception as e:  # noqa: BLE001 - a lane that cannot start must not take the page down
            if not isinstance(e, PlaygroundError):
                log.exception("lane %d (%s) could not be prepared", j + 1, cfg.decoder)
            msg = str(e) if isinstance(e, PlaygroundError) else one_line(f"could not start: {type(e).__name__}: {e}")
            errors[j] = msg
            prepared.append(Lane(error=msg, label=cfg.decoder,
                                 stub=error_trace(msg, decoder=cfg.decoder, model=cfg.model or model, prompt=prompt,
                                                  params=cfg.params, seed=seed)))
    if errors and len(errors) == len(lanes) and len(set(errors.values())) == 1:
        raise PlaygroundError(next(iter(errors.values())))
    if errors:
        yield "errors", {j + 1: f"lane {j + 1}: {m}" for j, m in errors.items()}
    runner = Runner(prepared, policy=policy, rate=STREAM_RATE)
    with _RUNNERS_LOCK:
        _RUNNERS[key] = runner
    try:
        yield "runner", runner
        for snaps in runner.stream():
            yield "snapshots", snaps
    finally:
        runner.cancel()  # a closed stream (browser gone) must not leave lanes running
        with _RUNNERS_LOCK:
            if _RUNNERS.get(key) is runner:
                del _RUNNERS[key]


def _gpu_wrapped() -> Callable[..., Iterator[tuple[str, Any]]]:
    from playground.hosting import gpu

    return gpu(_compare_stream_impl)


compare_stream = _gpu_wrapped()


def _check_models_allowed() -> None:
    from playground.settings import limits

    if limits().no_models:
        raise PlaygroundError("model loading is disabled on this instance (replay only): open a shared session instead")


def session_key(request: Any) -> str:
    """The browser session a request comes from (``"local"`` when called without one)."""
    return str(getattr(request, "session_hash", None) or "local")


def root_url(request: Any) -> str:
    """The public URL of the app, from the request that pressed Share."""
    from gradio import route_utils

    try:
        req = request.request
        return route_utils.get_root_url(req, route_utils.get_api_call_path(req), None)
    except Exception:  # noqa: BLE001 - fall back to the headers the browser sent
        headers = getattr(request, "headers", {}) or {}
        origin = headers.get("origin") or ""
        if origin:
            return origin
        host = headers.get("host") or "localhost:7860"
        return f"http://{host}"
