"""Preset prompts speak the bundled models' language: the corpus's own speaker format.

The corpus writes a speaker as ``NAME.`` on a line of its own (``KING HENRY.``, ``Ham.``,
``Juliet.``), never ``ROMEO:``; a prompt in another format shows the bundled models text
they never saw, and the presets' points (confident drafts, parallel commits) get lost.
"""

from __future__ import annotations

import gzip
import re
from functools import lru_cache
from pathlib import Path

import pytest

from playground.presets import list_presets, load_preset

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "corpus" / "shakespeare_complete_works.txt.gz"
# a line that names a speaker: capitalised words, ending in "." or ":" and nothing else
SPEAKER = re.compile(r"^[A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*)*[.:]$")


@lru_cache(maxsize=1)
def corpus_lines() -> frozenset[str]:
    with gzip.open(CORPUS, "rt", encoding="ascii") as f:
        return frozenset(line.strip() for line in f)


@pytest.mark.parametrize("name", [p["name"] for p in list_presets()])
def test_preset_speakers_are_written_as_the_corpus_writes_them(name):
    prompt = load_preset(name)["prompt"]
    speakers = [line for line in prompt.splitlines() if SPEAKER.match(line)]
    assert speakers, f"{name}: the prompt names no speaker"
    for line in speakers:
        assert not line.endswith(":"), f"{name}: speaker {line!r} — the corpus writes {line[:-1]}."
        assert line in corpus_lines(), f"{name}: the corpus never has the speaker line {line!r}"


def test_the_format_check_catches_the_old_format():
    assert SPEAKER.match("ROMEO:") and "ROMEO." not in corpus_lines() and "Romeo." in corpus_lines()
    assert "KING HENRY." in corpus_lines() and "Ham." in corpus_lines()
