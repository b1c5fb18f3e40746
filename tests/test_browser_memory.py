"""One tab, many runs (issue 36): the page lets go of what each run drew. Measured through
Chromium's DevTools protocol after a forced garbage collection: DOM nodes (detached ones
included), event listeners and the JS heap. Before the fix each run kept its replaced figure
alive through plotly's window resize handler: +310 nodes, +67 listeners, +0.27 MB a run.
"""

from __future__ import annotations

import pytest

# app, browser: the shared fixtures of browser_helpers (a plugin of conftest.py)
from browser_helpers import load_preset, open_page, wait_idle
from playground.bench._browser import press_run, set_number

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUNS = 12


# Every figure the page holds back (lazy_plots.js) has been drawn, then the main thread has had
# an idle moment: a plot already on the page is redrawn by Gradio right after its new figure
# came, before any idle time.
DRAWN_JS = """() => new Promise((resolve) => {
  const tick = () => (window.__pgLazyPlots && window.__pgLazyPlots.held.size === 0)
    ? requestIdleCallback(() => resolve(true), {timeout: 3000}) : setTimeout(tick, 20);
  tick();
})"""


def plots_drawn(p) -> None:
    """Wait until the run's plots are drawn (see ``DRAWN_JS``)."""
    assert p.evaluate(DRAWN_JS)


def test_the_page_does_not_grow_run_after_run(browser, app):
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    p = ctx.new_page()
    p.set_default_timeout(120_000)
    cdp = ctx.new_cdp_session(p)
    cdp.send("Performance.enable")

    def measure() -> dict[str, float]:
        cdp.send("HeapProfiler.collectGarbage")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        return {"nodes": metrics["Nodes"], "listeners": metrics["JSEventListeners"],
                "heap_mb": cdp.send("Runtime.getHeapUsage")["usedSize"] / 1e6}

    try:
        open_page(p, app.url)
        load_preset(p, "Greedy vs beam search vs sampling")
        set_number(p, "max-new-tokens", 24)
        seen = []
        for k in range(RUNS):
            press_run(p)  # a 24-token run can end before "Running" is ever polled
            wait_idle(p)  # the plots' figures have come (the event chained after Done)
            plots_drawn(p)
            if k in (1, RUNS - 1):
                # what the run's last messages and timers still hold is let go before measuring
                p.wait_for_timeout(1500)
                seen.append(measure())
        first, last = seen
        runs = RUNS - 2
        assert last["nodes"] - first["nodes"] < 50 * runs, (first, last)
        assert last["listeners"] - first["listeners"] < 5 * runs, (first, last)
        assert last["heap_mb"] - first["heap_mb"] < 0.1 * runs, (first, last)
    finally:
        ctx.close()
