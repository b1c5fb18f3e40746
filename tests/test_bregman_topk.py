"""Bregman top-k (decoders/processors.py ``BregmanTopK``, decoder ``bregman_top_k``).

The equality the method rests on: under KL the loss is ``-log(top-k mass) + lambda k`` and the
rule *is* top-k with the chosen k, so every step of a ``bregman_top_k`` lane keeps the same
set and draws the same token as a ``top_k`` lane with that step's recorded k, under the same
random numbers. Also: both losses are discretely convex, the binary search's k is the
brute-force argmin, the evidence is the loss curve the search read, and bad knobs are one line.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from decoders.processors import BregmanTopK, History, bregman_losses, bregman_search
from playground.core.errors import PlaygroundError

H = History(ids=[1], prompt_len=1, pos=0)
PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def shakespeare():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu")


def _brute(p: np.ndarray, lam: float, divergence: str, k_max: int = 0) -> tuple[int, np.ndarray]:
    """The argmin over every k of the objective, written out independently of the module."""
    s = np.sort(p)[::-1]
    cap = len(s) if k_max <= 0 else min(k_max, len(s))
    k = np.arange(1, cap + 1)
    mass = np.cumsum(s)[:cap]
    if divergence == "kl":
        # KL(q_k || p) with q_k = p renormalised on the top k, summed term by term
        div = np.array([sum((s[i] / mass[j]) * math.log(1 / mass[j]) for i in range(j + 1)) for j in range(cap)])
    else:
        # 0.5 ||q - p||^2 with q = p + (1 - S_k)/k on the top k and 0 elsewhere
        div = np.array([0.5 * (sum(((1 - mass[j]) / (j + 1)) ** 2 for _ in range(j + 1)) + float((s[j + 1:] ** 2).sum()))
                        for j in range(cap)])
    loss = div + lam * k
    return int(np.argmin(loss)) + 1, loss


def _random_logits(rng: np.random.Generator, n: int) -> torch.Tensor:
    conc = rng.choice([0.05, 0.3, 1.0, 5.0])
    p = rng.dirichlet(np.full(n, conc))
    p = np.maximum(p, 1e-12)  # every token live: log of a dirichlet zero would be -inf
    return torch.tensor(np.log(p), dtype=torch.float32)


def test_kl_loss_is_minus_log_of_the_kept_mass():
    p = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)
    got = bregman_losses(p, float((p * p).sum()), 0.1, "kl")
    want = torch.tensor([-math.log(0.5) + 0.1, -math.log(0.75) + 0.2, -math.log(0.9) + 0.3, 0.4], dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("divergence", ["kl", "sq_euclid"])
def test_both_losses_are_discretely_convex_in_k(divergence):
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(3, 60))
        logits = _random_logits(rng, n)
        p = torch.softmax(logits.double(), -1)
        s = torch.sort(p, descending=True).values
        loss = bregman_losses(s, float((p * p).sum()), 0.0, divergence)  # lambda k is linear: it cannot matter
        second = loss[2:] - 2 * loss[1:-1] + loss[:-2]
        assert float(second.min()) >= -1e-12, (divergence, n)


@pytest.mark.parametrize("divergence", ["kl", "sq_euclid"])
def test_the_binary_search_finds_the_brute_force_argmin(divergence):
    rng = np.random.default_rng(1)
    checked = set()
    for trial in range(300):
        n = int(rng.integers(1, 80))
        logits = _random_logits(rng, n)
        lam = float(10 ** rng.uniform(-4, 0))
        k_max = int(rng.choice([0, 0, 1, 5, 20]))
        rule = BregmanTopK(lam, divergence, k_max)
        rule(logits, H)
        ev = rule.last
        p = torch.softmax(logits.double(), -1).numpy()
        want, loss = _brute(p, lam, divergence, k_max)
        assert ev["k"] == want, (trial, n, lam, k_max)
        # the search read O(log K) points, each one's value is on the curve
        cap = ev["k_max"]
        assert len(ev["probes"]) <= 2 * max(1, math.ceil(math.log2(max(cap, 2)))) + 1
        for k, v in ev["probes"]:
            assert v == pytest.approx(loss[k - 1], rel=1e-6, abs=1e-9)
        assert ev["curve"] == pytest.approx(loss[ev["curve_k0"] - 1:][:len(ev["curve"])].tolist(), rel=1e-6, abs=1e-9)
        checked.add(want)
    assert len(checked) > 5  # the trials chose many different k


def test_search_on_a_plain_convex_list():
    losses = [5.0, 3.0, 2.0, 2.5, 4.0, 7.0, 11.0]
    k, probes = bregman_search(losses)
    assert k == 3 and 3 in probes and len(probes) <= 6 and len(set(probes)) == len(probes)
    assert bregman_search([1.0]) == (1, [1])
    assert bregman_search([2.0, 2.0, 3.0])[0] == 1  # the smallest minimiser, as argmin


def test_sq_euclid_keeps_the_projection_and_kl_only_renormalises():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04]))
    kl = BregmanTopK(0.12, "kl")
    sq = BregmanTopK(0.03, "sq_euclid")
    out_kl = torch.softmax(kl(logits, H), -1)
    out_sq = torch.softmax(sq(logits, H), -1)
    k = kl.last["k"]
    p = torch.softmax(logits, -1)
    assert torch.allclose(out_kl[:k], p[:k] / p[:k].sum(), atol=1e-6) and float(out_kl[k:].sum()) == 0
    m = sq.last["kept"]
    assert m == sq.last["k"] and 1 < m < 5
    shift = (1 - float(p[:m].sum())) / m
    assert torch.allclose(out_sq[:m], p[:m] + shift, atol=1e-6) and float(out_sq[m:].sum()) == 0
    # the projection is closer to p than the renormalised top-m (it is the best q on that support)
    renorm = torch.zeros_like(p)
    renorm[:m] = p[:m] / p[:m].sum()
    assert float(((out_sq - p) ** 2).sum()) < float(((renorm - p) ** 2).sum())
    assert not sq.masks and kl.masks


def test_ties_at_the_kth_token_are_kept_as_top_k_keeps_them():
    from decoders.processors import TopK

    logits = torch.tensor([2.0, 1.0, 1.0, 1.0, -3.0])
    rule = BregmanTopK(0.2, "kl")
    out = rule(logits, H)
    k = rule.last["k"]
    assert torch.equal(out, TopK(k)(logits, H))
    assert rule.last["kept"] >= k


@pytest.mark.parametrize("coupling", ["gumbel", "inverse_cdf"])
def test_bregman_kl_is_top_k_with_the_chosen_k(shakespeare, coupling):
    """Every step: the same kept set, the same final distribution and the same token as a
    ``top_k`` lane whose k is this step's recorded k, with the same prefix (forced) and seed."""
    from playground.engine import prepare

    seed, n = 7, 8
    tr = prepare(model=shakespeare, decoder="bregman_top_k", prompt=PROMPT, max_new_tokens=n, seed=seed,
                 params={"lambda": 0.03, "temperature": 0.8, "coupling": coupling}).finish().to_dict()
    out = tr["output_ids"]
    ks = [s["bregman"]["k"] for s in tr["steps"]]
    assert len(set(ks)) > 1  # k adapted across the steps: the comparison is not one fixed top-k
    for t, s in enumerate(tr["steps"]):
        force = [[j, out[j]] for j in range(t)]
        ref = prepare(model=shakespeare, decoder="top_k", prompt=PROMPT, max_new_tokens=t + 1, seed=seed,
                      params={"k": ks[t], "temperature": 0.8, "coupling": coupling},
                      force=force or None).finish().to_dict()
        r = ref["steps"][t]
        assert r["committed"] == s["committed"] == [out[t]], t
        assert r["dist"]["final_probs"] == s["dist"]["final_probs"], t
        assert r["dist"]["kept_mass"] == s["dist"]["kept_mass"], t
        a, b = r["chain"][0], s["chain"][0]
        assert (a["kept"], a["top_kept"], a["removed"]) == (b["kept"], b["top_kept"], b["removed"]), t
        assert b["kept"] == s["bregman"]["kept"]


def test_lambda_zero_is_plain_sampling_and_a_large_lambda_is_greedy(shakespeare):
    from playground.engine import prepare

    def run(decoder, **params):
        return prepare(model=shakespeare, decoder=decoder, prompt=PROMPT, max_new_tokens=6, seed=3,
                       params=params).finish().to_dict()

    plain = run("sample")
    free = run("bregman_top_k", **{"lambda": 0.0})
    assert free["output_ids"] == plain["output_ids"]
    assert all(s["bregman"]["k"] == s["bregman"]["live"] for s in free["steps"])
    greedy = run("greedy")
    sharp = run("bregman_top_k", **{"lambda": 0.7})  # > log 2: one more token never pays under KL
    assert sharp["output_ids"] == greedy["output_ids"]
    assert all(s["bregman"]["k"] == 1 for s in sharp["steps"])


def test_evidence_and_views(shakespeare):
    import visualizers
    from playground.engine import prepare
    from visualizers.bregman import bregman_figure, bregman_run_figure

    tr = prepare(model=shakespeare, decoder="bregman_top_k", prompt=PROMPT, max_new_tokens=4, seed=1,
                 params={"divergence": "sq_euclid", "lambda": 0.01, "k_max": 40}).finish().to_dict()
    for s in tr["steps"]:
        ev = s["bregman"]
        assert ev["k_max"] == 40 and len(ev["curve"]) == 40 and ev["curve_k0"] == 1
        assert ev["curve"][ev["k"] - 1] == min(ev["curve"]) == ev["loss"]
        assert ev["k"] in [k for k, _ in ev["probes"]]  # the search read the k it chose
    assert tr["stats"]["bregman_k"]["min"] >= 1
    fig = bregman_figure(tr, 1)
    assert f"k = {tr['steps'][1]['bregman']['k']}" in fig.layout.title.text
    assert {d.name for d in fig.data} >= {"L(k)", "probes (in order read)"}
    assert "Bregman loss vs k" in [t for t, _ in visualizers.step_figures(tr, 1)]
    assert "Bregman k per step" in [t for t, _ in visualizers.run_figures(tr)]
    assert bregman_run_figure(tr).data
    # partial or odd evidence gives a note, never a raise
    for odd in ({}, {"steps": [{"kind": "token"}]}, {"steps": [{"kind": "token", "bregman": {"curve": "x"}}]},
                {"steps": [{"kind": "beam", "bregman": {}}]}):
        assert bregman_figure(odd, 0).layout.annotations or bregman_figure(odd, 0).layout.title.text
        bregman_run_figure(odd)


@pytest.mark.parametrize("params, needle", [
    ({"lambda": -0.1}, "'lambda'"), ({"lambda": 2.0}, "'lambda'"), ({"lambda": "x"}, "'lambda'"),
    ({"divergence": "l2"}, "'divergence'"), ({"k_max": -1}, "'k_max'"), ({"k_max": 1.5}, "'k_max'"),
    ({"bogus": 1}, "no knob 'bogus'"),
])
def test_bad_knobs_are_one_line(shakespeare, params, needle):
    from playground.engine import prepare

    with pytest.raises(PlaygroundError, match=needle) as e:
        prepare(model=shakespeare, decoder="bregman_top_k", prompt=PROMPT, max_new_tokens=2, params=params)
    assert "\n" not in str(e.value)


def test_the_rule_refuses_bad_arguments_in_one_line():
    for args in ((-1.0,), (float("nan"),), (0.1, "hellinger"), (0.1, "kl", -2)):
        with pytest.raises(PlaygroundError) as e:
            BregmanTopK(*args)
        assert "\n" not in str(e.value)


def test_the_built_in_chain_is_unchanged():
    """The rule is not registered: ``sample`` and its presets keep their knobs and order."""
    from decoders import get_decoder
    from decoders import processors as P

    assert BregmanTopK not in P.RULES and "bregman" not in P.order_items()
    assert not any(k.startswith("bregman") for k in get_decoder("sample").params)
