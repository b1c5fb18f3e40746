"""The Compare page's rules as plain data: knob widgets, page checks, sessions, metrics."""

from __future__ import annotations

import math

import pytest

from playground.errors import PlaygroundError
from playground.ui import state as st


def test_knob_widgets_follow_the_spec():
    assert st.knob_widget("p", {"type": "float", "default": 0.9, "min": 0.0, "max": 1.0, "help": "mass"}) == \
        st.KnobWidget("slider", {"label": "p", "info": "mass", "minimum": 0.0, "maximum": 1.0, "step": 0.001, "value": 0.9})
    w = st.knob_widget("k", {"type": "int", "default": 50, "min": 0, "max": 1000000, "help": ""})
    assert w.widget == "number" and w.kwargs["precision"] == 0 and w.kwargs["maximum"] == 1000000
    w = st.knob_widget("n", {"type": "int", "default": 4, "min": 1, "max": 64, "help": "beams"}, value=6)
    assert w.widget == "slider" and w.kwargs["step"] == 1 and w.kwargs["value"] == 6
    w = st.knob_widget("t", {"type": "float", "default": 1.0, "min": 0.0, "max": math.inf, "help": ""})
    assert w.widget == "number" and "maximum" not in w.kwargs
    assert st.knob_widget("b", {"type": "bool", "default": True, "help": ""}).widget == "checkbox"
    w = st.knob_widget("c", {"type": "choice", "default": "a", "choices": ["a", "b"], "help": "pick"})
    assert w.widget == "dropdown" and w.kwargs["choices"] == ["a", "b"] and w.kwargs["info"] == "pick"
    assert st.knob_widget("s", {"type": "str", "default": "x,y", "help": ""}).widget == "textbox"


def test_every_registered_knob_maps_to_a_widget():
    for name, spec in st.decoder_specs().items():
        for knob, p in spec["params"].items():
            w = st.knob_widget(knob, p)
            assert w.widget in ("slider", "number", "checkbox", "dropdown", "textbox"), (name, knob)


def test_coerce_knobs_restores_ints_and_drops_stale_knobs():
    assert st.coerce_knobs("greedy", {"p": 0.5}) == {}
    spec = st.decoder_spec("top_k")
    if spec is None:
        pytest.skip("top_k not registered")
    out = st.coerce_knobs("top_k", {"k": 40.0, "temperature": 0.7, "gone": 1})
    assert out == {"k": 40, "temperature": 0.7} and isinstance(out["k"], int)


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
                   "seed": 1, "draft": None, "params": {}}
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
    if st.decoder_spec("top_k") is None:
        pytest.skip("top_k not registered")
    assert st.knob_summary("top_k", st.default_knobs("top_k")) == ""
    assert st.knob_summary("top_k", {"k": 20, "temperature": 1.0}) == "k=20"
    info = st.decoder_info_md("top_k", {"k": 20})
    assert info.endswith("**k=20**")
    assert "<" not in st.decoder_info_md("<script>")
