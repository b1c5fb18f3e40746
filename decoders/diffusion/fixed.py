"""Fixed positions (infilling): words written into the canvas before denoising starts.

LLaDA's demo lets a user pin words at positions of the answer; the sampler then fills the
masked positions around them. The ``fixed`` knob holds ``"pos:text; pos:text"`` (generated
positions from 0; the text after the colon verbatim, spaces included, so ``"4: love"`` writes
the token of ``" love"``), or from Python a dict ``{4: " love"}``. A text of several tokens
fills the positions from ``pos`` on. Fixed positions are never masked, so no plan commits or
changes them; each step records them (``fixed``) and the canvas draws them apart.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch

from decoders.base import Context, Text
from playground.core.errors import PlaygroundError

MAX_FIXED = 32  # entries in one knob
MAX_FIXED_CHARS = 64  # characters of one entry's text
_ENTRY = re.compile(r"\s*(\d+)\s*:(.*)", re.S)


def parse_fixed(value: Any) -> list[tuple[int, str]]:
    """The (position, text) entries of a ``fixed`` value, in order; one line of error for a
    malformed one."""
    if value is None or value == "":
        return []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, str):
        if len(value) > MAX_FIXED * (MAX_FIXED_CHARS + 8):
            raise PlaygroundError(f"knob 'fixed': {len(value)} characters is too long")
        items = []
        for part in value.split(";"):
            if not part.strip():
                continue
            m = _ENTRY.fullmatch(part)
            if m is None:
                raise PlaygroundError(f"knob 'fixed': {part.strip()[:40]!r} is not position:text (e.g. 4: love)")
            items.append((m.group(1), m.group(2)))
    else:
        raise PlaygroundError(f"knob 'fixed' takes 'pos:text; …' or a dict, not {type(value).__name__}")
    if len(items) > MAX_FIXED:
        raise PlaygroundError(f"knob 'fixed': {len(items)} entries; at most {MAX_FIXED}")
    out: list[tuple[int, str]] = []
    for pos, text in items:
        if isinstance(pos, bool) or not (isinstance(pos, int) or (isinstance(pos, str) and pos.strip().isdigit())):
            raise PlaygroundError(f"knob 'fixed': position {pos!r} is not a whole number")
        if not isinstance(text, str) or text == "":  # whitespace is text: a newline may be fixed
            raise PlaygroundError(f"knob 'fixed': position {pos} has no text")
        if len(text) > MAX_FIXED_CHARS:
            raise PlaygroundError(f"knob 'fixed': the text at position {pos} has {len(text)} characters; "
                                  f"at most {MAX_FIXED_CHARS}")
        out.append((int(pos), text))
    return out


def fixed_text(entries: list[tuple[int, str]]) -> str:
    """The canonical knob value of ``entries``: ``"pos:text;pos:text"``."""
    return ";".join(f"{p}:{t}" for p, t in entries)


class FixedParam(Text):
    """The ``fixed`` knob: checked and normalised to :func:`fixed_text` (a dict becomes the string)."""

    def check(self, name: str, value: Any) -> str:
        return fixed_text(parse_fixed(value))


def fixed_param() -> FixedParam:
    """The ``fixed`` knob of the run-recipe diffusion decoders."""
    return FixedParam("", "infilling: words fixed before denoising, 'pos:text; pos:text' (generated positions "
                          "from 0; spaces after the colon kept); the plan fills the masks around them")


def place_fixed(ctx: Context, value: Any, gen_length: int, prompt_len: int, canvas: torch.Tensor,
                encode: Callable[[str], list[int]] | None = None) -> list[int]:
    """Write the ``fixed`` entries into ``canvas`` (prompt + generated part) and return the
    generated positions they fill, sorted; PlaygroundError for an entry past the canvas or two
    entries on one position."""
    entries = parse_fixed(value)
    if not entries:
        return []
    tok = ctx.target.tokenizer
    enc = encode or (lambda s: [int(t) for t in tok.encode(s, add_special_tokens=False)])
    taken: dict[int, int] = {}
    for pos, text in entries:
        ids = enc(text)
        if not ids:
            raise PlaygroundError(f"knob 'fixed': {text!r} encodes to no token")
        if pos + len(ids) > gen_length:
            raise PlaygroundError(f"knob 'fixed': {text!r} at position {pos} ({len(ids)} token"
                                  f"{'s' if len(ids) > 1 else ''}) runs past the canvas of {gen_length}")
        for k, t in enumerate(ids):
            if pos + k in taken:
                raise PlaygroundError(f"knob 'fixed': position {pos + k} is fixed twice")
            taken[pos + k] = t
    for p, t in taken.items():
        canvas[prompt_len + p] = t
    return sorted(taken)


__all__ = ["FixedParam", "MAX_FIXED", "MAX_FIXED_CHARS", "fixed_param", "fixed_text", "parse_fixed", "place_fixed"]
