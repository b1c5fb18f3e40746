"""Fast-dLLM's block KV cache (``decoders.diffusion.block_cache``) on the block decoders.

The layer-by-layer forward equals the model's own (the bundled ModernBERT, a tiny random one
with sliding-window layers, tiny BERT and RoBERTa); with a cache just refreshed it equals the model on every
block; on a one-layer model, where the keys/values outside the block depend on their own
tokens only, the cached forward is exact, and on deeper ones it is not (the approximation is
real). In the decoders: cache none is LLaDA's reference, a refresh at every step equals no
cache, a cached run is valid (prompt, fixed positions), its steps record what was computed
fresh and when the cache was refreshed, and the recorded confidences replay by hand.
"""

from __future__ import annotations

import pytest
import torch
from transformers import ModernBertConfig, ModernBertForMaskedLM

from _arch_models import build_masked
from decoders.diffusion.block_cache import BertBlockForward, ModernBertBlockForward, block_forward
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model, load_model
from playground.core.trace import validate_trace_dict
from playground.engine import prepare
from test_diffusion import PROMPT, build_bert, llada_reference

VOCAB = 64


def tiny_modernbert(layers: int = 3, seed: int = 0) -> ModernBertForMaskedLM:
    """A random ModernBERT whose sliding layers see +-4 positions (local_attention 8), with
    attention scaled up so that one token moves the logits of its neighbours by ~1e-2."""
    torch.manual_seed(seed)
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    cfg = ModernBertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, max_position_embeddings=128, local_attention=8,
                           layer_types=types, pad_token_id=0, bos_token_id=1, eos_token_id=1,
                           cls_token_id=1, sep_token_id=1)
    cfg._attn_implementation = "sdpa"
    model = ModernBertForMaskedLM(cfg).eval()
    with torch.no_grad():  # random init barely mixes positions: make attention matter, sharpen the head
        for layer in model.model.layers:
            layer.attn.Wqkv.weight.mul_(8.0)
            layer.attn.Wo.weight.mul_(8.0)
        model.decoder.weight.mul_(6.0)
    return model


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-shakespeare-diffusion", device="cpu")


def model_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits.float()


def canvases(vocab: int, t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, t), generator=g)


def model_under_test(bundled, tokenizer, which: str) -> tuple[torch.nn.Module, int]:
    """(model, vocabulary size): the bundled ModernBERT, the tiny one, or tiny BERT / RoBERTa."""
    if which == "bundled":
        return bundled.model, bundled.vocab_size
    if which == "tiny":
        return tiny_modernbert(), VOCAB
    return build_masked(which, tokenizer), len(tokenizer)


WHICH = ["bundled", "tiny", "bert", "roberta"]


# ---------------------------------------------------------------------- the layer-by-layer forward
def test_tiny_model_has_sliding_layers_narrower_than_the_canvas():
    cfg = tiny_modernbert().config
    assert "sliding_attention" in cfg.layer_types and "full_attention" in cfg.layer_types
    assert cfg.sliding_window == 4  # half of local_attention: canvases of 40 cross the window


@pytest.mark.parametrize("which", WHICH)
def test_full_forward_equals_the_models_own(bundled, tokenizer, which):
    model, vocab = model_under_test(bundled, tokenizer, which)
    expected = BertBlockForward if which in ("bert", "roberta") else ModernBertBlockForward
    assert isinstance(block_forward(model), expected)
    for seed, t in ((0, 40), (1, 57), (2, 9)):
        ids = canvases(vocab, t, seed)
        ids[0, 5] = model.config.pad_token_id  # a pad inside the canvas (RoBERTa's positions skip pads)
        with torch.inference_mode():
            ours = block_forward(model).full(ids).float()
        torch.testing.assert_close(ours, model_logits(model, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", WHICH)
def test_a_block_against_a_fresh_cache_equals_the_models_own(bundled, tokenizer, which):
    """A cache refreshed on this very canvas: every block (dual) and block+suffix (prefix)
    computed through the layers equals the model's logits there; a 'block' covering the
    whole canvas equals the model on any canvas (nothing is read from the cache)."""
    model, vocab = model_under_test(bundled, tokenizer, which)
    ids = canvases(vocab, 48, 3)
    ref = model_logits(model, ids)
    runner = block_forward(model)
    with torch.inference_mode():
        runner.full(ids)
        for lo, hi in ((0, 8), (8, 16), (20, 28), (40, 48), (20, 48), (5, 6)):
            torch.testing.assert_close(runner.partial(ids, lo, hi).float(), ref[:, lo:hi], rtol=1e-5, atol=1e-5)
        other = canvases(vocab, 48, 4)
        torch.testing.assert_close(runner.partial(other, 0, 48).float(), model_logits(model, other),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["modernbert", "bert"])
def test_one_layer_cache_is_exact_and_deeper_ones_are_not(tokenizer, family):
    """With one layer the keys/values of a position depend on its own token (and position)
    only, so a cache built on another canvas that agrees outside the block gives the model's
    logits exactly; deeper, the outside keys/values saw the old block and the logits differ."""
    cases = (((tiny_modernbert(layers=1, seed=5), True), (tiny_modernbert(layers=3, seed=5), False))
             if family == "modernbert" else ((build_bert(tokenizer, layers=1), True),))
    vocab = VOCAB if family == "modernbert" else len(tokenizer)
    for model, exact in cases:
        old = canvases(vocab, 40, 6)
        for lo, hi in ((16, 24), (16, 40)):  # dual: the block; prefix: the block and the suffix
            new = old.clone()
            new[:, lo:hi] = canvases(vocab, hi - lo, 7)
            runner = block_forward(model)
            with torch.inference_mode():
                runner.full(old)
                got = runner.partial(new, lo, hi).float()
            want = model_logits(model, new)[:, lo:hi]
            if exact:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            else:
                assert (got - want).abs().max() > 1e-3


# ---------------------------------------------------------------------- in the decoders
def run(handle, decoder, n=24, seed=0, prompt=PROMPT, **params):
    return prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                   params=params).finish()


def test_cache_none_is_llada_and_records_no_cache(bundled):
    trace = run(bundled, "llada", n=16, steps=8, block_length=8, cache="none")
    ref = llada_reference(bundled.model, trace.prompt_ids, 8, 16, 8, bundled.mask_token_id)
    assert trace.steps[-1].evidence["canvas"] == ref
    assert all("cache" not in s.evidence for s in trace.steps)
    default = run(bundled, "llada", n=16, steps=8, block_length=8)
    assert default.output_ids == trace.output_ids


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("decoder,knobs", [("llada", {"steps": 3}), ("llada", {"steps": 3, "cfg_scale": 1.0}),
                                           ("fast_dllm", {"threshold": 0.0})])
def test_a_refresh_at_every_step_equals_no_cache(bundled, mode, decoder, knobs):
    """One step per block: every step is a block's first, a full forward, so nothing cached is read."""
    plain = run(bundled, decoder, block_length=8, **knobs)
    cached = run(bundled, decoder, block_length=8, cache=mode, **knobs)
    assert cached.steps[-1].evidence["canvas"] == plain.steps[-1].evidence["canvas"]
    assert cached.stats["target_forwards"] == plain.stats["target_forwards"] == 3
    assert all(s.evidence["cache"]["refreshed"] for s in cached.steps)


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("decoder,knobs", [("llada", {"steps": 12}), ("fast_dllm", {"threshold": 0.5})])
def test_cached_run_is_valid_and_records_fresh_positions_and_refreshes(bundled, mode, decoder, knobs):
    g, b = 24, 8
    trace = run(bundled, decoder, n=g, block_length=b, cache=mode, fixed="3: love", **knobs)
    validate_trace_dict(trace.to_dict())
    p0 = len(trace.prompt_ids)
    assert trace.prompt_ids == bundled.encode(PROMPT)
    love = bundled.encode(" love")
    canvas = trace.steps[-1].evidence["canvas"]
    assert bundled.mask_token_id not in canvas and canvas[3:3 + len(love)] == love
    assert all(s.evidence["canvas"][3:3 + len(love)] == love for s in trace.steps)
    processed, refresh_step, block = 0, None, None
    for j, s in enumerate(trace.steps):
        ev, (s0, s1) = s.evidence["cache"], s.evidence["block"]
        assert ev["mode"] == mode
        if [s0, s1] != block:  # a block's first step refreshes the cache with a full forward
            block, refresh_step = [s0, s1], j
            assert ev["refreshed"] and ev["fresh"] == [0, g] and ev["cached_positions"] == 0
            processed += p0 + g
        else:
            end = g if mode == "prefix" else s1
            assert not ev["refreshed"] and ev["fresh"] == [s0, end]
            assert ev["cached_positions"] == p0 + g - (end - s0)
            processed += end - s0
        assert ev["refresh_step"] == refresh_step
        assert all(s0 <= p < s1 for p in s.evidence["unmasked"])
    assert trace.stats["target_forwards"] == len(trace.steps)
    assert trace.stats["target_tokens_processed"] == processed
    assert sum(not s.evidence["cache"]["refreshed"] for s in trace.steps) > 0  # the cache was read


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("which", ["bundled", "bert", "roberta"])
def test_recorded_confidences_replay_by_hand(bundled, tokenizer, mode, which):
    """Each step's confidences at the block's masked positions are the softmax of a hand-run
    forward: the full canvas at the block's first step, else the fresh positions against the
    keys/values of that first step's canvas."""
    g, b = 16, 8
    handle = bundled if which == "bundled" else handle_from_model(build_masked(which, tokenizer), tokenizer,
                                                                   name=f"tiny-{which}")
    trace = run(handle, "fast_dllm", n=g, block_length=b, cache=mode, threshold=0.6)
    assert sum(not s.evidence["cache"]["refreshed"] for s in trace.steps) > 0
    p0, mask = len(trace.prompt_ids), handle.mask_token_id
    runner = block_forward(handle.model)
    canvas = list(trace.prompt_ids) + [mask] * g
    for s in trace.steps:
        ev, (s0, s1) = s.evidence["cache"], s.evidence["block"]
        x = torch.tensor([canvas])
        with torch.inference_mode():
            if ev["refreshed"]:
                logits = runner.full(x)[0, p0:]
            else:
                lo, hi = p0 + ev["fresh"][0], p0 + ev["fresh"][1]
                logits = torch.zeros(g, handle.vocab_size)
                logits[lo - p0:hi - p0] = runner.partial(x, lo, hi)[0]
        probs = torch.softmax(logits.float(), -1)
        for p in range(s0, s1):
            if canvas[p0 + p] == mask:
                tok = s.evidence["predicted"][p]
                assert tok == int(probs[p].argmax())
                assert s.evidence["confidence"][p] == pytest.approx(float(probs[p, tok]), abs=2e-5)
        canvas = list(trace.prompt_ids) + s.evidence["canvas"]


def test_cache_on_a_model_without_support_is_one_line(tokenizer):
    distil = handle_from_model(build_masked("distilbert", tokenizer), tokenizer, name="tiny-distilbert")
    for dec in ("llada", "fast_dllm"):
        with pytest.raises(PlaygroundError) as e:
            run(distil, dec, n=8, block_length=4, cache="dual")
        assert "\n" not in str(e.value) and "ModernBERT" in str(e.value) and "tiny-distilbert" in str(e.value)
        assert run(distil, dec, n=8, block_length=4, cache="none").output_ids


def test_unknown_cache_mode_is_one_line(bundled):
    with pytest.raises(PlaygroundError, match="knob 'cache'='full' is not one of: none, prefix, dual"):
        run(bundled, "fast_dllm", n=8, cache="full")
