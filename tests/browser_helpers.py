"""Helpers of the browser tests: start the app in a subprocess, open Chromium, read the page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playground.bench._browser import CHROMIUM, CHROMIUM_ARGS, App, free_port  # noqa: F401 - one app launcher

ROOT = Path(__file__).resolve().parent.parent


def launch_browser(pw: Any) -> Any:
    """Headless Debian Chromium (the Playwright browser download does not work offline)."""
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


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
    """Wait until the comparison has finished or stopped (the status says so, Run is enabled);
    an error in the status line fails at once, with that line as the message."""
    try:
        page.wait_for_function(
            "() => { const s = document.querySelector('#status'); const b = document.querySelector('#run');"
            " if (!s || !b) return false;"
            " if (s.querySelector('.pg-status-error')) return true;"
            " return !b.disabled && /^(Done|Stopped)/.test(s.innerText.trim()); }",
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


def status_text(page: Any) -> str:
    """The status line under the Run button."""
    try:
        return page.locator("#status").inner_text(timeout=30_000).strip()
    except Exception:  # noqa: BLE001
        return "<unreadable>"


def wait_running(page: Any, timeout_ms: int = 60_000) -> None:
    """Wait until the Run button has been pressed and the lanes are decoding."""
    page.wait_for_function(
        "() => { const s = document.querySelector('#status'); return s && /^Running/.test(s.innerText.trim()); }",
        timeout=timeout_ms)
