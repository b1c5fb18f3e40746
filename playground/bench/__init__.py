"""``playground bench --suite NAME``: benchmark suites that write to docs/benchmarks.md.

A suite is a module ``playground/bench/<name>.py`` exposing ``DESCRIPTION`` and
``run_suite(args) -> str`` (a markdown section). The section replaces the one between
``<!-- bench:<name> -->`` and ``<!-- /bench:<name> -->`` in the output file, so suites can
be re-run one at a time. Speed is reported as ratios against a reference run in the same
process, never asserted in tests.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import pkgutil
import re
import time
from pathlib import Path

from playground.core.errors import PlaygroundError

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "benchmarks.md"


def suites() -> list[str]:
    """Names of the available suites."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``playground bench``."""
    p.add_argument("--suite", required=True, help="one of: " + ", ".join(suites()))
    p.add_argument("--out", default=str(DOC), help="markdown file to update (default docs/benchmarks.md)")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per measurement")
    p.add_argument("--quick", action="store_true", help="fewer prompts/tokens (a smoke run)")
    p.add_argument("--no-write", action="store_true", help="print the section, do not write it")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")


def write_section(path: Path, name: str, body: str) -> None:
    """Replace (or append) the section of suite ``name`` in ``path``."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _m: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    """Run one suite and write its section."""
    if args.suite not in suites():
        raise PlaygroundError(f"unknown benchmark suite {args.suite!r} (suites: {', '.join(suites())})")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    mod = importlib.import_module(f"{__name__}.{args.suite}")
    body = mod.run_suite(args)
    print(body)
    if not args.no_write:
        write_section(Path(args.out), args.suite, body)
        print(f"\nwritten to {args.out}")
    return 0


def machine_line() -> str:
    """One line naming the machine and library versions, for the top of a section."""
    # torch and transformers only here and for --threads: listing and choosing a suite stays light.
    import torch
    import transformers

    return (f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), transformers {transformers.__version__}; "
            f"measured {time.strftime('%Y-%m-%d')}.")
