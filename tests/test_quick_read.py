"""A share link reads at once: the first HTML answer to ``/?session=<id>`` carries the session's
text (playground/ui/quick_read.py), and nothing else the app serves is touched."""

from __future__ import annotations

import html

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import visualizers
from playground.ownership import owner_id
from playground.store import default_store
from playground.ui.quick_read import BLOCK_ID, QuickRead, insert_block, session_id_of
from tests.test_store import make_trace

PAGE = "<!doctype html><html><head><title>app</title></head><body class=\"x\"><div id=\"root\"></div></body></html>"


def app_with(store) -> TestClient:
    """A stand-in for Gradio's app (its page, an API answer, a page that is not HTML) behind the middleware."""
    async def index(request):
        return HTMLResponse(PAGE)

    async def config(request):
        return JSONResponse({"session": request.query_params.get("session")})

    inner = Starlette(routes=[Route("/", index), Route("/config", config),
                              Route("/plain", lambda r: PlainTextResponse("<body>plain</body>"))])
    return TestClient(QuickRead(inner, store=lambda: store))


@pytest.fixture()
def store(db):
    return default_store()


def two_lanes(store, title="Romeo's two decoders", **kw) -> str:
    a, b = make_trace("greedy"), make_trace("top_k", seed=1)
    return store.save_session(title, "tiny-llama", "ROMEO: <b>hi</b>", {}, [a, b], **kw)


def test_the_first_html_of_a_share_link_holds_every_lanes_text_decoder_and_stats(store):
    sid = two_lanes(store)
    session = store.load_session(sid)
    r = app_with(store).get(f"/?session={sid}")
    assert r.status_code == 200 and r.headers["content-length"] == str(len(r.content))
    page = r.text
    assert page.index(f'<div id="{BLOCK_ID}"') == page.index('<body class="x">') + len('<body class="x">')
    assert page.count(f'id="{BLOCK_ID}"') == 1 and '<div id="root"></div>' in page  # the app's page is all there
    block = page[page.index(BLOCK_ID):page.index('<div id="root">')]
    assert "Lane 1: greedy" in block and "Lane 2: top_k" in block
    for run in session["runs"]:
        for piece in run["pieces"]:
            assert html.escape(piece) in block  # every token of both lanes, escaped
    assert "Romeo&#x27;s two decoders" in block and "ROMEO: &lt;b&gt;hi&lt;/b&gt;" in block  # title and prompt escaped
    assert "<b>hi</b>" not in block
    assert 'class="divergence"' in block  # the comparison strip
    for run in session["runs"]:
        assert visualizers.stats_line(run) and visualizers.stats_line(run) in block  # each lane's stats line


def test_a_blind_comparison_an_unknown_id_or_a_malformed_one_get_the_app_page_unchanged(store):
    sid = two_lanes(store, owner=owner_id("O" * 40))
    store.set_blind(sid, True)
    client = app_with(store)
    for query in (f"session={sid}", "session=nosuchsession", "session=%3Cscript%3E", "session=" + "a" * 65,
                  "session=", "other=1", "session=" + "x" * 5000):
        r = client.get(f"/?{query}")
        assert r.status_code == 200 and r.text == PAGE, query
    assert "greedy" not in client.get(f"/?session={sid}").text  # nothing of a blind lane


def test_only_the_root_page_is_touched(store):
    sid = two_lanes(store)
    client = app_with(store)
    assert client.get(f"/config?session={sid}").json() == {"session": sid}
    assert client.get(f"/plain?session={sid}").text == "<body>plain</body>"
    assert client.post(f"/?session={sid}").status_code == 405  # not a GET: passed through to the app
    assert BLOCK_ID not in client.get("/").text


def test_the_session_parameter_and_the_insertion_point():
    assert session_id_of(b"session=abc123&x=1") == "abc123"
    assert session_id_of("x=1&session=a_b-C") == "a_b-C"
    assert session_id_of(b"session=a%20b") is None and session_id_of(b"") is None
    assert insert_block(b"<html><BODY data-x='1'>z</BODY>", "<i>q</i>") == b"<html><BODY data-x='1'><i>q</i>z</BODY>"
    assert insert_block(b"no body here", "<i>q</i>") == b"no body here"
