"""Lane configuration of the Compare page: presets, decoder pick, knob controls, lane count,
model status, the default page and opening a stored session.

Lane knobs are rendered from the decoder's parameter spec with ``gr.render`` and kept in one
``gr.State`` dict per lane.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

import gradio as gr

from playground.errors import PlaygroundError
from playground.ui import state as st
from playground.ui.html import empty_output, human, md_text, status_html
from playground.ui.layout import LaneUI, PageLayout

DEFAULT_PRESETS = ("speculative-showdown", "greedy-beam-sampling")  # what a first visit shows


class LaneConfigHandlers(PageLayout):
    """Handlers that set up the lanes (mixed into :class:`~playground.ui.compare.ComparePage`)."""

    def knob_render(self, ui: LaneUI) -> None:
        """Render lane ``ui``'s knob controls from its decoder's spec, again on every nonce bump."""
        k = ui.k

        # One render at a time across lanes: Gradio registers a render's events in a shared
        # table, and a preset re-renders every lane at once (seen: "dictionary changed size
        # during iteration" when six renders ran in parallel).
        @gr.render(inputs=[ui.decoder, ui.knobs], triggers=[ui.nonce.change], show_progress="hidden",
                   concurrency_limit=1, concurrency_id="knob-render")
        def _knobs(decoder: str, knobs: dict[str, Any]) -> None:
            spec = st.decoder_spec(decoder)
            if spec is None or not spec["params"]:
                gr.Markdown("*no knobs*" if spec else "", elem_classes=["lane-info"])
                return
            params = spec["params"]
            with gr.Column(elem_id=f"lane-{k}-knobs"):
                for name, p in params.items():
                    w = st.knob_widget(name, p, (knobs or {}).get(name))
                    comp = _WIDGETS[w.widget](**w.kwargs, elem_id=f"lane-{k}-knob-{name}",
                                              key=f"lane-{k}-{decoder}-{name}", interactive=True)
                    # .input (user edits only): a freshly rendered control reports nothing, so
                    # a re-render never races its predecessor's events.
                    comp.input(partial(_set_knob, name), inputs=[comp, ui.knobs, ui.decoder],
                               outputs=[ui.knobs, ui.info], show_progress="hidden", trigger_mode="always_last")

    # ================================================================== events
    def wire_config(self, demo: gr.Blocks) -> None:
        """Attach the configuration events (preset, model, lane count, decoder picks)."""
        self.preset.input(self.on_preset, [self.preset], self.lane_config_outputs() + [self.status])
        self.model.change(self.on_model, [self.model, self.model_path], [self.model_status],
                          show_progress="minimal")
        self.model_path.submit(self.on_model, [self.model, self.model_path], [self.model_status],
                               show_progress="minimal")
        self.add_btn.click(self.on_add, [self.lane_count], [self.lane_count] + [u.column for u in self.lanes],
                           queue=False)
        self.remove_btn.click(self.on_remove, [self.lane_count], [self.lane_count] + [u.column for u in self.lanes],
                              queue=False)
        for ui in self.lanes:
            ui.decoder.input(self.on_decoder, [ui.decoder, self.model, ui.model],
                             [ui.knobs, ui.nonce, ui.draft, ui.info, ui.model], queue=False)

    def wire_load(self, demo: gr.Blocks) -> None:
        """Attach the page-load events: the default page (or a shared session) and model status."""
        demo.load(self.on_load, None, self.page_outputs(), show_progress="hidden")
        # Warm the model cache as soon as the page opens, so the first Run starts at once.
        demo.load(self.on_model, [self.model, self.model_path], [self.model_status], show_progress="minimal")

    # ================================================================== update builders
    def config_updates(self, page: dict[str, Any], preset: str | None = None) -> dict[Any, Any]:
        """Updates that show ``page`` (from :func:`state.preset_page`/:func:`state.session_page`)."""
        lanes: list[st.LaneConfig] = page["lanes"][: self.max_lanes]
        n = max(len(lanes), 1)
        nonce = time.time_ns()
        up: dict[Any, Any] = {
            self.model: gr.update(value=page["model"]), self.model_path: "", self.prompt: page["prompt"],
            self.seed: page["seed"], self.max_new: page["max_new_tokens"],
            self.policy: page.get("policy", "forwards"), self.lane_count: n, self.preset_state: preset,
            self.preset_info: md_text(page.get("description", "")),
        }
        if "metric" in page:
            up[self.metric] = page["metric"]
        for j, ui in enumerate(self.lanes):
            if j < len(lanes):
                cfg = lanes[j]
                spec = st.decoder_spec(cfg.decoder)
                knobs = {**st.default_knobs(cfg.decoder), **cfg.params}
                up.update({
                    ui.column: gr.update(visible=True),
                    ui.decoder: gr.update(value=cfg.decoder) if spec else gr.update(value=None),
                    ui.model: cfg.model or st.SAME_MODEL,
                    ui.draft: gr.update(value=cfg.draft or st.DEFAULT_DRAFT, visible=st.needs_draft(cfg.decoder)),
                    ui.info: st.decoder_info_md(cfg.decoder, knobs), ui.knobs: knobs, ui.nonce: nonce + j,
                })
            else:
                up[ui.column] = gr.update(visible=False)
        return up

    # ================================================================== handlers
    def on_preset(self, name: str) -> dict[Any, Any]:
        """Apply a preset to the page."""
        try:
            page = st.preset_page(name)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return {self.status: status_html(str(e), "error")}
        up = self.config_updates(page, preset=name)
        missing = [c.decoder for c in page["lanes"] if st.decoder_spec(c.decoder) is None]
        msg = f"Preset “{page['title']}” loaded — press Run."
        if len(page["lanes"]) > self.max_lanes:
            msg += f" (only its first {self.max_lanes} lanes: this instance allows {self.max_lanes})"
        if missing:
            msg += f" (decoders not available here: {', '.join(missing)})"
        up[self.status] = status_html(msg)
        return up

    def on_model(self, model: str, path: str) -> str:
        """Load (or find in the cache) the picked model, showing what it is."""
        from playground.settings import limits

        spec = (path or "").strip() or (model or "").strip()
        if not spec:
            return ""
        if limits().no_models:
            return status_html("Replay-only instance: models are not loaded here; shared sessions still open.", "info")
        try:
            handle = _load(spec)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return status_html(str(e), "error")
        nparams = sum(p.numel() for p in handle.model.parameters())
        return status_html(f"✓ {handle.name} · {handle.kind} · {human(nparams)} parameters · "
                           f"context {handle.context_length} tokens", "ok")

    def on_add(self, n: int) -> list[Any]:
        """Show one more lane."""
        n = min(int(n or 0) + 1, self.max_lanes)
        return [n] + [gr.update(visible=j < n) for j in range(self.max_lanes)]

    def on_remove(self, n: int) -> list[Any]:
        """Hide the last lane (at least two stay)."""
        n = max(int(n or 0) - 1, 1)
        return [n] + [gr.update(visible=j < n) for j in range(self.max_lanes)]

    def on_decoder(self, decoder: str, page_model: str, lane_model: str) -> list[Any]:
        """A lane's decoder was picked: its default knobs, draft picker and lane model."""
        lm = st.lane_model_for(decoder, page_model, None if lane_model == st.SAME_MODEL else lane_model)
        return [st.default_knobs(decoder), time.time_ns(), gr.update(visible=st.needs_draft(decoder)),
                st.decoder_info_md(decoder), lm or st.SAME_MODEL]

    def on_load(self, request: gr.Request) -> dict[Any, Any]:
        """Page load: replay ``?session=<id>`` if given, else show the default preset."""
        params = dict(getattr(request, "query_params", {}) or {}) if request is not None else {}
        sid = params.get("session")
        if sid is not None:
            return self.open_session(sid)
        return self.default_page()

    def default_page(self) -> dict[Any, Any]:
        """The page as a first visit shows it: the first preset that runs here."""
        up: dict[Any, Any] = {}
        names = [n for _t, n in st.preset_choices()]
        for name in [n for n in DEFAULT_PRESETS if n in names] + names:
            try:
                page = st.preset_page(name)
            except PlaygroundError:
                continue
            if all(st.decoder_spec(c.decoder) for c in page["lanes"]) and 2 <= len(page["lanes"]) <= self.max_lanes \
                    and _models_present(page):
                up = self.config_updates(page, preset=name)
                up[self.preset] = name
                break
        else:
            page = {"model": st.DEFAULT_MODEL, "prompt": st.EXAMPLE_PROMPTS[0], "seed": 0, "max_new_tokens": 48,
                    "lanes": [st.LaneConfig("greedy"), st.LaneConfig("greedy")]}
            up = self.config_updates(page)
        for ui in self.lanes[: up.get(self.lane_count, 2)]:
            up[ui.output] = empty_output(ui.k)
        up[self.status] = status_html("Press Run to race the lanes. Pick another preset or change any lane.")
        up.update(self.idle_buttons())
        return up

    def open_session(self, sid: Any) -> dict[Any, Any]:
        """Replay a stored session: text, colours, stats, scrubber and every plot, no model."""
        from playground.store import default_store

        try:
            session = default_store().load_session(str(sid))
        except PlaygroundError as e:
            up = self.default_page()
            msg = f"Could not open the shared session: {e}."
            gr.Warning(msg)
            up[self.status] = status_html(msg, "error")
            return up
        page = st.session_page(session)
        up = self.config_updates(page)
        up[self.preset_info] = md_text(f"Replaying stored session **{st._md_escape(session['title'])}** "
                                       f"({session['created'][:16].replace('T', ' ')} UTC) — no model loaded.")
        runs = page["runs"]
        up.update(self.result_updates(runs, page["metric"], step=None, sid=session["id"],
                                      status=status_html(f"Replaying “{session['title']}”: {len(runs)} lanes, "
                                                         f"stored {session['created'][:10]}. Press Run to run it again.",
                                                         "ok")))
        up.update(self.idle_buttons())
        up[self.share_link] = ""
        return up


def _set_knob(name: str, value: Any, knobs: dict[str, Any] | None, decoder: str) -> tuple[dict[str, Any], str]:
    new = {**(knobs or {}), name: value}
    return new, st.decoder_info_md(decoder, new)


_WIDGETS: dict[str, Callable[..., Any]] = {
    "slider": gr.Slider, "number": gr.Number, "checkbox": gr.Checkbox, "dropdown": gr.Dropdown,
    "textbox": gr.Textbox,
}


def _load(spec: str) -> Any:
    from playground.models import load_model

    return load_model(spec)


def _models_present(page: dict[str, Any]) -> bool:
    """Whether the bundled models a page names are installed (other specs are assumed loadable)."""
    from playground.models import BUNDLED, BUNDLED_DIR

    names = {page["model"]} | {c.model for c in page["lanes"] if c.model} | {c.draft for c in page["lanes"] if c.draft}
    return all((BUNDLED_DIR / n / "config.json").exists() for n in names if n in BUNDLED)
