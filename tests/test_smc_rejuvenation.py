"""``smc`` with ``rejuvenate`` = k: one Metropolis-Hastings move per particle after every
resampling, redrawing its last k tokens from the proposal.

Off is the run without the knob; each recorded acceptance recomputes from the recorded
factors; on a bigram model with three tokens, where the target over complete sequences is
known exactly, the move keeps an exactly drawn population's distribution and the runs'
evidence-weighted outputs still follow the exact target; bad knobs are refused in one line."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import playground
from decoders.base import Context
from decoders.guided.smc import SMC, mh_rejuvenate
from playground.core.errors import PlaygroundError

# ---------------------------------------------------------------------- an exact tiny model
LETTERS = "abc"
# next-token logits given the previous token (the prompt is token 0, "a")
TABLE = torch.tensor([[0.0, -0.7, 0.4],
                      [0.9, -0.2, -0.5],
                      [-0.3, 0.6, 0.1]])
BETA = 1.5  # strength on the potential "contains b": 0 if present, else -1


class NoCache:
    """A bigram needs no state: the cache only has to survive the decoder's bookkeeping."""

    layers: list = []

    def reorder_cache(self, rows: torch.Tensor) -> None:
        pass


class Bigram:
    """A model view whose next-token logits depend only on the last token."""

    vocab_size = 3
    eos_ids: set = set()
    name = "bigram"

    def __init__(self) -> None:
        self.forwards = 0

    def new_cache(self) -> NoCache:
        return NoCache()

    def forward(self, ids, cache=None, **kw) -> SimpleNamespace:
        x = torch.as_tensor(ids, dtype=torch.long)
        if x.dim() == 1:
            x = x[None]
        self.forwards += 1
        return SimpleNamespace(logits=TABLE[x], cache=cache if cache is not None else NoCache())

    def decode(self, ids) -> str:
        return "".join(LETTERS[int(i)] for i in ids)


def log_p(seq: tuple[int, ...], prev: int = 0) -> float:
    lp = 0.0
    for tok in seq:
        lp += float(torch.log_softmax(TABLE[prev], -1)[tok])
        prev = tok
    return lp


def phi(seq) -> float:
    return 0.0 if 1 in seq else -1.0


def exact(length: int) -> dict[tuple[int, ...], float]:
    """The target over generated sequences of ``length``: p(x) * exp(BETA * phi(x)), normalised."""
    w = {s: math.exp(log_p(s) + BETA * phi(s)) for s in itertools.product(range(3), repeat=length)}
    z = sum(w.values())
    return {s: v / z for s, v in w.items()}


def run_bigram(seed: int, **knobs) -> tuple[list[int], float, list]:
    params = SMC.params.validate("smc", {"num_particles": 4, "keywords": "b", "strength": BETA,
                                         "ess_threshold": 1.0, **knobs})
    ctx = Context(target=Bigram(), prompt_ids=[0], max_new_tokens=3, params=params, seed=seed)
    dec = SMC()
    steps = list(dec.run(ctx))
    return dec.output_override, dec.extra_stats["log_z"], steps


# ---------------------------------------------------------------------- off is today's run
@pytest.mark.parametrize("seed", [0, 1])
def test_off_is_the_run_without_the_knob(seed):
    base = dict(model="tiny-shakespeare", decoder="smc", prompt="ROMEO:", max_new_tokens=16, seed=seed,
                num_particles=6, keywords="love", strength=5.0, ess_threshold=0.9)
    a = playground.generate(**base)
    b = playground.generate(**base, rejuvenate=0)
    assert b["output_ids"] == a["output_ids"]
    assert [s["beams"] for s in b["steps"]] == [s["beams"] for s in a["steps"]]
    assert [s["smc"] for s in b["steps"]] == [s["smc"] for s in a["steps"]]
    assert all("rejuvenation" not in s["smc"] for s in b["steps"])
    assert "rejuvenation_proposals" not in b["stats"]


# ---------------------------------------------------------------------- the recorded moves
def check_moves(steps: list, get) -> tuple[int, int]:
    """Every recorded move recomputes from its own factors; returns (proposals, acceptances)."""
    props = accs = 0
    for t, s in enumerate(steps):
        rj = get(s).get("rejuvenation")
        if rj is None:
            continue
        assert get(s)["resampled"] == rj["after_resampling"]
        assert rj["proposals"] == len(rj["moves"])
        assert rj["accepted"] == sum(mv["accepted"] for mv in rj["moves"])
        assert rj["acceptance_rate"] == round(rj["accepted"] / rj["proposals"], 4)
        for mv in rj["moves"]:
            assert len(mv["current"]) == len(mv["proposed"]) == mv["k"]
            if not mv["valid"]:
                assert mv["accept_prob"] == 0.0 and not mv["accepted"]
                continue
            assert mv["log_target_current"] == mv["log_q_current"] + mv["log_potential_current"]
            assert mv["log_target_proposed"] == mv["log_q_proposed"] + mv["log_potential_proposed"]
            # r = gamma(a, y') q(y | a) / (gamma(a, y) q(y' | a))
            ratio = (mv["log_target_proposed"] - mv["log_target_current"]) + \
                (mv["log_q_current"] - mv["log_q_proposed"])
            assert mv["log_ratio"] == ratio
            assert mv["accept_prob"] == min(1.0, math.exp(ratio))
            assert mv["accepted"] == (mv["u"] < mv["accept_prob"])
            # the proposal is the target's token part, so r is the potential's change alone
            assert ratio == pytest.approx(mv["log_potential_proposed"] - mv["log_potential_current"], abs=1e-9)
            # the next step's particle carries the tokens the move left it with
            if t + 1 < len(steps):
                ids = steps[t + 1]["beams"][mv["particle"]]["ids"] if isinstance(steps[t + 1], dict) \
                    else steps[t + 1].evidence["beams"][mv["particle"]]["ids"]
                end = t + 1
                assert ids[end - mv["k"]:end] == (mv["proposed"] if mv["accepted"] else mv["current"])
        props += rj["proposals"]
        accs += rj["accepted"]
    return props, accs


@pytest.mark.parametrize("at", ["resample", "every"])
def test_acceptance_recomputes_from_the_recorded_factors_on_the_bigram(at):
    props = accs = 0
    for seed in range(6):
        _, _, steps = run_bigram(seed, rejuvenate=2, rejuvenate_at=at)
        p, a = check_moves(steps, lambda s: s.evidence["smc"])
        props, accs = props + p, accs + a
    assert props > 0 and 0 < accs < props


def test_acceptance_recomputes_on_the_bundled_model():
    r = playground.generate(model="tiny-shakespeare", decoder="smc", prompt="ROMEO:", max_new_tokens=12, seed=3,
                            num_particles=6, keywords="love, the", strength=4.0, ess_threshold=0.99, rejuvenate=3)
    props, accs = check_moves(r["steps"], lambda s: s["smc"])
    assert props > 0
    assert r["stats"]["rejuvenation_proposals"] == props and r["stats"]["rejuvenation_accepted"] == accs
    assert r["stats"]["resamples"] == sum(1 for s in r["steps"] if s["smc"]["resampled"])


# ---------------------------------------------------------------------- the distribution is kept
@pytest.mark.parametrize("k", [1, 2, 3])
def test_one_move_keeps_an_exactly_drawn_population_exact(k):
    """Draw sequences of length 2 from the exact target, move each once: they still follow it."""
    target = exact(2)
    seqs = list(target)
    probs = np.array([target[s] for s in seqs])
    rng = np.random.default_rng(11 + k)
    n = 3000
    pop = [list(seqs[i]) for i in rng.choice(len(seqs), size=n, p=probs)]
    view = Bigram()
    us = rng.random((n, min(k, 2) + 1))
    moves = mh_rejuvenate([0], pop, k, lambda b: view.forward(b).logits,
                          lambda logits, gen: torch.log_softmax(logits.double(), -1),
                          lambda ids: BETA * phi(ids), lambda b, m: us[b][:m])
    after = [tuple(mv["ids"]) for mv in moves]
    counts = np.array([after.count(s) for s in seqs])
    assert chisquare(counts, probs * n).pvalue > 1e-3
    rate = np.mean([mv["accepted"] for mv in moves])
    moved = np.mean([tuple(mv["ids"]) != tuple(p) for mv, p in zip(moves, pop)])
    assert 0.2 < rate < 0.95 and moved > 0.1  # the move does move
    # the same sequences left unweighted by the potential would not pass: the test has power
    base = np.array([math.exp(log_p(s)) for s in seqs])
    assert chisquare(counts, base / base.sum() * n).pvalue < 1e-6


@pytest.fixture
def one_thread():
    """Thousands of 3-token runs: torch's intra-op threads only add overhead here."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


FUNCTIONALS = {"contains b": lambda s: 1 in s, "starts a": lambda s: s[0] == 0, "starts b": lambda s: s[0] == 1,
               "starts c": lambda s: s[0] == 2}


@pytest.mark.parametrize("knobs", [{"rejuvenate": 0}, {"rejuvenate": 2, "rejuvenate_at": "every"},
                                   {"rejuvenate": 2}])
def test_runs_still_follow_the_exact_target_over_complete_sequences(one_thread, knobs):
    """The evidence-weighted outputs of many runs, sum_r Z_r [x_r = x] / sum_r Z_r, estimate the
    exact target over the 27 complete sequences. ``every`` keeps that estimate unbiased for any
    N; after-resampling moves (the default) carry a finite-N bias below this test's resolution
    at N = 4 and 400 runs. Bounds: each functional within 4 standard errors (delta method),
    the TV over complete sequences below 0.14, and the potential's effect seen by > 8 s.e."""
    target = exact(3)
    runs = [run_bigram(seed, **knobs) for seed in range(400)]
    z = np.array([math.exp(lz) for _, lz, _ in runs])
    outs = [tuple(o) for o, _, _ in runs]
    base = {s: math.exp(log_p(s)) for s in target}
    zb = sum(base.values())
    for name, f in FUNCTIONALS.items():
        h = np.array([float(f(o)) for o in outs])
        est = float((z * h).sum() / z.sum())
        se = math.sqrt(float(((z * (h - est)) ** 2).sum())) / float(z.sum())
        want = sum(v for s, v in target.items() if f(s))
        assert abs(est - want) < 4 * se, (name, est, want, se)
        if name == "contains b":  # the same estimate rejects the model without the potential outright
            assert abs(est - sum(v for s, v in base.items() if f(s)) / zb) > 8 * se
    mass = dict.fromkeys(target, 0.0)
    for o, w in zip(outs, z):
        mass[o] += float(w)
    total = sum(mass.values())
    assert 0.5 * sum(abs(mass[s] / total - target[s]) for s in target) < 0.14
    moves = sum(s.evidence["smc"].get("rejuvenation", {}).get("proposals", 0) for _, _, st in runs for s in st)
    assert (moves > 0) == (knobs["rejuvenate"] > 0)


def test_every_moves_without_resampling_and_keeps_the_weights():
    _, _, steps = run_bigram(0, rejuvenate=1, rejuvenate_at="every", ess_threshold=0.0)
    moved = [s.evidence["smc"] for s in steps if "rejuvenation" in s.evidence["smc"]]
    assert len(moved) == 2  # after steps 0 and 1 (the last step has no next one)
    assert all(not m["resampled"] and not m["rejuvenation"]["after_resampling"] for m in moved)
    check_moves(steps, lambda s: s.evidence["smc"])
    # no resampling: a particle's log weight only grows by its potential's change from where
    # the move left it (a move itself changes no weight)
    for a, b in zip(steps, steps[1:]):
        moves = {mv["particle"]: mv for mv in a.evidence["smc"]["rejuvenation"]["moves"]}
        for i, (pa, pb) in enumerate(zip(a.evidence["beams"], b.evidence["beams"])):
            assert pb["parent"] == i
            mv = moves[i]
            start = mv["log_potential_proposed"] / BETA if mv["accepted"] else pa["potential"]
            gain = BETA * (pb["potential"] - start)
            assert b.evidence["smc"]["log_weights"][i] - a.evidence["smc"]["log_weights"][i] == \
                pytest.approx(gain, abs=1e-4)


# ---------------------------------------------------------------------- bad knobs
@pytest.mark.parametrize("knobs,word", [({"rejuvenate": -1}, "rejuvenate"), ({"rejuvenate": 65}, "rejuvenate"),
                                        ({"rejuvenate": "two"}, "rejuvenate"),
                                        ({"rejuvenate": 1, "rejuvenate_at": "sometimes"}, "rejuvenate_at"),
                                        ({"rejuvenate": 2, "regex": "[a-z]+"}, "rejuvenate")])
def test_bad_knobs_are_refused_in_one_line(knobs, word):
    with pytest.raises(PlaygroundError, match=word) as e:
        playground.generate(model="tiny-shakespeare", decoder="smc", prompt="ROMEO:", max_new_tokens=4, **knobs)
    assert "\n" not in str(e.value)
