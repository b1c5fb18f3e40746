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


class Fanout:
    """Several handlers of one trigger, run as one Gradio event.

    Each event a page runs costs its browser a pass over the loading status of every component
    any earlier event wrote (Gradio's frontend), several times per event: five listeners of one
    change were five such events at every replay and every run's end. Handlers are added with
    their own inputs and outputs and keep their own signatures; :meth:`wire` attaches one event
    that reads the union of the inputs, calls each handler with its own, and merges what they
    return (a dict of updates, or the value of a handler's single output).
    """

    def __init__(self) -> None:
        self._handlers: list[tuple[Callable[..., Any], list[Any], list[Any]]] = []
        self._wired = False

    def add(self, fn: Callable[..., Any], inputs: list[Any], outputs: list[Any]) -> None:
        """Run ``fn(*inputs)`` in the event; it writes ``outputs``."""
        if self._wired:
            raise RuntimeError("Fanout.add after wire: the event is already attached")
        self._handlers.append((fn, list(inputs), list(outputs)))

    def inputs(self) -> list[Any]:
        """Every handler's inputs, each component once, in the order first named."""
        return unique([c for _fn, ins, _outs in self._handlers for c in ins])

    def outputs(self) -> list[Any]:
        """Every handler's outputs, each component once, in the order first named."""
        return unique([c for _fn, _ins, outs in self._handlers for c in outs])

    def __call__(self, *values: Any) -> dict[Any, Any]:
        """Call each handler with its inputs' values (``values`` follow :meth:`inputs`) and
        merge the updates; a later handler's update of a component wins."""
        by_id = {id(c): v for c, v in zip(self.inputs(), values)}
        up: dict[Any, Any] = {}
        for fn, ins, outs in self._handlers:
            got = fn(*[by_id[id(c)] for c in ins])
            if isinstance(got, dict) and "__type__" not in got:  # {component: update}
                up.update(got)
            elif len(outs) == 1:  # the value (or gr.update) of its one output
                up[outs[0]] = got
            else:
                up.update(zip(outs, got))
        return up

    def wire(self, trigger: Callable[..., Any], **settings: Any) -> None:
        """Attach the one event to ``trigger`` (such as ``state.change``)."""
        self._wired = True
        if self._handlers:
            trigger(nothing_is_skip(self.__call__), self.inputs(), self.outputs(), **settings)


def unique(comps: list[Any]) -> list[Any]:
    """``comps`` without repeats, in order (an event lists each component once)."""
    return list({id(c): c for c in comps}.values())
