"""The bundled prompt set ``presets/prompts/shakespeare-24.jsonl``: 24 openings of scenes from
the held-out (validation) split of the corpus, so ``playground study`` runs out of the box.

The rule, run by :func:`scene_openings` and checked by the tests against the shipped file:
in each work's held-out tail (``playground.tiny_data.load_corpus``, the last 5 % of every
work by ``assets/corpus/split.json``), every scene heading (``SCENE V. Rome. A street...``)
opens a scene; so does an entrance right after everyone left the stage (``[Exeunt]`` then
``[Enter ...]``), and, to fill the set, an entrance right after an exit. A prompt is that opening up to and including the first line of its first
speech, at most ``MAX_CHARS`` characters; headings come first, then re-entrances, in corpus
order (each kind after the one before), until there are ``COUNT``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from playground.tiny_data import CORPUS_DIR, load_corpus

COUNT = 24
MAX_CHARS = 320
_HEADING = re.compile(r"(?mi)^scene [ivxl]+\b.*$")
_REENTRY = re.compile(r"\[Exeunt[^\]]*\]\s*\n\s*\n\s*(?=\[Enter)")
_AFTER_EXIT = re.compile(r"\[Exit[^\]]*\]\s*\n\s*\n\s*(?=\[Enter)")
# a speaker line (upper-case name ending with a full stop), then the first line of the speech
_FIRST_SPEECH = re.compile(r"\n\n([A-Z][A-Za-z' ,&-]+\.)\n([^\n]+)\n")


def _opening(text: str, start: int) -> str | None:
    m = _FIRST_SPEECH.search(text, start)
    if m is None:
        return None
    chunk = text[start:m.end()].strip("\n") + "\n"
    return chunk if len(chunk) <= MAX_CHARS else None


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40]


def scene_openings(count: int = COUNT) -> list[dict[str, Any]]:
    """The prompt set by the rule above: ``{"id", "work", "prompt"}`` records."""
    spec = json.loads((CORPUS_DIR / "split.json").read_text())
    _, val = load_corpus()
    found: list[dict[str, Any]] = []
    for pattern in (_HEADING, _REENTRY, _AFTER_EXIT):  # each kind after the one before
        for w, text in zip(spec["works"], val):
            for m in pattern.finditer(text):
                prompt = _opening(text, m.start() if pattern is _HEADING else m.end())
                if prompt:
                    found.append({"work": w["title"], "prompt": prompt})
    out = []
    for j, rec in enumerate(found[:count]):
        out.append({"id": f"{j + 1:02d}-{_slug(rec['work'])}", "work": rec["work"], "prompt": rec["prompt"]})
    return out


