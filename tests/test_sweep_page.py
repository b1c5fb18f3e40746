"""The Sweep tab's handlers (no browser): a grid runs into the page's store as this browser's
sessions, the figure and the grid of outputs show it, a second press reruns nothing, and
every bad box is one line."""

from __future__ import annotations

import html

import pytest

from playground.ownership import owner_id
from playground.store import default_store
from playground.sweep import sweep_sessions
from playground.ui.sweep_view import grid_html, knob_choices

KEY = "K" * 40
PROMPT = "ROMEO:\n"


def quiet(*args, **kwargs):
    """Stands in for Gradio's progress bar."""


def press(view, **over):
    boxes = dict(decoder="top_p", model="tiny-shakespeare", draft=None, knob1="temperature", values1="0.5,1.0",
                 knob2="p", values2="0.5:1.0:0.5", prompt=PROMPT, seed=3, repeats=2, max_new=6, metric="perplexity",
                 owner_key=KEY)
    boxes.update(over)
    return view.on_run(**boxes, progress=quiet)


def test_a_two_knob_sweep_runs_stores_and_shows_its_grid(demo, db):
    view = demo.sweep_view
    agg, status, fig, grid = press(view)
    assert "pg-status-ok" in status and "4 cells × 2 seeds" in status
    assert [c["knobs"] for c in agg["cells"]] == [{"temperature": 0.5, "p": 0.5}, {"temperature": 0.5, "p": 1.0},
                                                 {"temperature": 1.0, "p": 0.5}, {"temperature": 1.0, "p": 1.0}]
    assert all(c["repeats"] == 2 and c["seeds"] == [3, 4] for c in agg["cells"])
    store = default_store()
    sids = [s for c in agg["cells"] for s in c["sessions"]]
    assert len(set(sids)) == 8 and all(store.session_owner(s) == owner_id(KEY) for s in sids)
    assert agg["greedy"] is not None and store.session_owner(agg["greedy"]["session"]) == owner_id(KEY)
    # the same cells as run one by one: the stored text is the decoder's on that seed
    import playground

    again = playground.generate(model="tiny-shakespeare", decoder="top_p", prompt=PROMPT, max_new_tokens=6, seed=4,
                                temperature=1.0, p=0.5)
    assert agg["cells"][2]["texts"][1] == again["text"]
    assert fig.data[0].type == "heatmap"
    for c in agg["cells"]:
        assert f'?session={c["sessions"][0]}' in grid
    assert grid.count('class="sweep-cell"') == 4
    # pressed again: nothing reruns, the same sessions show
    count = store.count()
    agg2, *_ = press(view)
    assert store.count() == count and agg2["cells"] == agg["cells"]
    # another metric redraws from the shown sweep
    fig3, grid3 = view.on_metric(agg, "distinct_2")
    assert "dist-2" in grid3 and fig3.data


def test_one_knob_gives_a_line_and_an_escaped_grid(demo, db):
    agg, status, fig, grid = press(demo.sweep_view, knob2="(none)", values2="", repeats=1)
    assert fig.data[0].type == "scatter" and len(agg["cells"]) == 2
    assert "<script" not in grid_html({**agg, "cells": [{**agg["cells"][0], "texts": ["<script>x</script>"]}]},
                                      "perplexity")


@pytest.mark.parametrize("over, words", [
    (dict(decoder="nope"), "unknown decoder"),
    (dict(knob1="tempreature"), "no knob 'tempreature'"),
    (dict(values1=""), "give the first knob's values"),
    (dict(values1="0:3:0.01"), "at most 64"),
    (dict(values2="0.5,2"), "out of range"),
    (dict(knob1=None), "pick the knob"),
    (dict(repeats=0), "seeds per cell must be between 1 and 16"),
    (dict(max_new=0), "max new tokens must be between 1"),
    (dict(repeats="many"), "seeds per cell must be a whole number"),
    (dict(values1="0.5,0.75,1.0", max_new=700), "a sweep generates at most 8192"),
    (dict(max_new=100_000), "max new tokens must be between 1 and 1024"),
    (dict(prompt=""), "prompt"),
    (dict(prompt=["x"]), "the prompt must be text"),
    (dict(decoder="speculative", knob1="gamma", values1="1,2", knob2="(none)"), "needs a draft model"),
])
def test_bad_sweeps_are_one_line_and_store_nothing(demo, db, over, words):
    count = default_store().count()
    out = press(demo.sweep_view, **over)
    assert "pg-status-error" in out[1] and words in html.unescape(out[1]), out[1]
    assert default_store().count() == count


def test_a_replay_only_instance_runs_no_sweep(demo, db, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    out = press(demo.sweep_view)
    assert "model loading is disabled" in out[1]


def test_the_knob_choices_are_the_decoders_sweepable_knobs(db):
    assert "temperature" in knob_choices("top_p") and "regex" not in knob_choices("top_p")
    assert knob_choices("nope") == [] and knob_choices(None) == []
    assert sweep_sessions(default_store(), "0" * 16) == []  # a fingerprint nobody ran finds nothing


def test_the_instances_token_limit_holds_for_a_sweep(demo, db, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MAX_NEW_TOKENS", "4")
    out = press(demo.sweep_view, knob2="(none)", repeats=1, max_new=6)
    assert "max new tokens must be between 1 and 4 on this instance" in out[1]
    assert default_store().count() == 0


def test_a_threshold_sweep_of_a_diffusion_decoder_measures_parallel_commits(demo, db):
    """fast_dllm over its threshold on the bundled diffusion model: lower thresholds commit more
    tokens per forward; agreement is with llada one token per step, perplexity under the causal
    model that shares the tokenizer."""
    agg, status, fig, grid = press(demo.sweep_view, decoder="fast_dllm", model="tiny-shakespeare-diffusion",
                                   knob1="threshold", values1="0.05,0.9", knob2="(none)", repeats=1, max_new=12)
    assert "pg-status-ok" in status, status
    low, high = agg["cells"]
    assert low["tokens_per_target_forward"] > high["tokens_per_target_forward"] >= 1.0
    assert all(c["agreement"] is not None and c["perplexity"] is not None for c in agg["cells"])
    assert agg["scorer"] == "tiny-shakespeare"
    ref = default_store().load_session(agg["greedy"]["session"])
    assert ref["runs"][0]["decoder"] == "llada" and ref["title"] == "sweep reference: llada, one token per step"


def test_the_whole_sweep_downloads_as_one_offline_page(demo, db):
    """The Sweep tab's export link serves every run of the shown sweep (reference first) as one
    HTML page, and `playground sessions html --sweep` writes the same from a sweep's store."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from playground.cli import main
    from playground.ui.page_routes import page_routes
    from playground.ui.page_session import PageSessions

    view = demo.sweep_view
    assert "run a sweep first" in view.on_export(None)
    agg, *_ = press(view, knob2="(none)", repeats=1, max_new=4)
    link = view.on_export(agg)
    token = link.split("playground_api/export/")[1].split('"')[0]
    client = TestClient(Starlette(routes=page_routes(sessions=PageSessions(), exports=view.exports)))
    r = client.get(f"/playground_api/export/{token}")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert page.count('<article class="pg-session"') == 3  # the greedy reference and two cells
    assert "Sweep of top_p over temperature (3 runs)" in page
    assert 'attachment; filename="sweep-top_p.html"' in r.headers["content-disposition"]
    out = db.parent / "sweep.html"
    assert main(["sessions", "--db", str(db), "html", "--sweep", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").count('<article class="pg-session"') == 3
    assert main(["sessions", "--db", str(db), "html", "--sweep", "--study", "-o", str(out)]) == 2
