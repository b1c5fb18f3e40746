"""Speculative contrastive decoding: at temperature 0 it is ``contrastive`` token for token in
fewer expert forwards; at temperature > 0 its law is the contrastive distribution's (the
verification is exact for it, not for the expert); its evidence says what the contrast did."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from decoders.contrastive.expert_amateur import cd_scores
from decoders.speculative.spec_contrastive import contrast_probs
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from test_speculative_dist import chi_square_p
from visualizers import step_figures
from visualizers.scd import scd_figure

PROMPTS = ["ROMEO: But soft", "JULIET: O Romeo, Romeo, wherefore art thou", "To be, or not to be",
           "MACBETH: Tomorrow, and tomorrow"]


@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-draft", device="cpu")


def run(models, decoder, prompt, n=40, seed=0, **params):
    target, draft = models
    return prepare(model=target, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed, draft=draft,
                   params=params).finish()


def check_equals_contrastive(bundled, knobs, prompts, n):
    cd_knobs = {k: v for k, v in knobs.items() if k != "gamma"}
    saved = 0
    for prompt in prompts:
        cd = run(bundled, "contrastive", prompt, n, **cd_knobs)
        scd = run(bundled, "spec_contrastive", prompt, n, **knobs)
        assert scd.output_ids == cd.output_ids, prompt
        assert scd.stats["target_forwards"] <= cd.stats["target_forwards"]
        saved += cd.stats["target_forwards"] - scd.stats["target_forwards"]
        accepted = sum(len(s.evidence["tree"]["accepted_path"]) for s in scd.steps)
        # every accepted draft saves exactly one expert forward
        assert cd.stats["target_forwards"] - scd.stats["target_forwards"] == accepted
    assert saved > 0


def test_equals_contrastive_at_temperature_zero_in_fewer_expert_forwards(bundled):
    check_equals_contrastive(bundled, {}, PROMPTS[:2], 24)


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [{"beta": 0.5}, {"alpha": 0.3, "beta": 2.0, "gamma": 6}, {"gamma": 1},
                                   {"amateur_temperature": 0.5}])
def test_equals_contrastive_at_other_settings(bundled, knobs):
    check_equals_contrastive(bundled, knobs, PROMPTS, 40)


def test_a_draft_is_accepted_iff_it_is_the_best_contrast_score(bundled):
    target, draft = bundled
    tr = run(bundled, "spec_contrastive", PROMPTS[1], n=30)
    ids = list(tr.prompt_ids)
    for s in tr.steps:
        for row in s.evidence["scd"]["positions"]:
            if "drafted" not in row:
                continue
            context = ids + s.committed[:row["depth"]]
            e = target.forward(context).logits[0, -1]
            a = draft.forward(context).logits[0, -1]
            score, _ = cd_scores(e, a, 0.1, 1.0)
            best = int(torch.argmax(score))
            assert row["pick"] == best
            assert row["accepted"] == (row["drafted"] == best)
        ids += s.committed


def test_contrast_probs_is_contrastives_score_with_foreign_ids_excluded():
    e = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])
    a = torch.tensor([2.5, 0.0, 0.5, 1.0])
    probs, score, plausible = contrast_probs(e, a, 4, 0.1, 1.0, 0.0)
    le, la = torch.log_softmax(e[:4], -1), torch.log_softmax(a, -1)
    keep = le >= le.max() + torch.log(torch.tensor(0.1))
    want = torch.where(keep, le - la, torch.tensor(float("-inf")))
    assert torch.allclose(score[:4], want) and score[4] == float("-inf")
    assert plausible == int(keep.sum())
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]  # token 1: the amateur dislikes it most
    sampled, _, _ = contrast_probs(e, a, 4, 0.1, 1.0, 0.5)
    assert torch.allclose(sampled[:4], torch.softmax(want / 0.5, -1)) and sampled[4] == 0


def contrastive_law(target, draft, prompt_ids, n_tokens, temperature, alpha=0.1, beta=1.0):
    """P(continuation) under contrastive decoding at ``temperature``, by enumeration."""
    law = {}

    def walk(prefix, prob):
        if len(prefix) == n_tokens:
            law[tuple(prefix)] = prob
            return
        ids = prompt_ids + prefix
        e, a = target.forward(ids).logits[0, -1], draft.forward(ids).logits[0, -1]
        score, _ = cd_scores(e, a, alpha, beta)
        p = torch.softmax(score / temperature, -1)
        for t in torch.nonzero(p > 1e-9).flatten().tolist():
            walk(prefix + [t], prob * float(p[t]))

    walk([], 1.0)
    return law


@pytest.mark.slow
def test_samples_follow_the_contrastive_distribution(bundled):
    """Exact for the contrast: the law of 3 tokens over many seeds is contrastive's (alpha 0.3
    keeps the support small), and drafts were both accepted and rejected."""
    target, draft = bundled
    runs, counts, tried, accepted = 800, Counter(), 0, 0
    prompt_ids = None
    for seed in range(runs):
        tr = run(bundled, "spec_contrastive", "ROMEO: But soft, what light", n=3, seed=seed,
                 temperature=1.0, alpha=0.3, gamma=2)
        prompt_ids = tr.prompt_ids
        counts[tuple(tr.output_ids)] += 1
        for s in tr.steps:
            for node in s.evidence["tree"]["nodes"]:
                tried += node["accept_prob"] is not None
                accepted += node["accepted"]
    assert 0.05 < accepted / tried < 0.95 and accepted >= 50, (accepted, tried)
    law = contrastive_law(target, draft, prompt_ids, 3, 1.0, alpha=0.3)
    assert chi_square_p(counts, law, runs) > 1e-3


def test_evidence_and_view(bundled):
    tr = run(bundled, "spec_contrastive", PROMPTS[0], n=12)
    d = tr.to_dict()
    assert tr.stats["draft_forwards"] > 0
    for s in tr.steps:
        rows = s.evidence["scd"]["positions"]
        # the walk verified every accepted position and the one after
        assert [r["depth"] for r in rows] == list(range(len(s.evidence["tree"]["accepted_path"]) + 1))[:len(rows)]
    titles = [t for t, _ in step_figures(d, 0)]
    assert "Contrastive verification" in titles
    fig = scd_figure(d, 0)  # drawn, not a note
    assert [b.name for b in fig.data[:3]] == ["expert p", "amateur q (drafted from)", "contrast (verified against)"]
    with pytest.raises(PlaygroundError, match="gamma"):
        prepare(model=bundled[0], decoder="spec_contrastive", prompt="x", max_new_tokens=4, draft=bundled[1],
                params={"gamma": 0})


def test_forced_tokens_as_contrastive_takes_them(bundled):
    """A forced token makes the expert's row a point mass, so the contrast picks it too: the
    branch equals contrastive's branch with the same force."""
    target, draft = bundled
    force = [[2, 100], [5, 14]]
    outs = [prepare(model=target, decoder=d, prompt=PROMPTS[0], max_new_tokens=16, draft=draft, force=force)
            .finish().output_ids for d in ("contrastive", "spec_contrastive")]
    assert outs[0] == outs[1] and outs[1][2] == 100 and outs[1][5] == 14
