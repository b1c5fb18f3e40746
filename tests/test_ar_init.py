"""The diffusion LM initialised from the causal target (`train_tiny --recipe from_ar`).

`diffusion_from_causal` maps the bundled Llama into a ModernBertForMaskedLM. The map is exact
where LayerNorm equals RMSNorm (a residual stream with zero mean over the hidden units) and
the attention is given the causal mask, so the sub-blocks are checked there to float
precision; the whole model, whose residual stream is not zero-mean, is checked against the
Llama's next-token predictions on validation windows."""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from transformers import AutoModelForMaskedLM, AutoTokenizer

from playground import tiny_eval, train_tiny
from playground.tiny_data import NAMES

TARGET = "assets/models/tiny-shakespeare"


def _models():
    llama = tiny_eval.load(TARGET, "causal")
    return llama, train_tiny.diffusion_from_causal(llama).eval()


def _zero_mean(shape, seed: int) -> torch.Tensor:
    h = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return h - h.mean(-1, keepdim=True)


def _causal(b: int, t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()[None, None].expand(b, 1, t, t)


@torch.no_grad()
def test_every_sub_block_reproduces_the_llama_on_zero_mean_inputs():
    llama, bert = _models()
    b, t, d = 2, 12, llama.config.hidden_size
    pos = torch.arange(t)[None].expand(b, t)
    cos_l, sin_l = llama.model.rotary_emb(torch.zeros(b, t, d), pos)
    cos_b, sin_b = bert.model.rotary_emb(torch.zeros(b, t, d), pos, "full_attention")
    assert torch.allclose(cos_l, cos_b) and torch.allclose(sin_l, sin_b)
    mask = _causal(b, t)
    for i, (ll, bl) in enumerate(zip(llama.model.layers, bert.model.layers)):
        h = _zero_mean((b, t, d), seed=i) * 3.0
        want = ll.self_attn(ll.input_layernorm(h), position_embeddings=(cos_l, sin_l),
                            attention_mask=mask)[0]
        # layer 0 reads the normed embeddings: ModernBERT's embedding norm, then no layer norm
        inp = bert.model.embeddings.norm(h) if i == 0 else bl.attn_norm(h)
        got = bl.attn(inp, position_embeddings=(cos_b, sin_b), attention_mask=mask)[0]
        assert torch.allclose(got, want, atol=1e-5), (i, (got - want).abs().max())
        # SwiGLU: the half of Wi that ModernBERT activates must be the Llama's gate
        want = ll.mlp(ll.post_attention_layernorm(h))
        got = bl.mlp(bl.mlp_norm(h))
        assert torch.allclose(got, want, atol=1e-5), (i, (got - want).abs().max())


@torch.no_grad()
def test_with_a_causal_mask_the_mapped_model_predicts_like_the_llama():
    """Approximate only through LayerNorm's mean subtraction (in the blocks and in the MLM
    head, whose LayerNorm renormalises the final-normed state): measured 0.925 top-1 agreement
    and +0.004 nats of next-token loss on these windows; a wrong map is far off both."""
    llama, bert = _models()
    tok = AutoTokenizer.from_pretrained(TARGET)
    _, val = tiny_eval.corpus_ids(tok)
    w = tiny_eval.val_windows(val, 128, 8)
    a = llama(input_ids=w).logits
    mask = _causal(*w.shape[:1], w.shape[1])
    b = bert(input_ids=w, attention_mask={"full_attention": mask,
                                          "sliding_attention": mask}).logits
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.85
    ce = [F.cross_entropy(x[:, :-1].reshape(-1, x.size(-1)), w[:, 1:].reshape(-1)).item()
          for x in (a, b)]
    assert abs(ce[1] - ce[0]) < 0.05, ce


def test_annealed_mask_goes_from_causal_to_full():
    gen = torch.Generator().manual_seed(0)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    assert (train_tiny.annealed_mask(3, 16, 0.0, gen) == causal).all()
    assert train_tiny.annealed_mask(3, 16, 1.0, gen) is None
    half = train_tiny.annealed_mask(64, 16, 0.5, gen)
    assert half.shape == (64, 1, 16, 16) and half[..., causal].all()
    future = half[..., ~causal].float().mean().item()
    assert 0.45 < future < 0.55  # 7,680 Bernoulli(0.5) draws: 0.5 +- 0.006 (1 sd)


@torch.no_grad()
def test_aligned_logits_read_position_i_from_the_output_at_i_minus_1():
    _, bert = _models()
    ids = torch.randint(3, 4096, (2, 10), generator=torch.Generator().manual_seed(1))
    raw = bert(input_ids=ids).logits
    got = train_tiny.AlignedLogits(bert)(input_ids=ids).logits
    assert torch.equal(got[:, 1:], raw[:, :-1]) and torch.equal(got[:, 0], raw[:, 0])


def test_shifted_loss_never_masks_position_0_and_scores_the_next_token(monkeypatch):
    """The loss of a shifted model equals a brute-force recomputation from the same draws:
    targets at masked i >= 1 read the output at i - 1, weighted 1 / t."""
    _, bert = _models()
    batch = torch.randint(3, 4096, (4, 33), generator=torch.Generator().manual_seed(2))
    seen = {}
    forward = bert.model.forward

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        seen["xt"], seen["hidden"] = kwargs["input_ids"], out.last_hidden_state
        return out

    monkeypatch.setattr(bert.model, "forward", spy)
    mask_id = 1
    with torch.no_grad():
        loss = train_tiny.diffusion_loss(bert, batch, mask_id, torch.Generator().manual_seed(3))
    xt, x0 = seen["xt"], batch[:, :-1]
    masked = xt == mask_id
    assert not masked[:, 0].any() and masked.any()
    logits = bert.decoder(bert.head(seen["hidden"]))
    ce = F.cross_entropy(logits[:, :-1][masked[:, 1:]], x0[:, 1:][masked[:, 1:]],
                         reduction="none")
    # the 1/t weights: replay the generator's first draws exactly as diffusion_loss makes them
    gen = torch.Generator().manual_seed(3)
    n = x0.shape[0]
    u = (torch.rand(1, generator=gen) + torch.arange(n) / n) % 1.0
    t = 1e-3 + (1 - 1e-3) * u[torch.randperm(n, generator=gen)]
    weights = (1.0 / t)[:, None].expand_as(x0)[:, 1:][masked[:, 1:]]
    maskable = x0[:, 1:].numel()  # no prefix rows (prefix_share 0); position 0 excluded
    assert torch.allclose(loss, (ce * weights).sum() / maskable, rtol=1e-5)


def test_from_ar_smoke_end_to_end(tmp_path):
    """`--smoke --recipe from_ar` trains a toy target, maps it, fine-tunes, and writes a
    loadable shifted ModernBERT with eval.json figures that recompute."""
    parser = argparse.ArgumentParser()
    train_tiny.add_arguments(parser)
    args = parser.parse_args(["--smoke", "--recipe", "from_ar", "--out", str(tmp_path)])
    assert train_tiny.run(args) == 0
    path = tmp_path / NAMES["diffusion"]
    config = json.loads((path / "config.json").read_text())
    assert config[train_tiny.SHIFTED_KEY] is True and config["playground_kind"] == "diffusion"
    assert set(config["layer_types"]) == {"full_attention"}
    assert config["hidden_activation"] == "silu"
    ev = json.loads((path / "eval.json").read_text())
    assert ev["training"]["from_causal"] and ev["sample"]["logits_shifted"]
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    train_ids, val_ids = tiny_eval.corpus_ids(tok, smoke=True)
    windows = tiny_eval.val_windows(val_ids, ev["sample"]["seq_len"], tiny_eval.SMOKE_WINDOWS)
    m = tiny_eval.random_masks(windows.shape, 0.5)
    acc, _ = tiny_eval.masked_scores(train_tiny.AlignedLogits(model), windows, m,
                                     tok.mask_token_id)
    assert round(acc, 5) == ev["figures"]["masked_acc_50"]
