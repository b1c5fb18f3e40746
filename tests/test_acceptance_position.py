"""Acceptance by draft position: counted per depth from the draft trees, the per-position
accepted counts sum to the run's accepted drafted tokens and the drafted counts to its drafted
tokens (a chain draft offers one node per depth, so offered equals drafted); the textbook
expectation; the run plot."""

from __future__ import annotations

import pytest

import playground
import visualizers
from playground.core.trace import acceptance_by_position, draft_depths, expected_tokens_per_verification
from visualizers.acceptance import TITLE, position_figure

MODEL, DRAFT = "tiny-shakespeare", "tiny-shakespeare-draft"
PROMPT = "ROMEO: But soft, what light"


def chain_tree(n: int, accepted: int) -> dict:
    return {"nodes": [{"id": i, "parent": i - 1 if i else None} for i in range(n)],
            "accepted_path": list(range(accepted))}


def test_hand_built_trees_count_by_depth():
    tree = {"nodes": [{"id": 0, "parent": None}, {"id": 1, "parent": None}, {"id": 2, "parent": 0},
                      {"id": 3, "parent": 2}, {"id": 4, "parent": 1}], "accepted_path": [1, 4]}
    assert draft_depths(tree["nodes"]) == [1, 1, 2, 3, 2]
    by = acceptance_by_position([tree, chain_tree(2, 0), chain_tree(4, 4), {"nodes": [], "accepted_path": []}])
    assert by == {"offered": [3, 3, 2, 1], "accepted": [2, 2, 1, 1], "drafted": [4, 4, 2, 1],
                  "rate": [0.6667, 0.6667, 0.5, 1.0]}
    assert acceptance_by_position([]) == {"offered": [], "accepted": [], "drafted": [], "rate": []}


def test_the_textbook_expectation():
    for alpha in (0.0, 0.3, 0.8, 0.999):
        for gamma in (1, 4, 7):
            assert expected_tokens_per_verification(alpha, gamma) == pytest.approx(
                sum(alpha ** k for k in range(gamma + 1)), abs=1e-4)
    assert expected_tokens_per_verification(1.0, 5) == 6.0 and expected_tokens_per_verification(0.5, 0) == 1.0


# confidence 0: drafts of a fixed length (the default stops a draft at an unlikely token, so
# deep positions are offered only sometimes; the sums must hold either way)
@pytest.mark.parametrize("decoder,knobs", [("speculative", {"gamma": 4, "temperature": 1.0, "confidence": 0.0}),
                                           ("speculative", {"temperature": 1.0}),
                                           ("spec_tree", {"depth": 3, "width": 2, "confidence": 0.0})])
def test_per_position_counts_sum_to_the_runs_figures(decoder, knobs):
    tr = playground.generate(model=MODEL, draft=DRAFT, decoder=decoder, prompt=PROMPT, max_new_tokens=24,
                             seed=1, **knobs)
    s = tr["stats"]
    by = s["acceptance_by_position"]
    assert sum(by["accepted"]) == s["accepted_tokens"]
    assert sum(by["drafted"]) == s["drafted_tokens"]
    assert by["offered"][0] == sum(1 for st in tr["steps"] if st["tree"]["nodes"]) <= s["verifications"]
    assert all(a <= o for a, o in zip(by["accepted"], by["offered"]))
    assert by["accepted"] == sorted(by["accepted"], reverse=True)  # accepting at i needs i - 1 first
    if decoder == "speculative":
        assert by["offered"] == by["drafted"]
        if knobs.get("confidence") == 0.0:
            assert len(by["offered"]) == 4
        else:  # stopped drafts offer the deep positions less often
            assert by["offered"] == sorted(by["offered"], reverse=True)
    else:
        assert sum(by["drafted"]) > sum(by["offered"])  # a tree drafts several nodes per depth
    figs = dict(visualizers.run_figures(tr))
    assert TITLE in figs
    fig = position_figure(tr)
    assert list(fig.data[0].y) == by["rate"]
    assert "textbook" in fig.layout.title.subtitle.text


def test_non_speculative_runs_have_no_such_figure():
    tr = playground.generate(model=MODEL, decoder="greedy", prompt=PROMPT, max_new_tokens=2)
    assert "acceptance_by_position" not in tr["stats"]
    assert position_figure(tr).layout.annotations
