"""How a decoder cites its sources: :class:`Paper`, what ``Decoder.papers`` holds.

A decoder class carries its linked sources itself (``papers = (arxiv(...), Paper(...))``) beside
its free-text ``reference``; ``playground/papers.py`` renders them for the catalogue.
"""

from __future__ import annotations

from typing import NamedTuple


class Paper(NamedTuple):
    """One source: how to cite it and where to read it (None: no stable link, say a thesis)."""

    cite: str
    url: str | None


def arxiv(cite: str, arxiv_id: str) -> Paper:
    """A paper on arXiv, linked to its abstract page."""
    return Paper(cite, f"https://arxiv.org/abs/{arxiv_id}")


__all__ = ["Paper", "arxiv"]
