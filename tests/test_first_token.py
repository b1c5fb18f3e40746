"""Run → first token: the live feed's first answer with text carries the run's marks in the
order the run reached them, and the Run event's frames wait for that answer (a frame the
browser draws first delays the first token by its drawing)."""

import threading
import time

import pytest

from playground.runner import Runner
from playground.ui.live_feed import LiveFeed


class Session:
    """Stands in for gr.Request: one browser session."""

    def __init__(self, name: str) -> None:
        self.session_hash = name


@pytest.fixture()
def page(demo):
    return demo.compare_page


def run_args(page, lanes, max_new):
    args = ["tiny-llama", "", "ROMEO:", 0, max_new, "forwards", "auto", len(lanes), None]
    for j in range(page.max_lanes):
        dec, knobs = lanes[j] if j < len(lanes) else ("greedy", {})
        args += [dec, knobs, None, "(page model)"]
    return args


def _follow(page, token, answers, feeds, stop):
    """The page script's polls, in a thread: every answer, and the feed once it exists."""
    seq = 0
    while not stop.is_set():
        feed, _seq = page.sessions.find_feed(f"{token}:{seq}")
        if feed is not None and not feeds:
            feeds.append(feed)
        ans = page.sessions.poll_feed(f"{token}:{seq}")
        if ans.get("unknown"):
            continue
        answers.append((time.monotonic(), ans))
        seq = ans["seq"]
        if ans["done"]:
            return


def test_frames_wait_for_the_first_text_and_its_answer_carries_the_runs_marks(page, tiny, db):
    from playground.ui.run_handlers import FIRST_HOLD_S

    token = "m" * 32
    answers, feeds, stop = [], [], threading.Event()
    reader = threading.Thread(target=_follow, args=(page, token, answers, feeds, stop), daemon=True)
    reader.start()
    frames, got = [], []
    started = time.monotonic()
    try:
        for f in page.on_run(Session("first-token"), *run_args(page, [("greedy", {}), ("greedy", {})], 24),
                             f"flow:{token}"):
            frames.append(f)
            got.append(time.monotonic())
    finally:
        reader.join(10)
        stop.set()
    assert "Done" in str(frames[-1][page.status])
    timed = [a for _t, a in answers if "t" in a]
    assert len(timed) == 1 and timed[0]["lanes"]  # sent once, with the first lane text
    t = timed[0]["t"]
    order = ["event", "opened", "first_frame", "resumed", "started", "lane_prepared", "first_step",
             "published", "ready", "answered"]
    assert t["event"] == 0.0 and all(k in t for k in order), t
    assert [t[k] for k in order] == sorted(t[k] for k in order)  # each reached after the one before
    assert t["attached"] >= t["resumed"] and t["polled"] <= t["ready"]
    assert t.get("prepared", float("inf")) >= t["lane_prepared"]  # every lane: maybe after the first text
    assert abs(t["event_ms"] / 1000 - time.time()) < 120  # a wall clock, to align with the page's
    # every frame between the first and the last came after the first text was answered
    answered = feeds[0].marks["answered"]
    middle = [g for g in got[1:-1] if g - started < FIRST_HOLD_S]
    assert all(g >= answered for g in middle), (answered, got)
    # ...and what a held frame would have said is still said: each lane's legend
    for ui in page.lanes[:2]:
        assert any(ui.legend in f for f in frames[1:]), ui.k


def test_runner_marks_follow_the_first_step():
    runner = Runner([_OneStep()], rate=0)
    runner.start()
    assert runner.join(10)
    m = runner.marks
    assert m["started"] <= m["first_step"] <= m["published"]
    feed = LiveFeed(lambda j, trace: ("x", ""))
    feed.mark("event", m["started"] - 0.5)
    feed.attach(runner)
    ans = feed.poll(0, timeout=1.0)
    assert ans["t"]["event"] == 0.0 and ans["t"]["started"] == pytest.approx(500.0, abs=0.2)
    assert feed.shown and feed.wait_shown(0.0)
    assert "t" not in feed.poll(ans["seq"], timeout=0.1)  # once


class _OneStep:
    """A run of one step that makes one token."""

    def __init__(self) -> None:
        self.done, self.target_forwards = False, 0

    def step(self):
        self.done = True
        return None

    def snapshot(self):
        return {"output_ids": [1], "steps": [{}], "done": self.done, "stats": {}}


def test_a_poll_that_overtakes_the_run_waits_for_it_and_an_ended_runs_poll_does_not():
    """The page's first poll leaves before the Run request: the route holds it (in the event
    loop) until the run is registered and answers with its text, not "unknown" and a retry."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from playground.ui import page_routes as routes
    from playground.ui.page_session import PageSessions

    sessions = PageSessions()
    client = TestClient(Starlette(routes=routes.page_routes(sessions=sessions)))
    token = "e" * 32

    def start_later() -> None:
        time.sleep(0.2)
        feed = sessions.open_feed(token, lambda j, trace: ("<b>x</b>", ""), "p")
        runner = Runner([_OneStep()], rate=0)
        runner.start()
        feed.attach(runner)

    opener = threading.Thread(target=start_later, daemon=True)
    opener.start()
    t0 = time.monotonic()
    ans = client.post("/playground_api/live", json={"value": f"{token}:0"}).json()
    took = time.monotonic() - t0
    opener.join(5)
    assert ans.get("lanes") and ans["lanes"][0]["html"] == "<b>x</b>" and "t" in ans
    assert 0.2 <= took < routes.EARLY_WAIT_S
    sessions.end_run(token)
    t0 = time.monotonic()
    assert client.post("/playground_api/live", json={"value": f"{token}:1"}).json() == {"unknown": True}
    assert time.monotonic() - t0 < 0.5 * routes.EARLY_WAIT_S  # ended: said at once
    t0 = time.monotonic()  # a run that never comes: "unknown" once the wait is over
    assert client.post("/playground_api/live", json={"value": "n" * 32 + ":0"}).json() == {"unknown": True}
    assert time.monotonic() - t0 >= routes.EARLY_WAIT_S
    assert client.post("/playground_api/live", json={"value": "bad:0"}).json() == {"unknown": True}
