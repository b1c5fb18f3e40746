"""The Sessions tab: stored comparisons — list, open, rename, delete, export and import.

Every finished or stopped comparison is saved by the Compare page; this view works on the
store (``playground.store``) only, so it needs no model. Opening a session replays it in the
Compare tab, exactly as a share link does.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any

import gradio as gr

from playground.errors import PlaygroundError
from playground.ui.compare import ComparePage, private_events
from playground.ui.html import status_html

HEADERS = ["Title", "Model", "Decoders", "Created (UTC)", "Id"]


def session_rows() -> list[list[str]]:
    """The stored sessions as table rows, newest first."""
    from playground.store import default_store

    rows = []
    for s in default_store().list_sessions():
        rows.append([s["title"], s["model"], ", ".join(s["decoders"]),
                     str(s["created"])[:19].replace("T", " "), s["id"]])
    return rows


def _safe_filename(title: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", title).strip("-")[:60] or "session"
    return f"{stem}.json"


class SessionsView:
    """Builds the Sessions tab and wires it to the Compare page."""

    def __init__(self, page: ComparePage, tabs: Any) -> None:
        self.page, self.tabs = page, tabs

    def build(self) -> None:
        """Create the components (call inside the Sessions tab)."""
        gr.Markdown("Every finished or stopped comparison is saved here. Select a row, then open, rename, "
                    "delete or export it; import a JSON export from another machine.", elem_classes=["lane-info"])
        with gr.Row(equal_height=True):
            self.refresh = gr.Button("↻ Refresh", elem_id="sessions-refresh", size="md", scale=1)
            self.import_btn = gr.UploadButton("⇪ Import JSON…", file_types=[".json"], type="binary",
                                              elem_id="session-import", size="md", scale=1)
            self.status = gr.HTML("", elem_id="sessions-status")
        self.table = gr.Dataframe(value=[], headers=HEADERS, datatype="str", interactive=False, wrap=True,
                                  elem_id="sessions-table", column_widths=["30%", "16%", "26%", "14%", "14%"],
                                  max_height=420)
        self.selected = gr.State(None)
        with gr.Row(equal_height=True):
            self.selected_label = gr.HTML('<div class="lane-info">no session selected</div>', elem_id="session-selected")
        with gr.Row(equal_height=True):
            self.open_btn = gr.Button("Open in Compare", variant="primary", elem_id="session-open", scale=1)
            self.title = gr.Textbox(label="Title", elem_id="session-title", scale=3, max_lines=1)
            self.rename_btn = gr.Button("Rename", elem_id="session-rename", scale=1)
            self.delete_btn = gr.Button("Delete", variant="stop", elem_id="session-delete", scale=1)
            self.export_btn = gr.Button("Export JSON", elem_id="session-export", scale=1)
        self.export_file = gr.File(label="Export", elem_id="session-export-file", visible=False, interactive=False)

    def wire(self, demo: gr.Blocks, tab: Any) -> None:
        """Attach the events, hidden from the public API; ``tab`` is the Sessions tab (refreshed
        when selected)."""
        with private_events(demo):
            self._wire(demo, tab)

    def _wire(self, demo: gr.Blocks, tab: Any) -> None:
        listing = [self.table, self.status]
        self.refresh.click(self.on_refresh, None, listing)
        tab.select(self.on_refresh, None, listing)
        self.table.select(self.on_select, [self.table], [self.selected, self.title, self.selected_label])
        self.rename_btn.click(self.on_rename, [self.selected, self.title], listing)
        self.delete_btn.click(self.on_delete, [self.selected], listing + [self.selected, self.title,
                                                                         self.selected_label])
        self.export_btn.click(self.on_export, [self.selected], [self.export_file, self.status])
        self.import_btn.upload(self.on_import, [self.import_btn], listing)
        self.open_btn.click(self.on_open, [self.selected], self.page.page_outputs() + [self.tabs, self.status])

    # ---------------------------------------------------------------- handlers
    def on_refresh(self) -> list[Any]:
        """Reload the list."""
        try:
            rows = session_rows()
        except PlaygroundError as e:
            return [gr.skip(), status_html(str(e), "error")]
        return [rows, status_html(f"{len(rows)} stored session{'s' if len(rows) != 1 else ''}.")]

    def on_select(self, table: Any, evt: gr.SelectData) -> list[Any]:
        """A row was clicked: remember its session id."""
        try:
            row = evt.index[0]
            rows = table.values.tolist() if hasattr(table, "values") else list(table)
            title, sid = rows[row][0], rows[row][4]
        except (IndexError, TypeError, AttributeError):
            return [None, "", '<div class="lane-info">no session selected</div>']
        return [sid, title, f'<div class="lane-info">selected: <b>{_esc(title)}</b></div>']

    def on_rename(self, sid: str | None, title: str) -> list[Any]:
        """Rename the selected session."""
        from playground.store import default_store

        if not sid:
            return self._warn("select a session first")
        try:
            default_store().rename_session(sid, title)
        except PlaygroundError as e:
            return self._warn(str(e))
        rows = session_rows()
        return [rows, status_html("Renamed.", "ok")]

    def on_delete(self, sid: str | None) -> list[Any]:
        """Delete the selected session."""
        from playground.store import default_store

        if not sid:
            return self._warn("select a session first") + [gr.skip(), gr.skip(), gr.skip()]
        try:
            default_store().delete_session(sid)
        except PlaygroundError as e:
            return self._warn(str(e)) + [gr.skip(), gr.skip(), gr.skip()]
        return [session_rows(), status_html("Deleted.", "ok"), None, "",
                '<div class="lane-info">no session selected</div>']

    def on_export(self, sid: str | None) -> list[Any]:
        """Write the selected session as a JSON file to download."""
        from playground.store import default_store

        if not sid:
            gr.Warning("select a session first")
            return [gr.update(visible=False), status_html("select a session first", "error")]
        try:
            data = default_store().export_session(sid)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return [gr.update(visible=False), status_html(str(e), "error")]
        folder = tempfile.mkdtemp(prefix="playground-export-")
        path = os.path.join(folder, _safe_filename(data.get("title") or "session"))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
        return [gr.update(value=path, visible=True), status_html("Exported — download the file below.", "ok")]

    def on_import(self, data: bytes | None) -> list[Any]:
        """Store an uploaded export as a new session (validated; nothing changes on error)."""
        from playground.store import default_store

        if not data:
            return self._warn("no file received")
        try:
            sid = default_store().import_session(bytes(data))
        except PlaygroundError as e:
            return self._warn(f"import refused: {e}")
        rows = session_rows()
        title = next((r[0] for r in rows if r[4] == sid), sid)
        return [rows, status_html(f"Imported “{title}”.", "ok")]

    def on_open(self, sid: str | None) -> dict[Any, Any]:
        """Open the selected session in the Compare tab."""
        if not sid:
            gr.Warning("select a session first")
            return {self.status: status_html("select a session first", "error")}
        up = self.page.open_session(sid)
        up[self.tabs] = gr.Tabs(selected="compare")
        up[self.status] = status_html("Opened in the Compare tab.", "ok")
        return up

    def _warn(self, msg: str) -> list[Any]:
        gr.Warning(msg)
        return [gr.skip(), status_html(msg, "error")]


def _esc(text: Any) -> str:
    import html

    return html.escape(str(text))
