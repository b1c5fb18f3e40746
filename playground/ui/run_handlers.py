"""The Compare page's Run, Stop and Share handlers (:class:`RunHandlers`) and the model work
behind them.

The data path reads in one direction: Run → worker → snapshot → live feed → page.

1. :meth:`RunHandlers.on_run` checks the page and starts :func:`page_race`.
2. :func:`page_race` makes the page's :class:`~playground.ui.page_session.PageSession` hold a
   :class:`~playground.runner.Runner` (so Stop, a separate unqueued event, reaches it at once, even while lanes are still
   being prepared) and starts its worker thread: each lane is prepared in a thread of its own
   and the worker steps the lanes in lockstep, never waiting for the page.
3. While the lanes decode, the Run event's frames carry the status line (about once a
   second), each lane's legend once its colouring is known, and the comparison strip at a
   paced rate, to a short list of outputs (:meth:`Layout.run_outputs`). Lane text and stats
   take one path only: the page's script reads the run's live feed
   (:mod:`playground.ui.live_feed`), which answers with the new tokens of the lanes that grew.
   A step the user scrubs to while it streams is drawn from the live snapshot by the
   inspector's own events.
4. The last frame (every lane whole, session saved, Run enabled) ends the run;
   :meth:`RunHandlers.on_draw`, chained after the Run event, then draws every plot.

Closing the Run generator (the page went away) cancels the runner and waits for its worker
to end; the worker also ends by itself when nobody reads it any more.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import gradio as gr
from gradio import route_utils

import playground.ui.rules as st
import visualizers
from playground import blind
from playground.core.errors import PlaygroundError
from playground.core.settings import limits
from playground.engine import prepare
from playground.hosting import gpu, model_event_settings
from playground.ownership import change_filter, owner_id
from playground.runner import Lane, Runner, pending_trace
from playground.store import default_store, lane_failed, run_outcome
from playground.watch import watch_items
from playground.ui.events import nothing_is_skip
from playground.ui.html import empty_output, one_line, stats_html, status_html
from playground.ui.inspector import InspectorHandlers, PlotPacer
from playground.ui.lane_config import LaneHandlers
from playground.ui.layout import Layout
from playground.ui.model_options import option_inputs, page_options, split_options
from playground.ui.page_js import page_js
from playground.ui.page_session import BUSY_MESSAGE, Busy, PageSession, PageSessions, session_key
from playground.ui.updates import pending_header
from playground.ui.vote_page import vote_url

log = logging.getLogger(__name__)

STREAM_RATE = 12.0  # snapshots the stream reads per second at most (0: every publish)
FLOOR_RATE = 2.0  # the worker's own publishing rate; the page's reads ask for the rest
# The Run frames carry the status line about once a second: each Gradio message costs the
# browser a walk over every component (~0.1 s on a two-core machine), time the live text and
# a click on Stop need. Lane text takes the live feed only (one transport: the two paths
# wrote the same lanes, and a page switching between them redrew every lane whole).
STATUS_S = 1.0
JOIN_S = 30.0  # how long a closed stream waits for its worker to end (it stops within one step)
# Frames the page may have received but not yet drawn. The browser says which frame it drew
# (FLOW_JS acknowledges each status line it shows), and the stream waits for it: every frame
# costs the browser a fixed amount of work (Gradio's frontend revisits every component's
# loading status per streamed message), so on a busy machine frames sent faster than they are
# drawn queued up in the browser, and a click on Stop waited behind that queue until the run
# had ended (issue 10). At most FLOW_WINDOW frames are in flight; FLOW_WAIT_S bounds the
# wait for one acknowledgement (a lost one only slows the stream down, never stalls it).
# The stream's frames wait (up to FIRST_HOLD_S after Run) until the live feed has answered with
# the first lane text: each frame costs the browser a walk over every component, and the
# browser handles them in order, so a legend or status frame sent just before the first
# answer delayed the first token by as long as the browser took to draw it (profile in
# docs/benchmarks.md, ui section). The first frame (Run disabled, Stop enabled) is not held.
FIRST_HOLD_S = 1.5
FLOW_WINDOW = 3  # one was too few: a short run (3 lanes x 48 tokens) ended before a second frame
FLOW_WAIT_S = 3.0

# Shift+Enter while this page's run streams (Run disabled): the browser says why nothing started.
BUSY_JS = page_js("busy_notice.js", BUSY_MESSAGE=BUSY_MESSAGE)


# Run by the Run event in the browser, before the request leaves. Once per page it installs
# two things. (1) Frame acknowledgements: whenever the status line shows a new frame number,
# tell the server with a plain POST. (2) Stop's direct path: a click on #stop (capture phase,
# before Gradio's own handler; a keyboard press or a script's click() counts too) posts the
# run's token straight to the server:
# Chromium runs input events ahead of queued work, so this request leaves even while Gradio's
# frontend is still busy with earlier frames. Both go around Gradio's frontend on purpose: a
# Gradio event per frame would add the very per-message work this is meant to keep bounded.
# Then, at every Run, it names the run (a random token, the last Run input as "flow:<token>")
# and reads the run's live feed (live_feed.py): a long poll answered as soon as the lanes grew,
# whose new tokens and stats it patches into the lanes, asking again once the browser has drawn
# them, at most POLL_HZ times a second. All three requests go to the app's own routes
# (page_routes.py), not to Gradio events.
FLOW_JS = page_js("run_flow.js")


@dataclass
class RunRequest:
    """What one press of Run asks for, read from the Run event's inputs (not yet checked)."""

    page_model: str  # the model path if one was typed, else the picked model
    prompt: Any
    seed: Any
    max_new: Any
    policy: str
    metric: str
    preset: Any
    lanes: list[st.LaneConfig]
    owner_key: str | None
    flag: str  # "flow:<run token>" from a page whose script reads the live feed
    watch: Any = None  # the watch field as sent (checked by on_run with watch_items)

    @property
    def wants_flow(self) -> bool:
        """Whether the page acknowledges the frames it draws (its script sent the flag)."""
        return self.flag == "flow" or self.flag.startswith("flow:")


def read_run_inputs(ui: Layout, args: tuple[Any, ...]) -> RunRequest:
    """The Run event's input values as a :class:`RunRequest`: page settings, four values per
    lane (only the first ``lane_count`` lanes count), the model options, then the watch field,
    the owner key and last the flow flag (read from the end: a caller may send only the flag,
    or the owner key and the flag)."""
    (model, model_path, prompt, seed, max_new, policy, metric, lane_count, preset) = args[:9]
    lane_args = args[9: 9 + 4 * ui.max_lanes]
    options, tail = split_options(ui, tuple(args[9 + 4 * ui.max_lanes:]))
    flag = str(tail[-1]) if tail and tail[-1] else ""
    owner_key = tail[-2] if len(tail) > 1 else None
    watch = tail[-3] if len(tail) > 2 else None
    n = max(1, min(int(lane_count or 2), ui.max_lanes))
    lanes = []
    for j in range(n):
        dec, knobs, draft, lmodel = lane_args[4 * j: 4 * j + 4]
        lanes.append(st.LaneConfig(decoder=dec or "", params=st.coerce_knobs(dec or "", knobs or {}),
                                   draft=None if draft in (None, "", st.NO_DRAFT) or not st.needs_draft(dec) else draft,
                                   model=None if lmodel in (None, "", st.SAME_MODEL) else lmodel))
    lanes = st.with_options(lanes, **page_options(*options))
    return RunRequest(page_model=(model_path or "").strip() or (model or "").strip(), prompt=prompt, seed=seed,
                      max_new=max_new, policy=policy, metric=metric, preset=preset, lanes=lanes,
                      owner_key=owner_key, flag=flag, watch=watch)


@dataclass
class RunStream:
    """One streaming run as on_run follows it: its token, transports, runner and latest traces."""

    token: str
    started: float
    feed: Any  # the live feed the page reads, or None
    busy: dict[Any, Any]  # the buttons' state every frame repeats
    end_mark: str | None
    flow: Any  # the frame flow, or None
    runner: Any = None
    traces: list[dict[str, Any]] = field(default_factory=list)


class RunHandlers:
    """Run, Stop and Share, over the page's components ``ui``. ``sessions`` is the page registry
    (a page's runner, run token, feed and picked step), ``inspector`` draws the lanes and plots,
    ``config`` says what a run that did not start leaves in the lanes."""

    def __init__(self, ui: Layout, sessions: PageSessions, inspector: InspectorHandlers,
                 config: LaneHandlers) -> None:
        self.ui, self.sessions, self.inspector, self.config = ui, sessions, inspector, config

    # ================================================================== events
    def wire_run(self, demo: gr.Blocks) -> None:
        """Attach Run (button and Enter in the prompt) and Stop."""
        run_inputs = [self.ui.model, self.ui.model_path, self.ui.prompt, self.ui.seed, self.ui.max_new, self.ui.policy, self.ui.metric,
                      self.ui.lane_count, self.ui.preset_state]
        for ui in self.ui.lanes:
            run_inputs += [ui.decoder, ui.knobs, ui.draft, ui.model]
        run_inputs += option_inputs(self.ui)  # chat, system prompt, remote-code opt-in (model_options)
        run_inputs.append(self.ui.watch)  # the tokens every lane watches (playground/watch.py)
        run_inputs.append(self.ui.owner_key)  # the saved session is this browser's (ownership.py)
        # The last input is the flow flag: FLOW_JS sets it to "flow:<run token>" in a page that
        # acknowledges the frames it draws and reads the live feed (the hidden run token box only
        # carries it; its own value is ignored).
        run_inputs.append(self.ui.run_token)
        # The Run button and Shift+Enter in the prompt are ONE event. As two events with the same
        # outputs, a Shift+Enter during a run sent a second request whose refusal shared the
        # running event's outputs (buttons included) and raised a toast over the page; in the
        # browser, Stop then did not always reach the run. One event with trigger_mode "once":
        # the browser sends no second Run while the first is pending (the server still refuses
        # one that races in), and BUSY_JS says so in #run-notice, which no server frame writes
        # while the run streams.
        self.run_event = gr.on([self.ui.run_btn.click, self.ui.prompt.submit], self.on_run, run_inputs,
                               self.ui.run_outputs() + [self.ui.run_btn, self.ui.stop_btn, self.ui.notice, self.ui.run_token],
                               show_progress="hidden", trigger_mode="once",
                               js=FLOW_JS, **model_event_settings())
        # Every plot is drawn by this follow-up event, after the Done frame has re-enabled Run:
        # the stream stays a short list of outputs, and Done never waits for a dozen figures.
        # Not in the model group: drawing needs no model and must not queue behind a Run.
        self.run_event.then(nothing_is_skip(self.on_draw), [self.ui.traces, self.ui.step], self.ui.draw_outputs(), show_progress="hidden")
        self.ui.prompt.submit(None, None, [self.ui.notice], js=BUSY_JS, queue=False, show_progress="hidden")
        self.ui.stop_btn.click(self.on_stop, [self.ui.run_token], None, queue=False)

    def wire_share(self, demo: gr.Blocks) -> None:
        """Attach Share."""
        self.ui.share_btn.click(self.on_share, [self.ui.sid, self.ui.blind, self.ui.owner_key], [self.ui.share_link])

    # ================================================================== handlers
    def on_run(self, request: gr.Request, *args: Any) -> Iterator[dict[Any, Any]]:
        """Run the comparison, streaming text and stats, then plots; autosave at the end.

        ``request`` comes first because Gradio injects it only into positional parameters;
        ``args`` are the values of the Run button's inputs (page settings, then 4 per lane).
        The steps: read and check the inputs, open the run (its token, feed and frame flow),
        stream its frames, then save it and send the last frame.
        """
        entered = time.monotonic()  # the first token's clock (LiveFeed.mark)
        req = read_run_inputs(self.ui, args)
        try:
            seed_i, mnt = st.check_page(req.page_model, req.prompt, req.seed, req.max_new, req.lanes)
            req.watch = watch_items(req.watch)
            _check_models_allowed()
        except PlaygroundError as e:
            gr.Warning(str(e))
            yield {self.ui.status: status_html(str(e), "error")}
            return
        key = session_key(request)
        page = self.sessions.page(key)
        if page.running() is not None:
            # No toast: it can lie over the Stop button that the user needs next.
            yield {self.ui.status: status_html(BUSY_MESSAGE, "error")}
            return
        run = self._open_run(req, key)
        if run.feed is not None:
            run.feed.mark("event", entered)
            run.feed.mark("opened")
        first = self._first_frame(req, run)
        if run.feed is not None:
            run.feed.mark("first_frame")
        yield first
        if run.feed is not None:
            run.feed.mark("resumed")  # Gradio has sent the first frame and asks for the next
        page.selected = None
        stream = page_race(req.page_model, req.prompt, seed_i, mnt, req.policy, req.lanes, page, req.watch)
        try:
            yield from self._stream_frames(stream, req, run, page)
        except Busy as e:  # another Run of this page got there first: leave it alone
            yield {self.ui.status: status_html(str(e), "error")}
            return
        except PlaygroundError as e:  # a page-level problem (e.g. the model cannot load)
            gr.Warning(str(e))
            yield self._failed_frame(req, run, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug shows as one line; the log has the traceback
            log.exception("comparison failed")
            msg = one_line(f"the comparison failed: {type(e).__name__}: {e}")
            gr.Warning(msg)
            yield self._failed_frame(req, run, msg)
            return
        finally:
            stream.close()  # the page went away (or an error): the worker must not run on
            picked, page.selected = page.selected, None
            self.sessions.end_run(run.token)
        stopped = run.runner is not None and run.runner.cancelled
        sid, saved = self._save(req, run.traces, seed_i, mnt, stopped)
        page.draw_pending = False
        yield self._last_frame(req, run, stopped, sid, saved, picked)

    def _open_run(self, req: "RunRequest", key: str) -> "RunStream":
        """Name the run and open what it streams through (the live feed, the frame flow)."""
        started = time.perf_counter()
        # The page's script names the run (so it can read the live feed and send Stop before the
        # first frame arrives); a page without it, or a token in use, gets one made here.
        named = req.flag[len("flow:"):] if req.flag.startswith("flow:") else None
        feed = self.sessions.open_feed(named, self._live_render(req.metric), key) if named is not None else None
        token = named if feed is not None else secrets.token_urlsafe(16)
        if feed is None:
            self.sessions.name_run(key, token)
        # Every frame until the last repeats the buttons' state. Gradio streams each output as a
        # diff against its previous frame, and a frame that leaves the buttons out reads as
        # "delete interactive"; when the browser took the first two frames together, Stop stayed
        # disabled for the whole run (1 run in 4 in the browser) and could not be pressed.
        busy = {self.ui.run_btn: gr.update(interactive=False), self.ui.stop_btn: gr.update(interactive=True)}
        return RunStream(token=token, started=started, feed=feed, busy=busy,
                         end_mark=token if feed is not None else None,  # the last frame names the run ended
                         flow=self.sessions.start_flow(token) if req.wants_flow else None)

    def _first_frame(self, req: "RunRequest", run: "RunStream") -> dict[Any, Any]:
        """The frame that says the run started: Run disabled, Stop enabled, lanes starting."""
        start: dict[Any, Any] = {
            self.ui.run_token: run.token,
            self.ui.status: status_html("Preparing lanes (loading models if needed)…"), self.ui.share_link: "",
            **run.busy, self.ui.notice: ""}
        # The previous run's traces and session id stay until the last frame replaces them:
        # changing them here set off their change listeners (three more events, each costing the
        # browser a walk over every component) just when the first tokens should be drawn.
        for ui, cfg in zip(self.ui.lanes, req.lanes):
            if run.feed is None:
                # (a page reading the live feed gets every lane whole in its first answer, with
                # tokens most often; two writes of six lanes at once delayed the first tokens)
                start[ui.output] = empty_output(ui.k, "Starting…")
                start[ui.stats] = stats_html("")
            start[ui.insp_header] = pending_header(ui.k, cfg.decoder)
        return start

    def _stream_frames(self, stream: Iterator[tuple[str, Any]], req: "RunRequest", run: "RunStream",
                       page: PageSession) -> Iterator[dict[Any, Any]]:
        """The frames while the lanes decode: the status line about once a second, a lane's
        legend when its colouring is known, the strip at a paced rate; ``run`` keeps the runner
        and the latest traces. Lane text is never in these frames: the page reads it from the
        live feed, and the last frame carries every lane whole."""
        pacer = PlotPacer()
        legends: dict[int, str] = {}  # lane -> the colouring its legend shows
        warned: set[int] = set()
        last_status = -1.0
        frame = 0  # frames sent by the stream (the status line carries the number)
        for kind, payload in stream:
            if kind == "runner":
                run.runner = payload
                if run.feed is not None:
                    run.feed.attach(run.runner)
                continue
            run.traces = traces = payload
            runner = run.runner
            for j, tr in enumerate(traces):
                err = (tr.get("stats") or {}).get("error")
                if err and j not in warned and not tr.get("steps"):
                    warned.add(j)  # a lane that could not start: say so once, at once
                    gr.Warning(f"lane {j + 1}: {err}")
            if runner is not None and runner.finished:
                continue  # the final frame is drawn in full by on_run
            rest = FIRST_HOLD_S - (time.perf_counter() - run.started)
            if run.feed is not None and runner is not None and not run.feed.shown and rest > 0:
                # the first text goes first; this frame's news goes with the next one
                while rest > 0 and not (runner.finished or runner.cancelled or run.feed.wait_shown(min(rest, 0.05))):
                    rest = FIRST_HOLD_S - (time.perf_counter() - run.started)
                continue
            now = time.perf_counter()
            up = self.inspector.legend_updates(traces, req.metric, legends)
            if not up and now - last_status < STATUS_S and not pacer.due("strip", now):
                if runner is not None:
                    # nothing to send for a while: read again when the status is due
                    # (each read makes the worker publish a snapshot)
                    runner.join(max(0.0, STATUS_S - (now - last_status)))
                continue
            if now - last_status >= STATUS_S or run.flow is not None:
                # with flow control every frame carries the status line: it holds the frame
                # number the page acknowledges
                last_status = now
                running = sum(1 for t in traces if not t.get("done"))
                loading = sum(1 for t in traces if t.get("preparing"))
                what = f", {loading} still loading" if loading else ""
                frame += 1
                up[self.ui.status] = status_html(f"Running… {running} of {len(traces)} lanes still decoding"
                                                 f"{what} ({now - run.started:.1f} s)",
                                                 frame=f"{run.token}:{frame}" if run.flow is not None else None)
            # No lane plots in the stream (a step the user scrubs to or clicks is drawn at
            # once from the live snapshot by on_step / on_token); the strip at a paced rate.
            if pacer.due("strip", now):
                with pacer.timed("strip"):
                    up.update(self.inspector.strip_updates(traces, follow=page.selected is None))
            if run.flow is not None and runner is not None:
                # the page must have drawn all but FLOW_WINDOW of the frames sent so far
                run.flow.wait_drawn(frame - FLOW_WINDOW, FLOW_WAIT_S, lambda: runner.cancelled or runner.finished)
            up.update(run.busy)
            yield up

    def _failed_frame(self, req: "RunRequest", run: "RunStream", msg: str) -> dict[Any, Any]:
        """The last frame of a run that could not go on: the message, Run back, the lanes say why."""
        return {self.ui.status: status_html(msg, "error", ended=run.end_mark), **self.ui.idle_buttons(),
                self.ui.notice: "", **self.config.not_run(len(req.lanes), msg)}

    def _save(self, req: "RunRequest", traces: list[dict[str, Any]], seed: int,
              max_new_tokens: int, stopped: bool = False) -> tuple[str | None, str]:
        """Store the run as this browser's session: its id (None when nothing was saved) and
        what the status line says about it. A run where every lane failed, or none took a
        step, is not saved (the line says why); the saved one keeps whether it was stopped and
        which lanes failed (``settings.outcome``, the Sessions list's markers)."""
        if traces and all(lane_failed(t) for t in traces):
            return None, " Not saved: every lane failed."
        if not (traces and any(t.get("steps") for t in traces)):
            return None, " Not saved: no lane took a step."
        try:
            pre = st.preset_page(req.preset) if req.preset else None
            title = st.session_title(req.lanes, pre["title"] if pre and [c.decoder for c in pre["lanes"]] ==
                                     [c.decoder for c in req.lanes] else None)
            settings = st.session_settings(req.page_model, seed, max_new_tokens, req.policy, req.metric,
                                           req.lanes, req.preset, run_outcome(traces, stopped), req.watch)
            sid = default_store().save_session(title, req.page_model, req.prompt, settings, traces,
                                               owner=owner_id(req.owner_key))
            return sid, " Saved — press Share for a link."
        except PlaygroundError as e:
            gr.Warning(f"could not save the session: {e}")
            return None, f" (not saved: {e})"

    def _last_frame(self, req: "RunRequest", run: "RunStream", stopped: bool, sid: str | None, saved: str,
                    picked: int | None) -> dict[Any, Any]:
        """Done (or Stopped): the lanes complete, the session id, the scrubber, Run enabled."""
        traces = run.traces
        head = "Stopped" if stopped else "Done"
        # A lane that failed makes the whole line red and says which, never a green "Done".
        failed = [str(j + 1) for j, t in enumerate(traces) if (t.get("stats") or {}).get("error")]
        fail = f" Lane{'s' if len(failed) > 1 else ''} {', '.join(failed)} failed (see the lane)." if failed else ""
        # The status names the run as ended: a live-feed answer still on its way (sent before
        # Stop) must not overwrite the final text and stats this frame writes.
        up = self.inspector.result_updates(traces, req.metric, step=None, plots=False, sid=sid,
                                           status=status_html(f"{head} in {time.perf_counter() - run.started:.1f} s."
                                                              f"{fail}{saved}",
                                                              "error" if failed else "ok" if not stopped else "info",
                                                              ended=run.end_mark))
        up[self.ui.sid] = sid  # None when nothing was saved: the previous run's session is not this one
        top = max((visualizers.step_count(t) for t in traces), default=0)
        last = max(top - 1, 0)
        # The scrubber: the last step, or the one the user picked while the run streamed; the
        # chained draw (on_draw) then draws every plot at it.
        up[self.ui.step] = gr.update(minimum=0, maximum=max(top - 1, 1),
                                     value=last if picked is None else min(int(picked), last))
        up.update(self.ui.idle_buttons())
        up[self.ui.notice] = ""
        return up

    def _live_render(self, metric: str) -> Callable[[int, dict[str, Any]], tuple[str, str]]:
        """How the live feed renders a lane (the same HTML the Run frames would carry)."""
        return lambda j, trace: self.inspector.live_lane(j, trace, metric)

    def on_draw(self, traces: list[dict[str, Any]] | None, step: Any, request: gr.Request) -> dict[Any, Any]:
        """Draw every plot of the run that just ended (chained after Run), at scrubber ``step``.

        A scrub or token click that lands while this draws keeps its step: the draw then
        fills only the run plots and the strip. Nothing is drawn while this page's next run
        streams, or when there is nothing to draw.
        """
        page = self.sessions.page(session_key(request))
        if not traces or page.running() is not None:
            page.draw_pending = None
            return {}
        try:
            s = int(step) if step is not None else None
        except (TypeError, ValueError):
            s = None
        up = self.inspector.inspector_updates(list(traces), s)
        if page.running() is not None:  # the page's next run started while this drew
            page.draw_pending = None
            return {}
        if page.take_draw():  # the user picked a step meanwhile: leave the step plots
            keep = {self.ui.progress_plot, self.ui.divergence}
            for ui in self.ui.lanes:
                keep.update([ui.insp_column, ui.run_html, *ui.run_plots])
            up = {c: v for c, v in up.items() if c in keep}
        up.pop(self.ui.step, None)
        return up

    def on_stop(self, token: str | None, request: gr.Request) -> None:
        """Stop the running comparison of this browser session (lanes keep what they made).

        It updates nothing itself: the Run stream notices within one step and shows the
        stopped lanes. (Sharing an output with the streaming event was a suspect in a run
        that never showed its last frame.)
        """
        runner = self.sessions.running_runner(session_key(request))
        by_token = self.sessions.runner_by_token(token)
        for r in {id(x): x for x in (runner, by_token) if x is not None}.values():
            r.cancel()

    def on_share(self, sid: str | None, blind_vote: Any = False, owner_key: Any = None,
                 request: gr.Request = None) -> str:
        """Show the share link of the current session. With *Blind vote* ticked the session is
        marked blind (its owner only) and the link is its vote page's; unticked, a blind session
        of the caller's is opened again (its ballots stay) and the link replays it."""
        if self.sessions.running_runner(session_key(request)) is not None:
            gr.Warning("the comparison is still running: press Share once it is done (or stopped)")
            return ""
        if not sid:
            gr.Warning("Run a comparison (or open a session) first: there is nothing to share yet.")
            return ""
        wanted = blind_vote is True
        try:
            store = default_store()
            if wanted:
                store.set_blind(str(sid), True, owned_by=change_filter(owner_key))
            elif blind.is_blind(store.load_session(str(sid))):
                store.set_blind(str(sid), False, owned_by=change_filter(owner_key))
        except PlaygroundError as e:
            gr.Warning(str(e))
            return ""
        return vote_url(root_url(request), str(sid)) if wanted else st.share_url(root_url(request), str(sid))


# ---------------------------------------------------------------------- the model work
def _page_race_impl(model: str, prompt: str, seed: int, max_new_tokens: int, policy: str,
                    lanes: list[st.LaneConfig], page: PageSession,
                    watch: list[int | str] | None = None) -> Iterator[tuple[str, Any]]:
    """Start the comparison's worker and stream its snapshots at the page's cadence; every
    lane watches the tokens ``watch`` names (``playground/watch.py``).

    Yields ("runner", runner) once, then ("snapshots", [trace dict per lane]) at most
    ``STREAM_RATE`` times per second while something changed, and a final one. Raises
    :class:`Busy` when this page already runs a comparison, and PlaygroundError
    when no lane could start, all for the same page-level reason.
    """
    runner = Runner([Lane(label=cfg.decoder, prepare=_preparer(cfg, model, prompt, seed, max_new_tokens, watch),
                          stub=pending_trace(cfg.decoder, cfg.model or model, prompt, cfg.params, seed))
                     for cfg in lanes], policy=policy, rate=FLOOR_RATE if STREAM_RATE > 0 else 0)
    key = page.key
    page.claim(runner)
    try:
        runner.start(name=f"playground-compare-{key[:12]}")
        yield "runner", runner
        period = 1.0 / STREAM_RATE if STREAM_RATE > 0 else 0.0
        version = 0
        while not runner.finished:
            if not runner.wait(version, timeout=1.0):
                continue
            version, snaps = runner.latest()
            shown_at = time.monotonic()
            yield "snapshots", snaps
            rest = period - (time.monotonic() - shown_at)
            if rest > 0:
                runner.join(rest)  # the page's cadence; the worker decodes on meanwhile
        _version, snaps = runner.latest()
        failed = [lane.error for lane in runner.lanes if lane.run is None and lane.error]
        if failed and len(failed) == len(runner.lanes) and len(set(failed)) == 1:
            raise PlaygroundError(failed[0])
        yield "snapshots", snaps
    finally:
        runner.cancel()  # a closed stream (browser gone) must not leave lanes running
        if not runner.join(JOIN_S):
            log.warning("the comparison worker of %s did not end within %.0f s of Stop", key, JOIN_S)
        page.release(runner)


def _preparer(cfg: st.LaneConfig, model: str, prompt: str, seed: int, max_new_tokens: int,
              watch: list[int | str] | None = None) -> Callable[[], Any]:
    """A callable that builds lane ``cfg``'s run (in the lane's own preparation thread)."""
    def build() -> Any:
        # lane_request refuses a knob out of range or a missing draft: that lane fails, not the page
        return prepare(**st.lane_request(cfg, model, prompt, seed, max_new_tokens, watch=watch))

    return build


# ZeroGPU wants its functions decorated when the app starts, not per request.
page_race = gpu(_page_race_impl)


def _check_models_allowed() -> None:
    if limits().no_models:
        raise PlaygroundError("model loading is disabled on this instance (replay only): open a shared session instead")


def root_url(request: Any) -> str:
    """The public URL of the app, from the request that pressed Share."""
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
