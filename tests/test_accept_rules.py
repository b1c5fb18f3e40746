"""The Cactus and relaxed (additive, multiplicative) acceptance rules, checked against hand
computations; every verified draft node records each rule's acceptance probability side by
side; the lossy ones are flagged as the other lossy rules are."""

from __future__ import annotations

import math

import pytest
import torch

from decoders.draft_tree import Rule, cactus_target, rule_params, verify_group
from playground.engine import prepare
from playground.core.models import handle_from_model
from test_speculative import build_varied_llama
from visualizers import step_figures
from visualizers.accept_rules import accept_rules_figure

KNOBS = {k: p.default for k, p in rule_params().items()}


def rule(name: str, **kw) -> Rule:
    return Rule({**KNOBS, "accept": name, **kw})


def test_cactus_target_by_hand():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    h = cactus_target(p, 1, 0.1)
    hx = 0.3 + math.sqrt(2 * 0.1 * 0.3 * 0.7)  # 0.504939
    scale = (1 - hx) / 0.7
    assert h.tolist() == pytest.approx([0.5 * scale, hx, 0.2 * scale], abs=1e-12)
    assert float(h.sum()) == pytest.approx(1.0)
    # delta 0 is strict's target; a point mass (temperature 0) is left alone; h never exceeds 1
    assert cactus_target(p, 1, 0.0).tolist() == pytest.approx(p.tolist())
    point = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    assert cactus_target(point, 1, 5.0).tolist() == [0.0, 1.0, 0.0]
    assert cactus_target(point, 0, 5.0).tolist() == [0.0, 1.0, 0.0]
    assert float(cactus_target(p, 0, 10.0)[0]) == 1.0


def test_cactus_verification_by_hand():
    """One drafted token: accept with min(1, h(x)/q(x)); on rejection resample from
    norm(max(0, h - q))."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    hx = 0.3 + math.sqrt(2 * 0.1 * 0.3 * 0.7)
    scale = (1 - hx) / 0.7
    h = [0.5 * scale, hx, 0.2 * scale]
    cactus = rule("cactus", cactus_delta=0.1)
    idx, trials, residual, _ = verify_group(p, [1], q, [0.999], cactus, p, q)
    assert idx is None and trials[0].accept_prob == pytest.approx(hx / 0.6)
    res = [max(0.0, a - b) for a, b in zip(h, q.tolist())]
    assert residual.tolist() == pytest.approx([r / sum(res) for r in res])
    # the same uniform under strict rejects (0.3 / 0.6 = 0.5); under cactus 0.8 < 0.8416 accepts
    idx, trials, _, _ = verify_group(p, [1], q, [0.8], cactus, p, q)
    assert idx == 0 and trials[0].lossy
    idx, trials, _, _ = verify_group(p, [1], q, [0.8], rule("strict"), p, q)
    assert idx is None and trials[0].accept_prob == pytest.approx(0.5)


def test_relaxed_rules_by_hand():
    p = torch.tensor([0.5, 0.42, 0.08])
    add = rule("additive", relax_delta=0.1)  # accept p(x) >= 0.5 - 0.1
    assert add.decide(1, p, None) is True and add.decide(2, p, None) is None and add.decide(0, p, None) is True
    assert rule("multiplicative", relax_rho=0.8).decide(1, p, None) is True  # 0.42 >= 0.4
    assert rule("multiplicative", relax_rho=0.9).decide(1, p, None) is None  # 0.42 < 0.45
    # a token the target rules out stays out, even with the widest relaxation
    assert rule("additive", relax_delta=1.0).decide(2, torch.tensor([0.6, 0.4, 0.0]), None) is None
    # greedy: the target's point mass would reject token 1; the raw softmax says it is close enough
    point = torch.tensor([1.0, 0.0, 0.0])
    idx, trials, _, _ = verify_group(point, [1], None, [0.5], add, p, None)
    assert idx == 0 and trials[0].accept_prob == 1.0 and trials[0].lossy


def test_side_by_side_probabilities_by_hand():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    got = rule("strict").side_by_side(1, p, 0.6, p, q)
    hx = 0.3 + math.sqrt(2 * 1.0 * 0.3 * 0.7)  # default delta 1
    H = -sum(x * math.log(x) for x in (0.5, 0.3, 0.2))
    want = {
        "strict": 0.5,
        "typical": 1.0 if 0.3 > min(0.09, 0.3 * math.exp(-H)) else 0.5,
        "top_m": 1.0,  # token 1 is among the 3 most probable
        "cactus": min(1.0, hx / 0.6),
        "additive": 0.5,  # 0.3 < 0.5 - 0.1: strict's probability
        "multiplicative": 1.0,  # 0.3 >= 0.5 * 0.5
    }
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name
    assert set(got) == {"strict", "typical", "fuzzy", "top_m", "entropy", "cactus", "additive", "multiplicative"}


@pytest.fixture(scope="module")
def models(tokenizer):
    target = handle_from_model(build_varied_llama(tokenizer, seed=2), tokenizer, name="t")
    draft = handle_from_model(build_varied_llama(tokenizer, seed=9, noise_from=target.model, noise=0.25),
                              tokenizer, name="d")
    return target, draft


def run(models, n=12, seed=0, **params):
    target, draft = models
    return prepare(model=target, decoder="speculative", prompt="JULIET: O Romeo, Romeo", max_new_tokens=n,
                   seed=seed, draft=draft, params=params).finish()


def test_cactus_is_strict_at_temperature_zero_and_lossy_only_when_sampling(models):
    greedy = run(models)
    cactus = run(models, accept="cactus")
    assert cactus.output_ids == greedy.output_ids and not cactus.extra.get("lossy")
    assert run(models, accept="cactus", temperature=1.0).extra.get("lossy") is True
    assert not run(models, accept="cactus", temperature=1.0, cactus_delta=0.0).extra.get("lossy")
    assert run(models, accept="additive").extra.get("lossy") is True


def test_nodes_carry_every_rules_acceptance_probability(models):
    tr = run(models, n=16, accept="cactus", temperature=1.0, gamma=3)
    tried = 0
    for s in tr.steps:
        assert s.evidence["accept_rules"]["active"] == "cactus"
        assert "cactus" in s.evidence["accept_rules"]["lossy"] and "strict" not in s.evidence["accept_rules"]["lossy"]
        for n in s.evidence["tree"]["nodes"]:
            if n["accept_prob"] is None:
                assert "rule_probs" not in n
                continue
            tried += 1
            probs = n["rule_probs"]
            assert probs["cactus"] == pytest.approx(n["accept_prob"], abs=1e-6)
            assert probs["cactus"] >= probs["strict"] - 1e-9  # h(x) >= p(x)
    assert tried > 0
    titles = [t for t, _ in step_figures(tr.to_dict(), 0)]
    assert "Acceptance by rule" in titles
    fig = accept_rules_figure(tr.to_dict(), 0)  # drawn, not a note
    assert "cactus (lossy) ← this run" in [b.name for b in fig.data]


@pytest.mark.slow
def test_cactus_accepts_more_than_strict_on_the_same_seeds(models):
    strict = cactus = 0.0
    for seed in range(20):
        strict += run(models, n=16, seed=seed, temperature=1.0).stats["acceptance_rate"]
        cactus += run(models, n=16, seed=seed, temperature=1.0, accept="cactus").stats["acceptance_rate"]
    assert cactus > strict
