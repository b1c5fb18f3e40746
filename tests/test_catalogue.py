"""The decoder catalogue in docs/ is current with the registry."""

from pathlib import Path

from playground.catalogue import DOC, render


def test_catalogue_is_current():
    assert DOC.exists(), "run `python -m playground.catalogue`"
    assert DOC.read_text(encoding="utf-8") == render(), "docs/decoders.md is stale: run `python -m playground.catalogue`"


def test_every_decoder_has_a_paper_and_help():
    from decoders import all_decoders

    for c in all_decoders():
        assert c.reference, c.name
        assert c.family and c.kind in ("causal", "diffusion")
        for name, p in c.params.items():
            assert p.help, f"{c.name}.{name} has no help text"
