"""Lane configuration of the Compare page: presets, decoder pick, knob controls, lane count,
model status, the default page and opening a stored session (:class:`LaneHandlers`).

Lane knobs are rendered from the decoder's parameter spec with ``gr.render`` and kept in one
``gr.State`` dict per lane.
"""

from __future__ import annotations

import secrets

import time
from functools import partial
from typing import Any, Callable

import gradio as gr

import playground.ui.model_options as mo
import playground.ui.rules as st
from playground import blind
from playground.core.errors import PlaygroundError
from playground.core.models import BUNDLED, BUNDLED_DIR, load_model
from playground.core.settings import limits
from playground.hosting import model_event_settings
from playground.store import default_store
from playground.ui.html import empty_output, error_html, human, md_text, stats_html, status_html
from playground.ui.events import nothing_is_skip, unique
from playground.ui.inspector import InspectorHandlers
from playground.ui.lane_reset import reset_all, reset_lanes
from playground.ui.layout import LaneUI, Layout
from playground.ui.page_js import page_js

DEFAULT_PRESETS = ("speculative-showdown", "greedy-beam-sampling")  # what a first visit shows

# The preset and decoder picks of every page run one at a time (one group for the whole app;
# 15-20 ms a preset, ~3 ms a decoder pick), so the second report of a pick (Gradio's dropdown
# sends a mouse pick twice) reads the states the first stored and can tell it changes nothing;
# run side by side (the app's default concurrency is 4), both saw the page before the pick.
ONE_PICK_AT_A_TIME: dict[str, Any] = {"concurrency_limit": 1, "concurrency_id": "lane-pick"}



def knob_nonce(decoder: str, n: int | None = None) -> dict[str, Any]:
    """A lane's knob-render nonce: a fresh number (a change re-renders the knob controls) and
    the decoder those controls are for (a second pick of the same decoder is not a change)."""
    return {"n": time.time_ns() if n is None else n, "decoder": decoder}

class LaneHandlers:
    """Handlers that set up the lanes, over the page's components ``ui``; ``inspector`` draws
    an opened session's results."""

    def __init__(self, ui: Layout, inspector: InspectorHandlers) -> None:
        self.ui, self.inspector = ui, inspector

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
            errors = st.knob_errors(decoder, knobs)
            with gr.Column(elem_id=f"lane-{k}-knobs"):
                for name, p in params.items():
                    w = st.knob_widget(name, p, (knobs or {}).get(name))
                    kwargs = {**w.kwargs, "info": st.knob_info(p, errors.get(name)) or None}
                    comp = _WIDGETS[w.widget](**kwargs, elem_id=f"lane-{k}-knob-{name}",
                                              key=f"lane-{k}-{decoder}-{name}", interactive=True)
                    # .input (user edits only): a freshly rendered control reports nothing, so
                    # a re-render never races its predecessor's events. One event holds the
                    # value and clears the lane's run (its setup changed). Enter and leaving the
                    # box send the value again: an edit made while the page was still busy
                    # with a burst of re-renders (a preset re-renders every lane) was seen to
                    # be lost, and holding the value twice changes nothing. The event's key
                    # keeps its id across renders of the same control: an edit sent while the
                    # server renders the lane again still finds its handler.
                    gr.on(_edit_triggers(comp), nothing_is_skip(partial(self.on_knob, k - 1, comp, name, p)),
                          inputs=[comp, ui.knobs, ui.decoder, self.ui.traces, self.ui.lane_count],
                          outputs=[ui.knobs, ui.info, comp, self.ui.status] + self.ui.lane_reset_outputs(k - 1),
                          show_progress="hidden", trigger_mode="always_last", key=f"lane-{k}-{decoder}-{name}-edit")

    # ================================================================== events
    def wire_config(self, demo: gr.Blocks) -> None:
        """Attach the configuration events (preset, model, lane count, decoder picks)."""
        # one event sets every lane up and clears every lane's run
        # Gradio's dropdown reports a pick by mouse twice (.input as the option is clicked and
        # again as it loses focus), both with the page as it was before the pick, and sends
        # .input on every blur, picked or not (on_preset tells them apart).
        self.ui.preset.input(nothing_is_skip(self.on_preset), [self.ui.preset, self.ui.preset_state],
                             self.ui.lane_config_outputs() + self.ui.result_outputs(), **ONE_PICK_AT_A_TIME)
        # Model work shares one concurrency group (loading a model races nothing else).
        model_in, model_out = self.model_io()
        self.ui.model.change(self.on_model, model_in, model_out, show_progress="minimal", **model_event_settings())
        self.ui.model_path.submit(self.on_model, model_in, model_out, show_progress="minimal", **model_event_settings())
        # A model the user picks clears every lane's run (.input: a preset or an opened
        # session sets the model too, and shows runs of its own).
        clear_in, clear_out = [self.ui.traces, self.ui.lane_count], self.ui.result_outputs()
        self.ui.model.input(nothing_is_skip(self.on_model_picked), clear_in, clear_out, show_progress="hidden")
        self.ui.model_path.submit(nothing_is_skip(self.on_model_picked), clear_in, clear_out, show_progress="hidden")
        mo.wire(self.ui)
        if self.ui.trust_remote_code is not None:
            # Ticking the opt-in loads the model it was refused for (and unticking says why not).
            self.ui.trust_remote_code.input(self.on_model, model_in, model_out, show_progress="minimal",
                                         **model_event_settings())
        lane_setup = [c for ui in self.ui.lanes for c in (ui.decoder, ui.knobs, ui.nonce, ui.info, ui.draft, ui.model)]
        count_outputs = [self.ui.lane_count, self.ui.add_btn, self.ui.remove_btn, self.ui.status] + [u.column for u in self.ui.lanes]
        # Queued (not queue=False): only a queued event's reply carries the changed states, so
        # only then does a nonce bump reach the knob render.
        # + Lane clears the lane it brings back (it may still show an older run), − Lane
        # drops the hidden lane's run from the traces and the inspector.
        self.ui.add_btn.click(self.on_add, [self.ui.lane_count, self.ui.model, self.ui.model_path, self.ui.traces],
                           unique(count_outputs + lane_setup + self.ui.result_outputs()), show_progress="hidden",
                           trigger_mode="always_last")
        # always_last, not Gradio's default "once": a second click while the first is still on
        # its way was dropped (two quick − Lane clicks removed one lane); deferred, it runs on
        # the count the first one left.
        self.ui.remove_btn.click(self.on_remove, [self.ui.lane_count, self.ui.traces],
                              count_outputs + self.ui.comparison_outputs(), show_progress="hidden",
                              trigger_mode="always_last")
        for j, ui in enumerate(self.ui.lanes):
            setup_out = [ui.knobs, ui.nonce, ui.draft, ui.info, ui.model]
            ui.decoder.input(partial(self.on_lane_decoder, j), [ui.decoder, self.ui.model, ui.model, ui.draft,
                                                                 self.ui.traces, self.ui.lane_count, ui.nonce],
                             setup_out + [self.ui.status] + self.ui.lane_reset_outputs(j), show_progress="hidden",
                             **ONE_PICK_AT_A_TIME)
            # the lane's own model or draft: the same setup change
            for comp in (ui.model, ui.draft):
                comp.input(partial(self.on_lane_setup, j), [ui.decoder, self.ui.traces, self.ui.lane_count],
                           [self.ui.status] + self.ui.lane_reset_outputs(j), show_progress="hidden")
        budget_inputs = [self.ui.model, self.ui.model_path, self.ui.prompt, self.ui.max_new]
        # .input, not .change: a preset or an opened session writes its budget note itself
        # (config_updates), and two more events at every page load cost the browser more than
        # the note (Gradio redoes every component's loading status per event)
        self.ui.prompt.input(self.on_budget, budget_inputs, [self.ui.max_new], show_progress="hidden",
                             trigger_mode="always_last")
        self.ui.max_new.input(self.on_budget, budget_inputs, [self.ui.max_new], show_progress="hidden",
                              trigger_mode="always_last")

    def wire_load(self, demo: gr.Blocks) -> None:
        """Attach the page-load events of the setup: the owner key and the model status."""
        # The owner key, from the browser alone (no server round trip).
        demo.load(None, None, [self.ui.owner_key], js=page_js("owner.js"), show_progress="hidden")
        # Warm the model cache as soon as the page opens, so the first Run starts at once.
        model_in, model_out = self.model_io()
        demo.load(self.on_model, model_in, model_out, show_progress="minimal", **model_event_settings())

    def model_io(self) -> tuple[list[Any], list[Any]]:
        """Inputs and outputs of :meth:`on_model`: the page's model, prompt and budget, and the
        remote-code opt-in where the page has one; its status, budget and chat help line."""
        ins = [self.ui.model, self.ui.model_path, self.ui.prompt, self.ui.max_new]
        if self.ui.trust_remote_code is not None:
            ins.append(self.ui.trust_remote_code)
        return ins, [self.ui.model_status, self.ui.max_new, self.ui.chat]

    # ================================================================== update builders
    def config_updates(self, page: dict[str, Any], preset: str | None = None) -> dict[Any, Any]:
        """Updates that show ``page`` (from :func:`state.preset_page`/:func:`state.session_page`)."""
        lanes: list[st.LaneConfig] = page["lanes"][: self.ui.max_lanes]
        n = max(len(lanes), 1)
        nonce = time.time_ns()
        up: dict[Any, Any] = {
            self.ui.model: gr.update(value=page["model"]), self.ui.model_path: "", self.ui.prompt: page["prompt"],
            self.ui.seed: page["seed"],
            # with the budget note its prompt leaves (the box's listeners hear user edits only)
            self.ui.max_new: {**self.on_budget(page["model"], "", page["prompt"], page["max_new_tokens"])[self.ui.max_new],
                              "value": page["max_new_tokens"]},
            self.ui.policy: page.get("policy", "forwards"), self.ui.lane_count: n,
            # the preset the page shows, in the box too (none for a stored session: picking the
            # last preset then applies it, see on_preset)
            self.ui.preset: preset, self.ui.preset_state: preset,
            self.ui.preset_info: md_text(page.get("description", "")),
        }
        if "metric" in page:
            up[self.ui.metric] = page["metric"]
        if "watch" in page:  # a stored session's watched tokens; a preset leaves the field as typed
            up[self.ui.watch] = page["watch"]
        up.update(mo.option_updates(self.ui, page))
        for j, ui in enumerate(self.ui.lanes):
            if j < len(lanes):
                cfg = lanes[j]
                spec = st.decoder_spec(cfg.decoder)
                knobs = {**st.default_knobs(cfg.decoder), **cfg.params}
                up.update({
                    ui.column: gr.update(visible=True),
                    ui.decoder: gr.update(value=cfg.decoder) if spec else gr.update(value=None),
                    ui.model: cfg.model or st.SAME_MODEL,
                    ui.draft: gr.update(value=cfg.draft or st.DEFAULT_DRAFT, visible=st.needs_draft(cfg.decoder)),
                    ui.info: st.decoder_info_md(cfg.decoder, knobs), ui.knobs: knobs,
                    ui.nonce: knob_nonce(cfg.decoder, nonce + j),
                })
            else:
                up[ui.column] = gr.update(visible=False)
        up.update(self.count_buttons(n))
        return up

    def not_run(self, n: int, message: str) -> dict[Any, Any]:
        """Lanes ``1..n`` after a run that was refused or failed before they started: the
        reason in red in each (never a lasting "Starting…"), no stats, and no session: what the
        previous run left (its traces, its share link) is not this page's any more."""
        return {self.ui.traces: [], self.ui.shown: secrets.token_hex(8), self.ui.sid: None,
                **{ui.output: error_html(message) + empty_output(ui.k, "Not run.") for ui in self.ui.lanes[:n]},
                **{ui.stats: stats_html("") for ui in self.ui.lanes[:n]},
                **{ui.insp_header: f'<div class="lane-title">Lane {ui.k}</div>' for ui in self.ui.lanes[:n]}}

    def count_buttons(self, n: int) -> dict[Any, Any]:
        """"+ Lane" and "− Lane" enabled only where they can do something at ``n`` lanes."""
        can_add, can_remove = st.lane_buttons(n, self.ui.max_lanes)
        return {self.ui.add_btn: gr.update(interactive=can_add), self.ui.remove_btn: gr.update(interactive=can_remove)}

    # ================================================================== handlers
    def on_preset(self, name: str, shown: Any = None) -> dict[Any, Any]:
        """Apply the preset picked; nothing (``{}``) when it is the preset the page shows
        already (``shown``) or the box is empty.

        Gradio reports one pick by mouse twice and every blur of the box (tabbing through it,
        clicking away) as a pick of the preset it shows. Applied again, every lane's run and
        edited knobs were wiped and every lane rendered its knob controls a second time: an
        edit typed into a knob meanwhile went to controls the second render had replaced (and
        was lost). So, as with a dropdown's unchanged value, picking the preset the page shows
        changes nothing: pick another, or open a stored session, and it applies again."""
        if not isinstance(name, str) or not name:
            return {}  # an empty box left (a stored session's page): nothing picked
        if name == shown:
            return {}
        try:
            page = st.preset_page(name)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return {self.ui.status: status_html(str(e), "error")}
        up = self.config_updates(page, preset=name)
        missing = [c.decoder for c in page["lanes"] if st.decoder_spec(c.decoder) is None]
        msg = f"Preset “{page['title']}” loaded — press Run."
        if len(page["lanes"]) > self.ui.max_lanes:
            msg += f" (only its first {self.ui.max_lanes} lanes: this instance allows {self.ui.max_lanes})"
        if missing:
            msg += f" (decoders not available here: {', '.join(missing)})"
        up[self.ui.status] = status_html(msg)
        lanes = page["lanes"][: self.ui.max_lanes]
        up.update(reset_all(self.ui, max(len(lanes), 1), [c.decoder for c in lanes]))
        return up

    def on_model_picked(self, traces: list[dict[str, Any]] | None, n: Any) -> dict[Any, Any]:
        """The user picked another page model: every lane's run is cleared (nothing to do
        when the page shows none)."""
        if not traces:
            return {}
        up = reset_all(self.ui, int(n or 0) or len(traces))
        up[self.ui.status] = status_html("The model changed: press Run to race the lanes on it.")
        return up

    def lane_changed(self, j: int, decoder: str, traces: list[dict[str, Any]] | None, n: Any,
                     what: str = "") -> dict[Any, Any]:
        """Lane ``j`` (0-based) was set up anew (to run ``decoder``; ``what`` changed): it is
        cleared to its "Press Run" state (:func:`lane_reset.reset_lanes`), and the status
        line says so in place of whatever it said about the page before."""
        up = reset_lanes(self.ui, traces, {j: decoder or ""}, max(int(n or 0), j + 1))
        change = f" ({what})" if what else ""
        up[self.ui.status] = status_html(f"Lane {j + 1} changed{change}: press Run to race the lanes.")
        return up

    def on_lane_decoder(self, j: int, decoder: str, page_model: str, lane_model: str, draft: str | None,
                        traces: list[dict[str, Any]] | None, n: Any, nonce: Any = None) -> dict[Any, Any]:
        """Lane ``j``'s decoder was picked: its setup (:meth:`on_decoder`) and the lane cleared.

        Picking the decoder the lane's knobs are already set up for changes nothing: Gradio's
        dropdown sends one mouse pick twice (see :meth:`on_preset`), and the second knob
        render replaced the controls the first had drawn — an edit typed in between reached
        the server for an event that no longer existed, and was lost."""
        ui = self.ui.lanes[j]
        if isinstance(nonce, dict) and nonce.get("decoder") == decoder:
            return {}
        setup = self.on_decoder(decoder, page_model, lane_model, draft)
        return {**dict(zip([ui.knobs, ui.nonce, ui.draft, ui.info, ui.model], setup)),
                **self.lane_changed(j, decoder, traces, n, f"decoder {decoder}")}

    def on_lane_setup(self, j: int, decoder: str, traces: list[dict[str, Any]] | None, n: Any) -> dict[Any, Any]:
        """Lane ``j``'s own model or draft changed: the lane is cleared."""
        return self.lane_changed(j, decoder, traces, n, "its model")

    def on_knob(self, j: int, comp: Any, name: str, spec: dict[str, Any], value: Any,
                knobs: dict[str, Any] | None, decoder: str, traces: list[dict[str, Any]] | None,
                n: Any) -> dict[Any, Any]:
        """A knob control ``comp`` of lane ``j`` was edited: the value held as typed
        (:func:`_set_knob`) and the lane cleared; nothing when the control shows the value the
        lane holds already."""
        held = knobs if isinstance(knobs, dict) else {}
        if name in held and held[name] == value:
            return {}  # the value held already (Enter or leaving the box after the edit was held)
        ui = self.ui.lanes[j]
        new, info, control = _set_knob(name, spec, value, knobs, decoder)
        return {ui.knobs: new, ui.info: info, comp: control,
                **self.lane_changed(j, decoder, traces, n, f"{name} = {value}")}

    def on_model(self, model: str, path: str, prompt: str = "", max_new: Any = None,
                 trust_remote_code: bool = False) -> dict[Any, Any]:
        """Load (or find in the cache) the picked model, showing what it is, whether it has a
        chat template and the new-token budget its context leaves after the prompt. A model
        that needs its own code is not loaded until the remote-code opt-in is ticked."""
        spec = (path or "").strip() or (model or "").strip()
        if not spec:
            return {self.ui.model_status: "", self.ui.max_new: gr.update(info=None), self.ui.chat: gr.update(info=mo.CHAT_INFO)}
        if limits().no_models:
            return {self.ui.model_status: status_html("Replay-only instance: models are not loaded here; shared "
                                                   "sessions still open.", "info")}
        trust = mo.page_options(trust_remote_code=trust_remote_code)["trust_remote_code"]
        try:
            mo.check_remote_code([spec], trust)
            # conftest's stand-in loader takes the spec alone: the opt-in is passed only when ticked
            handle = _load(spec, trust_remote_code=True) if trust else _load(spec)
        except PlaygroundError as e:
            gr.Warning(str(e))
            return {self.ui.model_status: status_html(str(e), "error"), self.ui.max_new: gr.update(info=None),
                    self.ui.chat: gr.update(info=mo.CHAT_INFO)}
        st.remember_model(spec, handle)
        nparams = sum(p.numel() for p in handle.model.parameters())
        return {self.ui.model_status: status_html(f"✓ {handle.name} · {handle.kind} · {human(nparams)} parameters · "
                                               f"context {handle.context_length} tokens", "ok"),
                self.ui.chat: gr.update(info=mo.chat_template_note(handle)),
                **self.on_budget(model, path, prompt, max_new)}

    def on_budget(self, model: str, path: str, prompt: str, max_new: Any) -> dict[Any, Any]:
        """Show under max new tokens what the model's context leaves after the prompt (and
        say so when the value is over it); nothing when the model is not loaded yet."""
        spec = (path or "").strip() or (model or "").strip()
        b = st.page_budget(spec, prompt or "")
        if b is None:
            return {self.ui.max_new: gr.update(info=None)}
        lim = limits().max_new_tokens
        note = st.budget_note(b["model"], b["context"], b["prompt_tokens"], lim)
        try:
            st.check_budget(int(float(max_new)), b["model"], b["context"], b["prompt_tokens"], lim)
        except PlaygroundError as e:
            note = f"⚠ {e}"
        except (TypeError, ValueError):
            pass  # not a number: the Run check says so
        return {self.ui.max_new: gr.update(info=note)}

    def on_add(self, n: int, model: str = "", path: str = "",
               traces: list[dict[str, Any]] | None = None) -> dict[Any, Any]:
        """Show one more lane, set up with a decoder the page's model can run and cleared (a
        lane shown again may still hold an older run); at the limit, say so."""
        n0 = int(n or 0)
        n, note = st.add_lane(n0, self.ui.max_lanes)
        up: dict[Any, Any] = {self.ui.lane_count: n, **self.count_buttons(n)}
        up.update({ui.column: gr.update(visible=j < n) for j, ui in enumerate(self.ui.lanes)})
        if note:
            gr.Info(note)
            up[self.ui.status] = status_html(note)
            return up
        spec = (path or "").strip() or (model or "").strip()
        cfg = st.new_lane(spec, page_kind=st.loaded_kind(spec))
        ui = self.ui.lanes[n - 1]
        up.update({ui.decoder: gr.update(value=cfg.decoder), ui.knobs: dict(cfg.params), ui.nonce: knob_nonce(cfg.decoder),
                   ui.info: st.decoder_info_md(cfg.decoder, cfg.params), ui.model: st.SAME_MODEL,
                   ui.draft: gr.update(value=cfg.draft or st.DEFAULT_DRAFT, visible=st.needs_draft(cfg.decoder)),
                   self.ui.status: status_html(f"Lane {n} added ({cfg.decoder})." + _limit_note(n, self.ui.max_lanes))})
        up.update(reset_lanes(self.ui, traces, {n - 1: cfg.decoder}, n))
        return up

    def on_remove(self, n: int, traces: list[dict[str, Any]] | None = None) -> dict[Any, Any]:
        """Hide the last lane, and its run from the traces and the inspector; at the limit
        (two lanes), say so."""
        n, note = st.remove_lane(int(n or 0))
        up: dict[Any, Any] = {self.ui.lane_count: n, **self.count_buttons(n), **reset_lanes(self.ui, traces, {}, n)}
        up.update({ui.column: gr.update(visible=j < n) for j, ui in enumerate(self.ui.lanes)})
        if note:
            gr.Info(note)
            up[self.ui.status] = status_html(note)
        else:
            up[self.ui.status] = status_html(f"Lane {n + 1} removed." + _limit_note(n, self.ui.max_lanes))
        return up

    def on_decoder(self, decoder: str, page_model: str, lane_model: str, draft: str | None = None) -> list[Any]:
        """A lane's decoder was picked: its default knobs (and a new nonce, which re-renders
        the knob controls for this decoder), the draft picker and the lane model."""
        lm = st.lane_model_for(decoder, page_model, None if lane_model == st.SAME_MODEL else lane_model)
        knobs = st.default_knobs(decoder)
        need = st.needs_draft(decoder)
        # A cleared draft box stays cleared (the Run refuses it); a fresh pick offers the bundled draft.
        draft_up = gr.update(visible=need, value=draft if draft not in (None, "") else st.DEFAULT_DRAFT) if need \
            else gr.update(visible=False)
        return [knobs, knob_nonce(decoder), draft_up, st.decoder_info_md(decoder, knobs), lm or st.SAME_MODEL]

    def default_page(self) -> dict[Any, Any]:
        """The page as a first visit shows it: the first preset that runs here."""
        up: dict[Any, Any] = {}
        names = [n for _t, n in st.preset_choices()]
        for name in [n for n in DEFAULT_PRESETS if n in names] + names:
            try:
                page = st.preset_page(name)
            except PlaygroundError:
                continue
            if all(st.decoder_spec(c.decoder) for c in page["lanes"]) and 2 <= len(page["lanes"]) <= self.ui.max_lanes \
                    and _models_present(page):
                up = self.config_updates(page, preset=name)
                break
        else:
            page = {"model": st.DEFAULT_MODEL, "prompt": st.EXAMPLE_PROMPTS[0], "seed": 0, "max_new_tokens": 48,
                    "lanes": [st.LaneConfig("greedy"), st.LaneConfig("greedy")]}
            up = self.config_updates(page)
        for ui in self.ui.lanes[: up.get(self.ui.lane_count, 2)]:
            up[ui.output] = empty_output(ui.k)
        up[self.ui.status] = status_html("Press Run to race the lanes. Pick another preset or change any lane.")
        up.update(self.ui.idle_buttons())
        return up

    def open_session(self, sid: Any) -> dict[Any, Any]:
        """Replay a stored session: text, colours, stats, scrubber and every plot, no model (a
        blind comparison is refused: this path has no owner key)."""
        try:
            session = default_store().load_session(str(sid))
            blind.check_readable(default_store(), session["id"], None)
        except PlaygroundError as e:
            up = self.default_page()
            msg = f"Could not open the shared session: {e}."
            gr.Warning(msg)
            up[self.ui.status] = status_html(msg, "error")
            return up
        page = st.session_page(session)
        up = self.config_updates(page)
        how = mo.options_note(page["chat"], page["system_prompt"] or None)
        up[self.ui.preset_info] = md_text(f"Replaying stored session **{st._md_escape(session['title'])}** "
                                       f"({session['created'][:16].replace('T', ' ')} UTC) — no model loaded."
                                       + (f" {st._md_escape(how)}" if how else ""))
        runs = page["runs"]
        up.update(self.inspector.result_updates(runs, page["metric"], step=None, sid=session["id"],
                                      status=status_html(f"Replaying “{session['title']}”: {len(runs)} lanes, "
                                                         f"stored {session['created'][:10]}. Press Run to run it again.",
                                                         "ok")))
        up.update(self.ui.idle_buttons())
        up[self.ui.share_link] = ""
        return up


def _set_knob(name: str, spec: dict[str, Any], value: Any, knobs: dict[str, Any] | None,
              decoder: str) -> tuple[dict[str, Any], str, Any]:
    """A knob control was edited: hold exactly what it shows, and say next to it when the
    run would refuse that value (its help line turns into the one-line reason)."""
    new = {**(knobs or {}), name: value}
    err = st.knob_error(decoder, name, value) if st.decoder_spec(decoder) else None
    return new, st.decoder_info_md(decoder, new), gr.update(info=st.knob_info(spec, err) or None)


def _edit_triggers(comp: Any) -> list[Any]:
    """The events by which a knob control reports the user's edit: its input, and where the
    control has them, Enter (submit) and leaving it (blur)."""
    return [comp.input] + [getattr(comp, e) for e in ("submit", "blur") if hasattr(comp, e)]


def _limit_note(n: int, max_lanes: int) -> str:
    """What the lane buttons can no longer do at ``n`` lanes (why one is now disabled)."""
    if n >= max_lanes:
        return f" {max_lanes} lanes is the most this page runs side by side."
    if n <= st.MIN_LANES:
        return f" A comparison needs at least {st.MIN_LANES} lanes."
    return ""


_WIDGETS: dict[str, Callable[..., Any]] = {
    "slider": gr.Slider, "number": gr.Number, "checkbox": gr.Checkbox, "dropdown": gr.Dropdown,
    "textbox": gr.Textbox,
}


def _load(spec: str, trust_remote_code: bool = False) -> Any:
    return load_model(spec, trust_remote_code=trust_remote_code)


def _models_present(page: dict[str, Any]) -> bool:
    """Whether the bundled models a page names are installed (other specs are assumed loadable)."""
    names = {page["model"]} | {c.model for c in page["lanes"] if c.model} | {c.draft for c in page["lanes"] if c.draft}
    return all((BUNDLED_DIR / n / "config.json").exists() for n in names if n in BUNDLED)
