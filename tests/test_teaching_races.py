"""The teaching guide's hand-built races show what docs/teaching.md says they show, on the page's
defaults (its first example prompt, seed 0, 48 tokens, the bundled models); and no race asks
for one lane, which the page does not offer (it keeps at least two)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "teaching.md"


def _page_run(decoder: str, **knobs):
    from playground.engine import run_to_end
    from playground.ui.rules import DEFAULT_DIFFUSION, DEFAULT_DRAFT, DEFAULT_MODEL, EXAMPLE_PROMPTS
    from decoders.base import get_decoder

    cls = get_decoder(decoder)
    model = DEFAULT_DIFFUSION if cls.kind == "diffusion" else DEFAULT_MODEL
    return run_to_end(model=model, decoder=decoder, prompt=EXAMPLE_PROMPTS[0], max_new_tokens=48, seed=0,
                      draft=DEFAULT_DRAFT if cls.needs_draft else None, params=knobs)


def _rows() -> list[str]:
    return [ln for ln in DOC.read_text(encoding="utf-8").splitlines() if re.match(r"\| \d+–\d+ \|", ln)]


def test_no_race_has_a_single_lane():
    from playground.ui.rules import MIN_LANES

    assert MIN_LANES == 2  # the page's − Lane stops at two; if that changes, the guide may say one
    races = [r.split("|")[2] for r in _rows()]
    assert races and not [r for r in races if re.search(r"\bone `\w+` lane\b", r)]


@pytest.mark.slow
def test_longer_drafts_accept_less_and_gain_less_than_a_token_per_doubling():
    row = next(r for r in _rows() if "`gamma` 2, 4 and 8" in r)
    runs = [_page_run("speculative", gamma=g, confidence=0.0).stats for g in (2, 4, 8)]
    acc = [s["acceptance_rate"] for s in runs]
    tpf = [s["tokens_per_target_forward"] for s in runs]
    assert acc[0] > acc[1] > acc[2]
    assert tpf[0] < tpf[1] < tpf[2] and tpf[1] - tpf[0] < 1 and tpf[2] - tpf[1] < 1
    assert runs[0]["draft_forwards"] < runs[1]["draft_forwards"] < runs[2]["draft_forwards"]
    stated = "about " + ", ".join(f"{x:.1f}" for x in tpf[:2]) + f" and {tpf[2]:.1f} per target forward"
    assert stated in row, f"the guide's figures are not the run's: {stated}"


@pytest.mark.slow
def test_freedave_is_llada_in_fewer_forwards_and_prophet_needs_lower_thresholds():
    row = next(r for r in _rows() if "`freedave`" in r and "`prophet`" in r)
    llada, free, prophet = _page_run("llada", steps=48), _page_run("freedave"), _page_run("prophet")
    assert free.output_ids == llada.output_ids
    stated = f"{free.stats['target_forwards']} against {llada.stats['target_forwards']}"
    assert stated in row, stated
    assert prophet.stats["target_forwards"] == 48 and "takes all 48 steps" in row


@pytest.mark.slow
def test_fast_dllm_at_its_default_threshold_commits_about_one_token_per_step():
    row = next(r for r in _rows() if "preset `diffusion-parallel`" in r)
    assert "about one token per step" in row
    tr = _page_run("fast_dllm")
    assert tr.stats["tokens_per_target_forward"] < 1.2
