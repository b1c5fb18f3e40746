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

import time

import pytest

# app, browser, page: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import App, choose, load_preset, status_text, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PRESET = "Greedy vs beam search vs sampling"  # lanes: greedy, beam, top_p on the bundled target


def set_number(p, selector: str, value: str) -> None:
    box = p.locator(selector).first
    box.fill(value)
    box.press("Enter")


def open_settings(p, k: int) -> None:
    p.locator(f"#lane-{k}-settings").get_by_text("Lane settings").click()


def pick_decoder(p, k: int, name: str) -> None:
    """Pick decoder ``name`` by hand in lane ``k`` (its option reads "family · name")."""
    choose(p, f"lane-{k}-decoder", f"· {name}")


def session_count(app: App) -> int:
    from playground.store import Store

    with Store(app.db) as store:
        return store.count()


def wait_saved(app: App, before: int, timeout_s: float = 180.0) -> None:
    """Wait until a run started after ``before`` sessions were stored has been saved."""
    deadline = time.monotonic() + timeout_s
    while session_count(app) <= before:
        if time.monotonic() > deadline:
            raise AssertionError(f"no session was saved within {timeout_s:.0f} s")
        time.sleep(0.5)


def newest_session(app: App) -> dict:
    from playground.store import Store

    with Store(app.db) as store:
        return store.load_session(store.list_sessions()[0]["id"])


def test_a_hand_picked_decoder_gets_its_knobs_and_the_value_set_is_the_value_run(page, app):
    p = page
    load_preset(p, PRESET)
    open_settings(p, 1)
    assert p.locator("#lane-1-knob-p").count() == 0  # greedy has no p
    renders = knob_renders(p)
    pick_decoder(p, 1, "top_p")  # by mouse, which Gradio reports twice
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
    assert renders.count((0, "top_p")) == 1, renders  # the pick rendered lane 1's knobs once
    # and back: greedy -> speculative shows speculative's own knobs, not "no knobs"
    open_settings(p, 2)
    pick_decoder(p, 2, "speculative")
    p.locator("#lane-2-knob-gamma").wait_for(state="visible", timeout=30_000)
    assert p.locator("#lane-2-knob-num_beams").count() == 0


def inspector_header(p, k: int) -> str:
    return p.locator(f"#inspect-{k}-header").inner_text()


def knob_renders(p) -> list[tuple[int, str]]:
    """Record the knob renders the page asks for from now on: (0-based lane, decoder) each (a
    render's id is its place among the app's renders, and the knob renders are its only ones)."""
    lane_of = dict(p.evaluate("() => window.gradio_config.dependencies.filter((d) => d.render_id !== null"
                              " && d.render_id !== undefined).map((d) => [d.id, d.render_id])"))
    assert lane_of, "the page's config names no render"
    asked: list[tuple[int, str]] = []

    def on_request(r) -> None:
        if "/queue/join" in r.url and r.post_data:
            body = r.post_data_json
            if body.get("fn_index") in lane_of:
                asked.append((lane_of[body["fn_index"]], body["data"][0]))

    p.on("request", on_request)
    return asked


def test_an_out_of_range_knob_is_refused_next_to_its_control_and_never_clamped(page, app):
    p = page
    renders = knob_renders(p)
    load_preset(p, PRESET)  # a pick by mouse, which Gradio reports twice
    open_settings(p, 3)  # top_p, typed into at once: no second render replaces the control meanwhile
    set_number(p, "#lane-3-knob-p input[type=number]", "1.5")
    p.wait_for_function("() => document.querySelector('#lane-3-knob-p').innerText.includes('out of range [0, 1]')")
    assert p.locator("#lane-3-knob-p input[type=number]").input_value() == "1.5"  # shown as typed
    box = p.locator("#preset input")
    box.focus()
    box.blur()  # which Gradio reports as a pick of the preset shown: it changes nothing
    set_number(p, "#max-new-tokens input", "8")
    p.click("#run")
    wait_idle(p)
    status = status_text(p)
    assert "Lane 3 failed" in status and p.locator("#status .pg-status-error").count() == 1, status
    assert "knob 'p'=1.5 is out of range [0, 1]" in p.locator("#lane-3-output .lane-error").inner_text()
    assert p.locator("#lane-1-output .tok").count() == 8  # the other lanes ran
    s = newest_session(app)
    assert not s["runs"][2]["steps"]  # nothing ran with a clamped or default p
    # the preset rendered its lanes' knobs once each (the page before it had other decoders
    # there), and leaving its box re-applied nothing
    assert renders.count((1, "beam")) == 1 and renders.count((2, "top_p")) == 1, renders

    # The inspector: align lanes by token position, then focus one lane.
    p.locator("#align").get_by_text("by token position").click()
    p.locator("#position").wait_for(state="visible")
    assert not p.locator("#step").is_visible()
    set_number(p, "#position input[type=number]", "3")
    p.wait_for_function("() => document.querySelector('#inspect-2-header').innerText.includes('token 3')")
    # the token at that position is outlined in every lane
    p.wait_for_function("() => [1, 2].every((k) => { const t = document.querySelectorAll("
                        "'#lane-' + k + '-output .tok')[3]; return t && t.classList.contains('cur-step'); })")
    # beam commits its tokens at the end, greedy one per step: the same position, different steps
    assert "step 3 of" in inspector_header(p, 1)
    assert "step 3 of" not in inspector_header(p, 2)
    p.locator("#lane-1-output .tok").nth(5).click()  # a token click moves the position scrubber
    p.wait_for_function("() => document.querySelector('#inspect-2-header').innerText.includes('token 5')")
    assert p.locator("#position input[type=number]").input_value() == "5"
    choose(p, "focus", "Lane 2 only")
    p.wait_for_function("() => { const e = document.querySelector('#inspect-1');"
                        " return e && getComputedStyle(e).display === 'none'; }")
    assert p.locator("#inspect-2").is_visible()
    before = session_count(app)
    p.click("#run")  # the focus outlasts a run, which shows every lane's inspector column again
    wait_saved(app, before)  # the old status is red too: wait for this run's save, then for the page
    wait_idle(p)
    assert not p.locator("#inspect-1").is_visible() and p.locator("#inspect-2").is_visible()
    choose(p, "focus", "all lanes")
    p.locator("#inspect-1").wait_for(state="visible")


def test_an_empty_draft_is_refused_never_replaced_by_the_target(page):
    p = page
    load_preset(p, PRESET)
    open_settings(p, 2)
    pick_decoder(p, 2, "speculative")
    draft = p.locator("#lane-2-draft input")
    draft.wait_for(state="visible")
    draft.fill("")
    draft.press("Tab")
    set_number(p, "#max-new-tokens input", "8")
    p.click("#run")
    wait_idle(p)
    assert "pick a draft model" in p.locator("#lane-2-output .lane-error").inner_text()
    assert "Lane 2 failed" in status_text(p)
    assert "acceptance" not in p.locator("#lane-2-stats").inner_text()


def test_lane_buttons_stop_at_the_limits_and_a_diffusion_page_gets_a_diffusion_lane(page):
    p = page
    load_preset(p, "Diffusion remasking")  # five lanes on the diffusion model
    assert p.locator("#add-lane").is_enabled()
    p.click("#add-lane")
    p.locator("#lane-6").wait_for(state="visible")
    p.wait_for_function("() => document.querySelector('#add-lane').disabled")
    assert "Lane 6 added" in status_text(p)
    decoder = p.locator("#lane-6-decoder input").input_value()
    assert "llada" in decoder or "diffusion" in decoder, decoder
    open_settings(p, 6)
    p.locator("#lane-6-knob-steps").wait_for(state="visible", timeout=30_000)
    for n in (5, 4, 3, 2):
        p.click("#remove-lane")
        p.wait_for_function(f"() => !document.querySelector('#lane-{n + 1}') ||"
                            f" document.querySelector('#lane-{n + 1}').offsetParent === null")
    p.wait_for_function("() => document.querySelector('#remove-lane').disabled")
    assert p.locator("#lane-2").is_visible() and p.locator("#add-lane").is_enabled()


def test_max_new_tokens_shows_the_budget_and_a_run_beyond_it_is_refused(page):
    p = page
    load_preset(p, PRESET)
    p.wait_for_function("() => /up to \\d+ \\(tiny-shakespeare: context 512/.test("
                        "document.querySelector('#max-new-tokens').innerText)", timeout=60_000)
    set_number(p, "#max-new-tokens input", "1024")
    p.wait_for_function("() => document.querySelector('#max-new-tokens').innerText.includes('over the budget')")
    p.click("#run")
    p.wait_for_function("() => document.querySelector('#status .pg-status-error')")
    assert "over the budget" in status_text(p)
    assert "Starting" not in p.locator("#lane-1-output").inner_text()
    assert p.locator("#run").is_enabled()


def test_share_before_any_run_says_there_is_nothing_to_share(page):
    p = page
    p.click("#share")
    p.get_by_text("nothing to share yet").first.wait_for(state="visible", timeout=30_000)
    assert p.locator("#share-link textarea, #share-link input").first.input_value() == ""


def test_watched_tokens_typed_in_the_page_are_drawn_and_stored(page, app):
    p = page
    load_preset(p, PRESET)
    box = p.locator("#watch textarea, #watch input").first
    box.fill("#7, #19")
    box.press("Tab")
    set_number(p, "#max-new-tokens input", "6")
    before = session_count(app)
    p.click("#run")
    wait_idle(p)
    wait_saved(app, before)
    s = newest_session(app)
    assert s["settings"]["watch"] == ["#7", " #19"]
    assert all([e["token"] for e in run["watch"]] == [7, 19] for run in s["runs"])
    # the greedy lane's inspector draws the watched tokens' plot
    p.wait_for_function("() => [...document.querySelectorAll('#inspect-1 .js-plotly-plot')]"
                        ".some((el) => el.innerText.includes('Watched tokens') || "
                        "[...el.querySelectorAll('text')].some((t) => t.textContent.includes('Watched tokens')))")
