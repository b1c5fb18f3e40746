"""Stale lanes and raw Gradio errors, in a real browser (headless Chromium driven by Playwright).

Covered: after a run, picking a preset, changing a lane's decoder or knob and + Lane clear
the lane to "Press Run" (text, stats, inspector column), a token click never brings the old
lane back, − Lane and a preset with fewer lanes leave no inspector column for a lane not on
the page (issue 36, item 1); every numeric control driven past its bounds — max new tokens,
seed, the step and position scrubbers (also after a run with fewer steps than the one
before), a knob, the Watermark tab's numbers — answers with the page's own line and never
with Gradio's "Error" toast or badge (item 2).
"""

from __future__ import annotations

import pytest

# app, browser, page: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import choose, load_preset, status_text, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOWDOWN = "Speculative showdown"  # five lanes: greedy, speculative, spec_tree, prompt_lookup, lookahead
GREEDY = "Greedy vs beam search vs sampling"  # three lanes: greedy, beam, top_p

# Gradio's own error display: a red toast, and the "Error" badge of a component's status tracker.
GRADIO_ERRORS_JS = """() => [
  ...[...document.querySelectorAll('.toast-body.error')].map(e => 'toast: ' + e.innerText.replace(/\\s+/g, ' ')),
  ...[...document.querySelectorAll('.error')].filter(e => e.innerText.trim() === 'Error').map(e => 'badge')]"""


def gradio_errors(p) -> list[str]:
    return p.evaluate(GRADIO_ERRORS_JS)


def set_number(p, selector: str, value: str) -> None:
    box = p.locator(selector).first
    box.fill(value)
    box.press("Enter")


def tokens(p, k: int) -> int:
    return p.locator(f"#lane-{k}-output .tok").count()


def header(p, k: int) -> str:
    return p.locator(f"#inspect-{k}-header").inner_text()


def wait_press_run(p, k: int) -> None:
    p.wait_for_function(f"() => {{ const o = document.querySelector('#lane-{k}-output');"
                        f" return o && o.innerText.includes('Press Run') && !o.querySelector('.tok'); }}")


def assert_cleared(p, k: int) -> None:
    """Lane k shows nothing of a run: its text, stats and inspector column are the "Press Run" state."""
    wait_press_run(p, k)
    p.wait_for_function(f"() => document.querySelector('#lane-{k}-stats .lane-stats').innerText.trim() === '—'")
    p.wait_for_function(f"() => document.querySelector('#inspect-{k}-header').innerText.includes('press Run')")
    assert p.locator(f"#inspect-{k} .js-plotly-plot:visible").count() == 0


def wait_wm_status(p, line: str, elem: str) -> None:
    """Wait until the Watermark tab's status shows ``line``; a timeout says what the tab showed
    (its status, the number box, Gradio's loading state of the status) instead of a bare timeout."""
    try:
        p.wait_for_function("(line) => document.querySelector('#wm-status').innerText.includes(line)", arg=line)
    except Exception as e:  # noqa: BLE001 - say what the page showed
        shown = p.evaluate("(elem) => ({status: document.querySelector('#wm-status').innerText,"
                           " box: document.querySelector('#' + elem + ' input').value,"
                           " detect_disabled: document.querySelector('#wm-detect').disabled,"
                           " loading: [...document.querySelectorAll('#wm-status .wrap, #wm-status .progress-text, #wm-status .eta-bar')]"
                           ".map(x => x.className + ':' + x.innerText.trim())})", elem)
        raise AssertionError(f"Detect with {elem} out of range never said {line!r}: the tab shows {shown}") from e


def run(p, max_new: int) -> None:
    """Run with ``max_new`` tokens and wait until this run (not an earlier line) is done."""
    set_number(p, "#max-new-tokens input", str(max_new))
    # the status element is replaced by the run's first frame: marking it tells the lines apart
    p.evaluate("() => { const s = document.querySelector('#status .pg-status'); if (s) s.dataset.old = '1'; }")
    p.click("#run")
    p.wait_for_function("() => { const s = document.querySelector('#status .pg-status');"
                        " return s && !s.dataset.old; }", timeout=120_000)
    wait_idle(p)


def test_a_lane_whose_setup_changes_is_cleared_and_the_inspector_shows_only_the_pages_lanes(page):
    p = page
    load_preset(p, SHOWDOWN)
    run(p, 8)
    assert tokens(p, 2) == 8 and "acceptance" in p.locator("#lane-2-stats").inner_text()
    assert p.locator("#inspect-5").is_visible()
    # the reproduction: the showdown, then a preset with fewer (and other) lanes
    load_preset(p, GREEDY)
    for k in (1, 2, 3):
        assert_cleared(p, k)
    assert "beam" in header(p, 2) and "speculative" not in header(p, 2)
    assert not p.locator("#inspect-4").is_visible() and not p.locator("#inspect-5").is_visible()
    assert gradio_errors(p) == []

    run(p, 8)
    assert all(tokens(p, k) == 8 for k in (1, 2, 3))
    choose(p, "lane-2-decoder", "· greedy")  # a lane's decoder
    assert_cleared(p, 2)
    assert tokens(p, 1) == 8 and "Lane 2 changed" in status_text(p)
    p.locator("#lane-1-output .tok").nth(3).click()  # a token click redraws the inspector from the traces
    p.wait_for_function("() => document.querySelector('#inspect-1-header').innerText.includes('step 3 of')")
    assert "press Run" in header(p, 2) and tokens(p, 2) == 0

    p.click("#add-lane")  # + Lane: a lane shown again holds no older run
    p.wait_for_function("() => document.querySelector('#status').innerText.includes('Lane 4 added')")
    assert_cleared(p, 4)
    p.locator("#lane-3-settings").get_by_text("Lane settings").click()  # a knob (lane 3 is top_p)
    set_number(p, "#lane-3-knob-p input[type=number]", "0.5")
    assert_cleared(p, 3)
    assert "Lane 4 added" not in status_text(p)  # a later change replaces the lane-added notice

    p.click("#remove-lane")
    p.click("#remove-lane")
    p.wait_for_function("() => !document.querySelector('#lane-3') || getComputedStyle("
                        "document.querySelector('#lane-3')).display === 'none' || !document.querySelector('#lane-3').offsetParent")
    p.locator("#lane-1-output .tok").nth(5).click()
    p.wait_for_function("() => document.querySelector('#inspect-1-header').innerText.includes('step 5 of')")
    assert not p.locator("#inspect-3").is_visible() and not p.locator("#inspect-4").is_visible()
    assert gradio_errors(p) == []


def test_every_number_past_its_bounds_gets_the_pages_own_line_never_a_gradio_error(page):
    p = page
    load_preset(p, GREEDY)
    for elem, value, line in [("max-new-tokens", "5000", "max new tokens 5000 is over this instance's limit"),
                              ("max-new-tokens", "0", "max new tokens must be a positive integer"),
                              ("max-new-tokens", "-3", "max new tokens must be a positive integer"),
                              ("seed", "-7", "seed must be between 0 and 2^63 - 1")]:
        if elem == "seed":
            set_number(p, "#max-new-tokens input", "8")  # only the seed is out of bounds
        set_number(p, f"#{elem} input", value)
        p.click("#run")
        p.wait_for_function("(line) => document.querySelector('#status').innerText.includes(line)", arg=line)
        assert p.locator("#status .pg-status-error").count() == 1
        assert gradio_errors(p) == [], value

    set_number(p, "#seed input", "0")
    run(p, 12)
    assert tokens(p, 1) == 12 and gradio_errors(p) == []
    set_number(p, "#step input[type=number]", "999")  # past the scrubber's end
    p.wait_for_timeout(1500)
    assert gradio_errors(p) == []
    # a run with fewer steps than the one before: the scrubber's range follows it
    run(p, 3)
    p.locator("#lane-1-output .tok").nth(1).click()
    p.wait_for_function("() => document.querySelector('#inspect-1-header').innerText.includes('step 1 of 2')")
    assert gradio_errors(p) == []
    top = float(p.locator("#step input[type=range]").get_attribute("max"))
    assert float(p.locator("#step input[type=number]").input_value()) <= top

    p.locator("#align").get_by_text("by token position").click()
    p.locator("#position").wait_for(state="visible")
    set_number(p, "#position input[type=number]", "500")
    p.wait_for_timeout(1500)
    assert gradio_errors(p) == []

    p.locator("#lane-3-settings").get_by_text("Lane settings").click()
    set_number(p, "#lane-3-knob-p input[type=number]", "7")
    p.wait_for_function("() => document.querySelector('#lane-3-knob-p').innerText.includes('out of range [0, 1]')")
    assert gradio_errors(p) == []

    p.get_by_role("tab", name="Watermark").click()
    p.locator("#wm-text textarea").fill("To be or not to be, that is the question.")
    for elem, value, line in [("wm-gamma", "5", "'watermark_gamma'=5 is out of range"),
                              ("wm-context-width", "-4", "'watermark_context_width'=-4 is out of range")]:
        set_number(p, f"#{elem} input", value)
        p.click("#wm-detect")
        wait_wm_status(p, line, elem)
        assert gradio_errors(p) == [], elem
        set_number(p, f"#{elem} input", "0.25" if elem == "wm-gamma" else "1")
        p.wait_for_timeout(300)
    # the lane picker offers the lanes the comparison has: lane 3 changed since (its knob)
    p.click("#wm-lane input")
    options = [t.replace("✓", "").strip() for t in p.locator("[role=option]").all_inner_texts()]
    assert options == ["lane 1 · greedy", "lane 2 · beam"]
