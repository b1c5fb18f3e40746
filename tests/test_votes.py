"""Blind ballots: the reader's letters, what a vote may say, one ballot per reader in the store,
and the Results table over configurations."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from playground.ballots import ballot_from_letters, check_ballot, lane_comparisons, reader_order
from playground.cli import main
from playground.core.errors import PlaygroundError
from playground.ownership import owner_id
from playground.store import Store
from playground.votes import config_key, results, results_table
from tests.test_store import make_trace

READER = owner_id("r" * 40)
OTHER = owner_id("s" * 40)


def _lanes(*decoders: str, temps=None) -> list[dict]:
    out = []
    for k, d in enumerate(decoders):
        t = make_trace(d, seed=k)
        if temps:
            t["params"] = {"temperature": temps[k]}
        out.append(t)
    return out


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "v.db")
    yield s
    s.close()


def test_reader_order_is_a_fixed_permutation_that_differs_between_readers():
    orders = {tuple(reader_order("S" * 32, owner_id(f"{k:040d}"), 4)) for k in range(40)}
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    assert len(orders) > 6  # readers see different orders
    assert reader_order("S" * 32, READER, 4) == reader_order("S" * 32, READER, 4)


def test_letters_map_through_the_readers_order():
    order = [2, 0, 1]
    assert ballot_from_letters({"kind": "best", "winner": "A"}, order) == {"kind": "best", "winner": 2}
    assert ballot_from_letters({"kind": "best", "winner": "tie"}, order) == {"kind": "best", "winner": None}
    assert ballot_from_letters({"kind": "pair", "a": "b", "b": "C", "winner": "b"}, order) == \
        {"kind": "pair", "a": 0, "b": 1, "winner": "b"}
    for bad in ({"kind": "best", "winner": "D"}, {"kind": "pair", "a": "A", "b": "A", "winner": "a"},
                {"kind": "pair", "a": "A", "b": "B", "winner": "x"}, {"kind": "x"}, "A", None,
                {"kind": "best", "winner": 0}):
        with pytest.raises(PlaygroundError):
            ballot_from_letters(bad, order)


def test_ballots_become_pairwise_outcomes():
    assert lane_comparisons({"kind": "best", "winner": 1}, 3) == [(1, 0, 1.0), (1, 2, 1.0)]
    assert lane_comparisons({"kind": "best", "winner": None}, 3) == [(0, 1, 0.5), (0, 2, 0.5), (1, 2, 0.5)]
    assert lane_comparisons({"kind": "pair", "a": 2, "b": 0, "winner": "b"}, 3) == [(2, 0, 0.0)]
    with pytest.raises(PlaygroundError):
        check_ballot({"kind": "best", "winner": 5}, 3)
    with pytest.raises(PlaygroundError):
        check_ballot({"kind": "best", "winner": True}, 3)


def test_votes_need_a_blind_session_and_keep_one_ballot_per_reader(store: Store):
    sid = store.save_session("t", "tiny-llama", "ROMEO:", {}, _lanes("greedy", "top_p"), owner=OTHER)
    with pytest.raises(PlaygroundError, match="not blind"):
        store.add_ballot(sid, READER, {"kind": "best", "winner": 0})
    with pytest.raises(PlaygroundError, match="only the browser"):
        store.set_blind(sid, True, owned_by=READER)
    store.set_blind(sid, True, owned_by=OTHER)
    assert store.load_session(sid)["settings"]["blind"] is True
    assert store.add_ballot(sid, READER, {"kind": "best", "winner": 0}, "  crisper  ") is False
    assert store.add_ballot(sid, READER, {"kind": "best", "winner": 1}) is True  # replaced
    assert store.ballot_of(sid, READER)["ballot"] == {"kind": "best", "winner": 1}
    store.add_ballot(sid, OTHER, {"kind": "pair", "a": 0, "b": 1, "winner": "tie"}, "same")
    assert store.ballot_count(sid) == 2
    assert [b["reason"] for b in store.ballots([sid])] == ["", "same"]
    for bad_reader in ("", "abc", None, 7):
        with pytest.raises(PlaygroundError, match="key"):
            store.add_ballot(sid, bad_reader, {"kind": "best", "winner": 0})
    with pytest.raises(PlaygroundError, match="at most 500"):
        store.add_ballot(sid, READER, {"kind": "best", "winner": 0}, "x" * 501)
    assert store.ballot_of(sid, READER)["ballot"] == {"kind": "best", "winner": 1}  # refused: unchanged
    store.delete_session(sid)
    assert store.ballots() == []


def test_a_one_lane_session_cannot_be_blind(store: Store):
    sid = store.save_session("t", "tiny-llama", "ROMEO:", {}, _lanes("greedy"))
    with pytest.raises(PlaygroundError, match="two lanes"):
        store.set_blind(sid, True)


def test_the_ballot_limit_per_session(store: Store, monkeypatch):
    monkeypatch.setattr("playground.ballots.MAX_BALLOTS_PER_SESSION", 2)
    sid = store.save_session("t", "tiny-llama", "ROMEO:", {}, _lanes("greedy", "top_p"))
    store.set_blind(sid, True)
    store.add_ballot(sid, owner_id("a" * 40), {"kind": "best", "winner": 0})
    store.add_ballot(sid, owner_id("b" * 40), {"kind": "best", "winner": 0})
    with pytest.raises(PlaygroundError, match="takes no more"):
        store.add_ballot(sid, owner_id("c" * 40), {"kind": "best", "winner": 0})
    store.add_ballot(sid, owner_id("a" * 40), {"kind": "best", "winner": 1})  # a revote still counts


def test_an_older_database_gains_the_ballots_table(tmp_path: Path):
    path = tmp_path / "old.db"
    with Store(path) as s:
        sid = s.save_session("t", "tiny-llama", "ROMEO:", {}, _lanes("greedy", "top_p"))
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE ballots")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    with Store(path) as s:
        s.set_blind(sid, True)
        s.add_ballot(sid, READER, {"kind": "best", "winner": 0})
        assert s.ballot_count(sid) == 1


def test_results_pool_configurations_across_sessions_and_rank_the_winner_first(store: Store):
    sids = []
    for k in range(6):  # the same two configurations, lanes in either order, different seeds
        lanes = _lanes("greedy", "top_p") if k % 2 else _lanes("top_p", "greedy")
        sid = store.save_session(f"s{k}", "tiny-llama", "ROMEO:", {}, lanes)
        store.set_blind(sid, True)
        greedy_lane = 0 if k % 2 else 1
        for r in range(3):
            store.add_ballot(sid, owner_id(f"{k}{r}" * 20), {"kind": "best", "winner": greedy_lane if r < 2 else 1 - greedy_lane},
                             "clear" if r == 0 else "")
        sids.append(sid)
    res = results([store.load_session(s) for s in sids], store.ballots(sids))
    assert res.ballots == 18 and res.sessions == 6 and len(res.rows) == 2
    top, bottom = res.rows
    assert top.label.startswith("greedy") and top.wins == 12 and top.losses == 6
    assert top.score > 0 > bottom.score and top.sessions == 6
    assert top.low < top.score < top.high
    assert len(res.reasons) == 6 and all(r["reason"] == "clear" for r in res.reasons)
    assert "greedy" in results_table(res)


def test_same_decoder_with_other_knobs_is_another_configuration():
    a, b = _lanes("top_p", "top_p", temps=[0.3, 1.2])
    assert config_key("m", a) != config_key("m", b)
    c = dict(a, seed=99)
    assert config_key("m", a) == config_key("m", c)


def test_the_command_line_marks_blind_and_prints_the_table(tmp_path: Path, capsys):
    db = tmp_path / "cli.db"
    with Store(db) as s:
        sid = s.save_session("t", "tiny-llama", "ROMEO:", {}, _lanes("greedy", "top_p"))
    assert main(["votes", "--db", str(db), "blind", sid]) == 0
    with Store(db) as s:
        s.add_ballot(sid, READER, {"kind": "best", "winner": 1})
    capsys.readouterr()
    assert main(["votes", "--db", str(db), "results", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ballots"] == 1 and data["rows"][0]["label"].startswith("top_p") and data["rows"][0]["low"] is None
    assert main(["votes", "--db", str(db), "blind", "not-an-id"]) != 0
    assert "malformed session id" in capsys.readouterr().err
