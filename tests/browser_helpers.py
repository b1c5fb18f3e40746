"""Helpers and fixtures of the browser tests: start the app in a subprocess, open Chromium,
read the page.

The fixtures ``browser``, ``app`` and ``page`` serve every browser test module (this module is
a plugin of ``conftest.py``). The handler tests define a ``page`` of their own (the Compare
page object), which wins in their modules.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from playground.bench._browser import (CHROMIUM, CHROMIUM_ARGS, IDLE_JS, VIEW, App,  # noqa: F401 - one app launcher
                                       choose, free_port, load_preset, open_page, status_text, wait_running)

ROOT = Path(__file__).resolve().parent.parent


def launch_browser(pw: Any) -> Any:
    """Headless Debian Chromium (the Playwright browser download does not work offline)."""
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def check_prerequisites() -> None:
    """CI installs Chromium and ships the bundled models: their absence fails, never skips."""
    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM} (set PLAYGROUND_CHROMIUM)"
    assert (ROOT / "assets" / "models" / "tiny-shakespeare" / "config.json").exists(), \
        "the bundled tiny-shakespeare model is missing"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for one test module (each test opens its own context, so no cookies or
    storage pass between tests). Per module, not per session: while Playwright's sync API is
    open it keeps an asyncio loop running in the main thread, and every later test that calls
    ``asyncio.run`` failed ("cannot be called from a running event loop"); a launch takes about
    a second, the app (session-wide) is what costs."""
    import playwright.sync_api as playwright_api

    with playwright_api.sync_playwright() as pw:
        b = launch_browser(pw)
        yield b
        b.close()


@pytest.fixture(scope="session")
def app(tmp_path_factory: Any) -> Iterator[App]:
    """The app on a free 127.0.0.1 port with a database of its own (``app.db``), one torch
    thread (on a busy shared CPU, more threads spin against each other).

    Started once for every browser test module: a start imports torch, transformers and gradio
    in a fresh interpreter (10-20 s on a busy 2-core machine). Tests that read the database
    read what they stored themselves (the newest session, or a count taken before their run),
    never that it is empty."""
    check_prerequisites()
    tmp = tmp_path_factory.mktemp("browser")
    a = App(str(tmp / "sessions.db"), tmp / "app.log", OMP_NUM_THREADS="1")
    try:
        a.wait()
        yield a
    finally:
        a.stop()


@pytest.fixture()
def page(browser: Any, app: App, request: Any) -> Iterator[Any]:
    """A fresh browser context on the app's page, loaded (its load event filled the lanes in).

    The page's console and the app's log written during the test are attached to a failure's
    report (a browser test that fails in CI is otherwise a bare timeout)."""
    ctx = browser.new_context(viewport=VIEW)
    p = ctx.new_page()
    console: list[str] = []
    p.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    p.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    log_start = Path(app.log.name).stat().st_size
    request.node.browser_evidence = lambda: _evidence(console, app.log.name, log_start)
    p.set_default_timeout(60_000)
    open_page(p, app.url)
    yield p
    ctx.close()


def _evidence(console: list[str], log_path: str, log_start: int, limit: int = 6_000) -> list[tuple[str, str]]:
    """Report sections: the page's console and what the app logged since the test began."""
    with open(log_path, errors="replace") as f:
        f.seek(log_start)
        log = f.read()
    return [("browser console", "\n".join(console)[-limit:] or "(nothing)"), ("app log", log[-limit:] or "(nothing)")]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """Attach :func:`_evidence` to a browser test's failed call."""
    rep = yield
    evidence = getattr(item, "browser_evidence", None)
    if rep.when == "call" and rep.failed and evidence is not None:
        for title, text in evidence():
            rep.sections.append((title, text))
    return rep


def lane_text(page: Any, k: int) -> str:
    """The visible text of lane k's output."""
    return page.locator(f"#lane-{k}-output .tok-output").inner_text()


def token_count(page: Any, k: int) -> int:
    """How many token spans lane k shows."""
    return page.locator(f"#lane-{k}-output .tok").count()


def step_value(page: Any) -> int:
    """The step scrubber's value."""
    return int(float(page.locator("#step input[type=number]").input_value()))


def wait_idle(page: Any, timeout_ms: int = 180_000) -> None:
    """Wait until the comparison has finished or stopped (the status says so, Run is enabled)
    and its plots are drawn (no inspector header still says they follow); an error in the
    status line fails at once, with that line as the message."""
    try:
        # the bench's idle test (Run enabled, the app's status line done or red), plus no plot pending
        page.wait_for_function(f"() => ({IDLE_JS})() && !document.querySelector('#inspector .insp-pending')",
                               timeout=timeout_ms)
    except Exception as e:  # noqa: BLE001 - say what the page showed
        try:
            extra = page.evaluate("() => ({run_disabled: document.querySelector('#run').disabled,"
                                  " stop_disabled: document.querySelector('#stop').disabled,"
                                  " lane1: (document.querySelector('#lane-1-stats') || {}).innerText})")
        except Exception:  # noqa: BLE001
            extra = {}
        raise AssertionError(f"the run did not finish: status {status_text(page)!r}, {extra}") from e
    text = status_text(page)
    assert re.match(r"^(Done|Stopped)", text), f"the run failed: {text!r}"
