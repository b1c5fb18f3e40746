"""Per-token display text that never shows a broken UTF-8 character."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text pieces that are safe to show.

    A piece is released only when the decoded text no longer ends in a replacement
    character (an unfinished UTF-8 sequence) and is decoded with its left context, so a
    word piece gets the spacing it has in the full text.
    """

    def __init__(self, tokenizer: Any, context_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context_ids)[-4:]
        self.prefix = 0
        self.read = len(self.ids)

    def _dec(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the new text it completes ('' while a character is open)."""
        self.ids.append(int(token_id))
        before = self._dec(self.ids[self.prefix:self.read])
        after = self._dec(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            piece = after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
            return piece
        return ""

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """One display piece per token (joined they equal the text); '' where pending."""
        return [self.push(t) for t in ids]


def token_pieces(tokenizer: Any, ids: Sequence[int], context_ids: Sequence[int] = ()) -> list[str]:
    """Per-token display text for ``ids`` following ``context_ids`` (see IncrementalDetokenizer)."""
    return IncrementalDetokenizer(tokenizer, context_ids).pieces(ids)
