"""The page's "Watch tokens" field, driven through the Compare page's handlers: what it names is
watched in every lane of the run (the probabilities the trace records equal the model's
softmax at that step), stored with the session and shown again when the session is opened;
a bad field is one line and runs nothing."""

from __future__ import annotations

import html

import pytest
import torch

import playground.ui.model_options as mo
import visualizers
import playground.ui.rules as st
from playground.store import default_store
from playground.watch import MAX_WATCH, MAX_WATCH_CHARS, watch_items, watch_text

pytestmark = pytest.mark.slow  # building the Gradio app imports gradio


@pytest.fixture(scope="module")
def page(demo):
    return demo.compare_page


def run_args(page, watch, lanes=(("greedy", {}), ("top_k", {"k": 5})), max_new=5):
    """The Run event's inputs in the page's order: settings, lanes, options, watch, owner, flag."""
    args = ["tiny-llama", "", "ROMEO:", 0, max_new, "forwards", "auto", len(lanes), None]
    for j in range(page.max_lanes):
        dec, knobs = lanes[j] if j < len(lanes) else ("greedy", {})
        args += [dec, knobs, None, st.SAME_MODEL]
    options = [False, ""] + ([False] if len(mo.option_inputs(page)) == 3 else [])
    return args + options + [watch, None, ""]


def status_of(up, page) -> str:
    v = up.get(page.status)
    return html.unescape(v if isinstance(v, str) else str(v))


def test_the_field_watches_its_tokens_in_every_lane_and_the_session_keeps_them(page, tiny, db, llama_handle):
    final = list(page.on_run(None, *run_args(page, "#7, #19")))[-1]
    assert "Done" in status_of(final, page), status_of(final, page)
    traces = final[page.traces]
    assert all([e["token"] for e in t["watch"]] == [7, 19] for t in traces)
    # the greedy lane's raw probabilities are the model's softmax at each step
    t = traces[0]
    ids = t["prompt_ids"]
    for i, s in enumerate(t["steps"]):
        seq = torch.tensor([ids + t["output_ids"][:i]])
        with torch.no_grad():
            p = torch.softmax(llama_handle.model(seq).logits[0, -1].float(), -1)
        for tid in (7, 19):
            assert s["watch"][str(tid)]["raw_p"] == pytest.approx(float(p[tid]), rel=1e-3, abs=1e-6)
    assert all("Watched tokens" in [title for title, _ in visualizers.run_figures(t)] for t in traces)
    stored = default_store().load_session(final[page.sid])
    assert stored["settings"]["watch"] == ["#7", " #19"]
    up = page.open_session(final[page.sid])
    assert up[page.watch] == "#7, #19"  # the field shows what the run watched


def test_a_session_without_stored_items_shows_the_ids_its_traces_watched():
    session = {"settings": {}, "runs": [{"watch": [{"token": 3, "word": "a"}, {"token": 11, "word": "b"}]}]}
    assert st.session_page(session)["watch"] == "#3,#11"
    assert st.session_page({"settings": {}, "runs": []})["watch"] == ""


@pytest.mark.parametrize("watch, message", [
    (",".join(f"#{i}" for i in range(MAX_WATCH + 1)), f"at most {MAX_WATCH} per run"),
    ("x" * (MAX_WATCH_CHARS + 1), f"at most {MAX_WATCH_CHARS}"),
    ("y" * 20_000, "characters; at most"),
    ({"a": 1}, "watch must be a list"),
    ("#99999", "outside the vocabulary"),
], ids=["17 items", "long item", "long field", "not text", "id outside"])
def test_a_bad_field_is_one_line_and_runs_nothing(page, tiny, db, watch, message):
    frames = list(page.on_run(None, *run_args(page, watch)))
    text = status_of(frames[-1], page)
    assert message in text and "\n" not in text.strip(), text
    assert not any(t.get("steps") for t in frames[-1].get(page.traces) or [])
    assert frames[-1].get(page.sid) is None


def test_the_field_text_reads_back_as_the_same_items():
    for value in ["Juliet, Romeo", "#5,#9", [" thee", 12, "Romeo"], ""]:
        assert watch_items(watch_text(value)) == [f"#{w}" if isinstance(w, int) else w for w in watch_items(value)]
