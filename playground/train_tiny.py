"""Train the bundled tiny models (`playground train-tiny`).

One file, read top to bottom (nanoGPT spirit):

  1. corpus   -- Shakespeare's complete works (assets/corpus/), split into train / validation
                 by the fixed rule in assets/corpus/split.json (last 5% of every work held out);
  2. tokenizer -- byte-level BPE (the `tokenizers` library), vocabulary 4,096, special tokens
                 <|endoftext|> (eos, also bos), <|mask|> and <|pad|>, saved as a HF fast tokenizer;
  3. target   -- `tiny-shakespeare`, a Llama-style causal LM (LlamaForCausalLM);
  4. draft    -- `tiny-shakespeare-draft`, a ~7x smaller Llama, distilled from the target's logits;
  5. diffusion -- `tiny-shakespeare-diffusion`, a bidirectional ModernBertForMaskedLM trained with
                 the MDLM / LLaDA masked-diffusion objective.

Every model stage checkpoints to --ckpt-dir and can be resumed with --resume; after training it
writes a Hugging Face model directory (config with "playground_kind", model.safetensors, the shared
tokenizer files) and a model card + eval.json computed by playground.tiny_eval.

    python -m playground.train_tiny --threads 2                 # everything, into assets/models
    python -m playground.train_tiny --only draft --resume       # continue from its checkpoint
    python -m playground.train_tiny --smoke --out /tmp/tiny     # seconds; what the tests run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

# On a shared, oversubscribed CPU, OpenMP threads that busy-wait make training up to ~10x slower;
# passive waiting costs little on an idle machine. (Takes effect only if torch is not loaded yet.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from playground import tiny_eval  # noqa: E402
from playground.tiny_data import NAMES, encode_docs, load_corpus  # noqa: E402

DEFAULT_OUT = "assets/models"
DEFAULT_CKPT = "runs/train-tiny"

EOS, MASK, PAD = "<|endoftext|>", "<|mask|>", "<|pad|>"
SPECIAL_TOKENS = [EOS, MASK, PAD]  # ids 0, 1, 2
STAGES = ("tokenizer", "target", "draft", "diffusion")
KINDS = {"target": "causal", "draft": "causal", "diffusion": "diffusion"}

# ----------------------------------------------------------------------------------------------
# Recipes. `arch` goes into the transformers config; the rest drives the training loop.
# Sizes were chosen from measured throughput on a shared 2-core CPU (about 2-3k tokens/s for
# the target with bf16 autocast) so that all three models train in about 45 minutes.

RECIPES = {
    "tokenizer": dict(vocab_size=4096),
    "target": dict(
        arch=dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=3, num_key_value_heads=3),
        steps=700, batch_size=8, seq_len=256, lr=2e-3, min_lr=2e-4, warmup=40,
        weight_decay=0.1,
    ),
    "draft": dict(
        arch=dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2),
        steps=400, batch_size=8, seq_len=256, lr=3e-3, min_lr=3e-4, warmup=40,
        weight_decay=0.1,
        distill=0.5,  # loss = (1-a) * CE(data) + a * KL(target || draft); 0 = no distillation
    ),
    "diffusion": dict(
        # Sliding-window (+-8 tokens) attention in the first two layers: with only full attention
        # (BertForMaskedLM, or ModernBERT with global layers) the model sat on the unigram
        # plateau for 700+ steps (masked accuracy = unigram baseline); local layers make
        # neighbouring tokens visible from the start and it learns within 50 steps.
        arch=dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=3, local_attention=16,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention",
                               "full_attention"]),
        steps=1800, batch_size=8, seq_len=256, lr=2e-3, min_lr=2e-4, warmup=40,
        weight_decay=0.1,
        eps=1e-3,           # t ~ U(eps, 1)
        prefix_share=0.25,  # share of "clean prefix, masked suffix" sequences (LLaDA SFT style)
    ),
}

# --smoke: the same code path at toy sizes, on a slice of the corpus; runs in seconds.
SMOKE = {
    "tokenizer": dict(vocab_size=512),
    "target": dict(arch=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2),
                   steps=4, batch_size=4, seq_len=64, warmup=1),
    "draft": dict(arch=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=1, num_key_value_heads=1),
                  steps=4, batch_size=4, seq_len=64, warmup=1),
    "diffusion": dict(arch=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=2, local_attention=16,
                                layer_types=["sliding_attention", "full_attention"]),
                      steps=4, batch_size=4, seq_len=64, warmup=1),
}
# --recipe gpu: sized for about 4-5 minutes on one H200 for the three models together (each
# stage also stops at `max_seconds`, the cosine schedule following whichever of steps / time
# runs out first). On the full corpus (~1.6M training tokens) the CPU recipe saw less than one
# epoch; here every model sees tens of epochs, so overfitting is held back by residual dropout
# (forward hooks during training only, nothing in the saved config) and by early stopping on a
# held-out tail of the training split (the card's validation split is never used to choose).
# Sizes stay inside the budget: each model.safetensors under 15 MB (fp32), all three ~30 MB.
GPU_RECIPES = {
    "target": dict(
        arch=dict(hidden_size=192, intermediate_size=512, num_hidden_layers=6,
                  num_attention_heads=3, num_key_value_heads=3),
        steps=4000, batch_size=64, seq_len=256, lr=2e-3, min_lr=1e-4, warmup=100,
        weight_decay=0.1, dropout=0.15, eval_every=100, max_seconds=85,
    ),
    "draft": dict(
        # ~0.61M parameters: 5.6x fewer than the target (the issue asks for >= 5x)
        arch=dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2),
        steps=8000, batch_size=64, seq_len=256, lr=3e-3, min_lr=1.5e-4, warmup=100,
        weight_decay=0.05, dropout=0.0, eval_every=100, max_seconds=90,
        distill=0.8,  # top-1 agreement is what speculation needs: lean on the teacher
    ),
    "diffusion": dict(
        arch=dict(hidden_size=192, intermediate_size=512, num_hidden_layers=6,
                  num_attention_heads=3, local_attention=16,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention",
                               "sliding_attention", "full_attention", "full_attention"]),
        steps=6000, batch_size=64, seq_len=256, lr=2e-3, min_lr=1e-4, warmup=100,
        weight_decay=0.1, dropout=0.1, eval_every=100, max_seconds=95,
        eps=1e-3, prefix_share=0.25,
        # a share of sequences with t ~ U(high_t, 1): the decoders start from a fully masked
        # canvas, where the CPU model was barely above the unigram baseline
        high_mask_share=0.3, high_t=0.7,
    ),
}
# --recipe finetune: continue training the bundled diffusion LM on this CPU (issue 17: its masked
# accuracy at 90 % masking was the one target unmet, +0.04 over the unigram baseline). Most
# sequences draw t ~ U(0.8, 1), around the 90 % the figure is taken at; small batches (bf16 on
# a 2-core CPU trains ~5k tokens/s at batch 16) for 85 minutes, about half the tokens of the
# whole GPU run, nearly all of them at high masking (measured: +0.002 at 90 % on the
# validation split, within its noise; docs/models.md). Early stopping keeps the held-out step
# with the best accuracy at 90 % masking among those still >= GUARD_MARGIN above the unigram
# baseline at 15 % and 50 % (measured on the held-out tail of the training split, never on the
# validation split).
FINETUNE_RECIPES = {
    "diffusion": dict(
        init_from=True,  # start from the model already in --out (or --init-from DIR)
        # an earlier try, 4e-4 for 160 steps, cost 0.02 at 15 % and moved nothing at 90 %;
        # this one (6,789 steps in the time cap) keeps 15 % and 50 % and adds 0.002 at 90 %
        steps=12000, batch_size=16, seq_len=256, lr=3e-4, min_lr=1.5e-5, warmup=200,
        weight_decay=0.1, dropout=0.05, eval_every=250, select="masked_acc_90",
        max_seconds=5100,
        eps=1e-3, prefix_share=0.1, high_mask_share=0.85, high_t=0.8,
    ),
}
# --recipe grow: the fine-tune above moved the 90 % figure by one standard error while the
# model scored about the same on training and validation windows (0.156 / 0.153 at 90 %), so
# the next thing to try was capacity. This recipe doubles the depth of the bundled model
# function-preservingly (`deepen`: a full-attention copy of each layer inserted after it, its
# two output projections zeroed, so step 0 computes exactly the bundled model) and trains the
# 12-layer model (6.14M parameters) at high masking ratios on this CPU; same early stopping as
# `finetune`. Measured: 2,714 steps (11.1M tokens) in 70 minutes; held-out 90 % accuracy
# 0.131 -> 0.136 (best, step 1750), validation 0.153 -> 0.153 (docs/models.md), not adopted.
GROW_RECIPES = {
    "diffusion": dict(
        init_from=True,
        deepen=dict(after=[0, 1, 2, 3, 4, 5], layer_type="full_attention"),
        steps=12000, batch_size=16, seq_len=256, lr=6e-4, min_lr=3e-5, warmup=200,
        weight_decay=0.1, dropout=0.05, eval_every=250, select="masked_acc_90",
        max_seconds=4200,
        eps=1e-3, prefix_share=0.1, high_mask_share=0.85, high_t=0.8,
    ),
}
# --recipe from_ar: the two tries above started from the bundled diffusion LM; this one starts
# from the bundled causal target instead, as Dream and DiffuLLaMA adapt an autoregressive model.
# `diffusion_from_causal` maps the Llama's weights into a ModernBertForMaskedLM (every layer
# global attention, SwiGLU, RoPE theta of the Llama, the MLM head an identity up to a scale);
# the model keeps the Llama's "shifted" prediction: the token at position i is read from the
# output at position i - 1 (config key `playground_logits_shifted`). Training anneals the
# attention from causal to bidirectional over the first `anneal` of the run (DiffuLLaMA's
# attention-mask annealing, in this project's form: each future key is visible with a
# probability that grows linearly from 0 to 1), with the masking ratios decoding visits
# (t ~ U(eps, 1), half of the sequences at t ~ U(0.7, 1), a quarter with a clean prefix).
# Same early stopping as `finetune`, on shifted logits. Measured on one shared CPU thread: 795
# steps (3.26M tokens) in 40 minutes gave 0.354 / 0.254 / 0.142 at 15 / 50 / 90 % masking on
# the validation split, below the bundled model (0.394 / 0.307 / 0.153); not adopted.
FROM_AR_RECIPES = {
    "diffusion": dict(
        from_ar=True, anneal=0.2,
        steps=12000, batch_size=16, seq_len=256, lr=6e-4, min_lr=6e-5, warmup=100,
        weight_decay=0.1, dropout=0.0, eval_every=200, select="masked_acc_90",
        max_seconds=2400,
        eps=1e-3, prefix_share=0.25, high_mask_share=0.5, high_t=0.7,
    ),
}
SHIFTED_KEY = "playground_logits_shifted"  # config key: logits[i - 1] score the token at i
GUARD_MARGIN = 0.05
FINETUNE_HOLDOUT_WINDOWS = 48  # fewer than for the loss: each check costs CPU time
HOLDOUT_FRACTION = 0.03  # tail of the training stream kept out of training, for early stopping
HOLDOUT_WINDOWS = 96

MAX_POSITIONS = 512


def recipe(stage: str, smoke: bool, name: str = "cpu") -> dict:
    """The training recipe of a stage: `name` "cpu" (the default), "gpu", "finetune", "grow" or
    "from_ar"; `smoke` shrinks it."""
    tables = {"gpu": GPU_RECIPES, "finetune": FINETUNE_RECIPES, "grow": GROW_RECIPES,
              "from_ar": FROM_AR_RECIPES}
    table = tables.get(name, RECIPES)
    if stage not in table:
        if name in ("finetune", "grow"):
            raise SystemExit(f"--recipe {name}: only for {', '.join(table)}")
        table = RECIPES
    r = json.loads(json.dumps(table[stage]))
    if smoke:
        for k, v in SMOKE[stage].items():
            r[k] = v
    return r


# ----------------------------------------------------------------------------------------------
# 1. Corpus: read and split by playground.tiny_data (shared with the evaluation).


# ----------------------------------------------------------------------------------------------
# 2. Tokenizer


def train_tokenizer(train_docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Byte-level: every string is representable, decode(encode(s)) == s, no prefix space added.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(train_docs, trainer=trainer)
    return hf_tokenizer(tok)


def hf_tokenizer(tok):
    """Wrap a `tokenizers.Tokenizer` as the HF fast tokenizer saved with every model."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=PAD, mask_token=MASK,
        clean_up_tokenization_spaces=False, model_input_names=["input_ids", "attention_mask"],
    )


def load_tokenizer(out: Path):
    from tokenizers import Tokenizer

    path = out / NAMES["target"] / "tokenizer.json"
    if not path.exists():
        raise SystemExit(f"no tokenizer at {path}: run with --only tokenizer first")
    return hf_tokenizer(Tokenizer.from_file(str(path)))


# ----------------------------------------------------------------------------------------------
# 3-5. Models


def build_model(stage: str, arch: dict, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM, ModernBertConfig, ModernBertForMaskedLM

    ids = dict(bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    if stage in ("target", "draft"):
        config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS,
                             tie_word_embeddings=True, **ids, **arch)
        model = LlamaForCausalLM(config)
    else:
        # pre-norm, RoPE, GeGLU, no token_type_ids; every special id is one of ours
        config = ModernBertConfig(vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS,
                                  cls_token_id=tokenizer.eos_token_id,
                                  sep_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
                                  attention_dropout=0.0, mlp_dropout=0.0, embedding_dropout=0.0,
                                  **ids, **arch)
        model = ModernBertForMaskedLM(config)
        if arch.get("layer_types") and list(getattr(config, "layer_types", None) or []) != list(
                arch["layer_types"]):
            # an older transformers would ignore layer_types and train another attention pattern
            raise SystemExit("this transformers' ModernBertConfig does not honour layer_types")
    model.config.playground_kind = KINDS[stage]
    return model


def deepen(model, after: list[int], layer_type: str = "full_attention"):
    """A deeper ModernBertForMaskedLM computing exactly what `model` computes (Net2Net-style
    growth): after each layer index in `after`, a copy of that layer is inserted with attention
    type `layer_type` and its attention and MLP output projections zeroed, so on the residual
    stream it adds nothing until training moves those projections. Everything else is copied."""
    import copy

    from transformers import ModernBertForMaskedLM

    old_types = list(model.config.layer_types)
    order = []  # (source layer, is_new) for every layer of the deeper model
    for i in range(len(old_types)):
        order.append((i, False))
        if i in after:
            order.append((i, True))
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = len(order)
    config.layer_types = [layer_type if new else old_types[i] for i, new in order]
    grown = ModernBertForMaskedLM(config)
    src = model.state_dict()
    state = {k: v for k, v in src.items() if not k.startswith("model.layers.")}
    for k, v in grown.state_dict().items():
        if not k.startswith("model.layers."):
            continue
        j, rest = k[len("model.layers."):].split(".", 1)
        i, new = order[int(j)]
        value = src.get(f"model.layers.{i}.{rest}", v)  # layer 0 has no attn_norm: keep init
        if new and rest in ("attn.Wo.weight", "mlp.Wo.weight"):
            value = torch.zeros_like(v)
        state[k] = value.clone()
    grown.load_state_dict(state, strict=True)
    grown.config.playground_kind = getattr(model.config, "playground_kind", "diffusion")
    return grown.train(model.training)


def diffusion_from_causal(causal):
    """A ModernBertForMaskedLM initialised from a LlamaForCausalLM (Dream / DiffuLLaMA-style
    adaptation of an autoregressive model), meant to be read with shifted logits.

    The map, block for block: Wqkv = [q; k; v]; the GeGLU MLP becomes SwiGLU
    (hidden_activation silu; ModernBERT activates the first half of Wi, so Wi = [gate; up]);
    the norms take the RMSNorm gains; every layer attends globally with the Llama's RoPE theta;
    the MLM head's dense is the identity with a linear activation. It is exact where the
    residual stream has zero mean over the hidden units (LayerNorm then equals RMSNorm) and the
    attention is given the causal mask; elsewhere approximate, which fine-tuning absorbs:
    ModernBERT's layer 0 has no norm of its own but a norm on the embeddings, so that norm
    carries the embeddings' typical scale and layer 0's gain moves into its Wqkv; the head's
    LayerNorm renormalises the final-normed state (subtracting its mean, rescaling by about
    the final gain's RMS), so the logits are close to the Llama's but not equal. With the
    causal mask the mapped target keeps its next-token loss within 0.01 nats."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    c = causal.config
    heads = c.num_attention_heads
    if c.num_key_value_heads != heads or c.hidden_size // heads != getattr(c, "head_dim", 0) \
            or getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        raise SystemExit("--recipe from_ar: needs a Llama with full multi-head attention, "
                         "head_dim = hidden / heads and no biases")
    theta = float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
    layers = c.num_hidden_layers
    config = ModernBertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=layers, num_attention_heads=heads,
        max_position_embeddings=c.max_position_embeddings, hidden_activation="silu",
        classifier_activation="linear", norm_eps=c.rms_norm_eps, norm_bias=False,
        attention_bias=False, mlp_bias=False, classifier_bias=False, decoder_bias=True,
        layer_types=["full_attention"] * layers,
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=theta),
                         "sliding_attention": dict(rope_type="default", rope_theta=theta)},
        tie_word_embeddings=True, attention_dropout=0.0, mlp_dropout=0.0, embedding_dropout=0.0,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id,
        cls_token_id=c.eos_token_id, sep_token_id=c.eos_token_id)
    model = ModernBertForMaskedLM(config)
    src = {k: v.detach().float() for k, v in causal.state_dict().items()}
    emb = src["model.embed_tokens.weight"]
    # LayerNorm on the embeddings: give its output the embeddings' typical scale
    scale = emb.std(dim=1, unbiased=False).mean()
    final_gain = src["model.norm.weight"]
    state = {
        "model.embeddings.tok_embeddings.weight": emb,
        "model.embeddings.norm.weight": torch.full_like(final_gain, float(scale)),
        "model.final_norm.weight": final_gain,
        "head.dense.weight": torch.eye(c.hidden_size),
        # the head's LayerNorm undoes the final gain's scale; this puts it back (on average)
        "head.norm.weight": torch.full_like(final_gain, float(final_gain.pow(2).mean().sqrt())),
        "decoder.weight": emb,
        "decoder.bias": torch.zeros(c.vocab_size),
    }
    for i in range(layers):
        a = b = f"model.layers.{i}."
        gain = src[a + "input_layernorm.weight"]
        qkv = torch.cat([src[a + f"self_attn.{n}_proj.weight"] for n in "qkv"], dim=0)
        if i == 0:
            qkv = qkv * (gain / scale)[None, :]  # layer 0's gain, on the normed embeddings
        else:
            state[b + "attn_norm.weight"] = gain
        state[b + "attn.Wqkv.weight"] = qkv
        state[b + "attn.Wo.weight"] = src[a + "self_attn.o_proj.weight"]
        state[b + "mlp_norm.weight"] = src[a + "post_attention_layernorm.weight"]
        state[b + "mlp.Wi.weight"] = torch.cat([src[a + "mlp.gate_proj.weight"],
                                                 src[a + "mlp.up_proj.weight"]], dim=0)
        state[b + "mlp.Wo.weight"] = src[a + "mlp.down_proj.weight"]
    model.load_state_dict(state, strict=True)
    model.config.playground_kind = "diffusion"
    setattr(model.config, SHIFTED_KEY, True)
    return model


def is_shifted(model) -> bool:
    """Whether a masked LM scores the token at position i with its logits at i - 1."""
    return bool(getattr(model.config, SHIFTED_KEY, False))


def unshift(logits: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of a shifted model re-aligned so that [:, i] scores position i; position
    0 keeps its own logits, as the playground's model handle does for Dream."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


class AlignedLogits(torch.nn.Module):
    """A masked LM whose forward returns logits aligned with the input (shifted models
    re-aligned by `unshift`), so tiny_eval's scoring reads every model the same way."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids: torch.Tensor, **kwargs):
        """The wrapped model's output, logits re-aligned when the model is shifted."""
        out = self.model(input_ids=input_ids, **kwargs)
        if is_shifted(self.model):
            out.logits = unshift(out.logits)
        return out


def annealed_mask(batch: int, length: int, visible: float, gen: torch.Generator):
    """(B, 1, T, T) boolean attention mask between causal and full: every past key visible,
    each future key visible with probability `visible`; None once `visible` reaches 1."""
    if visible >= 1.0:
        return None
    future = torch.rand(batch, 1, length, length, generator=gen) < visible
    return torch.ones(length, length, dtype=torch.bool).tril() | future


def n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """(B, T+1) random windows of `data`; one gather, so it stays cheap when data is on a GPU."""
    ix = torch.randint(len(data) - seq_len - 1, (batch_size,), generator=gen)
    idx = ix[:, None] + torch.arange(seq_len + 1)[None, :]
    return data[idx.to(data.device)]


def causal_loss(model, batch, teacher=None, distill=0.0):
    x, y = batch[:, :-1], batch[:, 1:]
    logits = model(input_ids=x).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    if teacher is not None and distill > 0:
        with torch.no_grad():
            t_logp = F.log_softmax(teacher(input_ids=x).logits.float(), dim=-1)
        kl = F.kl_div(F.log_softmax(logits, dim=-1), t_logp, log_target=True, reduction="none")
        loss = (1 - distill) * loss + distill * kl.sum(-1).mean()
    return loss


def diffusion_loss(model, batch, mask_id: int, gen: torch.Generator, eps=1e-3, prefix_share=0.0,
                   high_mask_share=0.0, high_t=0.7, attend=None):
    """MDLM / LLaDA: per sequence t ~ U(eps, 1); mask each token with probability t;
    cross-entropy on the masked positions weighted 1/t, averaged over all maskable positions.
    A share of sequences keeps a clean prefix of random length and masks only the suffix,
    which is how the diffusion decoders use the model (prompt, then masks). A share
    `high_mask_share` draws t ~ U(high_t, 1) instead, spending more training on the nearly
    fully masked canvases that diffusion decoding starts from. A shifted model (`is_shifted`)
    predicts the token at i from its output at i - 1 and never has position 0 masked;
    `attend` is an attention mask for every layer (`annealed_mask`), None = bidirectional."""
    x0 = batch[:, :-1]
    B, T = x0.shape
    # low-discrepancy t (as in MDLM): one uniform offset, B evenly spaced points
    u = (torch.rand(1, generator=gen) + torch.arange(B) / B) % 1.0
    t = eps + (1 - eps) * u[torch.randperm(B, generator=gen)]
    if high_mask_share > 0:
        high = torch.rand(B, generator=gen) < high_mask_share
        t = torch.where(high, high_t + (1 - high_t) * torch.rand(B, generator=gen), t)
    maskable = torch.ones(B, T, dtype=torch.bool)
    prefix_rows = torch.rand(B, generator=gen) < prefix_share
    prefix_len = torch.randint(1, T - T // 8, (B,), generator=gen)
    maskable &= ~(prefix_rows[:, None] & (torch.arange(T)[None, :] < prefix_len[:, None]))
    shifted = is_shifted(model)
    if shifted:
        maskable[:, 0] = False  # nothing before it to predict it from
    masked = ((torch.rand(B, T, generator=gen) < t[:, None]) & maskable).to(x0.device)
    maskable, t = maskable.to(x0.device), t.to(x0.device)
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    kwargs = {}
    if attend is not None:
        kwargs["attention_mask"] = {"full_attention": attend.to(x0.device),
                                    "sliding_attention": attend.to(x0.device)}
    hidden = model.model(input_ids=xt, **kwargs).last_hidden_state
    if shifted:
        hidden = torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)  # [:, i] = output at i - 1
    logits = model.decoder(model.head(hidden[masked])).float()  # LM head only where needed
    ce = F.cross_entropy(logits, x0[masked], reduction="none")
    weights = (1.0 / t)[:, None].expand(B, T)[masked]
    return (ce * weights).sum() / maskable.sum()


def lr_at(step: int, r: dict, time_frac: float = 0.0) -> float:
    """Warmup then cosine; the cosine follows whichever runs out first, steps or `max_seconds`
    (time_frac = elapsed / max_seconds), so a time-capped run still ends at min_lr."""
    if step < r["warmup"]:
        return r["lr"] * (step + 1) / r["warmup"]
    frac = max((step - r["warmup"]) / max(1, r["steps"] - r["warmup"]), time_frac)
    return r["min_lr"] + 0.5 * (r["lr"] - r["min_lr"]) * (1 + math.cos(math.pi * min(1.0, frac)))


def add_dropout(model, p: float) -> list:
    """Residual dropout on the embeddings and on every attention / MLP output, as forward hooks:
    Llama has no residual dropout in its config, and hooks leave the saved model plain."""
    if p <= 0:
        return []

    def hook(module, inputs, output):
        if not module.training:
            return output
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, True),) + tuple(output[1:])
        return F.dropout(output, p, True)

    targets = [m for n, m in model.named_modules()
               if n.endswith(("embed_tokens", ".self_attn", ".mlp", ".attn")) or n == "model.embeddings"]
    return [m.register_forward_hook(hook) for m in targets]


def holdout_split(data: torch.Tensor, fraction: float = HOLDOUT_FRACTION):
    """(train, holdout): the last `fraction` of the training stream is kept for early stopping."""
    cut = int(len(data) * (1 - fraction))
    return data[:cut], data[cut:]


@torch.no_grad()
def holdout_loss(stage: str, model, holdout: torch.Tensor, seq_len: int, mask_id: int | None,
                 device: str, amp: bool) -> float:
    """Mean loss on fixed held-out windows: next-token cross-entropy for the causal models, masked
    cross-entropy at 15 / 50 / 90 % masking (fixed masks) for the diffusion LM."""
    n = min(HOLDOUT_WINDOWS, len(holdout) // seq_len)
    w = holdout[: n * seq_len].view(n, seq_len).to(device)
    was = model.training
    model.eval()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        if stage == "diffusion":
            gen = torch.Generator().manual_seed(0)
            losses = []
            for ratio in (0.15, 0.5, 0.9):
                m = (torch.rand(w.shape, generator=gen) < ratio).to(device)
                logits = model(input_ids=torch.where(m, mask_id, w)).logits.float()
                losses.append(F.cross_entropy(logits[m], w[m]).item())
            loss = sum(losses) / len(losses)
        else:
            logits = model(input_ids=w[:, :-1]).logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1)).item()
    model.train(was)
    return loss


@torch.no_grad()
def holdout_masked_acc(model, holdout: torch.Tensor, seq_len: int, mask_id: int,
                       top_token: int) -> dict:
    """Masked top-1 accuracy at 15 / 50 / 90 % masking on fixed held-out windows and masks, with
    the unigram baseline (always `top_token`, the most frequent training token) beside each."""
    n = min(FINETUNE_HOLDOUT_WINDOWS, len(holdout) // seq_len)
    w = holdout[: n * seq_len].view(n, seq_len).to(next(model.parameters()).device)
    was = model.training
    model.eval()
    out = {}
    for ratio in tiny_eval.RATIOS:
        m = tiny_eval.random_masks(w.shape, ratio, seed=0).to(w.device)
        pct = int(ratio * 100)
        correct = 0
        for i in range(0, n, 16):
            wb, mb = w[i:i + 16], m[i:i + 16]
            logits = AlignedLogits(model)(input_ids=torch.where(mb, mask_id, wb)).logits[mb]
            correct += (logits.argmax(-1) == wb[mb]).sum().item()
        out[f"masked_acc_{pct}"] = correct / m.sum().item()
        out[f"unigram_acc_{pct}"] = (w[m] == top_token).float().mean().item()
    model.train(was)
    return out


def selection_score(acc: dict, key: str) -> float:
    """What early stopping maximises: accuracy `key`, or -inf while the accuracy at 15 % or 50 %
    masking is less than GUARD_MARGIN above the unigram baseline (no trading those away)."""
    for pct in (15, 50):
        if acc[f"masked_acc_{pct}"] - acc[f"unigram_acc_{pct}"] < GUARD_MARGIN:
            return float("-inf")
    return acc[key]


class Progress:
    """tqdm bar on a terminal, a plain line every `every` steps in a log file; shows the loss
    (smoothed) and tokens/s (over the last few steps)."""

    def __init__(self, name: str, total: int, start: int, every: int = 25):
        self.every, self.name, self.total = every, name, total
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc=name, dynamic_ncols=True)
        self.loss = None
        self.window_tokens, self.window_start = 0, time.time()

    def update(self, step: int, loss: float, tokens: int, lr: float):
        self.loss = loss if self.loss is None else 0.9 * self.loss + 0.1 * loss
        self.window_tokens += tokens
        tok_s = self.window_tokens / max(time.time() - self.window_start, 1e-9)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{self.loss:.3f}", tok_s=f"{tok_s:.0f}", lr=f"{lr:.1e}")
        elif step % self.every == 0 or step == self.total:
            print(f"[{self.name}] step {step}/{self.total} loss {self.loss:.4f} "
                  f"{tok_s:.0f} tok/s lr {lr:.2e}", flush=True)
        if step % self.every == 0:
            self.window_tokens, self.window_start = 0, time.time()

    def close(self):
        if self.bar is not None:
            self.bar.close()


def train_model(stage: str, model, data: torch.Tensor, r: dict, args, ckpt_dir: Path,
                mask_id: int | None = None, teacher=None, holdout: torch.Tensor | None = None) -> dict:
    """The training loop shared by the three models. Returns training facts for the card.

    With `r["eval_every"]` and a `holdout` stream, the held-out loss is measured every so many
    steps and the best weights are the ones kept (early stopping); `r["max_seconds"]` caps the
    training time of the stage."""
    device = getattr(args, "device", "cpu") or "cpu"
    gen = torch.Generator().manual_seed(args.seed + STAGES.index(stage))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=r["lr"], betas=(0.9, 0.95), fused=device == "cuda" or None)
    step, tokens_seen, elapsed = 0, 0, 0.0
    best = dict(loss=float("inf"), step=0, state=None, acc=None)
    select = r.get("select")  # None: lowest held-out loss; else the accuracy to maximise
    top_token = int(torch.bincount(data.cpu()).argmax()) if select else None
    ckpt = ckpt_dir / stage / "ckpt.pt"
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        gen.set_state(state["gen"])
        step, tokens_seen, elapsed = state["step"], state["tokens_seen"], state["elapsed"]
        if state.get("best"):
            best.update(state["best"])
        print(f"[{stage}] resumed from {ckpt} at step {step}", flush=True)

    def save_ckpt():
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = ckpt.with_suffix(".tmp")
        # the best weights travel too, so a resumed run still knows what to beat
        torch.save(dict(model=model.state_dict(), optim=opt.state_dict(), gen=gen.get_state(),
                        step=step, tokens_seen=tokens_seen, elapsed=elapsed, recipe=r,
                        best=best), tmp)
        os.replace(tmp, ckpt)

    def check_holdout():
        acc = None
        if select:
            acc = holdout_masked_acc(model, holdout, r["seq_len"], mask_id, top_token)
            loss = -selection_score(acc, select)  # lower is better, like a loss
        else:
            loss = holdout_loss(stage, model, holdout, r["seq_len"], mask_id, device, amp)
        if loss < best["loss"] or best["state"] is None:
            best.update(loss=loss, step=step, acc=acc,
                        state={k: v.detach().clone() for k, v in model.state_dict().items()})
        what = (" ".join(f"{k} {v:.4f}" for k, v in acc.items()) if acc
                else f"held-out loss {loss:.4f}")
        print(f"[{stage}] step {step} {what} (best {best['loss']:.4f} at step {best['step']})",
              flush=True)

    amp = args.bf16
    eval_every = r.get("eval_every") if holdout is not None else None
    max_seconds = r.get("max_seconds") or getattr(args, "max_seconds", None)
    hooks = add_dropout(model, r.get("dropout", 0.0))
    loads: list[float] = []  # machine load during training, for the card
    model.train()
    bar = Progress(stage, r["steps"], step)
    if select and best["state"] is None:
        check_holdout()  # the starting weights are a candidate: fine-tuning must beat them
    t_last = time.time()
    while step < r["steps"] and not (max_seconds and elapsed >= max_seconds):
        lr = lr_at(step, r, elapsed / max_seconds if max_seconds else 0.0)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = get_batch(data, r["batch_size"], r["seq_len"], gen)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            if stage == "diffusion":
                attend = None
                if r.get("anneal"):
                    # the same progress the cosine follows: steps or time, whichever is further
                    progress = max(step / r["steps"], elapsed / max_seconds if max_seconds else 0)
                    attend = annealed_mask(r["batch_size"], r["seq_len"],
                                           progress / r["anneal"], gen)
                loss = diffusion_loss(model, batch, mask_id, gen, r["eps"], r["prefix_share"],
                                      r.get("high_mask_share", 0.0), r.get("high_t", 0.7),
                                      attend=attend)
            else:
                loss = causal_loss(model, batch, teacher, r.get("distill", 0.0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += r["batch_size"] * r["seq_len"]
        # loss.item() waits for the step, so the clock below counts GPU time too
        bar.update(step, loss.item(), r["batch_size"] * r["seq_len"], lr)
        now = time.time()
        elapsed, t_last = elapsed + (now - t_last), now
        if step % 10 == 0 and hasattr(os, "getloadavg"):
            loads.append(os.getloadavg()[0])
        if eval_every and step % eval_every == 0:
            check_holdout()
            t_last = time.time()  # held-out checks are not training time
        if step % args.ckpt_every == 0 or step == r["steps"]:
            save_ckpt()
    for h in hooks:
        h.remove()
    if eval_every:
        if step % eval_every:
            check_holdout()
        model.load_state_dict(best["state"])
    bar.close()
    model.eval()
    facts = dict(steps=step, batch_size=r["batch_size"], seq_len=r["seq_len"],
                 tokens_seen=tokens_seen, train_seconds=round(elapsed, 1), lr=r["lr"],
                 min_lr=r["min_lr"], warmup=r["warmup"], weight_decay=r["weight_decay"],
                 bf16_autocast=bool(amp),
                 mean_load_avg=round(sum(loads) / len(loads), 2) if loads else None,
                 cpu_shared=device == "cpu" and bool(loads)
                 and sum(loads) / len(loads) > torch.get_num_threads() + 0.5)
    if r.get("dropout"):
        facts["dropout"] = r["dropout"]
    if max_seconds:
        facts["max_seconds"] = max_seconds
    if eval_every and select:
        facts.update(early_stopping=True, best_step=best["step"], selected_by=select,
                     guard_margin=GUARD_MARGIN,
                     holdout_acc={k: round(v, 5) for k, v in best["acc"].items()},
                     holdout_tokens=min(FINETUNE_HOLDOUT_WINDOWS,
                                        len(holdout) // r["seq_len"]) * r["seq_len"])
    elif eval_every:
        facts.update(early_stopping=True, best_step=best["step"],
                     holdout_loss=round(best["loss"], 5), holdout_tokens=len(holdout))
    return facts


def save_model(stage: str, model, tokenizer, out: Path) -> Path:
    path = out / NAMES[stage]
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    for p in (tmp, old):
        shutil.rmtree(p, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # swap the finished directory in (others may be loading the previous one meanwhile)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def evaluate_aligned(path: Path, val_ids, train_ids, facts: dict, n_windows: int,
                     sample_tokens: int) -> dict:
    """tiny_eval's diffusion figures and samples for a model read with shifted logits (its
    model card assumes the bundled recipe, so only eval.json is written). The same windows,
    masks and scoring as `tiny_eval.compute_figures`, through `AlignedLogits`."""
    from transformers import AutoTokenizer

    model = AlignedLogits(tiny_eval.load(path, "diffusion"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    mask_id = tokenizer.mask_token_id
    windows = tiny_eval.val_windows(val_ids, facts["seq_len"], n_windows)
    uni = tiny_eval.unigram_logprobs(train_ids, model.config.vocab_size)
    figs: dict = {}
    for ratio in tiny_eval.RATIOS:
        m = tiny_eval.random_masks(windows.shape, ratio)
        pct = int(ratio * 100)
        figs[f"masked_acc_{pct}"], figs[f"masked_ce_{pct}"] = tiny_eval.masked_scores(
            model, windows, m, mask_id)
        figs[f"unigram_acc_{pct}"] = (windows[m] == int(uni.argmax())).float().mean().item()
        figs[f"unigram_ce_{pct}"] = -uni[windows[m]].mean().item()
    p = min(tiny_eval.SUFFIX_PREFIX, facts["seq_len"] // 2)
    m = torch.zeros(windows.shape, dtype=torch.bool)
    m[:, p:] = True
    figs["suffix_masked_acc"] = tiny_eval.masked_accuracy(model, windows, m, mask_id)
    figs["suffix_first_token_acc"] = tiny_eval._first_token_acc(model, windows, m, p, mask_id)
    samples = [dict(prompt=q, greedy=tiny_eval.diffusion_generate(model, tokenizer, q,
                                                                   sample_tokens),
                    sampled=tiny_eval.diffusion_generate(model, tokenizer, q, sample_tokens,
                                                         temperature=0.8, seed=i))
               for i, q in enumerate(tiny_eval.PROMPTS)]
    result = dict(model=path.name, kind="diffusion",
                  figures={k: round(v, 5) for k, v in figs.items()},
                  sample=dict(split="validation (assets/corpus/split.json)",
                              windows=len(windows), seq_len=facts["seq_len"],
                              tokens=windows.numel(), mask_seed=tiny_eval.MASK_SEED,
                              logits_shifted=True),
                  training=facts, sample_tokens=sample_tokens, samples=samples)
    (path / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# ----------------------------------------------------------------------------------------------
# Driver


def hardware(threads: int, device: str = "cpu") -> str:
    """One line naming what trained the model, for the card."""
    if device == "cuda":
        return f"1x {torch.cuda.get_device_name()} (CUDA), torch {torch.__version__}"
    name = platform.processor() or "CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{threads}-core CPU ({name}), torch {torch.__version__}"


def cpu_has_bf16() -> bool:
    """bf16 autocast pays off only with native bf16 (AVX512-BF16 / AMX); elsewhere it is slower."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:
        return False


def parse_only(values) -> list[str]:
    if not values:
        return list(STAGES)
    chosen = set()
    for v in values:
        for s in v.split(","):
            s = s.strip()
            if s not in STAGES:
                raise SystemExit(f"--only: unknown stage {s!r} (choose from {', '.join(STAGES)})")
            chosen.add(s)
    return [s for s in STAGES if s in chosen]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="where the model directories are written (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true",
                        help="toy sizes on a slice of the corpus: a few steps each, seconds")
    parser.add_argument("--only", action="append", metavar="STAGE",
                        help="tokenizer, target, draft, diffusion (repeatable or comma list)")
    parser.add_argument("--steps", type=int, help="override the number of steps of each model")
    parser.add_argument("--ckpt-dir", help=f"checkpoint directory (default: {DEFAULT_CKPT}; "
                        "with --smoke: OUT/_checkpoints)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, metavar="DIR",
                        help="resume from the checkpoints in --ckpt-dir (or in DIR)")
    parser.add_argument("--ckpt-every", type=int, default=100, help="steps between checkpoints")
    parser.add_argument("--lr", type=float, help="override the peak learning rate (min = lr/10)")
    parser.add_argument("--distill", type=float,
                        help="draft: weight of KL(target || draft) in the loss (default 0.5)")
    parser.add_argument("--prefix-share", type=float,
                        help="diffusion: share of clean-prefix / masked-suffix sequences "
                             "(default 0.25)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false",
                        help="train in plain fp32 (default: bf16 autocast where the CPU has it)")
    parser.add_argument("--no-eval", dest="eval", action="store_false",
                        help="skip the validation figures / model card")
    parser.add_argument("--eval-only", action="store_true",
                        help="no training: recompute eval.json and README.md of the models in "
                             "--out (keeps their recorded training facts)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="train on the CPU (default) or a CUDA GPU (bf16 autocast)")
    parser.add_argument("--recipe", default=None,
                        choices=("cpu", "gpu", "finetune", "grow", "from_ar"),
                        help="model sizes and schedule: cpu (the bundled models' recipe), gpu "
                             "(bigger, many epochs, dropout, early stopping; ~4-5 min on an H200) "
                             "finetune (diffusion only: continue from the model in --out, "
                             "mostly high masking ratios), grow (the same after doubling the "
                             "model's depth) or from_ar (diffusion: start from the causal target "
                             "mapped into ModernBERT, shifted logits, attention annealed from "
                             "causal to full; 40 min cap; eval.json only, no card); default: "
                             "gpu with --device cuda, else cpu")
    parser.add_argument("--init-from", metavar="DIR",
                        help="--recipe finetune / grow: the model directory to start from "
                             "(default: the one in --out); from_ar: the causal model to map "
                             "(default: the target in --out)")
    parser.add_argument("--max-seconds", type=float,
                        help="cap the training time of each model (the schedule follows it)")
    parser.set_defaults(bf16=None, eval=True)


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    stages = parse_only(args.only)
    if getattr(args, "eval_only", False):
        stages = [s for s in stages if s != "tokenizer"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(args.resume, str):
        args.ckpt_dir = args.resume
    ckpt_dir = Path(args.ckpt_dir or (out / "_checkpoints" if args.smoke else DEFAULT_CKPT))
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    args.device = getattr(args, "device", "cpu") or "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    recipe_name = getattr(args, "recipe", None) or ("gpu" if args.device == "cuda" else "cpu")
    if args.bf16 is None:
        args.bf16 = args.device == "cuda" or (cpu_has_bf16() and not args.smoke)
    torch.manual_seed(args.seed)

    t0 = time.time()
    train_docs, val_docs = load_corpus(smoke=args.smoke)
    if "tokenizer" in stages:
        tokenizer = train_tokenizer(train_docs, recipe("tokenizer", args.smoke)["vocab_size"])
        for name in NAMES.values():
            tokenizer.save_pretrained(out / name)
        print(f"[tokenizer] vocab {len(tokenizer)} saved to {out}/*/ ({time.time() - t0:.1f}s)",
              flush=True)
    else:
        tokenizer = load_tokenizer(out)
    train_ids = torch.from_numpy(encode_docs(tokenizer, train_docs))
    val_ids = torch.from_numpy(encode_docs(tokenizer, val_docs))
    print(f"[data] train {len(train_ids):,} tokens, validation {len(val_ids):,} tokens", flush=True)
    eval_windows = tiny_eval.SMOKE_WINDOWS if args.smoke else tiny_eval.CARD_WINDOWS
    sample_tokens = 4 if args.smoke else tiny_eval.SAMPLE_TOKENS

    for stage in stages[stages.index("tokenizer") + 1 if "tokenizer" in stages else 0:]:
        r = recipe(stage, args.smoke, recipe_name)
        if getattr(args, "eval_only", False):
            facts = json.loads((out / NAMES[stage] / "eval.json").read_text())["training"]
            figures = tiny_eval.evaluate(stage, out, val_ids, train_ids, facts,
                                         n_windows=eval_windows, sample_tokens=sample_tokens)
            print(f"[{stage}] {json.dumps(figures['figures'])}", flush=True)
            continue
        if args.steps:
            r["steps"] = args.steps
            r["warmup"] = min(r["warmup"], max(1, args.steps // 10))
        if getattr(args, "lr", None):
            r["lr"], r["min_lr"] = args.lr, args.lr / 10
        if stage == "draft" and args.distill is not None:
            r["distill"] = args.distill
        if stage == "diffusion" and args.prefix_share is not None:
            r["prefix_share"] = args.prefix_share
        if getattr(args, "max_seconds", None):
            r["max_seconds"] = args.max_seconds
        torch.manual_seed(args.seed + STAGES.index(stage))  # deterministic init
        base_facts, grown = None, None
        if r.get("init_from"):
            init = Path(getattr(args, "init_from", None) or out / NAMES[stage])
            if not (init / "config.json").exists():
                raise SystemExit(f"--recipe {recipe_name}: no model to start from at {init}")
            model = tiny_eval.load(init, KINDS[stage]).train()
            if (init / "eval.json").exists():
                base_facts = json.loads((init / "eval.json").read_text())["training"]
            r["arch"] = (base_facts or {}).get("arch") or r.get("arch")
            if r.get("deepen"):
                layers = model.config.num_hidden_layers
                model = deepen(model, **r["deepen"])
                r["arch"] = dict(r["arch"], num_hidden_layers=model.config.num_hidden_layers,
                                 layer_types=list(model.config.layer_types))
                grown = dict(r["deepen"], from_layers=layers,
                             to_layers=model.config.num_hidden_layers)
                print(f"[{stage}] deepened {layers} -> {model.config.num_hidden_layers} layers",
                      flush=True)
        elif r.get("from_ar"):
            source = Path(getattr(args, "init_from", None) or out / NAMES["target"])
            if not (source / "config.json").exists():
                raise SystemExit(f"--recipe {recipe_name}: no causal model to start from at "
                                 f"{source}")
            model = diffusion_from_causal(tiny_eval.load(source, "causal")).train()
            base_facts = {"source": str(source)}
            if (source / "eval.json").exists():
                base_facts = json.loads((source / "eval.json").read_text())["training"]
            r["arch"] = dict(hidden_size=model.config.hidden_size,
                             intermediate_size=model.config.intermediate_size,
                             num_hidden_layers=model.config.num_hidden_layers,
                             num_attention_heads=model.config.num_attention_heads,
                             layer_types=list(model.config.layer_types),
                             hidden_activation="silu", logits_shifted=True)
            print(f"[{stage}] initialised from the causal model {source} (shifted logits, "
                  f"attention annealed causal -> full over {r['anneal']:.0%} of the run)",
                  flush=True)
        else:
            model = build_model(stage, r["arch"], tokenizer)
        teacher = None
        if stage == "draft" and r.get("distill", 0) > 0:
            teacher = tiny_eval.load(out / NAMES["target"], "causal").to(args.device)
        print(f"[{stage}] {NAMES[stage]}: {n_params(model):,} parameters"
              + (", distilled from the target" if teacher is not None else ""), flush=True)
        data, holdout = train_ids, None
        if r.get("eval_every"):
            data, holdout = holdout_split(train_ids)
        model.to(args.device)
        facts = train_model(stage, model, data.to(args.device), r, args, ckpt_dir,
                            mask_id=tokenizer.mask_token_id, teacher=teacher, holdout=holdout)
        model.to("cpu")
        facts.update(parameters=n_params(model), hardware=hardware(threads, args.device),
                     seed=args.seed, recipe=recipe_name,
                     architecture=type(model).__name__, arch=r["arch"],
                     train_tokens_available=len(data), smoke=bool(args.smoke))
        if stage == "draft":
            facts["distill"] = r["distill"] if teacher is not None else 0.0
            if (out / NAMES["target"] / "config.json").exists():
                target = teacher or tiny_eval.load(out / NAMES["target"], "causal")
                facts["size_ratio"] = round(n_params(target) / n_params(model), 1)
        if stage == "diffusion":
            facts.update(eps=r["eps"], prefix_share=r["prefix_share"])
            if r.get("high_mask_share"):
                facts.update(high_mask_share=r["high_mask_share"], high_t=r["high_t"])
        if base_facts is not None:
            # the card tells both runs: how the starting model was trained, then this one
            facts["finetuned_from"] = base_facts
        if grown:
            facts["deepened"] = grown
        if r.get("from_ar"):
            facts.update(from_causal=True, anneal=r["anneal"], logits_shifted=True)
        path = save_model(stage, model, tokenizer, out)
        print(f"[{stage}] saved {path} ({facts['train_seconds']:.0f}s training)", flush=True)
        if args.eval and is_shifted(model):
            figures = evaluate_aligned(path, val_ids, train_ids, facts, eval_windows,
                                       sample_tokens)
            print(f"[{stage}] {json.dumps(figures['figures'])}", flush=True)
        elif args.eval:
            figures = tiny_eval.evaluate(stage, out, val_ids, train_ids, facts,
                                         n_windows=eval_windows, sample_tokens=sample_tokens)
            print(f"[{stage}] {json.dumps(figures['figures'])}", flush=True)
    print(f"[done] {time.time() - t0:.0f}s", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m playground.train_tiny",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
