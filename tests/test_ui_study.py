"""The Study tab's handlers: a study file's aggregate as stored, drill-down to a prompt's
comparison in the Compare tab, and one line for anything that is not a study."""

from __future__ import annotations

import contextlib
import io
import json
import math
import sqlite3
from collections import Counter

import pytest

from playground.cli import main
from playground.store import Store
from playground.study import DEFAULT_PROMPTS, METRICS, agreement, distinct, read_prompts, study_sessions


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A three-prompt, two-lane study on the bundled model: (its folder, its file, the JSON the CLI printed)."""
    folder = tmp_path_factory.mktemp("studies")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": k, "prompt": p}) + "\n" for k, p in read_prompts(DEFAULT_PROMPTS)[:3]))
    out = folder / "study.db"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["study", "--prompts", str(prompts), "--lanes", "greedy,top_p", "--max-new-tokens", "6",
                     "--seed", "3", "--no-progress", "--out", str(out), "--json"]) == 0
    return folder, out, json.loads(buf.getvalue())


@pytest.fixture()
def here(study, monkeypatch):
    """The page's own database sits beside the study: the study's folder is the data folder."""
    folder, _, _ = study
    monkeypatch.setenv("PLAYGROUND_DB", str(folder / "page.db"))
    return study


@pytest.fixture()
def view(demo):
    return demo.study_view


def _msg(html: str) -> str:
    return html.split(">", 1)[1].rsplit("<", 1)[0]


def test_table_equals_the_aggregate_recomputed_from_the_stored_traces(view, here):
    folder, out, printed = here
    state, status, rows, prompt_dd, fig = view.on_open("study.db", "perplexity")
    assert "3 prompts" in status and "pg-status-ok" in status
    with Store(out) as s:
        sessions = study_sessions(s)
    assert len(sessions) == 3 and len(rows) == 2
    for j, row in enumerate(rows):
        runs = [sess["runs"][j] for sess in sessions]
        firsts = [[int(t) for t in sess["runs"][0]["output_ids"]] for sess in sessions]
        outs = [[int(t) for t in r["output_ids"]] for r in runs]
        tokens = sum(r["stats"]["new_tokens"] for r in runs)
        forwards = sum(r["stats"]["target_forwards"] for r in runs)
        nll = sum(r["score"]["nll_sum"] for r in runs)
        scored = sum(r["score"]["tokens"] for r in runs)
        want = {"tokens_per_target_forward": tokens / forwards,
                "wall_s": sum(r["stats"]["wall_s"] for r in runs) / 3, "target_forwards": forwards / 3,
                "perplexity": math.exp(nll / scored), "distinct_1": distinct(outs, 1),
                "distinct_2": distinct(outs, 2),
                "agreement": sum(agreement(f, o) for f, o in zip(firsts, outs)) / 3}
        assert row[0] == j + 1 and row[1] == runs[0]["decoder"] == ["greedy", "top_p"][j]
        for c, (key, _title, digits) in enumerate(METRICS, start=2):
            assert row[c] == pytest.approx(want[key], abs=0.6 * 10 ** -digits), key
            assert row[c] == pytest.approx(printed["lanes"][j][key], abs=0.6 * 10 ** -digits), key
        finish = Counter(str(r["stats"]["finish_reason"]) for r in runs)
        assert row[-1] == ", ".join(f"{k} {v}" for k, v in sorted(finish.items()))
    assert state["sessions"] == printed["sessions"]
    assert [v for _label, v in prompt_dd.constructor_args["choices"]] == list(printed["sessions"])
    assert "ppl" in fig.layout.title.text
    assert "finish" in view.on_figure(state, "finish_reasons").layout.title.text.lower()


def test_drill_down_opens_that_prompts_comparison_in_compare(demo, view, here):
    from playground.store import default_store

    page = demo.compare_page
    folder, out, printed = here
    state = view.on_open(str(out), None)[0]  # an absolute path inside the data folder
    key = list(printed["sessions"])[1]
    with Store(out) as s:
        stored = s.load_session(printed["sessions"][key])
    up = view.on_open_prompt(state, key)
    assert up[view.tabs].constructor_args["selected"] == "compare"
    assert [t["output_ids"] for t in up[page.traces]] == [r["output_ids"] for r in stored["runs"]]
    assert up[page.prompt] == stored["prompt"] and "prompt " + key in up[view.status]
    # the comparison now lives in the page's store too (share link, branches), once
    sid = up[page.sid]
    assert default_store().load_session(sid)["settings"]["from_study"]["key"] == key
    assert view.on_open_prompt(state, key)[page.sid] == sid
    with Store(out) as s:  # the study itself is unchanged
        assert len(study_sessions(s)) == 3


def test_the_pages_own_database_opens_as_a_study_without_a_copy(demo, view, study, monkeypatch):
    folder, out, printed = study
    monkeypatch.setenv("PLAYGROUND_DB", str(out))
    state = view.on_open("", None)[0]
    key = list(printed["sessions"])[0]
    assert view.on_open_prompt(state, key)[demo.compare_page.sid] == printed["sessions"][key]
    with Store(out) as s:
        assert s.count() == 3


def test_no_models_needed(demo, view, here, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    state, status, rows, _dd, _fig = view.on_open("study.db", None)
    assert len(rows) == 2 and "pg-status-ok" in status
    up = view.on_open_prompt(state, list(state["sessions"])[0])
    assert up[demo.compare_page.traces][0]["output_ids"]


def test_an_upload_opens_from_a_copy_and_a_path_that_was_not_uploaded_is_refused(view, here, tmp_path, monkeypatch):
    import hashlib
    import shutil

    _, out, printed = here
    uploads = tmp_path / "gradio-uploads"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    (uploads / "abc").mkdir(parents=True)
    copy = uploads / "abc" / "uploaded.db"
    shutil.copy(out, copy)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    state, status, rows, _dd, _fig = view.on_upload(str(copy), None)
    assert state["sessions"] == printed["sessions"] and "uploaded.db" in status and len(rows) == 2
    # read from a private copy: the upload itself is never opened as a store (nor migrated)
    assert state["path"] != str(copy) and hashlib.sha256(copy.read_bytes()).hexdigest() == before
    # a direct call naming any other file on the server opens nothing
    outside = tmp_path / "elsewhere.db"
    shutil.copy(out, outside)
    state, status, *_ = view.on_upload(str(outside), None)
    assert state is None and "not a file uploaded to this page" in status


def test_what_is_not_a_study_is_one_line(view, here):
    folder, out, printed = here
    (folder / "notes.db").write_text("hello")
    raw = folder / "other.db"
    with sqlite3.connect(raw) as conn:
        conn.execute("CREATE TABLE things (x)")
    Store(folder / "empty.db").close()
    with Store(out) as s:
        one = s.load_session(next(iter(printed["sessions"].values())))
    with Store(folder / "plain.db") as s:  # a comparison saved by the page, not by a study
        s.save_session("t", one["model"], one["prompt"], {"seed": 0}, one["runs"])
    cases = [("missing.db", "no study at missing.db"), ("notes.db", "not an SQLite file"),
             ("other.db", "holds no stored comparisons"), ("empty.db", "holds no study comparisons"),
             ("plain.db", "holds no study comparisons"), ("../outside.db", "opened from"),
             ("/etc/passwd", "opened from"), (".", "is not a file")]
    for name, why in cases:
        state, status, rows, _dd, fig = view.on_open(name, None)
        assert state is None and rows == [] and fig is None, name
        assert why in status and "pg-status-error" in status, (name, status)
        assert "\n" not in _msg(status)
    with sqlite3.connect(raw) as conn:  # refused before the store could add its tables
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["things"]
    assert "no file" in view.on_upload(None, None)[1]
    assert "open a study" in view.on_open_prompt(None, "x")[view.status]
    state = view.on_open("study.db", None)[0]
    assert "pick a prompt" in view.on_open_prompt(state, "no-such-prompt")[view.status]
