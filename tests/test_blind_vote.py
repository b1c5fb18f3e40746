"""Blind comparisons end to end without a browser: what the vote page's routes give a reader
before and after their vote, every other way of reading a session by id refusing a blind one
to anyone but its owner, Share marking a session blind, and the Results tab's table."""

from __future__ import annotations

import json

import gradio as gr
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from playground import blind
from playground.core.errors import PlaygroundError
from playground.ownership import owner_id
from playground.store import default_store
from playground.ui.vote_page import MAX_BODY, vote_routes
from playground.ui.results_view import caller_results
from tests.test_store import make_trace

KEY_OWNER = "O" * 40
KEY_READER = "R" * 40
KEY_OTHER = "Q" * 40
DECODERS = ("top_p", "typical", "mirostat")


def blind_session(store, decoders=DECODERS, owner=KEY_OWNER) -> str:
    lanes = []
    for k, d in enumerate(decoders):
        t = make_trace(d, seed=k)
        t["text"] = f"text of lane {k}"
        lanes.append(t)
    sid = store.save_session("a vote", "tiny-llama", "ROMEO:", {}, lanes, owner=owner_id(owner))
    store.set_blind(sid, True)
    return sid


@pytest.fixture()
def store(db):
    return default_store()


@pytest.fixture()
def client(store):
    return TestClient(Starlette(routes=vote_routes(lambda: store)))


def post(client, path, **body):
    return client.post(f"/playground_api/vote/{path}", content=json.dumps(body),
                       headers={"content-type": "application/json"})


def test_before_the_vote_a_reader_gets_letters_and_text_and_no_decoder(client, store):
    sid = blind_session(store)
    r = post(client, "view", session=sid, key=KEY_READER)
    assert r.status_code == 200
    view = r.json()
    assert [lane["letter"] for lane in view["lanes"]] == ["A", "B", "C"]
    assert sorted(lane["text"] for lane in view["lanes"]) == ["text of lane 0", "text of lane 1", "text of lane 2"]
    body = r.text.lower()
    for name in (*DECODERS, "tiny-llama", "temperature", "params", "forward"):
        assert name not in body, name
    assert view["voted"] is False and "reveal" not in view
    # the page itself is static: nothing of any session is in it
    page = client.get(f"/vote?session={sid}")
    assert page.status_code == 200 and "Blind vote" in page.text
    assert not any(name in page.text for name in DECODERS)


def test_the_vote_is_stored_in_the_readers_order_and_reveals_the_letters(client, store):
    sid = blind_session(store)
    view = post(client, "view", session=sid, key=KEY_READER).json()
    b_text = next(lane["text"] for lane in view["lanes"] if lane["letter"] == "B")
    stored_lane = int(b_text.rsplit(" ", 1)[1])
    r = post(client, "cast", session=sid, key=KEY_READER, ballot={"kind": "best", "winner": "B"}, reason="fluent")
    assert r.status_code == 200
    after = r.json()
    assert after["voted"] and after["ballot"] == {"kind": "best", "winner": "B"} and after["reason"] == "fluent"
    assert store.ballot_of(sid, owner_id(KEY_READER))["ballot"] == {"kind": "best", "winner": stored_lane}
    revealed = {lane["letter"]: lane["label"] for lane in after["reveal"]["lanes"]}
    assert revealed["B"].startswith(DECODERS[stored_lane])
    assert after["reveal"]["ballots"] == 1
    assert after["reveal"]["table"][0]["label"].startswith(DECODERS[stored_lane])  # the winner on top
    # another reader still sees nothing named; a revote replaces the first ballot
    assert not any(n in post(client, "view", session=sid, key=KEY_OTHER).text for n in DECODERS)
    post(client, "cast", session=sid, key=KEY_READER, ballot={"kind": "pair", "a": "A", "b": "C", "winner": "tie"})
    assert store.ballot_count(sid) == 1


def test_the_vote_routes_refuse_bad_input_in_one_line(client, store):
    sid = blind_session(store)
    open_sid = store.save_session("open", "tiny-llama", "ROMEO:", {}, [make_trace(), make_trace("top_k")])
    cases = [
        (dict(session=sid), "reader key"),
        (dict(session=sid, key="short"), "reader key"),
        (dict(session="x" * 10, key=KEY_READER), "malformed"),
        (dict(session=open_sid, key=KEY_READER), "not a blind vote"),
        (dict(session=sid, key=KEY_READER, ballot={"kind": "best", "winner": "Z"}), "one of the letters"),
        (dict(session=sid, key=KEY_READER, ballot="A"), "best lane or a pair"),
        (dict(session=sid, key=KEY_READER, ballot={"kind": "best", "winner": "A"}, reason="x" * 501), "500"),
    ]
    for body, words in cases:
        r = post(client, "cast", **body)
        assert r.status_code == 400 and words in r.json()["error"], (body, r.text)
        assert "\n" not in r.json()["error"]
    assert store.ballot_count(sid) == 0
    big = client.post("/playground_api/vote/cast", content=b"{" + b" " * MAX_BODY + b"}")
    assert big.status_code == 413
    assert client.post("/playground_api/vote/view", content=b"not json").status_code == 400
    assert client.post("/playground_api/vote/view", content=b"[1, 2]").status_code == 400


def test_every_other_reading_path_refuses_a_blind_session_but_to_its_owner(demo, store):
    from playground.ui.api_endpoints import session as api_session

    sid = blind_session(store)
    assert blind.readable(store, sid, KEY_OWNER) and not blind.readable(store, sid, KEY_READER)
    assert not blind.readable(store, sid, None)
    with pytest.raises(gr.Error) as e:
        api_session(sid)
    assert "blind vote" in str(e.value)
    page = demo.compare_page
    # a share link's page load: the default page and the vote link, no lane text
    up = page.replay.frame(sid)
    assert f"/vote?session={sid}" in str(up[page.status])
    assert page.traces not in up
    opened = page.replay.frame(sid, key=KEY_OWNER)  # the owner, from the Sessions tab
    assert opened[page.traces] and opened[page.blind] is True
    # the Sessions tab lists it without decoders to anyone but its owner
    sv = demo.sessions_view
    rows, ids, _ = sv.on_refresh(KEY_READER, None)
    row = rows[ids.index(sid)]
    assert not any(d in row[2] for d in DECODERS) and "blind" in row[2]
    rows, ids, _ = sv.on_refresh(KEY_OWNER, None)
    assert "top_p" in rows[ids.index(sid)][2]
    link, status = sv.on_export(sid, KEY_READER, None)
    assert "blind vote" in str(status)
    with pytest.raises(PlaygroundError):
        blind.check_readable(store, sid, KEY_READER)


def test_share_with_blind_ticked_marks_the_session_and_gives_the_vote_link(demo, store, monkeypatch):
    sid = store.save_session("mine", "tiny-llama", "ROMEO:", {}, [make_trace(), make_trace("top_k")],
                             owner=owner_id(KEY_OWNER))

    class Req:
        headers = {"host": "example.org"}
        client = None
        session_hash = "h"
        query_params = {}
        url = "http://example.org/"

    handlers = demo.compare_page.run
    monkeypatch.setattr("playground.ui.run_handlers.root_url", lambda request: "http://example.org")
    link = handlers.on_share(sid, True, KEY_OWNER, Req())
    assert link == f"http://example.org/vote?session={sid}"
    assert blind.is_blind(store.load_session(sid))
    link = handlers.on_share(sid, False, KEY_OWNER, Req())
    assert link == f"http://example.org/?session={sid}" and not blind.is_blind(store.load_session(sid))
    one = store.save_session("one lane", "tiny-llama", "ROMEO:", {}, [make_trace()], owner=owner_id(KEY_OWNER))
    assert handlers.on_share(one, True, KEY_OWNER, Req()) == ""  # a blind vote needs two lanes
    assert not blind.is_blind(store.load_session(one))


def test_share_marks_only_the_owners_session_on_a_hosted_instance(demo, store, monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/decoder-playground")
    monkeypatch.setattr("playground.ui.run_handlers.root_url", lambda request: "http://example.org")
    sid = store.save_session("theirs", "tiny-llama", "ROMEO:", {}, [make_trace(), make_trace("top_k")],
                             owner=owner_id(KEY_OWNER))
    assert demo.compare_page.run.on_share(sid, True, KEY_OTHER, None) == ""
    assert not blind.is_blind(store.load_session(sid))


def test_results_pool_what_the_caller_may_see(store, monkeypatch):
    mine = blind_session(store)
    theirs = blind_session(store, owner=KEY_OTHER)
    for sid in (mine, theirs):
        blind.cast(store, sid, KEY_READER, {"kind": "best", "winner": "A"})
    assert caller_results(None).ballots == 2  # one user: every ballot
    monkeypatch.setenv("SPACE_ID", "someone/decoder-playground")
    assert caller_results(KEY_OWNER).ballots == 1  # the owner: ballots on their own comparison
    assert caller_results(KEY_READER).ballots == 2  # a reader: what they voted on
    assert caller_results("bad").ballots == 0


def test_a_blind_study_walks_the_reader_through_its_prompts(store):
    sids = []
    for k in range(3):
        t = [make_trace("greedy"), make_trace("top_p", seed=1)]
        sids.append(store.save_session(f"p{k}", "tiny-llama", "ROMEO:", {"study": {"key": f"p{k}", "index": k}}, t))
        store.set_blind(sids[-1], True)
    q = blind.study_queue(store, KEY_READER)
    assert [r["session"] for r in q["sessions"]] == sids and q["next"] == sids[0]
    blind.cast(store, sids[0], KEY_READER, {"kind": "best", "winner": "B"})
    q = blind.study_queue(store, KEY_READER)
    assert q["sessions"][0]["voted"] and q["next"] == sids[1]
