"""Notes on steps and the Sessions tab's HTML export in a real browser (headless Chromium).

Covered: a note typed on a replayed comparison's step is stored and shown again when its link
is reopened (escaped); the Sessions tab's *Export HTML* link downloads one page that carries
the lanes' text, the note and the plots, and that page draws its plots from a file URL with
the network cut off.
"""

from __future__ import annotations

import pytest

import playground
from playground.notes import notes_of
from playground.store import Store
from tests.browser_helpers import open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "ROMEO:\n"
NOTE = "here top_k keeps <only> the likeliest"


def test_a_note_on_a_step_is_kept_and_shown_on_the_link_and_in_the_html_export(page, app, tmp_path):
    lanes = [playground.generate(model="tiny-shakespeare", decoder=d, prompt=PROMPT, max_new_tokens=6, seed=2)
             for d in ("greedy", "top_k")]
    with Store(app.db) as s:
        sid = s.save_session("notes check", "tiny-shakespeare", PROMPT, {}, lanes)
    open_page(page, f"{app.url}/?session={sid}")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
    page.locator("#lane-2-output .tok[data-step='3']").first.click()
    page.wait_for_function("() => document.querySelector('#notes-where').innerText.includes('Lane 2, step 3')")
    page.locator("#note-text textarea").fill(NOTE)
    page.click("#note-save")
    page.wait_for_function("() => document.querySelector('#notes-status').innerText.includes('Saved')")
    with Store(app.db) as s:
        assert [(n["lane"], n["step"], n["text"]) for n in notes_of(s.load_session(sid))] == [(1, 3, NOTE)]

    open_page(page, f"{app.url}/?session={sid}")
    page.wait_for_function("() => document.querySelector('#notes-list').innerText.includes('step 3')")
    assert NOTE in page.locator("#notes-list").inner_text()

    page.get_by_role("tab", name="Sessions").click()
    cell = page.locator("#sessions-table [role=gridcell]", has_text="notes check").first
    cell.wait_for()
    cell.click()
    page.wait_for_function("() => document.querySelector('#session-selected').innerText.includes('notes check')")
    page.click("#session-export-html")
    link = page.locator("#session-export-file a.pg-export-link")
    link.wait_for()
    with page.expect_download() as dl:
        link.click()
    out = tmp_path / "session.html"
    dl.value.save_as(out)
    text = out.read_text(encoding="utf-8")
    assert "here top_k keeps &lt;only&gt; the likeliest" in text

    # the downloaded page, opened from disk with no network, shows the text, the note and plots
    ctx = page.context.browser.new_context(offline=True)
    try:
        q = ctx.new_page()
        q.goto(out.as_uri())
        q.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        body = q.locator("body").inner_text()
        assert NOTE in body and "notes check" in body
        # every embedded figure is drawn, the step plots of both lanes too
        blocks = text.count('type="application/json" data-figure=')
        q.wait_for_function(f"() => document.querySelectorAll('.plot .js-plotly-plot, .plot.js-plotly-plot').length >= {blocks}")
        assert q.locator("#pg-lane0-step .js-plotly-plot").count() >= 1
        # the scrubber: a step's plots and its tokens follow it; a token click moves it
        q.locator("#pg-step").evaluate("e => { e.value = '1'; e.dispatchEvent(new Event('input')); }")
        assert q.locator("#pg-step-label").inner_text() == "step 1"
        assert q.locator("section.lane[data-lane='1'] .tok.pg-current").first.get_attribute("data-step") == "1"
        assert "step 1" in q.locator("#pg-lane1-step").inner_text()
        q.locator("section.lane[data-lane='0'] .tok[data-step='4']").first.click()
        assert q.locator("#pg-step").input_value() == "4"
        assert q.locator("section.lane[data-lane='1'] .tok.pg-current").first.get_attribute("data-step") == "4"
    finally:
        ctx.close()
