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


def test_catalogue_takes_step_kinds_and_plots_from_their_registries():
    # what each step kind shows and which plots it gets are declared once (playground.core.trace,
    # visualizers); the catalogue repeats them for every decoder of that kind
    import visualizers
    from decoders import all_decoders
    from playground.core.trace import STEP_KINDS

    doc = render()
    for c in all_decoders():
        section = doc.split(f"\n### {c.name}\n", 1)[1].split("\n### ", 1)[0]
        assert STEP_KINDS[c.step_kind].shows in section, c.name
        for title, _fn, need in visualizers.STEP_PLOTS[c.step_kind]:
            if need is None:
                assert f"*{title}*" in section, (c.name, title)
