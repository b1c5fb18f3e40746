"""``playground screenshots``: the screenshots the README and docs/ui.md show, by explicit command.

Starts the app (its own temporary database, bundled models) and headless Chromium, runs the
presets the README shows and writes ``compare-running.png``, ``compare-finished.png``,
``inspector.png``, ``speculative-showdown.png`` and ``sessions.png`` to ``--out`` (default
docs/screenshots), and one inspector column per step kind or evidence that docs/teaching.md's
"Reading the plots" annotates: ``diffusion-canvas.png`` (denoise steps), ``jacobi.png``,
``constraint.png``, ``watermark.png``, ``particles.png`` (SMC), and ``divergence.png`` (the comparison strip of lanes that
share their random numbers), and ``width-1440.png``, ``width-800.png``, ``width-400.png``: the top of
the page after a *Speculative showdown* run at each width the page is checked at. Tests never
write these files; this command is the only writer.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import visualizers
from playground.bench._browser import (app_and_browser, load_preset, new_page, open_page, set_number, wait_idle,
                                      wait_running)
from playground.core.errors import PlaygroundError
from playground.core.models import BUNDLED_DIR

OUT = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
THREE_LANES = "Greedy vs beam search vs sampling"
SHOWDOWN = "Speculative showdown"
# One inspector column per step kind or evidence: name -> (preset title, lane, token clicked).
# The token picks the step: one past the first few, where the plots have something to show.
COLUMNS = {
    "diffusion-canvas": ("Diffusion: tokens per step", 2, 12),  # fast_dllm: several commits a step
    "jacobi": ("Lossless check", 4, 10),
    "constraint": ("Guided decoding", 2, 6),  # the regex lane
    "watermark": ("Guided decoding", 4, 20),
    "particles": ("Guided decoding", 5, 10),  # smc
}
DIVERGENCE = "Truncation samplers"
WIDTHS = (1440, 800, 400)  # the widths tests/test_browser_widths.py checks
NAMES = ("compare-running", "compare-finished", "inspector", "speculative-showdown", "sessions",
         *COLUMNS, "divergence", *(f"width-{w}" for w in WIDTHS))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``playground screenshots``."""
    p.add_argument("--out", default=str(OUT), help="folder for the PNG files (default docs/screenshots)")
    p.add_argument("--only", action="append", choices=NAMES, default=None, metavar="NAME",
                   help="write only this screenshot (repeatable): " + ", ".join(NAMES))


def _save(out: Path, name: str, png: bytes, written: list[str]) -> None:
    """Write ``png`` as ``out/name.png`` in one step (never a half-written file)."""
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".png", dir=out)
    with os.fdopen(fd, "wb") as f:
        f.write(png)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; these are files of the repository
    os.replace(tmp, out / f"{name}.png")
    written.append(str(out / f"{name}.png"))


def _try_wait(page: Any, js: str, timeout_ms: int = 15_000) -> bool:
    """Wait for an optional sign of the page (inspector ids are not part of the page's contract)."""
    try:
        page.wait_for_function(js, timeout=timeout_ms)
        return True
    except Exception:  # noqa: BLE001 - a missing optional element only makes the picture less settled
        return False


def _jump_to_token(page: Any, lane: int, nth: int) -> None:
    """Click a token of a lane (the scrubber jumps to its step) and let the plots redraw."""
    tok = page.locator(f"#lane-{lane}-output .tok").nth(nth)
    step = tok.get_attribute("data-step")
    tok.click()
    if step is not None:
        _try_wait(page, f"() => {{ const h = document.querySelector('#inspect-{lane}-header');"
                        f" return h && h.innerText.includes('step {int(step)} of'); }}")
    _try_wait(page, f"() => !!document.querySelector('#inspect-{lane}-step-0 .main-svg')")
    page.wait_for_timeout(1000)  # plotly's transitions


def _compare_shots(page: Any, want: set[str], out: Path, written: list[str]) -> None:
    load_preset(page, THREE_LANES)
    if "compare-running" in want:
        set_number(page, "max-new-tokens", 200)
        page.click("#run")
        wait_running(page)
        page.wait_for_function("() => document.querySelectorAll('#lane-1-output .tok').length >= 12"
                               " && /^Running/.test(document.querySelector('#status').innerText.trim())",
                               timeout=120_000, polling="raf")
        # the lanes, not the settings above them, are what this picture is about
        page.evaluate("() => document.querySelector('#run').scrollIntoView({block: 'start'})")
        _save(out, "compare-running", page.screenshot(full_page=False), written)
        page.evaluate("() => window.scrollTo(0, 0)")
        page.click("#stop")
        wait_idle(page)
    if want & {"compare-finished", "inspector"}:
        set_number(page, "max-new-tokens", 48)
        page.click("#run")
        wait_idle(page)
        _jump_to_token(page, 3, 6)
        if "compare-finished" in want:
            _save(out, "compare-finished", page.screenshot(full_page=True), written)
        if "inspector" in want:
            target = page.locator("#inspector")
            shot = target.screenshot() if target.count() else page.screenshot(full_page=True)
            _save(out, "inspector", shot, written)


def _showdown_shot(page: Any, out: Path, written: list[str]) -> None:
    load_preset(page, SHOWDOWN)
    page.click("#run")
    wait_idle(page)
    _jump_to_token(page, 2, 10)
    _save(out, "speculative-showdown", page.screenshot(full_page=True), written)


def _column_shots(page: Any, want: set[str], out: Path, written: list[str]) -> None:
    """Run each wanted column's preset once and save the inspector column of its lane."""
    by_preset: dict[str, list[str]] = {}
    for name, (preset, _lane, _nth) in COLUMNS.items():
        if name in want:
            by_preset.setdefault(preset, []).append(name)
    for preset, names in by_preset.items():
        load_preset(page, preset)
        page.click("#run")
        wait_idle(page)
        for name in names:
            _preset, lane, nth = COLUMNS[name]
            count = page.locator(f"#lane-{lane}-output .tok").count()
            _jump_to_token(page, lane, min(nth, max(count - 1, 0)))
            _save(out, name, page.locator(f"#inspect-{lane}").screenshot(), written)


def _divergence_shot(page: Any, out: Path, written: list[str]) -> None:
    """Race lanes that share their random numbers and save the comparison strip."""
    load_preset(page, DIVERGENCE)
    page.click("#run")
    wait_idle(page)

    # the progress plot and every figure over all lanes the strip holds
    plots = 1 + len(getattr(visualizers, "COMPARE_PLOTS", []))
    _try_wait(page, f"() => document.querySelectorAll('#compare-strip .plot-container').length >= {plots}")
    page.wait_for_timeout(1000)  # plotly's transitions
    _save(out, "divergence", page.locator("#compare-strip").screenshot(), written)


def _sessions_shot(page: Any, out: Path, written: list[str]) -> None:
    page.get_by_role("tab", name="Sessions").click()
    page.wait_for_function("() => { const s = document.querySelector('#sessions-status');"
                           " return s && /stored session/.test(s.innerText); }", timeout=60_000)
    cell = page.locator("#sessions-table [role=gridcell]").first
    cell.wait_for()
    cell.click()
    _try_wait(page, "() => { const s = document.querySelector('#session-selected');"
                    " return s && !/no session selected/.test(s.innerText); }")
    page.wait_for_timeout(500)
    _save(out, "sessions", page.screenshot(full_page=False), written)


def _width_shots(browser: Any, url: str, want: set[str], out: Path, written: list[str]) -> None:
    """The page after a showdown run at each checked width: its first two screens."""
    for w in WIDTHS:
        if f"width-{w}" not in want:
            continue
        ctx = browser.new_context(viewport={"width": w, "height": 900})
        page = ctx.new_page()
        page.set_default_timeout(120_000)
        try:
            open_page(page, url)
            load_preset(page, SHOWDOWN)
            page.click("#run")
            wait_running(page)
            wait_idle(page)
            page.wait_for_timeout(1500)  # the chained draw of the plots
            png = page.screenshot(clip={"x": 0, "y": 0, "width": w, "height": 1800}, full_page=True)
            _save(out, f"width-{w}", png, written)
        finally:
            ctx.close()


def run(args: argparse.Namespace) -> int:
    """Start the app and Chromium, take the screenshots, print the files written."""
    want = set(args.only or NAMES)
    models = ("tiny-shakespeare", "tiny-shakespeare-draft") + (("tiny-shakespeare-diffusion",)
                                                               if "diffusion-canvas" in want else ())
    if not all((BUNDLED_DIR / m / "config.json").exists() for m in models):
        raise PlaygroundError("the screenshots need the bundled models; run `playground train-tiny` first")
    out = Path(args.out)
    written: list[str] = []
    with app_and_browser(threads=1) as (app, browser):
        page = new_page(browser, app.url)
        if want & {"compare-running", "compare-finished", "inspector"}:
            _compare_shots(page, want, out, written)
        if "speculative-showdown" in want:
            _showdown_shot(page, out, written)
        if want & set(COLUMNS):
            _column_shots(page, want, out, written)
        if "divergence" in want:
            _divergence_shot(page, out, written)
        if "sessions" in want:
            if not written:  # the Sessions tab needs a stored session to show
                load_preset(page, THREE_LANES)
                set_number(page, "max-new-tokens", 16)
                page.click("#run")
                wait_idle(page)
            _sessions_shot(page, out, written)
        page.context.close()
        _width_shots(browser, app.url, want, out, written)
    for path in written:
        print(path)
    return 0
