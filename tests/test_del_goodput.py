"""``speculative`` with ``stop=del``: the draft length of each round follows DEL's expected
goodput (Zarch et al. 2025) from a running acceptance estimate.

Checked here: the output is still greedy's token for token at temperature 0 (bundled models
and a pair whose drafts are often rejected); ``expected_goodput`` against values worked out by
hand and the length rule's behaviour at high and low acceptance; every recorded round's length,
α update and goodput curve recomputed from the recorded numbers; a bad ``stop`` is refused in
one line.
"""

from __future__ import annotations

import pytest

from decoders.speculative.draft_model import (DEL_ALPHA0, expected_goodput, goodput_draft_length,
                                              parameter_count)
from playground.core.errors import PlaygroundError
from playground.engine import prepare
from test_speculative import PROMPTS as VARIED_PROMPTS, run, varied, varied_draft  # noqa: F401 (fixtures)

BUNDLED_PROMPTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "HAMLET:\nTo be, or not to be, that is the question:\n",
    "[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter",  # repetitive: long accepted runs
]


@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-draft", device="cpu")


def _bundled_run(target, decoder, prompt, n, draft=None, **params):
    r = prepare(model=target, decoder=decoder, prompt=prompt, max_new_tokens=n,
                draft=draft if decoder != "greedy" else None, params=params)
    r.ctx.stop_ids = set()  # run to the length asked, so both runs commit the same count
    return r.finish()


# ---------------------------------------------------------------------- losslessness
@pytest.mark.parametrize("prompt", BUNDLED_PROMPTS)
def test_del_equals_greedy_on_bundled_models(bundled, prompt):
    target, draft = bundled
    for n in (9, 32):
        ref = _bundled_run(target, "greedy", prompt, n)
        tr = _bundled_run(target, "speculative", prompt, n, draft, temperature=0.0, stop="del")
        assert tr.output_ids == ref.output_ids, f"{prompt[:20]!r}, {n} tokens"
        assert [t for s in tr.steps for t in s.committed] == tr.output_ids
        assert tr.stats["lossless_mismatch"] == 0
        assert all(s.evidence["draft_stop"]["reason"] in ("goodput", "gamma", "length") for s in tr.steps)


def test_del_equals_greedy_when_drafts_are_often_rejected(varied, varied_draft):  # noqa: F811
    for prompt, n in zip(VARIED_PROMPTS, [5, 17, 24, 9, 24]):
        ref = run(varied, "greedy", prompt, n)
        tr = run(varied, "speculative", prompt, n, draft=varied_draft, stop="del", gamma=8)
        assert tr.output_ids == ref.output_ids, f"{prompt!r}, {n} tokens"
        assert len(tr.output_ids) == n


def test_rules_is_the_default(varied, varied_draft):  # noqa: F811
    """stop=rules is the decoder as it was: same steps as leaving the knob out, no DEL evidence."""
    a = run(varied, "speculative", VARIED_PROMPTS[1], 20, draft=varied_draft)
    b = run(varied, "speculative", VARIED_PROMPTS[1], 20, draft=varied_draft, stop="rules")
    assert [s.committed for s in a.steps] == [s.committed for s in b.steps]
    assert [s.evidence for s in a.steps] == [s.evidence for s in b.steps]
    assert not any("del_goodput" in s.evidence for s in a.steps) and "del_alpha" not in a.stats


# ---------------------------------------------------------------------- the goodput formula
def test_expected_goodput_hand_values():
    # k = 0: one target forward commits exactly one token, whatever α and c
    assert expected_goodput(0.5, 0, 0.3) == pytest.approx(1.0)
    # α = 0.5, k = 1, c = 0.5: (1 - 0.25) / 0.5 = 1.5 tokens over 1.5 forwards
    assert expected_goodput(0.5, 1, 0.5) == pytest.approx(1.0)
    # α = 0.5, k = 2, c = 0.1: (1 - 0.125) / 0.5 = 1.75 tokens over 1.2 forwards
    assert expected_goodput(0.5, 2, 0.1) == pytest.approx(1.75 / 1.2)
    # α = 0.8, k = 1, c = 0.25: 1.8 tokens over 1.25 forwards
    assert expected_goodput(0.8, 1, 0.25) == pytest.approx(1.44)
    # α = 0.8, k = 3, c = 0.2: (1 - 0.4096) / 0.2 = 2.952 tokens over 1.6 forwards
    assert expected_goodput(0.8, 3, 0.2) == pytest.approx(1.845)
    # α = 1: every draft accepted, k + 1 tokens (the closed form's limit)
    assert expected_goodput(1.0, 3, 0.5) == pytest.approx(4 / 2.5)
    # α = 0: only the correction is committed
    assert expected_goodput(0.0, 3, 0.1) == pytest.approx(1 / 1.3)
    # the closed form is the geometric sum
    for a in (0.1, 0.55, 0.93):
        for k in range(6):
            assert expected_goodput(a, k, 0.2) == pytest.approx(sum(a ** i for i in range(k + 1)) / (k * 0.2 + 1))


def test_goodput_draft_length_follows_acceptance():
    # α = 0.8, c = 0.2: goodput 1, 1.5, 1.743, 1.845, 1.868, 1.844 for k = 0..5: four drafts
    assert goodput_draft_length(0.8, 10, 0.2) == 4
    assert goodput_draft_length(0.8, 3, 0.2) == 3  # capped by γ
    # low acceptance: drafting never pays beyond the one token every round drafts
    assert goodput_draft_length(0.1, 10, 0.2) == 1
    assert goodput_draft_length(0.0, 10, 0.2) == 1
    # a draft as costly as the target: one token, (1 + α) / 2 < 1 already
    assert goodput_draft_length(0.9, 10, 1.0) == 1
    # free drafts or certain acceptance: always up to γ
    assert goodput_draft_length(0.5, 12, 0.0) == 12
    assert goodput_draft_length(1.0, 12, 0.3) == 12
    # high α drafts longer; the length never falls as α rises
    lengths = [goodput_draft_length(a / 100, 32, 0.1) for a in range(0, 100)]
    assert lengths == sorted(lengths) and lengths[0] == 1 and lengths[-1] >= 10
    assert goodput_draft_length(0.95, 32, 0.05) > goodput_draft_length(0.6, 32, 0.05) > 1
    # the curve has one peak, so the rule's stopping point is its argmax over 1..γ
    for a in (0.3, 0.6, 0.75, 0.9, 0.97):
        for c in (0.02, 0.1, 0.3):
            best = max(range(1, 17), key=lambda k: (expected_goodput(a, k, c), -k))
            assert goodput_draft_length(a, 16, c) == best, (a, c)


# ---------------------------------------------------------------------- the recorded rounds
def _check_rounds(tr, n, gamma, cost):
    """Every round's length is the rule applied to its recorded α, α moves by the moving
    average of the recorded counts, and the curve is expected_goodput at the recorded α."""
    alpha, produced, lengths = DEL_ALPHA0, 0, []
    for s in tr.steps:
        ev, stop, nodes = s.evidence["del_goodput"], s.evidence["draft_stop"], s.evidence["tree"]["nodes"]
        assert ev["alpha"] == alpha and ev["gamma"] == gamma and ev["cost"] == pytest.approx(cost)
        want = goodput_draft_length(ev["alpha"], gamma, ev["cost"])
        assert ev["draft_length"] == want
        assert ev["goodput"] == pytest.approx([expected_goodput(alpha, k, cost) for k in range(gamma + 1)],
                                              rel=1e-5)
        room = n - produced - 1  # the last position is always the target's own token
        assert ev["drafted"] == len(nodes) == min(want, room)
        if nodes:
            assert stop["reason"] == ("length" if room < want else "gamma" if want == gamma else "goodput")
            accepted = len(s.evidence["tree"]["accepted_path"])
            assert ev["accepted"] == accepted
            alpha = 0.7 * alpha + 0.3 * accepted / len(nodes)
            lengths.append(len(nodes))
        assert ev["alpha_next"] == pytest.approx(alpha, abs=1e-12)
        alpha = ev["alpha_next"]
        produced += len(s.committed)
    assert produced == n
    return lengths


def test_recorded_draft_lengths_follow_the_rule_bundled(bundled):
    target, draft = bundled
    cost = parameter_count(draft.model) / parameter_count(target.model)
    assert 0 < cost < 1
    lengths = []
    for prompt in BUNDLED_PROMPTS:
        tr = _bundled_run(target, "speculative", prompt, 40, draft, temperature=0.0, stop="del", gamma=10)
        lengths += _check_rounds(tr, 40, 10, cost)
        assert tr.stats["del_alpha"] == pytest.approx(tr.steps[-1].evidence["del_goodput"]["alpha_next"], abs=1e-6)
    assert len(set(lengths)) >= 2, "α never moved the length: the test would not see the rule"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_recorded_draft_lengths_follow_the_rule_varied(varied, varied_draft, temperature):  # noqa: F811
    cost = parameter_count(varied_draft.model) / parameter_count(varied.model)
    tr = run(varied, "speculative", VARIED_PROMPTS[1], 24, draft=varied_draft, stop="del", gamma=6,
             temperature=temperature, seed=2)
    _check_rounds(tr, 24, 6, cost)


def test_del_ignores_the_confidence_rules(bundled):
    """Under del the length comes from α alone: the confidence floor and adaptive_h change nothing."""
    target, draft = bundled
    runs = [_bundled_run(target, "speculative", BUNDLED_PROMPTS[0], 24, draft, temperature=0.0, stop="del",
                         **kw) for kw in ({}, {"confidence": 0.99, "adaptive_h": 0.0})]
    assert [len(s.evidence["tree"]["nodes"]) for s in runs[0].steps] == \
        [len(s.evidence["tree"]["nodes"]) for s in runs[1].steps]


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("value", ["goodput", "DEL", "", 3])
def test_bad_stop_is_refused_in_one_line(varied, varied_draft, value):  # noqa: F811
    with pytest.raises(PlaygroundError, match="stop") as e:
        prepare(model=varied, decoder="speculative", prompt="ROMEO:", draft=varied_draft, params={"stop": value})
    msg = str(e.value)
    assert "\n" not in msg and "rules" in msg and "del" in msg
