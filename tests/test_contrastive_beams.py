"""Contrastive decoding searched with beams (Li et al. 2023 search the objective with beam search):
with the amateur switched off it is beam search exactly; the best hypothesis's score is the sum
of its contrastive step scores, recomputed by teacher forcing both models."""

from __future__ import annotations

import pytest
import torch

import playground
from decoders.contrastive.expert_amateur import cd_scores
from playground.core.errors import PlaygroundError
from playground.core.models import load_model

PROMPT = "ROMEO.\nBut soft, what light"
DRAFT = "tiny-shakespeare-draft"


@pytest.mark.parametrize("beams", [2, 4])
def test_without_the_amateur_it_is_beam_search(beams):
    cd = playground.generate(model="tiny-shakespeare", decoder="contrastive", draft=DRAFT, prompt=PROMPT,
                             max_new_tokens=8, num_beams=beams, beta=0.0, alpha=0.0)
    beam = playground.generate(model="tiny-shakespeare", decoder="beam", prompt=PROMPT, max_new_tokens=8,
                               num_beams=beams)
    assert cd["output_ids"] == beam["output_ids"]


def test_the_best_hypothesis_scores_its_summed_contrast():
    alpha, beta = 0.1, 1.0
    trace = playground.generate(model="tiny-shakespeare", decoder="contrastive", draft=DRAFT, prompt=PROMPT,
                                max_new_tokens=6, num_beams=3, alpha=alpha, beta=beta)
    out = trace["output_ids"]
    expert, amateur = load_model("tiny-shakespeare"), load_model(DRAFT)
    ids = torch.tensor([trace["prompt_ids"] + out])
    with torch.no_grad():
        le, la = expert.model(ids).logits[0].float(), amateur.model(ids).logits[0].float()
    n = len(trace["prompt_ids"])
    total = 0.0
    for j, tok in enumerate(out):
        s, plausible = cd_scores(le[n - 1 + j], la[n - 1 + j], alpha, beta)
        assert bool(plausible[tok])  # every chosen token is in its step's plausible set
        total += float(s[tok])
    best = trace["stats"]["sequences"][0]
    assert best["ids"] == out
    assert best["score"] == pytest.approx(total / len(out), abs=1e-3)  # length penalty 1
    # beams record beam steps (the search tree view); one beam stays the token-by-token lane
    greedy = playground.generate(model="tiny-shakespeare", decoder="contrastive", draft=DRAFT, prompt=PROMPT,
                                 max_new_tokens=6, alpha=alpha, beta=beta)
    assert trace["steps"][0]["kind"] == "beam" and greedy["steps"][0]["kind"] == "token"


def test_beams_want_temperature_zero():
    with pytest.raises(PlaygroundError, match="temperature 0"):
        playground.generate(model="tiny-shakespeare", decoder="contrastive", draft=DRAFT, prompt=PROMPT,
                            max_new_tokens=2, num_beams=2, temperature=0.7)
