"""The app on a free 127.0.0.1 port and headless Chromium on it, for the ``ui`` bench suite and
``playground screenshots`` (not a suite itself: the leading underscore keeps it out of
``playground bench --suite``).

Only the element ids the page promises are used (#model, #prompt, #seed, #max-new-tokens,
#preset, #run, #stop, #lane-<k>…, #step, #share, #share-link, #status), plus #remove-lane to
cut a preset to fewer lanes.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import signal
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from playground.core.errors import PlaygroundError

ROOT = Path(__file__).resolve().parent.parent.parent
CHROMIUM = os.environ.get("PLAYGROUND_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
VIEW = {"width": 1440, "height": 1100}

# The page is idle when the status says the run ended (or failed) and Run can be pressed again.
IDLE_JS = ("() => { const s = document.querySelector('#status'); const b = document.querySelector('#run');"
           " if (!s || !b) return false;"
           " if (s.querySelector('.pg-status-error')) return !b.disabled && 'error';"
           " return !b.disabled && /^(Done|Stopped)/.test((s.querySelector('.pg-status') || s).innerText.trim()); }")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """``python app.py`` in a subprocess on a free 127.0.0.1 port, with its own database."""

    def __init__(self, db: str, log_path: str | Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = db
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
                raise PlaygroundError(f"the app exited with status {self.proc.returncode}; see {self.log.name}")
            try:
                with opener.open(self.url + "/", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise PlaygroundError(f"the app did not start within {timeout:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        """Terminate the subprocess this object started (and only that one)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@contextlib.contextmanager
def app_and_browser(threads: int = 1, **env: str) -> Iterator[tuple[App, Any]]:
    """Start the app (own temporary database, ``threads`` torch threads) and headless Chromium.

    Yields ``(app, browser)``; both are closed on exit. A missing Playwright or Chromium is a
    one-line :class:`PlaygroundError`.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        raise PlaygroundError("this command needs Playwright: pip install -e '.[dev]'") from e
    if not Path(CHROMIUM).exists():
        raise PlaygroundError(f"no Chromium at {CHROMIUM} (install Debian's chromium or set PLAYGROUND_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="playground-browser-") as tmp, _exit_on_sigterm():
        app = App(str(Path(tmp) / "sessions.db"), Path(tmp) / "app.log", OMP_NUM_THREADS=str(threads), **env)
        try:
            app.wait()
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    yield app, browser
                finally:
                    browser.close()
        except PlaygroundError:
            raise
        except Exception as e:  # noqa: BLE001 - a browser or page failure: one line, and where the app logged
            log = _tail(Path(tmp) / "app.log")
            raise PlaygroundError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                                  + (f" (app log: {log})" if log else "")) from e
        finally:
            app.stop()


@contextlib.contextmanager
def _exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (``timeout``, ``kill``) into SystemExit while the app runs, so the cleanup
    above stops the app subprocess instead of leaving it orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def new_page(browser: Any, url: str) -> Any:
    """A page in a fresh browser context, opened on ``url`` and ready (its load event ran)."""
    ctx = browser.new_context(viewport=VIEW)
    page = ctx.new_page()
    page.set_default_timeout(120_000)
    open_page(page, url)
    return page


def open_page(page: Any, url: str) -> None:
    """Load ``url`` and wait until the page's load event has filled in the status line (and so the lanes)."""
    page.goto(url)
    page.wait_for_function("() => { const s = document.querySelector('#status');"
                           " return s && s.innerText.trim().length > 0 && !s.innerText.includes('Pick a preset'); }",
                           timeout=180_000)


def choose(page: Any, elem_id: str, text: str) -> None:
    """Pick the option containing ``text`` in the Gradio dropdown ``#elem_id``."""
    page.click(f"#{elem_id} input")
    page.locator("[role=option]", has_text=text).first.click()


def set_number(page: Any, elem_id: str, value: int) -> None:
    """Type ``value`` into the number box ``#elem_id`` and leave it (the change event fires)."""
    box = page.locator(f"#{elem_id} input").first
    box.fill(str(value))
    box.press("Tab")


def load_preset(page: Any, title: str) -> None:
    """Choose a preset by (part of) its title and wait until the page says that one is loaded.

    Picking the preset the page shows changes nothing (a first visit shows one): then another
    is picked first, so the preset is always applied afresh (every lane set up anew, no run)."""
    if title in page.locator("#preset input").input_value():
        page.click("#preset input")
        other = page.locator("[role=option]").filter(has_not_text=title).first
        other_title = other.inner_text().strip()
        other.click()
        _wait_loaded(page, other_title)
    choose(page, "preset", title)
    _wait_loaded(page, title)


def _wait_loaded(page: Any, title: str) -> None:
    """Wait until the status line says preset ``title`` (or part of it) is loaded."""
    page.wait_for_function("(t) => { const s = document.querySelector('#status').innerText;"
                           " return s.includes('loaded') && s.includes(t); }", arg=title)


def lanes_visible(page: Any) -> list[int]:
    """The numbers k of the lanes (#lane-k) shown."""
    return [k for k in range(1, 7) if page.locator(f"#lane-{k}").is_visible()]


def keep_lanes(page: Any, n: int) -> None:
    """Remove lanes from the end until ``n`` are shown."""
    for _ in range(6):
        if len(lanes_visible(page)) <= n:
            break
        page.click("#remove-lane")
        page.wait_for_timeout(300)
    if len(lanes_visible(page)) != n:
        raise PlaygroundError(f"could not cut the page to {n} lanes (it shows {lanes_visible(page)})")


def status_text(page: Any) -> str:
    """The status line under the Run button."""
    try:
        # the app's own line, not Gradio's progress timer that can sit beside it in #status
        line = page.locator("#status .pg-status")
        if line.count():
            return line.first.inner_text(timeout=5_000).strip()
        return page.locator("#status").inner_text(timeout=5_000).strip()
    except Exception:  # noqa: BLE001 - a page in the middle of a re-render
        return "<unreadable>"


def wait_idle(page: Any, timeout_ms: int = 300_000) -> str:
    """Wait until the run has finished or stopped; return the status line. A failed run raises."""
    try:
        page.wait_for_function(IDLE_JS, timeout=timeout_ms)
    except Exception as e:  # noqa: BLE001 - say what the page showed instead of a Playwright trace
        raise PlaygroundError(f"the run did not finish within {timeout_ms / 1000:.0f} s: "
                              f"status {status_text(page)!r}") from e
    text = status_text(page)
    if not re.match(r"^(Done|Stopped)", text):
        raise PlaygroundError(f"the run failed in the page: {text!r}")
    return text


def wait_running(page: Any, timeout_ms: int = 120_000) -> None:
    """Wait until Run has been pressed and the status says the lanes are decoding."""
    page.wait_for_function("() => { const s = document.querySelector('#status .pg-status');"
                           " return s && /^Running/.test(s.innerText.trim()); }", timeout=timeout_ms)


# The run started by the latest Run press (a flow token other than `before`) is decoding, or
# has already ended: a short run on an idle machine can go from its first frame to Done
# between two of the driver's polls, so "Running" alone may never be seen.
RUN_STARTED_JS = """(before) => { const l = window.__pgLive; if (!l || l.tok === before) return false;
  const s = document.querySelector('#status .pg-status');
  return (!!s && /^Running/.test(s.innerText.trim()))
    || !!document.querySelector('#status [data-run-end="' + l.tok + '"]'); }"""


def press_run(page: Any, timeout_ms: int = 120_000) -> None:
    """Click Run and wait until that run is decoding or over (see ``RUN_STARTED_JS``)."""
    before = page.evaluate("() => window.__pgLive ? window.__pgLive.tok : null")
    page.click("#run")
    page.wait_for_function(RUN_STARTED_JS, arg=before, timeout=timeout_ms)


def seconds_in_status(text: str) -> float | None:
    """The X of "Done in X s" / "Stopped in X s" (None when the status has no such figure)."""
    m = re.search(r"(?:Done|Stopped) in ([0-9.]+) ?s", text)
    return float(m.group(1)) if m else None
