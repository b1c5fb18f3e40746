"""Helpers for wiring Gradio events.

Gradio reads a handler's returned dict as ``{component: update}`` only when it is non-empty: an
empty dict counts as *one* output value, and an event with several outputs then fails with
"didn't return enough output values". Handlers here return ``{}`` for "nothing to change" (the
tests rely on that contract), so events that can change nothing are wired through
:func:`nothing_is_skip`. :func:`clicked_token` and :func:`clicked_cell` read what a click in a
lane's output or canvas view sent (``token_click.js``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import gradio as gr


def nothing_is_skip(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an event handler so that an empty update dict reaches Gradio as ``gr.skip()``
    (change nothing). The wrapper keeps ``fn``'s signature and annotations, so Gradio still
    injects ``gr.Request`` / ``gr.EventData`` arguments."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        up = fn(*args, **kwargs)
        return gr.skip() if isinstance(up, dict) and not up else up

    return call


def clicked_token(evt: Any) -> tuple[int | None, int] | None:
    """What a click on a lane's token names (``token_click.js`` sends ``{lane, step}``): the
    0-based lane (None when the data names none) and the step; None when it names no step."""
    data = getattr(evt, "_data", None) or {}
    try:
        step = int(data.get("step"))
    except (TypeError, ValueError, OverflowError):
        return None
    lane = data.get("lane")
    return (lane - 1 if isinstance(lane, int) and not isinstance(lane, bool) and lane >= 1 else None), step


def clicked_cell(evt: Any) -> tuple[int, int | None, int] | None:
    """What a click on a canvas cell for a hand names (``token_click.js`` sends ``{lane, step,
    pos, hand}`` as a ``select`` event): the 0-based lane, the step the cell shows (None: the
    scrubber's) and the position; None when the data is not a hand click."""
    data = getattr(evt, "_data", None) or {}
    if data.get("hand") is not True:
        return None

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    lane, step, pos = data.get("lane"), data.get("step"), data.get("pos")
    if not (whole(lane) and lane >= 1 and whole(pos) and (step is None or whole(step))):
        return None
    return lane - 1, step, pos
