"""Online draft selection (``bandit_spec`` with ``arm_kind=drafter``): the bandit's arms are
drafters (draft model, prompt lookup, layer-skip exits). At temperature 0 the output is
greedy's token for token whichever drafters it pulls; the recorded choices are UCB1 replayed
on rewards recomputed from each round's recorded counts; the regret curve is
t · max mean − Σ rewards from the recorded values; bad drafter lists are one line."""

from __future__ import annotations

import math

import pytest

from decoders.base import Context
from decoders.speculative.bandit import BanditSpec
from decoders.speculative.draft_select import DrafterSpec, drafter_reward, parse_drafters
from playground.core.errors import PlaygroundError
from playground.engine import prepare
from visualizers import run_figures
from visualizers.bandit import bandit_figure, bandit_rounds, hindsight_regret

PROMPT = "ROMEO: But soft"
ALL = "draft_model,prompt_lookup,layer_skip:1,layer_skip"


@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-draft", device="cpu")


def run(models, n=24, decoder="bandit_spec", **params):
    target, draft = models
    return prepare(model=target, decoder=decoder, prompt=PROMPT, max_new_tokens=n, seed=3,
                   draft=draft if decoder == "bandit_spec" else None, params=params).finish()


@pytest.fixture(scope="module")
def greedy(bundled):
    return run(bundled, decoder="greedy").output_ids


@pytest.fixture(scope="module")
def ucb_trace(bundled):
    return run(bundled, arm_kind="drafter", drafters=ALL, algorithm="ucb", ucb_c=0.5, gamma=3, draft_cost=0.2)


def test_parse_drafters():
    assert parse_drafters(" draft_model, prompt_lookup ,layer_skip:2,layer_skip") == [
        DrafterSpec("draft_model"), DrafterSpec("prompt_lookup"), DrafterSpec("layer_skip", 2),
        DrafterSpec("layer_skip")]
    assert [s.label for s in parse_drafters("layer_skip:2,layer_skip")] == ["layer_skip:2", "layer_skip"]
    for text, msg in (("", "at least one"), ("eagle", "unknown drafter 'eagle'"), ("prompt_lookup:2", "no ':'"),
                      ("layer_skip:x", "whole number"), ("layer_skip:0", "whole number"),
                      ("layer_skip:2,layer_skip:2", "twice")):
        with pytest.raises(PlaygroundError, match=msg) as e:
            parse_drafters(text)
        assert "\n" not in str(e.value)


def test_drafter_reward_by_hand():
    # γ = 4, costs 0.1 / 0 / 0.5: best is the free drafter committing all 5 tokens
    costs = [0.1, 0.0, 0.5]
    assert drafter_reward(3, 4, 0.1, 4, costs) == pytest.approx(3 / 1.4 / 5)
    assert drafter_reward(5, 4, 0.0, 4, costs) == pytest.approx(1.0)
    assert drafter_reward(1, 0, 0.0, 4, costs) == pytest.approx(0.2)  # no lookup match: the target's token alone


@pytest.mark.parametrize("algorithm", ["ucb", "exp3"])
def test_lossless_at_temperature_zero(bundled, greedy, algorithm):
    tr = run(bundled, arm_kind="drafter", drafters=ALL, algorithm=algorithm, gamma=4)
    assert tr.output_ids == greedy
    names = [s.evidence["bandit"]["drafter"] for s in tr.steps]
    assert all("lossless_mismatch" not in s.evidence for s in tr.steps)
    if algorithm == "ucb":
        assert set(names) == set(ALL.split(","))  # every drafter was pulled (UCB1 tries each once)
    # and without a draft model among the arms (the self-drafters only)
    tr2 = run(bundled, arm_kind="drafter", drafters="prompt_lookup,layer_skip:2,layer_skip:5", gamma=5)
    assert tr2.output_ids == greedy


def test_sampling_runs_with_drafter_arms(bundled):
    tr = run(bundled, arm_kind="drafter", drafters=ALL, algorithm="exp3", temperature=0.8, reward="measured")
    rewards = [s.evidence["bandit"]["reward"] for s in tr.steps]
    assert tr.output_ids and all(0.0 <= r <= 1.0 for r in rewards)


def test_choices_follow_ucb1_from_recorded_rewards(ucb_trace):
    c, gamma = 0.5, 3
    rounds = bandit_rounds(ucb_trace.to_dict())
    arms = rounds[0]["arms"]
    assert arms == ALL.split(",")
    # costs per drafted token: draft_cost, 0, k / L on the 6-layer target (1 and 3 layers)
    assert rounds[0]["costs"] == pytest.approx([0.2, 0.0, 1 / 6, 3 / 6], abs=1e-6)
    pulls, sums = [0] * len(arms), [0.0] * len(arms)
    for k, (s, b) in enumerate(zip(ucb_trace.steps, rounds)):
        t = sum(pulls)
        if 0 in pulls:
            want = pulls.index(0)  # every arm once, in order
        else:
            bounds = [sums[i] / pulls[i] + c * math.sqrt(2 * math.log(t) / pulls[i]) for i in range(len(arms))]
            want = max(range(len(arms)), key=lambda i: (bounds[i], -i))
            assert b["scores"] == pytest.approx(bounds, abs=1e-5)
        assert b["chosen"] == want, f"round {k}"
        assert b["drafter"] == arms[want] and b["gamma"] == gamma and b["arm_kind"] == "drafter"
        drafted = len(s.evidence["tree"]["nodes"])
        assert drafted == b["drafted"] <= gamma
        # the round's reward recomputed from what it recorded (committed, drafted, the costs)
        r = drafter_reward(len(s.committed), drafted, b["costs"][want], gamma, b["costs"])
        assert b["reward"] == pytest.approx(r, abs=1e-6)
        pulls[want] += 1
        sums[want] += r
        assert b["pulls"] == pulls
        assert b["means"] == pytest.approx([x / n if n else None for x, n in zip(sums, pulls)], abs=1e-6)
    assert ucb_trace.stats["arm_pulls"] == dict(zip(arms, pulls))


def test_regret_from_recorded_values(ucb_trace):
    rounds = bandit_rounds(ucb_trace.to_dict())
    best = max(m for m in rounds[-1]["means"] if m is not None)
    acc, want = 0.0, []
    for t, b in enumerate(rounds, start=1):
        acc += b["reward"]
        want.append(t * best - acc)
    assert hindsight_regret(rounds) == pytest.approx(want)
    # the best fixed arm in hindsight earns its mean every round: regret ends at Σ over arms
    # of pulls · (best − mean), never negative
    last = rounds[-1]
    gap = sum(n * (best - m) for n, m in zip(last["pulls"], last["means"]) if n)
    assert want[-1] == pytest.approx(gap, abs=1e-4) and want[-1] >= -1e-6
    # by hand: arm 0 earns 0.5 and 0.3 (mean 0.4), arm 1 earns 0.6 (mean 0.6)
    toy = [{"chosen": 0, "reward": 0.5, "means": [0.5, None]}, {"chosen": 1, "reward": 0.6, "means": [0.5, 0.6]},
           {"chosen": 0, "reward": 0.3, "means": [0.4, 0.6]}]
    assert hindsight_regret(toy) == pytest.approx([0.1, 0.1, 0.4])


def test_run_view_names_the_drafters_and_draws_the_regret(ucb_trace):
    d = ucb_trace.to_dict()
    assert "Bandit arms over time" in [t for t, _ in run_figures(d)]
    fig = bandit_figure(d)
    arms = ALL.split(",")
    assert list(fig.layout.yaxis.ticktext) == arms
    pulls = bandit_rounds(d)[-1]["pulls"]
    assert [tr.y[-1] for tr in fig.data[1:1 + len(arms)]] == pulls
    assert list(fig.data[-1].y) == pytest.approx(hindsight_regret(bandit_rounds(d)))
    assert "regret" in fig.data[-1].name


def test_length_arms_record_no_drafter_fields(bundled):
    # the default (draft-length arms) keeps the evidence it had
    tr = run(bundled, n=12)
    b = tr.steps[0].evidence["bandit"]
    assert set(b) == {"algorithm", "arms", "chosen", "gamma", "drafted", "reward", "raw_reward", "reward_kind",
                      "pulls", "means", "scores"}
    assert b["arms"] == [1, 2, 4, 8]


def test_bad_drafters_are_one_line(bundled):
    target, draft = bundled
    for drafters, msg in (("draft_model,medusa", "unknown drafter 'medusa'"), ("layer_skip:6", "below the model's 6"),
                          ("", "at least one")):
        with pytest.raises(PlaygroundError, match=msg) as e:
            prepare(model=target, decoder="bandit_spec", prompt="x", max_new_tokens=4, draft=draft,
                    params={"arm_kind": "drafter", "drafters": drafters}).finish()
        assert "\n" not in str(e.value)


def test_draft_model_arm_without_a_draft_is_one_line(bundled):
    target, _draft = bundled
    params = BanditSpec.params.validate("bandit_spec", {"arm_kind": "drafter", "drafters": "prompt_lookup,draft_model"})
    ctx = Context(target=target.view(), prompt_ids=target.encode(PROMPT), max_new_tokens=4, params=params, draft=None)
    with pytest.raises(PlaygroundError, match="drafter 'draft_model' needs a draft model") as e:
        next(iter(BanditSpec().run(ctx)))
    assert "\n" not in str(e.value)
    # the self-drafters alone run without one
    params = BanditSpec.params.validate("bandit_spec", {"arm_kind": "drafter", "drafters": "prompt_lookup,layer_skip"})
    ctx = Context(target=target.view(), prompt_ids=target.encode(PROMPT), max_new_tokens=4, params=params, draft=None)
    steps = list(BanditSpec().run(ctx))
    assert sum(len(s.committed) for s in steps) == 4
    # through the engine the decoder's draft model is asked for up front, also in one line
    with pytest.raises(PlaygroundError, match="needs a draft model") as e:
        prepare(model=target, decoder="bandit_spec", prompt="x", max_new_tokens=4, draft=None,
                params={"arm_kind": "drafter", "drafters": "draft_model"})
    assert "\n" not in str(e.value)
