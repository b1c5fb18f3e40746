"""The diffusion "why now" plot: what it draws is what the plan decided — each committed
position starred once at the step that committed it, a quota plan's stars the best scores of
their step's block, a threshold plan's stars above its line (or the step's single best), and a
remasked position's line broken where it went back under the mask."""

from __future__ import annotations

import pytest

import visualizers
from playground.core.models import load_model
from playground.engine import prepare
from visualizers.canvas import denoise_steps, unmasked_of
from visualizers.why_now import TITLE, commit_reason, position_paths, why_now_figure

PROMPT = "ROMEO: But soft"


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-shakespeare-diffusion", device="cpu")


def run(handle, decoder, **params):
    return prepare(model=handle, decoder=decoder, prompt=PROMPT, max_new_tokens=16, seed=0,
                   params=params).finish().to_dict()


def stars(fig):
    return next(d for d in fig.data if d.name == "committed")


def test_every_commit_is_one_star_at_its_step_and_a_quota_plan_starred_its_blocks_best(bundled):
    t = run(bundled, "llada", steps=8, block_length=8)
    paths = position_paths(t)
    steps = denoise_steps(t)
    committed = {p: s["i"] for s in steps for p in unmasked_of(s)}
    assert {p: [x for x, _ in v["commits"]] for p, v in paths.items() if v["commits"]} == \
        {p: [i] for p, i in committed.items()}
    for s in steps:
        lo, hi = s["block"]
        scored = {p: v for p, v in enumerate(s["score"]) if v is not None and lo <= p < hi}
        picked = set(unmasked_of(s))
        assert len(picked) == s["plan"]["k"]
        # the quota plan commits the k best scores of the block: no unpicked one beats a picked one
        assert min(scored[p] for p in picked) >= max((v for p, v in scored.items() if p not in picked), default=0)
    fig = why_now_figure(t)
    assert len(stars(fig).x) == len(committed) and TITLE in fig.layout.title.text
    assert all("best" in h for h in stars(fig).hovertext)
    assert TITLE in [title for title, _ in visualizers.run_figures(t)]


def test_a_threshold_plan_draws_its_line_and_each_star_is_above_it_or_its_steps_best(bundled):
    t = run(bundled, "fast_dllm", threshold=0.3)
    fig = why_now_figure(t)
    line = next(d for d in fig.data if d.name == "threshold")
    assert set(line.y) == {0.3}
    by_step = {s["i"]: s for s in denoise_steps(t)}
    for x, y in zip(stars(fig).x, stars(fig).y):
        s = by_step[x]
        if y <= 0.3:  # below the line: the plan's fallback, the single best of the step
            assert len(unmasked_of(s)) == 1
            assert y == max(v for v in s["score"] if v is not None)
    assert any("above the threshold" in h for h in stars(fig).hovertext) or all(
        "the step's best" in h for h in stars(fig).hovertext)


def test_a_remasked_position_starts_a_new_stretch():
    trace = {"steps": [
        {"i": 0, "kind": "denoise", "score": [0.2, 0.5], "unmasked": [1], "remasked": [], "plan": {"plan": "even", "k": 1}},
        {"i": 1, "kind": "denoise", "score": [0.4, None], "unmasked": [0], "remasked": [], "plan": {"plan": "even", "k": 1}},
        {"i": 2, "kind": "denoise", "score": [None, None], "unmasked": [], "remasked": [0], "plan": {"plan": "even", "k": 1}},
        {"i": 3, "kind": "denoise", "score": [0.9, None], "unmasked": [0], "remasked": [], "plan": {"plan": "even", "k": 1}},
    ]}
    paths = position_paths(trace)
    assert paths[0]["x"] == [0, 1, None, 3] and paths[0]["commits"] == [(1, 0.4), (3, 0.9)]
    assert paths[1] == {"x": [0], "y": [0.5], "commits": [(0, 0.5)]}
    assert commit_reason({"plan": "threshold", "threshold": 0.5}, 0.7) == "above the threshold 0.5"


def test_an_empty_or_partial_trace_is_a_note():
    assert "no denoise steps" in why_now_figure({}).layout.annotations[0].text
    assert "no per-position scores" in why_now_figure({"steps": [{"i": 0, "kind": "denoise"}]}).layout.annotations[0].text
