"""Helpers of the browser tests: start the app in a subprocess, open Chromium, read the page."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("PLAYGROUND_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """The app running in a subprocess on 127.0.0.1 (``python app.py``)."""

    def __init__(self, db: str, log_path: str | Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, "PORT": str(self.port), "GRADIO_SERVER_NAME": "127.0.0.1",
                "PLAYGROUND_DB": db, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **env}
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=str(ROOT), env=full,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 240.0) -> "App":
        """Block until the page answers (importing torch and transformers takes a while)."""
        deadline = time.time() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with opener.open(self.url + "/", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"app did not start within {timeout} s; see {self.log.name}")

    def stop(self) -> None:
        """Terminate the subprocess (only the one this object started)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


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
