"""Every decoder in the catalogue links its paper, and the catalogue reads as a public document."""

import re

from playground.catalogue import knob_groups, render
from playground.papers import markdown, papers_for, papers_table, scrub

ARXIV_ABS = re.compile(r"^https://arxiv\.org/abs/\d{4}\.\d{4,5}$")


def test_every_registered_decoder_links_a_paper():
    from decoders import all_decoders

    missing = [c.name for c in all_decoders() if not any(p.url for p in papers_for(c.name, c.reference))]
    assert not missing, f"add a linked source to the decoder class's `papers` for: {', '.join(missing)}"


def test_links_are_well_formed_and_the_table_names_real_decoders():
    from decoders import REGISTRY

    table = papers_table()
    assert set(table) <= set(REGISTRY), f"papers name unknown decoders: {set(table) - set(REGISTRY)}"
    for name, papers in table.items():
        for p in papers:
            assert p.cite.strip(), name
            if p.url and "arxiv.org" in p.url:
                assert ARXIV_ABS.match(p.url), (name, p.url)
            elif p.url:
                assert p.url.startswith("https://"), (name, p.url)


def test_a_decoder_missing_from_the_table_links_the_arxiv_id_of_its_reference():
    papers = papers_for("not_a_decoder", "Someone et al. 2025, A Method (A123, arXiv:2510.02358)")
    assert [p.url for p in papers] == ["https://arxiv.org/abs/2510.02358"]
    assert "A123" not in papers[0].cite and "arXiv" not in papers[0].cite
    assert papers_for("not_a_decoder", "Someone 2025, no id") == ()
    assert markdown("not_a_decoder", "Someone 2025 (A214)") == "Someone 2025"


def test_scrub_drops_internal_ids_and_keeps_the_sentence():
    assert scrub("Jacobi decoding (Santilli et al. 2023, A028): greedy") == "Jacobi decoding (Santilli et al. 2023): greedy"
    assert scrub("CreditDecoding (A239): threshold") == "CreditDecoding: threshold"
    assert scrub("tokens (seed paper A311)") == "tokens"
    assert scrub("style, A061/A259/A106): per") == "style): per"
    assert scrub("(LayerSkip; DEL,\nA180).") == "(LayerSkip; DEL)."


def test_catalogue_cites_no_internal_ids_and_every_decoder_section_has_a_link():
    from decoders import all_decoders

    doc = render()
    assert not re.search(r"\bA\d{3}\b", doc), re.search(r".{40}\bA\d{3}\b.{10}", doc).group(0)
    sections = doc.split("\n### ")
    for c in all_decoders():
        section = next(s for s in sections if s.startswith(c.name + "\n"))
        assert "](https://" in section.split("\n- model:")[0], c.name


def test_shared_knob_tables_are_shown_once():
    from playground.catalogue import _knob_table

    lines = render().splitlines()
    for title, _, shared in knob_groups():
        assert lines.count(f"### {title}") == 1
        for name in shared:
            row = _knob_table({name: shared[name]})[-1]  # the row exactly as the shared table has it
            assert lines.count(row) == 1, (title, name, lines.count(row))


def test_every_family_with_decoders_has_a_section_in_catalogue_order():
    from decoders import all_decoders

    doc = render()
    fams = {c.family for c in all_decoders()}
    headings = [line for line in doc.splitlines() if line.startswith("## ")]
    assert len(headings) == len(fams) + 2  # the glossary and the shared knobs
