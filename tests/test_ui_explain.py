"""The inspector's Explain panel, driven through its handlers: a clicked token's attribution is
the one ``playground.attribution`` computes on that lane's trace, drawn one shaded span per
context token; it is kept with the session and shown again without a model (a replay-only
instance included); whoever did not make a hosted session sees it computed but not stored; and
every bad pick is one line."""

from __future__ import annotations

import html
import re

import pytest

import playground.engine
import playground.ui.model_options as mo
import playground.ui.rules as st
from playground.attribution import attribute
from playground.ownership import owner_id
from playground.store import default_store

pytestmark = pytest.mark.slow  # building the Gradio app imports gradio

KEY_A, KEY_B = "A" * 40, "B" * 40


@pytest.fixture(scope="module")
def page(demo):
    return demo.compare_page


def run_args(page, owner=KEY_A, max_new=5):
    args = ["tiny-llama", "", "ROMEO:", 0, max_new, "forwards", "auto", 2, None]
    for j in range(page.max_lanes):
        args += [("greedy", "top_k")[j] if j < 2 else "greedy", {"k": 5} if j == 1 else {}, None, st.SAME_MODEL]
    return args + [False, ""] + ([False] if len(mo.option_inputs(page)) == 3 else []) + ["", owner, ""]


@pytest.fixture()
def ran(page, tiny, db, llama_handle):
    final = list(page.on_run(None, *run_args(page)))[-1]
    assert final[page.sid]
    return final


def text(up, comp) -> str:
    v = up.get(comp)
    return html.unescape(v if isinstance(v, str) else str(v))


def scores_in(result_html: str) -> list[float]:
    return [float(x) for x in re.findall(r'data-score="([^"]+)"', result_html)]


def test_explain_draws_the_attribution_of_the_picked_token_and_keeps_it(page, ran, llama_handle, monkeypatch):
    ex = page.explain
    traces = ran[page.traces]
    picked = ex.on_pick(traces, 1, 3)
    assert "Lane 2 · top_k, step 3 committed" in text(picked, ex.where)
    up = ex.on_explain(ran[page.sid], traces, 1, 3, None, "gradient_x_input", KEY_A)
    assert "stored with the session" in text(up, ex.status)
    want = attribute(traces[1], 3, method="gradient_x_input", model=llama_handle)
    got = scores_in(up[ex.result])
    assert len(got) == len(traces[1]["prompt_ids"]) + 3 == len(want["scores"])
    assert got == pytest.approx(want["scores"], rel=1e-4, abs=1e-6)
    kept = default_store().load_session(ran[page.sid])["settings"]["explanations"]
    assert list(kept) == ["1:3:gradient_x_input:-"]

    # a replay-only instance shows the kept result, and says in one line what it cannot compute
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    monkeypatch.setattr(playground.engine, "load_model", lambda *a, **k: pytest.fail("replay loaded a model"))
    again = ex.on_explain(ran[page.sid], traces, 1, 3, None, "gradient_x_input", KEY_B)
    assert "Stored with the session" in text(again, ex.status) and scores_in(again[ex.result]) == got
    other = ex.on_explain(ran[page.sid], traces, 1, 3, None, "integrated_gradients", KEY_B)
    assert "replay only" in text(other, ex.status) and other[ex.result] == ""


def test_a_contrast_explains_a_difference_of_log_probabilities(page, ran, llama_handle):
    ex = page.explain
    traces = ran[page.traces]
    choices = ex.on_pick(traces, 0, 2)[ex.contrast]["choices"]
    other = choices[0][1]
    up = ex.on_explain(ran[page.sid], traces, 0, 2, other, "integrated_gradients", KEY_A)
    want = attribute(traces[0], 2, contrast=other, model=llama_handle)
    assert scores_in(up[ex.result]) == pytest.approx(want["scores"], rel=1e-4, abs=1e-6)
    assert "rather than" in text(up, ex.result) and "attributions sum to" in text(up, ex.result)


def test_a_hosted_visitor_who_did_not_make_the_session_sees_it_but_stores_nothing(page, ran, monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/decoder-playground")
    ex = page.explain
    up = ex.on_explain(ran[page.sid], ran[page.traces], 0, 1, None, "gradient_x_input", KEY_B)
    assert "not stored" in text(up, ex.status) and scores_in(up[ex.result])
    assert "explanations" not in default_store().load_session(ran[page.sid])["settings"]
    assert owner_id(KEY_A) == default_store().session_owner(ran[page.sid])
    mine = ex.on_explain(ran[page.sid], ran[page.traces], 0, 1, None, "gradient_x_input", KEY_A)
    assert "stored with the session" in text(mine, ex.status)


@pytest.mark.parametrize("lane, step, contrast, method, line", [
    (5, 0, None, "gradient_x_input", "has no lane 6"),
    (0, 1, 99999, "gradient_x_input", "top-K"),
    (0, 1, "x", "gradient_x_input", "top-K"),
    (0, 1, None, "saliency", "unknown attribution method"),
], ids=["no such lane", "contrast outside the top-K", "contrast not an id", "unknown method"])
def test_a_bad_pick_is_one_line(page, ran, lane, step, contrast, method, line):
    ex = page.explain
    up = ex.on_explain(ran[page.sid], ran[page.traces], lane, step, contrast, method, KEY_A)
    assert line in text(up, ex.status) and up[ex.result] == ""


def test_nothing_to_explain_before_a_run_and_on_a_diffusion_lane(page):
    ex = page.explain
    assert "nothing to explain yet" in text(ex.on_explain(None, [], 0, 0, None, "gradient_x_input", KEY_A), ex.status)
    diffusion = [{"decoder": "llada", "steps": [{"i": 0, "kind": "denoise", "committed": [3]}]}]
    assert "diffusion lane" in text(ex.on_pick(diffusion, 0, 0), ex.where)
