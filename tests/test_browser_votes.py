"""Blind votes in a real browser (headless Chromium driven by Playwright).

Covered: the vote page of a blind comparison holds no decoder name anywhere in its DOM until the
reader votes, then reveals the letters and the session's table; the Compare page's share link
of a blind session shows no lanes, only the way to the vote; *Blind vote* + Share turns an
open comparison into a vote link; the Results tab draws the table and the forest plot.
"""

from __future__ import annotations

import pytest

import playground
from playground.store import Store
from tests.browser_helpers import open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "ROMEO:\n"
DECODERS = ("mirostat", "typical")


@pytest.fixture(scope="module")
def blind_sid(app):
    """A two-lane blind comparison stored in the app's database (made by no browser)."""
    lanes = [playground.generate(model="tiny-shakespeare", decoder=d, prompt=PROMPT, max_new_tokens=8, seed=3 + k)
             for k, d in enumerate(DECODERS)]
    assert lanes[0]["text"] != lanes[1]["text"]  # the test tells the lanes apart by their text
    with Store(app.db) as s:
        sid = s.save_session("which reads better", "tiny-shakespeare", PROMPT, {}, lanes)
        s.set_blind(sid, True)
    return sid, lanes


def dom(page) -> str:
    return page.evaluate("() => document.documentElement.outerHTML")


def test_the_vote_page_hides_every_decoder_until_the_vote(page, app, blind_sid):
    sid, lanes = blind_sid
    page.goto(f"{app.url}/vote?session={sid}")
    page.locator("#vote-lane-B .vote-text").wait_for()
    before = dom(page)
    for name in (*DECODERS, "tiny-shakespeare", "temperature"):
        assert name not in before, name
    shown = {page.locator(f"#vote-lane-{L} .vote-text").inner_text() for L in "AB"}
    assert shown == {t["text"] for t in lanes}
    page.check("#vote-best-A")
    page.locator("#vote-reason").fill("reads like a play")
    page.click("#vote-submit")
    page.wait_for_function("() => !document.querySelector('#vote-reveal').hidden")
    reveal = page.locator("#vote-reveal").inner_text()
    assert all(name in reveal for name in DECODERS)
    a_text = page.locator("#vote-lane-A .vote-text").inner_text()
    winner = DECODERS[[t["text"] for t in lanes].index(a_text)]
    assert f"A was {winner}" in reveal
    assert "1 ballot" in reveal
    with Store(app.db) as s:
        assert s.ballot_count(sid) == 1
    # coming back: the same letters, the vote and the reveal stay
    page.reload()
    page.wait_for_function("() => !document.querySelector('#vote-reveal').hidden")
    assert page.locator("#vote-lane-A .vote-text").inner_text() == a_text
    assert page.is_checked("#vote-best-A")

    # the Results tab (same browser, one user's instance: every ballot)
    open_page(page, app.url)
    page.get_by_role("tab", name="Results").click()
    page.wait_for_function("() => document.querySelector('#results-status').innerText.includes('ballot')")
    table = page.locator("#results-table").inner_text()
    assert winner in table
    page.locator("#results-plot .js-plotly-plot").first.wait_for()
    assert "reads like a play" in page.locator("#results-reasons").inner_text()


def test_a_blind_sessions_replay_link_shows_no_lanes(page, app, blind_sid):
    sid, lanes = blind_sid
    open_page(page, f"{app.url}/?session={sid}")
    assert f"/vote?session={sid}" in page.locator("#status").inner_text()
    assert lanes[0]["text"].strip()[:12] not in page.locator("#lanes").inner_text()


def test_blind_vote_and_share_give_the_vote_link(page, app):
    lanes = [playground.generate(model="tiny-shakespeare", decoder=d, prompt=PROMPT, max_new_tokens=4, seed=1)
             for d in ("greedy", "top_k")]
    with Store(app.db) as s:
        sid = s.save_session("to share blind", "tiny-shakespeare", PROMPT, {}, lanes)
    open_page(page, f"{app.url}/?session={sid}")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
    page.check("#blind input")
    page.click("#share")
    page.wait_for_function("() => document.querySelector('#share-link textarea, #share-link input').value.includes('/vote')")
    assert page.locator("#share-link textarea, #share-link input").first.input_value().endswith(f"/vote?session={sid}")
    with Store(app.db) as s:
        assert s.load_session(sid)["settings"]["blind"] is True
