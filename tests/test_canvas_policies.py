"""The diffusion per-position plot is right for every remasking policy of the diffusion family
(random remasking included): one bar per canvas position on an axis that is the canvas, each
position in the state an independent replay of the steps gives it, a position filled earlier
drawn at the confidence it was committed with, and the "filled earlier" legend entry shown
exactly when some position was filled at an earlier step."""

from __future__ import annotations

import json

import pytest

import decoders  # noqa: F401 - registers every family
from decoders.base import REGISTRY, Choice
from playground.core.models import load_model
from playground.engine import prepare
from visualizers.canvas import position_metrics_figure

POLICY_KNOBS = ("remasking", "alg", "score", "plan")  # the knobs that choose which positions to commit
DIFFUSION = sorted(n for n, c in REGISTRY.items() if c.kind == "diffusion")


def _cases() -> list[tuple[str, dict]]:
    out = []
    for name in DIFFUSION:
        specs = REGISTRY[name].params
        out.append((name, {}))
        for knob in POLICY_KNOBS:
            spec = specs.get(knob)
            if isinstance(spec, Choice):
                out += [(name, {knob: v}) for v in spec.choices if v != spec.default]
    return out


CASES = _cases()


def test_every_policy_knob_is_covered():
    assert ("llada", {"remasking": "random"}) in CASES and ("masked_diffusion", {"score": "random"}) in CASES
    assert ("dream", {"alg": "origin"}) in CASES and len(DIFFUSION) >= 8


@pytest.fixture(scope="module")
def diffusion_model():
    return load_model("tiny-shakespeare-diffusion", device="cpu")


def _replay(steps, mask_id, i):
    """Independently: each position's state at step ``i`` and the confidence it was committed with."""
    committed_at, conf_at = {}, {}
    for s in steps[:i]:
        for p in s.get("remasked") or []:
            committed_at.pop(p, None)
        for p in s["unmasked"]:
            committed_at[p] = s["i"]
            conf_at[p] = (s.get("confidence") or [None] * (p + 1))[p]
    s = steps[i]
    state = {}
    for p, tok in enumerate(s["canvas"]):
        if p in s["unmasked"]:
            state[p] = "committed this step"
        elif p in (s.get("remasked") or []):
            state[p] = "remasked this step"
        elif tok == mask_id:
            state[p] = "masked"
        else:
            state[p] = "filled earlier"
    return state, conf_at


@pytest.mark.slow
@pytest.fixture(scope="module")
def helper_model():
    """The bundled causal draft, for the diffusion decoders that take a helper (apd)."""
    return load_model("tiny-shakespeare-draft", device="cpu")


@pytest.mark.parametrize("name,knobs", CASES, ids=[f"{n}-{json.dumps(k)}" for n, k in CASES])
def test_per_position_plot_follows_the_canvas(diffusion_model, helper_model, name, knobs):
    draft = helper_model if REGISTRY[name].needs_draft else None
    tr = json.loads(prepare(model=diffusion_model, decoder=name, prompt="Romeo.\nBut soft", max_new_tokens=12,
                            seed=3, params=knobs, draft=draft).finish().to_json())
    steps = [s for s in tr["steps"] if s["kind"] == "denoise"]
    assert steps
    mask_id = steps[-1]["mask_id"]
    for i, s in enumerate(steps):
        fig = position_metrics_figure(tr, s["i"])
        bars = {t.name: t for t in fig.data if t.type == "bar"}
        if not bars:  # a step without per-position metrics says so
            assert not any(v is not None for v in s.get("confidence") or [])
            continue
        n = len(s["canvas"])
        assert tuple(fig.layout.xaxis.range) == (-0.5, n - 0.5)
        assert all(b.width == 0.8 for b in bars.values())
        xs = sorted(x for b in bars.values() for x in b.x)
        assert xs == list(range(n)), f"step {i}: a bar per position"
        state, conf_at = _replay(steps, mask_id, i)
        for label, bar in bars.items():
            assert all(state[x] == label for x in bar.x), f"step {i}: {label}"
        assert ("filled earlier" in bars) == ("filled earlier" in state.values())
        if "filled earlier" in bars:
            bar = bars["filled earlier"]
            conf = s.get("confidence") or []
            for x, y in zip(bar.x, bar.y):
                own = conf[x] if x < len(conf) else None
                assert y == (own if own is not None else conf_at.get(x)), f"step {i}, position {x}"
            assert any(y is not None for y in bar.y)  # so the legend entry is drawn
