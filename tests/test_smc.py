"""Reward-guided SMC: identities with plain sampling, resampling that keeps weights
normalised and lineages intact, potentials that steer, and one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import regex
from hypothesis import given, settings, strategies as st

import playground
from decoders.guided.smc import ess, normalise, pick, resample
from playground.core.errors import PlaygroundError

MODEL = "tiny-shakespeare"
PROMPT = "ROMEO:"


def gen(decoder: str, seed: int, n: int = 24, **knobs):
    return playground.generate(model=MODEL, decoder=decoder, prompt=PROMPT, max_new_tokens=n, seed=seed, **knobs)


# ---------------------------------------------------------------------- identities
@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 1.0), (2, 0.7), (3, 1.6)])
def test_one_particle_without_potential_is_sampling(seed, temperature):
    a = gen("sample", seed, temperature=temperature)
    b = gen("smc", seed, num_particles=1, temperature=temperature)
    assert b["output_ids"] == a["output_ids"]
    assert b["stats"]["finish_reason"] == a["stats"]["finish_reason"]
    assert b["stats"]["target_forwards"] == a["stats"]["target_forwards"]


def test_unweighted_particles_are_parallel_samples():
    """strength 0: weights stay uniform, nothing is resampled, and particle 0 draws exactly
    what the sample decoder draws (it reads the same common random numbers)."""
    a = gen("sample", 4)
    b = gen("smc", 4, num_particles=6, strength=0.0, keywords="lord", ess_threshold=1.0)
    last = b["steps"][-1]
    assert last["beams"][0]["ids"] == a["output_ids"]
    assert b["stats"]["resamples"] == 0
    for s in b["steps"]:
        assert s["smc"]["weights"] == pytest.approx([1 / 6] * 6, abs=1e-6)
        assert s["smc"]["ess"] == pytest.approx(6.0, abs=1e-3)
    # the particles are different samples (independent streams), the output one of them
    assert len({tuple(p["ids"]) for p in b["stats"]["particles"]}) > 1
    assert b["output_ids"] in [p["ids"] for p in b["stats"]["particles"]]


SENTENCE = r"[A-Z][a-z]+( [a-z]+)*\."


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_particle_under_a_constraint_is_constrained_sampling(seed):
    a = playground.generate(model=MODEL, decoder="sample", prompt="ROMEO:\n", max_new_tokens=24, seed=seed,
                            regex=SENTENCE)
    b = playground.generate(model=MODEL, decoder="smc", prompt="ROMEO:\n", max_new_tokens=24, seed=seed,
                            regex=SENTENCE, num_particles=1)
    assert b["output_ids"] == a["output_ids"]
    assert b["stats"]["finish_reason"] == a["stats"]["finish_reason"] == "constraint"


def test_constraint_weights_are_the_allowed_mass():
    """Without resampling, a particle's log weight is the sum over its steps of the log of
    the probability its constraint allowed (the correction from locally masked proposals
    to the model conditioned on the constraint)."""
    tr = playground.generate(model=MODEL, decoder="smc", prompt="ROMEO:\n", max_new_tokens=16, seed=3,
                             regex=SENTENCE, num_particles=4, ess_threshold=0.0)
    assert tr["stats"]["resamples"] == 0
    total = [0.0] * 4
    done = [False] * 4
    for s in tr["steps"]:
        for j, b in enumerate(s["beams"]):
            if not done[j]:
                assert 0 < b["allowed_mass"] <= 1
                total[j] += math.log(b["allowed_mass"])
            done[j] = b["finished"]
            assert s["smc"]["log_weights"][j] == pytest.approx(total[j], abs=1e-3)
    for p in tr["stats"]["particles"]:
        assert regex.fullmatch(SENTENCE, playground_text(p["ids"])) or len(p["ids"]) == 16


def playground_text(ids):
    from playground.core.models import load_model

    return load_model(MODEL, device="cpu").decode(ids)


# ---------------------------------------------------------------------- resampling
def test_resampling_keeps_weights_normalised_and_lineages_intact():
    tr = gen("smc", 7, n=20, num_particles=8, keywords="lord, good", match_regex=r"[^;:!?]*", ess_threshold=0.9)
    steps = tr["steps"]
    assert tr["stats"]["resamples"] >= 1
    prev = None
    for s in steps:
        sm, beams = s["smc"], s["beams"]
        assert len(beams) == sm["n"] == 8
        assert sum(sm["weights"]) == pytest.approx(1.0, abs=1e-5)
        assert all(w >= 0 for w in sm["weights"])
        assert 1.0 - 1e-6 <= sm["ess"] <= 8 + 1e-6
        assert sm["ess"] == pytest.approx(1.0 / sum(w * w for w in sm["weights"]), rel=1e-3)
        assert sm["resampled"] == (sm["ess"] < sm["threshold"] and not all(b["finished"] for b in beams))
        if prev is not None:
            anc = prev["smc"]["ancestors"] if prev["smc"]["resampled"] else list(range(8))
            for j, b in enumerate(beams):
                assert b["parent"] == anc[j]
                parent_ids = prev["beams"][anc[j]]["ids"]
                grew = 0 if prev["beams"][anc[j]]["finished"] else 1
                assert b["ids"][: len(parent_ids)] == parent_ids and len(b["ids"]) == len(parent_ids) + grew
        if sm["resampled"]:
            anc = sm["ancestors"]
            assert len(anc) == 8 and anc == sorted(anc)
            # nobody is copied from a particle of weight 0
            assert all(sm["weights"][a] > 0 for a in anc)
        prev = s
    # after a resampling the next step's weights reflect one step of potential change only
    for a, b in zip(steps, steps[1:]):
        if a["smc"]["resampled"]:
            lw = b["smc"]["log_weights"]
            pots_before = [a["beams"][k]["potential"] for k in a["smc"]["ancestors"]]
            strength = 5.0
            for j, bj in enumerate(b["beams"]):
                assert lw[j] == pytest.approx(strength * (bj["potential"] - pots_before[j]), abs=1e-3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=24).filter(lambda w: sum(w) > 1e-9),
       st.floats(0.0, 1.0, exclude_max=True))
def test_systematic_resampling_gives_each_particle_floor_or_ceil_of_its_share(w, u):
    w = np.asarray(w) / np.sum(w)
    anc = resample(w, [u], "systematic")
    n = len(w)
    assert len(anc) == n and anc == sorted(anc)
    counts = np.bincount(anc, minlength=n)
    for i in range(n):
        # float weights sum to 1 only up to rounding (w = [1e-126, 1.0]): allow that much
        assert math.floor(n * w[i] - 1e-9) <= counts[i] <= math.ceil(n * w[i] + 1e-9)
        if w[i] == 0:
            assert counts[i] == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-50, 5), min_size=1, max_size=16), st.data())
def test_weights_normalise_and_multinomial_picks_live_particles(logw, data):
    w = normalise(logw)
    assert w.sum() == pytest.approx(1.0) and (w >= 0).all()
    assert 1.0 - 1e-9 <= ess(w) <= len(w) + 1e-9
    us = data.draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=len(w), max_size=len(w)))
    anc = resample(w, us, "multinomial")
    assert len(anc) == len(w) and all(w[a] > 0 for a in anc)
    assert w[pick(w, us[0])] > 0


def test_multinomial_resampling_draws_by_weight():
    w = np.array([0.1, 0.6, 0.3])
    rng = np.random.default_rng(0)
    counts = np.zeros(3)
    for _ in range(400):
        counts += np.bincount(resample(w, rng.random(3), "multinomial"), minlength=3)
    expected = 1200 * w
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 13.8  # chi-square, 2 degrees of freedom, p = 0.001


# ---------------------------------------------------------------------- steering
def fisher_one_sided(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float:
    """P(b's hits >= observed | both groups share one rate), hypergeometric tail."""
    total, hits = a_n + b_n, a_hits + b_hits
    denom = math.comb(total, b_n)
    return sum(math.comb(hits, k) * math.comb(total - hits, b_n - k)
               for k in range(b_hits, min(hits, b_n) + 1)) / denom


SEEDS = range(16)


@pytest.fixture(scope="module")
def plain_texts():
    """The plain samples both steering tests compare against (the same runs: decoded once)."""
    return {s: gen("sample", s)["text"] for s in SEEDS}


def test_regex_potential_steers_towards_matches(plain_texts):
    pattern = r"[^,.;:!?']*"  # no punctuation at all
    plain = sum(bool(regex.fullmatch(pattern, plain_texts[s])) for s in SEEDS)
    steered = [gen("smc", s, num_particles=8, match_regex=pattern) for s in SEEDS]
    hits = sum(bool(regex.fullmatch(pattern, t["text"])) for t in steered)
    assert hits > plain and fisher_one_sided(plain, len(SEEDS), hits, len(SEEDS)) < 0.01
    # a potential makes weights uneven, so the population is resampled along the way
    assert sum(t["stats"]["resamples"] for t in steered) > 0


def test_keyword_potential_steers_towards_the_keyword(plain_texts):
    plain = sum("lord" in plain_texts[s].lower() for s in SEEDS)
    hits = sum("lord" in gen("smc", s, num_particles=16, keywords="lord")["text"].lower() for s in SEEDS)
    assert hits > plain and fisher_one_sided(plain, len(SEEDS), hits, len(SEEDS)) < 0.01


def test_length_potential_pulls_towards_the_target():
    """Seed by seed (particle 0 is the plain sample), the steered output is closer to 40
    characters more often than not: a one-sided sign test over 12 seeds."""
    far = [abs(len(gen("sample", s, n=32)["text"]) - 40) for s in range(12)]
    near = [abs(len(gen("smc", s, n=32, num_particles=8, target_chars=40)["text"]) - 40) for s in range(12)]
    wins = sum(a < b for a, b in zip(near, far))
    losses = sum(a > b for a, b in zip(near, far))
    m = wins + losses
    p = sum(math.comb(m, k) for k in range(wins, m + 1)) / 2 ** m
    assert sum(near) < sum(far) and p < 0.05


# ---------------------------------------------------------------------- errors and views
@pytest.mark.parametrize("knobs,needle", [
    ({"match_regex": "("}, "match_regex"),
    ({"match_regex": "[a-"}, "match_regex"),
    ({"num_particles": 0}, "num_particles"),
    ({"num_particles": 65}, "num_particles"),
    ({"ess_threshold": 1.5}, "ess_threshold"),
    ({"resampling": "stratified"}, "resampling"),
    ({"strength": -1}, "strength"),
    ({"target_chars": -3}, "target_chars"),
    ({"regex": "("}, "regex"),
    ({"json_schema": "{not json"}, "json_schema"),
])
def test_bad_knobs_are_one_line(knobs, needle):
    with pytest.raises(PlaygroundError) as e:
        gen("smc", 0, n=4, **knobs)
    assert "\n" not in str(e.value) and needle in str(e.value)


def test_views_draw_particles_and_ess():
    import visualizers as V
    from visualizers.smc import ess_figure, particles_figure

    tr = gen("smc", 7, n=12, num_particles=5, keywords="lord", ess_threshold=0.9)
    fig = particles_figure(tr, 6)
    markers = [d for d in fig.data if d.mode == "markers"][0]
    assert len(markers.x) == 5 * 7  # five particles at each of steps 0..6
    e = ess_figure(tr)
    assert list(e.data[0].y) == [s["smc"]["ess"] for s in tr["steps"]]
    resampled = [s["i"] for s in tr["steps"] if s["smc"]["resampled"]]
    if resampled:
        assert list(e.data[2].x) == resampled
    assert "Particles" in [t for t, _ in V.step_figures(tr, 3)]
    assert "Effective sample size" in [t for t, _ in V.run_figures(tr)]
    assert "no SMC steps" in str(ess_figure({"steps": []}).layout.annotations[0].text)
