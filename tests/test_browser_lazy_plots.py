"""In headless Chromium: a replayed session's plots are drawn when they come into view
(playground/ui/lazy_plots.js). A plot below the fold holds its figure undrawn, and so does
every other plot out of view, until it is scrolled to; once the page has been quiet, the plots
still waiting are drawn too. Run: ``python -m pytest -m browser tests/test_browser_lazy_plots.py``."""

from __future__ import annotations

import pytest

from browser_helpers import VIEW, App, check_prerequisites, open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Whether the plot `#id` holds a drawn figure, and whether its figure is waiting to be drawn.
STATE_JS = """(id) => { const box = document.querySelector('#' + id);
  const held = [...window.__pgLazyPlots.held.keys()].some(gd => box.contains(gd));
  const r = box.getBoundingClientRect();
  return {drawn: !!box.querySelector('.main-svg'), held, in_view: r.bottom > 0 && r.top < innerHeight}; }"""

# Once every plot in `ids` has been handed its figure, in that same task (the page's own idle
# drawing cannot come in between): the state of each, then scroll the last one into view and
# resolve, once it is drawn, with those states and how many plots still wait at that moment.
SCROLL_JS = """(ids) => new Promise((resolve) => {
  const state = %s;
  const given = () => window.__pgLazyPlots && ids.every(id => {
    const s = state(id); return s.held || s.drawn; });
  let states = null;
  const box = document.querySelector('#' + ids[ids.length - 1]);
  const tick = () => {
    if (states === null) {
      if (given()) { states = ids.map(state); box.scrollIntoView({block: 'center'}); }
      setTimeout(tick, 10);
    } else if (box.querySelector('.main-svg')) resolve({states, waiting: window.__pgLazyPlots.held.size});
    else setTimeout(tick, 10);
  };
  tick();
})""" % STATE_JS

PLOTS = ["progress-plot", "inspect-1-step-0", "inspect-1-run-0", "inspect-2-step-0", "inspect-2-run-0"]


@pytest.fixture(scope="module")
def replay_app(tmp_path_factory):
    """A replay-only instance on a database holding a two-lane comparison of the bundled model."""
    from playground.engine import prepare
    from playground.store import Store

    check_prerequisites()
    tmp = tmp_path_factory.mktemp("lazy")
    db = str(tmp / "sessions.db")
    traces = [prepare(model="tiny-shakespeare", decoder=d, prompt="ROMEO:", max_new_tokens=12, seed=0,
                      params={"k": 20} if d == "top_k" else {}).finish().to_dict() for d in ("top_k", "greedy")]
    with Store(db) as store:
        sid = store.save_session("lazy check", "tiny-shakespeare", "ROMEO:", {"max_new_tokens": 12}, traces)
    app = App(db, tmp / "app.log", OMP_NUM_THREADS="1", PLAYGROUND_NO_MODELS="1")
    try:
        app.wait()
        yield {"app": app, "sid": sid}
    finally:
        app.stop()


def test_plots_out_of_view_are_drawn_when_scrolled_to_and_the_rest_once_the_page_is_quiet(browser, replay_app):
    ctx = browser.new_context(viewport=VIEW)
    q = ctx.new_page()
    q.set_default_timeout(60_000)
    try:
        open_page(q, f"{replay_app['app'].url}/?session={replay_app['sid']}")
        q.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
        # each plot out of view holds its figure undrawn; the lowest one, scrolled to, is drawn,
        # and plots left out of view still wait
        seen = q.evaluate(SCROLL_JS, PLOTS)
        for plot, state in zip(PLOTS, seen["states"]):
            assert state == {"drawn": False, "held": True, "in_view": False}, plot
        assert seen["waiting"] > 0
        assert q.locator("#lane-2-output .tok").count() > 0  # the text was on screen all along
        assert q.evaluate(STATE_JS, "inspect-2-run-0") == {"drawn": True, "held": False, "in_view": True}
        # left alone, the page draws the rest
        q.wait_for_function("(ids) => ids.every(id => document.querySelector('#' + id + ' .main-svg'))", arg=PLOTS)
        q.wait_for_function("() => window.__pgLazyPlots.held.size === 0")
        # a drawn plot out of view is redrawn at once when the scrubber moves
        before = q.locator("#inspect-1-step-0 .main-svg").first.inner_html()
        q.evaluate("() => window.scrollTo(0, 0)")
        box = q.locator("#step input[type=number]").first
        box.fill("2")
        box.press("Enter")
        q.wait_for_function("(b) => { const s = document.querySelector('#inspect-1-step-0 .main-svg');"
                            " return s && s.innerHTML !== b; }", arg=before)
        assert "step 2" in q.locator("#inspect-1-header").inner_text()
    finally:
        ctx.close()
