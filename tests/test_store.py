"""The session store: save/load/list/rename/delete, export/import, migrations, crashes, threads."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from playground.core.errors import PlaygroundError
from playground.store import (EXPORT_FORMAT, MIGRATIONS, Store, default_path, default_store,
                              is_valid_session_id, new_session_id, schema_version)
from playground.core.trace import Step, Trace

ROOT = Path(__file__).resolve().parents[1]


def make_trace(decoder: str = "greedy", n: int = 5, seed: int = 0, text_pad: str = "") -> dict:
    """A schema-valid trace dict with the replay fields (tokens, pieces) the engine adds."""
    rng = random.Random(seed)
    tr = Trace(model="tiny-llama", decoder=decoder, params={"temperature": 0.7}, seed=seed,
               prompt="ROMEO:", prompt_ids=[5, 6])
    out = []
    for i in range(n):
        tok = rng.randrange(10, 300)
        probs = sorted((rng.random() for _ in range(4)), reverse=True)
        s = Step("token", [tok], dist={"top_ids": [tok, 1, 2, 3], "raw": probs, "final": probs,
                                       "chosen": tok, "entropy": 1.25})
        s.i, s.t, s.target_forwards = i, 0.01 * i, i + 1
        tr.steps.append(s)
        out.append(tok)
    tr.output_ids, tr.text = out, "".join(f"<{t}>" for t in out) + text_pad
    tr.stats = {"new_tokens": n, "target_forwards": n, "finish_reason": "length", "wall_s": 0.1}
    d = tr.to_dict()
    d["tokens"] = {str(t): f"<{t}>" for t in sorted(set(out) | {1, 2, 3, 5, 6})}
    d["pieces"] = [f"<{t}>" for t in out]
    return d


def dump(path: Path) -> tuple:
    """Every row of both tables: to show that a failed operation changed nothing."""
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("SELECT * FROM sessions ORDER BY id").fetchall(),
                conn.execute("SELECT * FROM runs ORDER BY session_id, lane").fetchall())
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
def store(db: Path):
    s = Store(db)
    yield s
    s.close()


def save(store: Store, title: str = "demo", decoders: tuple[str, ...] = ("greedy", "top_p")) -> str:
    traces = [make_trace(d, seed=i) for i, d in enumerate(decoders)]
    return store.save_session(title, "tiny-llama", "ROMEO:", {"max_new_tokens": 5, "lanes": len(traces)}, traces)


# ---------------------------------------------------------------------- basics
def test_save_load_roundtrip(store: Store) -> None:
    traces = [make_trace("greedy", seed=1), make_trace("top_p", seed=2), make_trace("beam", seed=3)]
    settings = {"max_new_tokens": 5, "metric": "entropy", "nested": {"a": [1, 2.5, None]}}
    sid = store.save_session("Three lanes", "tiny-llama", "ROMEO:", settings, traces)
    assert is_valid_session_id(sid)
    s = store.load_session(sid)
    assert s["id"] == sid and s["title"] == "Three lanes" and s["model"] == "tiny-llama"
    assert s["prompt"] == "ROMEO:" and s["settings"] == settings
    assert s["runs"] == traces  # every field, lane order, token texts and pieces included
    assert s["decoders"] == ["greedy", "top_p", "beam"]
    assert s["created"].endswith("+00:00")


def test_engine_trace_roundtrip(store: Store, llama_handle) -> None:
    from playground.engine import prepare

    run = prepare(llama_handle, "greedy", "ROMEO: But soft", max_new_tokens=6)
    trace = run.finish()
    d = json.loads(json.dumps(trace.to_dict()))  # what the UI hands over: plain JSON values
    assert d["tokens"] and len(d["pieces"]) == 6
    sid = store.save_session("real", trace.model, trace.prompt, {}, [d])
    exported = json.loads(json.dumps(store.export_session(sid)))
    new = store.import_session(exported)
    assert store.load_session(new)["runs"] == [d] == store.load_session(sid)["runs"]


def test_list_newest_first_with_decoders(store: Store) -> None:
    a = save(store, "first", ("greedy",))
    b = save(store, "second", ("top_k", "top_p", "greedy"))
    c = save(store, "third", ("beam",))
    listed = store.list_sessions()
    assert [s["id"] for s in listed] == [c, b, a]
    assert listed[1] == {"id": b, "title": "second", "model": "tiny-llama",
                         "decoders": ["top_k", "top_p", "greedy"], "created": listed[1]["created"],
                         "parent": None, "branch": None, "owner": None, "blind": False, "stopped": False, "failed_lanes": []}
    assert store.count() == 3
    assert [s["id"] for s in store.list_sessions(limit=2)] == [c, b]
    assert store.list_sessions(limit=2)[1]["decoders"] == ["top_k", "top_p", "greedy"]
    assert store.list_sessions(limit=0) == []


def test_numpy_values_are_stored_as_plain_json(store: Store) -> None:
    import numpy as np

    trace = make_trace()
    trace["steps"][0]["dist"]["final"] = np.array([0.5, 0.25], dtype=np.float32)
    trace["stats"]["wall_s"] = np.float64(0.125)
    sid = store.save_session("np", "m", "p", {"seed": np.int64(3)}, [trace])
    s = store.load_session(sid)
    assert s["runs"][0]["steps"][0]["dist"]["final"] == [0.5, 0.25] and s["runs"][0]["stats"]["wall_s"] == 0.125
    assert s["settings"] == {"seed": 3}


def test_rename_and_delete(store: Store, db: Path) -> None:
    a, b = save(store, "a"), save(store, "b")
    store.rename_session(a, "  A  new\n title ")
    assert store.load_session(a)["title"] == "A new title"
    store.delete_session(a)
    with pytest.raises(PlaygroundError, match="no session"):
        store.load_session(a)
    sessions, runs = dump(db)
    assert [r[0] for r in sessions] == [b] and {r[0] for r in runs} == {b}  # runs went too
    assert store.load_session(b)["title"] == "b"


def test_titles(store: Store) -> None:
    sid = store.save_session("", "m", "ROMEO: " + "x" * 100, {}, [make_trace()])
    assert store.load_session(sid)["title"] == ("ROMEO: " + "x" * 100)[:60] + "..."
    sid = store.save_session("t" * 500, "m", "p", {}, [make_trace()])
    assert len(store.load_session(sid)["title"]) == 200
    with pytest.raises(PlaygroundError, match="cannot be empty"):
        store.rename_session(sid, "   ")
    with pytest.raises(PlaygroundError, match="at most 200"):
        store.rename_session(sid, "t" * 201)


def test_ids_are_unguessable_tokens(store: Store) -> None:
    ids = {save(store, str(i), ("greedy",)) for i in range(20)}
    assert len(ids) == 20
    for sid in ids:
        assert len(sid) == 32 and is_valid_session_id(sid)  # 32 url-safe chars, ~192 random bits
    many = [new_session_id() for _ in range(3000)]
    assert len(set(many)) == 3000 and all(is_valid_session_id(x) for x in many)
    assert not any(x[0] in "-_" for x in many)  # `playground sessions show <id>` never sees an option
    assert len({x[0] for x in many}) == 62 and len({c for x in many for c in x[1:]}) == 64
    for bad in ("", "abc", "a" * 31, "-" + "a" * 31, "_" + "a" * 31, "a" * 33, "a" * 31 + "!", "../../etc/passwd", "a" * 31 + "\n",
                None, 12, b"a" * 32, "<script>alert(1)</script>aaaaaaa"):
        assert not is_valid_session_id(bad)


# ---------------------------------------------------------------------- bad input changes nothing
@pytest.mark.parametrize("op", ["load", "rename", "delete", "export"])
def test_unknown_and_malformed_ids(store: Store, db: Path, op: str) -> None:
    save(store)
    before = dump(db)
    call = {"load": store.load_session, "export": store.export_session, "delete": store.delete_session,
            "rename": lambda sid: store.rename_session(sid, "x")}[op]
    with pytest.raises(PlaygroundError, match=r"^no session with id A{32}$"):
        call("A" * 32)
    for bad in ("nope", "<b>x</b>", "A" * 40, None):
        with pytest.raises(PlaygroundError) as e:
            call(bad)
        assert str(e.value) == "malformed session id"  # the bad value is never echoed
    assert dump(db) == before


def test_save_rejects_bad_traces(store: Store, db: Path) -> None:
    save(store)
    before = dump(db)
    broken = make_trace()
    del broken["steps"]
    cases = [
        ([make_trace(), broken], "lane 2: trace is missing field"),
        ([], "at least one run"),
        ([dict(make_trace(), tokens=[1, 2])], "'tokens' must map"),
        ([dict(make_trace(), schema=99)], "unsupported trace schema"),
    ]
    for traces, msg in cases:
        with pytest.raises(PlaygroundError, match=msg):
            store.save_session("t", "m", "p", {}, traces)
    with pytest.raises(PlaygroundError, match="settings cannot be stored as JSON"):
        store.save_session("t", "m", "p", {"x": object()}, [make_trace()])
    with pytest.raises(PlaygroundError, match="settings must be a JSON object"):
        store.save_session("t", "m", "p", ["x"], [make_trace()])  # type: ignore[arg-type]
    assert dump(db) == before


# ---------------------------------------------------------------------- export / import
def test_export_import_roundtrip(store: Store) -> None:
    sid = save(store, "shared", ("greedy", "top_p"))
    original = store.load_session(sid)
    exported = store.export_session(sid)
    assert exported["format"] == EXPORT_FORMAT and exported["version"] == 1
    text = json.dumps(exported)
    ids = [store.import_session(exported), store.import_session(text), store.import_session(text.encode())]
    assert len(set(ids) | {sid}) == 4  # a new id every time; the original is untouched
    for new in ids:
        s = store.load_session(new)
        assert s["runs"] == original["runs"]
        for k in ("title", "model", "prompt", "settings", "decoders"):
            assert s[k] == original[k]
    assert store.load_session(sid) == original


def _export_variants(good: dict) -> list[tuple[object, str]]:
    bad_trace = json.loads(json.dumps(good))
    bad_trace["runs"][1]["steps"][0]["kind"] = "teleport"
    no_runs = dict(good)
    del no_runs["runs"]
    return [
        ("{not json", "not valid JSON"),
        (b"\xff\xfe garbage", "not valid JSON"),
        ("[1, 2, 3]", "not a session export"),
        (json.dumps({"format": "something-else", "version": 1}), "not a session export"),
        (json.dumps(dict(good, version=2)), "unsupported session export version 2"),
        (json.dumps(dict(good, version="1")), "unsupported session export version"),
        (json.dumps(no_runs), "missing field"),
        (json.dumps(dict(good, runs=[])), "at least one run"),
        (json.dumps(dict(good, runs={"a": 1})), "at least one run"),
        (json.dumps(dict(good, settings="x")), "settings must be a JSON object"),
        (json.dumps(dict(good, prompt=3)), "prompt must be text"),
        (json.dumps(bad_trace), "lane 2: trace step 0 has no valid kind"),
        (bad_trace, "lane 2: trace step 0 has no valid kind"),
        (42, "must be a session export"),
    ]


def test_import_rejects_bad_input_and_changes_nothing(store: Store, db: Path) -> None:
    good = store.export_session(save(store))
    before = dump(db)
    for data, msg in _export_variants(good):
        with pytest.raises(PlaygroundError, match=msg) as e:
            store.import_session(data)  # type: ignore[arg-type]
        assert "\n" not in str(e.value)
    assert dump(db) == before


def test_import_size_limit(store: Store, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = store.export_session(save(store))
    before = dump(db)
    text = json.dumps(good)
    monkeypatch.setenv("PLAYGROUND_MAX_IMPORT_BYTES", str(len(text.encode()) - 1))
    for data in (text, text.encode(), good):
        with pytest.raises(PlaygroundError, match=r"the import is [\d,]+ bytes; the limit here is"):
            store.import_session(data)
    assert dump(db) == before
    monkeypatch.setenv("PLAYGROUND_MAX_IMPORT_BYTES", str(len(text.encode())))
    store.import_session(text)  # exactly at the limit is fine
    assert store.count() == 2


# ---------------------------------------------------------------------- schema & files
def test_wal_and_schema_version(store: Store, db: Path) -> None:
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.version() == schema_version() == len(MIGRATIONS) >= 1


def test_older_database_is_migrated(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Version 0: a database file that exists but has never been set up.
    sqlite3.connect(db).execute("CREATE TABLE unrelated (x)").connection.close()
    n = schema_version()
    with Store(db) as s:
        assert s.version() == n
        sid = save(s, "kept")
        before = s.load_session(sid)

    def v_next(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE sessions ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    monkeypatch.setattr("playground.store.MIGRATIONS", [*MIGRATIONS, v_next])
    with Store(db) as s:
        assert s.version() == n + 1
        assert s.load_session(sid) == before
        assert "pinned" in s.db["sessions"].columns_dict
        assert s.conn.execute("SELECT pinned FROM sessions").fetchall() == [(0,)]


def test_failed_migration_changes_nothing(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(db) as s:
        sid = save(s)
    before = dump(db)

    def v_next(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE sessions ADD COLUMN half INTEGER")
        conn.execute("THIS IS NOT SQL")

    monkeypatch.setattr("playground.store.MIGRATIONS", [*MIGRATIONS, v_next])
    with pytest.raises(PlaygroundError, match="cannot use the session database"):
        Store(db)
    monkeypatch.setattr("playground.store.MIGRATIONS", MIGRATIONS)
    with Store(db) as s:
        assert s.version() == schema_version() and "half" not in s.db["sessions"].columns_dict
        assert s.load_session(sid)
    assert dump(db) == before


def test_newer_database_is_refused(db: Path) -> None:
    with Store(db):
        pass
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(PlaygroundError, match=f"schema version 99; this playground reads up to {schema_version()}"):
        Store(db)


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "junk.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(PlaygroundError, match="cannot use the session database"):
        Store(bad)


def test_default_path_and_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAYGROUND_DB", str(tmp_path / "a" / "env.db"))
    assert default_path() == str(tmp_path / "a" / "env.db")
    s1 = default_store()
    assert s1.path == default_path() and default_store() is s1 and (tmp_path / "a" / "env.db").exists()
    monkeypatch.setenv("PLAYGROUND_DB", str(tmp_path / "other.db"))
    assert default_store().path == str(tmp_path / "other.db")
    monkeypatch.delenv("PLAYGROUND_DB")
    monkeypatch.chdir(tmp_path)
    real_isdir = os.path.isdir
    monkeypatch.setattr(os.path, "isdir", lambda p: False if p == "/data" else real_isdir(p))
    assert default_path() == str(tmp_path / "playground.db")
    monkeypatch.setattr(os.path, "isdir", lambda p: True if p == "/data" else real_isdir(p))
    monkeypatch.setattr(os, "access", lambda p, mode: p == "/data")
    assert default_path() == "/data/playground.db"


# ---------------------------------------------------------------------- threads
def test_concurrent_writers_lose_nothing(db: Path) -> None:
    shared = Store(db)
    saved: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(k: int, own: bool) -> None:
        try:
            st = Store(db) if own else shared
            for i in range(8):
                sid = st.save_session(f"w{k}-{i}", "m", "p", {"k": k, "i": i},
                                      [make_trace(seed=k * 100 + i), make_trace("top_p", seed=i)])
                with lock:
                    saved.append(sid)
                if i % 3 == 0:
                    st.list_sessions()  # readers interleave with writers
            if own:
                st.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k, k % 2 == 0)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(saved) == len(set(saved)) == 48
    assert {s["id"] for s in shared.list_sessions()} == set(saved)
    for sid in saved:
        s = shared.load_session(sid)
        k, i = s["settings"]["k"], s["settings"]["i"]
        assert s["title"] == f"w{k}-{i}" and s["runs"][0] == make_trace(seed=k * 100 + i)
    shared.close()


# ---------------------------------------------------------------------- crashes
CHILD = r"""
import sys, time
from playground.store import Store

path, mode = sys.argv[1], sys.argv[2]
store = Store(path)

def trace(lane, n):
    big = "x" * 200_000  # large rows: a write spans many pages
    return {"schema": 1, "model": "m", "decoder": "greedy", "params": {}, "seed": n, "prompt": "p",
            "prompt_ids": [1], "output_ids": [2], "text": big + str(n), "stats": {"lane": lane},
            "steps": [{"i": 0, "kind": "token", "committed": [2], "dist": {"top_ids": list(range(500))}}]}

if mode == "pause":
    # Stop inside the transaction, after some rows are written, and wait to be killed.
    original = Store._insert_run
    def pausing(self, conn, sid, run):
        original(self, conn, sid, run)
        if run["lane"] == 1:
            print("MID", sid, flush=True)
            time.sleep(600)
    Store._insert_run = pausing
    store.save_session("doomed", "m", "p", {}, [trace(lane, 0) for lane in range(3)])
else:
    n = 0
    while True:
        sid = store.save_session(f"s{n}", "m", "p", {"n": n}, [trace(lane, n) for lane in range(3)])
        print("OK", sid, n, flush=True)
        n += 1
"""


def _child(db: Path, mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(db), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _check_intact(db: Path) -> Store:
    s = Store(db)
    assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    orphans = s.conn.execute("SELECT count(*) FROM runs WHERE session_id NOT IN (SELECT id FROM sessions)")
    assert orphans.fetchone()[0] == 0
    for row in s.list_sessions():  # every session present is whole: all three lanes
        assert len(s.load_session(row["id"])["runs"]) == len(row["decoders"])
    return s


def test_kill_mid_transaction_leaves_previous_sessions(db: Path) -> None:
    with Store(db) as s:
        kept = [save(s, f"kept {i}") for i in range(3)]
        before = [s.load_session(k) for k in kept]
    child = _child(db, "pause")
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("MID "), child.stderr.read()  # type: ignore[union-attr]
        doomed = line.split()[1]
        # While the child holds the write transaction, readers still see the old state.
        with Store(db) as reader:
            assert reader.count() == 3
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    s = _check_intact(db)
    assert [s.load_session(k) for k in kept] == before
    with pytest.raises(PlaygroundError, match="no session"):
        s.load_session(doomed)
    assert s.conn.execute("SELECT count(*) FROM runs WHERE session_id = ?", (doomed,)).fetchone()[0] == 0
    save(s, "after the crash")  # the database is writable again
    assert s.count() == 4
    s.close()


def test_kill_at_a_random_moment_of_a_write_loop(db: Path) -> None:
    with Store(db) as s:
        kept = save(s, "kept")
    delay = random.Random(20240607).uniform(0.05, 0.4)
    child = _child(db, "loop")
    reported: list[tuple[str, int]] = []
    try:
        first = child.stdout.readline().split()  # type: ignore[union-attr]
        assert first and first[0] == "OK", child.stderr.read()  # type: ignore[union-attr]
        reported.append((first[1], int(first[2])))
        threading.Event().wait(delay)
        os.kill(child.pid, signal.SIGKILL)
        for line in child.stdout:  # type: ignore[union-attr]
            parts = line.split()
            if len(parts) == 3 and parts[0] == "OK":
                reported.append((parts[1], int(parts[2])))
    finally:
        child.kill()
        child.wait()
    s = _check_intact(db)
    assert s.load_session(kept)["title"] == "kept"
    for sid, n in reported:  # every save the child saw committed is there, whole
        got = s.load_session(sid)
        assert got["settings"] == {"n": n} and [r["text"][-len(str(n)):] for r in got["runs"]] == [str(n)] * 3
    # At most one more: committed just before the kill, not yet reported.
    assert s.count() - 1 in (len(reported), len(reported) + 1)
    s.close()


# ---------------------------------------------------------------------- branches (issue 16)
def _branch(store: Store, parent: str, lane: int = 0, step: int = 2, token: int = 77, title: str = "b") -> str:
    traces = [make_trace("greedy", seed=40 + step)]
    traces[0]["force"] = [[step, token]]
    return store.save_session(title, "tiny-llama", "ROMEO:", {}, traces, parent=parent,
                              branch={"lane": lane, "step": step, "position": step, "token": token})


def test_branch_tree_saved_and_listed(store: Store) -> None:
    root = save(store, "root")
    a = _branch(store, root, lane=0, step=1, title="a")
    b = _branch(store, root, lane=1, step=3, title="b")
    aa = _branch(store, a, lane=0, step=4, title="aa")
    s = store.load_session(a)
    assert s["parent"] == root and s["branch"] == {"lane": 0, "step": 1, "position": 1, "token": 77}
    assert s["branches"] == [aa] and store.load_session(root)["branches"] == [a, b]
    assert store.load_session(root)["parent"] is None and store.load_session(root)["branch"] is None
    tree = store.branch_tree(aa)  # from any member: the whole tree, from its root
    assert tree["id"] == root and [k["id"] for k in tree["branches"]] == [a, b]
    assert [k["id"] for k in tree["branches"][0]["branches"]] == [aa]
    assert tree["branches"][1]["branch"]["lane"] == 1
    listed = {s["id"]: s for s in store.list_sessions()}
    assert listed[aa]["parent"] == a and listed[root]["parent"] is None


def test_bad_branches_are_refused_and_change_nothing(store: Store, db: Path) -> None:
    root = save(store, "root")  # two lanes
    before = dump(db)
    good = {"lane": 0, "step": 1, "position": 1, "token": 5}
    for parent, branch, msg in [
        (root, dict(good, lane=2), "not a lane of its parent"),
        (root, dict(good, token=-1), "token must be a whole number"),
        (root, {"lane": 0}, "step must be a whole number"),
        (root, dict(good, colour="red"), "unknown field"),
        (root, dict(good, lanes="some"), "'one' or 'all'"),
        (new_session_id(), good, "no session with id"),
        (root, None, "needs both"),
        (None, good, "needs both"),
    ]:
        with pytest.raises(PlaygroundError, match=msg):
            store.save_session("x", "m", "p", {}, [make_trace()], parent=parent, branch=branch)
    assert dump(db) == before


def test_branch_tree_survives_export_and_import(store: Store, tmp_path: Path) -> None:
    root = save(store, "root")
    a = _branch(store, root, step=1, title="a")
    aa = _branch(store, a, step=4, title="aa")
    exported = json.loads(json.dumps(store.export_session(root)))
    assert [b["title"] for b in exported["branches"]] == ["a"]
    # into a fresh database: the whole tree, new ids, same traces and branch records
    with Store(tmp_path / "other.db") as other:
        new_root = other.import_session(exported)
        tree = other.branch_tree(new_root)
        assert tree["id"] == new_root and [k["title"] for k in tree["branches"]] == ["a"]
        new_a = tree["branches"][0]["id"]
        new_aa = tree["branches"][0]["branches"][0]["id"]
        assert {new_root, new_a, new_aa}.isdisjoint({root, a, aa})
        for old, new in ((root, new_root), (a, new_a), (aa, new_aa)):
            assert other.load_session(new)["runs"] == store.load_session(old)["runs"]
            assert other.load_session(new)["branch"] == store.load_session(old)["branch"]
        # a branch exported alone, into a database without its parent, becomes a root that
        # still says where it branched off
        lone = other.import_session(store.export_session(aa))
        assert other.load_session(lone)["parent"] is None
        assert other.load_session(lone)["branch"]["position"] == 4
    # ...and into the database that has its parent: it stands alone there too. An import is
    # never filed under a session already stored (it may be someone else's), and that
    # session's export does not carry it
    again = store.import_session(store.export_session(aa))
    assert store.load_session(again)["parent"] is None
    assert store.load_session(again)["branch"]["position"] == 4
    assert again not in store.load_session(a)["branches"]
    assert "branches" not in store.export_session(aa)


def test_import_rejects_a_malformed_branch_and_changes_nothing(store: Store, db: Path) -> None:
    root = save(store, "root")
    _branch(store, root)
    good = store.export_session(root)
    before = dump(db)
    no_record = json.loads(json.dumps(good))
    del no_record["branches"][0]["branch"]
    bad_trace = json.loads(json.dumps(good))
    bad_trace["branches"][0]["runs"][0]["steps"][0]["kind"] = "teleport"
    for data, msg in [(no_record, "says nowhere where it branched off"),
                      (bad_trace, "no valid kind"),
                      (dict(good, branches="x"), "must be a list"),
                      (dict(good, branches=[{"a": 1}]), "not a session export")]:
        with pytest.raises(PlaygroundError, match=msg):
            store.import_session(data)
    assert dump(db) == before


def test_deleting_a_parent_keeps_its_branches(store: Store) -> None:
    root = save(store, "root")
    a = _branch(store, root)
    store.delete_session(root)
    s = store.load_session(a)
    assert s["parent"] is None and s["branch"]["token"] == 77


def test_a_version_1_database_gains_branches(db: Path) -> None:
    conn = sqlite3.connect(db)
    MIGRATIONS[0](conn)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO sessions VALUES ('A' || hex(randomblob(15)) || 'b', '2026-01-01', 't', 'm', 'p', '{}')")
    conn.commit()
    conn.close()
    with Store(db) as s:
        assert s.version() == schema_version() >= 2
        [listed] = s.list_sessions()
        assert listed["parent"] is None and listed["branch"] is None


def test_sessions_cli_lists_branches(store: Store, db: Path, capsys: pytest.CaptureFixture) -> None:
    from playground.cli import main

    root = save(store, "root")
    a = _branch(store, root, lane=1, step=2, token=77, title="the branch")
    assert main(["sessions", "--db", str(db), "list"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(a))
    assert f"of {root}" in line and "branch at lane 2 step 2: token 77" in line
    assert main(["sessions", "--db", str(db), "tree", a, "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["id"] == root and tree["branches"][0]["id"] == a
    assert main(["sessions", "--db", str(db), "tree", a]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith(root) and text[1].lstrip().startswith("└") and a in text[1]
    assert main(["sessions", "--db", str(db), "list", "--json"]) == 0
    listed = {s["id"]: s for s in json.loads(capsys.readouterr().out)}
    assert listed[a]["parent"] == root and listed[a]["branch"]["token"] == 77


def test_a_summary_reads_no_trace(store: Store, db: Path) -> None:
    """The Sessions list and a branch's labels read summaries: a session's traces are parsed only
    when it is opened, so a summary works even where a stored trace could not be read."""
    root = save(store, "root")
    kid = _branch(store, root, lane=1, step=3, title="kid")
    s = store.session_summary(kid)
    assert s == {"id": kid, "title": "kid", "model": "tiny-llama", "created": s["created"],
                 "decoders": ["greedy"], "parent": root,
                 "branch": {"lane": 1, "step": 3, "position": 3, "token": 77}, "branches": [],
                 "stopped": False, "failed_lanes": []}
    assert store.session_summary(root)["branches"] == [kid]
    assert store.session_summary(root)["decoders"] == ["greedy", "top_p"]
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE runs SET trace = 'not json' WHERE session_id = ?", (root,))
    assert store.session_summary(root)["title"] == "root"
    assert [x["id"] for x in store.list_sessions()] == [kid, root]
    with pytest.raises(ValueError):
        store.load_session(root)
    with pytest.raises(PlaygroundError, match=r"^no session with id A{32}$"):
        store.session_summary("A" * 32)
    with pytest.raises(PlaygroundError, match="^malformed session id$"):
        store.session_summary("<b>x</b>")
