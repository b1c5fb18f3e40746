"""Readable at 1440, 800 and 400 px (issue 36, item 7), in headless Chromium: with every preset
loaded, and after a run, no input, label or text box of the page clips its text (an input
whose value is wider than its box, an element with hidden overflow and more content than
room) and nothing sticks out of the page sideways. Plotly figures size themselves and are left
out; a textarea scrolls by design.
"""

from __future__ import annotations

import pytest

# app, browser: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import load_preset, open_page, wait_idle, wait_running  # noqa: I001
import playground.ui.rules as st

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTHS = (1440, 800, 400)

# Every visible element with text that is cut: [{id, tag, text, why}] (empty when all is readable).
CLIPPED_JS = """() => {
  const out = [];
  const vw = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > vw + 1)
    out.push({id: 'page', tag: 'HTML', text: '', why: `page ${document.documentElement.scrollWidth} px wide in ${vw}`});
  const hidden = (el) => el.closest('.sr-only, .visually-hidden, .hide, [aria-hidden="true"], .wrap.default, .toast-wrap, .js-plotly-plot');
  for (const el of document.querySelectorAll('.gradio-container *')) {
    if (el.tagName === 'TEXTAREA' || hidden(el)) continue;
    const cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden') continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    const input = el.tagName === 'INPUT';
    const txt = input ? (el.value || '') : (el.innerText || '').trim();
    if (!txt) continue;
    const why = [];
    if (el.scrollWidth > el.clientWidth + 1 && (input || ['hidden', 'clip'].includes(cs.overflowX))) why.push('cut sideways');
    if (!input && el.scrollHeight > el.clientHeight + 1 && ['hidden', 'clip'].includes(cs.overflowY)) why.push('cut below');
    if (r.right > vw + 1 || r.left < -1) why.push('outside the page');
    if (why.length) out.push({id: el.id || (el.closest('[id]') || {}).id || '', tag: el.tagName,
                              text: txt.slice(0, 40), why: why.join(', ')});
  }
  return out;
}"""


def test_every_preset_is_readable_at_every_width(browser, app):
    """One page, resized to each width after each preset is loaded: the same checks as a page
    opened at each width, with a third of the preset loads (each costs a round trip and a
    re-render; the three widths were three tests of ~100 s each)."""
    ctx = browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
    p = ctx.new_page()
    p.set_default_timeout(60_000)

    def check(what: str) -> None:
        for width in WIDTHS:
            p.set_viewport_size({"width": width, "height": 900})
            # the resize's layout, then a frame, before measuring
            p.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            assert p.evaluate(CLIPPED_JS) == [], f"{what} at {width} px"

    try:
        open_page(p, app.url)
        check("the page as it opens")
        for title, _name in st.preset_choices():
            load_preset(p, title)
            check(f"preset {title!r}")
    finally:
        ctx.close()


def test_a_finished_run_is_readable_at_400_px(browser, app):
    """The narrowest width with a run's lanes, stats, legends and the strip's first-divergence
    table filled in."""
    ctx = browser.new_context(viewport={"width": 400, "height": 900})
    p = ctx.new_page()
    p.set_default_timeout(90_000)
    try:
        open_page(p, app.url)
        load_preset(p, "Speculative showdown")
        p.click("#run")
        wait_running(p)
        wait_idle(p)
        assert "Done" in p.locator("#status").inner_text()
        p.wait_for_function("() => document.querySelector('#divergence').innerText.trim().length > 0")
        assert p.evaluate(CLIPPED_JS) == []
    finally:
        ctx.close()
