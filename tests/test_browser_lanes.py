"""Hand-built lanes in a real browser (headless Chromium driven by Playwright).

What a person does after the presets: pick decoders by hand, set their knobs, add and remove
lanes, and run. Covered: a hand-picked decoder gets its own knob controls and the value set
there is the value the run used (read back from the stored session); a knob out of range is
refused with a message next to the control and nothing is clamped; a decoder that needs a
draft model with the draft box cleared is refused ("pick a draft model"), never run against
the target itself; "+ Lane"/"− Lane" stop at the limits, are disabled there and say so; a
lane added to a diffusion preset gets a diffusion decoder; max new tokens shows the model's
budget and a run beyond it is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from browser_helpers import CHROMIUM, ROOT, App, launch_browser, status_text, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

playwright_api = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)
if not (ROOT / "assets" / "models" / "tiny-shakespeare" / "config.json").exists():
    pytest.skip("the bundled tiny-shakespeare model is missing", allow_module_level=True)

PRESET = "Greedy vs beam search vs sampling"  # lanes: greedy, beam, top_p on the bundled target
VIEW = {"width": 1440, "height": 1100}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-lanes")
    db = str(tmp / "sessions.db")
    a = App(db, tmp / "app.log", OMP_NUM_THREADS="1")
    a.db = db  # type: ignore[attr-defined]  (where newest_session reads the stored runs)
    try:
        a.wait()
        yield a
    finally:
        a.stop()


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as pw:
        b = launch_browser(pw)
        yield b
        b.close()


@pytest.fixture()
def page(browser, app):
    ctx = browser.new_context(viewport=VIEW)
    p = ctx.new_page()
    p.set_default_timeout(60_000)
    p.goto(app.url)
    p.wait_for_function("() => { const s = document.querySelector('#status');"
                        " return s && s.innerText.trim().length > 0 && !s.innerText.includes('Pick a preset'); }",
                        timeout=120_000)
    yield p
    ctx.close()


def choose(p, elem_id: str, text: str) -> None:
    """Pick the option containing ``text`` in the Gradio dropdown ``#elem_id``."""
    p.click(f"#{elem_id} input")
    p.locator("[role=option]", has_text=text).first.click()


def load_preset(p, title: str) -> None:
    choose(p, "preset", title)
    p.wait_for_function("() => document.querySelector('#status').innerText.includes('loaded')")


def set_number(p, selector: str, value: str) -> None:
    box = p.locator(selector).first
    box.fill(value)
    box.press("Enter")


def open_settings(p, k: int) -> None:
    p.locator(f"#lane-{k}-settings").get_by_text("Lane settings").click()


def pick_decoder(p, k: int, name: str) -> None:
    """Pick decoder ``name`` by hand in lane ``k`` (its option reads "family · name")."""
    choose(p, f"lane-{k}-decoder", f"· {name}")


def newest_session(app: App) -> dict:
    from playground.store import Store

    with Store(app.db) as store:
        return store.load_session(store.list_sessions()[0]["id"])


def test_a_hand_picked_decoder_gets_its_knobs_and_the_value_set_is_the_value_run(page, app):
    p = page
    load_preset(p, PRESET)
    open_settings(p, 1)
    assert p.locator("#lane-1-knobs").count() == 0  # greedy has no knobs
    pick_decoder(p, 1, "top_p")
    knob = p.locator("#lane-1-knob-p input[type=number]")
    knob.wait_for(state="visible", timeout=30_000)
    assert p.locator("#lane-1-knob-gamma").count() == 0
    set_number(p, "#lane-1-knob-p input[type=number]", "0.42")
    p.wait_for_function("() => document.querySelector('#lane-1-info').innerText.includes('p=0.42')")
    set_number(p, "#max-new-tokens input", "8")
    p.click("#run")
    wait_idle(p)
    s = newest_session(app)
    assert s["settings"]["lanes"][0]["decoder"] == "top_p"
    assert s["settings"]["lanes"][0]["params"]["p"] == 0.42
    assert s["runs"][0]["decoder"] == "top_p" and s["runs"][0]["params"]["p"] == 0.42
    # and back: greedy -> speculative shows speculative's own knobs, not "no knobs"
    open_settings(p, 2)
    pick_decoder(p, 2, "speculative")
    p.locator("#lane-2-knob-gamma").wait_for(state="visible", timeout=30_000)
    assert p.locator("#lane-2-knob-num_beams").count() == 0
