"""Each processor that transformers also implements filters exactly as transformers does;
the other rules (top-nσ, XTC, mirostat, presence/frequency, DRY) are checked against their
definitions; the chain builder honours the user's order and rejects bad knobs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation import logits_process as hf

import playground
from decoders import processors as P
from decoders.ar import draw
from decoders.base import Context, Float, Int, get_decoder
from playground.engine import prepare
from playground.core.errors import PlaygroundError


def hist(ids=(), prompt_len=None, pos=0, u=0.0):
    ids = list(ids)
    return P.History(ids=ids, prompt_len=len(ids) if prompt_len is None else prompt_len, pos=pos,
                     uniform=lambda i, s="sample": u)


def random_logits(seed: int, v: int = 320, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(v, generator=g) * scale


@pytest.fixture(scope="module")
def model_logits(llama_handle):
    """Real next-token logits of the tiny Llama at several positions of a prompt."""
    ids = llama_handle.encode("ROMEO: But soft, what light through yonder window breaks? It is the east")
    out = llama_handle.forward(ids).logits[0]
    return ids, [out[i] for i in range(4, out.shape[0], 3)]


def same_filter(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Identical kept set and the same final distribution."""
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    torch.testing.assert_close(torch.softmax(ours, -1), torch.softmax(theirs, -1), rtol=1e-5, atol=1e-7)


CASES = [
    (lambda: P.Temperature(0.7), lambda: hf.TemperatureLogitsWarper(0.7)),
    (lambda: P.Temperature(1.6), lambda: hf.TemperatureLogitsWarper(1.6)),
    (lambda: P.TopK(1), lambda: hf.TopKLogitsWarper(1)),
    (lambda: P.TopK(17), lambda: hf.TopKLogitsWarper(17)),
    (lambda: P.TopP(0.5), lambda: hf.TopPLogitsWarper(0.5)),
    (lambda: P.TopP(0.93), lambda: hf.TopPLogitsWarper(0.93)),
    (lambda: P.MinP(0.05), lambda: hf.MinPLogitsWarper(0.05)),
    (lambda: P.MinP(0.3), lambda: hf.MinPLogitsWarper(0.3)),
    (lambda: P.Typical(0.2), lambda: hf.TypicalLogitsWarper(0.2)),
    (lambda: P.Typical(0.9), lambda: hf.TypicalLogitsWarper(0.9)),
    (lambda: P.Epsilon(3e-3), lambda: hf.EpsilonLogitsWarper(3e-3)),
    (lambda: P.Epsilon(0.02), lambda: hf.EpsilonLogitsWarper(0.02)),
    (lambda: P.Eta(3e-3), lambda: hf.EtaLogitsWarper(3e-3)),
    (lambda: P.Eta(0.05), lambda: hf.EtaLogitsWarper(0.05)),
]


@pytest.mark.parametrize("ours,theirs", CASES)
def test_matches_transformers_on_random_logits(ours, theirs):
    for seed in range(6):
        for scale in (0.5, 3.0):
            x = random_logits(seed, scale=scale)
            ids = torch.tensor([[1, 2, 3]])
            same_filter(ours()(x.clone(), hist([1, 2, 3])), theirs()(ids, x.clone()[None])[0])


@pytest.mark.parametrize("ours,theirs", CASES)
def test_matches_transformers_on_model_logits(model_logits, ours, theirs):
    ids, rows = model_logits
    for x in rows:
        same_filter(ours()(x.clone(), hist(ids)), theirs()(torch.tensor([ids]), x.clone()[None])[0])


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(model_logits, penalty):
    ids, rows = model_logits
    for j, x in enumerate(rows[:4]):
        ctx = ids[: 5 + 3 * j]
        ours = P.RepetitionPenalty(penalty)(x.clone(), hist(ctx))
        theirs = hf.RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([ctx]), x.clone()[None])[0]
        torch.testing.assert_close(ours, theirs)
        assert not torch.equal(ours, x)  # it really changed something
    x = random_logits(1)
    ctx = [5, 9, 9, 300, 17]
    torch.testing.assert_close(P.RepetitionPenalty(1.5)(x.clone(), hist(ctx)),
                               hf.RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([ctx]), x.clone()[None])[0])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_matches_transformers(n):
    x = random_logits(3)
    g = torch.Generator().manual_seed(n)
    for _ in range(5):
        ctx = torch.randint(0, 6, (25,), generator=g).tolist()  # small alphabet: many repeats
        ctx += ctx[3:3 + n - 1]  # end on an (n-1)-gram seen before, so something is banned
        ours = P.NoRepeatNGram(n)(x.clone(), hist(ctx))
        theirs = hf.NoRepeatNGramLogitsProcessor(n)(torch.tensor([ctx]), x.clone()[None])[0]
        assert torch.equal(ours, theirs)
        assert torch.isinf(ours).any()


def test_top_n_sigma_definition():
    x = random_logits(4)
    out = P.TopNSigma(1.5)(x.clone(), hist())
    thresh = float(x.max() - 1.5 * x.std(correction=0))
    assert torch.equal(torch.isfinite(out), x >= thresh)
    assert torch.equal(out[torch.isfinite(out)], x[x >= thresh])
    # scale-invariant: the same tokens survive at any temperature
    assert torch.equal(torch.isfinite(P.TopNSigma(1.5)(x / 0.3, hist())), torch.isfinite(out))


def test_xtc_removes_all_top_choices_but_the_least():
    x = torch.log(torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05]))
    on = P.XTC(0.15, 0.5)(x.clone(), hist(u=0.2))  # coin 0.2 < 0.5: fires
    assert torch.isinf(on[:2]).all() and torch.isfinite(on[2:]).all()
    off = P.XTC(0.15, 0.5)(x.clone(), hist(u=0.7))  # coin 0.7 >= 0.5: no-op
    assert torch.equal(off, x)
    one = P.XTC(0.3, 1.0)(x.clone(), hist(u=0.0))  # only one token above: no-op
    assert torch.equal(one, x)


def test_mirostat_truncates_by_surprise_and_tracks_tau():
    m = P.Mirostat(tau=2.0, eta=0.5)
    x = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    out = m(x.clone(), hist())  # mu = 4 bits: keeps p >= 1/16
    assert torch.isfinite(out).tolist() == [True, True, True, False]
    final = torch.softmax(out, -1)
    m.observe(1, final)
    assert m.mu == pytest.approx(4.0 - 0.5 * (-math.log2(float(final[1])) - 2.0))


def test_presence_and_frequency_count_generated_tokens_only():
    x = torch.zeros(8)
    h = hist([1, 1, 2, 3, 3, 3], prompt_len=2)  # prompt [1, 1]; generated [2, 3, 3, 3]
    assert P.PresencePenalty(0.5)(x, h).tolist() == [0, 0, -0.5, -0.5, 0, 0, 0, 0]
    assert P.FrequencyPenalty(0.5)(x, h).tolist() == [0, 0, -0.5, -1.5, 0, 0, 0, 0]


def test_dry_penalises_the_token_that_extends_a_repeat():
    x = torch.zeros(10)
    # "5 6 7 8 | 1 5 6 7": a repeat of length 3 (5 6 7) would continue with 8
    ctx = [5, 6, 7, 8, 1, 5, 6, 7]
    out = P.DRY(multiplier=0.8, base=2.0, allowed_length=2)(x, hist(ctx))
    assert out[8] == pytest.approx(-0.8 * 2.0 ** (3 - 2))
    assert (out[torch.arange(10) != 8] == 0).all()
    # a breaker inside the repeat cuts the match to length 2 (6 7): penalty 0.8 * 2^0
    out = P.DRY(0.8, 2.0, 2, breakers=frozenset({5}))(x, hist(ctx))
    assert out[8] == pytest.approx(-0.8)
    # below the allowed length nothing happens
    assert torch.equal(P.DRY(0.8, 2.0, 4)(x, hist(ctx)), x)


def test_temperature_zero_is_argmax():
    x = random_logits(5)
    out = P.Temperature(0.0)(x.clone(), hist())
    assert torch.isfinite(out).sum() == 1 and int(torch.argmax(out)) == int(torch.argmax(x))


def test_chain_follows_order_and_skips_neutral_knobs():
    chain = P.build_chain({"top_k": 5, "temperature": 0.5, "order": "temperature,top_k"})
    assert [p.item for p in chain.processors] == ["temperature", "top_k"]
    assert [p.item for p in P.build_chain({}).processors] == []
    default = P.build_chain({"top_p": 0.9, "repetition_penalty": 1.2, "temperature": 0.8, "min_p": 0.1})
    assert [p.item for p in default.processors] == ["penalties", "top_p", "min_p", "temperature"]
    # the order matters: temperature before min_p keeps a different set than after
    x = random_logits(6, scale=1.0)
    a = P.build_chain({"min_p": 0.2, "temperature": 3.0, "order": "temperature,min_p"})(x, hist())
    b = P.build_chain({"min_p": 0.2, "temperature": 3.0, "order": "min_p,temperature"})(x, hist())
    assert torch.isfinite(a).sum() > torch.isfinite(b).sum()


@pytest.mark.parametrize("decoder,params,msg", [
    ("sample", {"top_p": 1.5}, "out of range"),
    ("sample", {"top_k": -1}, "out of range"),
    ("sample", {"temperature": -0.1}, "out of range"),
    ("sample", {"repetition_penalty": 0.0}, "out of range"),
    ("sample", {"bogus": 1}, "no knob"),
    ("sample", {"order": "top_k,banana"}, "unknown item"),
    ("sample", {"order": "top_k,top_k"}, "twice"),
    ("sample", {"top_p": 0.9, "order": "top_k,temperature"}, "missing from 'order'"),
    ("sample", {"dry_multiplier": 0.8, "dry_sequence_breakers": "[oops"}, "dry_sequence_breakers"),
    ("top_k", {"k": 0}, "out of range"),
    ("top_k", {"top_p": 0.5}, "no knob"),
    ("top_p", {"p": 2}, "out of range"),
    ("mirostat", {"tau": -1}, "out of range"),
    ("xtc", {"threshold": 0.9}, "out of range"),
])
def test_bad_knobs_are_playground_errors(llama_handle, decoder, params, msg):
    with pytest.raises(PlaygroundError, match=msg):
        prepare(model=llama_handle, decoder=decoder, prompt="ROMEO:", max_new_tokens=4, params=params)


def test_every_sampler_is_documented():
    for name in ("sample", "top_k", "top_p", "min_p", "typical", "epsilon", "eta", "xtc", "mirostat"):
        cls = get_decoder(name)
        assert cls.family == "sampling" and cls.kind == "causal"
        assert cls.reference and cls.description and cls.__doc__
        for knob, spec in cls.params.items():
            assert spec.help, (name, knob)


# ---------------------------------------------------------------------- chains that can empty
def test_xtc_counts_only_live_tokens():
    """After top-k, XTC at threshold 0 sees the five live tokens as the top choices (not the
    removed ones, whose probability 0 is also >= 0) and keeps the least probable of them."""
    x = random_logits(7)
    top5 = torch.topk(x, 5).indices
    out = P.XTC(0.0, 1.0)(P.TopK(5)(x.clone(), hist()), hist())
    assert torch.isfinite(out).sum() == 1
    assert int(torch.argmax(out)) == int(top5[-1])
    # a live token whose probability underflowed to 0 is still live: it is the one kept
    y = torch.tensor([5.0, 4.0, -200.0, float("-inf"), float("-inf")])
    assert torch.softmax(y, -1)[2] == 0
    assert torch.isfinite(P.XTC(0.0, 1.0)(y, hist())).tolist() == [False, False, True, False, False]


def test_bundled_model_top_k_then_xtc_at_threshold_zero_draws_a_kept_token():
    """The repro of the bug: ``sample`` with top_k=5, xtc_threshold=0, xtc_probability=1 used to
    empty the chain (all NaN) and emit the last id, 4095, at every step."""
    for coupling in ("gumbel", "inverse_cdf"):
        trace = playground.generate(model="tiny-shakespeare", decoder="sample", prompt="ROMEO:",
                                    max_new_tokens=8, seed=3, top_k=5, xtc_threshold=0.0,
                                    xtc_probability=1.0, coupling=coupling)
        for step in trace["steps"]:
            d = step["dist"]
            assert d["chosen"] != 4095
            assert not any(math.isnan(p) for p in d["final_probs"] + d["raw_probs"])
            five = [t for _, t in sorted(zip(d["raw_probs"], d["top_ids"]), key=lambda pt: -pt[0])][:5]
            assert d["chosen"] == five[-1]  # XTC left only the least probable of the top 5
            assert d["final_probs"][d["top_ids"].index(d["chosen"])] == 1.0
            assert [s["kept"] for s in step["chain"]] == [5, 1]


def test_a_rule_that_would_remove_every_token_keeps_the_most_probable_live_one():
    x = random_logits(8)
    top = int(torch.argmax(x))
    chain = P.Chain([P.TopK(1), P.NoRepeatNGram(1)])  # the n-gram rule bans the only survivor
    stages: list = []
    out = chain(x.clone(), hist([top]), stages)
    assert torch.isfinite(out).tolist() == [i == top for i in range(x.numel())]
    assert chain.emptied == ["no_repeat_ngram(n=1)"]
    assert stages[1]["emptied"] is True and stages[1]["kept"] == 1
    assert "kept the most probable" in stages[1]["note"]
    assert "emptied" not in stages[0]
    assert not torch.isnan(chain.probs(x.clone(), hist([top]))).any()
    chain(x.clone(), hist([]), [])
    assert chain.emptied == []  # the note is per call


def test_an_emptied_chain_is_noted_in_a_real_run(llama_handle):
    """The sharpened tiny Llama loops on one token: top-1 then a ban on repeating any token
    leaves nothing from the second step on; the run keeps the top token and says so."""
    greedy = prepare(model=llama_handle, decoder="greedy", prompt="ROMEO: But soft",
                     max_new_tokens=4).finish()
    trace = prepare(model=llama_handle, decoder="sample", prompt="ROMEO: But soft", max_new_tokens=4,
                    params={"top_k": 1, "no_repeat_ngram_size": 1, "order": "top_k,no_repeat_ngram"}).finish()
    assert trace.output_ids[:len(greedy.output_ids)] == greedy.output_ids
    notes = [s.evidence["dist"].get("note") for s in trace.steps]
    assert any(n and "no_repeat_ngram" in n for n in notes)
    assert all(s.evidence["dist"]["final_probs"][s.evidence["dist"]["top_ids"].index(s.committed[0])] == 1.0
               for s in trace.steps)


def test_tiny_temperatures_and_bad_logits_never_give_nan():
    x = random_logits(9)
    for t in (1e-30, 1e-45, 5e-324):
        p = torch.softmax(P.Temperature(t)(x.clone(), hist()), -1)
        assert not torch.isnan(p).any() and p[int(torch.argmax(x))] == 1.0
    nan_rule = type("NanRule", (P.Processor,), {"item": "nan", "__call__": lambda self, lg, h: lg * float("nan")})
    out = P.Chain([nan_rule()])(x.clone(), hist())  # all NaN = all removed: the fallback keeps the top token
    assert torch.isfinite(out).sum() == 1 and int(torch.argmax(out)) == int(torch.argmax(x))
    y = x.clone()
    y[[3, 7]] = float("inf")
    p = P.Chain([])(y, hist()).softmax(-1)
    assert p[3] == p[7] == 0.5
    with pytest.raises(PlaygroundError, match="no finite logits"):
        P.Chain([])(torch.full((5,), float("nan")), hist())


def _knob(spec):
    if isinstance(spec, Float):
        return st.floats(spec.lo, spec.hi, allow_nan=False)
    return st.integers(spec.lo, min(spec.hi, 400))


_NUMERIC = {k: v for k, v in P.chain_params().items() if isinstance(v, (Float, Int))}


@settings(max_examples=40, deadline=None, derandomize=True)
@given(knobs=st.fixed_dictionaries({k: _knob(v) for k, v in _NUMERIC.items()}),
       order=st.permutations(list(P.order_items())),
       seed=st.integers(0, 2**16), removed=st.integers(0, 300),
       history=st.lists(st.integers(0, 319), max_size=40))
def test_any_chain_leaves_a_finite_distribution_and_draws_a_kept_token(knobs, order, seed, removed, history):
    chain = P.build_chain({**knobs, "order": ",".join(order)})
    x = random_logits(seed)
    x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))[:removed]] = float("-inf")
    h = P.History(ids=history or [0], prompt_len=min(3, len(history)), pos=len(history),
                  uniform=lambda i, s="sample": ((seed * 2654435761 + i) % 1000) / 1000)
    out = chain(x, h, [])
    p = torch.softmax(out, -1)
    assert torch.isfinite(out).any() and not torch.isnan(p).any()
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-5)
    assert not (p > 0)[~torch.isfinite(x)].any()  # a removed token never comes back
    c = Context(target=None, prompt_ids=[0], max_new_tokens=1, params={}, seed=seed)
    for coupling in ("gumbel", "inverse_cdf"):
        assert p[draw(c, h.pos, p, out, coupling)] > 0


# ---------------------------------------------------------------------- DRY breakers spanning tokens
def test_dry_breakers_resolve_to_token_sequences_as_llama_cpp(tokenizer):
    ids = tokenizer.encode("ROMEO:", add_special_tokens=False)
    assert len(ids) > 1  # the breaker spans several tokens of this tokenizer
    br = P.breaker_sequences(tokenizer, ["ROMEO:"], len(tokenizer))
    texts = {i: tokenizer.decode([i]) for i in range(len(tokenizer))}
    assert br.single == {i for i, s in texts.items() if "ROMEO:" in s}
    assert tuple(ids[1:]) in br.heads[ids[0]]  # head "R" then the tail spelling "OMEO:"
    for head, tails in br.heads.items():  # every head ends with a proper prefix of the breaker
        assert any(texts[head].endswith("ROMEO:"[:k]) for k in range(1, 6))
    # a single-character breaker is found inside tokens, as before
    colon = P.breaker_sequences(tokenizer, [":"], len(tokenizer))
    assert colon.single == {i for i, s in texts.items() if ":" in s} and not colon.heads


def test_dry_match_stops_at_a_breaker_spanning_several_tokens(tokenizer):
    romeo = tokenizer.encode("ROMEO:", add_special_tokens=False)
    a, b, c = 100, 101, 102
    ctx = romeo + [a, b, c, 7] + romeo + [a, b]  # "ROMEO: a b" repeats; c would extend it
    x = torch.zeros(len(tokenizer))
    plain = P.DRY(0.8, 2.0, 2)(x, hist(ctx))
    assert plain[c] == pytest.approx(-0.8 * 2.0 ** (len(romeo) + 2 - 2))  # the match runs through "ROMEO:"
    br = P.breaker_sequences(tokenizer, ["ROMEO:"], len(tokenizer))
    cut = P.DRY(0.8, 2.0, 2, breakers=br)(x, hist(ctx))
    assert cut[c] == pytest.approx(-0.8)  # only "a b" after the breaker counts
    assert (cut[torch.arange(x.numel()) != c] == 0).all()
    # the head alone, without its tail, breaks nothing
    head_only = romeo[:1] + [a, b, c, 7] + romeo[:1] + [a, b]
    assert P.DRY(0.8, 2.0, 2, breakers=br)(x, hist(head_only))[c] == pytest.approx(-0.8 * 2.0)
    # a breaker at the very end leaves nothing to match
    assert torch.equal(P.DRY(0.8, 2.0, 2, breakers=br)(x, hist(ctx + romeo)), x)


def test_dry_penalty_stays_finite():
    dry = P.DRY(10.0, 10.0, 1)
    x = torch.zeros(8)
    out = dry(x, hist([1, 2, 3] * 30))  # a 50-token match: 10 * 10^49 overflows float32
    assert torch.isfinite(out).all() and out.min() < -1e30
