"""Branches of stored sessions (forced tokens, stored as a tree) and the divergence between lanes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import playground
from playground.branching import branch_requests, branch_session, step_position
from playground.core.errors import PlaygroundError
from playground.store import Store
from visualizers import COMPARE_PLOTS
from visualizers.divergence import divergence, divergence_figure, js, kl, lane_divergence, lumped

MODEL = "tiny-shakespeare"
BASE = dict(model=MODEL, prompt="ROMEO:", max_new_tokens=12, seed=1)


@pytest.fixture(scope="module")
def lanes():
    return [playground.generate(decoder="greedy", **BASE), playground.generate(decoder="top_p", p=0.8, **BASE),
            playground.generate(decoder="greedy", **BASE)]


# ---------------------------------------------------------------------- divergence
def test_identical_lanes_diverge_by_zero(lanes):
    rows = lane_divergence(lanes[0], lanes[2])
    assert len(rows) == BASE["max_new_tokens"]
    assert all(r["kl_ab"] == 0 and r["kl_ba"] == 0 and r["js"] == 0 for r in rows)


def test_divergence_of_different_lanes_while_they_share_a_prefix(lanes):
    greedy, top_p = lanes[0], lanes[1]
    rows = lane_divergence(greedy, top_p)
    split = next((k for k, (a, b) in enumerate(zip(greedy["output_ids"], top_p["output_ids"])) if a != b),
                 len(greedy["output_ids"]) - 1)
    assert [r["position"] for r in rows] == list(range(split + 1))
    for r in rows:
        assert 0 <= r["js"] <= math.log(2) + 1e-9 and r["kl_ab"] >= 0 and r["kl_ba"] >= 0
    # greedy is a point mass; top-p differs from it exactly where it kept more than one token
    for r in rows:
        kept = sum(1 for p in top_p["steps"][r["position"]]["dist"]["final_probs"] if p > 0)
        assert (r["js"] > 0) == (kept > 1), r
    # the same two lanes compared on the model's own probabilities: the same model, the same prefix
    assert all(r["js"] == 0 for r in lane_divergence(greedy, top_p, which="raw"))


def test_lumping_and_the_formulas():
    p = ([1, 2, 3], [0.5, 0.3, 0.1])
    q = ([1, 2, 4], [0.4, 0.4, 0.1])
    a, b = lumped(p, q)  # buckets: 1, 2, rest
    assert a == pytest.approx([0.5, 0.3, 0.2]) and b == pytest.approx([0.4, 0.4, 0.2])
    d = divergence(p, q)
    assert d["kl_pq"] == pytest.approx(0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4), abs=1e-5)
    assert d["js"] == pytest.approx(js(a, b)) and 0 < d["js"] < min(d["kl_pq"], d["kl_qp"])
    assert kl([1.0, 0.0], [0.0, 1.0]) < math.inf and js([1.0, 0.0], [0.0, 1.0]) == pytest.approx(math.log(2))


def test_divergence_figure_is_registered_and_draws(lanes):
    assert ("Divergence between lanes", divergence_figure) in COMPARE_PLOTS
    fig = divergence_figure(lanes)
    names = [t.name for t in fig.data]
    # the greedy lane is identical to lane 1 (greedy too): 0 everywhere, and named so
    assert "2: top_p JS" in names and "3: greedy · identical (0) JS" in names
    assert list(fig.data[names.index("3: greedy · identical (0) JS")].y) == [0.0] * BASE["max_new_tokens"]
    assert divergence_figure(lanes[:1]).layout.annotations[0].text.startswith("one lane")
    assert divergence_figure([{}, {"steps": "junk"}]).layout.annotations  # a note, never a raise


# ---------------------------------------------------------------------- branches
def _save(store: Store, traces: list[dict]) -> str:
    return store.save_session("demo", MODEL, BASE["prompt"], {"max_new_tokens": BASE["max_new_tokens"]}, traces)


def test_branch_one_lane_stores_a_branch_that_replays_and_travels(lanes, tmp_path: Path):
    store = Store(tmp_path / "s.db")
    sid = _save(store, lanes[:2])
    parent = lanes[0]
    step = 4
    pos = step_position(parent, step)
    token = 100 if parent["output_ids"][pos] != 100 else 101
    bid = branch_session(store, sid, lane=0, step=step, token=token)
    b = store.load_session(bid)
    assert b["parent"] == sid and b["branch"]["lane"] == 0 and b["branch"]["step"] == step
    assert b["branch"]["position"] == pos and b["branch"]["token"] == token and b["branch"]["lanes"] == "one"
    # stored beside its parent: the parent's lane unchanged, then the branch
    kept, run = b["runs"]
    assert kept == parent
    assert run["output_ids"][:pos] == parent["output_ids"][:pos] and run["output_ids"][pos] == token
    assert run["force"] == [[pos, token]] and run["steps"][step]["forced"][0]["picked"] == parent["output_ids"][pos]
    # the divergence between the parent lane and its branch: 0 up to the forced token
    rows = lane_divergence(parent, run)
    assert [r["position"] for r in rows] == list(range(pos + 1)) and all(r["js"] == 0 for r in rows)
    # a branch of the branch keeps the earlier forced token
    reqs, _ = branch_requests(b, lane=1, token=7, position=pos + 3)
    assert reqs[0]["force"] == [[pos, token], [pos + 3, 7]]
    # export / import into a fresh database, then replay with no model: the tree and traces survive
    exported = json.dumps(store.export_session(sid))
    other = Store(tmp_path / "other.db")
    root = other.import_session(exported)
    tree = other.branch_tree(root)
    [kid] = tree["branches"]
    replayed = other.load_session(kid["id"])
    assert replayed["runs"] == b["runs"] and replayed["branch"] == b["branch"]
    fig = divergence_figure(replayed["runs"])
    assert any(t.name == "forced token" for t in fig.data)


def test_branch_every_lane_from_the_edited_prefix(lanes, tmp_path: Path):
    store = Store(tmp_path / "s.db")
    sid = _save(store, lanes[:2])
    pos = 3
    token = 100 if lanes[1]["output_ids"][pos] != 100 else 101
    bid = branch_session(store, sid, lane=1, position=pos, token=token, lanes="all")
    runs = store.load_session(bid)["runs"]
    assert [r["decoder"] for r in runs] == ["greedy", "top_p"]
    edited = lanes[1]["output_ids"][:pos] + [token]
    for r in runs:
        assert r["output_ids"][:pos + 1] == edited


@pytest.mark.parametrize("kw,msg", [
    (dict(lane=5, step=1, token=3), "no lane 6"),
    (dict(lane=0, step=99, token=3), "no step 99"),
    (dict(lane=0, token=3), "the step or the position"),
    (dict(lane=0, step=1, position=1, token=3), "the step or the position"),
    (dict(lane=0, step=1, token=3, lanes="some"), "'one' or 'all'"),
])
def test_bad_branch_requests_are_one_line_errors(lanes, kw, msg):
    session = {"runs": lanes[:2], "settings": {}}
    with pytest.raises(PlaygroundError, match=msg):
        branch_requests(session, **kw)


def test_sessions_cli_branch(lanes, tmp_path: Path, capsys):
    from playground.cli import main

    db = tmp_path / "s.db"
    with Store(db) as store:
        sid = _save(store, lanes[:2])
    token = 100 if lanes[0]["output_ids"][2] != 100 else 101
    assert main(["sessions", "--db", str(db), "branch", sid, "--lane", "1", "--position", "2",
                 "--token", str(token), "--json"]) == 0
    bid = json.loads(capsys.readouterr().out)["id"]
    with Store(db) as store:
        b = store.load_session(bid)
    assert b["parent"] == sid and b["runs"][1]["output_ids"][2] == token
    assert main(["sessions", "--db", str(db), "branch", sid, "--lane", "9", "--step", "1", "--token", "3"]) == 2
    assert "no lane 9" in capsys.readouterr().err


def test_a_replayed_branch_shows_its_forced_tokens():
    from visualizers import run_figures
    from visualizers.forced import forced_figure

    parent = playground.generate(decoder="greedy", **BASE)
    picked = parent["output_ids"][4]
    branch = json.loads(json.dumps(playground.generate(decoder="greedy", force=[[4, 100]], **BASE)))
    titles = [t for t, _ in run_figures(branch)]
    assert "Forced tokens" in titles
    fig = forced_figure(branch)
    bars = {t.name: t for t in fig.data}
    assert list(bars["forced token"].x) == ["4"] and list(bars["decoder's pick"].x) == ["4"]
    # greedy picked the most probable token: the forced one is less probable (or absent from the top-K)
    dist = parent["steps"][4]["dist"]
    assert bars["decoder's pick"].y[0] == dist["raw_probs"][dist["top_ids"].index(picked)]
    assert bars["forced token"].y[0] is None or bars["forced token"].y[0] <= bars["decoder's pick"].y[0]
    assert "Forced tokens" not in [t for t, _ in run_figures(parent)]
    assert forced_figure(parent).layout.annotations[0].text == "no forced token in this run"


def test_inspector_helpers_offer_the_steps_top_k_and_take_one_token_of_text(lanes):
    from playground.branching import resolve_token, token_choices
    from playground.core.models import load_model

    greedy = lanes[0]
    choices = token_choices(greedy, 3)
    dist = greedy["steps"][3]["dist"]
    assert [t for _, t in choices] == [t for t in dist["top_ids"] if t != greedy["output_ids"][3]]
    assert token_choices(greedy, 999) == []
    tok = load_model(MODEL).tokenizer
    one = tok.convert_ids_to_tokens(200)
    text = tok.convert_tokens_to_string([one])
    assert resolve_token(text, tok) == 200 and resolve_token(17) == 17 and resolve_token(" 42 ") == 42
    with pytest.raises(PlaygroundError, match="exactly one token"):
        resolve_token("wherefore art thou", tok)
    with pytest.raises(PlaygroundError, match="pick a token"):
        resolve_token("", tok)
