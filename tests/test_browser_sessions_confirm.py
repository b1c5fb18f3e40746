"""In headless Chromium: the Sessions tab's Delete asks before it deletes (the first press turns
the button into "Confirm delete" and says what would go; selecting another row takes that back;
the second press deletes), and Rename puts the new title on the "selected:" line. No browser
dialog is involved, so nothing here depends on how a headless browser answers confirm().
Run: ``python -m pytest -m browser tests/test_browser_sessions_confirm.py``."""

from __future__ import annotations

import pytest

from browser_helpers import VIEW, App, check_prerequisites, open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def sessions_app(tmp_path_factory):
    """A replay-only instance on a database holding two sessions (saved here, in the test process)."""
    from playground.engine import prepare
    from playground.store import Store

    check_prerequisites()
    tmp = tmp_path_factory.mktemp("confirm")
    db = str(tmp / "sessions.db")
    trace = prepare(model="tiny-shakespeare", decoder="greedy", prompt="ROMEO:", max_new_tokens=6, seed=0).finish().to_dict()
    with Store(db) as store:
        keep = store.save_session("keep this one", "tiny-shakespeare", "ROMEO:", {}, [trace])
        doomed = store.save_session("delete this one", "tiny-shakespeare", "ROMEO:", {}, [trace])
    app = App(db, tmp / "app.log", OMP_NUM_THREADS="1", PLAYGROUND_NO_MODELS="1")
    try:
        app.wait()
        yield {"app": app, "db": db, "keep": keep, "doomed": doomed}
    finally:
        app.stop()


def stored_titles(db: str) -> set[str]:
    from playground.store import Store

    with Store(db) as store:
        return {s["title"] for s in store.list_sessions()}


def test_delete_asks_first_and_rename_updates_the_selected_line(browser, sessions_app):
    app, db = sessions_app["app"], sessions_app["db"]
    ctx = browser.new_context(viewport=VIEW)
    q = ctx.new_page()
    q.set_default_timeout(60_000)
    try:
        open_page(q, app.url)
        q.get_by_role("tab", name="Sessions").click()
        q.wait_for_function("() => document.querySelector('#sessions-status').innerText.includes('2 stored sessions')")
        table = q.locator("#sessions-table")
        delete = q.locator("#session-delete")

        def select(title: str) -> None:
            cell = q.locator("#sessions-table [role=gridcell]", has_text=title).first
            cell.wait_for()
            cell.click()
            q.wait_for_function(f"() => document.querySelector('#session-selected').innerText.includes({title!r})")

        # the first press asks and deletes nothing
        select("delete this one")
        delete.click()
        q.wait_for_function("() => document.querySelector('#sessions-status').innerText.includes('Press Confirm delete')")
        assert "Delete “delete this one”?" in q.locator("#sessions-status").inner_text()
        assert delete.inner_text().strip() == "Confirm delete"
        assert stored_titles(db) == {"keep this one", "delete this one"}
        # selecting another row takes the question back: the button says Delete again
        select("keep this one")
        q.wait_for_function("() => document.querySelector('#session-delete').innerText.trim() === 'Delete'")
        # ...so one press on the other row asks about that row, and still deletes nothing
        select("delete this one")
        delete.click()
        q.wait_for_function("() => document.querySelector('#session-delete').innerText.trim() === 'Confirm delete'")
        assert stored_titles(db) == {"keep this one", "delete this one"}
        # the second press deletes
        delete.click()
        q.wait_for_function("() => document.querySelector('#sessions-status').innerText.includes('Deleted.')")
        assert stored_titles(db) == {"keep this one"}
        assert "delete this one" not in table.inner_text()
        assert delete.inner_text().strip() == "Delete"
        assert "no session selected" in q.locator("#session-selected").inner_text()

        # Rename: the "selected:" line follows the new title
        select("keep this one")
        box = q.locator("#session-title textarea, #session-title input").first
        box.fill("Spéculatif, renamed")
        q.locator("#session-rename").click()
        q.wait_for_function("() => document.querySelector('#sessions-status').innerText.includes('Renamed.')")
        q.wait_for_function("() => document.querySelector('#session-selected').innerText.includes('Spéculatif, renamed')")
        assert "keep this one" not in q.locator("#session-selected").inner_text()
        assert stored_titles(db) == {"Spéculatif, renamed"}
    finally:
        ctx.close()
