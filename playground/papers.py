"""Links to the papers (or primary sources) behind every decoder, for ``docs/decoders.md``.

The decoder classes carry a free-text ``reference`` and their linked sources, ``papers``
(a citation and a stable URL each: arXiv abstract, ACL Anthology, DOI or the project's own
page; see ``decoders/citation.py``); this module reads them from the registry and renders
them, so ``tests/test_papers.py`` can require a linked source for every registered decoder.
A source with ``url=None`` is cited without a link (a thesis with no stable online copy);
every decoder still needs at least one linked source.
"""

from __future__ import annotations

import re

from decoders import REGISTRY, all_decoders
from decoders.citation import Paper, arxiv


def papers_table() -> dict[str, tuple[Paper, ...]]:
    """The sources of every registered decoder that declares some, by decoder name."""
    return {c.name: c.papers for c in all_decoders() if c.papers}


# Internal catalogue ids of the project's research notes ("A239", "seed paper A311"): they mean
# nothing to a reader of the public docs, so rendered text drops them.
_ID = r"A\d{3}(?:\s*/\s*A\d{3})*"
_INTERNAL = (
    re.compile(rf"\s*\((?:seed paper\s+)?{_ID}(?:\s+family)?\)"),   # " (A239)", " (seed paper A311)"
    re.compile(rf"\s*[,;]\s*{_ID}(?=\s*\))"),                         # "(Santilli et al. 2023, A028)"
    re.compile(rf"\s*\(\s*{_ID}\s*,\s*"),                             # "(A012, see ...)" -> keep the rest
    re.compile(rf"\s+{_ID}\b"),                                       # anything left
)


def scrub(text: str) -> str:
    """``text`` without the internal research-note ids (``A239``) a public doc must not cite."""
    for pat in _INTERNAL[:2]:
        text = pat.sub("", text)
    text = _INTERNAL[2].sub(" (", text)
    return _INTERNAL[3].sub("", text)


_ARXIV_ID = re.compile(r"arXiv:\s*(\d{4}\.\d{4,5})", re.IGNORECASE)


def papers_for(decoder: str, reference: str = "") -> tuple[Paper, ...]:
    """The sources of one decoder: its class's ``papers``; for a decoder that declares none (or
    a name not registered), the arXiv ids its ``reference`` names (``arXiv:2510.02358``),
    cited by that reference."""
    cls = REGISTRY.get(decoder)
    if cls is not None and cls.papers:
        return cls.papers
    ids = _ARXIV_ID.findall(reference or "")
    cite = scrub(_ARXIV_ID.sub("", reference or "").replace("()", "").strip(" ,;")) or decoder
    return tuple(arxiv(cite, i) for i in ids)


def _link(p: Paper) -> str:
    return f"[{p.cite}]({p.url})" if p.url else p.cite


def markdown(decoder: str, reference: str = "") -> str:
    """The decoder's sources as markdown links joined by '; ' (the scrubbed reference if none)."""
    papers = papers_for(decoder, reference)
    return "; ".join(_link(p) for p in papers) if papers else scrub(reference)


def short_markdown(decoder: str, reference: str = "") -> str:
    """One source for the summary table, a linked one first (the decoder's section has them all)."""
    papers = papers_for(decoder, reference)
    if not papers:
        return scrub(reference)
    first = next((p for p in papers if p.url), papers[0])
    more = f" (+{len(papers) - 1})" if len(papers) > 1 else ""
    return _link(first) + more
