"""Watched tokens: the run-level ``watch`` list, resolved against the target's vocabulary.

A run may watch a few tokens (words or token ids): every token step then records each one's
raw and final probability and raw rank, however far outside the top-K it is (``watch``
evidence, :func:`decoders.ar.watch_evidence`), and the trace keeps the resolved list under
``watch`` so a replay can label the plot without a tokenizer.

Items: an int is a token id; a string ``"#42"`` is token id 42; any other string is text,
tokenized as given, spaces included (``" Romeo"`` with its leading space is usually the token
inside a line, ``"Romeo"`` the one after a newline). Text that is several tokens watches its
first token and says so in the entry's ``note``. A string holding several items separates them
by commas (``"Juliet, Romeo"`` watches ``"Juliet"`` and ``" Romeo"``).
"""

from __future__ import annotations

import re
from typing import Any

from playground.core.errors import PlaygroundError

MAX_WATCH = 16  # watched tokens per run (each costs every step a few numbers)
MAX_WATCH_CHARS = 64  # characters in one watched item (a word or a short phrase)


def watch_items(watch: Any) -> list[int | str]:
    """The items of a ``watch`` value: None, a list of ids and words, or one comma-separated string."""
    if watch is None:
        return []
    if isinstance(watch, str):
        # sized before it is split: a page field or an API call may send any length
        if len(watch) > MAX_WATCH * (MAX_WATCH_CHARS + 1):
            raise PlaygroundError(f"watch: {len(watch)} characters; at most {MAX_WATCH} items of "
                                  f"{MAX_WATCH_CHARS} characters")
        watch = [w for w in watch.split(",") if w.strip()]
    if not isinstance(watch, (list, tuple)):
        raise PlaygroundError(f"watch must be a list of words or token ids, got {type(watch).__name__}")
    if len(watch) > MAX_WATCH:
        raise PlaygroundError(f"watch: {len(watch)} items; at most {MAX_WATCH} per run")
    out: list[int | str] = []
    for w in watch:
        if isinstance(w, bool) or not isinstance(w, (int, str)):
            raise PlaygroundError(f"watch: each item must be a word or a token id, got {type(w).__name__}")
        if isinstance(w, str) and not w.strip():
            raise PlaygroundError("watch: an item is empty")
        if isinstance(w, str) and len(w) > MAX_WATCH_CHARS:
            raise PlaygroundError(f"watch: an item has {len(w)} characters; at most {MAX_WATCH_CHARS}")
        out.append(w)
    return out


def watch_text(items: Any) -> str:
    """``items`` (as :func:`watch_items` reads them) as the page's one-line field shows them:
    comma-separated, token ids as ``#id``, spaces kept, so reading the text back gives the
    same items (a stored session refills the field with what its run watched)."""
    try:
        parsed = watch_items(items)
    except PlaygroundError:
        return ""
    return ",".join(f"#{w}" if isinstance(w, int) else w for w in parsed)


def resolve_watch(handle: Any, watch: Any) -> list[dict[str, Any]]:
    """The run's watch entries ``{"token": id, "word": text}`` (plus ``note`` when the text is
    several tokens), in the order given, each token once; one PlaygroundError line for an id
    outside the vocabulary, text that encodes to nothing, or more than :data:`MAX_WATCH`."""
    vocab = int(handle.vocab_size)
    entries: list[dict[str, Any]] = []
    seen: set[int] = set()
    for item in watch_items(watch):
        note = ""
        if isinstance(item, int) or re.fullmatch(r"\s*#\d+\s*", item):
            tid = int(item) if isinstance(item, int) else int(item.strip()[1:])
            if not 0 <= tid < vocab:
                raise PlaygroundError(f"watch: token id {tid} is outside the vocabulary (size {vocab})")
            word = handle.tokenizer.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        else:
            ids = [int(t) for t in handle.tokenizer.encode(item, add_special_tokens=False)]
            if not ids:
                raise PlaygroundError(f"watch: {item!r} encodes to no token")
            tid, word = ids[0], item
            if len(ids) > 1:
                first = handle.tokenizer.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                note = f"{item!r} is {len(ids)} tokens; watching its first, {first!r}"
        if tid in seen:
            continue
        seen.add(tid)
        entries.append({"token": tid, "word": word, **({"note": note} if note else {})})
    if len(entries) > MAX_WATCH:
        raise PlaygroundError(f"watch: {len(entries)} tokens; at most {MAX_WATCH} per run")
    return entries


__all__ = ["MAX_WATCH", "MAX_WATCH_CHARS", "resolve_watch", "watch_items", "watch_text"]
