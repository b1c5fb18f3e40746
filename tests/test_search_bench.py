"""The search bench suite's measures: distinct-n and the two agreements with the large model."""

from __future__ import annotations

import pytest
import torch

from playground.bench import suites
from playground.bench.search import distinct_n, positional_agreement, teacher_forced_agreement
from playground.engine import prepare


def test_search_is_a_suite():
    assert "search" in suites()


def test_distinct_n():
    assert distinct_n([1, 2, 1, 2, 1, 2]) == pytest.approx(2 / 5)
    assert distinct_n([1, 2, 3, 4]) == 1.0 and distinct_n([7]) == 1.0
    assert distinct_n([1, 1, 1, 1], 1) == 0.25


def test_agreements(llama_handle):
    greedy = prepare(model=llama_handle, decoder="greedy", prompt="ROMEO: But soft", max_new_tokens=6).finish()
    assert teacher_forced_agreement(llama_handle, greedy.prompt_ids, greedy.output_ids) == 1.0
    bad = [(t + 1) % llama_handle.vocab_size for t in greedy.output_ids]
    logits = llama_handle.forward(greedy.prompt_ids + bad).logits[0]
    p = len(greedy.prompt_ids)
    want = sum(int(torch.argmax(logits[p - 1 + i])) == t for i, t in enumerate(bad)) / len(bad)
    assert teacher_forced_agreement(llama_handle, greedy.prompt_ids, bad) == pytest.approx(want)
    assert positional_agreement([1, 2, 3, 4], [1, 9, 3]) == 0.5


def test_every_search_and_collaboration_decoder_is_benched():
    from decoders.base import all_decoders
    from playground.bench.search import SEARCH, collab_configs

    benched = {c[1] for c in SEARCH} | {c[1] for c in collab_configs()}
    wanted = {c.name for c in all_decoders() if c.family in ("search", "collab")}
    assert wanted <= benched, wanted - benched


@pytest.fixture(scope="module")
def shakespeare():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare")


def test_search_rows_show_best_first_matching_beam_in_no_more_forwards(shakespeare):
    from playground.bench.search import NEWLINE, REFERENCE, search_rows

    configs = [("beam", REFERENCE[0], REFERENCE[1], NEWLINE),
               ("best-first", "best_first_beam", {"num_beams": 4}, NEWLINE),
               ("greedy", "greedy", {}, None)]
    (_, _, _, beam_same, beam_fw, _), (_, ppl, dist, bf_same, bf_fw, wall), greedy = search_rows(
        shakespeare, ["Ham.\nTo be, or not to be, that is the question:\n"], 16, configs)
    assert beam_same == bf_same == 1.0  # best-first returns beam search's answer
    assert bf_fw <= beam_fw
    assert ppl > 1.0 and 0.0 < dist <= 1.0 and wall > 0.0
    assert greedy[4] == 16  # one target forward per greedy token


def test_collab_rows_measure_the_two_limits_of_ead(shakespeare):
    from playground.bench.search import collab_rows

    configs = [("large only", "ead", "tiny-shakespeare-draft", {"entropy_threshold": 0.0, "span": 4}),
               ("small only", "ead", "tiny-shakespeare-draft", {"entropy_threshold": 100.0, "span": 4})]
    large, small = collab_rows(shakespeare, ["Prospero.\nOur revels now are ended.\n"], 12, configs)
    assert large[1] == 0.0 and large[2] == 1.0 and large[3] == 1.0  # the large model's greedy text
    assert small[1] == 1.0 and small[4] == 0  # the small model wrote all of it, no target forward
