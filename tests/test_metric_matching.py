"""Metric matching by sampling-importance-resampling (decoder ``metric_match``).

The tilt ``w ∝ exp(beta · metric)`` solves the moment equation (weighted mean = target) when
the target is inside the samples' range and clamps with a note when not; the ESS is
``(Σw)²/Σw²``; a seed fixes the run; over many seeds the resampled index follows the weights
(chi-square, on a stub that skips the model); bad knobs are one line.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from decoders.search import metric_match as MM
from decoders.search._parallel import Samples
from playground.core.errors import PlaygroundError

PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def shakespeare():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu")


def test_beta_solves_the_moment_equation():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(2, 65))
        m = rng.normal(0, 10 ** rng.uniform(-2, 3), n) + rng.uniform(-100, 100)
        lo, hi = float(m.min()), float(m.max())
        target = lo + (hi - lo) * float(rng.uniform(0.001, 0.999))
        t = MM.tilt_to_target(m.tolist(), target)
        w = np.asarray(t.weights)
        assert t.status == "solved" and t.note == ""
        assert math.isclose(w.sum(), 1.0, abs_tol=1e-12)
        assert abs(float(np.dot(w, m)) - target) <= 1e-6, trial
        assert abs(t.weighted_mean - target) <= 1e-6
        # the weights are the exponential tilt with the reported beta: log w - beta m is constant
        live = w > 1e-300
        resid = np.log(w[live]) - t.beta * m[live]
        assert float(resid.max() - resid.min()) <= 1e-6 * max(1.0, abs(t.beta) * float(np.abs(m).max()))


def test_beta_has_the_sign_of_the_shift_and_the_mean_target_is_uniform():
    m = [1.0, 2.0, 3.0, 4.0]
    assert MM.tilt_to_target(m, 3.0).beta > 0 and MM.tilt_to_target(m, 2.0).beta < 0
    t = MM.tilt_to_target(m, 2.5)
    assert abs(t.beta) < 1e-9 and np.allclose(t.weights, 0.25)


@pytest.mark.parametrize("target, side, edge", [(0.5, "low", 1.0), (1.0, "low", 1.0), (9.0, "high", 4.0)])
def test_a_target_at_or_outside_the_range_is_clamped_with_a_note(target, side, edge):
    m = [1.0, 2.0, 4.0, 1.0, 3.0]
    t = MM.tilt_to_target(m, target)
    assert t.status == f"clamped_{side}" and t.beta is None
    assert t.weighted_mean == edge
    hold = [w for w, x in zip(t.weights, m) if x == edge]
    assert sum(hold) == pytest.approx(1.0) and len(set(hold)) == 1  # shared evenly among ties
    if target != edge:
        assert "outside the samples' range" in t.note and "\n" not in t.note
    else:
        assert t.note == ""  # the limit tilt meets a target on the edge exactly


def test_equal_metrics_leave_the_weights_uniform_with_a_note():
    t = MM.tilt_to_target([2.0, 2.0, 2.0], 5.0)
    assert t.status == "flat" and t.weights == [pytest.approx(1 / 3)] * 3 and "out of reach" in t.note
    assert MM.tilt_to_target([2.0, 2.0], 2.0).note == ""


def test_ess_formula():
    assert MM.ess([0.25] * 4) == pytest.approx(4.0)
    assert MM.ess([0.0, 1.0, 0.0]) == pytest.approx(1.0)
    assert MM.ess([0.0, 0.0]) == 0.0
    rng = np.random.default_rng(2)
    for _ in range(50):
        w = rng.exponential(size=int(rng.integers(1, 30)))
        want = w.sum() ** 2 / (w ** 2).sum()
        assert MM.ess(w.tolist()) == pytest.approx(want, rel=1e-12)
        assert MM.ess((7.5 * w).tolist()) == pytest.approx(want, rel=1e-12)  # scale-free
        assert 1.0 - 1e-12 <= MM.ess(w.tolist()) <= len(w) + 1e-12


def test_metrics():
    assert MM.sample_metric("length", [5, 6, 7], -3.0) == 3.0
    assert MM.sample_metric("distinct_2", [1, 2, 1, 2, 1], 0.0) == 0.5  # bigrams 12 21 12 21
    assert MM.sample_metric("distinct_2", [4], 0.0) == 1.0
    assert MM.sample_metric("surprisal", [1, 2, 3, 4], -6.0) == 1.5
    with pytest.raises(PlaygroundError):
        MM.sample_metric("bleu", [1], 0.0)


def test_resample_inverse_cdf_and_zero_weights():
    w = [0.0, 0.2, 0.0, 0.8]
    assert MM.resample(w, 0.0) == 1 and MM.resample(w, 0.1999) == 1 and MM.resample(w, 0.2) == 3
    assert MM.resample(w, 0.999999999999) == 3
    assert MM.resample([0.5, 0.5, 0.0], 1.0 - 1e-17) == 1  # never the zero-weight sample at the top
    with pytest.raises(PlaygroundError):
        MM.resample([0.0, 0.0], 0.5)


class _StubTarget:
    eos_ids: set[int] = set()

    def decode(self, ids, **_kw):
        return "".join(chr(97 + i % 26) for i in ids)


STUB_SEQS = [[1, 2, 3], [1, 1, 1, 1], [2, 3], [4, 5, 6, 7, 8], [3, 3, 3]]
STUB_LOGP = [-6.0, -2.0, -5.0, -4.0, -9.0]


def _stub_parallel(ctx, n, choose, commit_first, chain=None, label=None):
    """``parallel_samples`` without a model: fixed samples (a generator that yields no step)."""
    return Samples([list(s) for s in STUB_SEQS[:n]], list(STUB_LOGP[:n]))
    yield  # pragma: no cover - makes this a generator, as the real one


def _stub_run(monkeypatch, seed: int, **params):
    from decoders.base import Context

    monkeypatch.setattr(MM, "parallel_samples", _stub_parallel)
    dec = MM.MetricMatch()
    p = dec.params.validate("metric_match", {"num_samples": 5, **params})
    steps = list(dec.run(Context(target=_StubTarget(), prompt_ids=[0], max_new_tokens=8, params=p, seed=seed)))
    return dec, steps[-1].evidence["sir"]


def test_resampling_follows_the_weights_over_many_seeds(monkeypatch):
    """Chi-square goodness of fit of the resampled index against the weights over 2000 seeds."""
    from scipy.stats import chisquare

    runs = 2000
    counts: Counter[int] = Counter()
    weights = None
    for seed in range(runs):
        dec, ev = _stub_run(monkeypatch, seed, metric="surprisal", target=1.0)
        weights = weights or ev["weights"]
        assert ev["weights"] == weights  # the stub's samples are fixed: so are their weights
        counts[ev["chosen"]] += 1
        assert dec.output_override == STUB_SEQS[ev["chosen"]]
    assert ev["status"] == "solved" and abs(ev["weighted_mean"] - 1.0) < 1e-6
    assert sorted(weights)[-2] > 0.05  # more than one sample carries real weight: a real test
    observed = [counts[i] for i in range(5)]
    expected = [w * runs for w in weights]
    stat, pvalue = chisquare(observed, expected)
    assert pvalue > 1e-3, (observed, expected)
    # and the test has power: the same counts reject uniform resampling (weights ignored)
    assert chisquare(observed).pvalue < 1e-6


def test_a_seed_fixes_the_run(shakespeare):
    from playground.engine import prepare

    def run(seed):
        return prepare(model=shakespeare, decoder="metric_match", prompt=PROMPT, max_new_tokens=10, seed=seed,
                       params={"num_samples": 6, "metric": "surprisal", "target": 3.5}).finish().to_dict()

    a, b, c = run(4), run(4), run(5)
    assert a["output_ids"] == b["output_ids"] and a["steps"][-1]["sir"] == b["steps"][-1]["sir"]
    assert a["steps"][-1]["sir"] != c["steps"][-1]["sir"]


def test_the_trace_evidence_is_consistent(shakespeare):
    import visualizers
    from playground.engine import prepare
    from visualizers.sir import sir_figure

    probe = prepare(model=shakespeare, decoder="metric_match", prompt=PROMPT, max_new_tokens=12, seed=2,
                    params={"num_samples": 8}).finish().to_dict()
    m = probe["steps"][-1]["sir"]["metrics"]
    target = 0.3 * min(m) + 0.7 * max(m)  # inside the samples' range: the equation is solvable
    tr = prepare(model=shakespeare, decoder="metric_match", prompt=PROMPT, max_new_tokens=12, seed=2,
                 params={"num_samples": 8, "target": target}).finish().to_dict()
    last = tr["steps"][-1]
    ev = last["sir"]
    assert ev["metrics"] == m and ev["status"] == "solved" and ev["note"] == ""
    w = ev["weights"]
    assert sum(w) == pytest.approx(1.0, abs=1e-9)
    assert sum(x * y for x, y in zip(w, m)) == pytest.approx(target, abs=1e-6)
    assert ev["ess"] == pytest.approx(sum(w) ** 2 / sum(x * x for x in w), rel=1e-8)
    assert tr["output_ids"] == last["beams"][ev["chosen"]]["ids"] and last["beams"][ev["chosen"]]["chosen"]
    assert tr["stats"]["chosen_sample"] == ev["chosen"]
    fig = sir_figure(tr, len(tr["steps"]) - 1)
    assert f"ESS {ev['ess']:.2f} of 8" in fig.layout.title.text
    assert {d.name for d in fig.data} == {"samples", "resampled"}
    assert "SIR weights" in [t for t, _ in visualizers.step_figures(tr, len(tr["steps"]) - 1)]
    for odd in ({}, {"steps": [{"kind": "beam"}]}, {"steps": [{"kind": "beam", "sir": {"weights": "x"}}]},
                {"steps": [{"kind": "token", "sir": {}}]}):
        assert sir_figure(odd, 0).layout.title.text is not None


def test_a_clamped_run_says_so(shakespeare):
    from playground.engine import prepare

    tr = prepare(model=shakespeare, decoder="metric_match", prompt=PROMPT, max_new_tokens=6, seed=1,
                 params={"num_samples": 4, "target": 500.0}).finish().to_dict()
    ev = tr["steps"][-1]["sir"]
    assert ev["status"] == "clamped_high" and ev["beta"] is None and "outside" in ev["note"]
    assert ev["weights"][ev["chosen"]] > 0 and ev["ess"] >= 1.0


@pytest.mark.parametrize("params, needle", [
    ({"num_samples": 1}, "'num_samples'"), ({"num_samples": 65}, "'num_samples'"),
    ({"metric": "bleu"}, "'metric'"), ({"target": -1}, "'target'"), ({"target": "x"}, "'target'"),
    ({"metric": "distinct_2", "target": 2.0}, "distinct_2 lies in"), ({"top_p": 3}, "'top_p'"),
    ({"beta": 1}, "no knob 'beta'"),
])
def test_bad_knobs_are_one_line(shakespeare, params, needle):
    from playground.engine import prepare

    with pytest.raises(PlaygroundError, match=needle) as e:
        prepare(model=shakespeare, decoder="metric_match", prompt=PROMPT, max_new_tokens=2, params=params)
    assert "\n" not in str(e.value)
