"""Sessions as a user meets them (issue 36, item 8): a run where every lane failed is not saved
and the status line says so; a stopped run and failed lanes are marked in the list, so equal
titles are told apart; Delete asks first; Rename updates the "selected:" line; export file
names keep their letters in any script; an import whose token ids fall outside its model's
vocabulary, or whose counts disagree with its steps, is refused before anything is stored —
while every preset's run, saved by the page itself, exports and imports back unchanged."""

from __future__ import annotations

import copy
import html
import json
import re

import gradio as gr
import pytest

from playground.core.errors import PlaygroundError

from test_ui_app import download_export, html_of, run_and_stop, run_args


@pytest.fixture(scope="module")
def page(demo):
    return demo.compare_page


def status(out: list) -> str:
    return html.unescape(next(v for v in out if isinstance(v, str) and "pg-status" in v))


def status_line(up, page) -> str:
    """The status line's text, as the page shows it."""
    return re.sub(r"<[^>]+>", "", html_of(up, page.status))


def rows_by_id() -> dict[str, str]:
    from playground.ui.sessions_view import session_rows

    return {r[4]: r[0] for r in session_rows()}


def bundled_trace(max_new: int = 8) -> dict:
    from playground.engine import prepare

    return prepare(model="tiny-shakespeare", decoder="greedy", prompt="ROMEO:", max_new_tokens=max_new,
                   seed=0).finish().to_dict()


# ---------------------------------------------------------------------- what is saved
def fail_after(monkeypatch, steps: int) -> None:
    """Every run fails with a one-line error at its step ``steps`` + 1 (as a decoder's own
    PlaygroundError does: the run closes, what it made is kept)."""
    import playground.engine

    real = playground.engine.Run.step

    def step(self):
        self._calls = getattr(self, "_calls", 0) + 1
        if self._calls > steps:
            self.error = "the decoder ran into a wall"
            self._close("error")
            raise PlaygroundError(self.error)
        return real(self)

    monkeypatch.setattr(playground.engine.Run, "step", step)


def test_a_run_where_every_lane_failed_is_not_saved_and_the_status_says_why(page, tiny, db, monkeypatch):
    from playground.store import default_store

    # lanes that could not start, each for its own reason (one shared reason is the page's error)
    args = run_args(page, [("llada", {}), ("greedy", {})])
    args[9 + 4 + 3] = "missing-model"
    final = list(page.on_run(None, *args))[-1]
    line = status_line(final, page)
    assert "Lanes 1, 2 failed" in line and line.endswith("Not saved: every lane failed.") and "\n" not in line
    assert final[page.sid] is None and default_store().count() == 0
    # lanes that failed after taking steps: their text is on the page, but nothing is saved
    fail_after(monkeypatch, 2)
    final = list(page.on_run(None, *run_args(page, [("greedy", {}), ("top_k", {"k": 20})])))[-1]
    assert all(len(t["steps"]) == 2 for t in final[page.traces])
    line = status_line(final, page)
    assert "Lanes 1, 2 failed" in line and line.endswith("Not saved: every lane failed.") and "Saved" not in line
    assert final[page.sid] is None and default_store().count() == 0


def test_a_run_stopped_before_any_step_says_it_was_not_saved(page, tiny, db, monkeypatch):
    import threading

    import playground.engine
    from playground.store import default_store

    # the lanes' model loads until Stop has been pressed: no lane can take a step before it
    release = threading.Event()
    monkeypatch.setattr(playground.engine, "load_model", lambda spec, **kw: (release.wait(30), tiny)[1])

    def stop() -> None:
        page.on_stop(None, request=None)
        release.set()

    gen = page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})], max_new=200))
    next(gen)
    timer = threading.Timer(0.5, stop)
    timer.start()
    final = list(gen)[-1]
    timer.join()
    assert not any(t["steps"] for t in final[page.traces])
    line = status_line(final, page)
    assert line.startswith("Stopped") and line.endswith("Not saved: no lane took a step.")
    assert final[page.sid] is None and default_store().count() == 0


def test_a_run_with_a_failed_lane_is_saved_and_listed_with_that_lane_marked(page, tiny, db):
    from playground.store import default_store

    final = list(page.on_run(None, *run_args(page, [("greedy", {}), ("llada", {})])))[-1]
    sid = final[page.sid]
    assert sid and "Saved" in html_of(final, page.status)
    assert default_store().load_session(sid)["settings"]["outcome"] == {"stopped": False, "failed_lanes": [2]}
    assert rows_by_id()[sid] == "greedy vs llada [lane 2 failed]"


def test_a_stopped_run_is_marked_stopped_and_told_apart_from_a_finished_one(page, tiny, db, frame_per_snapshot):
    done = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})], max_new=6)))[-1][page.sid]
    final = run_and_stop(page, [("greedy", {}), ("greedy", {})])
    stopped = final[page.sid]
    assert "Stopped" in html_of(final, page.status) and stopped
    rows = rows_by_id()
    assert rows[done] == "greedy vs greedy" and rows[stopped] == "greedy vs greedy [stopped]"


def test_sessions_saved_without_an_outcome_are_marked_from_their_lanes(tiny, db):
    """Older databases, exports and the CLI/API's saves keep no outcome: the lanes' stats say it."""
    from playground.runner import error_trace
    from playground.store import default_store

    store = default_store()
    ok = bundled_trace()
    cancelled = copy.deepcopy(ok)
    cancelled["stats"]["finish_reason"] = "cancelled"
    a = store.save_session("same", "tiny-shakespeare", "ROMEO:", {}, [ok, cancelled])
    b = store.save_session("same", "tiny-shakespeare", "ROMEO:", {}, [error_trace("boom"), ok, error_trace("x")])
    c = store.save_session("same", "tiny-shakespeare", "ROMEO:", {}, [ok])
    assert rows_by_id() == {a: "same [stopped]", b: "same [lanes 1, 3 failed]", c: "same"}
    assert store.session_summary(b)["failed_lanes"] == [1, 3] and store.session_summary(a)["stopped"] is True


def test_a_malformed_outcome_is_refused(db):
    from playground.store import default_store

    store = default_store()
    for bad, why in (({"stopped": "yes"}, "stopped must be true or false"),
                     ({"failed_lanes": [3]}, r"failed_lanes must list lane numbers 1\.\.1"),
                     ({"lanes": 1}, "settings.outcome must be")):
        with pytest.raises(PlaygroundError, match=why):
            store.save_session("t", "tiny-shakespeare", "ROMEO:", {"outcome": bad}, [bundled_trace(4)])
    assert store.count() == 0


# ---------------------------------------------------------------------- delete, rename
def test_delete_asks_first_and_deletes_on_the_second_press(demo, tiny, db):
    from playground.store import default_store
    from playground.ui.sessions_view import CONFIRM_LABEL, DELETE_LABEL

    sv, store = demo.sessions_view, default_store()
    a = store.save_session("keep me", "tiny-shakespeare", "ROMEO:", {}, [bundled_trace(4)])
    b = store.save_session("delete me", "tiny-shakespeare", "ROMEO:", {}, [bundled_trace(4)])
    asked = sv.on_delete(b)
    assert "Delete “delete me”? Press Confirm delete" in status(asked) and store.count() == 2
    assert asked[6] == b and asked[7]["value"] == CONFIRM_LABEL
    # a pending press for another session confirms nothing: it asks about this one
    again = sv.on_delete(a, None, None, b)
    assert "Delete “keep me”?" in status(again) and store.count() == 2 and again[6] == a
    done = sv.on_delete(b, None, None, b)
    assert "Deleted." in status(done) and store.count() == 1 and done[1] == [a]
    assert done[6] is None and done[7]["value"] == DELETE_LABEL and "no session selected" in done[5]


def test_selecting_another_row_forgets_a_pending_delete(demo):
    """The table's select event also clears the pending press and restores the button."""
    from playground.ui.sessions_view import DELETE_LABEL

    sv = demo.sessions_view
    select_fns = [fn for fn in demo.fns.values() if fn.name == "_no_pending"]
    assert len(select_fns) == 1
    assert [t[0] for t in select_fns[0].targets] == [sv.table._id]
    assert [o._id for o in select_fns[0].outputs] == [sv.confirm._id, sv.delete_btn._id]
    cleared, button = select_fns[0].fn()
    assert cleared is None and button["value"] == DELETE_LABEL


def test_rename_shows_the_new_title_in_the_selected_line(demo, tiny, db):
    from playground.store import default_store

    sv = demo.sessions_view
    sid = default_store().save_session("old title", "tiny-shakespeare", "ROMEO:", {}, [bundled_trace(4)])
    _sid, _title, label = sv.on_select([sid], evt=gr.SelectData(None, {"index": [0, 0], "value": "x"}))
    assert "old title" in label
    out = sv.on_rename(sid, "  Spéculatif   nouveau ")
    assert "Renamed." in status(out)
    assert out[3] == "Spéculatif nouveau" and "selected: <b>Spéculatif nouveau</b>" in out[4]
    assert "Renamed" not in out[4] and rows_by_id()[sid] == "Spéculatif nouveau"
    refused = sv.on_rename(sid, "   ")
    assert "cannot be empty" in status(refused) and refused[4] == gr.skip()  # the line keeps the stored title


# ---------------------------------------------------------------------- export names
@pytest.mark.parametrize("title,name", [
    ("Spéculatif", "Spéculatif.json"),
    ("Spe\u0301culatif", "Spéculatif.json"),  # a combining accent is composed, not dropped
    ("投機的デコーディング", "投機的デコーディング.json"),
    ("../../etc/passwd", "etc-passwd.json"),
    ("a\\b/c\x00d\x1fe\nf", "a-b-c-d-e-f.json"),
    ("  ...  ", "session.json"),
])
def test_export_file_names_keep_letters_of_any_script(title, name):
    from playground.ui.sessions_view import safe_filename

    assert safe_filename(title) == name


def test_the_download_names_a_non_ascii_file_by_rfc_5987(demo, tiny, db):
    from urllib.parse import unquote

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from playground.store import default_store
    from playground.ui.page_routes import page_routes
    from playground.ui.page_session import PageSessions

    sv = demo.sessions_view
    sid = default_store().save_session("Spéculatif / γ=4", "tiny-shakespeare", "ROMEO:", {}, [bundled_trace(4)])
    link, msg = sv.on_export(sid)
    assert 'download="Spéculatif-γ-4.json"' in link["value"]
    href = re.search(r'href="([^"]+)"', link["value"]).group(1)
    r = TestClient(Starlette(routes=page_routes(sessions=PageSessions(), exports=sv.exports))).get("/" + href)
    cd = r.headers["content-disposition"]
    assert cd.isascii()  # a header is Latin-1: the name travels percent-encoded in filename*
    plain = re.search(r'filename="([^"]*)"', cd).group(1)
    star = re.search(r"filename\*=UTF-8''(\S+)$", cd).group(1)
    assert unquote(star) == "Spéculatif-γ-4.json" and plain == "Speculatif-4.json"
    assert r.json()["title"] == "Spéculatif / γ=4"


@pytest.mark.parametrize("name,plain", [("投機的.json", "session.json"), ("a\"b;c.json", "a-b-c.json"),
                                        ("Ünïcödé.json", "Unicode.json")])
def test_the_ascii_fallback_name_is_safe_in_a_header(name, plain):
    from urllib.parse import unquote

    from playground.ui.exports import content_disposition

    cd = content_disposition(name)
    assert cd.isascii() and re.fullmatch(r'attachment; filename="([^"]*)"; filename\*=UTF-8\'\'(\S+)', cd)
    assert re.search(r'filename="([^"]*)"', cd).group(1) == plain
    assert unquote(re.search(r"filename\*=UTF-8''(\S+)$", cd).group(1)) == name


# ---------------------------------------------------------------------- import validation
def prompt(*ids):
    """An edit giving a trace a prompt of these ids, their texts in the trace's own vocabulary."""
    return lambda t: (t.update(prompt_ids=list(ids)), t["tokens"].update({str(i): "x" for i in ids}))


def exported(store, traces, model="tiny-shakespeare"):
    sid = store.save_session("exp", model, "ROMEO:", {}, traces)
    return store.export_session(sid)


def test_an_import_with_ids_outside_the_bundled_vocabulary_is_refused_naming_lane_and_field(demo, db):
    from playground.store import default_store

    store, sv = default_store(), demo.sessions_view
    data = exported(store, [bundled_trace(), bundled_trace()])
    before = store.count()

    def refused(edit) -> str:
        d = copy.deepcopy(data)
        edit(d["runs"][1])
        line = status(sv.on_import(json.dumps(d).encode()))
        assert store.count() == before, line  # nothing stored
        return line

    # the import: shown as "#999999#-5" next to "64 tokens" before
    assert "lane 2: trace field 'output_ids' holds -5" in refused(lambda t: t.update(output_ids=[999999, -5]))
    # counts that disagree with the steps
    assert "lane 2: trace field 'output_ids' holds token 999999, which is not in the trace's vocabulary" in \
        refused(lambda t: t.update(output_ids=[999999, 3]))
    # counts that disagree with the steps: the output against the commits, the stats against the output
    assert "lane 2: trace output_ids (7 tokens) are not the tokens its steps committed (8)" in \
        refused(lambda t: t.update(output_ids=t["output_ids"][1:]))
    assert "lane 2: trace stats.new_tokens is 64, but its output holds 8 committed tokens" in \
        refused(lambda t: t["stats"].update(new_tokens=64))

    def consistent(t):  # ids, commits and counts that agree, but beyond the model's 4096 ids
        t["steps"][0]["committed"] = [999999]
        t["output_ids"][0] = 999999
        t["tokens"]["999999"] = "x"

    line = refused(consistent)
    assert "import refused: lane 2: output_ids holds token 999999, outside the vocabulary of " \
           "tiny-shakespeare (4096 ids)" in line
    assert "lane 2: prompt_ids holds token 4096" in refused(prompt(4096))

    def commits_only(t):
        t["steps"] = t["steps"] + [{**t["steps"][-1], "i": len(t["steps"]), "kind": "beam", "committed": [5000]}]
        t["stats"]["steps"] = len(t["steps"])

    assert f"lane 2: step {len(data['runs'][1]['steps'])}'s committed holds token 5000" in refused(commits_only)
    assert "lane 2: force holds token 4096" in refused(lambda t: t.update(force=[[0, 4096]]))
    # the ids at the top of the vocabulary are fine
    ok = copy.deepcopy(data)
    prompt(0, 4095)(ok["runs"][1])
    assert "Imported" in status(sv.on_import(json.dumps(ok).encode()))


def test_a_model_whose_vocabulary_is_not_on_this_machine_gets_a_generous_bound(db):
    from playground.store import default_store
    from playground.store_vocab import GENEROUS_VOCAB

    store = default_store()
    data = exported(store, [bundled_trace()], model="someone/not-here")
    data["runs"][0]["model"] = "someone/not-here"
    prompt(5000, 262_143)(data["runs"][0])  # beyond the bundled 4096, within real vocabularies
    store.import_session(data)
    prompt(GENEROUS_VOCAB)(data["runs"][0])
    with pytest.raises(PlaygroundError, match=rf"^lane 1: prompt_ids holds token {GENEROUS_VOCAB}, outside any "
                                              rf"vocabulary \(at most {GENEROUS_VOCAB} ids\)$"):
        store.import_session(data)


def test_a_path_models_config_on_disk_bounds_its_ids_only_where_paths_load(db, tmp_path, monkeypatch):
    from playground.store import default_store

    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": {"vocab_size": 300}}))
    store = default_store()
    data = exported(store, [bundled_trace()])
    data["model"] = data["runs"][0]["model"] = str(folder)
    prompt(299, 300)(data["runs"][0])
    with pytest.raises(PlaygroundError, match=r"lane 1: prompt_ids holds token 300, outside the vocabulary of "
                                              rf"{re.escape(str(folder))} \(300 ids\)"):
        store.import_session(data)
    # an instance that loads no paths never looks at the folder (an import cannot probe it)
    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "bundled")
    store.import_session(data)


@pytest.mark.slow  # every preset run through the page (~16 s)
def test_every_presets_run_saved_by_the_page_exports_and_imports_back(demo, page, db):
    """The import checks are the app's own invariants: no session the page saves is refused."""
    import playground.ui.rules as st
    from playground.presets import list_presets
    from playground.store import default_store

    store, sv = default_store(), demo.sessions_view
    for p in list_presets():
        pre = st.preset_page(p["name"])
        args = [pre["model"], "", pre["prompt"], pre["seed"], min(pre["max_new_tokens"], 32), pre["policy"], "auto",
                len(pre["lanes"]), p["name"]]
        for j in range(page.max_lanes):
            c = pre["lanes"][j] if j < len(pre["lanes"]) else st.LaneConfig()
            args += [c.decoder, c.params, c.draft or st.NO_DRAFT, c.model or st.SAME_MODEL]
        final = list(page.on_run(None, *args))[-1]
        sid = final[page.sid]
        assert sid, (p["name"], html_of(final, page.status))
        assert store.load_session(sid)["settings"]["outcome"] == {"stopped": False, "failed_lanes": []}, p["name"]
        data = download_export(sv, sid)
        before = {s["id"] for s in store.list_sessions()}
        out = sv.on_import(json.dumps(data).encode())
        assert "Imported" in status(out), (p["name"], status(out))
        (new,) = set(out[1]) - before
        assert store.load_session(new)["runs"] == store.load_session(sid)["runs"], p["name"]
