"""The page's JavaScript, kept in ``.js`` files beside this module (package data) and read
when the app is built.

Each file holds one snippet that a Gradio event or component runs in the browser: a function
expression for an event's ``js=`` (``run_flow.js``, ``busy_notice.js``, ``highlight_step.js``,
``highlight_position.js``, ``focus_lane.js``, ``owner.js``, ``lazy_plots.js``: plots drawn
when they come into view) or the body a ``gr.HTML``'s
``js_on_load`` runs (``token_click.js``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def page_js(name: str, **values: str) -> str:
    """The snippet in ``name``, with each ``__KEY__`` placeholder replaced by ``values[KEY]``
    as a JavaScript string literal."""
    text = _read(name)
    for key, value in values.items():
        text = text.replace(f"__{key}__", json.dumps(value))
    return text
