"""Notes on steps: kept with the session by its owner only, checked, shown by the Notes panel
on a replay, in the HTML export and by the command line."""

from __future__ import annotations

import contextlib
import io

import pytest

from playground.cli import main
from playground.core.errors import PlaygroundError
from playground.html_export import session_html
from playground.notes import MAX_NOTE_CHARS, MAX_NOTES, notes_of
from playground.ownership import owner_id
from playground.store import default_store
from tests.test_store import make_trace

KEY_OWNER = "O" * 40
KEY_OTHER = "Q" * 40


@pytest.fixture()
def stored(db):
    store = default_store()
    sid = store.save_session("noted", "tiny-llama", "ROMEO:", {}, [make_trace("greedy"), make_trace("top_k", seed=1)],
                             owner=owner_id(KEY_OWNER))
    return store, sid


def test_a_note_is_kept_replaced_and_removed(stored):
    store, sid = stored
    store.set_note(sid, 1, 3, "  the cut happens here  ")
    assert notes_of(store.load_session(sid)) == [
        {"lane": 1, "step": 3, "text": "the cut happens here", "updated": notes_of(store.load_session(sid))[0]["updated"]}]
    store.set_note(sid, 1, 3, "replaced")
    store.set_note(sid, 0, 0, "first")
    assert [(n["lane"], n["step"], n["text"]) for n in notes_of(store.load_session(sid))] == [(0, 0, "first"),
                                                                                               (1, 3, "replaced")]
    store.set_note(sid, 1, 3, "")
    assert [(n["lane"], n["step"]) for n in notes_of(store.load_session(sid))] == [(0, 0)]
    # an export carries the notes; its import keeps them
    copy = store.import_session(store.export_session(sid))
    assert [n["text"] for n in notes_of(store.load_session(copy))] == ["first"]


def test_bad_notes_are_refused_in_one_line_and_change_nothing(stored):
    store, sid = stored
    before = store.load_session(sid)["settings"]
    cases = [((2, 0, "x"), "no lane 3"), ((0, 5, "x"), "no step 5"), ((-1, 0, "x"), "≥ 0"), ((0, 1.5, "x"), "≥ 0"),
             (("a", 0, "x"), "whole number"), ((True, 0, "x"), "whole number"), ((0, 0, 7), "a note is text"),
             ((0, 0, "x" * (MAX_NOTE_CHARS + 1)), f"at most {MAX_NOTE_CHARS}")]
    for args, words in cases:
        with pytest.raises(PlaygroundError, match=words):
            store.set_note(sid, *args)
    with pytest.raises(PlaygroundError, match="only the browser"):
        store.set_note(sid, 0, 0, "x", owned_by=owner_id(KEY_OTHER))
    assert store.load_session(sid)["settings"] == before
    store.set_note(sid, 0, 0, "mine", owned_by=owner_id(KEY_OWNER))


def test_a_session_keeps_at_most_max_notes(db):
    store = default_store()
    sid = store.save_session("many", "tiny-llama", "ROMEO:", {}, [make_trace("greedy", n=MAX_NOTES + 1)])
    for s in range(MAX_NOTES):
        store.set_note(sid, 0, s, f"n{s}")
    with pytest.raises(PlaygroundError, match=f"{MAX_NOTES} notes"):
        store.set_note(sid, 0, MAX_NOTES, "one too many")
    store.set_note(sid, 0, 0, "an edit of a kept one is fine")


def test_the_notes_panel_shows_saves_and_refuses_others(demo, stored, monkeypatch):
    store, sid = stored
    panel = demo.compare_page.notes
    traces = store.load_session(sid)["runs"]
    up = panel.on_pick(sid, traces, 1, 2)
    assert "No notes" in up[panel.listing] and up[panel.text] == ""
    listing, status = panel.on_save(sid, traces, 1, 2, "a <script>x</script> note", KEY_OWNER)
    assert "Saved" in status and "&lt;script&gt;" in listing and "<script>" not in listing
    up = panel.on_pick(sid, traces, 1, 2)
    assert up[panel.text] == "a <script>x</script> note" and "pg-note-here" in up[panel.listing]
    assert "pg-note-here" not in panel.on_pick(sid, traces, 0, 2)[panel.listing]
    monkeypatch.setenv("SPACE_ID", "someone/decoder-playground")  # a hosted instance: owners only
    _, status = panel.on_save(sid, traces, 1, 2, "not mine", KEY_OTHER)
    assert "only the browser" in status
    _, status = panel.on_save(sid, traces, 1, 2, "no key", None)
    assert "only the browser" in status
    _, status = panel.on_save(None, traces, 1, 2, "x", KEY_OWNER)
    assert "run a comparison" in status
    _, status = panel.on_save(sid, [], 1, 2, "x", KEY_OWNER)
    assert "pick a step" in status
    assert notes_of(store.load_session(sid))[0]["text"] == "a <script>x</script> note"


def test_notes_are_in_the_html_export_and_the_command_line(stored, db):
    store, sid = stored
    store.set_note(sid, 1, 4, "the top-k <cut>")
    page = session_html(store.load_session(sid))
    assert "the top-k &lt;cut&gt;" in page and 'data-step="4"' in page
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["sessions", "--db", str(db), "note", sid]) == 0
    assert out.getvalue().strip() == "lane 2, step 4: the top-k <cut>"
    assert main(["sessions", "--db", str(db), "note", sid, "--lane", "1", "--step", "0", "--text", "from the CLI"]) == 0
    assert main(["sessions", "--db", str(db), "note", sid, "--lane", "1", "--step", "99", "--text", "x"]) == 2
    assert [n["text"] for n in notes_of(store.load_session(sid))] == ["from the CLI", "the top-k <cut>"]
