"""`playground sessions ...`: every subcommand, and one-line errors with exit status 2."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from playground.cli import main
from playground.store import Store
from playground.core.trace import Step, Trace

ROOT = Path(__file__).resolve().parents[1]


def make_trace(decoder: str = "greedy", seed: int = 0) -> dict:
    """A small schema-valid trace dict, different for each seed."""
    tr = Trace(model="tiny-llama", decoder=decoder, params={}, seed=seed, prompt="ROMEO:", prompt_ids=[5])
    s = Step("token", [10 + seed], dist={"top_ids": [10 + seed, 3], "final": [0.9, 0.1]})
    s.i = 0
    tr.steps, tr.output_ids, tr.text = [s], [10 + seed], f"lane text {decoder} {seed}"
    tr.stats = {"new_tokens": 1, "target_forwards": 1, "finish_reason": "length"}
    return dict(tr.to_dict(), tokens={str(10 + seed): "tok", "3": "x", "5": "R"}, pieces=["tok"])


def dump(path: Path) -> tuple:
    """Every row of both tables (to show a failed command changed nothing)."""
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("SELECT * FROM sessions ORDER BY id").fetchall(),
                conn.execute("SELECT * FROM runs ORDER BY session_id, lane").fetchall())
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "s.db"
    monkeypatch.setenv("PLAYGROUND_DB", str(tmp_path / "env-default.db"))
    return path


@pytest.fixture
def ids(db: Path) -> list[str]:
    with Store(db) as s:
        a = s.save_session("first", "tiny-llama", "ROMEO:", {"x": 1}, [make_trace("greedy")])
        b = s.save_session("second", "tiny-llama", "JULIET:", {}, [make_trace("top_k", seed=1),
                                                                    make_trace("top_p", seed=2)])
    return [a, b]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sessions", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list(capsys, db: Path, ids: list[str]) -> None:
    code, out, _ = cli(capsys, "list", "--db", str(db))
    assert code == 0
    lines = out.splitlines()
    assert [ln.split()[0] for ln in lines] == ids[::-1]
    assert "top_k,top_p" in lines[0] and lines[0].endswith("second")
    code, out, _ = cli(capsys, "--db", str(db), "list", "--json")  # --db before the command too
    listed = json.loads(out)
    assert [s["id"] for s in listed] == ids[::-1] and listed[0]["decoders"] == ["top_k", "top_p"]
    code, out, _ = cli(capsys, "list", "--limit", "1", "--db", str(db))
    assert code == 0 and out.split()[0] == ids[1] and len(out.splitlines()) == 1


def test_default_database_from_env(capsys, db: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PLAYGROUND_DB", str(db))
    with Store(db) as s:
        sid = s.save_session("env", "m", "p", {}, [make_trace()])
    code, out, _ = cli(capsys, "list", "--json")
    assert code == 0 and [s["id"] for s in json.loads(out)] == [sid]


def test_show(capsys, db: Path, ids: list[str]) -> None:
    code, out, _ = cli(capsys, "show", ids[1], "--db", str(db))
    assert code == 0 and "second" in out and "lane 1: top_k" in out and "lane 2: top_p" in out and make_trace("top_p", seed=2)["text"] in out
    code, out, _ = cli(capsys, "show", ids[1], "--json", "--db", str(db))
    assert json.loads(out)["runs"] == [make_trace("top_k", seed=1), make_trace("top_p", seed=2)]


def test_export_import_roundtrip(capsys, db: Path, ids: list[str], tmp_path: Path, monkeypatch) -> None:
    code, out, _ = cli(capsys, "export", ids[1], "--db", str(db))
    assert code == 0
    exported = json.loads(out)
    target = tmp_path / "export.json"
    code, _, err = cli(capsys, "export", ids[1], "-o", str(target), "--db", str(db))
    assert code == 0 and json.loads(target.read_text()) == exported and "exported" in err

    code, out, _ = cli(capsys, "import", str(target), "--db", str(db))
    new = out.strip()
    assert code == 0 and new not in ids
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(target.read_bytes())))
    code, out, _ = cli(capsys, "import", "-", "--json", "--db", str(db))
    new2 = json.loads(out)["id"]
    with Store(db) as s:
        assert s.count() == 4
        for sid in (new, new2):
            assert s.load_session(sid)["runs"] == s.load_session(ids[1])["runs"]


def test_rename_and_delete(capsys, db: Path, ids: list[str]) -> None:
    assert cli(capsys, "rename", ids[0], "Renamed lanes", "--db", str(db))[0] == 0
    code, _, err = cli(capsys, "delete", ids[1], "--db", str(db))
    assert code == 0 and ids[1] in err
    with Store(db) as s:
        assert [(x["id"], x["title"]) for x in s.list_sessions()] == [(ids[0], "Renamed lanes")]


def test_import_creates_the_database(capsys, tmp_path: Path, db: Path, ids: list[str]) -> None:
    with Store(db) as s:
        text = json.dumps(s.export_session(ids[0]))
    f = tmp_path / "e.json"
    f.write_text(text)
    fresh = tmp_path / "new" / "fresh.db"
    code, out, _ = cli(capsys, "import", str(f), "--db", str(fresh))
    assert code == 0 and fresh.exists()
    with Store(fresh) as s:
        assert s.load_session(out.strip())["title"] == "first"


def test_read_commands_never_create_a_database(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    code, out, _ = cli(capsys, "list", "--json", "--db", str(missing))
    assert code == 0 and json.loads(out) == []
    code, _, err = cli(capsys, "show", "A" * 32, "--db", str(missing))
    assert code == 2 and err == f"error: no session with id {'A' * 32}\n"
    assert not missing.exists() and not (tmp_path / "env-default.db").exists()


@pytest.mark.parametrize("argv, message", [
    (["show", "not-an-id"], "malformed session id"),
    (["export", "<script>"], "malformed session id"),
    (["delete", "A" * 32], "no session with id"),
    (["rename", "A" * 32, "x"], "no session with id"),
    (["rename", "@ID", "   "], "title cannot be empty"),
    (["import", "@NOTJSON"], "not valid JSON"),
    (["import", "@WRONG"], "not a session export"),
    (["import", "@BADTRACE"], "lane 1: trace is missing field"),
    (["import", "@BIG"], "the limit here is"),
    (["import", "@MISSING"], "cannot read"),
    ([], "sessions needs a command"),
    (["frobnicate"], "invalid choice"),
    (["show"], "required"),
])
def test_bad_input_is_one_line_exit_2(capsys, db: Path, ids: list[str], tmp_path: Path, monkeypatch,
                                      argv: list[str], message: str) -> None:
    files = {"@NOTJSON": "{oops", "@WRONG": json.dumps({"format": "x"}),
             "@BADTRACE": json.dumps({"format": "decoder-playground-session", "version": 1, "title": "t",
                                      "model": "m", "prompt": "p", "settings": {}, "runs": [{"schema": 1}]}),
             "@BIG": json.dumps({"format": "decoder-playground-session", "pad": "x" * 2000})}
    monkeypatch.setenv("PLAYGROUND_MAX_IMPORT_BYTES", "1000")
    resolved = []
    for a in argv:
        if a in files:
            (tmp_path / "in.json").write_text(files[a])
            a = str(tmp_path / "in.json")
        elif a == "@MISSING":
            a = str(tmp_path / "nope.json")
        elif a == "@ID":
            a = ids[0]
        resolved.append(a)
    before = dump(db)
    code, out, err = cli(capsys, *resolved, *(["--db", str(db)] if resolved else []))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert dump(db) == before


def test_oversized_stdin_import(capsys, db: Path, ids: list[str], monkeypatch) -> None:
    monkeypatch.setenv("PLAYGROUND_MAX_IMPORT_BYTES", "100")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"{" + b" " * 500 + b"}")))
    before = dump(db)
    code, _, err = cli(capsys, "import", "-", "--db", str(db))
    assert code == 2 and err == "error: the import is over the limit of 100 bytes\n"
    assert dump(db) == before


@pytest.mark.slow  # a fresh interpreter imports the whole CLI (torch included): ~10 s on a busy machine
def test_subprocess_smoke(tmp_path: Path, db: Path, ids: list[str]) -> None:
    env = dict(os.environ, PLAYGROUND_DB=str(db),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "playground", "sessions", "list", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [s["id"] for s in json.loads(done.stdout)] == ids[::-1]
