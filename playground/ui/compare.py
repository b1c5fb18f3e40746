"""The Compare page: decoders side by side, streaming, with the step inspector and sharing.

Element ids are a contract (docs/architecture.md, "Element ids"): ``#model``, ``#prompt``, ``#seed``,
``#max-new-tokens``, ``#preset``, ``#run``, ``#stop``, ``#lane-<k>`` with
``#lane-<k>-decoder``, ``#lane-<k>-output`` and ``#lane-<k>-stats``, ``#step``, ``#share``,
``#share-link``.

The page is assembled from modules with one job each:

- :mod:`playground.ui.layout` creates the components and names their groups;
- :mod:`playground.ui.lane_config` sets the lanes up (presets, decoders, knobs, lane count,
  model status, the default page, opening a stored session);
- :mod:`playground.ui.run_session` runs a comparison (Run, Stop, Share, the runner registry);
- :mod:`playground.ui.inspector` shows traces (lane outputs, stats, the step inspector);
- :mod:`playground.ui.html` holds small HTML helpers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import gradio as gr

from playground.ui.html import error_html, one_line, status_html
from playground.ui.inspector import InspectorHandlers
from playground.ui.lane_config import LaneConfigHandlers
from playground.ui.layout import LaneUI
from playground.ui.page_session import PageSessions
from playground.ui.run_session import RunSession

__all__ = ["ComparePage", "LaneUI", "error_html", "one_line", "private_events", "status_html"]


class ComparePage(LaneConfigHandlers, RunSession, InspectorHandlers):
    """Builds the Compare tab inside an open ``gr.Blocks`` and wires its events."""

    def __init__(self, sessions: PageSessions) -> None:
        self.lanes: list[LaneUI] = []
        self.sessions = sessions  # the app's open pages: runner, run token, picked step per page

    def build(self) -> None:
        """Create the components; their own events (examples, knob renders) are private too."""
        from gradio.context import Context

        with private_events(Context.root_block):
            super().build()

    def wire(self, demo: gr.Blocks) -> None:
        """Attach every event of the page, each hidden from the public API."""
        with private_events(demo):
            self.wire_config(demo)
            self.wire_run(demo)
            self.wire_inspector(demo)
            self.wire_share(demo)
            self.wire_load(demo)


@contextmanager
def private_events(demo: gr.Blocks) -> Iterator[None]:
    """Hide every event listener registered inside the block from the public API.

    The page's handlers take component values in page order (and ``gr.Request``); they are
    no interface for scripts, which get their own endpoints. ``api_visibility="private"``
    (Gradio 6) hides them from the API page and the client libraries; the page itself
    still calls them. Applied here, once, so a listener added later is hidden too.
    """
    before = set(demo.fns)
    try:
        yield
    finally:
        for i, fn in demo.fns.items():
            if i not in before:
                fn.api_visibility = "private"
