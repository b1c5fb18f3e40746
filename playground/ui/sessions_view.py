"""The Sessions tab: stored comparisons — list, open, rename, delete, export and import — and
the replay of a stored session (a share link or *Open in Compare*).

Every finished or stopped comparison is saved by the Compare page; this view works on the
store (``playground.store``) only, so it needs no model. Opening a session replays it in the
Compare tab, exactly as a share link does.

Branches (``playground/branching.py``) are listed under their parent, with where they branched
off. A one-lane branch is stored beside its parent (its runs: the parent's lane, then the
branched lane), so opening it shows both with the divergence strip marking where they part;
the replay labels the two lanes and puts the scrubber on the forced step.

A replay comes in two frames, so the text is on screen before any figure is built:
:func:`replay_frame` (configuration, every lane's text, colours and stats, the scrubber, the
inspector headers and the divergence strip; no figure), then :func:`replay_plots` (the comparison
strip's figures and every lane's step and run plots), chained after it (:func:`chain_replay`).
Measured on a stored five-lane showdown (20 plots), headless Chromium and the app sharing a
2-core machine that other jobs kept at load 6-13, navigation start to text shown / every plot
drawn, two replays per batch: this split 4.4/19.7, 3.9/18.2, 6.8/39.8, 3.5/11.8 s; one frame
with every plot (before) 10.0/19.0, 6.6/24.5, 4.5/10.8, 4.1/8.6 s — within the noise of that
machine, no clear win either way. The server builds the figures in about 1.3 s (the first frame
in about 30 ms); the rest is the browser drawing 20 plotly figures. Three frames (step plots,
then run plots) were clearly worse (first plots after 22-50 s): each frame costs the page a
large fixed amount of work.
"""

from __future__ import annotations

import re
from typing import Any

import gradio as gr

import visualizers
from playground.core.errors import PlaygroundError
from playground.ownership import NOBODY, change_filter, may_read_in_tab, one_user, owner_id
from playground.ui import state as st
from playground.ui.compare import ComparePage, private_events
from playground.ui.exports import ExportLinks
from playground.ui.events import nothing_is_skip
from playground.ui.html import esc, md_text, status_html
from playground.ui.page_session import PageSession, session_key

HEADERS = ["Title", "Model", "Decoders", "Created (UTC)", "Id"]
# relative to the page: the app's own route (page_routes.export_route)
EXPORT_ROUTE = "playground_api/export"
BRANCH_MARK = "↳ "
INDENT = "\u2003"  # an em space per level: the table collapses ordinary spaces


def visible_sessions(owner_key: Any = None, open_sid: Any = None) -> list[dict[str, Any]]:
    """The sessions the Sessions tab lists for a caller: every one for one user; on a hosted
    instance the caller's own and the one open in their page (:mod:`playground.ownership`)."""
    from playground.store import default_store

    store = default_store()
    if one_user():
        return store.list_sessions()
    who = owner_id(owner_key)
    also = (open_sid,) if isinstance(open_sid, str) else ()
    return store.list_sessions(owned_by=who or NOBODY, also=also)


def session_rows(owner_key: Any = None, open_sid: Any = None) -> list[list[str]]:
    """The listed sessions as table rows: sessions newest first, each followed by its branches
    (oldest first, nested), a branch's title saying where it branched off."""
    return tree_rows(visible_sessions(owner_key, open_sid))


def tree_rows(sessions: list[dict[str, Any]]) -> list[list[str]]:
    """Rows of :data:`HEADERS` for ``sessions`` (``Store.list_sessions``, newest first), every
    branch listed under its parent; a branch whose parent was deleted is listed on its own."""
    by_id = {s["id"]: s for s in sessions}
    kids: dict[str, list[dict[str, Any]]] = {}
    roots = []
    for s in sessions:
        if s.get("parent") in by_id and s.get("parent") != s["id"]:
            kids.setdefault(s["parent"], []).append(s)
        else:
            roots.append(s)
    rows: list[list[str]] = []
    seen: set[str] = set()

    def add(s: dict[str, Any], depth: int) -> None:
        if s["id"] in seen:  # a cycle cannot be stored, but a listing must end regardless
            return
        seen.add(s["id"])
        title = s["title"]
        if s.get("branch") is not None:
            parent = by_id.get(s.get("parent") or "")
            title = (INDENT * max(depth - 1, 0) + BRANCH_MARK + title + " — "
                     + branch_line(s["branch"], parent["title"] if parent else None))
        rows.append([title, s["model"], ", ".join(s["decoders"]), str(s["created"])[:19].replace("T", " "), s["id"]])
        for k in reversed(kids.get(s["id"], [])):  # listed newest first; branches read oldest first
            add(k, depth + 1)

    for s in roots:
        add(s, 0)
    for s in sessions:  # only a cycle leaves one out: list it rather than lose it
        if s["id"] not in seen:
            add(s, 0)
    return rows


def branch_line(branch: dict[str, Any], parent_title: str | None) -> str:
    """Where a branch branched off, in words: ``branch of “P”, lane 2, step 5, forced ' the'``."""
    of = f"branch of “{parent_title}”" if parent_title is not None else "branch of a deleted session"
    lane, step = int(branch.get("lane", 0)) + 1, int(branch.get("step", 0))
    token = f"'{branch['text']}'" if isinstance(branch.get("text"), str) else f"token #{branch.get('token')}"
    if branch.get("lanes") == "all":
        return f"{of}: every lane from lane {lane}, step {step}, forced {token}"
    return f"{of}, lane {lane}, step {step}, forced {token}"


# ---------------------------------------------------------------------- replay
def replay_frame(page: ComparePage, sid: Any, request: Any = None, clear: bool = False) -> dict[Any, Any]:
    """The first frame of a replay: configuration, every lane's text, colours and stats, the
    scrubber and the divergence strip; no figure (:func:`replay_plots` follows). With ``clear`` (a page that may show another comparison's
    plots) the plot slots are hidden until then; a fresh page's slots are empty, and hiding them
    only to show them again made the browser slower to draw. A branch's lanes are labelled and
    the scrubber is put on the forced step. A bad id is the default page with a one-line message."""
    from playground.store import default_store
    from playground.ui.inspector import insp_header

    try:
        session = default_store().load_session(str(sid))
    except PlaygroundError as e:
        up = page.default_page()
        msg = f"Could not open the shared session: {e}."
        gr.Warning(msg)
        up[page.status] = status_html(msg, "error")
        return up
    pg = st.session_page(session)
    runs = pg["runs"]
    up = page.config_updates(pg)
    when = f"{session['created'][:16].replace('T', ' ')} UTC"
    up[page.preset_info] = md_text(f"Replaying stored session **{st._md_escape(session['title'])}** "
                                   f"({when}) — no model loaded.")
    status = (f"Replaying “{session['title']}”: {len(runs)} lanes, stored {session['created'][:10]}. "
              "Press Run to run it again.")
    up.update(page.result_updates(runs, pg["metric"], plots=False, sid=session["id"], status=None))
    up.update(page.idle_buttons())
    up[page.share_link] = ""
    counts = [visualizers.step_count(t) for t in runs]
    top = max(counts, default=0)
    step = max(top - 1, 0)
    branch = session.get("branch")
    if branch is not None:
        up.update(_branch_labels(page, session, runs))
        status = f"{status} {_branch_status(session)}"
        if branch.get("lanes") != "all" and len(runs) == 2:
            step = min(int(branch.get("step", step)), step)  # the forced step: where the two part
    up[page.status] = status_html(status, "ok")
    up[page.step] = gr.update(minimum=0, maximum=max(top - 1, 1), value=step)
    up[page.divergence] = visualizers.divergence_html(runs)
    for j, ui in enumerate(page.lanes):
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
    ps = _page_session(page, request)
    if ps is not None:
        # this page's plots are being drawn: a scrub or token click meanwhile keeps its step
        ps.draw_pending = False
    return up


def replay_step_plots(page: ComparePage, traces: list[dict[str, Any]] | None, step: Any,
                      request: Any = None) -> dict[Any, Any]:
    """The step half of a replay's plot frame: the comparison strip's figures and every lane's
    plots at scrubber ``step`` (a step the user picked meanwhile keeps its plots). Nothing while this
    page runs a comparison, or without traces."""
    traces = list(traces or [])
    if not traces or _running(page, request):
        return {}
    try:
        s = int(step) if step is not None else None
    except (TypeError, ValueError):
        s = None
    up: dict[Any, Any] = {page.progress_plot: visualizers.progress_figure(traces)}
    for comp, (_title, fn) in zip(getattr(page, "compare_plots", []) or [], getattr(visualizers, "COMPARE_PLOTS", [])):
        up[comp] = fn(traces)
    ps = _page_session(page, request)
    if not (ps is not None and ps.take_draw()):
        up.update(page.step_updates(traces, s if s is not None else 0))
        up.pop(page.step, None)  # the scrubber is the user's: frame one put it in place
        for ui in page.lanes:  # frame one showed the columns: sending their visibility again
            up.pop(ui.insp_column, None)  # re-renders them, and the browser drew the plots slower
    return up


def replay_run_plots(page: ComparePage, traces: list[dict[str, Any]] | None, request: Any = None) -> dict[Any, Any]:
    """The run half of a replay's plot frame: every lane's whole-run plots."""
    from playground.ui.inspector import slot_updates

    traces = list(traces or [])
    if not traces or _running(page, request):
        return {}
    up: dict[Any, Any] = {}
    for j, ui in enumerate(page.lanes[: len(traces)]):
        up.update(slot_updates(ui.run_html, ui.run_plots, visualizers.run_figures(traces[j])))
    return up


def step_plot_outputs(page: ComparePage) -> list[Any]:
    """What :func:`replay_step_plots` writes."""
    out: list[Any] = [page.progress_plot, *(getattr(page, "compare_plots", []) or [])]
    for ui in page.lanes:
        out += [ui.insp_header, ui.step_html, *ui.step_plots]
    return out


def run_plot_outputs(page: ComparePage) -> list[Any]:
    """What :func:`replay_run_plots` writes."""
    out: list[Any] = []
    for ui in page.lanes:
        out += [ui.run_html, *ui.run_plots]
    return out


def replay_plots(page: ComparePage, traces: list[dict[str, Any]] | None, step: Any,
                 request: Any = None) -> dict[Any, Any]:
    """The second frame of a replay: every plot (:func:`replay_step_plots` and
    :func:`replay_run_plots` together)."""
    return {**replay_step_plots(page, traces, step, request), **replay_run_plots(page, traces, request)}


def chain_replay(page: ComparePage, event: Any) -> Any:
    """Chain the plot frame of a replay after ``event`` (whose handler returned
    :func:`replay_frame`); returns the chained event.

    One frame for every plot, not one for the step plots and another for the run plots: in
    Chromium each frame costs the page a large fixed amount of work, and the split page drew its
    first plots later than the unsplit one drew all of them (measured, see the module docstring).
    """

    def plots(traces: list[dict[str, Any]] | None, step: Any, request: gr.Request) -> dict[Any, Any]:
        return replay_plots(page, traces, step, request)

    return event.then(nothing_is_skip(plots), [page.traces, page.step], step_plot_outputs(page) + run_plot_outputs(page),
                      show_progress="hidden")


def _branch_labels(page: ComparePage, session: dict[str, Any], runs: list[dict[str, Any]]) -> dict[Any, Any]:
    """Each lane's role in a branch, above its stats: the parent's lane, or the branch."""
    from playground.ui.html import stats_html

    b = session["branch"]
    forced = f"'{b['text']}'" if isinstance(b.get("text"), str) else f"token #{b.get('token')}"
    if b.get("lanes") != "all" and len(runs) == 2:
        roles = [f"parent · its lane {int(b['lane']) + 1}, as stored",
                 f"branch · forced {forced} at step {b['step']} (position {b['position']})"]
    else:
        roles = [f"branch · from lane {int(b['lane']) + 1}'s prefix, forced {forced} at position {b['position']}"
                 for _ in runs]
    up: dict[Any, Any] = {}
    for j, ui in enumerate(page.lanes[: len(runs)]):
        role = f'<div class="lane-info lane-role" data-role="{roles[j].split(" ")[0]}"><b>{esc(roles[j])}</b></div>'
        up[ui.stats] = role + stats_html(visualizers.stats_line(runs[j]))
    return up


def _branch_status(session: dict[str, Any]) -> str:
    """The status line's account of a branch: of which session, where it parted."""
    from playground.store import default_store

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


def _page_session(page: ComparePage, request: Any) -> PageSession | None:
    """The page session of ``request`` (None when called without one, as tests and scripts do)."""
    return page.sessions.page(session_key(request)) if request is not None else None


def _running(page: ComparePage, request: Any) -> bool:
    ps = _page_session(page, request)
    return ps is not None and ps.running() is not None


def _safe_filename(title: str) -> str:
    # letters of any script stay (a French or Japanese title keeps its name); anything a file
    # system or a Content-Disposition header could misread becomes a dash
    stem = re.sub(r"[^\w.-]+", "-", title).strip("-._")[:60] or "session"
    return f"{stem}.json"


class SessionsView:
    """Builds the Sessions tab and wires it to the Compare page.

    Every handler takes the caller's owner key and the session open in their page, and looks
    sessions up on the server: the row a click selects is read from the listing this page was
    sent (kept server-side), never from the table the browser sends back, and rename, delete
    and export are checked against the session's owner (:mod:`playground.ownership`)."""

    def __init__(self, page: ComparePage, tabs: Any) -> None:
        self.page, self.tabs = page, tabs
        self.exports = ExportLinks()

    def build(self) -> None:
        """Create the components (call inside the Sessions tab)."""
        gr.Markdown(_intro(), elem_classes=["lane-info"])
        with gr.Row(equal_height=True):
            self.refresh = gr.Button("↻ Refresh", elem_id="sessions-refresh", size="md", scale=1)
            self.import_btn = gr.UploadButton("⇪ Import JSON…", file_types=[".json"], type="binary",
                                              elem_id="session-import", size="md", scale=1)
            self.status = gr.HTML("", elem_id="sessions-status")
        self.table = gr.Dataframe(value=[], headers=HEADERS, datatype="str", interactive=False, wrap=True,
                                  elem_id="sessions-table", column_widths=["30%", "16%", "26%", "14%", "14%"],
                                  max_height=420)
        self.listed = gr.State([])  # the ids of the rows this page was sent, in row order
        self.selected = gr.State(None)
        with gr.Row(equal_height=True):
            self.selected_label = gr.HTML('<div class="lane-info">no session selected</div>', elem_id="session-selected")
        with gr.Row(equal_height=True):
            self.open_btn = gr.Button("Open in Compare", variant="primary", elem_id="session-open", scale=1)
            self.title = gr.Textbox(label="Title", elem_id="session-title", scale=3, max_lines=1)
            self.rename_btn = gr.Button("Rename", elem_id="session-rename", scale=1)
            self.delete_btn = gr.Button("Delete", variant="stop", elem_id="session-delete", scale=1)
            self.export_btn = gr.Button("Export JSON", elem_id="session-export", scale=1)
        # a download link to the page's export route: the export streams from the store, no file
        self.export_file = gr.HTML("", elem_id="session-export-file", visible=False)

    def wire(self, demo: gr.Blocks, tab: Any) -> None:
        """Attach the events, hidden from the public API; ``tab`` is the Sessions tab (refreshed
        when selected)."""
        with private_events(demo):
            self._wire(demo, tab)

    def _wire(self, demo: gr.Blocks, tab: Any) -> None:
        who = [self.page.owner_key, self.page.sid]
        listing = [self.table, self.listed, self.status]
        self.refresh.click(self.on_refresh, who, listing)
        tab.select(self.on_refresh, who, listing)
        self.table.select(self.on_select, [self.listed, *who], [self.selected, self.title, self.selected_label])
        self.rename_btn.click(self.on_rename, [self.selected, self.title, *who], listing)
        self.delete_btn.click(self.on_delete, [self.selected, *who], listing + [self.selected, self.title,
                                                                                self.selected_label])
        self.export_btn.click(self.on_export, [self.selected, *who], [self.export_file, self.status])
        self.import_btn.upload(self.on_import, [self.import_btn, *who], listing)
        opened = self.open_btn.click(self.on_open, [self.selected], self.page.page_outputs() + [self.tabs, self.status])
        chain_replay(self.page, opened)

    # ---------------------------------------------------------------- handlers
    def _listing(self, owner_key: Any, open_sid: Any, note: str, kind: str = "info") -> list[Any]:
        """The table, the ids behind its rows and a status line."""
        rows = session_rows(owner_key, open_sid)
        n = len(rows)
        line = note or f"{n} stored session{'s' if n != 1 else ''}" + ("." if one_user() else " made in this browser or open in it.")
        return [rows, [r[4] for r in rows], status_html(line, kind)]

    def on_refresh(self, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """Reload the list."""
        try:
            return self._listing(owner_key, open_sid, "")
        except PlaygroundError as e:
            return [gr.skip(), gr.skip(), status_html(str(e), "error")]

    def on_select(self, listed: Any, owner_key: Any = None, open_sid: Any = None,
                  evt: gr.SelectData = None) -> list[Any]:
        """A row was clicked: take its session id from the listing this page was sent."""
        from playground.store import default_store

        nothing = [None, "", '<div class="lane-info">no session selected</div>']
        try:
            row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
            sid = list(listed or [])[int(row)]
        except (IndexError, TypeError, ValueError, AttributeError):
            return nothing
        try:  # a branch's cell says where it branched off: the title box gets the title alone
            store = default_store()
            if not may_read_in_tab(store.session_owner(sid), owner_key, open_sid, sid):
                return nothing
            title = store.session_summary(str(sid))["title"]
        except PlaygroundError:
            return nothing
        return [sid, title, f'<div class="lane-info">selected: <b>{_esc(title)}</b></div>']

    def on_rename(self, sid: Any, title: Any, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """Rename the selected session (its owner only, on a hosted instance)."""
        from playground.store import default_store

        if not sid:
            return self._warn("select a session first")
        try:
            default_store().rename_session(str(sid), title if isinstance(title, str) else "",
                                           owned_by=change_filter(owner_key))
            return self._listing(owner_key, open_sid, "Renamed.", "ok")
        except PlaygroundError as e:
            return self._warn(str(e))

    def on_delete(self, sid: Any, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """Delete the selected session (its owner only, on a hosted instance)."""
        from playground.store import default_store

        keep = [gr.skip(), gr.skip(), gr.skip()]
        if not sid:
            return self._warn("select a session first") + keep
        try:
            default_store().delete_session(str(sid), owned_by=change_filter(owner_key))
            return self._listing(owner_key, open_sid, "Deleted.", "ok") + [
                None, "", '<div class="lane-info">no session selected</div>']
        except PlaygroundError as e:
            return self._warn(str(e)) + keep

    def on_export(self, sid: Any, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """A download link for the selected session's export (streamed from the store when
        clicked, for the next ten minutes; nothing is written to disk)."""
        from playground.store import default_store

        def refuse(msg: str) -> list[Any]:
            gr.Warning(msg)
            return [gr.update(visible=False), status_html(msg, "error")]

        if not sid:
            return refuse("select a session first")
        try:
            store = default_store()
            if not may_read_in_tab(store.session_owner(str(sid)), owner_key, open_sid, str(sid)):
                raise PlaygroundError("only sessions made in this browser, or open in it, can be exported here")
            title = store.session_summary(str(sid))["title"]
        except PlaygroundError as e:
            return refuse(str(e))
        name = _safe_filename(title or "session")
        token = self.exports.issue(str(sid), name)
        link = (f'<a class="pg-export-link" href="{EXPORT_ROUTE}/{token}" download="{esc(name)}">'
                f'⇩ Download {esc(name)}</a>')
        return [gr.update(value=link, visible=True), status_html("Exported — download the file below.", "ok")]

    def on_import(self, data: Any, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """Store an uploaded export as a new session of this browser's (validated; nothing
        changes on error)."""
        from playground.store import default_store

        if not data or not isinstance(data, (bytes, bytearray)):
            return self._warn("no file received")
        try:
            sid = default_store().import_session(bytes(data), owner=owner_id(owner_key))
        except PlaygroundError as e:
            return self._warn(f"import refused: {e}")
        listing = self._listing(owner_key, open_sid, "")
        title = next((r[0] for r in listing[0] if r[4] == sid), sid)
        listing[2] = status_html(f"Imported “{title}”.", "ok")
        return listing

    def on_open(self, sid: str | None, request: gr.Request = None) -> dict[Any, Any]:
        """Open the selected session in the Compare tab: its text first (:func:`replay_frame`);
        the plots follow in the chained frame."""
        if not sid:
            gr.Warning("select a session first")
            return {self.status: status_html("select a session first", "error")}
        up = replay_frame(self.page, sid, request, clear=True)
        up[self.tabs] = gr.Tabs(selected="compare")
        up[self.status] = status_html("Opened in the Compare tab.", "ok")
        return up

    def _warn(self, msg: str) -> list[Any]:
        gr.Warning(msg)
        return [gr.skip(), gr.skip(), status_html(msg, "error")]


def _intro() -> str:
    if one_user():
        return ("Every finished or stopped comparison is saved here. Select a row, then open, rename, "
                "delete or export it; import a JSON export from another machine.")
    return ("The comparisons made in this browser are saved here, with the one open in the Compare tab. "
            "Select a row, then open, rename, delete or export it (your own sessions only); a share link "
            "shows a session to anyone, read-only.")


def _esc(text: Any) -> str:
    import html

    return html.escape(str(text))
