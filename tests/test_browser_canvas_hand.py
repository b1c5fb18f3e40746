"""A hand on the canvas in a real browser (headless Chromium driven by Playwright).

Run a diffusion lane, pause it at a step with the scrubber, pick a masked position and a token
from its top-K in the branch panel, press Continue: the page shows the branch beside the parent's
lane, the chosen position committed at that step with the chosen token, and the branch is a
stored session with its parent link and the hand in its record.
"""

from __future__ import annotations

import re

import pytest

# app, browser, page: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import load_preset, wait_idle
from playground.bench._browser import keep_lanes

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PRESET = "Diffusion remasking"  # lane 1: llada, 16 steps, on the bundled diffusion model
MAX_NEW = 16  # one commit per step
AT = 3  # the step the lane pauses at


def test_pause_a_diffusion_lane_pick_a_position_and_a_token_continue_and_see_the_branch(page, app):
    p = page
    load_preset(p, PRESET)
    keep_lanes(p, 2)  # the page keeps at least two
    box = p.locator("#max-new-tokens input").first
    box.fill(str(MAX_NEW))
    box.press("Enter")
    p.click("#run")
    wait_idle(p)
    assert p.locator("#lane-1-output .tok").count() > AT

    # pause at step AT: the panel lists the positions still masked there
    p.locator("#branch-panel").get_by_text("Branch: what if").click()
    box = p.locator("#step input[type=number]")
    box.fill(str(AT))
    box.press("Enter")
    p.wait_for_selector(f'#branch-where .branch-canvas-where[data-lane="0"][data-step="{AT}"]')
    p.locator("#branch-canvas").wait_for(state="visible")
    assert not p.locator("#branch-run").is_visible()
    labels = p.locator("#branch-canvas-positions label").all_inner_texts()
    assert len(labels) == MAX_NEW - AT, labels  # one commit per step: AT positions already filled
    pos = int(re.match(r"\s*position (\d+):", labels[0]).group(1))

    # pick that position's second most probable token
    p.click("#branch-canvas-at input")
    p.locator("[role=option]", has_text=f"position {pos}:").first.click()
    p.wait_for_function("() => document.querySelector('#branch-canvas-token input').value.includes('p=')")
    p.click("#branch-canvas-token input")
    options = p.locator("[role=option]")
    options.nth(1).wait_for(state="visible")
    options.nth(1).click()
    p.click("#branch-continue")
    p.wait_for_function("() => document.querySelector('#branch-status').innerText.includes('Branch:')"
                        " || !!document.querySelector('#branch-status .pg-status-error')", timeout=180_000)
    status = p.locator("#branch-status").inner_text()
    assert "Branch:" in status and f"your commits at step {AT}" in status and f"position {pos}" in status, status

    # the page shows the parent's lane and the branch; the branch committed the position at step AT
    p.locator("#lane-2").wait_for(state="visible")
    p.wait_for_function(f"() => document.querySelectorAll('#lane-2-output .tok').length > {pos}")
    assert p.locator("#lane-2-output .tok").nth(pos).get_attribute("data-step") == str(AT)
    p.locator("#branch-parent").wait_for(state="visible")

    from playground.store import Store

    with Store(app.db) as store:
        newest = store.load_session(store.list_sessions()[0]["id"])
    parent, lane = newest["runs"]
    [[hpos, tok]] = newest["branch"]["hand"]
    assert newest["parent"] and hpos == pos and newest["branch"]["step"] == AT
    assert tok == parent["steps"][AT]["top_ids"][pos][1]
    assert lane["steps"][AT]["hand"] == {**lane["steps"][AT]["hand"], "positions": [pos], "ids": [tok]}
    assert lane["steps"][-1]["canvas"][pos] == tok
    shown = p.locator("#lane-2-output .tok").nth(pos).inner_text()
    assert shown.strip() == lane["tokens"][str(tok)].strip() or shown.strip() in lane["tokens"][str(tok)], shown
