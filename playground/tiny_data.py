"""What training and evaluating the bundled tiny models share: the corpus, its split, the names.

The corpus is Shakespeare's complete works (``assets/corpus/``), split into train and validation
by the fixed rule in ``assets/corpus/split.json`` (the last 5 % of every work held out).
:mod:`playground.train_tiny` trains on it, :mod:`playground.tiny_eval` scores the models on its
validation split, :mod:`playground.study_prompts` takes the bundled prompts from that split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from playground.core.corpus import CORPUS_DIR, corpus_split

NAMES = {
    "target": "tiny-shakespeare",
    "draft": "tiny-shakespeare-draft",
    "diffusion": "tiny-shakespeare-diffusion",
}
SMOKE_CORPUS_CHARS = 40_000  # per split, taken from the first works


def load_corpus(corpus_dir: Path = CORPUS_DIR, smoke: bool = False) -> tuple[list[str], list[str]]:
    """Return (train_docs, val_docs): one string per work, following split.json."""
    train, val = corpus_split(corpus_dir)
    if smoke:
        train, val = _head(train, SMOKE_CORPUS_CHARS), _head(val, SMOKE_CORPUS_CHARS // 4)
    return train, val


def _head(docs: list[str], n: int) -> list[str]:
    out = []
    for d in docs:
        if n <= 0:
            break
        out.append(d[:n])
        n -= len(out[-1])
    return out


def encode_docs(tokenizer, docs: list[str]) -> np.ndarray:
    """One token stream: <|endoftext|> work1 <|endoftext|> work2 ..."""
    ids = []
    for d in docs:
        ids.append(tokenizer.eos_token_id)
        ids.extend(tokenizer(d, add_special_tokens=False)["input_ids"])
    return np.array(ids, dtype=np.int64)
