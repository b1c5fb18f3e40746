"""The Compare page's rules as plain data: knob widgets, page checks, sessions, metrics."""

from __future__ import annotations

import math

import pytest

from playground.core.errors import PlaygroundError
from playground.ui import rules as st


def test_knob_widgets_follow_the_spec():
    # numbers are number boxes with no bounds or precision (nothing clamps or rounds in the
    # browser), the range in the help line
    assert st.knob_widget("p", {"type": "float", "default": 0.9, "min": 0.0, "max": 1.0, "help": "mass"}) == \
        st.KnobWidget("number", {"label": "p", "info": "mass · [0, 1]", "value": 0.9, "step": 0.001})
    w = st.knob_widget("k", {"type": "int", "default": 50, "min": 0, "max": 1000000, "help": ""})
    assert w.widget == "number" and w.kwargs["step"] == 1 and w.kwargs["info"] == "[0, 1000000]"
    assert not {"minimum", "maximum", "precision"} & set(w.kwargs)
    w = st.knob_widget("n", {"type": "int", "default": 4, "min": 1, "max": 64, "help": "beams"}, value=100)
    assert w.kwargs["value"] == 100  # shown as held, even out of range (the page says why it is refused)
    w = st.knob_widget("t", {"type": "float", "default": 1.0, "min": 0.0, "max": math.inf, "help": ""})
    assert w.widget == "number" and w.kwargs["info"] == "[0, inf]"
    assert st.knob_widget("t", {"type": "float", "default": 1.0, "min": 0, "max": 1, "help": ""}, "x").kwargs["value"] is None
    assert st.knob_widget("b", {"type": "bool", "default": True, "help": ""}).widget == "checkbox"
    w = st.knob_widget("c", {"type": "choice", "default": "a", "choices": ["a", "b"], "help": "pick"})
    assert w.widget == "dropdown" and w.kwargs["choices"] == ["a", "b"] and w.kwargs["info"] == "pick"
    assert st.knob_widget("s", {"type": "str", "default": "x,y", "help": ""}).widget == "textbox"
    assert st.knob_info({"type": "int", "min": 1, "max": 32}, error="knob 'gamma'=100 is out of range [1, 32]") \
        == "⚠ knob 'gamma'=100 is out of range [1, 32]"


def test_every_registered_knob_maps_to_a_widget():
    for name, spec in st.decoder_specs().items():
        for knob, p in spec["params"].items():
            w = st.knob_widget(knob, p)
            assert w.widget in ("slider", "number", "checkbox", "dropdown", "textbox"), (name, knob)


def test_coerce_knobs_restores_ints_and_drops_stale_knobs():
    assert st.coerce_knobs("greedy", {"p": 0.5}) == {}
    assert st.decoder_spec("top_k") is not None
    out = st.coerce_knobs("top_k", {"k": 40.0, "temperature": 0.7, "gone": 1})
    assert out == {"k": 40, "temperature": 0.7} and isinstance(out["k"], int)
    # a refused value is kept as given (the lane check refuses it), never clamped
    assert st.coerce_knobs("top_k", {"k": 0, "temperature": -1.0}) == {"k": 0, "temperature": -1.0}


@pytest.mark.parametrize("args, message", [
    (("m", "", 0, 10), "prompt is empty"),
    (("m", "   ", 0, 10), "prompt is empty"),
    (("", "hi", 0, 10), "pick a model"),
    (("m", "hi", "x", 10), "seed must be an integer"),
    (("m", "hi", 0, 0), "positive integer"),
    (("m", "hi", 0, 2.5), "positive integer"),
])
def test_page_checks_are_one_line_errors(args, message):
    with pytest.raises(PlaygroundError, match=message):
        st.check_page(*args, lanes=[st.LaneConfig("greedy")])


def test_hosting_limits_are_enforced(monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MAX_NEW_TOKENS", "16")
    monkeypatch.setenv("PLAYGROUND_MAX_LANES", "2")
    monkeypatch.setenv("PLAYGROUND_MAX_PROMPT_CHARS", "5")
    with pytest.raises(PlaygroundError, match="limit of 16"):
        st.check_page("m", "hi", 0, 17, [st.LaneConfig()])
    with pytest.raises(PlaygroundError, match="limit of 2"):
        st.check_page("m", "hi", 0, 8, [st.LaneConfig()] * 3)
    with pytest.raises(PlaygroundError, match="limit here is 5"):
        st.check_page("m", "too long", 0, 8, [st.LaneConfig()])
    assert st.check_page("m", "hi", "3", 8.0, [st.LaneConfig()] * 2) == (3, 8)


def test_lane_request_drops_the_draft_of_a_decoder_that_needs_none():
    cfg = st.LaneConfig("greedy", {}, draft="tiny-shakespeare-draft", model=None)
    req = st.lane_request(cfg, "tiny-shakespeare", "hi", 1, 8)
    assert req == {"model": "tiny-shakespeare", "decoder": "greedy", "prompt": "hi", "max_new_tokens": 8,
                   "seed": 1, "draft": None, "params": {}, "chat": False, "system_prompt": None,
                   "trust_remote_code": False}
    cfg = st.LaneConfig("greedy", {}, model="other")
    assert st.lane_request(cfg, "tiny-shakespeare", "hi", 1, 8)["model"] == "other"


def test_lane_model_follows_the_decoder_kind():
    diffusion = [n for n, s in st.decoder_specs().items() if s["kind"] == "diffusion"]
    assert st.lane_model_for("greedy", "tiny-shakespeare", None) is None
    if diffusion:
        assert st.lane_model_for(diffusion[0], "tiny-shakespeare", None) == st.DEFAULT_DIFFUSION
        assert st.lane_model_for("greedy", st.DEFAULT_DIFFUSION, None) == st.DEFAULT_MODEL
    assert st.lane_model_for("greedy", "some/hub-model", "x") == "x"  # unknown kinds are left alone


def test_session_settings_round_trip_to_page_values():
    lanes = [st.LaneConfig("greedy"), st.LaneConfig("top_k", {"k": 5}, model="tiny-shakespeare")]
    settings = st.session_settings("tiny-shakespeare", 3, 20, "steps", "entropy", lanes, preset="p")
    runs = [{"decoder": "greedy", "params": {}, "seed": 3, "stats": {"new_tokens": 20}},
            {"decoder": "top_k", "params": {"k": 5}, "seed": 3, "stats": {"new_tokens": 20}}]
    page = st.session_page({"title": "t", "model": "tiny-shakespeare", "prompt": "hi", "settings": settings,
                            "runs": runs})
    assert page["lanes"] == lanes and page["seed"] == 3 and page["max_new_tokens"] == 20
    assert page["policy"] == "steps" and page["metric"] == "entropy" and page["prompt"] == "hi"


def test_session_page_recovers_lanes_from_traces_when_settings_are_missing():
    runs = [{"decoder": "greedy", "params": {}, "seed": 5, "model": "m", "stats": {"new_tokens": 7}},
            {"decoder": "top_p", "params": {"p": 0.5}, "seed": 5, "model": "m", "draft": None, "stats": {}}]
    page = st.session_page({"title": "t", "model": "m", "prompt": "hi", "settings": {}, "runs": runs})
    assert [c.decoder for c in page["lanes"]] == ["greedy", "top_p"]
    assert page["lanes"][1].params == {"p": 0.5} and page["seed"] == 5 and page["max_new_tokens"] == 7


def test_auto_metric_suits_the_trace():
    assert st.auto_metric({"steps": [{"kind": "token"}]}, "auto") == "probability"
    assert st.auto_metric({"steps": [{"kind": "draft"}]}, "auto") == "acceptance"
    assert st.auto_metric({"steps": [{"kind": "denoise"}]}, "auto") == "unmask_step"
    assert st.auto_metric({"steps": []}, "entropy") == "entropy"


def test_share_url_and_titles():
    assert st.share_url("http://127.0.0.1:7860/", "abc") == "http://127.0.0.1:7860/?session=abc"
    lanes = [st.LaneConfig("greedy"), st.LaneConfig("beam")]
    assert st.session_title(lanes) == "greedy vs beam"
    assert st.session_title(lanes, "Preset") == "Preset"


def test_knob_summary_lists_only_changed_knobs_and_is_escaped():
    assert st.decoder_spec("top_k") is not None
    assert st.knob_summary("top_k", st.default_knobs("top_k")) == ""
    assert st.knob_summary("top_k", {"k": 20, "temperature": 1.0}) == "k=20"
    info = st.decoder_info_md("top_k", {"k": 20})
    assert info.endswith("**k=20**")
    assert "<" not in st.decoder_info_md("<script>")


# ---------------------------------------------------------------------- knob values reach the run as shown
@pytest.mark.parametrize("decoder, knobs, message", [
    ("speculative", {"gamma": 100}, "lane 2 (speculative): knob 'gamma'=100 is out of range [1, 32]"),
    ("top_p", {"temperature": -1.0}, "lane 2 (top_p): knob 'temperature'=-1 is out of range [0, 10]"),
    ("top_p", {"p": "abc"}, "lane 2 (top_p): knob 'p' must be a number, got 'abc'; allowed: [0, 1]"),
    ("top_k", {"k": 5.5}, "lane 2 (top_k): knob 'k' must be an integer, got 5.5; allowed: [1, 1000000]"),
    ("top_p", {"p": None}, "knob 'p' must be a number, got None; allowed: [0, 1]"),
    ("beam", {"early_stopping": "maybe"}, "knob 'early_stopping'='maybe' is not one of:"),
])
def test_a_refused_knob_names_the_lane_the_knob_and_its_range(decoder, knobs, message):
    with pytest.raises(PlaygroundError) as e:
        st.check_knobs(decoder, knobs, lane=2)
    assert message in str(e.value) and "\n" not in str(e.value)
    name = next(iter(knobs))
    assert st.knob_errors(decoder, knobs)[name] in str(e.value)


def test_checked_knobs_are_the_values_given_in_their_types():
    out = st.check_knobs("speculative", {"gamma": 7.0, "temperature": 0.25, "accept": "strict", "stale_p": 3})
    assert out == {"gamma": 7, "temperature": 0.25, "accept": "strict"} and isinstance(out["gamma"], int)
    assert st.knob_errors("speculative", {"gamma": 7.0, "temperature": 0.25}) == {}
    # a knob of the decoder picked before has no control now: dropped, not refused
    assert st.check_knobs("greedy", {"gamma": 100}) == {}
    with pytest.raises(PlaygroundError, match="unknown decoder"):
        st.check_knobs("no-such-decoder", {}, lane=1)


def _numeric_knobs():
    return [(d, k, p) for d, s in sorted(st.decoder_specs().items()) for k, p in s["params"].items()
            if p["type"] in ("int", "float")]


def test_page_checks_agree_with_the_engine_and_never_clamp():
    """For every numeric knob of every decoder: a value the page accepts is the value the
    engine's spec of that knob validates to, and a value the page refuses the engine refuses too.
    (Rules between knobs are the lane's check: the next test.)"""
    from hypothesis import given, settings, strategies as hs

    from decoders.base import get_decoder

    knobs = _numeric_knobs()

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(hs.sampled_from(knobs), hs.one_of(hs.floats(allow_nan=False, allow_infinity=False),
                                             hs.integers(-10**7, 10**7), hs.text(max_size=4),
                                             hs.sampled_from(["inf", "-inf", "nan", "1e400", " 3 ", "0x10"])))
    def check(knob, value):
        dec, name, _spec = knob
        try:
            engine = get_decoder(dec).params[name].check(name, value)
        except (ValueError, ArithmeticError):  # PlaygroundError, or Int.check's int() of "inf"/"nan"
            engine = PlaygroundError
        if engine is PlaygroundError:
            with pytest.raises(PlaygroundError, match=repr(name)):
                st.check_knobs(dec, {name: value}, lane=1)
        else:
            assert st.check_knobs(dec, {name: value}) == {name: engine}
            assert float(engine) == float(value)  # never clamped, never replaced

    check()


def test_a_lane_whose_knobs_break_a_rule_between_them_is_refused_before_it_runs():
    with pytest.raises(PlaygroundError, match=r"^lane 2: decoder 'diverse_beam': num_beams \(3\) must be a multiple"):
        st.check_lane(st.LaneConfig("diverse_beam", {"num_beams": " 3 "}), lane=2)
    assert st.check_lane(st.LaneConfig("diverse_beam", {"num_beams": " 4 "}), lane=2).params == {"num_beams": 4}


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_values_are_refused_with_a_message(value):
    for dec, name, _spec in [("speculative", "gamma", None), ("top_p", "p", None)]:
        with pytest.raises(PlaygroundError, match=f"lane 1 \\({dec}\\): knob '{name}'"):
            st.check_knobs(dec, {name: value}, lane=1)


def test_lane_request_refuses_a_missing_draft_and_never_uses_the_target():
    for draft in (None, "", "  ", st.NO_DRAFT):
        with pytest.raises(PlaygroundError, match=r"lane 3 \(speculative\): pick a draft model"):
            st.lane_request(st.LaneConfig("speculative", {}, draft=draft), "tiny-shakespeare", "hi", 0, 8, lane=3)
    req = st.lane_request(st.LaneConfig("speculative", {"gamma": 3}, draft="tiny-shakespeare-draft"),
                          "tiny-shakespeare", "hi", 0, 8)
    assert req["draft"] == "tiny-shakespeare-draft" and req["params"] == {"gamma": 3}
    with pytest.raises(PlaygroundError, match="'gamma'=0 is out of range"):
        st.lane_request(st.LaneConfig("speculative", {"gamma": 0}, draft="d"), "m", "hi", 0, 8)


def test_check_lanes_reports_each_refused_lane():
    lanes = [st.LaneConfig("greedy"), st.LaneConfig("top_p", {"p": 1.5}), st.LaneConfig("speculative", {}),
             st.LaneConfig("", {})]
    checked, errors = st.check_lanes(lanes)
    assert set(errors) == {2, 3, 4}
    assert "lane 2 (top_p): knob 'p'=1.5 is out of range [0, 1]" == errors[2]
    assert "pick a draft model" in errors[3] and errors[4] == "lane 4: pick a decoder"
    assert checked[0] == st.LaneConfig("greedy")


def test_the_lane_card_lists_only_knobs_the_run_uses():
    assert st.knob_summary("top_p", {"p": 0.5, "gamma": 4}) == "p=0.5"
    assert st.knob_summary("greedy", {"gamma": 4}) == ""
    assert "gamma" not in st.decoder_info_md("top_p", {"gamma": 9, "p": 0.5})
    assert st.knob_summary("top_p", {"p": 1.5}) == "p=1.5 (refused)"


# ---------------------------------------------------------------------- lanes and budgets
def test_lane_buttons_respect_the_limits_and_say_so():
    assert st.add_lane(3, 6) == (4, None)
    n, msg = st.add_lane(6, 6)
    assert n == 6 and "6 lanes is the most" in msg
    assert st.remove_lane(3) == (2, None)
    n, msg = st.remove_lane(2)
    assert n == st.MIN_LANES == 2 and "at least 2 lanes" in msg
    assert st.lane_buttons(2, 6) == (True, False)
    assert st.lane_buttons(6, 6) == (False, True)
    assert st.lane_buttons(4, 4) == (False, True)


def test_a_new_lane_gets_a_decoder_its_model_can_run():
    lane = st.new_lane(st.DEFAULT_DIFFUSION)
    assert st.decoder_spec(lane.decoder)["kind"] == "diffusion"
    assert lane.params == st.default_knobs(lane.decoder)
    assert st.new_lane(st.DEFAULT_MODEL).decoder == "greedy"
    assert st.decoder_spec(st.new_lane("org/some-model", page_kind="diffusion").decoder)["kind"] == "diffusion"
    assert st.new_lane("org/some-model").decoder == "greedy"


def test_the_budget_is_what_the_context_leaves_after_the_prompt():
    assert st.new_token_budget(512, 12) == 500
    assert st.new_token_budget(512, 12, limit=256) == 256
    assert st.new_token_budget(10, 12) == 0
    assert st.budget_note("tiny", 512, 12) == "up to 500 (tiny: context 512 − prompt 12 tokens)"
    assert st.budget_note("tiny", 512, 12, limit=256).startswith("up to 256 (this instance's limit")
    st.check_budget(500, "tiny", 512, 12)
    with pytest.raises(PlaygroundError, match="max new tokens 1024 is over the budget of 500: 'tiny' has a "
                                              "512-token context and the prompt takes 12"):
        st.check_budget(1024, "tiny", 512, 12)
    with pytest.raises(PlaygroundError, match="fills the 512-token context"):
        st.check_budget(1, "tiny", 512, 512)


def test_check_page_enforces_the_budget_of_the_model_and_prompt_it_was_measured_for():
    budget = {"model": "m", "prompt": "hi", "context": 64, "prompt_tokens": 4}
    assert st.check_page("m", "hi", 0, 60, [st.LaneConfig()], budget=budget) == (0, 60)
    with pytest.raises(PlaygroundError, match="over the budget of 60"):
        st.check_page("m", "hi", 0, 61, [st.LaneConfig()], budget=budget)
    # measured for another model or prompt: not applied here (the engine checks each lane)
    assert st.check_page("m2", "hi", 0, 61, [st.LaneConfig()], budget=budget) == (0, 61)
    assert st.check_page("m", "hello", 0, 61, [st.LaneConfig()], budget=budget) == (0, 61)


# ---------------------------------------------------------------------- inspector alignment and focus
def test_scrubber_aligns_lanes_by_step_or_by_token_position():
    counts = [6, 3, 0]
    # lane 1 commits one token per step; lane 2 commits 4, 4 and 2 tokens in its 3 steps
    positions = [[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2], []]
    assert st.aligned_steps(4, "step", counts, positions) == [4, 2, 0]
    assert st.aligned_steps(4, "position", counts, positions) == [4, 1, 0]
    assert st.aligned_steps(9, "position", counts, positions) == [5, 2, 0]
    assert st.scrub_top("step", counts, positions) == 6
    assert st.scrub_top("position", counts, positions) == 10
    assert st.position_of_step(positions[1], 1) == 4
    assert st.position_of_step([0, 2, 2], 1) == 0


def test_focus_picks_all_lanes_or_one():
    assert st.focus_choices(2) == [("all lanes", 0), ("Lane 1 only", 1), ("Lane 2 only", 2)]


def test_the_budget_of_a_loaded_model_is_enforced_without_loading_anything(llama_handle):
    st.remember_model("budget-test-llama", llama_handle)
    b = st.page_budget("budget-test-llama", "ROMEO:")
    assert b["context"] == llama_handle.context_length and b["prompt_tokens"] == len(llama_handle.encode("ROMEO:"))
    left = b["context"] - b["prompt_tokens"]
    assert st.check_page("budget-test-llama", "ROMEO:", 0, min(left, 64), [st.LaneConfig()])[1] == min(left, 64)
    if left + 1 <= 1024:  # under the hosting limit, so the budget is what refuses it
        with pytest.raises(PlaygroundError, match=f"over the budget of {left}"):
            st.check_page("budget-test-llama", "ROMEO:", 0, left + 1, [st.LaneConfig()])
    assert st.loaded_kind("budget-test-llama") == llama_handle.kind
    assert st.page_budget("never-loaded", "ROMEO:") is None


def test_chat_and_the_system_prompt_are_stored_once_per_session_and_come_back_in_every_lane():
    lanes = st.with_options([st.LaneConfig("greedy"), st.LaneConfig("top_k", {"k": 5})], True, "Be brief.", True)
    settings = st.session_settings("m", 0, 8, "forwards", "auto", lanes)
    assert settings["chat"] is True and settings["system_prompt"] == "Be brief."
    assert "trust_remote_code" not in settings and all("chat" not in x for x in settings["lanes"])
    page = st.session_page({"title": "t", "model": "m", "prompt": "hi", "settings": settings,
                            "runs": [{"decoder": "greedy"}, {"decoder": "top_k"}]})
    assert page["chat"] is True and page["system_prompt"] == "Be brief."
    assert all(c.chat and c.system_prompt == "Be brief." and not c.trust_remote_code for c in page["lanes"])
    # a session saved without them in its settings (the HTTP API's) shows what its traces record
    runs = [{"decoder": "greedy", "chat": True, "system_prompt": "Rhyme."}, {"decoder": "greedy", "chat": True}]
    page = st.session_page({"title": "t", "model": "m", "prompt": "hi", "settings": {}, "runs": runs})
    assert page["chat"] is True and page["system_prompt"] == "Rhyme."
    plain = st.session_settings("m", 0, 8, "forwards", "auto", [st.LaneConfig("greedy")])
    assert "chat" not in plain and st.session_page({"settings": plain, "runs": [{}]})["chat"] is False
