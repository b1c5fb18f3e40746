"""The speculative family: lossless decoders return greedy's output at temperature 0; the
verification rule preserves the target distribution (exactly, by enumeration); tree
attention equals sequential decoding; the cache keeps only the accepted path; traces,
forward counts, stops and bad inputs behave as users rely on.

Statistical tests against the exact target distribution are in test_speculative_dist.py;
tests on the bundled models in test_speculative_bundled.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from decoders.base import all_decoders, get_decoder
from decoders.processors import History, build_chain
from decoders.draft_tree import (ROOT, Rule, Tree, select_cache, tree_inputs, verify_group)
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model

# From the registry, so a new lossless speculative decoder is tested without a list entry.
LOSSLESS = sorted(c.name for c in all_decoders() if c.family == "speculative" and c.lossless)
GREEDY_ONLY = {n for n in LOSSLESS if "temperature" not in get_decoder(n).params}  # no sampling to test
PROMPTS = [
    "ROMEO: But soft",
    "JULIET: O Romeo, Romeo, wherefore art thou",
    "To be, or not to be",
    "MACBETH: Tomorrow, and tomorrow, and tomorrow, creeps",
    "ab ab ab ab ab ab ab ab ab ab ab ab ab ab",  # repetitive: lookups draft long runs
]


# ---------------------------------------------------------------------- models
def build_varied_llama(tokenizer, seed: int = 0, layers: int = 3, hidden: int = 48, noise_from=None,
                       noise: float = 0.0):
    """A random Llama with an untied LM head, so greedy text is not a copy of the input.

    With ``noise_from`` it is a noisy copy of that model: a draft that agrees often, not always.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        if noise_from is not None:
            model.load_state_dict(noise_from.state_dict())
            for p in model.parameters():
                p.add_(torch.randn_like(p) * noise * p.std())
        else:
            model.lm_head.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def varied(tokenizer):
    return handle_from_model(build_varied_llama(tokenizer), tokenizer, name="varied")


@pytest.fixture(scope="module")
def varied_draft(tokenizer, varied):
    return handle_from_model(build_varied_llama(tokenizer, seed=5, noise_from=varied.model, noise=0.6),
                             tokenizer, name="varied-draft")


def run(handle, decoder, prompt, n, draft=None, stop_ids=(), seed=0, **params):
    if decoder not in GREEDY_ONLY and decoder != "greedy":
        params.setdefault("temperature", 0.0)
    r = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                draft=draft if get_decoder(decoder).needs_draft else None, params=params)
    r.ctx.stop_ids = set(stop_ids)
    return r.finish()


def committed(trace):
    return [t for s in trace.steps for t in s.committed]


# ---------------------------------------------------------------------- registry
def test_family_registered():
    for name in LOSSLESS:
        cls = get_decoder(name)
        assert cls.family == "speculative" and cls.kind == "causal" and cls.lossless
        assert cls.reference and cls.description
        assert cls.needs_draft == (name in ("speculative", "spec_tree", "bandit_spec", "ouroboros"))
        for knob, spec in cls.params.items():
            assert spec.help, f"{name}.{knob} has no help"
    assert get_decoder("speculative")().is_lossy({"accept": "top_m"})
    assert not get_decoder("speculative")().is_lossy({"accept": "strict"})


# ---------------------------------------------------------------------- the acceptance math
def _dist(seed: int, v: int, sharp: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(v, generator=g, dtype=torch.float64) * sharp, 0)
    p[int(torch.randint(v, (1,), generator=g))] = 0.0  # a token the model rules out
    return p / p.sum()


def _output_law(p, cands, qdist):
    """P(committed token = y) for fixed candidates: accept probabilities and residual come
    from verify_group run with u = 1 (nothing accepted unless forced by a probability 1)."""
    idx, trials, residual, _ = verify_group(p, cands, qdist, [1.0] * len(cands))
    law = torch.zeros_like(p, dtype=torch.float64)
    reach = 1.0
    for j, t in enumerate(trials):
        law[cands[j]] += reach * t.accept_prob
        reach *= 1.0 - t.accept_prob
        if t.accept_prob >= 1.0:
            return law
    return law + reach * residual.double()


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recursive_rejection_preserves_target_exactly(k, seed):
    """Averaged over k children drawn without replacement from q, the committed token is
    distributed exactly as p (Leviathan for k=1, RSD for k>1), enumerated, not sampled."""
    v = 5
    p, q = _dist(seed, v), _dist(seed + 100, v, sharp=2.5)
    law = torch.zeros(v, dtype=torch.float64)
    for cands in itertools.permutations(range(v), k):
        prob, left = 1.0, 1.0
        for c in cands:
            prob *= float(q[c]) / left
            left -= float(q[c])
        if prob > 0:
            law += prob * _output_law(p, list(cands), q)
    assert torch.allclose(law, p, atol=1e-9)


@pytest.mark.parametrize("cands", [[0], [3, 1], [4, 0, 2], [1, 2, 3, 4, 0]])
def test_deterministic_candidates_preserve_target(cands):
    p = _dist(7, 5)
    assert torch.allclose(_output_law(p, cands, None), p, atol=1e-12)


def test_greedy_acceptance_is_argmax():
    p = torch.zeros(6)
    p[2] = 1.0
    idx, trials, residual, _ = verify_group(p, [4, 2, 1], None, [0.0, 0.0, 0.0])
    assert idx == 1 and [t.accepted for t in trials] == [False, True]
    idx, _, residual, _ = verify_group(p, [4, 1], None, [0.0, 0.0])
    assert idx is None and int(torch.argmax(residual)) == 2


def test_lossy_rules_decide():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rule = Rule({"accept": "top_m", "top_m": 2})
    assert rule.decide(1, p, None) is True and rule.decide(2, p, None) is None
    flat = torch.full((50,), 1 / 50)
    easd = Rule({"accept": "entropy", "easd_entropy": 2.0, "easd_top_n": 5, "easd_overlap": 0.6})
    assert easd.decide(3, flat, flat) is False and easd.decide(0, p, p) is None
    typ = Rule({"accept": "typical", "typical_eps": 0.09, "typical_delta": 0.3})
    assert typ.decide(2, p, None) is True and typ.decide(3, p, None) is None
    fuzzy = Rule({"accept": "fuzzy", "fuzzy_div": 0.05})
    assert fuzzy.decide(0, p, p) is True and fuzzy.decide(0, p, torch.tensor([0.0, 0, 0, 1])) is None


# ---------------------------------------------------------------------- tree attention & cache
@pytest.mark.parametrize("which", ["varied", "gpt2_handle"])
def test_tree_verification_equals_sequential(request, which):
    h = request.getfixturevalue(which)
    prefix = h.encode("ROMEO: But soft, what")
    cache = h.forward(prefix[:-1]).cache
    past = len(prefix) - 1
    # fed: the pending token, then a tree: a, b under it; c under a; d under c; e under b
    tokens = [prefix[-1], 40, 41, 42, 43, 44]
    parents = [-1, 0, 0, 1, 3, 2]
    mask, pos = tree_inputs(parents, past, h.dtype)
    assert mask is not None and pos.tolist() == [[past, past + 1, past + 1, past + 2, past + 3, past + 2]]
    tree_logits = h.forward(tokens, cache=cache, attention_mask=mask, position_ids=pos).logits[0]
    for i in range(len(tokens)):
        path, j = [], i
        while j != -1:
            path.append(tokens[j])
            j = parents[j]
        seq = h.forward(prefix[:-1] + path[::-1]).logits[0, -1]
        assert torch.allclose(tree_logits[i], seq, atol=1e-4), f"node {i}"


def test_cache_after_partial_tree_equals_accepted_tokens(varied, varied_draft):
    """After a step that accepted part of a branching tree, the target cache holds exactly
    the keys/values of prompt + accepted tokens (the correction is fed next step)."""
    r = prepare(model=varied, decoder="spec_tree", prompt=PROMPTS[1], max_new_tokens=40,
                draft=varied_draft, params={"temperature": 0.0, "topk": 3, "width": 3, "depth": 4})
    r.ctx.stop_ids = set()
    seen_partial = False
    for _ in range(12):
        step = r.step()
        if step is None:
            break
        tree = step.evidence["tree"]
        n_acc = len(tree["accepted_path"])
        branching = len({n["parent"] for n in tree["nodes"]}) < len(tree["nodes"])
        if n_acc >= 1 and branching and any(not n["accepted"] for n in tree["nodes"]):
            seen_partial = True
            dec = r.decoder
            ids = dec.prompt + dec.out[:-1]
            ref = varied.forward(ids).cache
            assert dec.cache.get_seq_length() == len(ids)
            for a, b in zip(dec.cache.layers, ref.layers):
                assert torch.allclose(a.keys, b.keys, atol=1e-4)
                assert torch.allclose(a.values, b.values, atol=1e-4)
            break
    assert seen_partial, "no partially accepted branching tree in 12 steps"


def test_select_cache_keeps_positions(varied):
    ids = varied.encode("To be, or not to be")
    cache = varied.forward(ids).cache
    keep = [0, 1, 2, 4, 6]
    before = [layer.keys.clone() for layer in cache.layers]
    select_cache(cache, keep)
    for old, layer in zip(before, cache.layers):
        assert torch.equal(layer.keys, old[:, :, keep])


def test_tree_prune_keeps_ancestors():
    t = Tree()
    a = t.add(5)
    b = t.add(6, a)
    t.add(7, b)
    t.add(8, ROOT, aux=True)
    p = t.pruned(max_depth=3, max_draft_depth=2)
    assert p.tokens == [5, 6, 8] and p.parents == [-1, 0, -1]


# ---------------------------------------------------------------------- exactness
@pytest.mark.parametrize("decoder", LOSSLESS)
def test_lossless_equals_greedy_varied(varied, varied_draft, decoder):
    """Temperature 0: token for token greedy's output, several prompts and lengths, on a
    model whose drafts are partly rejected."""
    extra = {"exit_layer": 1} if decoder == "layer_skip" else {}
    for prompt, n in zip(PROMPTS, [5, 17, 24, 9, 24]):
        ref = run(varied, "greedy", prompt, n)
        tr = run(varied, decoder, prompt, n, draft=varied_draft, **extra)
        assert tr.output_ids == ref.output_ids, f"{decoder} on {prompt!r}, {n} tokens"
        assert committed(tr) == tr.output_ids
        assert len(tr.output_ids) == n


@pytest.mark.parametrize("decoder", LOSSLESS)
def test_lossless_equals_greedy_copying_model(llama_handle, decoder):
    """On the tied-embedding model, which copies its input, drafts are accepted in long runs."""
    for prompt, n in ((PROMPTS[4], 30), (PROMPTS[0], 12)):
        ref = run(llama_handle, "greedy", prompt, n)
        tr = run(llama_handle, decoder, prompt, n, draft=llama_handle,
                 **({"exit_layer": 1} if decoder == "layer_skip" else {}))
        assert tr.output_ids == ref.output_ids, f"{decoder} on {prompt!r}"
        assert committed(tr) == tr.output_ids
        if decoder in ("prompt_lookup", "jacobi", "ngram_adaptive") and prompt == PROMPTS[4]:
            assert tr.stats["tokens_per_target_forward"] >= 3.0


@pytest.mark.parametrize("decoder", ["speculative", "spec_tree", "prompt_lookup", "lookahead", "mask_probe",
                                     "layer_skip"])
def test_lossless_equals_greedy_gpt2(gpt2_handle, decoder):
    for prompt in (PROMPTS[2], PROMPTS[4]):
        ref = run(gpt2_handle, "greedy", prompt, 16)
        tr = run(gpt2_handle, decoder, prompt, 16, draft=gpt2_handle)
        assert tr.output_ids == ref.output_ids


@pytest.mark.parametrize("decoder", ["speculative", "spec_tree", "prompt_lookup", "jacobi", "token_recycling"])
def test_stops_on_stop_token_like_greedy(varied, varied_draft, decoder):
    free = run(varied, "greedy", PROMPTS[3], 20).output_ids
    stop = free[7]
    ref = run(varied, "greedy", PROMPTS[3], 20, stop_ids={stop})
    tr = run(varied, decoder, PROMPTS[3], 20, draft=varied_draft, stop_ids={stop})
    assert tr.output_ids == ref.output_ids and tr.output_ids[-1] == stop
    assert committed(tr) == tr.output_ids
    assert tr.stats["finish_reason"] == "stop"


def test_dynamic_layer_skip_is_exact(varied):
    ref = run(varied, "greedy", PROMPTS[1], 20)
    tr = run(varied, "layer_skip", PROMPTS[1], 20, exit_layer=1, dynamic=True)
    assert tr.output_ids == ref.output_ids
    assert "layer_acceptance" in tr.steps[-1].evidence


# ---------------------------------------------------------------------- traces & counts
def _count_calls(handle):
    calls = {"n": 0, "early": 0}
    orig = handle.model.forward
    layers = handle._layer_list()

    def counting(*a, **k):
        owner, attr = layers
        if len(getattr(owner, attr)) < handle.num_layers:
            calls["early"] += 1
        else:
            calls["n"] += 1
        return orig(*a, **k)

    handle.model.forward = counting
    return calls


@pytest.mark.parametrize("decoder", ["speculative", "spec_tree", "layer_skip", "token_recycling"])
def test_forward_counts_match_model_calls(tokenizer, decoder):
    target = handle_from_model(build_varied_llama(tokenizer), tokenizer, name="t")
    draft = handle_from_model(build_varied_llama(tokenizer, seed=5, noise_from=target.model, noise=0.6),
                              tokenizer, name="d")
    tc, dc = _count_calls(target), _count_calls(draft)
    tr = run(target, decoder, PROMPTS[1], 20, draft=draft, **({"exit_layer": 1} if decoder == "layer_skip" else {}))
    assert tr.stats["target_forwards"] == tc["n"] == len(tr.steps)
    assert tr.stats["draft_forwards"] == dc["n"] + tc["early"]
    assert tr.steps[-1].draft_forwards == tr.stats["draft_forwards"]
    if decoder in ("speculative", "spec_tree"):
        assert dc["n"] > 0 and tc["early"] == 0
    if decoder == "layer_skip":
        assert tc["early"] > 0


def test_draft_step_evidence(varied, varied_draft):
    tr = run(varied, "spec_tree", PROMPTS[0], 20, draft=varied_draft, temperature=1.0, seed=3)
    d = tr.to_dict()
    assert {"acceptance_rate", "mean_accepted_length", "accepted_length_hist", "source_share"} <= set(d["stats"])
    for s in d["steps"]:
        assert s["kind"] == "draft"
        tree = s["tree"]
        ids = {n["id"] for n in tree["nodes"]}
        for n in tree["nodes"]:
            assert set(n) >= {"id", "parent", "token", "q", "p", "accept_prob", "accepted", "source"}
            assert n["parent"] is None or n["parent"] in ids
        path = tree["accepted_path"]
        assert all(next(n for n in tree["nodes"] if n["id"] == i)["accepted"] for i in path)
        toks = [next(n for n in tree["nodes"] if n["id"] == i)["token"] for i in path]
        tail = [tree["correction"]] if tree["correction"] is not None else []
        assert s["committed"] == toks + tail
        assert tree["correction_kind"] in ("resample", "bonus", None)
    hist = d["stats"]["accepted_length_hist"]
    assert sum(hist.values()) == len(d["steps"])
    assert abs(sum(d["stats"]["source_share"].values()) - 1.0) < 1e-3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_stops_drafting_on_the_drafts_confidence(varied, varied_draft, temperature):
    """Each draft ends where its rule says, read against the draft model's own distribution
    recomputed here: every drafted token but the last has q >= confidence, and the step's
    draft_stop names the rule that ended it (confidence, the γ cap, the run's length)."""
    gamma, floor, n = 6, 0.4, 24
    tr = run(varied, "speculative", PROMPTS[1], n, draft=varied_draft, temperature=temperature, seed=4,
             gamma=gamma, confidence=floor)
    done, reasons = list(tr.prompt_ids), set()
    for s in tr.steps:
        nodes, stop = s.evidence["tree"]["nodes"], s.evidence["draft_stop"]
        if not nodes:  # the last token: nothing left to draft
            assert stop == {"reason": "length", "drafted": 0} and len(done) - len(tr.prompt_ids) == n - 1
            done += s.committed
            continue
        toks = [nd["token"] for nd in nodes]
        logits = varied_draft.forward(done + toks).logits[0, len(done) - 1:]
        chain = build_chain({"temperature": temperature})
        qs = [float((torch.softmax(logits[i], -1) if temperature == 0 else
                     chain.probs(logits[i], History(ids=done + toks[:i], prompt_len=len(tr.prompt_ids),
                                                     pos=0)))[t]) for i, t in enumerate(toks)]
        assert [nd["q"] for nd in nodes] == pytest.approx(qs, rel=1e-4, abs=1e-6)
        assert stop["drafted"] == len(nodes) and all(q >= floor for q in qs[:-1])
        room = n - (len(done) - len(tr.prompt_ids)) - 1
        want = "confidence" if qs[-1] < floor else "gamma" if len(nodes) == gamma else "length"
        assert len(nodes) == min(gamma, room) or want == "confidence"
        assert stop["reason"] == want and stop["q"] == pytest.approx(qs[-1], rel=1e-4, abs=1e-6)
        reasons.add(want)
        done += s.committed
    assert "confidence" in reasons and len(tr.output_ids) == n


def test_confidence_zero_drafts_to_the_cap(varied, varied_draft):
    """confidence = 0 (and adaptive_h = 1) is plain speculative sampling: γ tokens every step."""
    tr = run(varied, "speculative", PROMPTS[0], 20, draft=varied_draft, gamma=4, confidence=0.0)
    left = 20
    for s in tr.steps:
        assert len(s.evidence["tree"]["nodes"]) == min(4, left - 1)
        assert s.evidence["draft_stop"]["reason"] in ("gamma", "length")
        left -= len(s.committed)
    assert tr.output_ids == run(varied, "greedy", PROMPTS[0], 20).output_ids


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_spec_tree_grows_only_confident_nodes(varied, varied_draft, temperature):
    """A tree node the draft gives q below confidence is never expanded; a tree that stops
    for confidence has no node at its deepest level that reaches it."""
    floor = 0.3
    tr = run(varied, "spec_tree", PROMPTS[1], 24, draft=varied_draft, temperature=temperature, seed=2,
             depth=6, confidence=floor)
    reasons = set()
    for s in tr.steps:
        nodes, stop = s.evidence["tree"]["nodes"], s.evidence["draft_stop"]
        parents = {nd["parent"] for nd in nodes}
        assert all(nd["q"] >= floor for nd in nodes if nd["id"] in parents)
        depth = {}
        for nd in nodes:
            depth[nd["id"]] = 1 if nd["parent"] is None else depth[nd["parent"]] + 1
        if stop["reason"] == "confidence":
            deepest = max(depth.values())
            assert all(nd["q"] < floor for nd in nodes if depth[nd["id"]] == deepest)
        assert stop["drafted"] == len(nodes)
        reasons.add(stop["reason"])
    assert "confidence" in reasons


def test_jacobi_steps(varied):
    tr = run(varied, "jacobi", PROMPTS[2], 15, window=4)
    for s in tr.steps:
        assert s.kind == "jacobi"
        assert s.evidence["converged"] == len(s.committed) >= 1
        assert len(s.evidence["guess"]) <= 4


def test_lossy_rule_counts_tokens_that_differ_from_strict(varied, varied_draft):
    """top_m at temperature 0 accepts non-argmax tokens; the trace counts exactly the
    committed tokens that are not the target's argmax after their own prefix."""
    r = prepare(model=varied, decoder="speculative", prompt=PROMPTS[1], max_new_tokens=24,
                draft=varied_draft, params={"temperature": 0.0, "accept": "top_m", "top_m": 4})
    r.ctx.stop_ids = set()
    tr = r.finish()
    assert tr.extra.get("lossy") is True
    ids = tr.prompt_ids + tr.output_ids
    logits = varied.forward(ids).logits[0]
    n0 = len(tr.prompt_ids)
    differ = sum(int(torch.argmax(logits[n0 - 1 + i])) != t for i, t in enumerate(tr.output_ids))
    assert tr.stats["lossy_tokens"] == differ > 0


@pytest.mark.parametrize("decoder", ["speculative", "spec_tree", "prompt_lookup"])
@pytest.mark.parametrize("rule", ["fuzzy", "typical", "top_m", "entropy"])
def test_lossy_rules_never_accept_a_token_the_chain_rules_out(varied, varied_draft, decoder, rule):
    """Found by the fuzzer: ``fuzzy`` at its widest accepted drafted tokens that top_k had
    removed. With top_k=1 only the target's argmax is allowed, so every rule gives greedy."""
    loose = {"fuzzy_div": 0.7, "typical_eps": 0.0, "top_m": 100, "easd_entropy": 0.0, "easd_overlap": 0.0}
    ref = run(varied, "greedy", PROMPTS[4], 16)
    tr = run(varied, decoder, PROMPTS[4], 16, draft=varied_draft, temperature=1.0, top_k=1, accept=rule, **loose)
    assert tr.output_ids == ref.output_ids
    nodes = [n for s in tr.steps for n in s.evidence["tree"]["nodes"]]
    assert any(n["accepted"] for n in nodes) and all(n["p"] > 0 for n in nodes if n["accepted"])


def test_entropy_rule_runs_and_is_lossy(varied, varied_draft):
    tr = run(varied, "spec_tree", PROMPTS[0], 12, draft=varied_draft, temperature=1.0, accept="entropy",
             easd_entropy=0.5, easd_overlap=0.2)
    assert tr.extra.get("lossy") is True and "lossy_tokens" in tr.stats
    assert len(tr.output_ids) == 12


def test_same_seed_same_output(varied, varied_draft):
    a = run(varied, "speculative", PROMPTS[0], 16, draft=varied_draft, temperature=1.0, seed=11)
    b = run(varied, "speculative", PROMPTS[0], 16, draft=varied_draft, temperature=1.0, seed=11)
    assert a.output_ids == b.output_ids


# ---------------------------------------------------------------------- bad input
def test_draft_with_another_tokenizer_is_rejected(varied):
    from conftest import build_tokenizer

    other_tok = build_tokenizer(vocab_size=300)
    other = handle_from_model(build_varied_llama(other_tok), other_tok, name="other")
    with pytest.raises(PlaygroundError, match="different tokenizer"):
        prepare(model=varied, decoder="speculative", prompt="ROMEO:", draft=other)


def test_diffusion_draft_is_rejected(varied, tokenizer):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    diff = handle_from_model(BertForMaskedLM(cfg), tokenizer, name="tiny-bert", kind="diffusion")
    with pytest.raises(PlaygroundError, match="a draft must be causal"):
        prepare(model=varied, decoder="spec_tree", prompt="ROMEO:", draft=diff)


def test_missing_draft_is_rejected(varied):
    with pytest.raises(PlaygroundError, match="needs a draft model"):
        prepare(model=varied, decoder="speculative", prompt="ROMEO:")


@pytest.mark.parametrize("knob,value", [("gamma", 0), ("gamma", 33), ("gamma", 2.5), ("accept", "loose"),
                                        ("confidence", 1.5), ("confidence", -0.1)])
def test_bad_knobs_are_rejected(varied, varied_draft, knob, value):
    with pytest.raises(PlaygroundError, match=knob):
        prepare(model=varied, decoder="speculative", prompt="ROMEO:", draft=varied_draft, params={knob: value})


def test_exit_layer_out_of_range(varied):
    r = prepare(model=varied, decoder="layer_skip", prompt="ROMEO:", params={"exit_layer": 3})
    with pytest.raises(PlaygroundError, match="exit_layer"):
        r.step()
    assert r.done and "exit_layer" in r.trace.stats.get("error", "")


def test_draft_with_a_shorter_context_is_rejected(varied, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=16)
    short = handle_from_model(GPT2LMHeadModel(cfg), tokenizer, name="short-draft")
    r = prepare(model=varied, decoder="speculative", prompt=PROMPTS[1], max_new_tokens=20, draft=short)
    with pytest.raises(PlaygroundError, match="context of the draft"):
        r.step()
