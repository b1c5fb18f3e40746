"""Opening a stored session in the Compare page (a share link, *Open in Compare*, a study's
prompt, a finished branch), in two frames so the text is on screen before any figure is built.

:meth:`ReplayHandlers.frame` shows the configuration, every lane's text, colours and stats, the
scrubber, the inspector headers and the divergence strip (no figure); :meth:`ReplayHandlers.plots`
follows with the comparison strip's figures and every lane's step and run plots (see
:mod:`playground.ui.sessions_view` for the measurements behind the split). A branch's lanes are
labelled and the scrubber put on the forced step.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

import playground.ui.rules as st
import visualizers
from playground import blind
from playground.core.errors import PlaygroundError
from playground.store import default_store
from playground.ui.html import esc, md_text, stats_html, status_html
from playground.ui.inspector import InspectorHandlers
from playground.ui.lane_config import LaneHandlers
from playground.ui.layout import Layout
from playground.ui.page_js import page_js
from playground.ui.page_session import PageSession, PageSessions, session_key
from playground.ui.updates import insp_header, slot_updates


# Installed before the first figure arrives: holds each plot's first drawing until it is in view.
LAZY_PLOTS_JS = page_js("lazy_plots.js")


def branch_line(branch: dict[str, Any], parent_title: str | None) -> str:
    """Where a branch branched off, in words: ``branch of “P”, lane 2, step 5, forced ' the'``."""
    of = f"branch of “{parent_title}”" if parent_title is not None else "branch of a deleted session"
    lane, step = int(branch.get("lane", 0)) + 1, int(branch.get("step", 0))
    token = f"'{branch['text']}'" if isinstance(branch.get("text"), str) else f"token #{branch.get('token')}"
    if branch.get("lanes") == "all":
        return f"{of}: every lane from lane {lane}, step {step}, forced {token}"
    return f"{of}, lane {lane}, step {step}, forced {token}"


class ReplayHandlers:
    """Replays over the page's components ``ui``: ``config`` shows a stored configuration,
    ``inspector`` its results; ``sessions`` keeps a step the user picks while the plots are drawn."""

    def __init__(self, ui: Layout, sessions: PageSessions, config: LaneHandlers,
                 inspector: InspectorHandlers) -> None:
        self.ui, self.sessions, self.config, self.inspector = ui, sessions, config, inspector

    def wire_load(self, demo: gr.Blocks) -> None:
        """Attach the page load: the default page, or the shared session the link names."""
        # A shared session opens in one frame, text and plots together: in a page still being
        # built, a second frame cost Chromium more than it saved (measured: every plot drawn
        # 8.4-12.2 s after navigation in one frame, 12.4-13.5 s in two, the text ~0.5 s sooner).
        demo.load(self.on_load, None, self.ui.page_outputs(), show_progress="hidden")
        # Each plot is drawn when it comes into view (lazy_plots.js): the frame above carries
        # every figure, but drawing them all cost ~200 ms of the browser's time each, and a
        # showdown's 26 sit below the fold.
        demo.load(None, None, None, js=LAZY_PLOTS_JS)

    def on_load(self, request: gr.Request) -> dict[Any, Any]:
        """Page load: replay ``?session=<id>`` if given, else show the default preset."""
        params = dict(getattr(request, "query_params", {}) or {}) if request is not None else {}
        sid = params.get("session")
        if sid is not None:
            first = self.frame(sid, request)
            if not first.get(self.ui.traces):  # a bad id: the frame says why
                return first
            return {**first, **self.plots(first[self.ui.traces], first[self.ui.step]["value"], request)}
        return self.config.default_page()

    def frame(self, sid: Any, request: Any = None, clear: bool = False, key: Any = None) -> dict[Any, Any]:
        """The first frame of a replay: configuration, every lane's text, colours and stats, the
        scrubber and the divergence strip; no figure (:meth:`plots` follows). With ``clear`` (a
        page that may show another comparison's plots) the plot slots are hidden until then; a
        fresh page's slots are empty, and hiding them only to show them again made the browser
        slower to draw. A branch's lanes are labelled and the scrubber is put on the forced step.
        A bad id is the default page with a one-line message, and so is a blind comparison
        (:mod:`playground.blind`) unless ``key`` is its owner's: a share link's page load has no key.
        """
        try:
            session = default_store().load_session(str(sid))
            blind.check_readable(default_store(), session["id"], key)
        except PlaygroundError as e:
            up = self.config.default_page()
            msg = f"Could not open the shared session: {e}."
            gr.Warning(msg)
            up[self.ui.status] = status_html(msg, "error")
            return up
        pg = st.session_page(session)
        runs = pg["runs"]
        up = self.config.config_updates(pg)
        when = f"{session['created'][:16].replace('T', ' ')} UTC"
        up[self.ui.preset_info] = md_text(f"Replaying stored session **{st._md_escape(session['title'])}** "
                                          f"({when}) — no model loaded.")
        status = (f"Replaying “{session['title']}”: {len(runs)} lanes, stored {session['created'][:10]}. "
                  "Press Run to run it again.")
        up.update(self.inspector.result_updates(runs, pg["metric"], plots=False, sid=session["id"], status=None))
        up.update(self.ui.idle_buttons())
        up[self.ui.share_link] = ""
        up[self.ui.blind] = blind.is_blind(session)  # only its owner gets this far with a blind one
        counts = [visualizers.step_count(t) for t in runs]
        top = max(counts, default=0)
        step = max(top - 1, 0)
        branch = session.get("branch")
        if branch is not None:
            up.update(self._branch_labels(session, runs))
            status = f"{status} {self._branch_status(session)}"
            if branch.get("lanes") != "all" and len(runs) == 2:
                step = min(int(branch.get("step", step)), step)  # the forced step: where the two part
        up[self.ui.status] = status_html(status, "ok")
        up[self.ui.step] = gr.update(minimum=0, maximum=max(top - 1, 1), value=step)
        up[self.ui.divergence] = visualizers.divergence_html(runs)
        for j, ui in enumerate(self.ui.lanes):
            if j >= len(runs):
                up[ui.insp_column] = gr.update(visible=False)
                continue
            up[ui.insp_column] = gr.update(visible=True)
            # the header the drawn inspector will have: nothing on the page changes but the plots
            up[ui.insp_header] = insp_header(ui.k, runs[j], min(step, max(counts[j] - 1, 0)), counts[j])
            if clear:
                up[ui.step_html] = gr.update(visible=False)
                up[ui.run_html] = gr.update(visible=False)
                for comp in [*ui.step_plots, *ui.run_plots]:
                    up[comp] = gr.update(visible=False)
        ps = self._page_session(request)
        if ps is not None:
            # this page's plots are being drawn: a scrub or token click meanwhile keeps its step
            ps.draw_pending = False
        return up

    def step_plots(self, traces: list[dict[str, Any]] | None, step: Any,
                   request: Any = None) -> dict[Any, Any]:
        """The step half of a replay's plot frame: the comparison strip's figures and every lane's
        plots at scrubber ``step`` (a step the user picked meanwhile keeps its plots). Nothing while this
        page runs a comparison, or without traces."""
        traces = list(traces or [])
        if not traces or self._running(request):
            return {}
        try:
            s = int(step) if step is not None else None
        except (TypeError, ValueError):
            s = None
        up: dict[Any, Any] = {self.ui.progress_plot: visualizers.progress_figure(traces)}
        for comp, (_title, fn) in zip(self.ui.compare_plots, visualizers.COMPARE_PLOTS):
            up[comp] = fn(traces)
        ps = self._page_session(request)
        if not (ps is not None and ps.take_draw()):
            up.update(self.inspector.step_updates(traces, s if s is not None else 0))
            up.pop(self.ui.step, None)  # the scrubber is the user's: frame one put it in place
            for ui in self.ui.lanes:  # frame one showed the columns: sending their visibility again
                up.pop(ui.insp_column, None)  # re-renders them, and the browser drew the plots slower
        return up

    def run_plots(self, traces: list[dict[str, Any]] | None, request: Any = None) -> dict[Any, Any]:
        """The run half of a replay's plot frame: every lane's whole-run plots."""
        traces = list(traces or [])
        if not traces or self._running(request):
            return {}
        up: dict[Any, Any] = {}
        for j, ui in enumerate(self.ui.lanes[: len(traces)]):
            up.update(slot_updates(ui.run_html, ui.run_plots, visualizers.run_figures(traces[j])))
        return up

    def step_plot_outputs(self) -> list[Any]:
        """What :meth:`step_plots` writes."""
        out: list[Any] = [self.ui.progress_plot, *self.ui.compare_plots]
        for ui in self.ui.lanes:
            out += [ui.insp_header, ui.step_html, *ui.step_plots]
        return out

    def run_plot_outputs(self) -> list[Any]:
        """What :meth:`run_plots` writes."""
        out: list[Any] = []
        for ui in self.ui.lanes:
            out += [ui.run_html, *ui.run_plots]
        return out

    def plots(self, traces: list[dict[str, Any]] | None, step: Any,
              request: Any = None) -> dict[Any, Any]:
        """The second frame of a replay: every plot (:meth:`step_plots` and :meth:`run_plots`
        together)."""
        return {**self.step_plots(traces, step, request), **self.run_plots(traces, request)}

    def _branch_labels(self, session: dict[str, Any], runs: list[dict[str, Any]]) -> dict[Any, Any]:
        """Each lane's role in a branch, above its stats: the parent's lane, or the branch."""
        b = session["branch"]
        forced = f"'{b['text']}'" if isinstance(b.get("text"), str) else f"token #{b.get('token')}"
        if b.get("lanes") != "all" and len(runs) == 2:
            roles = [f"parent · its lane {int(b['lane']) + 1}, as stored",
                     f"branch · forced {forced} at step {b['step']} (position {b['position']})"]
        else:
            roles = [f"branch · from lane {int(b['lane']) + 1}'s prefix, forced {forced} at position {b['position']}"
                     for _ in runs]
        up: dict[Any, Any] = {}
        for j, ui in enumerate(self.ui.lanes[: len(runs)]):
            role = f'<div class="lane-info lane-role" data-role="{roles[j].split(" ")[0]}"><b>{esc(roles[j])}</b></div>'
            up[ui.stats] = role + stats_html(visualizers.stats_line(runs[j]))
        return up

    def _branch_status(self, session: dict[str, Any]) -> str:
        """The status line's account of a branch: of which session, where it parted."""
        b, parent = session["branch"], session.get("parent")
        title = None
        if parent:
            try:
                title = default_store().session_summary(parent)["title"]
            except PlaygroundError:
                title = None
        line = branch_line(b, title)
        if b.get("lanes") != "all" and len(session.get("runs") or []) == 2:
            return f"This is a {line[0].lower()}{line[1:]}: lane 1 is the parent's lane, lane 2 the branch; the strip marks where they part."
        return f"This is a {line[0].lower()}{line[1:]}."

    def _page_session(self, request: Any) -> PageSession | None:
        """The page session of ``request`` (None when called without one, as tests and scripts do)."""
        return self.sessions.page(session_key(request)) if request is not None else None

    def _running(self, request: Any) -> bool:
        ps = self._page_session(request)
        return ps is not None and ps.running() is not None
