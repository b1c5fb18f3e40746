"""The display text of a token, shared by the evidence of every decoder and the constraint stage."""

from __future__ import annotations

from typing import Any


def view_token(view: Any, token_id: int) -> str:
    """Display text of one token, cached per tokenizer."""
    tok = view.tokenizer
    cache = getattr(tok, "_playground_token_cache", None)
    if cache is None:
        cache = {}
        try:
            tok._playground_token_cache = cache
        except Exception:  # noqa: BLE001 - a tokenizer that refuses attributes just isn't cached
            pass
    s = cache.get(token_id)
    if s is None:
        s = tok.decode([int(token_id)], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        cache[token_id] = s
    return s
