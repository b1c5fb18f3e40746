"""A hand on the canvas: a reader commits chosen positions (and tokens) at one step of a diffusion
lane, the lane goes on with its own rule, and the result is a stored branch of the session.

Engine: the hand step is recorded (positions, tokens, what the plan would have picked) and its
tokens never change afterwards; choosing exactly what the decoder committed at step ``s`` gives
the parent's run back, step for step (the exactness of resuming by replay), for fixed-schedule,
threshold, Dream-schedule and rule plans; a fixed schedule re-spreads what a hand left.
Branching: the branch is stored beside its parent, replays from the store with its hand step, and
every bad request is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import playground
from playground.branching import branch_canvas, canvas_choices, canvas_requests, masked_at
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from playground.store import Store

MODEL = "tiny-shakespeare-diffusion"
PROMPT = "ROMEO: But soft"
N = 12


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL, device="cpu")


def run(model, decoder: str, hand=None, **params) -> dict:
    return json.loads(json.dumps(prepare(model=model, decoder=decoder, prompt=PROMPT, max_new_tokens=N,
                                         params=params, hand=hand).finish().to_dict()))


def own_choice(trace: dict, s: int) -> dict:
    st = trace["steps"][s]
    return {"step": s, "commit": [[p, st["canvas"][p]] for p in st["unmasked"]]}


@pytest.mark.parametrize("decoder,params", [("llada", {}), ("llada", {"steps": 6}), ("fast_dllm", {}),
                                            ("llada", {"steps": 4, "block_length": 6}),
                                            ("dream", {"steps": 4}), ("ete", {}), ("credit", {}), ("ass", {}),
                                            ("masked_diffusion", {"steps": 6, "plan": "origin"}),
                                            ("sched", {"steps": 6}), ("r2_dllm", {})])
def test_choosing_what_the_decoder_chose_gives_the_parent_back(model, decoder, params):
    parent = run(model, decoder, **params)
    n = len(parent["steps"])
    for s in [s for s in sorted({0, 1, n // 2, n - 1}) if parent["steps"][s]["unmasked"]]:
        b = run(model, decoder, own_choice(parent, s), **params)
        assert b["output_ids"] == parent["output_ids"], (decoder, s)
        assert [x["canvas"] for x in b["steps"]] == [x["canvas"] for x in parent["steps"]]
        hand = b["steps"][s]["hand"]
        assert hand["positions"] == parent["steps"][s]["unmasked"] == hand["picked"]["positions"]
        assert hand["ids"] == hand["picked"]["ids"] == hand["proposed"]
        assert b["hand"] == own_choice(parent, s)
        assert all("hand" not in x for k, x in enumerate(b["steps"]) if k != s)


def test_a_hand_chosen_commit_is_in_the_trace_and_never_changes(model):
    parent = run(model, "llada", steps=6)
    s = 2
    st = parent["steps"][s]
    # a position the plan did not commit at step s, with the model's 4th choice there
    pos = next(p for p in masked_at(parent, s) if p not in st["unmasked"])
    tok = st["top_ids"][pos][3]
    assert tok != st["predicted"][pos]
    b = run(model, "llada", {"step": s, "commit": [[pos, tok]]}, steps=6)
    hs = b["steps"][s]
    assert hs["hand"]["positions"] == [pos] and hs["hand"]["ids"] == [tok]
    assert hs["hand"]["proposed"] == [st["predicted"][pos]] and hs["predicted"][pos] == st["predicted"][pos]
    assert hs["hand"]["picked"]["positions"] == st["unmasked"]  # what the plan would have committed
    assert hs["unmasked"] == [pos] and hs["committed"] == [tok]
    # steps before the hand are the parent's; from the hand on the position holds the chosen token
    assert [x["canvas"] for x in b["steps"][:s]] == [x["canvas"] for x in parent["steps"][:s]]
    assert all(x["canvas"][pos] == tok for x in b["steps"][s:])
    assert all(pos not in x["unmasked"] for k, x in enumerate(b["steps"]) if k != s)
    # the hand committed 1 where the even schedule planned 2: the block's rest is re-spread over
    # its remaining steps (LLaDA's even rule), and every position is committed exactly once
    assert [len(x["unmasked"]) for x in b["steps"]] == [2, 2, 1, 3, 2, 2]
    assert sorted(p for x in b["steps"] for p in x["unmasked"]) == list(range(N))


@pytest.mark.parametrize("decoder,params,counts", [("llada", {"steps": 6}, [2, 2, 2, 2, 2, 1, 1]),
                                                   ("ass", {}, [1, 1, 4, 1, 5])])
def test_a_hand_at_a_blocks_last_step_that_leaves_masks_adds_one_step(model, decoder, params, counts):
    parent = run(model, decoder, **params)
    s = len(parent["steps"]) - 1
    last = parent["steps"][s]
    assert len(last["unmasked"]) > 1
    b = run(model, decoder, {"step": s, "commit": [[last["unmasked"][0], 5]]}, **params)
    assert [len(x["unmasked"]) for x in b["steps"]] == counts
    assert b["steps"][s]["hand"]["ids"] == [5] and b["steps"][-1]["canvas"][last["unmasked"][0]] == 5
    assert sorted(p for x in b["steps"] for p in x["unmasked"]) == list(range(N))


def test_the_python_api_takes_a_hand(model):
    parent = run(model, "llada", steps=6)
    pos = masked_at(parent, 1)[-1]
    t = playground.generate(model=MODEL, decoder="llada", prompt=PROMPT, max_new_tokens=N, steps=6,
                            hand={"step": 1, "commit": [[pos, 7]]})
    assert t["hand"] == {"step": 1, "commit": [[pos, 7]]} and t["steps"][1]["hand"]["ids"] == [7]
    assert [x["canvas"] for x in t["steps"]] == [x["canvas"] for x in run(model, "llada", t["hand"], steps=6)["steps"]]
    assert all(x["canvas"][pos] == 7 for x in t["steps"][1:])


def test_engine_refusals_are_one_line(model):
    with pytest.raises(PlaygroundError, match="cannot take a hand on its canvas: its loop is its own"):
        run(model, "freedave", {"step": 0, "commit": [[0, 5]]}, block_length=4)
    with pytest.raises(PlaygroundError, match="not a diffusion decoder"):
        prepare(model="tiny-shakespeare", decoder="greedy", prompt=PROMPT, max_new_tokens=4,
                hand={"step": 0, "commit": [[0, 5]]})
    with pytest.raises(PlaygroundError, match="before the hand's step 40"):
        run(model, "llada", {"step": 40, "commit": [[0, 5]]})
    parent = run(model, "llada")
    done = parent["steps"][0]["unmasked"][0]
    with pytest.raises(PlaygroundError, match=f"hand position {done} is not masked at step 1"):
        run(model, "llada", {"step": 1, "commit": [[done, 5]]})
    for hand, msg in [({"step": 0, "commit": [[99, 5]]}, "past the canvas of 12"),
                      ({"step": 0, "commit": [[0, 10 ** 7]]}, "outside the vocabulary"),
                      ({"step": 0, "commit": []}, "at least one"),
                      ({"step": 0, "commit": [[0, 5], [0, 6]]}, "twice"),
                      ({"step": -1, "commit": [[0, 5]]}, "whole number"),
                      ({"commit": [[0, 5]]}, "a hand is"),
                      ({"step": 0, "commit": [[p, 5] for p in range(65)]}, "at most 64")]:
        with pytest.raises(PlaygroundError, match=msg) as e:
            run(model, "llada", hand)
        assert "\n" not in str(e.value)


def _session(store: Store, traces: list[dict]) -> str:
    return store.save_session("canvas", MODEL, PROMPT, {"max_new_tokens": N}, traces)


def test_the_branch_is_stored_and_replays_with_its_hand(model, tmp_path: Path):
    parent = run(model, "fast_dllm")
    store = Store(tmp_path / "s.db")
    sid = _session(store, [parent])
    s = 1
    st = parent["steps"][s]
    pos = next(p for p in masked_at(parent, s) if p not in st["unmasked"])
    offered = canvas_choices(parent, s, pos)
    assert [t for _l, t in offered] == st["top_ids"][pos] and "p=" in offered[0][0]
    tok = offered[2][1]
    bid = branch_canvas(store, sid, lane=0, step=s, commit={pos: tok}, restrict=True)
    b = store.load_session(bid)
    assert b["parent"] == sid and b["branch"] == {"lane": 0, "step": s, "position": pos, "token": tok,
                                                  "lanes": "one", "hand": [[pos, tok]],
                                                  **({"text": parent["tokens"][str(tok)]}
                                                     if str(tok) in parent["tokens"] else {})}
    kept, lane = b["runs"]
    assert kept == parent
    assert lane["hand"] == {"step": s, "commit": [[pos, tok]]}
    assert lane["steps"][s]["hand"]["positions"] == [pos] and lane["steps"][s]["hand"]["ids"] == [tok]
    assert all(x["canvas"][pos] == tok for x in lane["steps"][s:])
    assert str(tok) in lane["tokens"]  # the replay shows the chosen token's text with no tokenizer
    # the stored request re-runs to the same lane: the branch replays
    again = run(model, "fast_dllm", lane["hand"])
    assert [x["canvas"] for x in again["steps"]] == [x["canvas"] for x in lane["steps"]]
    # export / import keeps the tree and the hand
    other = Store(tmp_path / "o.db")
    root = other.import_session(json.dumps(store.export_session(sid)))
    [kid] = other.branch_tree(root)["branches"]
    assert other.load_session(kid["id"])["runs"] == b["runs"] and kid["branch"]["hand"] == [[pos, tok]]
    # a list of positions takes the model's top-1 at each
    req, rec = canvas_requests(store.load_session(sid), 0, s, [pos])
    assert req["hand"]["commit"] == [[pos, st["top_ids"][pos][0]]] and rec["token"] == st["top_ids"][pos][0]


def test_a_visitor_branch_is_not_filed_under_the_parent(model, tmp_path: Path):
    parent = run(model, "llada", steps=6)
    store = Store(tmp_path / "s.db")
    sid = _session(store, [parent])
    pos = masked_at(parent, 0)[0]
    bid = branch_canvas(store, sid, lane=0, step=0, commit=[pos], attach=False)
    assert store.load_session(bid)["parent"] is None and store.load_session(sid).get("branches") in (None, [])


def test_bad_canvas_branch_requests_are_one_line(model):
    parent = run(model, "llada", steps=6)
    greedy = prepare(model="tiny-shakespeare", decoder="greedy", prompt=PROMPT, max_new_tokens=4).finish().to_dict()
    session = {"runs": [parent, greedy], "settings": {"max_new_tokens": N}}
    done = parent["steps"][0]["unmasked"][0]
    free = next(p for p in masked_at(parent, 1) if p not in parent["steps"][1]["unmasked"])
    not_top = next(t for t in range(100) if t not in parent["steps"][1]["top_ids"][free])
    for kw, msg in [(dict(lane=4, step=0, commit=[0]), "no lane 5"),
                    (dict(lane=1, step=0, commit=[0]), "only a diffusion lane"),
                    (dict(lane=0, step=6, commit=[0]), "no step 6"),
                    (dict(lane=0, step=1, commit=[done]), f"position {done} is not masked at step 1"),
                    (dict(lane=0, step=1, commit=[40]), "position 40 is not masked at step 1"),
                    (dict(lane=0, step=1, commit=[]), "at least one"),
                    (dict(lane=0, step=1, commit=[[free, 1], [free, 2]]), "chosen twice"),
                    (dict(lane=0, step=1, commit=[[free, "x"]]), "whole number"),
                    (dict(lane=0, step=1, commit="3"), "choose the positions"),
                    (dict(lane=0, step=1, commit=list(range(65))), "at most 64"),
                    (dict(lane=0, step=1, commit={free: not_top}, restrict=True), "not among position")]:
        with pytest.raises(PlaygroundError, match=msg) as e:
            canvas_requests(session, **kw)
        assert "\n" not in str(e.value)
    # an unrestricted token outside the top-K is taken; one outside the vocabulary is refused by the run
    req, _ = canvas_requests(session, 0, 1, {free: not_top})
    assert req["hand"]["commit"] == [[free, not_top]]


# ---------------------------------------------------------------------- the page's panel (handlers)
@pytest.mark.slow
def test_the_branch_panel_pauses_a_diffusion_lane_and_continues_with_the_readers_commits(model, demo, db):
    from playground.store import default_store

    page = demo.compare_page
    bp = page.branch
    greedy = prepare(model="tiny-shakespeare", decoder="greedy", prompt=PROMPT, max_new_tokens=4).finish().to_dict()
    parent = run(model, "llada", steps=6)
    sid = default_store().save_session("canvas", MODEL, PROMPT, {"max_new_tokens": N},
                                       [json.loads(json.dumps(greedy)), parent])
    traces = default_store().load_session(sid)["runs"]
    s = 2
    up = bp.on_pick(traces, 1, s)
    assert up[bp.canvas]["visible"] is True and up[bp.button]["visible"] is False
    offered = [p for _l, p in up[bp.canvas_pos]["choices"]]
    assert offered == masked_at(parent, s)
    assert "paused at step 2" in up[bp.where] and 'data-step="2"' in up[bp.where]
    # an AR lane shows the token controls again
    assert bp.on_pick(traces, 0, 1)[bp.canvas]["visible"] is False
    pos, other = [p for p in offered if p not in parent["steps"][s]["unmasked"]][:2]
    toks = bp.on_canvas_at(traces, 1, s, pos)[bp.canvas_token]
    assert [t for _l, t in toks["choices"]] == parent["steps"][s]["top_ids"][pos] and toks["value"] == toks["choices"][0][1]
    tok = toks["choices"][1][1]
    out = bp.on_continue(sid, traces, 1, s, [other], pos, tok)
    note = out[bp.status]
    assert "your commits at step 2" in note and "and 1 more" in note, note
    b = default_store().load_session(default_store().list_sessions()[0]["id"])
    assert b["parent"] == sid and b["branch"]["hand"] == sorted([[pos, tok], [other, parent["steps"][s]["top_ids"][other][0]]])
    assert b["runs"][1]["steps"][s]["hand"]["positions"] == sorted([pos, other])
    # nothing chosen, or a token missing for the picked position: one line, nothing stored
    n = len(default_store().list_sessions())
    assert "at least one" in bp.on_continue(sid, traces, 1, s, [], None, None)[bp.status]
    assert "pick a token for position" in bp.on_continue(sid, traces, 1, s, [], pos, None)[bp.status]
    assert "lane 1 is not a diffusion lane" in bp.on_continue(sid, traces, 0, 1, [0], None, None)[bp.status]
    assert len(default_store().list_sessions()) == n


def test_sessions_cli_branches_a_diffusion_lane_at_its_canvas(model, tmp_path: Path, capsys):
    from playground.cli import main

    parent = run(model, "llada", steps=6)
    db = tmp_path / "s.db"
    with Store(db) as store:
        sid = _session(store, [parent])
    a, b = [p for p in masked_at(parent, 1) if p not in parent["steps"][1]["unmasked"]][:2]
    assert main(["sessions", "--db", str(db), "branch", sid, "--lane", "1", "--step", "1",
                 "--commit", f"{a},{b}:7", "--json"]) == 0
    bid = json.loads(capsys.readouterr().out)["id"]
    with Store(db) as store:
        br = store.load_session(bid)
    assert br["branch"]["hand"] == sorted([[a, parent["steps"][1]["top_ids"][a][0]], [b, 7]])
    assert main(["sessions", "--db", str(db), "show", bid]) == 0
    assert "canvas branch at lane 1 step 1: the reader committed" in capsys.readouterr().out
    for extra, msg in [(["--commit", "x"], "POS or POS:TOKEN_ID"), (["--commit", f"{a}", "--token", "3"], "--commit branches"),
                       ([], "needs --token")]:
        assert main(["sessions", "--db", str(db), "branch", sid, "--lane", "1", "--step", "1", *extra]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.strip().count("\n") == 0, err
