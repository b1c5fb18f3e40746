"""A lane whose setup changes is cleared to its "Press Run" state, through the Compare page's
handlers (no browser): a preset, a decoder, a knob, a lane's model, the page model and + Lane
clear what the lane shows and what the page keeps of its run, so neither the lane card nor a
scrub or token click shows the old lane under its new label; − Lane drops the hidden lane from
the inspector. Each handler updates only its event's outputs (Gradio rejects others), one
event per change."""

from __future__ import annotations

import pytest

from playground.ui import rules as st
from playground.ui.lane_reset import cleared_trace, reset_lanes
from playground.ui.scrubber import Scrubber
from playground.ui.updates import is_cleared
from test_ui_lanes import prop, run_args, text  # the page's Run inputs and update readers, as there

pytestmark = pytest.mark.slow  # building the Gradio app imports gradio (~10 s on a busy CPU)


@pytest.fixture(scope="module")
def page(demo):
    return demo.compare_page


def outputs_of(demo, comp, event):
    fns = [fn for fn in demo.fns.values() if (comp._id, event) in [tuple(t) for t in fn.targets]]
    assert fns, (comp.elem_id, event)
    return [{b._id for b in fn.outputs} for fn in fns]


def only_outputs(demo, up, comp, event):
    """The reply updates nothing its event does not list, in one event (not one per lane)."""
    outs = outputs_of(demo, comp, event)
    assert len(outs) == 1, f"{comp.elem_id}.{event} fires {len(outs)} events"
    assert {c._id for c in up} <= outs[0]


@pytest.fixture()
def ran(page, tiny, db):
    """A finished three-lane comparison (greedy, top_p, greedy): the Done frame."""
    lanes = [("greedy", {}, None), ("top_p", st.default_knobs("top_p"), None), ("greedy", {}, None)]
    final = list(page.on_run(None, *run_args(page, lanes)))[-1]
    assert all(t.get("steps") for t in final[page.traces])
    return final


def assert_press_run(page, up, j):
    ui = page.lanes[j]
    assert "Press Run" in text(up, ui.output) and "tok-empty" in text(up, ui.output)
    assert text(up, ui.stats) == '<div class="lane-stats">—</div>'
    assert "press Run" in text(up, ui.insp_header)
    for comp in [ui.step_html, *ui.step_plots, ui.run_html, *ui.run_plots]:
        assert prop(up, comp, "visible") is False


def test_a_preset_clears_every_lane_its_traces_and_the_inspector(demo, page, ran):
    up = page.on_preset("greedy-beam-sampling")
    only_outputs(demo, up, page.preset, "input")
    n = up[page.lane_count]
    for j in range(page.max_lanes):
        assert_press_run(page, up, j)
        assert prop(up, page.lanes[j].insp_column, "visible") is (j < n)
    assert up[page.traces] == [] and up[page.sid] is None and up[page.share_link] == ""
    assert prop(up, page.step, "maximum") == 1 and prop(up, page.step, "value") == 0
    assert up[page.progress_plot] is None and "press Run" in up[page.divergence]
    # the labels are the preset's: lane 2 is the beam lane, not the previous run's top_p
    assert "beam" in text(up, page.lanes[1].insp_header)


def test_a_decoder_change_clears_that_lane_and_keeps_the_others(demo, page, ran):
    traces = ran[page.traces]
    up = page.config.on_lane_decoder(1, "beam", "tiny-llama", st.SAME_MODEL, None, traces, 3)
    only_outputs(demo, up, page.lanes[1].decoder, "input")
    assert_press_run(page, up, 1)
    assert "beam" in text(up, page.lanes[1].insp_header)
    assert page.lanes[0].output not in up and page.lanes[2].output not in up  # the others keep their run
    new = up[page.traces]
    assert new[0] is traces[0] and new[2] is traces[2] and is_cleared(new[1]) and not new[1]["steps"]
    assert up[page.sid] is None and up[page.share_link] == "" and up[page.progress_plot] is None
    assert up[page.lanes[1].knobs] == st.default_knobs("beam")
    assert "Lane 2 changed" in text(up, page.status)
    # a scrub or a token click on the page's traces never draws the old lane again
    step = page.step_updates(new, 2)
    assert "press Run" in text(step, page.lanes[1].insp_header)
    assert all(prop(step, c, "visible") is False for c in page.lanes[1].step_plots)
    assert "step 2 of" in text(step, page.lanes[0].insp_header)
    recol = page.on_metric("probability", new)
    assert "Press Run" in text(recol, page.lanes[1].output) and "Press Run" not in text(recol, page.lanes[0].output)


def test_a_knob_edit_clears_its_lane_in_the_same_event(demo, page, ran):
    traces = ran[page.traces]
    ui = page.lanes[1]
    spec = st.decoder_spec("top_p")["params"]["p"]
    marker = object()
    up = page.config.on_knob(1, marker, "p", spec, 0.5, st.default_knobs("top_p"), "top_p", traces, 3)
    assert up[ui.knobs]["p"] == 0.5 and marker in up
    assert_press_run(page, up, 1)
    assert is_cleared(up[page.traces][1]) and up[page.traces][0] is traces[0]
    assert "p = 0.5" in text(up, page.status)
    # the knob's event lists exactly these outputs (the control it edits aside)
    want = {c._id for c in [ui.knobs, ui.info, page.status] + page.lane_reset_outputs(1)}
    assert {c._id for c in up if c is not marker} <= want


def test_enter_or_leaving_a_knob_box_after_its_edit_changes_nothing(demo, page, ran):
    """A knob's Enter and blur send its value again (a second chance for an edit lost in a
    burst of re-renders); where the lane holds that value already, nothing is cleared."""
    spec = st.decoder_spec("top_p")["params"]["p"]
    held = {**st.default_knobs("top_p"), "p": 0.5}
    assert page.config.on_knob(1, object(), "p", spec, 0.5, held, "top_p", ran[page.traces], 3) == {}
    up = page.config.on_knob(1, object(), "p", spec, 0.6, held, "top_p", ran[page.traces], 3)
    assert up[page.lanes[1].knobs]["p"] == 0.6 and is_cleared(up[page.traces][1])


def test_a_lane_model_or_draft_change_clears_that_lane(demo, page, ran):
    up = page.config.on_lane_setup(2, "greedy", ran[page.traces], 3)
    for comp in (page.lanes[2].model, page.lanes[2].draft):
        only_outputs(demo, up, comp, "input")
    assert_press_run(page, up, 2)
    assert is_cleared(up[page.traces][2])


def test_the_page_model_picked_clears_every_lane(demo, page, ran):
    up = page.config.on_model_picked(ran[page.traces], 3)
    assert up[page.traces] == [] and all("Press Run" in text(up, ui.output) for ui in page.lanes)
    assert "model changed" in text(up, page.status)
    assert page.config.on_model_picked([], 3) == {}  # nothing shown: nothing to clear
    # only the user's pick clears (a preset or an opened session sets the model as well)
    assert outputs_of(demo, page.model, "input") and outputs_of(demo, page.model_path, "submit")


def test_add_lane_clears_the_lane_it_brings_back(demo, page, ran):
    traces = ran[page.traces]
    up = page.on_add(3, "tiny-llama", "", traces)
    only_outputs(demo, up, page.add_btn, "click")
    assert_press_run(page, up, 3)
    assert prop(up, page.lanes[3].insp_column, "visible") is True
    new = up[page.traces]
    assert len(new) == 4 and is_cleared(new[3]) and new[:3] == traces
    assert page.sid not in up  # no run was dropped: the stored comparison is still the page's
    # a lane added before any run: its card is cleared, there are no traces to touch
    up = page.on_add(3, "tiny-llama", "", [])
    assert "Press Run" in text(up, page.lanes[3].output) and page.traces not in up
    assert page.lanes[3].insp_column not in up  # the columns stay as the layout has them


def test_remove_lane_drops_the_hidden_lane_from_the_traces_and_the_inspector(demo, page, ran):
    traces = ran[page.traces]
    up = page.on_remove(3, traces)
    only_outputs(demo, up, page.remove_btn, "click")
    assert up[page.traces] == traces[:2]
    assert prop(up, page.lanes[2].insp_column, "visible") is False
    step = page.step_updates(up[page.traces], 1)
    assert prop(step, page.lanes[2].insp_column, "visible") is False


def test_changing_every_run_lane_leaves_no_traces(page):
    tr = [cleared_trace("greedy"), {"decoder": "greedy", "steps": [{}]}]
    up = reset_lanes(page, tr, {1: "beam"}, 2)
    assert up[page.traces] == []  # no run left: the page is as before any run
    # a lane already cleared: nothing of a run is dropped, so the comparison is not touched again
    up = reset_lanes(page, [cleared_trace("greedy"), {"decoder": "x", "steps": [{}]}], {0: "beam"}, 2)
    assert page.sid not in up and up[page.traces][0]["decoder"] == "beam"


def test_the_scrubber_takes_a_value_past_its_range_as_its_end():
    """A browser still holding step 31 of a longer run, after the range became 0..15, is
    at the last step, not Gradio's raw "Value 31 is greater than maximum value 15"."""
    s = Scrubber(0, 15, value=0, step=1)
    assert s.preprocess(31) == 15 and s.preprocess(-3) == 0 and s.preprocess(7) == 7
    assert s.get_block_name() == "slider"  # drawn by Gradio's own slider


def test_the_watermark_lane_picker_offers_the_lanes_the_comparison_has(demo, ran):
    from playground.ui.watermark_view import lane_choices

    traces = ran[demo.compare_page.traces]
    assert [k for _l, k in lane_choices(traces)] == [1, 2, 3]
    assert lane_choices(traces)[1][0] == "lane 2 · top_p"
    assert [k for _l, k in lane_choices([traces[0], cleared_trace("beam"), traces[2]])] == [1, 3]
    assert lane_choices([]) == [("lane 1", 1)]
    up = demo.watermark_view.on_lanes(traces[:2], 3)
    assert up["value"] == 1 and len(up["choices"]) == 2  # a lane no longer shown is not kept


def test_the_watermark_tab_asks_for_text_without_naming_a_cli_flag():
    from playground.core.errors import PlaygroundError
    from playground.ui.watermark_view import detect

    with pytest.raises(PlaygroundError) as e:
        detect("tiny-shakespeare", "", "", 0.25, "lefthash", "15485863", 1)
    assert "--" not in str(e.value) and "paste the text" in str(e.value)


def test_a_second_pick_of_the_decoder_the_knobs_are_set_for_changes_nothing(demo, page, ran):
    """Chromium sent one decoder pick twice; the second re-rendered the knob controls under an
    edit being typed, and the edit was lost. A pick of the decoder already set up is no change."""
    traces = ran[page.traces]
    ui = page.lanes[1]
    up = page.config.on_lane_decoder(1, "beam", "tiny-llama", st.SAME_MODEL, None, traces, 3, None)
    nonce = up[ui.nonce]
    assert nonce["decoder"] == "beam" and ui.knobs in up
    assert page.config.on_lane_decoder(1, "beam", "tiny-llama", st.SAME_MODEL, None, up[page.traces], 3, nonce) == {}
    other = page.config.on_lane_decoder(1, "top_p", "tiny-llama", st.SAME_MODEL, None, up[page.traces], 3, nonce)
    assert other[ui.nonce]["decoder"] == "top_p" and other[ui.nonce] != nonce  # a new decoder re-renders
    assert other[ui.knobs] == st.default_knobs("top_p")
    # a preset's nonce names its decoder too, so picking a lane's preset decoder again is no change
    pre = page.config.config_updates({"model": "tiny-llama", "prompt": "x", "seed": 0, "max_new_tokens": 4,
                                      "lanes": [st.LaneConfig("greedy"), st.LaneConfig("top_k")]})
    assert pre[ui.nonce]["decoder"] == "top_k"
    assert page.config.on_lane_decoder(1, "top_k", "tiny-llama", st.SAME_MODEL, None, traces, 2, pre[ui.nonce]) == {}
