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
