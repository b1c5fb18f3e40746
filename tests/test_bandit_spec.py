"""BanditSpec: the bandits (UCB1, EXP3) and the modelled reward against hand computations; each
round's evidence is the bandit's state; bad arm lists are one line. That it equals greedy at
temperature 0 and draws the target's law at 1 is checked for every lossless speculative decoder
(tests/test_speculative.py, tests/test_speculative_dist.py)."""

from __future__ import annotations

import math

import pytest

from decoders.speculative.bandit import EXP3, UCB, modeled_reward
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from visualizers import run_figures
from visualizers.bandit import bandit_figure


def test_ucb_by_hand():
    ucb = UCB(3, 1.0)
    assert [ucb.choose(0.5) for _ in range(1)] == [0]
    for arm, r in ((0, 0.2), (1, 0.9), (2, 0.5)):
        assert ucb.choose(0.5) == arm  # every arm once, in order
        ucb.update(arm, r)
    # t = 3, each n = 1: bonus sqrt(2 ln 3) for all, so the best mean wins
    assert ucb.scores() == pytest.approx([x + math.sqrt(2 * math.log(3)) for x in (0.2, 0.9, 0.5)])
    assert ucb.choose(0.5) == 1
    for _ in range(5):
        ucb.update(1, 0.9)
    # t = 8: arm 1 (n = 6) 0.9 + sqrt(2 ln 8 / 6) = 1.733; arm 2 (n = 1) 0.5 + sqrt(2 ln 8) = 2.539
    assert ucb.scores()[2] == pytest.approx(0.5 + math.sqrt(2 * math.log(8)))
    assert ucb.choose(0.5) == 2
    greedy = UCB(2, 0.0)
    greedy.update(0, 0.4)
    greedy.update(1, 0.6)
    assert greedy.choose(0.0) == 1 and greedy.means() == [0.4, 0.6]


def test_exp3_by_hand():
    exp3 = EXP3(4, 0.2)
    assert exp3.probs() == pytest.approx([0.25] * 4)
    # u = 0.6 falls in the third arm's slice [0.5, 0.75)
    assert exp3.choose(0.6) == 2
    exp3.update(2, 0.5)
    # weight of arm 2: exp(0.2 · (0.5 / 0.25) / 4) = exp(0.1)
    w = [1.0, 1.0, math.exp(0.1), 1.0]
    want = [0.8 * x / sum(w) + 0.2 / 4 for x in w]
    assert exp3.probs() == pytest.approx(want)
    assert exp3.pulls == [0, 0, 1, 0] and exp3.means() == [None, None, 0.5, None]


def test_modeled_reward_by_hand():
    # arms 1, 4 at cost 0.25: best possible is max(2 / 1.25, 5 / 2) = 2.5
    assert modeled_reward(3, 4, 0.25, [1, 4]) == pytest.approx(3 / 2.0 / 2.5)
    assert modeled_reward(2, 1, 0.25, [1, 4]) == pytest.approx(2 / 1.25 / 2.5)
    assert modeled_reward(5, 4, 0.25, [1, 4]) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-draft", device="cpu")


def run(models, n=30, **params):
    target, draft = models
    return prepare(model=target, decoder="bandit_spec", prompt="ROMEO: But soft", max_new_tokens=n, seed=3,
                   draft=draft, params=params).finish()


@pytest.mark.parametrize("algorithm", ["ucb", "exp3"])
def test_rounds_record_the_bandits_state(bundled, algorithm):
    arms = [1, 3, 6]
    tr = run(bundled, algorithm=algorithm, arms="1,3,6", draft_cost=0.2)
    pulls = [0, 0, 0]
    for k, s in enumerate(tr.steps):
        b = s.evidence["bandit"]
        assert b["arms"] == arms and b["gamma"] == arms[b["chosen"]]
        if algorithm == "ucb" and k < 3:
            assert b["chosen"] == k  # every arm once first
        drafted = len(s.evidence["tree"]["nodes"])
        assert drafted == b["drafted"] <= b["gamma"]
        assert b["reward"] == pytest.approx(modeled_reward(len(s.committed), drafted, 0.2, arms), abs=1e-6)
        pulls[b["chosen"]] += 1
        assert b["pulls"] == pulls
        if algorithm == "exp3":
            assert sum(b["scores"]) == pytest.approx(1.0, abs=1e-5)  # rounded to 6 digits each
    assert tr.stats["arm_pulls"] == {str(g): n for g, n in zip(arms, pulls)}
    titles = [t for t, _ in run_figures(tr.to_dict())]
    assert "Bandit arms over time" in titles
    fig = bandit_figure(tr.to_dict())  # drawn, not a note
    assert [d.y[-1] for d in fig.data[1:1 + len(arms)]] == pulls


def test_bad_arms_are_one_line(bundled):
    for arms, msg in (("", "at least one"), ("0,2", "unknown item"), ("2,2", "twice"), ("40", "unknown item")):
        with pytest.raises(PlaygroundError, match=msg):
            prepare(model=bundled[0], decoder="bandit_spec", prompt="x", max_new_tokens=4, draft=bundled[1],
                    params={"arms": arms})
