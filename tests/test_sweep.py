"""``playground sweep``: the grid, common random numbers, repeats and their spread, one-line
refusals, resuming, cells that reopen as comparisons, and the sweep figures."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import statistics

import pytest

from playground.api import compare
from playground.cli import main
from playground.store import Store
from playground.study import agreement, distinct
from playground.sweep import aggregate, parse_knob, sweep_sessions, table
from visualizers.sweep import sweep_figure, sweep_heatmap, sweep_line

TWO = ["sweep", "--decoder", "top_p", "--knob", "temperature=0.7,1.3", "--knob", "p=0.6:1.0:0.4",
       "--repeats", "2", "--seed", "2", "--max-new-tokens", "4", "--no-progress"]
ONE = ["sweep", "--decoder", "sample", "--knob", "temperature=1.2,1.2,0.4", "--param", "top_k=20",
       "--seed", "5", "--max-new-tokens", "6", "--no-progress"]


def _run(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def two_knobs(tmp_path_factory):
    """A 2 x 2 sweep of top_p with two repeats: (its store path, the printed aggregate)."""
    out = tmp_path_factory.mktemp("sweep2") / "sweep.db"
    rc, text = _run([*TWO, "--out", str(out), "--json"])
    assert rc == 0
    return out, json.loads(text)


@pytest.fixture(scope="module")
def one_knob(tmp_path_factory):
    """A one-knob sweep of sample whose first two cells have the same knob values."""
    out = tmp_path_factory.mktemp("sweep1") / "sweep.db"
    rc, text = _run([*ONE, "--out", str(out), "--json"])
    assert rc == 0
    return out, json.loads(text)


def _sessions(path) -> list[dict]:
    with Store(path) as s:
        return sweep_sessions(s)


def _cells(path) -> list[dict]:
    return [s for s in _sessions(path) if s["settings"]["sweep"]["role"] == "cell"]


@pytest.mark.slow
def test_one_cell_per_combination_with_its_knob_values(two_knobs):
    path, agg = two_knobs
    assert [a["name"] for a in agg["knobs"]] == ["temperature", "p"]
    assert [a["values"] for a in agg["knobs"]] == [[0.7, 1.3], [0.6, 1.0]]
    want = [{"temperature": t, "p": p} for t, p in itertools.product([0.7, 1.3], [0.6, 1.0])]
    assert [c["knobs"] for c in agg["cells"]] == want
    runs = _cells(path)
    assert len(runs) == 4 * 2
    for s in runs:
        knobs = s["settings"]["sweep"]["knobs"]
        trace = s["runs"][0]
        # the stored lane ran with the cell's knob values and the repeat's seed
        assert trace["decoder"] == "top_p"
        assert {k: trace["params"][k] for k in knobs} == knobs
        assert s["settings"]["lanes"][0]["params"]["temperature"] == knobs["temperature"]
        assert trace["seed"] == s["settings"]["seed"] == 2 + s["settings"]["sweep"]["repeat"]
    assert sorted(knobs_seed for c in agg["cells"] for knobs_seed in c["seeds"]) == [2, 2, 2, 2, 3, 3, 3, 3]
    # one greedy reference, run once
    assert sum(s["settings"]["sweep"]["role"] == "greedy" for s in _sessions(path)) == 1


@pytest.mark.slow
def test_cells_with_equal_knobs_give_identical_outputs(one_knob):
    path, agg = one_knob
    runs = {tuple(s["settings"]["sweep"]["cell"]): s["runs"][0] for s in _cells(path)}
    assert runs[(0,)]["output_ids"] == runs[(1,)]["output_ids"]
    assert runs[(0,)]["text"] == runs[(1,)]["text"]
    assert agg["cells"][0]["distinct_2"] == agg["cells"][1]["distinct_2"]
    assert agg["cells"][0]["perplexity"] == agg["cells"][1]["perplexity"]
    assert all(r["params"]["top_k"] == 20 for r in runs.values())  # the fixed --param reached every cell


@pytest.mark.slow
def test_repeats_give_the_spread_of_the_stored_runs(two_knobs):
    path, agg = two_knobs
    sessions = _sessions(path)
    greedy = next(s for s in sessions if s["settings"]["sweep"]["role"] == "greedy")["runs"][0]["output_ids"]
    for cell in agg["cells"]:
        runs = [s["runs"][0] for s in _cells(path) if s["settings"]["sweep"]["cell"] == cell["index"]]
        assert cell["repeats"] == len(runs) == 2
        ppl = [math.exp(r["score"]["nll_sum"] / r["score"]["tokens"]) for r in runs]
        agree = [agreement(greedy, r["output_ids"]) for r in runs]
        d2 = [distinct([r["output_ids"]], 2) for r in runs]
        for key, xs in (("perplexity", ppl), ("agreement", agree), ("distinct_2", d2),
                        ("wall_s", [r["stats"]["wall_s"] for r in runs])):
            assert cell[key] == pytest.approx(statistics.mean(xs), abs=1e-5)
            assert cell[key + "_spread"] == pytest.approx(statistics.stdev(xs), abs=1e-5)
        assert cell["acceptance_rate"] is None  # top_p drafts nothing
    # the two seeds give different outputs somewhere in the grid, so the spread is not all zero
    assert any(c["perplexity_spread"] > 0 for c in agg["cells"])


@pytest.mark.slow
def test_one_repeat_has_no_spread_and_the_aggregate_is_the_stores(one_knob, capsys):
    path, agg = one_knob
    assert all(c["repeats"] == 1 and c["perplexity_spread"] == 0.0 for c in agg["cells"])
    assert aggregate(_sessions(path)) == agg
    assert main(["sweep", "--out", str(path), "--report", "--metric", "distinct_2"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == table(agg, "distinct_2")
    assert "dist-2 by temperature" in printed


@pytest.mark.slow
def test_rerun_resumes_and_another_sweep_is_refused(one_knob, capsys):
    path, _ = one_knob
    before = len(_sessions(path))
    assert main([*ONE, "--out", str(path)]) == 0
    assert len(_sessions(path)) == before
    capsys.readouterr()
    assert main([*ONE[:4], "temperature=0.3", *ONE[5:], "--out", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "another --out" in err


@pytest.mark.slow
def test_a_cell_reopens_as_a_normal_comparison(two_knobs):
    path, _ = two_knobs
    s = _cells(path)[-1]
    st = s["settings"]
    again = compare(lanes=[{"decoder": ln["decoder"], "knobs": ln["params"]} for ln in st["lanes"]],
                    model=s["model"], prompt=s["prompt"], seed=st["seed"], max_new_tokens=st["max_new_tokens"])
    assert again[0]["output_ids"] == s["runs"][0]["output_ids"]


@pytest.mark.parametrize("argv, words", [
    (["--decoder", "top_p", "--knob", "tempreature=0.5,1"], "has no knob 'tempreature'"),
    (["--decoder", "top_p", "--knob", "p=0.5,1.5"], "out of range"),
    (["--decoder", "top_p", "--knob", "p=0.5,abc"], "must be a number"),
    (["--decoder", "top_p", "--knob", "temperature=0:3:0.01"], "at most 64"),
    (["--decoder", "top_p", "--knob", "temperature=0.1:1:0.1", "--knob", "p=0.1:1:0.1"], "the limit is 64"),
    (["--decoder", "top_p", "--knob", "p=0.5", "--knob", "p=0.9"], "swept twice"),
    (["--decoder", "top_p", "--knob", "p=0.5", "--param", "p=0.9"], "both swept"),
    (["--decoder", "top_p", "--knob", "p=1.0:0.5:0.1"], "START <= STOP"),
    (["--decoder", "top_p", "--knob", "p"], "NAME=V1,V2"),
    (["--decoder", "top_p"], "at least one --knob"),
    (["--decoder", "top_p", "--knob", "p=0.5,0.9", "--knob", "temperature=1", "--knob", "top_k=1"], "one or two"),
    (["--decoder", "top_p", "--knob", "p=0.1:1:0.1", "--repeats", "4", "--max-new-tokens", "256"], "at most 8192"),
    (["--decoder", "top_p", "--knob", "p=0.5", "--repeats", "0"], "--repeats"),
    (["--decoder", "nope", "--knob", "p=0.5"], "nope"),
    (["--knob", "p=0.5"], "needs --decoder"),
    (["--decoder", "top_p", "--knob", "p=0.5", "--max-new-tokens", "0"], "at least 1"),
])
def test_bad_sweeps_are_one_line(argv, words, tmp_path, capsys):
    out = tmp_path / "sweep.db"
    assert main(["sweep", *argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and words in err, err
    assert not out.exists()  # refused before anything ran or was stored


def test_range_includes_both_ends():
    assert parse_knob("temperature=0.3:1.5:0.3") == ("temperature", ["0.3", "0.6", "0.9", "1.2", "1.5"])
    assert parse_knob("gamma=1:8:1")[1] == [str(k) for k in range(1, 9)]
    assert parse_knob("p=0.5, 0.9")[1] == ["0.5", "0.9"]


def _agg(knobs, cells):
    return {"decoder": "top_p", "model": "m", "knobs": knobs, "cells": cells}


def test_heatmap_holds_the_metric_values():
    knobs = [{"name": "temperature", "values": [0.5, 1.0, 1.5]}, {"name": "p", "values": [0.5, 1.0]}]
    cells = [{"index": [i, j], "knobs": {}, "repeats": 2, "perplexity": 10.0 * i + j, "perplexity_spread": 0.5}
             for i in range(3) for j in range(2)]
    fig = sweep_heatmap(_agg(knobs, cells), "perplexity")
    assert fig.data[0].type == "heatmap"
    assert [list(r) for r in fig.data[0].z] == [[0.0, 1.0], [10.0, 11.0], [20.0, 21.0]]
    assert list(fig.layout.yaxis.ticktext) == ["0.5", "1", "1.5"] and list(fig.layout.xaxis.ticktext) == ["0.5", "1"]
    assert fig.data[0].text[2][1] == "21 ± 0.5"
    assert sweep_figure(_agg(knobs, cells), "perplexity").data[0].type == "heatmap"


def test_line_holds_the_metric_values_and_spread():
    knobs = [{"name": "gamma", "values": [1, 2, 4]}]
    cells = [{"index": [i], "knobs": {}, "repeats": 3, "acceptance_rate": a, "acceptance_rate_spread": s}
             for i, (a, s) in enumerate([(0.9, 0.1), (0.7, 0.05), (None, None)])]
    fig = sweep_figure(_agg(knobs, cells), "acceptance_rate")
    assert fig.data[0].type == "scatter"
    assert list(fig.data[0].y) == [0.9, 0.7, None]
    assert list(fig.data[0].error_y.array) == [0.1, 0.05, 0.0]
    assert "no value" in fig.data[0].hovertext[2]
    # the wrong figure for the sweep's shape says so instead of drawing nonsense
    assert sweep_line(_agg(knobs * 2, cells), "acceptance_rate").layout.annotations


@pytest.mark.slow
def test_figures_of_a_stored_sweep(two_knobs, tmp_path):
    path, agg = two_knobs
    assert main(["sweep", "--decoder", "top_p", "--out", str(path), "--report", "--figures", str(tmp_path)]) == 0
    html = (tmp_path / "perplexity.html").read_text()
    assert "heatmap" in html and (tmp_path / "plotly.min.js").exists()
    z = sweep_heatmap(agg, "perplexity").data[0].z
    assert [[c["perplexity"] for c in agg["cells"][2 * i:2 * i + 2]] for i in range(2)] == [list(r) for r in z]


@pytest.mark.slow
def test_a_speculative_sweep_reports_acceptance_and_stays_on_greedy(tmp_path):
    out = tmp_path / "gamma.db"
    rc, text = _run(["sweep", "--decoder", "speculative", "--draft", "tiny-shakespeare-draft", "--knob", "gamma=1,3",
                     "--max-new-tokens", "6", "--out", str(out), "--json", "--no-progress"])
    assert rc == 0
    agg = json.loads(text)
    for cell in agg["cells"]:
        stats = next(s["runs"][0]["stats"] for s in _cells(out) if s["settings"]["sweep"]["cell"] == cell["index"])
        # the decoder's own counts of drafted and accepted tokens
        assert cell["acceptance_rate"] == pytest.approx(stats["accepted_tokens"] / stats["drafted_tokens"], abs=1e-4)
        assert cell["agreement"] == 1.0  # lossless at temperature 0: greedy's text, whatever gamma
        assert cell["tokens_per_target_forward"] == pytest.approx(stats["new_tokens"] / stats["target_forwards"], abs=1e-4)
