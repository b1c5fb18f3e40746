"""Owners, limits and clean-up behind a hosted instance, in process (issue 29): the Sessions
tab's handlers in both modes, the store's owner checks, imports that never graft, exports that
do not pile up, the request guard, and every stored session staying readable."""

from __future__ import annotations

import json
import time

import gradio as gr
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from playground.core.errors import PlaygroundError
from playground.ownership import owner_id
from playground.store import Store, parse_export
from playground.ui.request_guard import RequestGuard

KEY_A = "A" * 40
KEY_B = "B" * 40


def trace(decoder: str = "greedy") -> dict:
    from playground.engine import prepare

    return prepare(model="tiny-shakespeare", decoder=decoder, prompt="ROMEO:\n", max_new_tokens=3).finish().to_dict()


@pytest.fixture()
def hosted(db, monkeypatch):
    """A Space-mode instance's store with one session of A's and one of nobody's."""
    from playground.store import default_store

    monkeypatch.setenv("SPACE_ID", "someone/decoder-playground")
    store = default_store()
    t = trace()
    return {"store": store, "a": store.save_session("A's", "tiny-shakespeare", "ROMEO:\n", {}, [t], owner=owner_id(KEY_A)),
            "cli": store.save_session("nobody's", "tiny-shakespeare", "ROMEO:\n", {}, [t])}


def status(out: list) -> str:
    return next(v for v in out if isinstance(v, str) and "pg-status" in v)


def test_owner_ids_are_hashes_of_well_formed_keys_only():
    assert owner_id(KEY_A) != owner_id(KEY_B) and len(owner_id(KEY_A)) == 64
    assert KEY_A not in owner_id(KEY_A)
    for bad in (None, "", "short", 123, ["x"], "A" * 31, "A" * 129, "x" * 40 + "<"):
        assert owner_id(bad) is None


def test_a_visitor_lists_and_changes_only_their_own_sessions(demo, hosted):
    sv, store = demo.sessions_view, hosted["store"]
    rows, ids, line = sv.on_refresh(KEY_B, None)
    assert ids == [] and "made in this browser" in line
    rows, ids, _ = sv.on_refresh(KEY_A, None)
    assert ids == [hosted["a"]]
    for key in (KEY_B, None, "short"):
        assert "may change it" in status(sv.on_rename(hosted["a"], "pwned", key, None))
        for confirm in (None, hosted["a"]):  # refused at the first press, and at the second
            assert "may change it" in status(sv.on_delete(hosted["a"], key, None, confirm))
        assert "only sessions made in this browser" in status(sv.on_export(hosted["a"], key, None))
    assert store.load_session(hosted["a"])["title"] == "A's"
    # nobody's session (the command line's, the API's) is changed by no visitor
    for confirm in (None, hosted["cli"]):
        assert "may change it" in status(sv.on_delete(hosted["cli"], KEY_A, None, confirm))
    assert "Renamed." in status(sv.on_rename(hosted["a"], "mine", KEY_A, None))
    assert "Exported" in status(sv.on_export(hosted["a"], KEY_A, None))
    assert "Confirm delete" in status(sv.on_delete(hosted["a"], KEY_A, None))  # the first press asks
    assert "Deleted." in status(sv.on_delete(hosted["a"], KEY_A, None, hosted["a"]))
    assert store.count() == 1


def test_a_session_open_by_its_link_is_listed_and_exportable_but_read_only(demo, hosted):
    sv = demo.sessions_view
    _rows, ids, _ = sv.on_refresh(KEY_B, hosted["a"])
    assert ids == [hosted["a"]]
    sid, title, _label = sv.on_select(ids, KEY_B, hosted["a"], evt=gr.SelectData(None, {"index": [0, 0], "value": "x"}))
    assert sid == hosted["a"] and title == "A's"
    assert "Exported" in status(sv.on_export(sid, KEY_B, hosted["a"]))
    assert "may change it" in status(sv.on_rename(sid, "pwned", KEY_B, hosted["a"]))
    for confirm in (None, sid):
        assert "may change it" in status(sv.on_delete(sid, KEY_B, hosted["a"], confirm))
    # a row index beyond this page's listing, or another listing's ids, selects nothing
    assert sv.on_select(ids, KEY_B, None, evt=gr.SelectData(None, {"index": [0, 0], "value": "x"}))[0] is None
    assert sv.on_select(ids, KEY_B, hosted["a"], evt=gr.SelectData(None, {"index": [5, 0], "value": "x"}))[0] is None


def test_an_import_belongs_to_the_importing_browser(demo, hosted):
    sv, store = demo.sessions_view, hosted["store"]
    data = json.dumps(store.export_session(hosted["cli"])).encode()
    _rows, ids, line = sv.on_import(data, KEY_B, None)
    assert "Imported" in line and len(ids) == 1
    assert store.session_owner(ids[0]) == owner_id(KEY_B)


def test_one_user_keeps_every_session_listed_and_changeable(demo, db, monkeypatch):
    from playground.store import default_store

    monkeypatch.delenv("SPACE_ID", raising=False)
    store = default_store()
    a = store.save_session("A's", "tiny-shakespeare", "ROMEO:\n", {}, [trace()], owner=owner_id(KEY_A))
    b = store.save_session("cli", "tiny-shakespeare", "ROMEO:\n", {}, [trace()])
    sv = demo.sessions_view
    assert set(sv.on_refresh(None, None)[1]) == {a, b}
    assert "Renamed." in status(sv.on_rename(a, "x", None, None))
    assert "Deleted." in status(sv.on_delete(b, None, None, b))


def test_the_store_refuses_a_change_by_anyone_but_the_owner(tmp_path):
    with Store(tmp_path / "s.db") as store:
        a = store.save_session("t", "m", "p", {}, [trace()], owner=owner_id(KEY_A))
        for who in (owner_id(KEY_B), "-"):
            with pytest.raises(PlaygroundError, match="only the browser that made this session may change it"):
                store.rename_session(a, "x", owned_by=who)
            with pytest.raises(PlaygroundError, match="only the browser that made this session may change it"):
                store.delete_session(a, owned_by=who)
        # a missing session says the same: a caller learns nothing about ids they do not hold
        with pytest.raises(PlaygroundError, match="only the browser that made this session may change it"):
            store.delete_session("Z" * 32, owned_by=owner_id(KEY_B))
        store.rename_session(a, "x", owned_by=owner_id(KEY_A))
        assert [s["id"] for s in store.list_sessions(owned_by=owner_id(KEY_B))] == []
        with pytest.raises(PlaygroundError, match="malformed owner id"):
            store.save_session("t", "m", "p", {}, [trace()], owner="not-a-hash")


def test_a_branch_of_someone_elses_session_is_not_filed_under_it(hosted, monkeypatch):
    from playground.ui.branch_panel import run_branch

    store = hosted["store"]
    tr = store.load_session(hosted["a"])["runs"][0]
    token = tr["steps"][1]["dist"]["top_ids"][1]
    theirs = run_branch(hosted["a"], 0, token, 1, "one", KEY_B)
    assert store.load_session(theirs)["parent"] is None and store.session_owner(theirs) == owner_id(KEY_B)
    assert store.load_session(hosted["a"])["branches"] == []
    mine = run_branch(hosted["a"], 0, token, 1, "one", KEY_A)
    assert store.load_session(mine)["parent"] == hosted["a"]


# ---------------------------------------------------------------------- every stored session stays readable
@pytest.mark.parametrize("seed", [2**63, 2**64, -1])
def test_an_import_with_a_seed_the_store_cannot_hold_is_refused(tmp_path, seed):
    with Store(tmp_path / "s.db") as store:
        sid = store.save_session("t", "m", "p", {"seed": 1}, [trace()])
        export = store.export_session(sid)
        export["runs"][0]["seed"] = seed
        # over 64 bits the import's number check names it first; within them, the seed check
        with pytest.raises(PlaygroundError, match="seed must be between 0 and 2\\^63 - 1|outside the 64-bit range"):
            store.import_session(json.dumps(export))
        export["runs"][0]["seed"] = 0
        export["settings"]["junk"] = [1, 2**70]
        with pytest.raises(PlaygroundError, match="outside the 64-bit range"):
            store.import_session(json.dumps(export))
        assert store.count() == 1


def test_a_deeply_nested_import_is_one_line():
    deep = '{"format": "decoder-playground-session", "version": 1, "settings": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(PlaygroundError, match="^the import nests deeper than"):
        parse_export(deep)
    shallow_but_deep = {"format": "decoder-playground-session", "version": 1, "model": "m", "prompt": "p",
                        "runs": [], "settings": {}}
    node: dict = shallow_but_deep["settings"]
    for _ in range(400):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(PlaygroundError, match="nests deeper than"):
        parse_export(shallow_but_deep)


def test_a_seed_over_the_limit_is_refused_before_any_model_loads(monkeypatch):
    from playground import engine

    monkeypatch.setattr(engine, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    for seed in (2**63, -1, "x", 1.5, None):
        with pytest.raises(PlaygroundError, match="^seed must"):
            engine.prepare(model="tiny-shakespeare", decoder="greedy", prompt="hi", seed=seed)


def test_a_prompt_over_the_limit_is_refused_before_any_model_loads(monkeypatch):
    from playground import engine

    monkeypatch.setenv("PLAYGROUND_MAX_PROMPT_CHARS", "100")
    monkeypatch.setattr(engine, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    t0 = time.perf_counter()
    with pytest.raises(PlaygroundError, match="^the prompt has 10000000 characters; the limit here is 100$"):
        engine.prepare(model="tiny-shakespeare", decoder="greedy", prompt="x" * 10_000_000)
    assert time.perf_counter() - t0 < 1.0
    for bad, line in ((123, "the prompt must be text"), (["x"], "the prompt must be text")):
        with pytest.raises(PlaygroundError, match=f"^{line}"):
            engine.prepare(model="tiny-shakespeare", decoder="greedy", prompt=bad)
    with pytest.raises(PlaygroundError, match="^knobs nests deeper than 32 levels"):
        node: dict = {}
        root = node
        for _ in range(40):
            node["k"] = {}
            node = node["k"]
        engine.prepare(model="tiny-shakespeare", decoder="greedy", prompt="hi", params=root)


def test_a_refused_path_model_never_says_whether_a_directory_holds_a_model(tmp_path, monkeypatch):
    from playground.core.models.sources import allowed

    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "bundled")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "config.json").write_text("{}")
    lines = set()
    for spec in (str(tmp_path / "real"), str(tmp_path / "nothing"), str(tmp_path)):
        with pytest.raises(PlaygroundError) as e:
            allowed(spec, False)
        lines.add(str(e.value))
    assert lines == {"loading path models is disabled on this instance (allowed: bundled)"}


# ---------------------------------------------------------------------- exports, bodies, the study tab
def test_exports_stream_from_the_store_and_leave_nothing_behind(demo, hosted, tmp_path, monkeypatch):
    """Export writes no file: its link streams the session from the store, keeps a title in
    any script, and expires; N exports take no space."""
    import re
    import tempfile

    from playground.ui.page_routes import page_routes
    from playground.ui.page_session import PageSessions

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # anything written would land here
    sv, store = demo.sessions_view, hosted["store"]
    store.rename_session(hosted["a"], "Spéculatif — 投機的")
    client = TestClient(Starlette(routes=page_routes(sessions=PageSessions(), exports=sv.exports)))
    hrefs = []
    for _ in range(5):
        link, line = sv.on_export(hosted["a"], KEY_A, None)
        assert "Exported" in line
        hrefs.append(re.search(r'href="([^"]+)"', link["value"]).group(1))
    assert len(set(hrefs)) == 5 and list(scratch.iterdir()) == []
    r = client.get("/" + hrefs[0])
    assert r.status_code == 200 and r.json()["title"] == "Spéculatif — 投機的"
    assert "filename*=UTF-8''Sp%C3%A9culatif" in r.headers["content-disposition"]
    assert client.get("/playground_api/export/" + "x" * 32).status_code == 404
    assert client.get("/playground_api/export/../../etc/passwd").status_code == 404


def test_export_links_expire():
    from playground.ui.exports import ExportLinks

    now = [0.0]
    links = ExportLinks(ttl=10, clock=lambda: now[0])
    token = links.issue("S" * 32, "s.json")
    assert links.resolve(token) == ("S" * 32, "s.json") and len(links) == 1
    now[0] = 11
    assert links.resolve(token) is None and len(links) == 0
    assert links.resolve("../x") is None and links.resolve(None) is None


def test_the_guard_refuses_large_bodies_and_private_calls(monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MAX_PROMPT_CHARS", "1000")  # the cap is then 1,004,000 bytes
    seen: list[int] = []

    async def echo(request):
        body = await request.body()
        seen.append(len(body))
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/{path:path}", echo, methods=["POST"])])
    client = TestClient(RequestGuard(app, public=("generate",)))
    small = [b"z" * 1000] * 3
    assert client.post("/gradio_api/call/generate", content=b"{}").status_code == 200
    assert client.post("/gradio_api/call/on_refresh", content=b"{}").status_code == 404
    assert client.post("/gradio_api/call/v2/on_delete", content=b"{}").status_code == 404
    assert client.post("/gradio_api/queue/join", content=b"x" * 2_000_000).status_code == 413

    def chunks():  # no Content-Length: cut off as it streams in
        for _ in range(30):
            yield b"y" * 100_000

    assert client.post("/gradio_api/queue/join", content=chunks()).status_code == 413
    assert client.post("/gradio_api/queue/join", content=iter(small)).status_code == 200
    assert seen == [2, 3000]


def test_a_hosted_study_tab_opens_only_study_files_from_copies(demo, hosted, tmp_path, monkeypatch):
    import shutil

    from playground.store import default_path

    view = demo.study_view
    # the page's own database, empty name or by its file name, is no study here
    state, line, *_ = view.on_open("", None)
    assert state is None and "name a study file" in line
    name = default_path().rsplit("/", 1)[-1]
    state, line, *_ = view.on_open(name, None)
    assert state is None and ("not a study file" in line or "holds no study comparisons" in line)
    # a database holding a study and other sessions is someone's page store: refused
    mixed = tmp_path / "mixed.db"
    shutil.copy(default_path(), mixed)
    assert view.on_open("mixed.db", None)[0] is None
    before = mixed.read_bytes()
    assert mixed.read_bytes() == before  # opened from a copy: never migrated in place
