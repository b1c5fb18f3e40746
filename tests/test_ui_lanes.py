"""Setting lanes up by hand, driven through the Compare page's handlers (no browser): a
hand-picked decoder gets its knobs, a refused knob says why next to its control, lane
limits, a new lane's decoder, the new-token budget, and a missing draft."""

from __future__ import annotations

import html

import pytest

from playground.ui import rules as st

pytestmark = pytest.mark.slow  # building the Gradio app imports gradio (~10 s on a busy CPU)


# demo, db, tiny: conftest.py
@pytest.fixture(scope="module")
def page(demo):
    """The Compare page object of the app (its handlers are called directly)."""
    return demo.compare_page


def run_args(page, lanes, prompt="ROMEO:", max_new=6, model="tiny-llama"):
    """The Run button's inputs: page settings, then (decoder, knobs, draft, lane model) per lane."""
    args = [model, "", prompt, 0, max_new, "forwards", "auto", len(lanes), None]
    for j in range(page.max_lanes):
        dec, knobs, draft = lanes[j] if j < len(lanes) else ("greedy", {}, None)
        args += [dec, knobs, draft, st.SAME_MODEL]
    return args


def text(up, comp) -> str:
    v = up.get(comp)
    v = v if isinstance(v, str) else (v.get("value") if isinstance(v, dict) else str(v))
    return html.unescape(str(v))


def prop(up, comp, name):
    v = up.get(comp)
    return v.get(name) if isinstance(v, dict) else None


def test_a_hand_picked_decoder_gets_its_own_knobs_and_a_render(page):
    knobs, nonce, draft, info, model = page.on_decoder("top_p", "tiny-shakespeare", st.SAME_MODEL, None)
    assert knobs == st.default_knobs("top_p") and "p" in knobs and "gamma" not in knobs
    knobs2, nonce2, draft, _info, _m = page.on_decoder("speculative", "tiny-shakespeare", st.SAME_MODEL, None)
    assert nonce2 != nonce  # a new nonce: the knob render runs again for the new decoder
    assert "gamma" in knobs2 and draft["visible"] is True and draft["value"] == st.DEFAULT_DRAFT
    # a cleared draft box is not refilled behind the user's back
    assert page.on_decoder("speculative", "tiny-shakespeare", st.SAME_MODEL, "")[2]["value"] == st.DEFAULT_DRAFT
    assert page.on_decoder("speculative", "tiny-shakespeare", st.SAME_MODEL, "other")[2]["value"] == "other"


def test_lane_setup_events_are_queued_so_their_renders_run(demo, page):
    """Gradio reports changed states (the nonce that triggers a knob render) only in a queued
    event's reply: a decoder pick sent with queue=False never re-rendered the knobs."""
    for comp, event in [(page.lanes[1].decoder, "input"), (page.add_btn, "click")]:
        fns = [fn for fn in demo.fns.values() if (comp._id, event) in [tuple(t) for t in fn.targets]]
        assert fns and all(fn.queue for fn in fns), (comp.elem_id, event)


def _outputs_of(demo, comp, event):
    fns = [fn for fn in demo.fns.values() if (comp._id, event) in [tuple(t) for t in fn.targets]]
    assert len(fns) >= 1
    return {b._id for fn in fns for b in fn.outputs}


def test_lane_count_handlers_only_update_their_events_outputs(demo, page):
    """Gradio rejects a reply that updates a component the event does not list (the page
    then silently stays as it was)."""
    for up, comp in [(page.on_add(2, "tiny-shakespeare", ""), page.add_btn),
                     (page.on_add(page.max_lanes, "tiny-shakespeare", ""), page.add_btn),
                     (page.on_remove(3), page.remove_btn), (page.on_remove(2), page.remove_btn)]:
        assert {c._id for c in up} <= _outputs_of(demo, comp, "click")


def test_a_refused_knob_says_why_next_to_its_control_and_is_held_as_typed():
    from playground.ui.lane_config import _set_knob

    spec = st.decoder_spec("speculative")["params"]["gamma"]
    knobs, info, control = _set_knob("gamma", spec, 100, st.default_knobs("speculative"), "speculative")
    assert knobs["gamma"] == 100  # held as typed: never clamped to 32, never replaced by 5
    assert control["info"] == "⚠ knob 'gamma'=100 is out of range [1, 32]"
    knobs, info, control = _set_knob("gamma", spec, 7, knobs, "speculative")
    assert knobs["gamma"] == 7 and not control["info"].startswith("⚠") and "[1, 32]" in control["info"]
    assert "gamma=7" in info


def test_lane_buttons_stop_at_the_limits_disabled_and_say_so(page):
    top = page.max_lanes
    up = page.on_add(top - 1, "tiny-shakespeare", "")
    assert up[page.lane_count] == top and prop(up, page.add_btn, "interactive") is False
    assert f"{top} lanes is the most" in text(up, page.status)  # why "+ Lane" is now disabled
    assert prop(up, page.remove_btn, "interactive") is True
    up = page.on_add(top, "tiny-shakespeare", "")
    assert up[page.lane_count] == top and f"{top} lanes is the most" in text(up, page.status)
    up = page.on_remove(3)
    assert up[page.lane_count] == 2 and prop(up, page.remove_btn, "interactive") is False
    assert "Lane 3 removed" in text(up, page.status) and "at least 2 lanes" in text(up, page.status)
    assert prop(up, page.lanes[2].column, "visible") is False
    up = page.on_remove(2)
    assert up[page.lane_count] == 2 and "at least 2 lanes" in text(up, page.status)


def test_a_lane_added_to_a_diffusion_page_gets_a_diffusion_decoder(page):
    up = page.on_add(2, st.DEFAULT_DIFFUSION, "")
    ui = page.lanes[2]
    dec = prop(up, ui.decoder, "value")
    assert st.decoder_spec(dec)["kind"] == "diffusion"
    assert up[ui.knobs] == st.default_knobs(dec) and ui.nonce in up
    assert prop(up, ui.column, "visible") is True
    assert prop(page.on_add(2, "tiny-shakespeare", ""), ui.decoder, "value") == "greedy"


def test_presets_set_the_lane_buttons_for_their_lane_count(page):
    up = page.on_preset("truncation-samplers")  # six lanes
    assert up[page.lane_count] == min(6, page.max_lanes)
    assert prop(up, page.add_btn, "interactive") is (page.max_lanes > 6)
    up = page.on_preset("greedy-beam-sampling")
    assert prop(up, page.add_btn, "interactive") is True and prop(up, page.remove_btn, "interactive") is True


def test_picking_the_preset_the_page_shows_changes_nothing(page):
    # Gradio reports one mouse pick twice, and every blur of the box as a pick of what it shows
    first = page.on_preset("greedy-beam-sampling", None)
    assert first[page.preset_state] == "greedy-beam-sampling" and page.lanes[2].nonce in first
    assert page.on_preset("greedy-beam-sampling", "greedy-beam-sampling") == {}  # no second render
    assert page.on_preset("", "greedy-beam-sampling") == {} and page.on_preset(None, None) == {}  # an empty box left
    assert page.on_preset(["greedy-beam-sampling"], None) == {}  # not a name: nothing picked
    # another preset applies, and so does this one once the page shows something else
    assert page.on_preset("truncation-samplers", "greedy-beam-sampling")[page.lane_count] > 3
    again = page.on_preset("greedy-beam-sampling", "truncation-samplers")
    assert again[page.lanes[2].knobs]["p"] == 0.9 and again[page.lanes[2].nonce] != first[page.lanes[2].nonce]
    assert "unknown preset" in text(page.on_preset("no-such-preset", None), page.status)


def test_max_new_tokens_shows_the_models_budget(page, tiny):
    up = page.on_model("tiny-llama", "", "ROMEO:", 8)
    left = tiny.context_length - len(tiny.encode("ROMEO:"))
    assert prop(up, page.max_new, "info").startswith(f"up to {min(left, 1024)} (")
    up = page.on_budget("tiny-llama", "", "ROMEO:", left + 1)
    assert prop(up, page.max_new, "info").startswith(f"⚠ max new tokens {left + 1} is over the budget of {left}")


def test_a_preset_or_session_writes_its_own_budget_note(page, tiny):
    # the box listens to user edits only: what a preset or opened session sets carries its note
    page.on_model("tiny-llama", "", "ROMEO:", 8)
    pg = st.preset_page("greedy-beam-sampling")
    pg = {**pg, "model": "tiny-llama", "prompt": "ROMEO:"}
    left = tiny.context_length - len(tiny.encode("ROMEO:"))
    up = page.config_updates({**pg, "max_new_tokens": 8})
    assert prop(up, page.max_new, "value") == 8
    assert prop(up, page.max_new, "info").startswith(f"up to {min(left, 1024)} (")
    up = page.config_updates({**pg, "max_new_tokens": left + 1})
    assert prop(up, page.max_new, "info").startswith(f"⚠ max new tokens {left + 1} is over the budget of {left}")


def test_a_run_beyond_the_budget_is_refused_before_anything_starts(page, tiny, db):
    page.on_model("tiny-llama", "", "ROMEO:", 8)
    left = tiny.context_length - len(tiny.encode("ROMEO:"))
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}, None)] * 2, max_new=left + 1)))
    assert len(frames) == 1 and f"over the budget of {left}" in text(frames[0], page.status)
    assert page.lanes[0].output not in frames[0]  # no lane was told it is starting


def test_an_empty_draft_is_refused_and_never_replaced_by_the_target(page, tiny, db):
    lanes = [("greedy", {}, None), ("speculative", st.default_knobs("speculative"), "")]
    final = list(page.on_run(None, *run_args(page, lanes)))[-1]
    out = text(final, page.lanes[1].output)
    assert "pick a draft model" in out and 'class="lane-error"' in out
    traces = final[page.traces]
    assert not traces[1].get("steps") and traces[1].get("extra", {}).get("draft") is None
    assert len(traces[0]["output_ids"]) == 6  # the other lane ran


def test_the_knob_value_set_is_the_value_the_run_used(page, tiny, db):
    lanes = [("greedy", {}, None), ("top_p", {**st.default_knobs("top_p"), "p": 0.42}, None)]
    final = list(page.on_run(None, *run_args(page, lanes)))[-1]
    assert final[page.traces][1]["params"]["p"] == 0.42
    out = text(final, page.lanes[1].output)
    assert "lane-error" not in out


def test_an_out_of_range_knob_is_refused_not_clamped(page, tiny, db):
    lanes = [("greedy", {}, None), ("speculative", {**st.default_knobs("speculative"), "gamma": 100}, "d")]
    final = list(page.on_run(None, *run_args(page, lanes)))[-1]
    assert "knob 'gamma'=100 is out of range [1, 32]" in text(final, page.lanes[1].output)
    assert not final[page.traces][1].get("steps")


def test_lanes_align_by_token_position_or_by_step(page, tiny, db):
    from playground.ui import align

    lanes = [("greedy", {}, None), ("beam", st.default_knobs("beam"), None)]
    traces = list(page.on_run(None, *run_args(page, lanes, max_new=6)))[-1][page.traces]
    greedy, beam = (align.position_steps(t) for t in traces)
    assert greedy == list(range(len(greedy))) and len(greedy) == 6
    up = align.on_align(page, "position", traces)
    assert prop(up, page.position, "visible") is True and prop(up, page.step, "visible") is False
    up = align.on_position(page, 2, traces)
    h1, h2 = (text(up, page.lanes[j].insp_header) for j in (0, 1))
    assert "token 2" in h1 and "step 2 of" in h1
    # beam search commits its text when it ends: position 2 is its last step, not its step 2
    assert f"step {beam[2]} of" in h2 and beam[2] != 2
    up = align.on_align(page, "step", traces)
    assert prop(up, page.step, "visible") is True and prop(up, page.position, "visible") is False
    # a token click under position alignment moves the position scrubber to that token
    up = align.at_position(page, traces, 4)
    assert prop(up, page.position, "value") == 4 and "token 4" in text(up, page.lanes[1].insp_header)
    class Click:  # what TOKEN_CLICK_JS sends: the token's step, lane and place in the output
        _data = {"step": greedy[3], "lane": 1, "pos": 3}

    up = page.on_token(traces, "position", Click(), None)
    assert prop(up, page.position, "value") == 3 and "token 3" in text(up, page.lanes[0].insp_header)
    up = page.on_token(traces, "step", Click(), None)
    assert page.position not in up and "step 3 of" in text(up, page.lanes[0].insp_header)
    rng = align.position_range(page, traces)[page.position]
    assert rng["maximum"] == 5 and rng["value"] == 5


def test_a_run_no_lane_could_start_leaves_every_lane_saying_why(page, tiny, db):
    lanes = [("speculative", st.default_knobs("speculative"), "")] * 2
    frames = list(page.on_run(None, *run_args(page, lanes)))
    final = frames[-1]
    assert "pick a draft model" in text(final, page.status) and "pg-status-error" in text(final, page.status)
    for j in (0, 1):
        out = text(final, page.lanes[j].output)
        assert "lane-error" in out and "pick a draft model" in out and "Starting" not in out
    assert prop(final, page.run_btn, "interactive") is True


def test_a_run_with_a_failed_lane_is_not_a_green_done(page, tiny, db):
    lanes = [("greedy", {}, None), ("top_p", {"p": 2.0}, None)]
    status = text(list(page.on_run(None, *run_args(page, lanes)))[-1], page.status)
    assert status.startswith('<div class="pg-status pg-status-error">Done') and "Lane 2 failed" in status
    status = text(list(page.on_run(None, *run_args(page, [("greedy", {}, None)] * 2)))[-1], page.status)
    assert "pg-status-ok" in status and "failed" not in status
