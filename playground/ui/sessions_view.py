"""The Sessions tab: stored comparisons — list, open, rename, delete, export and import — and
the replay of a stored session (a share link or *Open in Compare*).

Every finished or stopped comparison is saved by the Compare page (not one where every lane
failed); this view works on the store (``playground.store``) only, so it needs no model.
Opening a session replays it in the Compare tab, exactly as a share link does. The list marks
how a run ended after its title ("[stopped]", "[lane 2 failed]", :func:`outcome_mark`), so
equal titles are told apart; Delete takes two presses (the first asks, on the page itself: no
browser dialog), and Rename updates the "selected:" line.

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

import html
import re
import unicodedata
from typing import Any

import gradio as gr

import playground.ui.rules as st
import visualizers
from playground import blind
from playground.core.errors import PlaygroundError
from playground.ownership import NOBODY, change_filter, may_read_in_tab, one_user, owner_id
from playground.store import default_store
from playground.ui.compare import ComparePage
from playground.ui.events import nothing_is_skip
from playground.ui.exports import ExportLinks
from playground.ui.html import esc, md_text, status_html
from playground.ui.replay import branch_line


HEADERS = ["Title", "Model", "Decoders", "Created (UTC)", "Id"]
# relative to the page: the app's own route (page_routes.export_route)
EXPORT_ROUTE = "playground_api/export"
BRANCH_MARK = "↳ "
INDENT = "\u2003"  # an em space per level: the table collapses ordinary spaces
DELETE_LABEL = "Delete"
CONFIRM_LABEL = "Confirm delete"
BLIND_MARK = "(blind vote: decoders hidden)"
NO_SELECTION = '<div class="lane-info">no session selected</div>'


def visible_sessions(owner_key: Any = None, open_sid: Any = None) -> list[dict[str, Any]]:
    """The sessions the Sessions tab lists for a caller: every one for one user; on a hosted
    instance the caller's own and the one open in their page (:mod:`playground.ownership`).
    A blind comparison that is not the caller's lists no decoders (:mod:`playground.blind`)."""
    store = default_store()
    who = owner_id(owner_key)
    if one_user():
        listed = store.list_sessions()
    else:
        also = (open_sid,) if isinstance(open_sid, str) else ()
        listed = store.list_sessions(owned_by=who or NOBODY, also=also)
    return [{**s, "decoders": [BLIND_MARK]} if s.get("blind") and (who is None or s.get("owner") != who) else s
            for s in listed]


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
        mark = outcome_mark(s)
        rows.append([f"{title} [{mark}]" if mark else title, s["model"], ", ".join(s["decoders"]),
                     str(s["created"])[:19].replace("T", " "), s["id"]])
        for k in reversed(kids.get(s["id"], [])):  # listed newest first; branches read oldest first
            add(k, depth + 1)

    for s in roots:
        add(s, 0)
    for s in sessions:  # only a cycle leaves one out: list it rather than lose it
        if s["id"] not in seen:
            add(s, 0)
    return rows


def outcome_mark(session: dict[str, Any]) -> str:
    """What the listing adds to a session's title about how its run ended: ``stopped``,
    ``lane 2 failed``, ``lanes 1, 3 failed`` (``Store.list_sessions``' ``stopped`` and
    ``failed_lanes``); empty for a run that finished with every lane."""
    parts = ["stopped"] if session.get("stopped") else []
    failed = [str(k) for k in session.get("failed_lanes") or []]
    if failed:
        parts.append(f"lane{'s' if len(failed) > 1 else ''} {', '.join(failed)} failed")
    return " · ".join(parts)


# ---------------------------------------------------------------------- replay
# The replay itself is the page's (playground.ui.replay); these name it for the Sessions tab,
# the load of a share link and scripts.
def replay_frame(page: ComparePage, sid: Any, request: Any = None, clear: bool = False,
                 key: Any = None) -> dict[Any, Any]:
    """The first frame of a replay of session ``sid`` in ``page`` (:meth:`ReplayHandlers.frame`;
    a blind one only for its owner's ``key``)."""
    return page.replay.frame(sid, request, clear, key)


def replay_step_plots(page: ComparePage, traces: list[dict[str, Any]] | None, step: Any,
                      request: Any = None) -> dict[Any, Any]:
    """The step half of a replay's plot frame (:meth:`ReplayHandlers.step_plots`)."""
    return page.replay.step_plots(traces, step, request)


def replay_run_plots(page: ComparePage, traces: list[dict[str, Any]] | None, request: Any = None) -> dict[Any, Any]:
    """The run half of a replay's plot frame (:meth:`ReplayHandlers.run_plots`)."""
    return page.replay.run_plots(traces, request)


def replay_plots(page: ComparePage, traces: list[dict[str, Any]] | None, step: Any,
                 request: Any = None) -> dict[Any, Any]:
    """The second frame of a replay: every plot (:meth:`ReplayHandlers.plots`)."""
    return page.replay.plots(traces, step, request)


def step_plot_outputs(page: ComparePage) -> list[Any]:
    """What :func:`replay_step_plots` writes."""
    return page.replay.step_plot_outputs()


def run_plot_outputs(page: ComparePage) -> list[Any]:
    """What :func:`replay_run_plots` writes."""
    return page.replay.run_plot_outputs()


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


def safe_filename(title: str) -> str:
    """The export's file name for a session titled ``title``: letters and digits of any script
    stay ("Spéculatif" stays, composed to NFC first so an accent typed as a combining mark is
    kept too); path separators, control characters and other punctuation become a dash."""
    stem = re.sub(r"[^\w.-]+", "-", unicodedata.normalize("NFC", title)).strip("-._")[:60] or "session"
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
        self.confirm = gr.State(None)  # the session whose Delete was pressed once (the next press deletes)
        with gr.Row(equal_height=True):
            self.selected_label = gr.HTML(NO_SELECTION, elem_id="session-selected")
        with gr.Row(equal_height=True):
            self.open_btn = gr.Button("Open in Compare", variant="primary", elem_id="session-open", scale=1)
            self.title = gr.Textbox(label="Title", elem_id="session-title", scale=3, max_lines=1)
            self.rename_btn = gr.Button("Rename", elem_id="session-rename", scale=1)
            self.delete_btn = gr.Button(DELETE_LABEL, variant="stop", elem_id="session-delete", scale=1)
            self.export_btn = gr.Button("Export JSON", elem_id="session-export", scale=1)
            self.export_html_btn = gr.Button("Export HTML", elem_id="session-export-html", scale=1)
        # a download link to the page's export route: the export streams from the store, no file
        self.export_file = gr.HTML("", elem_id="session-export-file", visible=False)

    def wire(self, demo: gr.Blocks, tab: Any) -> None:
        """Attach the events, hidden from the public API; ``tab`` is the Sessions tab (refreshed
        when selected)."""
        who = [self.page.owner_key, self.page.sid]
        listing = [self.table, self.listed, self.status]
        self.refresh.click(self.on_refresh, who, listing)
        tab.select(self.on_refresh, who, listing)
        pending = [self.confirm, self.delete_btn]
        self.table.select(self.on_select, [self.listed, *who], [self.selected, self.title, self.selected_label])
        # a Delete pressed once is forgotten when another row is picked
        self.table.select(_no_pending, None, pending, queue=False, show_progress="hidden")
        self.rename_btn.click(self.on_rename, [self.selected, self.title, *who],
                              listing + [self.title, self.selected_label, *pending])
        self.delete_btn.click(self.on_delete, [self.selected, *who, self.confirm],
                              listing + [self.selected, self.title, self.selected_label, *pending])
        self.export_btn.click(self.on_export, [self.selected, *who], [self.export_file, self.status])
        self.export_html_btn.click(self.on_export_html, [self.selected, *who], [self.export_file, self.status])
        self.import_btn.upload(self.on_import, [self.import_btn, *who], listing)
        opened = self.open_btn.click(self.on_open, [self.selected, self.page.owner_key],
                                     self.page.page_outputs() + [self.tabs, self.status])
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
        nothing = [None, "", NO_SELECTION]
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
        return [sid, title, selected_html(title)]

    def on_rename(self, sid: Any, title: Any, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """Rename the selected session (its owner only, on a hosted instance); the title box and
        the "selected:" line then show the title as stored."""
        keep = [gr.skip(), gr.skip(), *_no_pending()]
        if not sid:
            return self._warn("select a session first") + keep
        try:
            store = default_store()
            store.rename_session(str(sid), title if isinstance(title, str) else "", owned_by=change_filter(owner_key))
            stored = store.session_summary(str(sid))["title"]
            return self._listing(owner_key, open_sid, "Renamed.", "ok") + [stored, selected_html(stored),
                                                                           *_no_pending()]
        except PlaygroundError as e:
            return self._warn(str(e)) + keep

    def on_delete(self, sid: Any, owner_key: Any = None, open_sid: Any = None, confirm: Any = None) -> list[Any]:
        """Delete the selected session (its owner only, on a hosted instance) in two presses:
        the first asks (the button then reads "Confirm delete"), the second, for the same
        session, deletes. Selecting another row forgets the first press."""
        keep = [gr.skip(), gr.skip(), gr.skip()]
        if not sid:
            return self._warn("select a session first") + keep + list(_no_pending())
        try:
            store = default_store()
            who = change_filter(owner_key)
            if confirm != sid:
                # refuse at once what the second press would refuse: nobody is asked to
                # confirm a change they may not make
                store.check_may_change(str(sid), who)
                title = store.session_summary(str(sid))["title"]
                ask = (f"Delete “{title}”? Press Confirm delete to delete it for good, or select another row "
                       f"to keep it.")
                return [gr.skip(), gr.skip(), status_html(ask, "info"), *keep, sid,
                        gr.update(value=CONFIRM_LABEL)]
            store.delete_session(str(sid), owned_by=who)
            return self._listing(owner_key, open_sid, "Deleted.", "ok") + [None, "", NO_SELECTION, *_no_pending()]
        except PlaygroundError as e:
            return self._warn(str(e)) + keep + list(_no_pending())

    def on_export_html(self, sid: Any, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """A download link for the selected session as one self-contained HTML page (made when
        clicked, :func:`playground.html_export.session_html`), under the same rules as JSON."""
        return self.on_export(sid, owner_key, open_sid, kind="html")

    def on_export(self, sid: Any, owner_key: Any = None, open_sid: Any = None, kind: str = "json") -> list[Any]:
        """A download link for the selected session's export (streamed from the store when
        clicked, for the next ten minutes; nothing is written to disk)."""
        def refuse(msg: str) -> list[Any]:
            gr.Warning(msg)
            return [gr.update(visible=False), status_html(msg, "error")]

        if not sid:
            return refuse("select a session first")
        try:
            store = default_store()
            if not may_read_in_tab(store.session_owner(str(sid)), owner_key, open_sid, str(sid)):
                raise PlaygroundError("only sessions made in this browser, or open in it, can be exported here")
            blind.check_readable(store, str(sid), owner_key)
            title = store.session_summary(str(sid))["title"]
        except PlaygroundError as e:
            return refuse(str(e))
        name = safe_filename(title or "session")
        if kind == "html":
            name = name[: -len(".json")] + ".html"
        token = self.exports.issue(str(sid), name)
        link = (f'<a class="pg-export-link" href="{EXPORT_ROUTE}/{token}" download="{esc(name)}">'
                f'⇩ Download {esc(name)}</a>')
        return [gr.update(value=link, visible=True), status_html("Exported — download the file below.", "ok")]

    def on_import(self, data: Any, owner_key: Any = None, open_sid: Any = None) -> list[Any]:
        """Store an uploaded export as a new session of this browser's (validated; nothing
        changes on error)."""
        if not data or not isinstance(data, (bytes, bytearray)):
            return self._warn("no file received")
        try:
            sid = default_store().import_session(bytes(data), owner=owner_id(owner_key))
        except PlaygroundError as e:
            return self._warn(f"import refused: {e}")
        listing = self._listing(owner_key, open_sid, "")
        listing[2] = status_html(f"Imported “{default_store().session_summary(sid)['title']}”.", "ok")
        return listing

    def on_open(self, sid: str | None, owner_key: Any = None, request: gr.Request = None) -> dict[Any, Any]:
        """Open the selected session in the Compare tab: its text first (:func:`replay_frame`);
        the plots follow in the chained frame. A blind comparison opens for its owner only."""
        if not sid:
            gr.Warning("select a session first")
            return {self.status: status_html("select a session first", "error")}
        up = replay_frame(self.page, sid, request, clear=True, key=owner_key)
        up[self.tabs] = gr.Tabs(selected="compare")
        up[self.status] = status_html("Opened in the Compare tab.", "ok")
        return up

    def _warn(self, msg: str) -> list[Any]:
        gr.Warning(msg)
        return [gr.skip(), gr.skip(), status_html(msg, "error")]


def _intro() -> str:
    if one_user():
        return ("Every finished or stopped comparison is saved here (marked [stopped] or [lane N failed] "
                "where it was). Select a row, then open, rename, delete (press twice) or export it; import a "
                "JSON export from another machine.")
    return ("The comparisons made in this browser are saved here, with the one open in the Compare tab. "
            "Select a row, then open, rename, delete or export it (your own sessions only); a share link "
            "shows a session to anyone, read-only.")


def _esc(text: Any) -> str:
    return html.escape(str(text))


def selected_html(title: str) -> str:
    """The "selected:" line for a session titled ``title``."""
    return f'<div class="lane-info">selected: <b>{_esc(title)}</b></div>'


def _no_pending() -> tuple[Any, Any]:
    """No Delete waiting for its confirmation: the state cleared, the button says Delete."""
    return None, gr.update(value=DELETE_LABEL)
