"""Every preset loads and names registered decoders, valid knobs and models of the right kind."""

from __future__ import annotations

import pytest

from decoders.base import REGISTRY, get_decoder
from playground.presets import PRESET_DIR, list_presets
from playground.ui import rules as st

BUNDLED_KIND = {"tiny-shakespeare": "causal", "tiny-shakespeare-draft": "causal",
                "tiny-shakespeare-diffusion": "diffusion"}


def _presets():
    return list_presets()


def test_there_are_at_least_six_presets():
    assert len(list(PRESET_DIR.glob("*.json"))) >= 6
    names = {p["name"] for p in _presets()}
    assert {"truncation-samplers", "greedy-beam-sampling", "speculative-showdown", "lossless-check",
            "diffusion-remasking", "diffusion-vs-ar"} <= names


@pytest.mark.parametrize("preset", [p["name"] for p in list_presets()])
def test_preset_lanes_validate_against_the_registry(preset):
    import decoders  # noqa: F401 - registers every family

    p = next(x for x in _presets() if x["name"] == preset)
    assert p["title"] and p["description"] and p["prompt"].strip()
    assert 2 <= len(p["lanes"]) <= 6
    assert p["model"] in BUNDLED_KIND
    for lane in p["lanes"]:
        assert lane["decoder"] in REGISTRY, f"preset {preset!r} names unknown decoder {lane['decoder']!r}"
        cls = get_decoder(lane["decoder"])
        cls.params.validate(lane["decoder"], lane["params"])  # raises on an unknown knob or bad value
        model = lane.get("model") or p["model"]
        assert BUNDLED_KIND[model] == cls.kind, f"{lane['decoder']} needs a {cls.kind} model, got {model}"
        if cls.needs_draft:
            assert BUNDLED_KIND.get(lane["draft"]) == getattr(cls, "draft_kind", "causal")
        else:
            assert not lane.get("draft")
    assert p["max_new_tokens"] <= 128  # presets must stay quick on a laptop CPU


@pytest.mark.parametrize("preset", [p["name"] for p in list_presets()])
def test_preset_becomes_page_values(preset):
    page = st.preset_page(preset)
    assert page["lanes"] and all(isinstance(c, st.LaneConfig) for c in page["lanes"])
    assert page["policy"] in ("forwards", "steps", "free")
