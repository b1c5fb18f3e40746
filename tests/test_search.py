"""Beam search equals transformers' generate(num_beams=k); diverse beam search follows the
Hamming-diversity rule; arithmetic sampling's samples are stratified and each is an exact
draw from the model."""

from __future__ import annotations

import ast
import pathlib

from fractions import Fraction

import pytest
import torch

from decoders.base import get_decoder
from decoders.search import arithmetic_codes, cdf_interval
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model
from sacrebleu.metrics import BLEU, CHRF

import decoders.search._utility as utility_module
from decoders.search._utility import aggregated

PROMPTS = ["ROMEO: But soft", "JULIET: O Romeo", "To be, or not to be"]
N = 8  # new tokens per beam test: enough for hypotheses to finish, cheap on two busy cores


def _untied(model_cls, cfg, scale: float):
    torch.manual_seed(1)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # moderately peaked next-token distributions: beams really compete
        model.get_output_embeddings().weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def llama(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=False)
    return handle_from_model(_untied(LlamaForCausalLM, cfg, 16.0), tokenizer, name="beam-llama")


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=256,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    return handle_from_model(_untied(GPT2LMHeadModel, cfg, 40.0), tokenizer, name="beam-gpt2")


def run(handle, decoder, prompt, n, params, stop=None, seed=0):
    r = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, params=params, seed=seed)
    r.ctx.stop_ids = set() if stop is None else {stop}
    return r.finish()


def hf_beams(handle, prompt_ids, k, n, eos, nret=1, lp=1.0, es=False):
    """transformers' beam search: the returned sequences (generated part) and their scores."""
    ids = torch.tensor([prompt_ids])
    out = handle.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=k,
                                max_new_tokens=n, min_new_tokens=0, eos_token_id=eos,
                                pad_token_id=handle.tokenizer.pad_token_id, num_return_sequences=nret,
                                length_penalty=lp, early_stopping=es, return_dict_in_generate=True,
                                output_scores=True)
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()  # each sequence's own generated length
    seqs = [out.sequences[i, len(prompt_ids): len(prompt_ids) + n].tolist()[:lengths[i]] for i in range(nret)]
    return seqs, out.sequences_scores.tolist()


_STOPS: dict = {}


def a_stop_token(handle, prompt, k):
    """A token the best beam produces midway, so hypotheses really finish on it."""
    key = (handle.name, prompt, k)
    if key not in _STOPS:
        _STOPS[key] = run(handle, "beam", prompt, 6, {"num_beams": k}).output_ids[3]
    return _STOPS[key]


def finished_early(trace, stop) -> bool:
    """Whether some hypothesis finished on ``stop`` before the length limit."""
    return any(b["finished"] and b["ids"][-1] == stop for s in trace.steps[:-1] for b in s.evidence["beams"])


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("with_eos", [False, True])
def test_beam_equals_transformers_llama(llama, k, prompt, with_eos):
    stop = a_stop_token(llama, prompt, k) if with_eos else None
    trace = run(llama, "beam", prompt, N, {"num_beams": k, "num_return_sequences": k}, stop)
    seqs, scores = hf_beams(llama, trace.prompt_ids, k, N, stop, nret=k)
    assert trace.output_ids == seqs[0]
    assert [s["ids"] for s in trace.stats["sequences"]] == seqs
    assert [s["score"] for s in trace.stats["sequences"]] == pytest.approx(scores, abs=1e-4)
    if with_eos:
        assert finished_early(trace, stop)  # the stop token really ended hypotheses


@pytest.mark.parametrize("k,with_eos", [(2, False), (4, True)])
def test_beam_equals_transformers_gpt2(gpt2, k, with_eos):
    stop = a_stop_token(gpt2, PROMPTS[2], k) if with_eos else None
    trace = run(gpt2, "beam", PROMPTS[2], N, {"num_beams": k}, stop)
    seqs, _ = hf_beams(gpt2, trace.prompt_ids, k, N, stop)
    assert trace.output_ids == seqs[0]


@pytest.mark.parametrize("lp,es", [(0.0, "never"), (2.0, "never"), (-1.0, "true")])
def test_beam_length_penalty_and_early_stopping(llama, lp, es):
    stop = a_stop_token(llama, PROMPTS[0], 4)
    trace = run(llama, "beam", PROMPTS[0], N,
                {"num_beams": 4, "length_penalty": lp, "early_stopping": es, "num_return_sequences": 4}, stop)
    seqs, scores = hf_beams(llama, trace.prompt_ids, 4, N, stop, nret=4, lp=lp,
                            es={"never": "never", "true": True}[es])
    assert [s["ids"] for s in trace.stats["sequences"]] == seqs
    assert [s["score"] for s in trace.stats["sequences"]] == pytest.approx(scores, abs=1e-4)


def test_beam_steps_show_the_beams(llama):
    trace = run(llama, "beam", PROMPTS[0], 6, {"num_beams": 3})
    assert trace.stats["target_forwards"] == 6  # one batched forward per step
    assert all(s.kind == "beam" and s.committed == [] for s in trace.steps)
    for prev, step in zip(trace.steps, trace.steps[1:]):
        for b in step.evidence["beams"]:
            parent = prev.evidence["beams"][b["parent"]]
            assert b["ids"][:-1] == parent["ids"] and not parent["finished"]
    d = trace.to_dict()
    assert all(str(t) in d["tokens"] for t in trace.steps[-1].evidence["beams"][0]["ids"])


def test_diverse_beam_with_one_group_is_beam_search(llama):
    trace = run(llama, "diverse_beam", PROMPTS[2], N, {"num_beams": 4, "num_beam_groups": 1,
                                                       "diversity_penalty": 5.0})
    seqs, _ = hf_beams(llama, trace.prompt_ids, 4, N, None)
    assert trace.output_ids == seqs[0]


def test_diverse_beam_first_group_is_unpenalised_beam_search(llama):
    """Group 0 never sees a penalty: it is exactly beam search with the group's size."""
    stop = a_stop_token(llama, PROMPTS[0], 2)
    trace = run(llama, "diverse_beam", PROMPTS[0], N, {"num_beams": 4, "num_beam_groups": 2,
                                                       "diversity_penalty": 2.0,
                                                       "num_return_sequences": 4}, stop)
    seqs, _ = hf_beams(llama, trace.prompt_ids, 2, N, stop, nret=2)
    assert [s["ids"] for s in trace.stats["sequences"] if s["group"] == 0] == seqs


def test_diverse_beam_hamming_rule_at_the_first_step(llama):
    """Groups of one beam: group g takes argmax(log p - penalty * times chosen by earlier groups)."""
    lam = 0.7
    trace = run(llama, "diverse_beam", PROMPTS[1], 2, {"num_beams": 4, "num_beam_groups": 4,
                                                       "diversity_penalty": lam})
    first = [b["ids"][0] for b in trace.steps[0].evidence["beams"] if not b["finished"]]
    logp = torch.log_softmax(llama.forward(trace.prompt_ids).logits[0, -1], -1)
    counts = torch.zeros_like(logp)
    expect = []
    for _ in range(4):
        tok = int(torch.argmax(logp - lam * counts))
        expect.append(tok)
        counts[tok] += 1
    assert first == expect
    huge = run(llama, "diverse_beam", PROMPTS[1], 2, {"num_beams": 4, "num_beam_groups": 4,
                                                      "diversity_penalty": 20.0})
    firsts = [b["ids"][0] for b in huge.steps[0].evidence["beams"] if not b["finished"]]
    assert len(set(firsts)) == 4  # a large penalty forces four different first tokens


# ---------------------------------------------------------------------- arithmetic sampling
def test_arithmetic_first_step_is_stratified(llama):
    """Codes in different CDF intervals give different first tokens, and every token gets
    floor or ceil of N * p of the N samples (the paper's low-variance property)."""
    n = 16
    trace = run(llama, "arithmetic", PROMPTS[0], 4, {"num_samples": n}, seed=3)
    beams = trace.steps[0].evidence["beams"]
    probs = torch.softmax(llama.forward(trace.prompt_ids).logits[0, -1].double(), -1)
    by_interval: dict[tuple, set] = {}
    for b in beams:
        lo, hi = b["interval"]
        assert lo <= b["code"] < hi
        by_interval.setdefault((lo, hi), set()).add(b["ids"][0])
    assert all(len(toks) == 1 for toks in by_interval.values())  # one token per interval
    tokens = [next(iter(t)) for t in by_interval.values()]
    assert len(set(tokens)) == len(tokens)  # different intervals, different tokens
    counts = torch.bincount(torch.tensor([b["ids"][0] for b in beams]), minlength=probs.numel())
    assert ((counts - n * probs).abs() < 1.0 + 1e-9).all()
    assert trace.stats["distinct_samples"] > 1
    assert [s["ids"] for s in trace.stats["samples"]][0] == trace.output_ids


def test_arithmetic_codes_are_evenly_spaced():
    codes = arithmetic_codes(5, 0.37)
    assert codes[0] == Fraction(0.37) / 5
    assert all(b - a == Fraction(1, 5) for a, b in zip(codes, codes[1:]))
    assert 0 <= codes[0] and codes[-1] < 1


def test_one_arithmetic_sample_is_an_exact_draw_over_two_steps():
    """With N = 1 the code is a uniform u; mapping a fine grid of u through two steps of
    interval coding reproduces the joint p(a) p(b | a) to within the grid's resolution."""
    g = torch.Generator().manual_seed(0)
    p1 = torch.softmax(torch.randn(6, generator=g) * 1.5, -1)
    p2 = torch.softmax(torch.randn(6, 6, generator=g) * 1.5, -1)
    m = 1000
    counts = torch.zeros(6, 6)
    for order in ("id", "prob"):
        counts.zero_()
        for j in range(m):
            c = Fraction(2 * j + 1, 2 * m)
            a, lo, hi = cdf_interval(p1, c, order)
            c = (c - lo) / (hi - lo)
            b, _, _ = cdf_interval(p2[a], c, order)
            counts[a, b] += 1
        joint = p1[:, None] * p2
        assert (counts / m - joint).abs().max() < 2.0 / m


def test_one_arithmetic_sample_uses_the_common_random_number(llama):
    """N = 1 in probability order is the `sample` decoder's first inverse-CDF draw with the
    same seed."""
    for seed in range(6):
        a = run(llama, "arithmetic", PROMPTS[2], 1, {"num_samples": 1, "token_order": "prob"}, seed=seed)
        s = run(llama, "sample", PROMPTS[2], 1, {"coupling": "inverse_cdf"}, seed=seed)
        assert a.output_ids == s.output_ids


def test_arithmetic_steps_and_batching(llama):
    n = 4
    stop = a_stop_token(llama, PROMPTS[0], 2)
    trace = run(llama, "arithmetic", PROMPTS[0], 8, {"num_samples": n, "temperature": 1.5}, stop, seed=1)
    assert trace.stats["target_forwards"] == len(trace.steps)  # all samples in one forward per step
    samples = [s["ids"] for s in trace.stats["samples"]]
    for s in samples:
        assert len(s) == 8 or s[-1] == stop
    last = trace.steps[-1].evidence["beams"]
    assert [b["ids"] for b in last] == samples


@pytest.mark.parametrize("decoder,params,msg", [
    ("beam", {"num_beams": 0}, "out of range"),
    ("beam", {"num_beams": 2, "num_return_sequences": 3}, "must not exceed"),
    ("beam", {"early_stopping": "maybe"}, "not one of"),
    ("diverse_beam", {"num_beams": 4, "num_beam_groups": 3}, "multiple"),
    ("arithmetic", {"num_samples": 0}, "out of range"),
    ("arithmetic", {"token_order": "random"}, "not one of"),
    ("beam", {"top_p": 0.5}, "no knob"),
])
def test_bad_search_knobs(llama, decoder, params, msg):
    with pytest.raises(PlaygroundError, match=msg):
        prepare(model=llama, decoder=decoder, prompt="ROMEO:", max_new_tokens=4, params=params)


def test_search_decoders_are_documented():
    for name in ("beam", "diverse_beam", "arithmetic", "best_of_n", "mbr", "best_first_beam", "uid_beam"):
        cls = get_decoder(name)
        assert cls.family == "search" and cls.kind == "causal" and cls.step_kind == "beam"
        assert cls.reference and cls.description and cls.__doc__
        assert all(spec.help for spec in cls.params.values())


# ---------------------------------------------------------------------- best-of-n and MBR
def test_best_of_n_sample_zero_is_the_sample_decoder(llama):
    knobs = {"temperature": 1.3, "top_k": 40}
    s = run(llama, "sample", PROMPTS[1], 8, knobs, seed=4)
    one = run(llama, "best_of_n", PROMPTS[1], 8, {"num_samples": 1, **knobs}, seed=4)
    assert one.output_ids == s.output_ids  # common random numbers: N = 1 is plain sampling
    four = run(llama, "best_of_n", PROMPTS[1], 8, {"num_samples": 4, **knobs}, seed=4)
    samples = four.stats["samples"]
    assert samples[0]["ids"] == s.output_ids
    assert len({tuple(x["ids"]) for x in samples}) > 1
    best = max(range(4), key=lambda i: samples[i]["score"])
    assert four.stats["chosen_sample"] == best and four.output_ids == samples[best]["ids"]
    for x in samples:
        assert x["score"] == pytest.approx(x["logprob"] / len(x["ids"]), abs=1e-4)
    assert four.stats["target_forwards"] == 8


def test_mbr_returns_the_consensus_sample(llama):
    from decoders.search import ngram_f1

    assert ngram_f1([1, 2, 3], [1, 2, 3], 2) == 1.0
    assert ngram_f1([1, 2, 3], [4, 5, 6], 2) == 0.0
    assert ngram_f1([1, 2, 3], [1, 2, 4], 1) == pytest.approx(2 / 3)
    trace = run(llama, "mbr", PROMPTS[0], 8, {"num_hypotheses": 5, "temperature": 1.5}, seed=2)
    samples = trace.stats["samples"]
    seqs = [x["ids"] for x in samples]
    for i, x in enumerate(samples):
        mean = sum(ngram_f1(seqs[i], seqs[j], 2) for j in range(5) if j != i) / 4
        assert x["utility"] == pytest.approx(mean, abs=1e-4)
    best = trace.stats["chosen_sample"]
    assert samples[best]["utility"] == max(x["utility"] for x in samples)
    assert trace.output_ids == seqs[best]


@pytest.mark.parametrize("refs", [0, 3])
def test_mbr_with_one_hypothesis_returns_it(llama, refs):
    knobs = {"temperature": 1.2}
    s = run(llama, "sample", PROMPTS[1], 8, knobs, seed=7)
    one = run(llama, "mbr", PROMPTS[1], 8, {"num_hypotheses": 1, "num_references": refs, "utility": "chrf",
                                             **knobs}, seed=7)
    assert one.output_ids == s.output_ids  # the one hypothesis is sample 0: the sample decoder's draw
    assert one.stats["chosen_sample"] == 0


def test_mbr_chrf_matrix_is_sacrebleus_and_the_choice_its_best_row(llama):
    from sacrebleu.metrics import CHRF

    n, m = 4, 3
    trace = run(llama, "mbr", PROMPTS[2], 10, {"num_hypotheses": n, "num_references": m, "utility": "chrf",
                                               "ref_sampler": "epsilon", "temperature": 1.5}, seed=1)
    hyps = [x["ids"] for x in trace.stats["samples"]]
    refs = [x["ids"] for x in trace.stats["references"]]
    ev = trace.steps[-1].evidence["mbr"]
    chrf = CHRF()
    dec = llama.decode
    for i, h in enumerate(hyps):
        for j, r in enumerate(refs):
            assert ev["matrix"][i][j] == pytest.approx(chrf.sentence_score(dec(h), [dec(r)]).score / 100, abs=1e-4)
        assert ev["expected"][i] == pytest.approx(sum(ev["matrix"][i]) / m, abs=1e-4)
    assert ev["chosen"] == trace.stats["chosen_sample"] == max(range(n), key=lambda i: (ev["expected"][i], -i))
    assert trace.output_ids == hyps[ev["chosen"]]
    sets = [s.evidence.get("set") for s in trace.steps[:-1]]
    assert "hypotheses" in sets and "references" in sets  # two batched sets, each in the trace
    assert trace.stats["target_forwards"] == len(trace.steps) - 1


@pytest.mark.parametrize("utility", ["ngram_f1", "chrf", "bleu"])
def test_mbr_reference_aggregation(llama, utility):
    """Against one reference, aggregation is the pairwise utility; against several, it
    compares with the references' mean n-gram statistics."""
    from decoders.search._utility import aggregated, pairwise

    dec = llama.decode
    hyps = [[5, 6, 7, 8, 9], [5, 6, 10, 11], [12, 13, 14]]
    refs = [[5, 6, 7, 20], [5, 6, 10, 21, 22]]
    for r in refs:
        agg = aggregated(utility, hyps, [r], dec, 2)
        pw = [row[0] for row in pairwise(utility, hyps, [r], dec, 2, skip_self=False)]
        assert agg == pytest.approx(pw, abs=1e-9)
    agg = aggregated(utility, hyps, refs, dec, 2)
    if utility == "ngram_f1":  # by hand: hypothesis 0 against the averaged counts
        # unigrams: matches 5:1, 6:1, 7:0.5 -> 2.5 of 5 hyp, ref mass 4.5; bigrams: (5,6):1, (6,7):0.5 -> 1.5 of 4, mass 3.5
        f1 = lambda m, h, r: 2 * (m / h) * (m / r) / (m / h + m / r)  # noqa: E731
        assert agg[0] == pytest.approx((f1(2.5, 5, 4.5) + f1(1.5, 4, 3.5)) / 2, abs=1e-9)
    trace = run(llama, "mbr", PROMPTS[0], 8, {"num_hypotheses": 4, "num_references": 4, "utility": utility,
                                              "aggregation": "reference"}, seed=3)
    ev = trace.steps[-1].evidence["mbr"]
    assert ev["matrix"] is None and ev["aggregation"] == "reference"
    assert trace.output_ids == trace.stats["samples"][ev["chosen"]]["ids"]


def test_mbr_aggregated_against_several_references_is_the_mean_statistics():
    """Against several references, chrF and BLEU score the mean n-gram counts: equal references
    give the single-reference score, and a hypothesis equal to one of two references scores
    between that reference's score (1) and the other's."""
    texts = {1: "the quick brown fox jumps over the lazy dog", 2: "a slow green turtle walks under a busy bridge",
             3: "the quick brown cat sleeps"}
    dec = lambda ids: " ".join(texts[i] for i in ids)  # noqa: E731
    for name, metric in (("chrf", CHRF()), ("bleu", BLEU(effective_order=True))):
        twice = aggregated(name, [[3]], [[1], [1]], dec, 2)[0]
        assert twice == pytest.approx(metric.sentence_score(texts[3], [texts[1]]).score / 100, abs=1e-9)
        mixed = aggregated(name, [[1]], [[1], [2]], dec, 2)[0]
        other = metric.sentence_score(texts[1], [texts[2]]).score / 100
        assert other < mixed < 1.0, name


def test_the_utilities_use_only_sacrebleus_public_names():
    tree = ast.parse(pathlib.Path(utility_module.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            assert not node.attr.startswith("_"), f"private attribute {node.attr!r}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sacrebleu"):
            assert node.module in ("sacrebleu", "sacrebleu.metrics"), node.module
            assert all(not a.name.startswith("_") for a in node.names)


def test_mbr_bad_knobs_are_one_line(llama):
    with pytest.raises(PlaygroundError, match="not one of"):
        prepare(model=llama, decoder="mbr", prompt="ROMEO:", max_new_tokens=4, params={"utility": "comet"})


# ---------------------------------------------------------------------- patience (Kasai et al. 2022)
@pytest.mark.parametrize("es", ["false", "true"])
def test_patience_one_is_transformers_beam(llama, es):
    stop = a_stop_token(llama, PROMPTS[0], 4)
    trace = run(llama, "beam", PROMPTS[0], N, {"num_beams": 4, "patience": 1.0, "early_stopping": es,
                                               "num_return_sequences": 4}, stop)
    seqs, scores = hf_beams(llama, trace.prompt_ids, 4, N, stop, nret=4, es={"false": False, "true": True}[es])
    assert [s["ids"] for s in trace.stats["sequences"]] == seqs
    assert [s["score"] for s in trace.stats["sequences"]] == pytest.approx(scores, abs=1e-4)


def _finished(trace) -> int:
    return sum(1 for s in trace.steps for b in s.evidence["beams"] if b["finished"])


def test_patience_moves_the_stopping_point(llama):
    """With early_stopping=true the search ends once ceil(patience * k) hypotheses have
    finished: more patience searches longer and can only find an equal or better best."""
    stops = set(run(llama, "beam", PROMPTS[1], 12, {"num_beams": 3}).output_ids[1:8])  # frequent finishes

    def beam(patience):
        r = prepare(model=llama, decoder="beam", prompt=PROMPTS[1], max_new_tokens=12,
                    params={"num_beams": 2, "early_stopping": "true", "patience": patience})
        r.ctx.stop_ids = stops
        return r.finish()

    less, one, more = beam(0.5), beam(1.0), beam(3.0)
    assert _finished(less) == 1 and less.output_ids[-1] in stops  # the first finish ends it
    assert _finished(one) == 2 and one.output_ids[-1] in stops
    assert _finished(more) >= 6 or len(more.steps) == 12
    assert len(less.steps) < len(one.steps) < len(more.steps)
    assert more.stats["sequences"][0]["score"] > one.stats["sequences"][0]["score"]  # it found a better one


# ---------------------------------------------------------------------- UID beam search
def test_uid_beam_with_lam_zero_is_beam(llama):
    stop = a_stop_token(llama, PROMPTS[1], 4)
    knobs = {"num_beams": 4, "num_return_sequences": 4}
    b = run(llama, "beam", PROMPTS[1], N, knobs, stop)
    u = run(llama, "uid_beam", PROMPTS[1], N, {**knobs, "lam": 0.0}, stop)
    assert u.output_ids == b.output_ids
    assert u.stats["sequences"] == b.stats["sequences"]
    assert [s.evidence["beams"] for s in u.steps] == [s.evidence["beams"] for s in b.steps]


def _surprisals(handle, prompt_ids, ids):
    logits = handle.forward(list(prompt_ids) + list(ids)).logits[0]
    lp = torch.log_softmax(logits.double(), -1)
    return [-float(lp[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(ids)]


def test_uid_beam_ranks_by_logp_minus_surprisal_variance(llama):
    lam = 3.0
    trace = run(llama, "uid_beam", PROMPTS[2], 6, {"num_beams": 3, "lam": lam, "length_penalty": 0.0})
    for step in trace.steps[1:]:
        for b in step.evidence["beams"]:
            s = _surprisals(llama, trace.prompt_ids, b["ids"])
            var = float(torch.tensor(s, dtype=torch.float64).var(unbiased=False))
            assert b["logprob"] == pytest.approx(-sum(s), abs=1e-3)
            assert b["score"] == pytest.approx(-sum(s) - lam * var, abs=1e-3)
    s = _surprisals(llama, trace.prompt_ids, trace.output_ids)
    assert trace.stats["surprisals"] == pytest.approx(s, abs=1e-3)
    uid = trace.steps[-1].evidence["uid"]
    assert uid["lam"] == lam and len(uid["surprisals"]) >= 1
    plain = run(llama, "beam", PROMPTS[2], 6, {"num_beams": 3, "length_penalty": 0.0})
    ps = _surprisals(llama, trace.prompt_ids, plain.output_ids)
    var = lambda xs: float(torch.tensor(xs, dtype=torch.float64).var(unbiased=False))  # noqa: E731
    # the regularised objective of uid_beam's answer is at least that of plain beam's answer
    assert -sum(s) - lam * var(s) >= -sum(ps) - lam * var(ps) - 1e-4


# ---------------------------------------------------------------------- best-first beam search
def beam_expansions(trace, k: int) -> int:
    """Hypotheses beam search expanded: the prompt, then k running beams per later step."""
    return 1 + k * (len(trace.steps) - 1)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("with_eos", [False, True])
def test_best_first_beam_returns_beams_answer_with_fewer_expansions(llama, k, prompt, with_eos):
    stop = a_stop_token(llama, prompt, k) if with_eos else None
    b = run(llama, "beam", prompt, N, {"num_beams": k, "length_penalty": 0.0}, stop)
    f = run(llama, "best_first_beam", prompt, N, {"num_beams": k}, stop)
    assert f.output_ids == b.output_ids
    assert f.stats["best_score"] == pytest.approx(b.stats["sequences"][0]["score"], abs=1e-4)
    assert f.stats["expansions"] <= beam_expansions(b, k)
    assert f.stats["target_forwards"] == f.stats["waves"]  # one batched forward per wave
    assert f.stats["target_forwards"] <= b.stats["target_forwards"]


@pytest.fixture(scope="module")
def shakespeare():
    """The bundled tiny-shakespeare model (real text: stops such as a newline really end hypotheses)."""
    from playground.core.models import load_model

    return load_model("tiny-shakespeare")


@pytest.mark.parametrize("stop_text", [None, "\n", ","])
def test_best_first_beam_needs_no_more_forwards_than_beam(shakespeare, llama, stop_text):
    """Best-first's waves batch hypotheses of mixed lengths into one forward: beam search's
    answer with at most beam search's forward passes (counted by the same model view), on the
    bundled model and the tiny random Llama, several prompts and beam widths."""
    saved = 0
    for handle in (shakespeare, llama):
        for k in (2, 4, 8):
            for prompt in PROMPTS:
                if stop_text is None:
                    stop = None
                elif handle is llama:
                    stop = a_stop_token(llama, prompt, k)
                else:
                    (stop,) = handle.tokenizer.encode(stop_text, add_special_tokens=False)
                b = run(handle, "beam", prompt, 16, {"num_beams": k, "length_penalty": 0.0}, stop)
                f = run(handle, "best_first_beam", prompt, 16, {"num_beams": k}, stop)
                assert f.output_ids == b.output_ids, (handle.name, k, prompt)
                assert f.stats["target_forwards"] <= b.stats["target_forwards"], (handle.name, k, prompt)
                saved += b.stats["target_forwards"] - f.stats["target_forwards"]
    if stop_text is not None:  # hypotheses finish early: the lazy search skips whole lengths
        assert saved > 0


@pytest.mark.parametrize("arch", ["gpt2", "gemma2", "mistral-window", "mamba"])
def test_best_first_beam_on_every_cache_kind(tokenizer, arch):
    """Waves copy the prompt's cache and feed right-padded rows: absolute positions (gpt2), a
    window the prompt overruns (gemma2's mixed layers, mistral's window) and a recurrent state
    (mamba) all give beam search's answer in no more forwards."""
    from _arch_models import build_causal

    handle = handle_from_model(build_causal(arch, tokenizer), tokenizer, name=f"bf-{arch}")
    prompt = "ROMEO: But soft, what light through yonder window breaks?\n\nJULIET: O Romeo, Romeo, wherefore"
    plain = run(handle, "beam", prompt, 10, {"num_beams": 3, "length_penalty": 0.0})
    for stop in (None, plain.output_ids[min(3, len(plain.output_ids) - 1)]):
        b = run(handle, "beam", prompt, 10, {"num_beams": 3, "length_penalty": 0.0}, stop)
        f = run(handle, "best_first_beam", prompt, 10, {"num_beams": 3}, stop)
        assert f.output_ids == b.output_ids
        # mamba's scan over a wave's several tokens and beam's one-token state update round differently
        tol = 1e-2 if arch == "mamba" else 1e-4
        assert f.stats["best_score"] == pytest.approx(b.stats["sequences"][0]["score"], abs=tol)
        assert f.stats["target_forwards"] <= b.stats["target_forwards"]


def test_best_first_beam_feeds_one_token_per_popped_hypothesis(llama):
    """On a full-attention model each expanded hypothesis keeps its keys and values: after the
    prompt's prefill a wave feeds one token per row, as beam search does."""
    r = prepare(model=llama, decoder="best_first_beam", prompt=PROMPTS[0], max_new_tokens=N, params={"num_beams": 3})
    trace = r.finish()
    assert trace.stats["expansions"] > trace.stats["waves"]  # waves of several rows
    assert r.ctx.target.tokens == len(trace.prompt_ids) + trace.stats["expansions"] - 1


def test_best_first_beam_trace_shows_frontier_and_pops(llama):
    k = 3
    trace = run(llama, "best_first_beam", PROMPTS[0], 6, {"num_beams": k})
    popped_scores = []
    for s in trace.steps:
        ev = s.evidence
        assert all(b["popped"] for b in ev["beams"])
        assert all(int(c) <= k for c in ev["pops"].values())  # the beam constraint
        fr = [x["score"] for x in ev["frontier"]]
        assert fr == sorted(fr, reverse=True)  # the queue's best entries, best first
        popped_scores += [b["score"] for b in ev["beams"]]
    last = trace.steps[-1].evidence["beams"]
    assert len(last) == 1 and last[0]["finished"] and last[0]["ids"] == trace.output_ids
    for s in trace.steps:  # a wave pops the queue's best entries in order
        sc = [b["score"] for b in s.evidence["beams"]]
        assert sc == sorted(sc, reverse=True)
    assert max(popped_scores) == popped_scores[0] == 0.0  # the prompt itself, popped first
    assert sum(len(s.evidence["beams"]) for s in trace.steps[:-1]) == trace.stats["expansions"]
