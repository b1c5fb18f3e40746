"""A hand on the canvas in a real browser (headless Chromium driven by Playwright).

Run a diffusion lane, pause it at a step with the scrubber, pick a masked position and a token
from its top-K in the branch panel, press Continue: the page shows the branch beside the parent's
lane, the chosen position committed at that step with the chosen token, and the branch is a
stored session with its parent link and the hand in its record. Clicking masked cells of the
lane's canvas view ticks their positions in the panel (marked, the scrubber stays), a second
click unticks, and Continue commits exactly the clicked positions at that step.
"""

from __future__ import annotations

import re

import pytest

# app, browser, page: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import load_preset, wait_idle
from playground.bench._browser import keep_lanes
from playground.store import Store

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


def _ticked(p) -> list[int]:
    return p.evaluate("() => Array.from(document.querySelectorAll('#branch-canvas-positions input:checked'))"
                      ".map((i) => parseInt(i.name, 10)).sort((a, b) => a - b)")


def _wait_ticked(p, want: list[int]) -> None:
    p.wait_for_function("(want) => JSON.stringify(Array.from(document.querySelectorAll("
                        "'#branch-canvas-positions input:checked')).map((i) => parseInt(i.name, 10))"
                        ".sort((a, b) => a - b)) === JSON.stringify(want)", arg=want, timeout=20_000)


def test_click_masked_cells_of_the_paused_canvas_then_continue_commits_exactly_those(page, app):
    p = page
    load_preset(p, PRESET)
    keep_lanes(p, 2)
    box = p.locator("#max-new-tokens input").first
    box.fill(str(MAX_NEW))
    box.press("Enter")
    p.click("#run")
    wait_idle(p)

    # scrub to step AT with the panel folded: a click on a cell opens it, paused there
    box = p.locator("#step input[type=number]")
    box.fill(str(AT))
    box.press("Enter")
    view = p.locator("#inspect-1-step-html .canvas-view")
    view.wait_for(state="visible")
    p.wait_for_function(f"() => document.querySelector('#inspect-1-step-html .canvas-head')"
                        f".innerText.startsWith('step {AT} ')")
    masks = view.locator(".tok.mask")
    assert masks.count() == MAX_NEW - AT - 1  # one commit per step, step AT's included
    # two masked cells the lane's own plan did not commit at AT
    first = int(masks.nth(masks.count() - 1).get_attribute("data-pos"))
    second = int(masks.nth(1).get_attribute("data-pos"))
    assert _ticked(p) == []

    view.locator(f'.tok.mask[data-pos="{first}"]').click()
    p.wait_for_selector(f'#branch-where .branch-canvas-where[data-lane="0"][data-step="{AT}"]')
    _wait_ticked(p, [first])
    assert p.locator("#branch-canvas").is_visible()  # the click opened the panel
    view.locator(f'.tok.mask[data-pos="{second}"]').click()
    _wait_ticked(p, sorted([first, second]))
    # the last clicked is picked for its token (the top-1 chosen); both cells are marked
    p.wait_for_function("(pos) => document.querySelector('#branch-canvas-at input').value"
                        ".startsWith('position ' + pos + ':')", arg=second)
    p.wait_for_function("() => document.querySelectorAll('#inspect-1-step-html .tok.hand-pick').length === 2")
    marked = sorted(int(x) for x in p.eval_on_selector_all(
        "#inspect-1-step-html .tok.hand-pick", "(els) => els.map((e) => e.dataset.pos)"))
    assert marked == sorted([first, second])
    # a click on a chosen cell unticks it, another ticks it again; the scrubber never moved
    view.locator(f'.tok.mask[data-pos="{first}"]').click()
    _wait_ticked(p, [second])
    p.wait_for_function("() => document.querySelectorAll('#inspect-1-step-html .tok.hand-pick').length === 1")
    view.locator(f'.tok.mask[data-pos="{first}"]').click()
    _wait_ticked(p, sorted([first, second]))
    assert p.locator("#step input[type=number]").input_value() == str(AT)

    p.click("#branch-continue")
    p.wait_for_function("() => document.querySelector('#branch-status').innerText.includes('Branch:')"
                        " || !!document.querySelector('#branch-status .pg-status-error')", timeout=180_000)
    status = p.locator("#branch-status").inner_text()
    assert "Branch:" in status and f"your commits at step {AT}" in status, status

    with Store(app.db) as store:
        newest = store.load_session(store.list_sessions()[0]["id"])
    parent, lane = newest["runs"]
    want = sorted([first, second])
    assert newest["parent"] and newest["branch"]["step"] == AT
    # each clicked position at the model's top-1 there, nothing else, at exactly step AT
    top1 = [parent["steps"][AT]["top_ids"][q][0] for q in want]
    assert newest["branch"]["hand"] == [[q, t] for q, t in zip(want, top1)]
    assert lane["steps"][AT]["hand"]["positions"] == want and lane["steps"][AT]["hand"]["ids"] == top1
    assert sorted(lane["steps"][AT]["unmasked"]) == want
    assert all("hand" not in s for k, s in enumerate(lane["steps"]) if k != AT)
    assert [lane["steps"][-1]["canvas"][q] for q in want] == top1
