"""Best-first lattice search with recombination (``best_first_beam`` with ``recombine``): with
no merge it is best-first's search exactly; a merge joins hypotheses of one length that share
their last n tokens, is never expanded and costs no beam slot; paths encoded are counted
through the merges."""

from __future__ import annotations

import heapq
from collections import Counter

import pytest

from decoders.search.best_first import Entry, Lattice, take_wave
from playground.engine import prepare
from visualizers.lattice import lattice_figure

PROMPTS = ["ROMEO: But soft", "To be, or not to be"]


def entry(uid: int, ids: list[int], score: float, parent: int = -1) -> Entry:
    return Entry((-score, uid), ids, score, False, parent)


def test_merge_rule_by_hand():
    lat = Lattice(2)
    assert lat.merge_target(entry(1, [5, 7, 9], -1.0, 0)) is None  # the first holder of (3, 7, 9)
    assert lat.merge_target(entry(2, [6, 7, 9], -2.0, 0)) == 1  # same length, same last 2 tokens
    assert lat.merge_target(entry(3, [6, 6, 7, 9], -2.5, 2)) is None  # another length: a node of its own
    assert lat.merge_target(entry(4, [9], -0.5, 0)) is None  # shorter than n: never merged
    assert lat.merge_target(entry(5, [6, 8, 9], -3.0, 0)) is None
    assert lat.merges == 1 and lat.into == {1: [0]}


def test_paths_encoded_by_hand():
    """root 0 -> a (1), b (2); a -> c (3); b's child merged into c; c's leaves count 2 paths."""
    lat = Lattice(1)
    root, a, b = entry(0, [], 0.0), entry(1, [10], -1.0, 0), entry(2, [11], -1.5, 0)
    c, merged = entry(3, [10, 12], -2.0, 1), entry(4, [11, 12], -2.5, 2)
    lat.evidence([root], [])
    assert lat.merge_target(a) is None and lat.merge_target(b) is None
    lat.evidence([a, b], [])
    assert lat.merge_target(c) is None and lat.merge_target(merged) == 3
    lat.evidence([c], [(merged, 3)])
    leaves = [entry(5, [10, 12, 13], -3.0, 3), entry(6, [10, 12, 14], -3.2, 3), entry(7, [10, 15], -4.0, 1)]
    # two leaves under c (2 paths each: via a and via b) + one under a (1 path)
    assert lat.paths_encoded(leaves[1:], leaves[0]) == 2 + 2 + 1


def test_take_wave_merges_without_a_pop():
    queue = [entry(1, [3, 4], -1.0, 0), entry(2, [5, 4], -1.2, 0), entry(3, [6, 7], -1.4, 0)]
    heapq.heapify(queue)
    pops: Counter = Counter()
    lat = Lattice(1)
    wave, dropped, merged = take_wave(queue, pops, 2, lat.merge_target)
    assert [e.uid for e in wave] == [1, 3] and [(e.uid, into) for e, into in merged] == [(2, 1)]
    assert pops[2] == 2 and dropped == 0 and not queue


@pytest.fixture(scope="module")
def shakespeare():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu")


def run(model, prompt, n=16, **params):
    return prepare(model=model, decoder="best_first_beam", prompt=prompt, max_new_tokens=n,
                   params={"num_beams": 3, **params}).finish()


def test_without_merges_it_is_best_first(shakespeare):
    checked = 0
    for prompt in PROMPTS[:1]:
        plain = run(shakespeare, prompt)
        for n in (3, 16):  # 16 > every length: no merge is possible
            lat = run(shakespeare, prompt, recombine=n)
            if lat.stats["merges"]:
                continue
            checked += 1
            assert lat.output_ids == plain.output_ids
            for key in ("expansions", "waves", "best_score", "target_forwards"):
                assert lat.stats[key] == plain.stats[key], key
            assert [s.evidence["beams"] for s in lat.steps] == [s.evidence["beams"] for s in plain.steps]
    assert checked >= 1


def test_merges_join_equal_suffixes_of_one_length_and_are_never_expanded(shakespeare):
    tr = run(shakespeare, PROMPTS[0], n=16, recombine=1)
    nodes, merges = {}, []
    for s in tr.steps:
        ev = s.evidence["lattice"]
        nodes.update({row[0]: row for row in ev["nodes"]})
        merges += ev["merges"]
    assert tr.stats["merges"] == len(merges) > 0
    popped = Counter(len(b["ids"]) for s in tr.steps for b in s.evidence["beams"])
    assert max(popped.values()) <= 3  # merged hypotheses take no beam slot
    for uid, parent, depth, token, into in merges:
        assert uid not in nodes  # never expanded
        assert nodes[into][2] == depth and nodes[into][3] == token  # one length, same last token (n = 1)
    fig = lattice_figure(tr.to_dict())  # drawn, not a note
    assert "merge" in [d.name for d in fig.data]
