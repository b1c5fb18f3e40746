"""BanditSpec: a multi-armed bandit chooses the draft length γ of every speculative round
(Hou et al. 2025), by UCB (stochastic rewards) or EXP3 (adversarial rewards); with
``arm_kind=drafter`` its arms are drafters instead (online draft selection, A358; the
drafters are in ``decoders/speculative/draft_select.py``)."""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

from decoders.base import Choice, Context, Float, Int, PlaygroundError, Text, register
from decoders.citation import arxiv
from decoders.draft_state import DraftState
from decoders.speculative._chain import draft_chain
from decoders.draft_tree import SpecDecoder, SpecParams, Tree, Verified, rule_params, sampling_params
from decoders.speculative.draft_model import check_draft, check_draft_context
from decoders.speculative.draft_select import Drafter, build_drafters, drafter_reward, parse_drafters
from playground.core.trace import Step

MAX_GAMMA = 32
ALGORITHMS = ("ucb", "exp3")
ARM_KINDS = ("length", "drafter")


def parse_arms(text: str) -> list[int]:
    """The draft lengths of a comma list (``"1,2,4,8"``), in the order given; one line if bad."""
    arms = [a.strip() for a in str(text).split(",") if a.strip()]
    if not arms:
        raise PlaygroundError("knob 'arms': give at least one draft length, e.g. 1,2,4,8")
    return [int(a) for a in arms]


class UCB:
    """UCB1 over K arms with rewards in [0, 1]: pull every arm once, then the arm with the
    largest mean + c · sqrt(2 ln t / n_i) (t = rounds so far; ties to the first arm)."""

    def __init__(self, k: int, c: float) -> None:
        self.pulls = [0] * k
        self.sums = [0.0] * k
        self.c = c

    def means(self) -> list[float | None]:
        """Mean reward per arm (None before its first pull)."""
        return [s / n if n else None for s, n in zip(self.sums, self.pulls)]

    def scores(self) -> list[float | None]:
        """Each arm's upper confidence bound now (None: not pulled yet, so it goes first)."""
        t = sum(self.pulls)
        return [None if n == 0 else s / n + self.c * math.sqrt(2.0 * math.log(max(t, 1)) / n)
                for s, n in zip(self.sums, self.pulls)]

    def choose(self, u: float) -> int:
        """The arm to pull (``u``, a uniform, is not needed: UCB is deterministic)."""
        scores = self.scores()
        if None in scores:
            return scores.index(None)
        return max(range(len(scores)), key=lambda i: (scores[i], -i))

    def update(self, arm: int, reward: float) -> None:
        """Record a reward in [0, 1] for ``arm``."""
        self.pulls[arm] += 1
        self.sums[arm] += reward


class EXP3:
    """EXP3 over K arms with rewards in [0, 1]: draw arm i with probability
    (1 - g) · w_i / sum w + g / K, and after a reward r multiply the pulled arm's weight by
    exp(g · (r / p_i) / K), the importance-weighted reward estimate."""

    def __init__(self, k: int, g: float) -> None:
        self.log_w = [0.0] * k
        self.pulls = [0] * k
        self.sums = [0.0] * k
        self.g = g
        self.last: list[float] = self.probs()

    def probs(self) -> list[float]:
        """The current draw probabilities."""
        k, top = len(self.log_w), max(self.log_w)
        w = [math.exp(lw - top) for lw in self.log_w]
        tot = sum(w)
        return [(1.0 - self.g) * x / tot + self.g / k for x in w]

    def means(self) -> list[float | None]:
        """Mean reward per arm (None before its first pull)."""
        return [s / n if n else None for s, n in zip(self.sums, self.pulls)]

    def scores(self) -> list[float]:
        """What the choice is based on: the draw probabilities."""
        return self.probs()

    def choose(self, u: float) -> int:
        """The arm drawn with the uniform ``u`` (inverse CDF over the arms in order)."""
        self.last = self.probs()
        acc = 0.0
        for i, p in enumerate(self.last):
            acc += p
            if u < acc:
                return i
        return len(self.last) - 1

    def update(self, arm: int, reward: float) -> None:
        """Record a reward in [0, 1] for ``arm`` (drawn with probability ``self.last[arm]``)."""
        self.pulls[arm] += 1
        self.sums[arm] += reward
        self.log_w[arm] += self.g * (reward / self.last[arm]) / len(self.log_w)


def modeled_reward(committed: int, drafted: int, cost: float, arms: Sequence[int]) -> float:
    """Tokens per unit of modelled time, in [0, 1]: a round costs one target forward plus
    ``cost`` per drafted token, so the reward is committed / (1 + cost · drafted), divided by
    the best any arm could get (all γ + 1 tokens committed)."""
    best = max((g + 1) / (1.0 + cost * g) for g in arms)
    return committed / (1.0 + cost * drafted) / best


class BanditParams(SpecParams):
    """The speculative knobs, with ``arms`` checked to name at least one draft length."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        parse_arms(out["arms"])
        # checked whatever arm_kind says, so a typo is caught before anyone switches to drafters
        parse_drafters(out["drafters"])
        return out


@register
class BanditSpec(SpecDecoder):
    """BanditSpec (Hou et al. 2025): speculative decoding whose draft length γ is chosen each
    round by a multi-armed bandit over ``arms``.

    Implements: each round the bandit picks an arm (a γ); the draft model drafts γ tokens and
    the target verifies them exactly as ``speculative`` does (same sampling chain and
    acceptance rules, so with ``strict`` it is lossless: greedy's text at temperature 0, the
    target's law at 1 — γ depends only on earlier rounds). The round's reward updates the arm:
    ``modeled`` = committed tokens / (1 + ``draft_cost`` · drafted tokens), normalised to
    [0, 1] by the best reward any arm could earn, a deterministic stand-in for throughput;
    ``measured`` = committed tokens per wall-clock second of the round, normalised by the best
    rate seen so far. ``ucb`` is textbook UCB1 in the role of the paper's UCBSpec (stochastic
    rewards), ``exp3`` textbook EXP3 in the role of EXP3Spec (adversarial rewards), its draws
    on the run's ``bandit`` stream.
    With ``arm_kind=drafter`` (online draft selection, A358) the arms are the ``drafters``
    instead — ``draft_model``, ``prompt_lookup`` (suffix n-gram, n = 3..1), ``layer_skip`` or
    ``layer_skip:k`` (the target's first k layers; half of them when k is omitted) — each
    drafting a chain of ``gamma`` tokens; the bandit, the verification and the rewards are the
    same, except that the modelled reward charges each drafter its own cost per drafted token:
    ``draft_cost`` for the draft model, 0 for prompt lookup, k / L for an early exit at layer
    k of L; the normaliser is the best reward the cheapest drafter could earn. Still lossless:
    which drafter drafts depends only on earlier rounds, and the target's test is unchanged.
    Simplifies: for draft lengths, one draft model; for drafters, one shared γ, no draft
    trees, and only the pulled drafter is scored each round (the online-selection paper scores every drafter on the
    verified text to learn from all of them at once; here it is a plain bandit); the bandits
    are the textbook UCB1 and EXP3, not the paper's exact variants and constants; both rewards
    and their normalisation to [0, 1] are this project's, and the costs are modelled, not
    measured (a lookup scan is free, an early exit costs its share of the layers).
    """

    name = "bandit_spec"
    needs_draft = True
    lossless = True
    shows = ("; plus `bandit` per round: the arms (draft lengths, or drafters with `arm_kind=drafter`), the chosen "
             "arm and γ, its reward, and every arm's pulls, mean reward and score (run plot *Bandit arms over time*, "
             "with the regret against the best arm in hindsight)")
    reference = ("Hou et al. 2025, BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms (ICML; "
                 "arXiv:2505.15141)")
    papers = (
        arxiv("Hou et al. 2025, BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms "
              "(ICML)", "2505.15141"),
    )
    description = ("A bandit (UCB or EXP3) picks the draft length γ, or the drafter, of each speculative round "
                   "from its rewards so far")
    params = BanditParams(
        arms=Text("1,2,4,8", "draft lengths γ the bandit chooses among (comma list, 1-32 each)",
                  items=tuple(str(i) for i in range(1, MAX_GAMMA + 1))),
        algorithm=Choice("ucb", ALGORITHMS, "ucb (UCB1: mean + confidence bonus) or exp3 (exponential weights)"),
        ucb_c=Float(1.0, 0.0, 10.0, "ucb: scale of the bonus c · sqrt(2 ln t / n); 0 = always the best mean"),
        exp3_gamma=Float(0.1, 0.01, 1.0, "exp3: exploration share (mixed with a uniform draw) and learning rate / K"),
        reward=Choice("modeled", ("modeled", "measured"), "modeled: tokens / (1 + draft_cost · drafted), "
                                                          "deterministic; measured: tokens per second of the round"),
        draft_cost=Float(0.1, 0.0, 1.0, "modeled reward: cost of one drafted token in target forwards"),
        arm_kind=Choice("length", ARM_KINDS, "length: the arms are the draft lengths in 'arms'; drafter: the arms "
                                             "are the drafters in 'drafters', each drafting 'gamma' tokens"),
        drafters=Text("draft_model,prompt_lookup,layer_skip",
                      "drafter arms (comma list): draft_model, prompt_lookup, layer_skip or layer_skip:k "
                      "(exit after layer k; half the layers without k)"),
        gamma=Int(4, 1, MAX_GAMMA, "drafter arms: tokens every drafter drafts per round"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        self.by_drafter = ctx.params.get("arm_kind", "length") == "drafter"
        self.drafters: list[Drafter] = []
        if self.by_drafter:
            # the draft model is set up only when an arm uses it, so its checks apply only then
            self.drafters = build_drafters(parse_drafters(ctx.params["drafters"]), ctx, lambda: self._draft_state(ctx),
                                           float(ctx.params["draft_cost"]), self.name)
            self.arms: list[Any] = [d.label for d in self.drafters]
        else:
            self.d = self._draft_state(ctx)
            self.arms = parse_arms(ctx.params["arms"])
        k = len(self.arms)
        self.algo = (UCB(k, float(ctx.params["ucb_c"])) if ctx.params["algorithm"] == "ucb"
                     else EXP3(k, float(ctx.params["exp3_gamma"])))
        self.best_rate = 0.0
        self.round: dict[str, Any] = {}

    def _draft_state(self, ctx: Context) -> DraftState:
        if ctx.draft is None:
            raise PlaygroundError(f"{self.name}: drafting with a draft model needs one, and none was given")
        check_draft_context(ctx)
        return DraftState(ctx.draft, check_draft(self.name, ctx))

    def gamma_of(self, ctx: Context, arm: int) -> int:
        """The draft length arm ``arm`` asks for (drafter arms share the ``gamma`` knob)."""
        return int(ctx.params["gamma"]) if self.by_drafter else self.arms[arm]

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        scores = self.algo.scores()
        arm = self.algo.choose(self.next_uniform(ctx, "bandit"))
        self.round = {"arm": arm, "scores": scores, "t0": time.perf_counter()}
        if self.by_drafter:
            return self.drafters[arm].draft(self, ctx, min(self.gamma_of(ctx, arm), max_depth))
        return draft_chain(self, ctx, self.d, min(self.arms[arm], max_depth)).tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        drafted = sum(1 for a in v.tree.aux if not a)
        if ctx.params["reward"] == "modeled" and self.by_drafter:
            cost = self.drafters[self.round["arm"]].cost
            raw = len(v.committed) / (1.0 + cost * drafted)
            reward = drafter_reward(len(v.committed), drafted, cost, int(ctx.params["gamma"]),
                                    [d.cost for d in self.drafters])
        elif ctx.params["reward"] == "modeled":
            raw = len(v.committed) / (1.0 + float(ctx.params["draft_cost"]) * drafted)
            reward = modeled_reward(len(v.committed), drafted, float(ctx.params["draft_cost"]), self.arms)
        else:
            raw = len(v.committed) / max(time.perf_counter() - self.round["t0"], 1e-9)
            self.best_rate = max(self.best_rate, raw)
            reward = raw / self.best_rate
        self.algo.update(self.round["arm"], reward)
        self.round.update(reward=reward, raw=raw, drafted=drafted)

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        r = self.round
        step.evidence["bandit"] = {
            "algorithm": str(ctx.params["algorithm"]), "arms": list(self.arms), "chosen": r["arm"],
            "gamma": self.gamma_of(ctx, r["arm"]), "drafted": r["drafted"], "reward": round(r["reward"], 6),
            "raw_reward": round(r["raw"], 6), "reward_kind": str(ctx.params["reward"]),
            "pulls": list(self.algo.pulls),
            "means": [None if m is None else round(m, 6) for m in self.algo.means()],
            # the scores the choice was made on (UCB bounds, None = not pulled yet; EXP3 draw probabilities)
            "scores": [None if s is None else round(s, 6) for s in r["scores"]],
        }
        if self.by_drafter:
            # only in drafter mode, so a draft-length run's evidence stays what it was
            d = self.drafters[r["arm"]]
            step.evidence["bandit"].update(arm_kind="drafter", drafter=d.label,
                                           costs=[round(x.cost, 6) for x in self.drafters])
        self.extra_stats["arm_pulls"] = {str(g): n for g, n in zip(self.arms, self.algo.pulls)}
        return step
