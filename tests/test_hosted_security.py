"""A Space-mode instance, attacked over plain HTTP as a visitor would (issue 29).

The app runs in a subprocess started as a Space (``SPACE_ID`` set: bundled models only, the
session list limited to each visitor's own, one model slot). Its database is seeded before it
starts with sessions owned by visitor A. Visitor B then calls the page's own events directly
(``/gradio_api/queue/join`` by index, as the page does, and ``/call/<name>`` as a script would),
and the public API with wrong types, huge prompts, huge seeds and deep JSON.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from playground.bench._browser import App
from playground.ownership import owner_id
from playground.store import Store

pytestmark = pytest.mark.slow

KEY_A = "a" * 20 + "visitorA" * 2 + "x" * 8
KEY_B = "b" * 20 + "visitorB" * 2 + "y" * 8


def _trace() -> dict[str, Any]:
    from playground.engine import prepare

    return prepare(model="tiny-shakespeare", decoder="greedy", prompt="ROMEO:\n", max_new_tokens=4).finish().to_dict()


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: Any) -> Any:
    """The Space-mode app, its database seeded with two sessions of A's and one nobody's."""
    tmp = tmp_path_factory.mktemp("hosted")
    db = tmp / "space.db"
    trace = _trace()
    with Store(db) as store:
        a1 = store.save_session("A's first", "tiny-shakespeare", "ROMEO:\n", {"seed": 0}, [trace], owner=owner_id(KEY_A))
        a2 = store.save_session("A's second", "tiny-shakespeare", "ROMEO:\n", {"seed": 0}, [trace], owner=owner_id(KEY_A))
        cli = store.save_session("from the command line", "tiny-shakespeare", "ROMEO:\n", {}, [trace])
    app = App(str(db), tmp / "app.log", SPACE_ID="someone/decoder-playground", OMP_NUM_THREADS="1")
    try:
        app.wait()
        config = httpx.get(app.url + "/config", timeout=30).json()
        app.fns = {d["api_name"]: d["id"] for d in config["dependencies"] if d.get("api_name")}  # type: ignore[attr-defined]
        app.private = [d["api_name"] for d in config["dependencies"]  # type: ignore[attr-defined]
                       if d.get("api_visibility") == "private" and d.get("api_name")]
        app.ids = {"a1": a1, "a2": a2, "cli": cli}  # type: ignore[attr-defined]
        yield app
    finally:
        app.stop()


def event(app: Any, name: str, data: list[Any], session_hash: str = "visitorB01", event_data: Any = None) -> dict[str, Any]:
    """Run one of the page's events as the page's frontend does (queue join by index, then
    the event stream); returns the completion message."""
    with httpx.Client(timeout=60) as c:
        r = c.post(app.url + "/gradio_api/queue/join",
                   json={"data": data, "fn_index": app.fns[name], "session_hash": session_hash,
                         "event_data": event_data, "trigger_id": None})
        assert r.status_code == 200, r.text
        with c.stream("GET", app.url + "/gradio_api/queue/data", params={"session_hash": session_hash}) as s:
            for line in s.iter_lines():
                if line.startswith("data:"):
                    m = json.loads(line[5:])
                    if m.get("msg") == "process_completed":
                        return m
    raise AssertionError("the event never completed")


def api(app: Any, name: str, body: dict[str, Any] | bytes, timeout: float = 60) -> tuple[int, str, float]:
    """Call a public endpoint over ``/call/<name>``: (status, the result or error line, seconds)."""
    t0 = time.perf_counter()
    with httpx.Client(timeout=timeout) as c:
        if isinstance(body, bytes):
            r = c.post(app.url + f"/gradio_api/call/{name}", content=body, headers={"content-type": "application/json"})
        else:
            r = c.post(app.url + f"/gradio_api/call/{name}", json=body)
        if r.status_code != 200:
            return r.status_code, r.text, time.perf_counter() - t0
        event_id = r.json()["event_id"]
        text = c.get(app.url + f"/gradio_api/call/{name}/{event_id}").text
    return 200, text, time.perf_counter() - t0


def listed_ids(msg: dict[str, Any]) -> list[str]:
    table = msg["output"]["data"][0]
    return [row[4] for row in table["data"]]


def status_of(msg: dict[str, Any]) -> str:
    return next(str(v) for v in msg["output"]["data"] if isinstance(v, str) and "pg-status" in v)


def title_of(app: Any, sid: str) -> str:
    code, text, _ = api(app, "session", {"data": [sid]})
    assert code == 200
    payload = json.loads(text.split("data:", 1)[1].splitlines()[0])
    return payload[0]["title"]


def rss_kb(app: Any) -> int:
    status = Path(f"/proc/{app.proc.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


# ---------------------------------------------------------------------- ownership
def test_a_second_visitor_cannot_list_rename_delete_or_export_the_first_visitors_sessions(hosted):
    a1, a2 = hosted.ids["a1"], hosted.ids["a2"]
    # B's list holds none of A's sessions, nor the command line's
    assert listed_ids(event(hosted, "on_refresh", [KEY_B, None])) == []
    # ...and A's holds exactly A's
    assert set(listed_ids(event(hosted, "on_refresh", [KEY_A, None], "visitorA01"))) == {a1, a2}
    # B sends A's ids in every field it can: the selection is the server's (kept per page, set
    # only from the listing this page was sent), so nothing is selected, renamed, deleted or
    # exported
    msg = event(hosted, "on_select", [[a1, a2], KEY_B, a1], event_data={"index": [0, 0], "value": "x"})
    assert a1 not in json.dumps(msg["output"]["data"])
    for key in (KEY_B, KEY_A, None, "short"):
        for name, data in (("on_rename", [a1, "pwned", key, a1]), ("on_delete", [a2, key, a2, a2]),
                           ("on_export", [a1, key, a1])):
            msg = event(hosted, name, data)
            assert "pg-status-error" in status_of(msg), (name, key)
    assert title_of(hosted, a1) == "A's first" and title_of(hosted, a2) == "A's second"
    # A selects a row of the listing A was sent, and renames it
    event(hosted, "on_select", [None, KEY_A, None], "visitorA01", event_data={"index": [1, 0], "value": "x"})
    msg = event(hosted, "on_rename", [None, "A renamed", KEY_A, None], "visitorA01")
    assert "Renamed." in status_of(msg)
    assert "A renamed" in (title_of(hosted, a1), title_of(hosted, a2))


def test_private_handlers_cannot_be_called_by_name(hosted):
    assert len(hosted.private) > 20
    with httpx.Client(timeout=30) as c:
        for name in hosted.private:
            for prefix in ("/gradio_api/call/", "/gradio_api/call/v2/"):
                r = c.post(hosted.url + prefix + name, json={"data": []})
                assert r.status_code == 404, (name, r.status_code)
    code, text, _ = api(hosted, "decoders", {"data": ["search"]})
    assert code == 200 and "beam" in text


# ---------------------------------------------------------------------- limits before work
def test_a_10mb_prompt_is_refused_at_once_and_does_not_hold_the_model_slot(hosted):
    small_request = {"data": ["tiny-shakespeare", "greedy", "ROMEO:\n", 8, 0, None, None]}
    api(hosted, "generate", small_request)  # the model is loaded (once) before anything is timed
    alone = min(api(hosted, "generate", small_request)[2] for _ in range(2))
    before = rss_kb(hosted)
    big = json.dumps({"data": ["tiny-shakespeare", "greedy", "x" * 10_000_000, 8, 0, None, None]}).encode()
    results: dict[str, Any] = {}

    def small() -> None:
        time.sleep(0.05)
        results["small"] = api(hosted, "generate", small_request)

    t = threading.Thread(target=small)
    t.start()
    code, text, seconds = api(hosted, "generate", big)
    t.join(60)
    assert code == 413 and seconds < 1.0
    s_code, s_text, s_seconds = results["small"]
    assert s_code == 200 and '"text"' in s_text and s_seconds < alone + 1.0, (s_seconds, alone)
    # just over the prompt limit but under the body cap: the page's own line, at once
    code, text, seconds = api(hosted, "generate", {"data": ["tiny-shakespeare", "greedy", "y" * 5000, 8, 0, None, None]})
    assert "the prompt has 5000 characters; the limit here is 4000" in text and seconds < 2.0
    assert rss_kb(hosted) - before < 60_000  # kB: nothing was tokenised or kept


def test_watermark_text_has_its_own_limit(hosted):
    msg = event(hosted, "on_detect", ["tiny-shakespeare", "z" * 10_001, "", 0.25, "lefthash", "15485863", 1, None])
    assert "the text has 10001 characters; the limit here is 10000" in json.dumps(msg["output"]["data"])


def test_wrong_types_get_a_line_naming_the_field(hosted):
    cases = [
        (["tiny-shakespeare", "greedy", 123, 8, 0, None, None], "the prompt must be text"),
        (["tiny-shakespeare", "greedy", ["a"], 8, 0, None, None], "the prompt must be text"),
        (["tiny-shakespeare", "greedy", {"a": 1}, 8, 0, None, None], "the prompt must be text"),
        ([["m"], "greedy", "hi", 8, 0, None, None], "model must be text"),
        (["tiny-shakespeare", {"d": 1}, "hi", 8, 0, None, None], "decoder must be text"),
        (["tiny-shakespeare", "greedy", "hi", 8, 0, None, "[" * 40 + "]" * 40], "knobs nests deeper than 32 levels"),
        (["tiny-shakespeare", "greedy", "hi", 8, 0, None, "[" * 60000 + "]" * 60000], "knobs has 120000 characters"),
    ]
    for data, line in cases:
        code, text, _ = api(hosted, "generate", {"data": data})
        assert line in text and "internal error" not in text, (data[:3], text[:300])
    code, text, _ = api(hosted, "compare", {"data": [None, {"decoder": "greedy"}, "hi", None, 0, 4, None]})
    assert "lanes must be a list" in text


def test_a_seed_the_store_cannot_hold_is_refused_before_anything_runs(hosted):
    for seed in (2**64, 2**63, -1):
        code, text, _ = api(hosted, "compare", {"data": ["lossless-check", None, None, None, seed, 4, None]})
        assert "seed must be between 0 and 2^63 - 1" in text, text[:300]
        code, text, _ = api(hosted, "generate", {"data": ["tiny-shakespeare", "greedy", "hi", 4, seed, None, None]})
        assert "seed must be between 0 and 2^63 - 1" in text, text[:300]


def threads_of(app: Any) -> int:
    return int(re.search(r"Threads:\s+(\d+)", Path(f"/proc/{app.proc.pid}/status").read_text()).group(1))


def test_live_polls_for_unknown_runs_never_hold_the_server(hosted):
    """100 concurrent polls with tokens that name no run are answered in the event loop (or
    told to back off): the server starts no thread for them, where each used to park a worker
    thread for a second; the API answers meanwhile."""
    before = threads_of(hosted)
    answers: list[int] = []

    def poll(i: int) -> None:
        r = httpx.post(hosted.url + "/playground_api/live", json={"value": f"{i:024d}:0"}, timeout=60)
        answers.append(r.status_code)
        if r.status_code == 200:
            assert r.json() == {"unknown": True}

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(100)]
    for th in threads:
        th.start()
    code, text, _ = api(hosted, "decoders", {"data": [None]})
    for th in threads:
        th.join(60)
    assert code == 200 and "greedy" in text
    assert len(answers) == 100 and set(answers) <= {200, 429}
    assert threads_of(hosted) <= before + 3
    r = httpx.post(hosted.url + "/playground_api/live", content=b"x" * 300_000,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413
