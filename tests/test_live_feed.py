"""The live feed that the Compare page's script long-polls for lane text while a run streams:
appends when a lane only grew, everything whole after a lost answer, nothing sent twice, a first
answer that waits for tokens, placeholders not resent, ``done`` at the end, and unknown or malformed run tokens refused."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from playground.ui import live_feed
from playground.ui.live_feed import LiveFeed, lane_signature, valid_token
from playground.ui.page_session import PageSessions

SESSIONS = PageSessions()  # the app's page registry, which holds the running comparisons' feeds


class Publisher:
    """Stands in for the runner: ``latest`` / ``wait`` / ``finished`` over published traces."""

    def __init__(self, traces: list[dict[str, Any]]) -> None:
        self._cond = threading.Condition()
        self.version = 0
        self.traces = traces
        self.finished = False
        self.latest_calls = 0

    def publish(self, traces: list[dict[str, Any]] | None = None, finished: bool = False) -> None:
        with self._cond:
            if traces is not None:
                self.traces = traces
            self.version += 1
            self.finished = finished
            self._cond.notify_all()

    def latest(self) -> tuple[int, list[dict[str, Any]]]:
        self.latest_calls += 1
        with self._cond:
            return self.version, [dict(t) for t in self.traces]

    def wait(self, version: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.version > version or self.finished, timeout)


def lane(ids: list[int], **kw: Any) -> dict[str, Any]:
    return {"output_ids": ids, "steps": [{}] * len(ids), "stats": {}, **kw}


def render(j: int, trace: dict[str, Any]) -> tuple[str, str]:
    """An open output that grows as tokens come (like the page's), and a stats line."""
    err = (trace.get("stats") or {}).get("error")
    body = ("<b>" + err + "</b>" if err else "") + "".join(f"<span>{t}</span>" for t in trace["output_ids"])
    return f'<div id="l{j}">' + body, f"{len(trace['output_ids'])} tokens, {len(trace['steps'])} steps"


def test_first_answer_is_whole_then_a_grown_lane_is_an_append_of_its_new_tokens():
    pub = Publisher([lane([1, 2]), lane([7])])
    feed = LiveFeed(render)
    feed.attach(pub)
    first = feed.poll(0, timeout=0.5)
    assert first["seq"] == 1 and not first["done"]
    assert [(x["lane"], x["op"]) for x in first["lanes"]] == [(0, "replace"), (1, "replace")]
    assert first["lanes"][0]["html"] == '<div id="l0"><span>1</span><span>2</span>'
    pub.publish([lane([1, 2, 3]), lane([7])])
    second = feed.poll(1, timeout=0.5)
    # only the lane that changed, and only what it added
    assert second["lanes"] == [{"lane": 0, "op": "append", "html": "<span>3</span>", "stats": "3 tokens, 3 steps"}]
    # the page's text, rebuilt from the answers, is what a whole render gives
    assert first["lanes"][0]["html"] + second["lanes"][0]["html"] == render(0, lane([1, 2, 3]))[0]


def test_an_output_that_changed_before_its_end_is_sent_whole():
    pub = Publisher([lane([1, 2])])
    feed = LiveFeed(render)
    feed.attach(pub)
    feed.poll(0, timeout=0.5)
    pub.publish([lane([1, 2], stats={"error": "lane broke"})])
    ans = feed.poll(1, timeout=0.5)
    assert [x["op"] for x in ans["lanes"]] == ["replace"]
    assert ans["lanes"][0]["html"].startswith('<div id="l0"><b>lane broke</b>')


def test_a_lost_answer_makes_the_next_one_send_every_lane_whole():
    pub = Publisher([lane([1]), lane([2])])
    feed = LiveFeed(render)
    feed.attach(pub)
    feed.poll(0, timeout=0.5)
    pub.publish([lane([1, 5]), lane([2])])
    lost = feed.poll(1, timeout=0.5)  # this answer never reaches the page
    assert lost["seq"] == 2
    pub.publish([lane([1, 5, 6]), lane([2])])
    again = feed.poll(1, timeout=0.5)  # the page still says it applied answer 1
    assert [(x["lane"], x["op"]) for x in again["lanes"]] == [(0, "replace"), (1, "replace")]
    assert again["lanes"][0]["html"] == render(0, lane([1, 5, 6]))[0]


def test_a_poll_waits_for_a_change_and_answers_as_soon_as_one_is_published():
    pub = Publisher([lane([1])])
    feed = LiveFeed(render)
    feed.attach(pub)
    feed.poll(0, timeout=0.5)
    t0 = time.monotonic()
    quiet = feed.poll(1, timeout=0.3)  # nothing new: an empty answer at the deadline
    assert quiet["lanes"] == [] and time.monotonic() - t0 >= 0.25
    threading.Timer(0.2, lambda: pub.publish([lane([1, 4])])).start()
    t0 = time.monotonic()
    ans = feed.poll(2, timeout=10.0)
    assert ans["lanes"] and ans["lanes"][0]["html"] == "<span>4</span>"
    assert time.monotonic() - t0 < 5.0  # woken by the publish, not by the deadline


def test_a_publish_that_changes_nothing_shown_does_not_end_the_wait():
    pub = Publisher([lane([1])])
    feed = LiveFeed(render)
    feed.attach(pub)
    feed.poll(0, timeout=0.5)
    threading.Timer(0.05, lambda: pub.publish([lane([1])])).start()  # the same lane again
    ans = feed.poll(1, timeout=0.4)
    assert ans["lanes"] == [] and pub.latest_calls >= 3  # it looked again after the publish


def test_the_first_answer_writes_every_lane_and_a_placeholder_is_not_resent_until_it_has_tokens():
    pub = Publisher([lane([1]), lane([], preparing=True)])
    feed = LiveFeed(render)
    feed.attach(pub)
    first = feed.poll(0, timeout=0.5)
    assert [(x["lane"], x["op"]) for x in first["lanes"]] == [(0, "replace"), (1, "replace")]
    pub.publish([lane([1]), lane([])])  # lane 2 prepared, no token yet: still nothing to show
    assert feed.poll(1, timeout=0.3)["lanes"] == []
    pub.publish([lane([1]), lane([9])])
    ans = feed.poll(2, timeout=0.5)
    assert [x["lane"] for x in ans["lanes"]] == [1]
    assert first["lanes"][1]["html"] + ans["lanes"][0]["html"] == render(1, lane([9]))[0]


def test_a_lane_with_steps_but_no_final_token_yet_is_shown_as_it_goes():
    """A beam's (or a diffusion canvas's) steps show before any token is final."""
    pub = Publisher([lane([1]), {"output_ids": [], "steps": [], "stats": {}}])
    feed = LiveFeed(render)
    feed.attach(pub)
    feed.poll(0, timeout=0.5)
    pub.publish([lane([1]), {"output_ids": [], "steps": [{}, {}], "stats": {}}])
    assert [x["lane"] for x in feed.poll(1, timeout=0.5)["lanes"]] == [1]


def test_the_first_answer_waits_for_tokens_then_sends_placeholders_if_models_are_still_loading(monkeypatch):
    monkeypatch.setattr(live_feed, "FIRST_WAIT_S", 0.4)
    pub = Publisher([lane([], preparing=True), lane([])])
    feed = LiveFeed(render)
    feed.attach(pub)
    threading.Timer(0.1, lambda: pub.publish([lane([5]), lane([])])).start()
    t0 = time.monotonic()
    ans = feed.poll(0, timeout=5.0)  # answered by the first token, with every lane
    assert time.monotonic() - t0 < 0.35
    assert [(x["lane"], x["html"]) for x in ans["lanes"]] == [(0, render(0, lane([5]))[0]), (1, render(1, lane([]))[0])]
    slow = LiveFeed(render)
    slow.attach(Publisher([lane([], preparing=True), lane([], preparing=True)]))
    t0 = time.monotonic()
    ans = slow.poll(0, timeout=5.0)  # no token within FIRST_WAIT_S: the placeholders
    assert 0.35 <= time.monotonic() - t0 < 3.0 and [x["lane"] for x in ans["lanes"]] == [0, 1]


def test_the_feed_says_done_when_the_run_ends_or_is_closed():
    pub = Publisher([lane([1])])
    feed = LiveFeed(render)
    feed.attach(pub)
    feed.poll(0, timeout=0.5)
    pub.publish([lane([1, 2], done=True)], finished=True)
    last = feed.poll(1, timeout=0.5)
    assert last["done"] and last["lanes"][0]["op"] == "append"
    # a feed closed before its runner existed answers done at once
    early = LiveFeed(render)
    early.close()
    assert early.poll(0, timeout=5.0) == {"seq": 0, "lanes": [], "done": True}


def test_a_poll_before_the_runner_exists_waits_then_answers_empty():
    feed = LiveFeed(render)
    ans = feed.poll(0, timeout=0.2)
    assert ans == {"seq": 0, "lanes": [], "done": False}


def test_lane_signature_tracks_what_the_page_shows():
    a = lane([1, 2])
    assert lane_signature(a) == lane_signature(dict(a))
    assert lane_signature(a) != lane_signature(lane([1, 2, 3]))
    assert lane_signature(a) != lane_signature(lane([1, 2], done=True))
    assert lane_signature(a) != lane_signature(lane([1, 2], stats={"error": "x"}))


@pytest.mark.parametrize("token,ok", [("a" * 16, True), ("A-b_" * 16, True), ("short", False), ("a" * 65, False),
                                      ("a" * 15 + "!", False), (None, False), (123, False)])
def test_run_tokens_are_16_to_64_url_safe_characters(token, ok):
    assert valid_token(token) is ok


def test_the_registry_serves_polls_by_token_and_forgets_ended_runs(monkeypatch):
    monkeypatch.setattr(live_feed, "POLL_WAIT_S", 0.2)
    token = "t" * 32
    assert SESSIONS.open_feed("bad token", render) is None
    feed = SESSIONS.open_feed(token, render)
    assert feed is not None and SESSIONS.open_feed(token, render) is None  # one feed per token
    try:
        pub = Publisher([lane([3])])
        feed.attach(pub)
        ans = SESSIONS.poll_feed(f"{token}:0")
        assert ans["lanes"][0]["html"] == render(0, lane([3]))[0]
        assert SESSIONS.poll_feed(f"{token}:junk")["seq"] == 2  # an unreadable seq is a lost answer: whole lanes
    finally:
        SESSIONS.close_feed(token)
    assert feed.closed
    assert SESSIONS.poll_feed(f"{token}:2") == {"unknown": True}
    assert SESSIONS.poll_feed("nonsense") == {"unknown": True}
    assert SESSIONS.poll_feed(None) == {"unknown": True}


def test_a_poll_that_overtakes_the_run_is_answered_at_once_and_the_next_one_is_served():
    """A poll for a run that is not registered yet never holds a thread: "unknown" at once
    (the page asks again a tenth of a second later), then the lanes once the run is there."""
    token = "o" * 24
    pub = Publisher([lane([8])])
    started = time.monotonic()
    assert SESSIONS.poll_feed(f"{token}:0") == {"unknown": True}
    assert time.monotonic() - started < 0.1
    feed = SESSIONS.open_feed(token, render)
    feed.attach(pub)
    try:
        ans = SESSIONS.poll_feed(f"{token}:0")
        assert ans["lanes"] and ans["lanes"][0]["lane"] == 0
    finally:
        SESSIONS.close_feed(token)


def test_a_second_poll_of_one_run_never_waits_for_the_first():
    """Two polls of the same run at once: the second is answered at once ("busy"), never
    parked on the first one's lock."""
    token = "p" * 24
    pub = Publisher([lane([8])])
    feed = SESSIONS.open_feed(token, render)
    feed.attach(pub)
    try:
        first = SESSIONS.poll_feed(f"{token}:0")  # nothing new after this: the next poll waits up to a second
        assert first["lanes"]
        waiting = threading.Thread(target=SESSIONS.poll_feed, args=(f"{token}:{first['seq']}",))
        waiting.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        second = SESSIONS.poll_feed(f"{token}:{first['seq']}")
        assert second.get("busy") and time.monotonic() - t0 < 0.1
        waiting.join(5)
    finally:
        SESSIONS.close_feed(token)

