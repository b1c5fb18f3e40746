"""In headless Chromium: the share link of a branch opens that branch beside its parent, on an
instance that loads no model, with the point of divergence marked; the Sessions tab lists the
branch under its parent. Run: ``python -m pytest -m browser tests/test_browser_sessions.py``."""

from __future__ import annotations

import pytest

from browser_helpers import VIEW, App, check_prerequisites, open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MAX_NEW = 16


@pytest.fixture(scope="module")
def replay_app(tmp_path_factory):
    """A replay-only instance (PLAYGROUND_NO_MODELS=1) on a database holding a comparison of the
    bundled model and a one-lane branch of it (built here, in the test process)."""
    from playground.branching import branch_session, token_choices
    from playground.engine import prepare
    from playground.store import Store

    check_prerequisites()
    tmp = tmp_path_factory.mktemp("branches")
    db = str(tmp / "sessions.db")
    traces = [prepare(model="tiny-shakespeare", decoder=d, prompt="ROMEO:", max_new_tokens=MAX_NEW, seed=0,
                      params={"k": 20} if d == "top_k" else {}).finish().to_dict() for d in ("top_k", "greedy")]
    with Store(db) as store:
        root = store.save_session("branch check", "tiny-shakespeare", "ROMEO:", {"max_new_tokens": MAX_NEW}, traces)
        token = token_choices(traces[1], 4)[0][1]
        bid = branch_session(store, root, 1, token, step=4)
        branch = store.load_session(bid)
    app = App(db, tmp / "app.log", OMP_NUM_THREADS="1", PLAYGROUND_NO_MODELS="1")
    try:
        app.wait()
        yield {"app": app, "root": root, "branch": branch}
    finally:
        app.stop()


def test_a_shared_branch_opens_beside_its_parent_with_the_divergence_marked(browser, replay_app):
    app, b = replay_app["app"], replay_app["branch"]
    pos, forced = b["branch"]["position"], b["branch"]["text"]
    ctx = browser.new_context(viewport=VIEW)
    q = ctx.new_page()
    q.set_default_timeout(60_000)
    try:
        open_page(q, f"{app.url}/?session={b['id']}")
        q.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
        status = q.locator("#status").inner_text()
        assert "branch of “branch check”, lane 2, step 4" in status
        assert "parent" in q.locator("#lane-1-stats").inner_text()
        assert f"forced '{forced}' at step 4" in q.locator("#lane-2-stats").inner_text()
        # the divergence strip marks where the branch leaves its parent
        assert f"first diverge at position {pos}" in q.locator("#divergence").inner_text()
        tokens = [q.locator(f"#lane-{k}-output .tok").evaluate_all("es => es.map(e => e.textContent)")
                  for k in (1, 2)]
        assert tokens[0][:pos] == tokens[1][:pos] and tokens[0][pos] != tokens[1][pos] == forced
        # the inspector opens on the forced step, and its plots follow the text
        assert q.locator("#step input[type=number]").first.input_value() == "4"
        for k in (1, 2):
            q.wait_for_selector(f"#inspect-{k}-step-0 .main-svg")
            q.wait_for_selector(f"#inspect-{k}-run-0 .main-svg")
        assert "step 4" in q.locator("#inspect-2-header").inner_text()
        # the Sessions tab lists the branch under its parent; Share gives the branch's own link
        q.get_by_role("tab", name="Sessions").click()
        q.wait_for_function("() => document.querySelector('#sessions-status').innerText.includes('stored session')")
        table = q.locator("#sessions-table").inner_text()
        assert table.index("branch check") < table.index("↳ ") < table.index("branch of “branch check”, lane 2, step 4")
    finally:
        ctx.close()


def test_a_share_link_is_readable_before_the_app_has_loaded_and_gives_way_to_it(browser, replay_app):
    """The first HTML holds the reading (playground/ui/quick_read.py): with the app's scripts
    held back it is all a reader sees, every lane's tokens as the replayed page shows them; with
    them, the replay takes its place and the reading is gone."""
    app, b = replay_app["app"], replay_app["branch"]
    url = f"{app.url}/?session={b['id']}"
    ctx = browser.new_context(viewport=VIEW)
    try:
        r = ctx.new_page()
        r.set_default_timeout(60_000)
        open_page(r, url)
        r.wait_for_function("() => document.querySelector('#status').innerText.includes('Replaying')")
        r.wait_for_function("() => !document.querySelector('#pg-quick-read')")
        shown = [r.locator(f"#lane-{k}-output .tok").evaluate_all("es => es.map(e => e.textContent)") for k in (1, 2)]
        assert all(shown)

        q = ctx.new_page()
        q.route("**/*.js", lambda route: route.abort())  # Gradio's frontend never starts
        q.goto(url)
        box = q.locator("#pg-quick-read")
        assert box.is_visible()
        for k in (0, 1):
            lane = box.locator(f'section.qr-lane[data-lane="{k}"]')
            assert lane.locator(".tok").evaluate_all("es => es.map(e => e.textContent)") == shown[k]
            assert b["runs"][k]["decoder"] in lane.locator("h2").inner_text()
        assert "branch check" in box.locator("h1").inner_text()
        q.click("#pg-quick-read button")  # the reader may put it away
        assert q.locator("#pg-quick-read").count() == 0
    finally:
        ctx.close()
