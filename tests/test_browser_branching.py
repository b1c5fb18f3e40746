"""Counterfactual branching in a real browser (headless Chromium driven by Playwright).

Run a comparison, click a token of lane 1, pick another token from the branch panel's top-K,
press Branch: the page shows the branch — the parent's lane beside the branched one, parting
at the clicked position, with the divergence figure drawn — and the branch is a stored
session with its parent link, shareable like any other.
"""

from __future__ import annotations

import pytest

# app, browser, page: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import choose, load_preset, token_count, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PRESET = "Greedy vs beam search vs sampling"  # lane 1 is greedy on the bundled target
MAX_NEW = 10
AT = 3  # the output position (greedy: the step) whose token is replaced


def lane_ids(p, k: int) -> list[str]:
    """The token texts lane ``k`` shows, in order."""
    return p.locator(f"#lane-{k}-output .tok").all_inner_texts()


def test_click_a_token_pick_another_branch_and_see_the_branch_beside_its_parent(page, app):
    p = page
    load_preset(p, PRESET)
    box = p.locator("#max-new-tokens input").first
    box.fill(str(MAX_NEW))
    box.press("Enter")
    p.click("#run")
    wait_idle(p)
    parent_text = lane_ids(p, 1)
    assert len(parent_text) == MAX_NEW
    p.wait_for_selector("#divergence-plot .main-svg")  # the divergence figure, drawn when the run ended

    # click lane 1's token: the panel opens on its lane and step with the step's top-K
    p.locator("#lane-1-output .tok").nth(AT).click()
    p.wait_for_function("() => { const w = document.querySelector('#branch-where .branch-where');"
                        f" return w && w.dataset.lane === '0' && w.dataset.step === '{AT}'; }}")
    choose(p, "branch-token", "p=")
    p.click("#branch-run")
    p.wait_for_function("() => document.querySelector('#branch-status').innerText.includes('Branch:')"
                        " || !!document.querySelector('#branch-status .pg-status-error')", timeout=180_000)
    status = p.locator("#branch-status").inner_text()
    assert "Branch:" in status and f"position {AT}" in status, status

    # the page shows the branch: lane 1 the parent's lane as it ran, lane 2 the branched one
    p.wait_for_function("() => document.querySelector('#divergence').innerText.includes('first diverge at position')")
    assert lane_ids(p, 1) == parent_text
    branched = lane_ids(p, 2)
    assert branched[:AT] == parent_text[:AT] and branched[AT] != parent_text[AT]
    assert token_count(p, 1) == MAX_NEW and not p.locator("#lane-3").is_visible()
    assert f"first diverge at position {AT}" in p.locator("#divergence").inner_text()
    p.wait_for_selector("#divergence-plot .main-svg")
    p.locator("#branch-parent").wait_for(state="visible")
    assert p.locator("#branch-run").is_enabled()

    # a stored session with its parent link, shared like any other
    from playground.store import Store

    with Store(app.db) as store:
        newest = store.load_session(store.list_sessions()[0]["id"])
    assert newest["parent"] and newest["branch"]["position"] == AT and newest["branch"]["lane"] == 0
    p.click("#share")
    p.wait_for_function("() => document.querySelector('#share-link textarea, #share-link input').value"
                        f".includes('session={newest['id']}')")


def test_click_a_token_explain_it_and_see_the_heatmap_over_its_context(page, app):
    p = page
    load_preset(p, PRESET)
    box = p.locator("#max-new-tokens input").first
    box.fill("6")
    box.press("Enter")
    p.click("#run")
    wait_idle(p)
    p.locator("#lane-1-output .tok").nth(AT).click()
    p.locator("#explain-panel").get_by_text("Explain: which earlier tokens").click()
    p.wait_for_function("() => { const w = document.querySelector('#explain-where .branch-where');"
                        f" return w && w.dataset.lane === '0' && w.dataset.step === '{AT}'; }}")
    p.locator("#explain-method").get_by_text("gradient × input").click()
    p.click("#explain-run")
    p.wait_for_function("() => document.querySelector('#explain-status').innerText.includes('stored')"
                        " || !!document.querySelector('#explain-status .pg-status-error')", timeout=180_000)
    status = p.locator("#explain-status").inner_text()
    assert "stored with the session" in status, status
    # one shaded span per context token: the prompt's and the AT tokens generated before the step
    spans = p.locator("#explain-result .attr-tok").count()
    prompt_tokens = p.evaluate("() => document.querySelectorAll('#explain-result .attr-split').length")
    assert prompt_tokens == 1 and spans > AT
    assert "gradient × input" in p.locator("#explain-result .attr-head").inner_text()
