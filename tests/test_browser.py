"""The Compare page in a real browser (headless Chromium driven by Playwright).

Two app instances run in subprocesses on free 127.0.0.1 ports and share one temporary
database: a normal one, and a replay-only one started with PLAYGROUND_NO_MODELS=1, where any
attempt to load a model fails — so a share link that replays there provably needs no model.

Covered: a three-lane preset streams (each lane's text grows, stats fill in), the scrubber
redraws the plots, clicking a token jumps to its step, Stop stops every lane, Share + replay
show the same text and plots, a ``<script>`` token is shown as text and never runs, a bad id
is a clear message, the Sessions tab opens a stored session, and four people at once each
get their own comparison (the same tokens as ``playground.api.compare``), Stop in one page
stops only that one, and a second Run from a running page is refused with a message.

Tests never write tracked files: screenshots and timings come from explicit commands
(``playground screenshots``, ``playground bench --suite ui``). A missing Chromium or bundled
model fails these tests loudly (CI installs both) instead of skipping them.
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlparse

import pytest

# app, browser, page: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import VIEW, App, load_preset, open_page, step_value, token_count, wait_idle, wait_running

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PRESET = "Greedy vs beam search vs sampling"  # three causal lanes, all on the bundled target
STREAMED = 160  # the tokens of the run whose lanes are watched growing


@pytest.fixture(scope="module")
def apps(app, tmp_path_factory):
    """The main app and a replay-only one (PLAYGROUND_NO_MODELS=1) on the same database."""
    tmp = tmp_path_factory.mktemp("replay")
    replay = App(app.db, tmp / "replay.log", OMP_NUM_THREADS="1", PLAYGROUND_NO_MODELS="1")
    try:
        replay.wait()
        yield {"main": app, "replay": replay, "db": app.db}
    finally:
        replay.stop()


def set_number(p, elem_id: str, value: int) -> None:
    box = p.locator(f"#{elem_id} input").first
    box.fill(str(value))
    box.press("Tab")


def lanes_visible(p) -> list[int]:
    return [k for k in range(1, 7) if p.locator(f"#lane-{k}").is_visible()]


def insp_text(p, k: int) -> str:
    """Everything lane k's inspector shows as text (header, plot titles, axis labels)."""
    return p.locator(f"#inspect-{k}").evaluate("e => e.textContent")


def lane_texts(p, ks) -> list[str]:
    return [p.locator(f"#lane-{k}-output .tok-output").evaluate("e => e.textContent") for k in ks]


RECORD_JS = """
() => {
  window.__hist = {};
  for (const k of [1, 2, 3]) {
    window.__hist[k] = [];
    const out = document.querySelector('#lane-' + k + '-output');
    const stats = document.querySelector('#lane-' + k + '-stats');
    const rec = () => window.__hist[k].push([out.querySelectorAll('.tok').length,
      /tokens/.test(stats.innerText) && /^Running/.test((document.querySelector('#status .pg-status') || {innerText: ''}).innerText.trim()),
      Math.round(out.getBoundingClientRect().height)]);
    new MutationObserver(rec).observe(out, {childList: true, subtree: true});
    new MutationObserver(rec).observe(stats, {childList: true, subtree: true, characterData: true});
  }
}
"""


# ---------------------------------------------------------------------- tests
def test_three_lane_preset_streams_and_the_inspector_follows(page, apps):
    p = page
    load_preset(p, PRESET)
    assert lanes_visible(p) == [1, 2, 3]
    # A knob generated from the decoder's spec: open lane 3's settings and change top-p's p.
    p.locator("#lane-3-settings").get_by_text("Lane settings").click()
    knob = p.locator("#lane-3-knob-p input[type=number]")
    knob.fill("0.5")
    knob.press("Enter")
    p.wait_for_function("() => document.querySelector('#lane-3-info').innerText.includes('p=0.5')")
    # Long enough to be seen growing on a loaded machine: a 48-token run (under a second here)
    # was once seen whole after its first token, the page's main thread busy for all of it.
    set_number(p, "max-new-tokens", STREAMED)
    p.evaluate(RECORD_JS)  # records every lane's token count and stats at each DOM update
    p.click("#run")
    wait_running(p)
    p.wait_for_function("() => document.querySelectorAll('#lane-1-output .tok').length >= 4", timeout=120_000)
    wait_idle(p)
    hist = p.evaluate("() => window.__hist")
    for k in ("1", "2", "3"):
        partial = sorted({c for c, _, _ in hist[k] if 0 < c < STREAMED})
        heights = {h for c, _, h in hist[k] if 0 < c}
        assert len(heights) == 1, f"lane {k}: its output box changed height while it grew ({sorted(heights)})"
        assert len(partial) >= 2, f"lane {k}: its text did not grow step by step (counts seen: {partial})"
        assert token_count(p, int(k)) > 0
        assert "target forwards" in p.locator(f"#lane-{k}-stats").inner_text()
    stats_live = any(live and 0 < c < STREAMED for c, live, _ in hist["1"])
    assert stats_live, "the stats line did not fill in while running"
    assert "Saved" in p.locator("#status").inner_text()
    from playground.store import Store

    with Store(apps["db"]) as store:
        newest = store.load_session(store.list_sessions()[0]["id"])
    assert newest["settings"]["lanes"][2]["params"]["p"] == 0.5  # the knob reached the run
    assert newest["runs"][2]["params"]["p"] == 0.5

    # The scrubber: moving it redraws every lane's step plots.
    last = step_value(p)
    assert last >= 10
    before = insp_text(p, 1)
    box = p.locator("#step input[type=number]")
    box.fill("3")
    box.press("Enter")
    p.wait_for_function("() => document.querySelector('#inspect-1-header').innerText.includes('step 3 of')")
    p.wait_for_function("() => document.querySelector('#inspect-1').textContent.includes('step 3')")
    after = insp_text(p, 1)
    assert after != before and "step 3" in after
    assert "step 3 of" in p.locator("#inspect-3-header").inner_text()

    # Clicking a token jumps the scrubber to the step that produced it.
    tok = p.locator("#lane-3-output .tok").nth(6)
    want = int(tok.get_attribute("data-step"))
    assert want != 3
    tok.click()
    p.wait_for_function(f"() => document.querySelector('#inspect-3-header').innerText.includes('step {want} of')")
    assert step_value(p) == want
    assert p.locator("#lane-3-output .tok.cur-step").count() >= 1


def test_speculative_showdown_is_lossless_and_cheaper(page):
    """All five lanes are lossless at temperature 0: the same text, fewer target forwards."""
    p = page
    load_preset(p, "Speculative showdown")
    assert lanes_visible(p) == [1, 2, 3, 4, 5]
    p.click("#run")
    wait_idle(p)
    texts = lane_texts(p, range(1, 6))
    assert len(set(texts)) == 1 and texts[0]
    forwards = [int(re.search(r"(\d+) target forwards", p.locator(f"#lane-{k}-stats").inner_text()).group(1))
                for k in range(1, 6)]
    assert all(f < forwards[0] for f in forwards[1:]), forwards
    assert "agree" in p.locator("#divergence").inner_text()
    tok = p.locator("#lane-2-output .tok").nth(10)
    tok.click()
    want = int(tok.get_attribute("data-step"))
    p.wait_for_function(f"() => document.querySelector('#inspect-2-header').innerText.includes('step {want} of')")
    p.wait_for_selector("#inspect-2-step-0 .main-svg")


def test_stop_stops_every_lane_and_keeps_their_output(page):
    p = page
    load_preset(p, "Truncation samplers")  # six lanes of up to 480 tokens: long enough to stop
    lanes = lanes_visible(p)
    assert len(lanes) == 6
    set_number(p, "max-new-tokens", 480)
    p.click("#run")
    p.wait_for_function("() => document.querySelectorAll('#lane-1-output .tok').length >= 3", timeout=120_000)
    p.click("#stop")
    wait_idle(p, 150_000)
    assert p.locator("#status").inner_text().startswith("Stopped")
    counts = [token_count(p, k) for k in lanes]
    assert all(c < 480 for c in counts) and counts[0] >= 3
    stats = [p.locator(f"#lane-{k}-stats").inner_text() for k in lanes]
    stopped = [s for s in stats if "cancelled" in s]
    # A sampling lane may have met its end-of-text token before Stop; every other lane stopped.
    assert len(stopped) >= 4 and all("cancelled" in s or "eos" in s or "stop" in s for s in stats), stats
    time.sleep(2)
    assert [token_count(p, k) for k in lanes] == counts  # nothing runs on after Stop


def test_share_link_replays_on_a_model_free_instance(page, browser, apps):
    p = page
    load_preset(p, PRESET)
    set_number(p, "max-new-tokens", 16)
    p.click("#run")
    wait_idle(p)
    p.click("#share")
    p.wait_for_function("() => { const e = document.querySelector('#share-link textarea, #share-link input');"
                        " return e && e.value.includes('?session='); }")
    link = p.locator("#share-link textarea, #share-link input").first.input_value()
    assert link.startswith(apps["main"].url + "/?session=")
    sid = link.split("?session=")[1]
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", sid)
    texts = lane_texts(p, (1, 2, 3))
    stats = [p.locator(f"#lane-{k}-stats").inner_text() for k in (1, 2, 3)]
    headers = [p.locator(f"#inspect-{k}-header").inner_text() for k in (1, 2, 3)]

    replay_url = apps["replay"].url + urlparse(link)._replace(scheme="", netloc="").geturl()
    ctx = browser.new_context(viewport=VIEW)
    q = ctx.new_page()
    q.set_default_timeout(60_000)
    try:
        open_page(q, replay_url)
        q.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
        assert lane_texts(q, (1, 2, 3)) == texts
        assert [q.locator(f"#lane-{k}-stats").inner_text() for k in (1, 2, 3)] == stats
        assert [q.locator(f"#inspect-{k}-header").inner_text() for k in (1, 2, 3)] == headers
        for k in (1, 2, 3):
            q.wait_for_selector(f"#inspect-{k}-step-0 .main-svg")
            q.wait_for_selector(f"#inspect-{k}-run-0 .main-svg")
        q.wait_for_selector("#progress-plot .main-svg")
        assert "Replay-only" in q.locator("#model-status").inner_text()
        assert q.locator("#lane-4").is_visible() is False
        # Running on the replay instance is refused with a clear message, not a traceback.
        q.click("#run")
        q.wait_for_function("() => document.querySelector('#status').innerText.includes('replay only')")
    finally:
        ctx.close()


def test_a_script_token_is_shown_as_text_and_never_runs(browser, apps):
    from playground.runner import error_trace
    from playground.store import Store

    evil = "<script>window.__pwned=1</script>"
    img = '<img src=x onerror="window.__pwned=2">'
    tr = error_trace("", decoder="greedy", model="tiny-shakespeare", prompt="p")
    tr["stats"] = {"new_tokens": 2, "target_forwards": 2, "finish_reason": "length"}
    tr.update(output_ids=[5, 6], text=evil + img, tokens={"5": evil, "6": img}, pieces=[evil, img],
              steps=[{"i": 0, "kind": "token", "t": 0.0, "target_forwards": 1, "draft_forwards": 0,
                      "committed": [5], "dist": {"top_ids": [5, 6], "top_tokens": [evil, img],
                                                 "raw_probs": [0.6, 0.4], "final_probs": [1.0, 0.0],
                                                 "entropy": 0.6, "chosen": 5, "chosen_rank": 0, "kept_mass": 0.6}},
                     {"i": 1, "kind": "token", "t": 0.1, "target_forwards": 2, "draft_forwards": 0,
                      "committed": [6]}])
    with Store(apps["db"]) as store:
        sid = store.save_session(evil, "tiny-shakespeare", evil, {}, [tr, dict(tr)])
    ctx = browser.new_context(viewport=VIEW)
    q = ctx.new_page()
    try:
        open_page(q, f"{apps['replay'].url}/?session={sid}")
        q.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
        q.wait_for_selector("#inspect-1-step-0 .main-svg")
        text = q.locator("#lane-1-output .tok-output").evaluate("e => e.textContent")
        assert evil in text and img in text  # shown literally
        assert q.evaluate("() => window.__pwned") is None
        assert q.locator("#lane-1-output script, #lane-1-output img, #status script").count() == 0
        assert q.locator("#preset-info script").count() == 0
    finally:
        ctx.close()


@pytest.mark.parametrize("sid, message", [("not-a-valid-id", "malformed session id"),
                                          ("A" * 32, "no session")])
def test_a_bad_share_link_gives_a_clear_message(browser, apps, sid, message):
    ctx = browser.new_context(viewport=VIEW)
    q = ctx.new_page()
    try:
        open_page(q, f"{apps['replay'].url}/?session={sid}")
        q.wait_for_function(f"() => document.querySelector('#status').innerText.includes({message!r})")
    finally:
        ctx.close()


def _hand_trace(decoder: str, token_texts: list[str]) -> dict:
    """A small valid trace (token steps with evidence) built by hand."""
    from playground.runner import error_trace

    ids = list(range(10, 10 + len(token_texts)))
    tr = error_trace("", decoder=decoder, model="tiny-shakespeare", prompt="p")
    tr["stats"] = {"new_tokens": len(ids), "target_forwards": len(ids), "finish_reason": "length"}
    tr.update(output_ids=ids, text="".join(token_texts), tokens={str(i): t for i, t in zip(ids, token_texts)},
              pieces=list(token_texts), steps=[
                  {"i": j, "kind": "token", "t": 0.01 * j, "target_forwards": j + 1, "draft_forwards": 0,
                   "committed": [i], "dist": {"top_ids": [i, 99], "top_tokens": [token_texts[j], "x"],
                                              "raw_probs": [0.7, 0.3], "final_probs": [1.0, 0.0], "entropy": 0.6,
                                              "chosen": i, "chosen_rank": 0, "kept_mass": 0.7}}
                  for j, i in enumerate(ids)])
    return tr


def test_sessions_tab_lists_and_opens_a_session(browser, apps):
    from playground.store import Store

    words = ["Now ", "is ", "the ", "winter"]
    with Store(apps["db"]) as store:
        store.save_session("Sessions tab check", "tiny-shakespeare", "RICHARD:", {},
                           [_hand_trace("greedy", words), _hand_trace("top_k", words)])
    ctx = browser.new_context(viewport=VIEW)
    q = ctx.new_page()
    q.set_default_timeout(60_000)
    try:
        open_page(q, apps["replay"].url)
        q.get_by_role("tab", name="Sessions").click()
        q.wait_for_function("() => document.querySelector('#sessions-status').innerText.includes('stored session')")
        cell = q.locator("#sessions-table [role=gridcell]", has_text="Sessions tab check").first
        cell.wait_for()
        assert "greedy, top_k" in q.locator("#sessions-table").inner_text()
        cell.click()
        q.wait_for_function("() => document.querySelector('#session-selected').innerText.includes('Sessions tab check')")
        q.click("#session-open")
        q.wait_for_function("() => document.querySelector('#status').innerText.includes('Sessions tab check')")
        assert q.locator("#lane-1-output .tok-output").evaluate("e => e.textContent") == "".join(words)
        assert q.locator("#lane-2-decoder input").input_value().endswith("top_k")
    finally:
        ctx.close()


def _share_sid(q) -> str:
    q.click("#share")
    q.wait_for_function("() => { const e = document.querySelector('#share-link textarea, #share-link input');"
                        " return e && e.value.includes('?session='); }")
    return q.locator("#share-link textarea, #share-link input").first.input_value().split("?session=")[1]


def test_several_people_at_once_each_get_their_own_comparison(browser, apps):
    """Four pages press Run together while a fifth runs a long comparison: each of the four
    gets its complete comparison, token for token what ``playground.api.compare`` gives for
    its seed; Stop in the long one stops that page, and only that one."""
    from playground.api import compare
    from playground.store import Store

    seeds = [11, 12, 13, 14]
    ctxs = []

    def new_page():
        ctx = browser.new_context(viewport=VIEW)
        ctxs.append(ctx)
        q = ctx.new_page()
        q.set_default_timeout(120_000)
        open_page(q, apps["main"].url)
        return q

    try:
        long = new_page()
        load_preset(long, "Truncation samplers")
        set_number(long, "max-new-tokens", 480)
        pages = []
        for seed in seeds:
            q = new_page()
            load_preset(q, PRESET)
            set_number(q, "seed", seed)
            set_number(q, "max-new-tokens", 24)
            pages.append(q)

        long.click("#run")
        long.wait_for_function("() => document.querySelectorAll('#lane-1-output .tok').length >= 3", timeout=120_000)
        # The refusal of a second Run: test_a_second_run_by_shift_enter_is_refused_and_the_first_runs_on.
        # Everyone starts at about the same moment.
        # (a script click returns at once: Playwright's own click waits for each page to settle,
        # which under this load once took long enough for the long run to end before Stop)
        for q in pages:
            q.evaluate("() => document.querySelector('#run').click()")
        assert long.locator("#status").inner_text().startswith("Running"), "the long run ended before Stop"
        # Stop by a script click too. Playwright's click first waits for the button to hold still
        # over two animation frames and for a hit test, each a round trip to a page busy drawing
        # six streaming lanes; with five pages sharing two cores that took over a minute, and
        # the click landed after the run had ended (the button then disabled). A person's click
        # is one input event, as this is; test_stop_stops_every_lane_and_keeps_their_output
        # presses Stop with Playwright's own click.
        long.evaluate("() => document.querySelector('#stop').click()")
        wait_idle(long, 150_000)
        assert long.locator("#status").inner_text().startswith("Stopped")
        assert any("cancelled" in long.locator(f"#lane-{k}-stats").inner_text() for k in range(1, 7))

        with Store(apps["db"]) as store:
            for seed, q in zip(seeds, pages):
                wait_idle(q, 240_000)
                assert q.locator("#status").inner_text().startswith("Done"), seed  # Stop elsewhere left it alone
                runs = store.load_session(_share_sid(q))["runs"]
                want = compare("greedy-beam-sampling", seed=seed, max_new_tokens=24)
                assert [r["output_ids"] for r in runs] == [w["output_ids"] for w in want], seed
                assert lane_texts(q, (1, 2, 3))[0]
        sampled = {lane_texts(q, (3,))[0] for q in pages}
        assert len(sampled) > 1  # the sampling lane differs between seeds: nobody saw another's run
    finally:
        for ctx in ctxs:
            ctx.close()


def test_a_second_run_by_shift_enter_is_refused_and_the_first_runs_on(page):
    """Shift+Enter in the prompt while the page's comparison streams starts nothing: the page says
    why under the status, Stop stays enabled and Run disabled, and the first run ends complete."""
    load_preset(page, "Truncation samplers")
    # long enough that the run is still streaming when the key press lands, on a busy machine too
    # (the notice is written only while Run is disabled; a 160-token run once ended in between)
    set_number(page, "max-new-tokens", 480)
    page.click("#run")
    page.wait_for_function("() => document.querySelectorAll('#lane-1-output .tok').length >= 3", timeout=120_000)
    page.locator("#prompt textarea").press("Shift+Enter")
    # the buttons read in the same moment the notice shows: two separate reads once straddled the
    # run's own end (Stop still enabled, then Run enabled by the Done frame)
    state = page.wait_for_function(
        "() => document.querySelector('#run-notice').innerText.includes('already running') &&"
        " {stop_enabled: !document.querySelector('#stop').disabled, run_disabled: document.querySelector('#run').disabled,"
        "  status: document.querySelector('#status').innerText}").json_value()
    assert not re.match(r"^(Done|Stopped)", state["status"]), state  # refused while the first run streamed
    assert state["stop_enabled"] and state["run_disabled"], state
    wait_idle(page, 300_000)
    assert page.locator("#status").inner_text().startswith("Done")
    assert "cancelled" not in page.locator("#lane-1-stats").inner_text()  # the first run was not cut short
    assert page.locator("#run-notice").inner_text().strip() == ""  # the notice ends with the run
