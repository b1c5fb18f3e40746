"""Small HTML helpers of the UI: escaping, the status line, a lane's error line, empty outputs.

Every string that reaches a ``gr.HTML`` from user input or a trace goes through :func:`esc`.
"""

from __future__ import annotations

import html as _html
from typing import Any


def esc(text: Any) -> str:
    """``text`` as HTML-escaped text."""
    return _html.escape(str(text))


def status_html(text: str, kind: str = "info", frame: str | None = None, ended: str | None = None) -> str:
    """The one-line status under the Run button (escaped); ``frame`` names the streamed frame it
    belongs to (the page acknowledges it once drawn); ``ended`` is the token of the run whose
    last frame this is (the page's script then ignores the run's late live-feed answers)."""
    tag = f' data-frame="{esc(frame)}"' if frame else ""
    tag += f' data-run-end="{esc(ended)}"' if ended else ""
    return f'<div class="pg-status pg-status-{kind}"{tag}>{esc(text)}</div>'


def error_html(message: str) -> str:
    """A lane's one-line error (escaped)."""
    return f'<div class="lane-error">⚠ {esc(message)}</div>'


def empty_output(k: int, note: str = "Press Run to start this lane.") -> str:
    """Lane ``k``'s output area before it has tokens, with a short note."""
    return f'<div class="tok-output" data-lane="{k}"><span class="tok-empty">{esc(note)}</span></div>'


def stats_html(line: str) -> str:
    """A lane's stats line (already HTML from the visualizers), or a dash when empty."""
    return f'<div class="lane-stats">{line or "—"}</div>'


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, shortened to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def md_text(text: str) -> str:
    """Markdown text for a ``gr.Markdown`` value (None becomes empty)."""
    return str(text or "")


def human(n: int) -> str:
    """A count in K/M/B, as model sizes are usually written."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return str(n)
