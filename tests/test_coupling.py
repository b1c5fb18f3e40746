"""Coupled sampling keeps its promise: with the same seed, a lane whose chain only truncates
draws the same token as the unfiltered lane whenever its rules kept that token.

The property, stated precisely: take two lanes at the same temperature whose chains differ
only by *pure truncation* rules (rules that set some logits to -inf and leave the others
bit-identical: top-k, top-p, min-p, typical, epsilon, eta, top-nσ, mirostat's cut). At a
position where both lanes have the same context, if the narrower lane's kept set contains
the token the wider lane drew, the narrower lane draws that very token. Rules that change
the distribution (temperature differences, repetition/presence/frequency penalties, DRY)
are not truncations and promise nothing of the kind. So, run side by side from one prompt,
a truncation lane's text first differs from plain sampling at a position where its rule cut
the token plain sampling drew. Gumbel-max coupling (the default) has the property; the old
inverse-CDF coupling (``coupling=inverse_cdf``) does not, and these tests show both.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import playground
from decoders import processors as P
from decoders.ar import PREFIX, descending_order, draw, gumbel_index, head_order, pick_in_order, sample_index
from decoders.base import Context, get_decoder
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.presets import load_preset


def hist(ids=(), pos=0):
    ids = list(ids)
    return P.History(ids=ids, prompt_len=len(ids), pos=pos, uniform=lambda i, s="sample": 0.99)


def ctx(seed: int) -> Context:
    return Context(target=None, prompt_ids=[1], max_new_tokens=1, params={}, seed=seed)


def lane_draw(chain: P.Chain, logits: torch.Tensor, c: Context, pos: int,
              coupling: str) -> tuple[int, torch.Tensor]:
    """One lane's draw at ``pos``: (token, kept mask)."""
    processed = chain(logits, hist(pos=pos))
    final = torch.softmax(processed, -1)
    return draw(c, pos, final, processed, coupling), final > 0


# ---------------------------------------------------------------------- the noise itself
def test_gumbel_noise_is_fixed_by_seed_stream_and_position_only():
    a = ctx(3).gumbel(7, 500)
    assert torch.equal(a, ctx(3).gumbel(7, 500))
    assert torch.equal(a[:100], ctx(3).gumbel(7, 100))  # a token's noise ignores the vocabulary size
    assert not torch.equal(a, ctx(4).gumbel(7, 500))
    assert not torch.equal(a, ctx(3).gumbel(8, 500))
    assert not torch.equal(a, ctx(3).gumbel(7, 500, "sample/1"))
    assert torch.isfinite(a).all() and a.dtype == torch.float64


def test_gumbel_noise_is_standard_gumbel():
    g = torch.cat([ctx(0).gumbel(i, 1000) for i in range(50)]).numpy()
    # Gumbel(0, 1): mean = Euler's gamma, variance = pi^2 / 6, P(g <= 0) = 1/e
    assert abs(g.mean() - 0.5772) < 0.02
    assert abs(g.var() - math.pi ** 2 / 6) < 0.05
    assert abs((g <= 0).mean() - math.exp(-1)) < 0.01
    # independent across tokens and positions
    assert abs(np.corrcoef(g[:-1], g[1:])[0, 1]) < 0.02


# ---------------------------------------------------------------------- exact draws
def test_gumbel_draws_follow_the_distribution():
    """Many seeds, one distribution with a removed token: frequencies match, the removed
    token is never drawn."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf"), 1.5, -0.5])
    p = torch.softmax(logits, -1)
    n = 4000
    counts = torch.zeros(8)
    for seed in range(n // 400):
        c = ctx(seed)
        for pos in range(400):
            counts[draw(c, pos, p, logits)] += 1
    assert counts[5] == 0
    expected = p.double() * n
    keep = expected > 0
    stat = float((((counts.double() - expected) ** 2)[keep] / expected[keep]).sum())
    assert stat < 26.1  # chi-square, 6 dof, 1e-4 tail


def test_removed_or_underflowed_tokens_are_never_drawn():
    logits = torch.tensor([0.0, -200.0, float("-inf")])  # softmax underflows token 1 to 0
    p = torch.softmax(logits, -1)
    assert p[1] == 0
    assert {draw(ctx(s), 0, p, logits) for s in range(200)} == {0}


def test_an_inverse_cdf_draw_from_the_head_is_the_draw_of_the_whole_layout():
    """sample_index first looks for the draw among the PREFIX most likely tokens (a partial
    sort); whatever it finds must be the token the full stable sort gives, ties by id
    included, for every u (the T = 1 speed-up is worth nothing if a draw moves)."""
    g = torch.Generator().manual_seed(3)
    heads = fallbacks = 0
    for t in range(600):
        p = torch.softmax(torch.randn(1024, generator=g) * float(torch.rand(1, generator=g) * 8), 0).double()
        if t % 3 == 0:
            p[torch.rand(1024, generator=g) < 0.95] = 0.0  # a truncated chain: mostly zeros
        if t % 4 == 0:
            p = torch.round(p * 200) / 200  # many ties, some straddling the head's end
        if t % 5 == 0:
            p[:PREFIX + 8] = p.max()  # one value on more tokens than the head holds
        if float(p.sum()) <= 0:
            continue
        head = head_order(p)
        if head is None:
            fallbacks += 1
        else:
            heads += 1
            assert head.tolist() == descending_order(p)[:PREFIX].tolist()
        for u in (0.0, 1e-12, float(torch.rand(1, generator=g)), 0.5, 1 - 1e-12, 1.0):
            assert sample_index(p, u) == pick_in_order(p, descending_order(p), u), (t, u)
    assert heads > 100 and fallbacks > 50  # both paths were taken


def test_a_distribution_with_no_mass_is_refused():
    for bad in (torch.zeros(5), torch.full((5,), float("nan")), torch.tensor([0.2, float("inf"), 0.1])):
        with pytest.raises(PlaygroundError, match="no finite probability mass"):
            sample_index(bad, 0.5)
    with pytest.raises(PlaygroundError, match="no finite probability mass"):
        gumbel_index(torch.full((4,), float("-inf")), torch.zeros(4))
    with pytest.raises(PlaygroundError, match="coupling"):
        draw(ctx(0), 0, torch.ones(3) / 3, coupling="banana")


# ---------------------------------------------------------------------- the promise
TRUNCATIONS = {
    "top_k5": lambda: P.TopK(5), "top_k40": lambda: P.TopK(40), "top_p.5": lambda: P.TopP(0.5),
    "top_p.9": lambda: P.TopP(0.9), "min_p.05": lambda: P.MinP(0.05), "min_p.3": lambda: P.MinP(0.3),
    "typical.6": lambda: P.Typical(0.6), "epsilon": lambda: P.Epsilon(3e-3), "eta": lambda: P.Eta(0.02),
    "top_n_sigma": lambda: P.TopNSigma(1.0), "mirostat": lambda: P.Mirostat(tau=3.0, eta=0.1),
}


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.8])
@pytest.mark.parametrize("rule", TRUNCATIONS)
def test_a_truncation_lane_draws_the_unfiltered_token_whenever_it_kept_it(rule, temperature):
    temp = [P.Temperature(temperature)] if temperature != 1.0 else []
    plain = P.Chain(list(temp))
    cut = P.Chain([TRUNCATIONS[rule](), *temp])
    kept_same = 0
    for seed in range(25):
        logits = torch.randn(300, generator=torch.Generator().manual_seed(seed)) * 2.5
        c = ctx(seed)
        for pos in range(4):
            a, _ = lane_draw(plain, logits, c, pos, "gumbel")
            b, kept = lane_draw(cut, logits, c, pos, "gumbel")
            assert kept[b]
            if kept[a]:
                assert b == a
                kept_same += 1
    assert kept_same > 0


@pytest.mark.parametrize("rule", ["top_k5", "top_p.5", "min_p.05", "typical.6"])
def test_two_filters_agree_whenever_the_narrower_kept_the_wider_ones_draw(rule):
    """Not only against the unfiltered lane: the narrower of any two nested filters draws
    what the wider drew whenever it kept it (here: top-k 60 as the wider lane)."""
    wide, narrow = P.Chain([P.TopK(60)]), P.Chain([TRUNCATIONS[rule]()])
    agreed = 0
    for seed in range(60):
        logits = torch.randn(300, generator=torch.Generator().manual_seed(1000 + seed)) * 2.0
        a, _ = lane_draw(wide, logits, ctx(seed), 0, "gumbel")
        b, kept = lane_draw(narrow, logits, ctx(seed), 0, "gumbel")
        if kept[a]:
            assert a == b
            agreed += 1
    assert agreed > 0


def test_inverse_cdf_coupling_breaks_the_promise():
    """The old scheme, kept as a knob, moves the draw whenever a filter renormalises the
    mass, even when the filter kept the token drawn without it (why Gumbel is the default)."""
    plain, cut = P.Chain([]), P.Chain([P.TopK(20)])
    broken = 0
    for seed in range(60):
        logits = torch.randn(300, generator=torch.Generator().manual_seed(seed)) * 2.5
        a, _ = lane_draw(plain, logits, ctx(seed), 0, "inverse_cdf")
        b, kept = lane_draw(cut, logits, ctx(seed), 0, "inverse_cdf")
        broken += bool(kept[a] and a != b)
    assert broken > 10


# ---------------------------------------------------------------------- the preset, end to end
PRESET = load_preset("truncation-samplers")
N_TOKENS = 4  # lanes split within a few tokens; a longer run adds cost, not evidence


def kept_set(model, decoder: str, params: dict, prompt_ids: list[int], prefix: list[int]) -> torch.Tensor:
    """The lane's kept set after ``prefix``, recomputed from the model and the lane's own chain."""
    cls = get_decoder(decoder)
    knobs = cls().chain_knobs(cls.params.validate(decoder, params))
    chain = P.build_chain(knobs, model.tokenizer, model.vocab_size)
    ids = prompt_ids + prefix
    logits = model.forward(ids).logits[0, -1]
    return chain.probs(logits, P.History(ids=ids, prompt_len=len(prompt_ids), pos=len(prefix))) > 0


@pytest.mark.parametrize("seeds", [range(0, 25), pytest.param(range(25, 225), marks=pytest.mark.slow)],
                         ids=["25-seeds", "200-seeds"])
def test_truncation_preset_lanes_first_differ_where_a_rule_cut_the_drawn_token(seeds):
    """Through the Python API on the bundled model, for each seed: every filtered lane of the
    truncation preset equals plain sampling up to its first difference, and there plain
    sampling's token is outside the lane's kept set (the rule cut it)."""
    plain_lane, *lanes = PRESET["lanes"]
    assert plain_lane["decoder"] == "sample" and lanes
    temps = {lane["params"].get("temperature", 1.0) for lane in PRESET["lanes"]}
    assert len(temps) == 1  # the promise holds at one temperature
    model = load_model(PRESET["model"])
    diverged = 0
    for seed in seeds:
        common = dict(model=PRESET["model"], prompt=PRESET["prompt"], max_new_tokens=N_TOKENS, seed=seed)
        plain = playground.generate(decoder="sample", **common, **plain_lane["params"])
        ref = plain["output_ids"]
        for lane in lanes:
            trace = playground.generate(decoder=lane["decoder"], **common, **lane["params"])
            out = trace["output_ids"]
            j = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), None)
            if j is None:
                continue
            diverged += 1
            kept = kept_set(model, lane["decoder"], lane["params"], trace["prompt_ids"], out[:j])
            assert not kept[ref[j]], (seed, lane["decoder"], j)
            assert kept[out[j]]
            d = trace["steps"][j]["dist"]  # the lane's own evidence says the same
            if ref[j] in d["top_ids"]:
                assert d["final_probs"][d["top_ids"].index(ref[j])] == 0.0
    assert diverged >= len(seeds)  # the lanes do split: the check is not vacuous

