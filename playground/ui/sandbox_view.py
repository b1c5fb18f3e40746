"""The Sandbox tab: a distribution typed by hand, or one recorded step of any session, cut by
the sampler chain stage by stage — with no model (:mod:`playground.sandbox`).

The knobs are the chain's own (their names, defaults and ranges from
:func:`decoders.processors.chain_params`), the plots the inspector's (*Distribution* and
*Sampler chain*, drawn from the one-step trace the sandbox returns). A recorded step is read
from the store by session id (empty: the session the Compare tab shows), lane and step.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
import torch

from decoders.processors import chain_params
from playground import blind
from playground.core.errors import PlaygroundError
from playground.sandbox import KINDS, KNOBS, Distribution, apply_chain, parse_distribution, recorded_step
from playground.store import default_store
from playground.ui.compare import ComparePage
from playground.ui.html import one_line, status_html
from visualizers import distribution_figure
from visualizers.chain import chain_figure

EXAMPLE = "the 0.30\na 0.22\nthou 0.15\nmy 0.11\nRomeo 0.08\nlove 0.06\nnight 0.04\nsweet 0.02\nbanished 0.01\nO 0.01"
SOURCES = [("the distribution typed here", "typed"), ("the recorded step loaded below", "recorded")]


class SandboxView:
    """The Sandbox tab's components and handlers; ``page`` is the Compare page (whose shown
    session a recorded step is taken from when no id is given)."""

    def __init__(self, page: ComparePage) -> None:
        self.page = page

    def build(self) -> None:
        """Create the components (inside the tab)."""
        gr.Markdown("Type a next-token distribution (one `token value` per line) or load a recorded step, set the "
                    "sampler knobs, and see each stage of the chain cut it — the decoders' own processors and random "
                    "numbers, no model.", elem_id="sandbox-intro")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=280):
                self.text = gr.Textbox(EXAMPLE, label="Distribution: token value (one per line)", lines=10,
                                       max_lines=20, elem_id="sandbox-dist")
                with gr.Row():
                    self.kind = gr.Radio(list(KINDS), value="probabilities", label="Values are",
                                         elem_id="sandbox-kind", min_width=200)
                    self.seed = gr.Number(0, label="Seed (the draw's noise)", precision=0, elem_id="sandbox-seed",
                                          min_width=120)
                with gr.Accordion("…or a recorded step of a session", open=False, elem_id="sandbox-recorded"):
                    with gr.Row():
                        self.sid = gr.Textbox(label="Session id (empty: the one the Compare tab shows)",
                                              max_lines=1, elem_id="sandbox-session", min_width=200)
                        self.lane = gr.Number(1, label="Lane", precision=0, elem_id="sandbox-lane", min_width=80)
                        self.step = gr.Number(0, label="Step", precision=0, elem_id="sandbox-step", min_width=80)
                        self.load = gr.Button("Load step", elem_id="sandbox-load", min_width=110)
                self.source = gr.Radio(SOURCES, value="typed", label="Cut", elem_id="sandbox-source")
            with gr.Column(scale=2, min_width=260):
                specs = chain_params()
                self.knobs = []
                for name in KNOBS:
                    spec = specs[name]
                    info = spec.help or None
                    if spec.type == "str":
                        comp = gr.Textbox(str(spec.default), label=name, info=info, max_lines=1,
                                          elem_id=f"sandbox-knob-{name}")
                    else:
                        comp = gr.Number(spec.default, label=name, info=info, elem_id=f"sandbox-knob-{name}",
                                         precision=0 if spec.type == "int" else None)
                    self.knobs.append(comp)
                self.apply = gr.Button("Apply the chain", variant="primary", elem_id="sandbox-apply")
        self.status = gr.HTML("", elem_id="sandbox-status")
        with gr.Row():
            self.dist_plot = gr.Plot(label="Distribution: raw vs final", elem_id="sandbox-dist-plot")
            self.chain_plot = gr.Plot(label="Sampler chain, stage by stage", elem_id="sandbox-chain-plot")
        self.recorded = gr.State(None)

    def wire(self, demo: gr.Blocks) -> None:
        """Attach Load and Apply (no model: neither joins the model group)."""
        self.load.click(self.on_load, [self.sid, self.page.sid, self.lane, self.step],
                        [self.recorded, self.source, self.status], show_progress="hidden")
        inputs = [self.source, self.text, self.kind, self.seed, self.recorded, *self.knobs]
        outputs = [self.status, self.dist_plot, self.chain_plot]
        self.apply.click(self.on_apply, inputs, outputs, show_progress="hidden")
        for comp in self.knobs:
            if hasattr(comp, "submit"):
                comp.submit(self.on_apply, inputs, outputs, show_progress="hidden")

    # ================================================================== handlers
    def on_load(self, sid: Any, page_sid: Any, lane: Any, step: Any) -> dict[Any, Any]:
        """Read a recorded step (session, 1-based lane, step) for the chain to cut."""
        try:
            sid = (sid.strip() if isinstance(sid, str) else "") or (page_sid if isinstance(page_sid, str) else "")
            if not sid:
                raise PlaygroundError("give a session id, or open a session in the Compare tab")
            session = default_store().load_session(sid)
            blind.check_readable(default_store(), session["id"], None)  # its steps would give the lanes away
            try:
                k = int(float(lane))
            except (TypeError, ValueError, OverflowError):
                raise PlaygroundError(f"the lane must be a whole number, got {lane!r}") from None
            runs = session.get("runs") or []
            if not 1 <= k <= len(runs):
                raise PlaygroundError(f"the session has lanes 1 to {len(runs)}")
            dist = recorded_step(runs[k - 1], step)
        except PlaygroundError as e:
            return {self.status: status_html(one_line(str(e)), "error")}
        held = {"labels": dist.labels, "logits": dist.logits.tolist(), "ids": dist.ids, "seed": dist.seed,
                "position": dist.position, "source": f"lane {k}, {dist.source}"}
        return {self.recorded: held, self.source: "recorded",
                self.status: status_html(f"Loaded lane {k}, {dist.source}: its top-{len(dist.ids)} with the run's "
                                         f"seed {dist.seed} and position {dist.position}. Press Apply.", "ok")}

    def on_apply(self, source: Any, text: Any, kind: Any, seed: Any, recorded: Any, *knob_values: Any) -> dict[Any, Any]:
        """Cut the distribution with the knobs: the status line, the distribution and chain plots."""
        try:
            dist = self.distribution(source, text, kind, seed, recorded)
            res = apply_chain(dist, dict(zip(KNOBS, knob_values)))
        except PlaygroundError as e:
            return {self.status: status_html(one_line(str(e)), "error")}
        chain = " → ".join(res["chain"]) or "no rule (every knob neutral)"
        note = f" {res['note']}." if res["note"] else ""
        line = f"Drew {res['drawn']!r} from {res['source']} · chain: {chain}.{note}"
        return {self.status: status_html(line, "ok"),
                self.dist_plot: distribution_figure(res["trace"], 0), self.chain_plot: chain_figure(res["trace"], 0)}

    @staticmethod
    def distribution(source: Any, text: Any, kind: Any, seed: Any, recorded: Any) -> Distribution:
        """The distribution Apply cuts: the recorded step when chosen (and loaded), else the typed one."""
        if source == "recorded":
            if not isinstance(recorded, dict):
                raise PlaygroundError("load a recorded step first (or cut the typed distribution)")
            return Distribution(list(recorded["labels"]), _tensor(recorded["logits"]), list(recorded["ids"]),
                                seed=int(recorded["seed"]), position=int(recorded["position"]), recorded=True,
                                source=str(recorded["source"]))
        return parse_distribution(text, kind if kind in KINDS else "probabilities", seed)


def _tensor(values: list[float]) -> Any:
    """Logits held in the page's state as a float32 tensor."""
    return torch.tensor(values, dtype=torch.float32)


__all__ = ["SandboxView"]
