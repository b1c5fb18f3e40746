"""Suite ``tests``: how long the test suite takes on this machine (issue 35: a suite a developer
can run often).

Runs the README's test command, ``python3 -m pytest`` (pytest-xdist puts a worker on every
core, see pyproject.toml), and the quick loop ``python3 -m pytest -m "not slow"``, each once,
in a fresh process from the repository root, one after the other. Records the wall time, the
counts pytest reports, the load average before and after and the slowest tests of each. A run
with failures is recorded as such; nothing here is asserted. ``--quick`` times one small test
module instead (a smoke run of the suite itself).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from playground.bench import machine_line
from playground.bench.overhead import load_average
from playground.core.errors import PlaygroundError

DESCRIPTION = "the test suite's wall time: the README's command and the quick loop"
ROOT = Path(__file__).resolve().parent.parent.parent
TARGETS = {"full": 8 * 60.0, "quick": 3 * 60.0}  # seconds, issue 35
SLOWEST = 8

# pytest's last line, e.g. "=== 1 failed, 4005 passed, 83 warnings in 1816.00s (0:30:16) ==="
_SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<s>[0-9.]+)s")
# a --durations line, e.g. "194.80s call     tests/test_browser.py::test_several_people"
_DURATION = re.compile(r"^(?P<s>[0-9.]+)s (?P<phase>call|setup|teardown)\s+(?P<test>\S+)")
# a short-summary line (-ra), e.g. "FAILED tests/test_b.py::test_y - TimeoutError: ..."
_FAILED = re.compile(r"^(?:FAILED|ERROR) (?P<test>\S+)(?: - (?P<why>.*))?$")


def parse_output(text: str) -> dict[str, Any]:
    """The counts (``{"passed": 4005, "failed": 1, ...}``), pytest's own seconds and the
    ``--durations`` lines (seconds, phase, test id; slowest first) of a pytest run's output,
    and the tests its short summary says failed or errored (test id, the reason's first line)."""
    failed: list[tuple[str, str]] = []
    counts: dict[str, int] = {}
    seconds = float("nan")
    slow: list[tuple[float, str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        m = _SUMMARY.match(line)
        if m:
            counts = {w: int(n) for n, w in re.findall(r"(\d+) (\w+)", m.group("counts"))}
            seconds = float(m.group("s"))
            continue
        d = _DURATION.match(line)
        if d:
            slow.append((float(d.group("s")), d.group("phase"), d.group("test")))
            continue
        f = _FAILED.match(line)
        if f:
            failed.append((f.group("test"), (f.group("why") or "")[:160]))
    slow.sort(key=lambda x: -x[0])
    return {"counts": counts, "seconds": seconds, "slowest": slow, "failed": failed}


def _time_pytest(extra: list[str]) -> dict[str, Any]:
    """Run ``python3 -m pytest -q --durations=N <extra>`` from the repository root."""
    cmd = [sys.executable, "-m", "pytest", "-q", f"--durations={SLOWEST}", *extra]
    load0 = load_average()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = parse_output(proc.stdout)
    if not out["counts"]:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise PlaygroundError(f"pytest {' '.join(extra)} gave no summary (exit {proc.returncode}): "
                              + " / ".join(tail))
    return {**out, "wall": wall, "load": (load0, load_average())}


def _workers() -> str:
    """How many workers ``-n auto --maxprocesses 4`` gives on this machine."""
    return str(min(os.cpu_count() or 1, 4))


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {w}" for w, n in c.items())


def _verdict(run: dict[str, Any], target: float) -> str:
    if run["counts"].get("failed") or run["counts"].get("error") or run["counts"].get("errors"):
        return "failed (time not comparable)"
    return "met" if run["wall"] <= target else "missed"


def run_suite(args: argparse.Namespace) -> str:
    """Time the two commands; return the markdown section."""
    if args.quick:
        runs = [("`python3 -m pytest tests/test_bench.py` (smoke)", _time_pytest(["tests/test_bench.py"]), None)]
    else:
        runs = [("`python3 -m pytest` (the README's command)", _time_pytest([]), TARGETS["full"]),
                ("`python3 -m pytest -m \"not slow\"` (the quick loop)", _time_pytest(["-m", "not slow"]),
                 TARGETS["quick"])]
    lines = ["## The test suite (`--suite tests`)", "", machine_line(),
             f"Each command run once from the repository root in a fresh process, one after the other; "
             f"pytest-xdist runs {_workers()} worker(s) (`-n auto`, a test module per worker at a time). "
             "Wall time from start to exit, as a developer waits for it.", "",
             "| command | wall (min) | pytest says | load average (start → end) | target (issue 35) | |",
             "|---|---:|---|---|---:|---|"]
    for title, r, target in runs:
        lines.append(f"| {title} | {r['wall'] / 60:.1f} | {_counts(r['counts'])} | {r['load'][0]:.1f} → "
                     f"{r['load'][1]:.1f} | {'≤ %.0f min' % (target / 60) if target else ''} | "
                     f"{_verdict(r, target) if target else ''} |")
    lines.append("")
    for title, r, _target in runs:  # the bench keeps no log: what failed is said here
        if r.get("failed"):
            lines += [f"Failed in {title.split(' (')[0]}: " + "; ".join(
                f"`{test}`" + (f" ({why})" if why else "") for test, why in r["failed"]), ""]
    for title, r, _target in runs:
        lines += [f"Slowest of {title.split(' (')[0]}:", "", "| s | phase | test |", "|---:|---|---|"]
        lines += [f"| {s:.1f} | {phase} | `{test}` |" for s, phase, test in r["slowest"][:SLOWEST]]
        lines.append("")
    return "\n".join(lines)
