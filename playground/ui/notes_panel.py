"""The inspector's Notes panel: remarks pinned to steps of a stored comparison.

Click a token (or scrub) to pick a lane and step; type a note and *Save note*: it is kept with
the session (:meth:`playground.store.Store.set_note`, the session's owner only on a hosted
instance) and listed for everyone who opens its link, the picked step's note marked, and in
its HTML export. An empty note removes the one at that step.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from playground.core.errors import PlaygroundError
from playground.notes import MAX_NOTE_CHARS, notes_of
from playground.ownership import change_filter
from playground.store import default_store
from playground.ui.events import clicked_token, nothing_is_skip
from playground.ui.html import esc, one_line, status_html
from playground.ui.layout import Layout

HINT = "Click a token in any lane (or scrub) to pick the step a note is about."


def notes_html(notes: list[dict[str, Any]], lane: int | None = None, step: int | None = None) -> str:
    """The session's notes as a list, the one at (``lane``, ``step``) marked (escaped text)."""
    if not notes:
        return '<div class="lane-info" id="notes-empty">No notes on this comparison yet.</div>'
    items = []
    for n in notes:
        here = n["lane"] == lane and n["step"] == step
        items.append(f'<li class="pg-note{" pg-note-here" if here else ""}" data-lane="{n["lane"]}" '
                     f'data-step="{n["step"]}"><b>Lane {n["lane"] + 1}, step {n["step"]}</b>: {esc(n["text"])}</li>')
    return f'<ul class="pg-notes">{"".join(items)}</ul>'


def stored_notes(sid: Any) -> list[dict[str, Any]]:
    """The notes of stored session ``sid`` (none for a comparison that is not stored)."""
    if not isinstance(sid, str) or not sid:
        return []
    try:
        return notes_of(default_store().load_session(sid))
    except PlaygroundError:
        return []


def _place(traces: list[dict[str, Any]] | None, lane: Any, step: Any) -> tuple[int, int] | None:
    """The picked lane (0-based) and step, the step clamped to the lane's last; None without one."""
    traces = list(traces or [])
    try:
        j, s = int(lane), max(0, int(step))
    except (TypeError, ValueError, OverflowError):
        return None
    if not 0 <= j < len(traces):
        return None
    steps = traces[j].get("steps") or []
    if not steps:
        return None
    return j, min(s, len(steps) - 1)


class NotesPanel:
    """The Notes controls of the Compare page's inspector and their handlers."""

    def __init__(self, ui: Layout) -> None:
        self.ui = ui

    def build(self) -> None:
        """Create the panel (inside the page's inspector section)."""
        with gr.Accordion("Notes on steps", open=True, elem_id="notes-panel", elem_classes=["branch-panel"]):
            self.listing = gr.HTML(notes_html([]), elem_id="notes-list")
            self.where = gr.HTML(f'<div class="branch-where">{esc(HINT)}</div>', elem_id="notes-where")
            with gr.Row(equal_height=True):
                self.lane = gr.Dropdown([(f"Lane {k}", k - 1) for k in range(1, self.ui.max_lanes + 1)], value=0,
                                        label="Lane", elem_id="note-lane", scale=1, min_width=140)
                self.text = gr.Textbox(label=f"Note on this step (up to {MAX_NOTE_CHARS} characters; empty removes it)",
                                       elem_id="note-text", lines=2, max_lines=6, scale=5)
                self.button = gr.Button("Save note", elem_id="note-save", scale=1, min_width=110)
            self.status = gr.HTML("", elem_id="notes-status")

    def outputs(self) -> list[Any]:
        """What picking a step rewrites."""
        return [self.listing, self.where, self.lane, self.text, self.status]

    def wire(self, demo: gr.Blocks) -> None:
        """Attach token clicks, scrubbing, the lane picker, a shown comparison and Save."""
        page = self.ui
        state = [page.sid, page.traces]
        for ui in page.lanes:
            ui.output.click(nothing_is_skip(self.on_click), [*state, self.lane], self.outputs(), show_progress="hidden")
        for trigger in (page.step.input, self.lane.input):
            trigger(self.on_pick, [*state, self.lane, page.step], self.outputs(), show_progress="hidden",
                    trigger_mode="always_last")
        page.on_shown.add(self.on_pick, [*state, self.lane, page.step], self.outputs())
        self.button.click(self.on_save, [*state, self.lane, page.step, self.text, page.owner_key],
                          [self.listing, self.status], show_progress="hidden")

    def on_pick(self, sid: Any, traces: list[dict[str, Any]] | None, lane: Any, step: Any) -> dict[Any, Any]:
        """Show the notes, say which step a note would be about, and put its note in the box."""
        notes = stored_notes(sid)
        traces = list(traces or [])
        lanes = [(f"Lane {j + 1}", j) for j in range(min(len(traces), self.ui.max_lanes))]
        place = _place(traces, lane, step)
        up: dict[Any, Any] = {self.status: "",
                              self.lane: gr.update(choices=lanes or None, value=place[0] if place else 0)
                              if lanes else gr.update()}
        if place is None:
            up[self.listing] = notes_html(notes)
            up[self.where] = f'<div class="branch-where">{esc(HINT)}</div>'
            up[self.text] = ""
            return up
        j, s = place
        up[self.listing] = notes_html(notes, j, s)
        up[self.where] = f'<div class="branch-where" data-lane="{j}" data-step="{s}">Lane {j + 1}, step {s}.</div>'
        up[self.text] = next((n["text"] for n in notes if n["lane"] == j and n["step"] == s), "")
        return up

    def on_click(self, sid: Any, traces: list[dict[str, Any]] | None, lane: Any, evt: gr.EventData) -> dict[Any, Any]:
        """A token was clicked: pick its lane and step."""
        hit = clicked_token(evt)
        if hit is None:
            return {}
        clicked, step = hit
        return self.on_pick(sid, traces, lane if clicked is None else clicked, step)

    def on_save(self, sid: Any, traces: list[dict[str, Any]] | None, lane: Any, step: Any, text: Any,
                owner_key: Any = None) -> list[Any]:
        """Keep the note with the stored session (its owner only, on a hosted instance)."""
        try:
            if not isinstance(sid, str) or not sid:
                raise PlaygroundError("run a comparison (or open a session) first: notes are kept with a stored one")
            place = _place(traces, lane, step)
            if place is None:
                raise PlaygroundError("pick a step first: click a token or move the scrubber")
            store = default_store()
            store.set_note(sid, place[0], place[1], text, owned_by=change_filter(owner_key))
            notes = notes_of(store.load_session(sid))
        except PlaygroundError as e:
            return [gr.skip(), status_html(one_line(str(e)), "error")]
        kept = any(n["lane"] == place[0] and n["step"] == place[1] for n in notes)
        line = (f"Saved: lane {place[0] + 1}, step {place[1]} — its link shows it." if kept
                else f"Removed the note on lane {place[0] + 1}, step {place[1]}.")
        return [notes_html(notes, *place), status_html(line, "ok")]
