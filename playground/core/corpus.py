"""The bundled corpus and its fixed train/validation split (``assets/corpus/split.json``).

Shakespeare's complete works, gzipped, with each work's last 5 % held out for validation. The
tiny models are trained and scored by this split (``playground/tiny_data.py``), and decoders
that build statistics from text (``superposed``'s n-gram tables) read its training part, so
nothing they see overlaps what the models are scored on.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from playground.core.errors import PlaygroundError
from playground.core.models.sources import ASSETS

CORPUS_DIR = ASSETS / "corpus"


def corpus_split(corpus_dir: Path = CORPUS_DIR) -> tuple[list[str], list[str]]:
    """(train, validation): one string per work, each work cut at its ``val_start``."""
    spec = json.loads((corpus_dir / "split.json").read_text())
    with gzip.open(corpus_dir / spec["corpus"], "rb") as f:
        text = f.read().decode("utf-8")
    if len(text) != spec["corpus_chars"]:
        raise PlaygroundError(f"the corpus in {corpus_dir} does not match its split.json")
    train = [text[w["start"]:w["val_start"]] for w in spec["works"]]
    val = [text[w["val_start"]:w["end"]] for w in spec["works"]]
    return train, val
