"""The Study and Watermark tabs in a real browser (headless Chromium driven by Playwright).

Covered: a study file in the server's data folder opens by name, its aggregate table and a
figure show, and "Open in Compare" replays the chosen prompt's comparison in the Compare tab;
the Watermark tab scores a watermarked text above the threshold and colours its tokens.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from playground.store import Store
from tests.browser_helpers import open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "ROMEO.\nBut soft, what light"


@pytest.fixture(scope="module")
def study(app):
    """A two-prompt study written beside the app's own database (its data folder)."""
    from playground.cli import main
    from playground.study import DEFAULT_PROMPTS, read_prompts

    folder = Path(app.db).parent
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": k, "prompt": p}) + "\n" for k, p in read_prompts(DEFAULT_PROMPTS)[:2]))
    out = folder / "study.db"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["study", "--prompts", str(prompts), "--lanes", "greedy,top_p", "--max-new-tokens", "5",
                     "--seed", "1", "--no-progress", "--out", str(out), "--json"]) == 0
    return out, json.loads(buf.getvalue())


def test_study_tab_opens_a_study_and_a_prompts_comparison(page, study):
    out, printed = study
    page.get_by_role("tab", name="Study").click()
    page.locator("#study-path input, #study-path textarea").first.fill("study.db")
    page.click("#study-open")
    page.wait_for_function("() => document.querySelector('#study-status').innerText.includes('2 prompts')")
    table = page.locator("#study-table").inner_text()
    assert "greedy" in table and "top_p" in table
    page.locator("#study-figure .js-plotly-plot").first.wait_for()
    key = list(printed["sessions"])[0]
    assert key in page.locator("#study-prompt input").input_value()
    page.click("#study-open-compare")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
    with Store(out) as s:
        stored = s.load_session(printed["sessions"][key])
    shown = page.locator("#lane-1-output .tok-output").evaluate("e => e.textContent")
    assert shown.replace("↵", "") == stored["runs"][0]["text"]  # ↵ marks a newline token
    assert page.locator("#lane-2-decoder input").input_value().endswith("top_p")


def test_watermark_tab_detects_a_watermarked_text(page):
    import playground

    marked = playground.generate(model="tiny-shakespeare", decoder="watermark", prompt=PROMPT, max_new_tokens=48,
                                 seed=1)
    page.get_by_role("tab", name="Watermark").click()
    page.locator("#wm-text textarea").fill(marked["text"])
    page.locator("#wm-prompt textarea, #wm-prompt input").first.fill(PROMPT)
    page.click("#wm-detect")
    page.wait_for_function("() => document.querySelector('#wm-status').innerText.includes('z = ')")
    status = page.locator("#wm-status").inner_text()
    assert "watermarked" in status and "no watermark" not in status
    assert page.locator("#wm-tokens .tok.wm[data-green=true]").count() > page.locator(
        "#wm-tokens .tok.wm[data-green=false]").count()
    page.locator("#wm-z .js-plotly-plot").first.wait_for()


def test_the_sandbox_cuts_a_typed_distribution_stage_by_stage(page):
    page.get_by_role("tab", name="Sandbox").click()
    page.locator("#sandbox-dist textarea").fill("the 0.4\na 0.3\nthou 0.2\nRomeo 0.1")
    box = page.locator("#sandbox-knob-top_k input").first
    box.fill("2")
    page.click("#sandbox-apply")
    page.wait_for_function("() => document.querySelector('#sandbox-status').innerText.includes('Drew')")
    status = page.locator("#sandbox-status").inner_text()
    assert "top_k(k=2)" in status and ("'the'" in status or "'a'" in status), status
    page.locator("#sandbox-chain-plot .js-plotly-plot").first.wait_for()
    assert "Romeo" in page.locator("#sandbox-chain-plot").inner_text()  # the cut token is drawn, in red
    page.locator("#sandbox-dist textarea").fill("the")
    page.click("#sandbox-apply")
    page.wait_for_function("() => !!document.querySelector('#sandbox-status .pg-status-error')")
    assert "is not 'token value'" in page.locator("#sandbox-status").inner_text()


def test_the_sweep_tab_runs_a_grid_and_any_cell_opens_as_a_comparison(page, app):
    page.get_by_role("tab", name="Sweep").click()
    page.locator("#sweep-values1 input, #sweep-values1 textarea").first.fill("0.5,1.0")
    page.locator("#sweep-values2 input, #sweep-values2 textarea").first.fill("0.5,1.0")
    page.locator("#sweep-max-new input").first.fill("4")
    page.click("#sweep-run")
    page.wait_for_function("() => document.querySelector('#sweep-status').innerText.includes('4 cells')", timeout=180_000)
    page.locator("#sweep-plot .js-plotly-plot").first.wait_for()
    assert page.locator("#sweep-grid .sweep-cell").count() == 4
    href = page.locator("#sweep-grid .sweep-cell a").first.get_attribute("href")
    assert href.startswith("?session=")
    open_page(page, f"{app.url}/{href}")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
    assert page.locator("#lane-1-decoder input").input_value().endswith("top_p")


def test_the_sandbox_draws_what_the_run_drew_on_a_recorded_step(page, app):
    import playground

    trace = playground.generate(model="tiny-shakespeare", decoder="top_k", prompt=PROMPT, max_new_tokens=6, seed=3,
                                k=5, temperature=1.0)
    with Store(app.db) as s:
        sid = s.save_session("sandbox step", "tiny-shakespeare", PROMPT, {}, [trace])
    step = trace["steps"][2]
    drawn = trace["tokens"][str(step["committed"][0])]
    page.get_by_role("tab", name="Sandbox").click()
    page.locator("#sandbox-recorded").get_by_text("…or a recorded step of a session").click()
    page.locator("#sandbox-session input, #sandbox-session textarea").first.fill(sid)
    page.locator("#sandbox-step input").first.fill("2")
    page.click("#sandbox-load")
    page.wait_for_function("() => document.querySelector('#sandbox-status').innerText.includes('Loaded lane 1')")
    page.locator("#sandbox-knob-top_k input").first.fill("5")
    page.locator("#sandbox-knob-temperature input").first.fill("1")
    page.click("#sandbox-apply")
    page.wait_for_function("() => document.querySelector('#sandbox-status').innerText.includes('Drew')")
    status = page.locator("#sandbox-status").inner_text()
    assert f"Drew {drawn!r}" in status, status
    page.locator("#sandbox-chain-plot .js-plotly-plot").first.wait_for()
