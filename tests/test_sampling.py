"""The samplers: top_k=1 and temperature 0 are greedy; identical chains and seeds give identical
output; draws follow the final distribution (chi-square at fixed seeds, both couplings);
common random numbers make two samplers differ by their rule only; stateful and penalty rules act as
their definitions say in real runs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from decoders.processors import build_chain
from decoders.sampling import chain_picker
from playground.engine import prepare
from playground.core.models import handle_from_model
from playground.core.trace import Trace

PROMPTS = ["ROMEO: But soft", "To be, or not to be"]


@pytest.fixture(scope="module")
def flat(tokenizer):
    """A tiny Llama whose next-token distributions are spread over many tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return handle_from_model(model, tokenizer, name="flat-llama")


def run(handle, decoder, prompt, n, params=None, seed=0, stop=False):
    r = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, params=params or {}, seed=seed)
    if not stop:
        r.ctx.stop_ids = set()
    return r.finish()


def first_draws(handle, decoder, params, seeds, prompt=PROMPTS[0]):
    """The decoder's own first-step pick (its chain and coupling, position 0) for many seeds,
    on the model's real first-step logits, without a forward pass per seed."""
    base = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=1, params=params)
    logits = handle.forward(base.ctx.prompt_ids).logits[0, -1]
    knobs = base.decoder.chain_knobs(base.ctx.params)
    toks, final = [], None
    for seed in seeds:
        ctx = dataclasses.replace(base.ctx, seed=seed)
        pick = chain_picker(ctx, build_chain(knobs), [[]])
        final, tok = pick(logits, 0, [])
        toks.append(tok)
    return logits, final, toks


def chi_square(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[float, int]:
    """Pearson's statistic over bins with expectation >= 5 (the rest pooled), and its dof."""
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


def chi2_critical(dof: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty); z = 3.719 is the 1e-4 tail."""
    a = 2.0 / (9.0 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


# ---------------------------------------------------------------------- greedy limits
@pytest.mark.parametrize("which,prompt", [("llama_handle", PROMPTS[1]), ("gpt2_handle", PROMPTS[0]),
                                          ("flat", PROMPTS[0]), ("flat", PROMPTS[1])])
def test_top_k_one_and_temperature_zero_are_greedy(request, which, prompt):
    handle = request.getfixturevalue(which)
    greedy = run(handle, "greedy", prompt, 10).output_ids
    assert run(handle, "top_k", prompt, 10, {"k": 1}, seed=7).output_ids == greedy
    assert run(handle, "top_p", prompt, 10, {"p": 0.9, "temperature": 0.0}, seed=3).output_ids == greedy


# ---------------------------------------------------------------------- reproducibility
def test_identical_chains_and_seeds_give_identical_output(flat):
    a = run(flat, "sample", PROMPTS[0], 10, {"top_p": 0.8, "temperature": 0.9}, seed=5)
    b = run(flat, "top_p", PROMPTS[0], 10, {"p": 0.8, "temperature": 0.9}, seed=5)
    c = run(flat, "sample", PROMPTS[0], 10, {"top_p": 0.8, "temperature": 0.9}, seed=5)
    assert a.output_ids == b.output_ids == c.output_ids
    assert [s.evidence["dist"] for s in a.steps] == [s.evidence["dist"] for s in b.steps]
    other = run(flat, "sample", PROMPTS[0], 10, {"top_p": 0.8, "temperature": 0.9}, seed=6)
    assert other.output_ids != a.output_ids  # a different seed really changes the draw


# ---------------------------------------------------------------------- statistics
@pytest.mark.parametrize("coupling", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("decoder,params", [
    ("sample", {}),  # temperature 1: the model's own distribution
    ("sample", {"temperature": 0.7, "top_k": 30}),
    ("min_p", {"p": 0.05, "temperature": 1.3}),
])
def test_draws_follow_the_final_distribution(flat, decoder, params, coupling):
    n = 2000
    logits, final, toks = first_draws(flat, decoder, {**params, "coupling": coupling}, range(n))
    if decoder == "sample" and not params:
        torch.testing.assert_close(final, torch.softmax(logits, -1))
    counts = torch.bincount(torch.tensor(toks), minlength=final.numel())
    assert counts[final == 0].sum() == 0  # never a removed token
    stat, dof = chi_square(counts, final, n)
    assert dof >= 10
    assert stat < chi2_critical(dof), (stat, dof)


@pytest.mark.parametrize("coupling", ["gumbel", "inverse_cdf"])
def test_first_draws_match_real_runs(flat, coupling):
    knobs = {"temperature": 1.2, "coupling": coupling}
    _, _, toks = first_draws(flat, "sample", knobs, range(5))
    for seed, tok in enumerate(toks):
        assert run(flat, "sample", PROMPTS[0], 1, knobs, seed=seed).output_ids == [tok]


def test_gumbel_coupling_keeps_a_filtered_lane_on_the_unfiltered_draw(flat):
    """Real runs, several positions: a top-k lane equals plain sampling up to the first token
    top-k removed (see test_coupling.py for the full property)."""
    checked = 0
    for seed in range(6):
        plain = run(flat, "sample", PROMPTS[1], 6, {}, seed=seed)
        lane = run(flat, "top_k", PROMPTS[1], 6, {"k": 30, "temperature": 1.0}, seed=seed)
        for a, b, step in zip(plain.output_ids, lane.output_ids, lane.steps):
            d = step.evidence["dist"]
            if a != b:
                assert a not in d["top_ids"] or d["final_probs"][d["top_ids"].index(a)] == 0.0
                break
            checked += 1
    assert checked >= 6


# ---------------------------------------------------------------------- common random numbers
@pytest.mark.parametrize("coupling", ["gumbel", "inverse_cdf"])
def test_common_random_numbers_top_k_vs_top_p(flat, coupling):
    """Same seed, same random numbers: when top-k and top-p keep the same tokens they draw the
    same token; otherwise the narrower filter never draws a lower-ranked token (both couplings:
    the kept sets are nested top sets)."""
    seeds = range(300)
    logits = first_draws(flat, "sample", {}, [0])[0]
    mass = torch.softmax(logits, -1).sort(descending=True).values.cumsum(0)
    p_same = float(mass[5] - 1e-4)  # top_p that keeps exactly the 6 most probable tokens
    for k, p in ((8, 0.5), (20, 0.5), (3, 0.9), (6, p_same)):
        logits, fk, tk = first_draws(flat, "top_k", {"k": k, "coupling": coupling}, seeds)
        _, fp, tp = first_draws(flat, "top_p", {"p": p, "coupling": coupling}, seeds)
        rank = {int(t): r for r, t in enumerate(torch.argsort(-logits, stable=True))}
        same_set = torch.equal(fk > 0, fp > 0)
        assert same_set == (k == 6)
        narrow_is_k = bool(((fk > 0) & ~(fp > 0)).sum() == 0)
        for a, b in zip(tk, tp):
            if same_set:
                assert a == b
            ra, rb = rank[a], rank[b]
            assert (ra <= rb) if narrow_is_k else (rb <= ra)


def test_common_random_numbers_in_real_runs(flat):
    for seed in range(4):
        a = run(flat, "top_k", PROMPTS[1], 1, {"k": 10}, seed=seed).steps[0].evidence["dist"]
        b = run(flat, "top_k", PROMPTS[1], 1, {"k": 40}, seed=seed).steps[0].evidence["dist"]
        assert a["chosen_rank"] <= b["chosen_rank"]


# ---------------------------------------------------------------------- rules in real runs
def test_mirostat_updates_mu_from_each_draw(flat):
    tau, eta = 3.0, 0.2
    trace = run(flat, "mirostat", PROMPTS[0], 10, {"tau": tau, "eta": eta}, seed=2)
    mus = [float(s.evidence["chain"][-1]["stage"].split("mu=")[1].rstrip(")")) for s in trace.steps]
    assert mus[0] == pytest.approx(2 * tau)
    for step, mu, nxt in zip(trace.steps, mus, mus[1:]):
        d = step.evidence["dist"]
        p = d["final_probs"][d["top_ids"].index(d["chosen"])]
        assert nxt == pytest.approx(mu - eta * (-math.log2(p) - tau), abs=2e-3)


def test_xtc_with_certain_coin_never_draws_a_top_choice_when_two_exist(flat):
    trace = run(flat, "xtc", PROMPTS[0], 12, {"threshold": 0.05, "probability": 1.0}, seed=1)
    fired = 0
    for s in trace.steps:
        d = s.evidence["dist"]
        above = [t for t, p in zip(d["top_ids"], d["raw_probs"]) if p >= 0.05]
        if len(above) >= 2:
            fired += 1
            top = above[0]
            assert d["final_probs"][d["top_ids"].index(top)] == 0.0 and d["chosen"] != top
    assert fired > 0


def test_no_repeat_ngram_in_a_real_run(llama_handle):
    n = 2
    trace = run(llama_handle, "sample", PROMPTS[0], 16, {"temperature": 0.0, "no_repeat_ngram_size": n})
    ctx = trace.prompt_ids + trace.output_ids
    start = len(trace.prompt_ids)
    grams = [tuple(ctx[i:i + n]) for i in range(len(ctx) - n + 1)]
    for j in range(start - n + 1, len(grams)):
        assert grams[j] not in grams[:j]


def test_repetition_penalty_breaks_a_greedy_loop(llama_handle):
    greedy = run(llama_handle, "greedy", PROMPTS[0], 12).output_ids
    assert len(set(greedy)) <= 2  # the sharpened random model loops on one token
    pen = run(llama_handle, "sample", PROMPTS[0], 12, {"temperature": 0.0, "repetition_penalty": 10.0}).output_ids
    assert len(set(pen)) > len(set(greedy))


def test_token_steps_carry_raw_final_and_chain_evidence(flat):
    trace = run(flat, "sample", PROMPTS[0], 6, {"top_k": 5, "temperature": 0.8}, seed=4)
    assert trace.stats["chain"] == ["top_k(k=5)", "temperature(t=0.8)"]
    for s in trace.steps:
        d = s.evidence["dist"]
        assert s.kind == "token" and s.committed == [d["chosen"]]
        assert sum(p > 0 for p in d["final_probs"]) <= 5
        assert d["final_probs"][d["top_ids"].index(d["chosen"])] > 0
        assert [c["kept"] for c in s.evidence["chain"]] == [5, 5]
    again = Trace.from_json(trace.to_json())
    assert again.steps[0].evidence["chain"] == trace.steps[0].evidence["chain"]
    assert trace.stats["target_forwards"] == 6
