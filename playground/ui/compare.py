"""The Compare page: decoders side by side, streaming, with the step inspector and sharing.

Element ids are a contract (docs/architecture.md, "Element ids"): ``#model``, ``#prompt``, ``#seed``,
``#max-new-tokens``, ``#preset``, ``#run``, ``#stop``, ``#lane-<k>`` with
``#lane-<k>-decoder``, ``#lane-<k>-output`` and ``#lane-<k>-stats``, ``#step``, ``#share``,
``#share-link``.

:class:`ComparePage` is the page's components (:class:`~playground.ui.layout.Layout`) with
its handler groups, each a plain object that receives the components and what else it needs
explicitly. The UI modules, one job each:

- :mod:`playground.ui.layout` creates the components and names their groups;
- :mod:`playground.ui.lane_config` sets the lanes up (presets, decoders, knobs, lane count,
  model status, the default page, opening a stored session);
- :mod:`playground.ui.lane_reset` clears a lane whose setup changed (card, inspector column,
  its trace);
- :mod:`playground.ui.scrubber` the step and position sliders (a stale value is their end);
- :mod:`playground.ui.run_handlers` runs a comparison (Run, Stop, Share);
- :mod:`playground.ui.inspector` shows traces (lane outputs, stats, the step inspector), from
  the pure update builders of :mod:`playground.ui.updates`;
- :mod:`playground.ui.align` lines the inspector's lanes up (by step or token position, focus);
- :mod:`playground.ui.branch_panel` branches a lane at a step with another token;
- :mod:`playground.ui.replay` opens a stored session in two frames (text, then plots);
- :mod:`playground.ui.page_session` holds what the server keeps per open page (runner, run
  token, frame flow, live feed, picked step) in one registry per app;
- :mod:`playground.ui.live_feed` is the long poll that carries lane text while a run streams;
- :mod:`playground.ui.page_routes` the app's own HTTP routes the page's script calls (live
  feed, frame acknowledgements, Stop, export downloads);
- :mod:`playground.ui.page_js` reads the page's JavaScript from the ``.js`` files;
- :mod:`playground.ui.events` adapts handler results to Gradio's event rules;
- :mod:`playground.ui.model_options` the chat template, system prompt and remote-code controls;
- :mod:`playground.ui.rules` the page's rules, free of Gradio (lane checks, presets, knobs);
- :mod:`playground.ui.html` small HTML helpers.

The other tabs live in :mod:`playground.ui.sessions_view`, :mod:`playground.ui.study_view` and
:mod:`playground.ui.watermark_view`; the public API in :mod:`playground.ui.api_endpoints`,
session downloads in :mod:`playground.ui.exports`, the request guard in
:mod:`playground.ui.request_guard`.
"""

from __future__ import annotations

import gradio as gr

from playground.ui.align import wire_align
from playground.ui.branch_panel import BranchPanel
from playground.ui.explain_panel import ExplainPanel
from playground.ui.notes_panel import NotesPanel
from playground.ui.inspector import InspectorHandlers
from playground.ui.lane_config import LaneHandlers
from playground.ui.layout import LaneUI, Layout
from playground.ui.page_session import PageSessions
from playground.ui.replay import ReplayHandlers
from playground.ui.run_handlers import RunHandlers

__all__ = ["ComparePage", "LaneUI"]


class ComparePage(Layout):
    """The Compare tab: its components (this object is the page's :class:`Layout`) and its
    handler groups, built inside an open ``gr.Blocks``.

    ``sessions`` is the app's page registry. The handlers other tabs and scripts call are named
    below, each the bound method of the one group that owns it."""

    def __init__(self, sessions: PageSessions) -> None:
        self.lanes: list[LaneUI] = []
        self.sessions = sessions
        self.inspector = InspectorHandlers(self, sessions)
        self.config = LaneHandlers(self, self.inspector)
        self.run = RunHandlers(self, sessions, self.inspector, self.config)
        self.replay = ReplayHandlers(self, sessions, self.config, self.inspector)
        self.branch = BranchPanel(self, self.config.open_session)
        self.explain = ExplainPanel(self)
        self.notes = NotesPanel(self)
        # lane configuration
        self.on_preset, self.on_model = self.config.on_preset, self.config.on_model
        self.on_budget = self.config.on_budget
        self.on_add, self.on_remove, self.on_decoder = self.config.on_add, self.config.on_remove, self.config.on_decoder
        self.config_updates, self.default_page = self.config.config_updates, self.config.default_page
        self.open_session = self.config.open_session
        # Run, Stop, Share
        self.on_run, self.on_draw = self.run.on_run, self.run.on_draw
        self.on_stop, self.on_share = self.run.on_stop, self.run.on_share
        # the inspector
        self.on_step, self.on_token = self.inspector.on_step, self.inspector.on_token
        self.on_metric = self.inspector.on_metric
        self.result_updates, self.step_updates = self.inspector.result_updates, self.inspector.step_updates
        self.live_lane = self.inspector.live_lane
        # page load: the default page or a shared session
        self.on_load = self.replay.on_load

    def build(self) -> None:  # type: ignore[override]  (the page knows its own knob render and branch panel)
        """Create the components."""
        super().build(knob_render=self.config.knob_render, build_branch=self.build_panels)

    def build_panels(self) -> None:
        """The inspector's panels above its columns: Notes, Branch, then Explain."""
        self.notes.build()
        self.branch.build()
        self.explain.build()

    def wire(self, demo: gr.Blocks) -> None:
        """Attach every event of the page (``api_endpoints.hide_ui_events`` hides them from the
        public API)."""
        self.config.wire_config(demo)
        wire_align(self, demo)
        self.run.wire_run(demo)
        self.inspector.wire_inspector(demo)
        self.branch.wire(demo)
        self.explain.wire(demo)
        self.notes.wire(demo)
        self.inspector.wire_metric(demo)
        self.run.wire_share(demo)
        self.replay.wire_load(demo)
        self.config.wire_load(demo)
