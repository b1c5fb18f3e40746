"""The Watermark tab's handlers: watermarked text scores high, plain text does not, tokens
coloured green/red as the detector counted them, a lane prefills the form, bad settings are
one line."""

from __future__ import annotations

import html
import re

import gradio as gr
import pytest

import playground
from decoders.guided.watermark import detect_text

MODEL = "tiny-shakespeare"
PROMPT = "ROMEO.\nBut soft, what light"
DEFAULTS = (0.25, "lefthash", "15485863", 1)  # the watermark decoder's knob defaults


@pytest.fixture()
def view(demo):
    return demo.watermark_view


def _z(status: str) -> float:
    return float(re.search(r"z = (-?[0-9.]+)", status).group(1))


def _greens(tokens_html: str) -> list[str]:
    return re.findall(r'data-green="(true|false|none)"', tokens_html)


def test_the_form_has_the_watermark_knobs_names_and_defaults(view):
    from decoders.base import get_decoder

    params = get_decoder("watermark").params
    for comp, name in ((view.gamma, "watermark_gamma"), (view.seeding, "watermark_seeding"),
                       (view.key, "watermark_key"), (view.width, "watermark_context_width")):
        assert comp.label == name
        assert str(comp.value) == str(params[name].default) or comp.value == params[name].default
    assert tuple(str(c.value) if c is view.key else c.value
                 for c in (view.gamma, view.seeding, view.key, view.width)) == DEFAULTS


@pytest.mark.parametrize("seed", [1, 2])
def test_watermarked_text_scores_high_and_plain_text_low(view, seed):
    marked = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=64, seed=seed)
    plain = playground.generate(model=MODEL, decoder="sample", prompt=PROMPT, max_new_tokens=64, seed=seed)
    status, tokens, fig = view.on_detect(MODEL, marked["text"], PROMPT, *DEFAULTS)
    assert _z(status) > 4 and "watermarked" in status and "pg-status-ok" in status
    res = detect_text(MODEL, marked["text"], prompt=PROMPT)
    assert _z(status) == pytest.approx(res["z"], abs=0.01)
    # one span per token, coloured as the detector counted it
    assert _greens(tokens) == [str(t["green"]).lower() for t in res["tokens"]]
    assert _greens(tokens).count("true") == res["green"]
    assert marked["text"] in html.unescape(re.sub(r"<[^>]+>", "", tokens)).replace("↵", "")
    assert fig.data[0].y[-1] == pytest.approx(res["z"], abs=1e-3)
    status, _tokens, _fig = view.on_detect(MODEL, plain["text"], PROMPT, *DEFAULTS)
    assert _z(status) < 2 and "no watermark detected" in status


def test_a_lane_prefills_text_prompt_model_and_its_watermark_settings(view):
    knobs = {"watermark_gamma": 0.5, "watermark_delta": 4.0, "watermark_key": 12345, "watermark_seeding": "selfhash"}
    marked = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=64, seed=4, **knobs)
    plain = playground.generate(model=MODEL, decoder="greedy", prompt=PROMPT, max_new_tokens=8)
    out = view.on_from_lane([plain, marked], 2)
    text, prompt, model, gamma, seeding, key, width, status, filled = out
    assert (text, prompt, model) == (marked["text"], PROMPT, MODEL)
    assert (gamma, seeding, key, width) == (0.5, "selfhash", "12345", 1)
    assert "lane 2" in status.lower()
    status, _tokens, _fig = view.on_detect(model, text, prompt, gamma, seeding, key, width, filled)
    assert _z(status) > 4
    # the tab scores the lane's own tokens: its z is the one the lane's stats show
    from playground.core.trace import watermark_figures

    assert _z(status) == pytest.approx(watermark_figures(marked["steps"])["z"], abs=0.01)
    # the same text under the default settings is not detected: the settings matter
    assert _z(view.on_detect(MODEL, text, prompt, *DEFAULTS)[0]) < 4
    # a lane that is not watermarked gives its text only; the settings stay as they are
    out = view.on_from_lane([plain, marked], 1)
    assert out[0] == plain["text"]
    assert all(v == gr.skip() for v in out[3:7])
    assert "no output" in view.on_from_lane([], 1)[-2]


@pytest.mark.parametrize("args,why", [
    ((MODEL, "hello there friend", "", 0, "lefthash", "15485863", 1), "watermark_gamma"),
    ((MODEL, "hello there friend", "", 1.5, "lefthash", "15485863", 1), "watermark_gamma"),
    ((MODEL, "hello there friend", "", None, "lefthash", "15485863", 1), "watermark_gamma"),
    ((MODEL, "hello there friend", "", 0.25, "minhash", "15485863", 1), "watermark_seeding"),
    ((MODEL, "hello there friend", "", 0.25, "lefthash", "abc", 1), "watermark_key"),
    ((MODEL, "hello there friend", "", 0.25, "lefthash", "-1", 1), "watermark_key"),
    ((MODEL, "hello there friend", "", 0.25, "lefthash", "", 1), "watermark_key"),
    ((MODEL, "hello there friend", "", 0.25, "lefthash", "15485863", 0), "watermark_context_width"),
    ((MODEL, "", "", *DEFAULTS), "text"),
    ((MODEL, "a", "", *DEFAULTS), "too short"),
    (("", "hello there friend", "", *DEFAULTS), "model"),
    (("/no/such/model", "hello there friend", "", *DEFAULTS), "no/such/model"),
])
def test_bad_settings_are_one_line(view, args, why):
    status, tokens, fig = view.on_detect(*args)
    assert "pg-status-error" in status and why in status and tokens == "" and fig is None
    assert "\n" not in status and "Traceback" not in status


def test_without_models_detection_is_one_line(view, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    status, _tokens, _fig = view.on_detect(MODEL, "hello there friend", "", *DEFAULTS)
    assert "pg-status-error" in status and "\n" not in status
