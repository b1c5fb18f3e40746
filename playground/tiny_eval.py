"""Validation figures, samples and model cards for the bundled tiny models.

Everything here is deterministic: the validation sample is a fixed set of evenly spaced
256-token windows of the held-out split (assets/corpus/split.json), masks come from a fixed
seed, and models are evaluated in fp32. The slow test recomputes these figures and compares
them with the eval.json written next to each model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from playground.tiny_data import NAMES, encode_docs, load_corpus

CARD_WINDOWS = 64    # validation windows used for the card figures
SMOKE_WINDOWS = 2
MASK_SEED = 1234
RATIOS = (0.15, 0.5, 0.9)
SUFFIX_PREFIX = 128  # "prompt then masks": first 128 tokens clean, the rest masked
PROMPTS = ["ROMEO.\n", "HAMLET.\nTo be, or not to be", "KING HENRY.\nNow, my lords,"]
SAMPLE_TOKENS = 32


def load(path, kind: str):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    cls = AutoModelForCausalLM if kind == "causal" else AutoModelForMaskedLM
    return cls.from_pretrained(path, dtype=torch.float32).eval()


def corpus_ids(tokenizer, smoke: bool = False):
    """(train_ids, val_ids) token streams, exactly as training sees them."""
    train_docs, val_docs = load_corpus(smoke=smoke)
    return (torch.from_numpy(encode_docs(tokenizer, train_docs)),
            torch.from_numpy(encode_docs(tokenizer, val_docs)))


def val_windows(val_ids: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    """n evenly spaced, non-overlapping windows of the validation stream, shape (n, seq_len)."""
    all_w = val_ids[: len(val_ids) // seq_len * seq_len].view(-1, seq_len)
    n = min(n, len(all_w))
    idx = torch.linspace(0, len(all_w) - 1, n).round().long().unique()
    return all_w[idx]


def _batches(windows, bs=16):
    for i in range(0, len(windows), bs):
        yield windows[i:i + bs]


# ---------------------------------------------------------------------------- causal figures

@torch.no_grad()
def perplexity(model, windows) -> tuple[float, float]:
    total, count = 0.0, 0
    for w in _batches(windows):
        logits = model(input_ids=w).logits[:, :-1].float()
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1),
                                 reduction="sum").item()
        count += w[:, 1:].numel()
    loss = total / count
    return loss, float(torch.tensor(loss).exp())


@torch.no_grad()
def agreement(target, draft, windows) -> float:
    """How often the draft's top-1 next token equals the target's, over every position."""
    same, count = 0, 0
    for w in _batches(windows):
        a = target(input_ids=w).logits.argmax(-1)
        b = draft(input_ids=w).logits.argmax(-1)
        same += (a == b).sum().item()
        count += a.numel()
    return same / count


@torch.no_grad()
def causal_samples(model, tokenizer, n_new=SAMPLE_TOKENS, seed=0) -> list[dict]:
    out = []
    for i, prompt in enumerate(PROMPTS):
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                                do_sample=False, pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(seed + i)
        sampled = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                                 do_sample=True, temperature=0.8, top_k=50, top_p=1.0,
                                 pad_token_id=tokenizer.pad_token_id)
        out.append(dict(prompt=prompt,
                        greedy=tokenizer.decode(greedy[0, ids.shape[1]:]),
                        sampled=tokenizer.decode(sampled[0, ids.shape[1]:])))
    return out


# ------------------------------------------------------------------------- diffusion figures

def random_masks(shape, ratio: float, seed: int = MASK_SEED) -> torch.Tensor:
    """Exactly round(ratio * T) masked positions per row, chosen at random with a fixed seed."""
    gen = torch.Generator().manual_seed(seed + int(ratio * 1000))
    n, T = shape
    k = max(1, round(ratio * T))
    order = torch.rand(n, T, generator=gen).argsort(dim=1)
    masks = torch.zeros(n, T, dtype=torch.bool)
    masks.scatter_(1, order[:, :k], True)
    return masks


@torch.no_grad()
def masked_scores(model, windows, masks, mask_id: int) -> tuple[float, float]:
    """(top-1 accuracy, cross-entropy in nats) over the masked positions, one forward pass."""
    correct, nll, count = 0, 0.0, 0
    for w, m in zip(_batches(windows), _batches(masks)):
        x = torch.where(m, torch.full_like(w, mask_id), w)
        logits = model(input_ids=x).logits[m].float()
        correct += (logits.argmax(-1) == w[m]).sum().item()
        nll += F.cross_entropy(logits, w[m], reduction="sum").item()
        count += m.sum().item()
    return correct / count, nll / count


def masked_accuracy(model, windows, masks, mask_id: int) -> float:
    return masked_scores(model, windows, masks, mask_id)[0]


def unigram_logprobs(train_ids: torch.Tensor, vocab_size: int):
    """The unigram baseline: add-one smoothed training-token frequencies. Its top-1 prediction
    is the most frequent training token, at every position."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1
    return (counts / counts.sum()).log().float()


@torch.no_grad()
def diffusion_generate(model, tokenizer, prompt: str, n_new: int = SAMPLE_TOKENS,
                       temperature: float = 0.0, seed: int = 0) -> str:
    """Prompt + n_new masks; each step fills the ONE masked position the model is most
    confident about (greedy: max probability; sampled: the probability of the sampled token)."""
    gen = torch.Generator().manual_seed(seed)
    mask_id = tokenizer.mask_token_id
    prompt_ids = tokenizer(prompt)["input_ids"]
    x = torch.tensor([prompt_ids + [mask_id] * n_new])
    banned = [tokenizer.mask_token_id, tokenizer.pad_token_id]
    for _ in range(n_new):
        masked = (x[0] == mask_id).nonzero().squeeze(1)
        logits = model(input_ids=x).logits[0, masked].float()
        logits[:, banned] = float("-inf")
        if temperature > 0:
            probs = F.softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            conf = probs.gather(1, tok[:, None]).squeeze(1)
        else:
            conf, tok = F.softmax(logits, dim=-1).max(-1)
        j = int(conf.argmax())
        x[0, masked[j]] = tok[j]
    return tokenizer.decode(x[0, len(prompt_ids):])


# ------------------------------------------------------------------------------ evaluation

def compute_figures(stage: str, out: Path, val_ids, train_ids, n_windows: int,
                    seq_len: int) -> dict:
    from transformers import AutoTokenizer

    out = Path(out)
    windows = val_windows(val_ids, seq_len, n_windows)
    figs: dict = {}
    if stage in ("target", "draft"):
        model = load(out / NAMES[stage], "causal")
        figs["val_loss"], figs["val_perplexity"] = perplexity(model, windows)
        if stage == "draft":
            target = load(out / NAMES["target"], "causal")
            figs["target_val_loss"], figs["target_val_perplexity"] = perplexity(target, windows)
            figs["agreement_top1"] = agreement(target, model, windows)
    else:
        model = load(out / NAMES[stage], "diffusion")
        mask_id = AutoTokenizer.from_pretrained(out / NAMES[stage]).mask_token_id
        uni = unigram_logprobs(train_ids, model.config.vocab_size)
        for r in RATIOS:
            m = random_masks(windows.shape, r)
            pct = int(r * 100)
            figs[f"masked_acc_{pct}"], figs[f"masked_ce_{pct}"] = masked_scores(
                model, windows, m, mask_id)
            figs[f"unigram_acc_{pct}"] = (windows[m] == int(uni.argmax())).float().mean().item()
            figs[f"unigram_ce_{pct}"] = -uni[windows[m]].mean().item()
        # the decoders' situation: a clean prompt, then a block of masks, one forward pass
        p = min(SUFFIX_PREFIX, seq_len // 2)
        m = torch.zeros(windows.shape, dtype=torch.bool)
        m[:, p:] = True
        figs["suffix_masked_acc"] = masked_accuracy(model, windows, m, mask_id)
        figs["suffix_first_token_acc"] = _first_token_acc(model, windows, m, p, mask_id)
    return dict(figures={k: round(v, 5) for k, v in figs.items()},
                sample=dict(split="validation (assets/corpus/split.json)", windows=len(windows),
                            seq_len=seq_len, tokens=windows.numel(), mask_seed=MASK_SEED,
                            selection="evenly spaced non-overlapping windows of the "
                                      "validation token stream"))


@torch.no_grad()
def _first_token_acc(model, windows, m, p, mask_id) -> float:
    x = torch.where(m, torch.full_like(windows, mask_id), windows)
    correct = 0
    for xb, wb in zip(_batches(x), _batches(windows)):
        correct += (model(input_ids=xb).logits[:, p].argmax(-1) == wb[:, p]).sum().item()
    return correct / len(windows)


def evaluate(stage: str, out: Path, val_ids, train_ids, facts: dict, n_windows: int,
             sample_tokens: int = SAMPLE_TOKENS) -> dict:
    """Compute figures and samples, write eval.json and README.md into the model directory."""
    from transformers import AutoTokenizer

    out = Path(out)
    path = out / NAMES[stage]
    result = compute_figures(stage, out, val_ids, train_ids, n_windows, facts["seq_len"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    if stage == "diffusion":
        model = load(path, "diffusion")
        samples = [dict(prompt=p, greedy=diffusion_generate(model, tokenizer, p, sample_tokens),
                        sampled=diffusion_generate(model, tokenizer, p, sample_tokens,
                                                   temperature=0.8, seed=i))
                   for i, p in enumerate(PROMPTS)]
    else:
        samples = causal_samples(load(path, "causal"), tokenizer, sample_tokens)
    result = dict(model=NAMES[stage], kind="diffusion" if stage == "diffusion" else "causal",
                  **result, training=facts, sample_tokens=sample_tokens, samples=samples)
    old = path / "eval.json"
    if old.exists() and "ablation" in json.loads(old.read_text()):
        # measured once by hand for this very model (see docs/models.md); kept on re-evaluation
        result["ablation"] = json.loads(old.read_text())["ablation"]
    (path / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    (path / "README.md").write_text(model_card(stage, result))
    return result


# ------------------------------------------------------------------------------ model card

def model_card(stage: str, ev: dict) -> str:
    f, t, s = ev["figures"], ev["training"], ev["sample"]
    name = ev["model"]
    arch = ", ".join(f"{k}={v}" for k, v in t["arch"].items())
    lines = [
        "---", "library_name: transformers", "language: en",
        f"pipeline_tag: {'fill-mask' if stage == 'diffusion' else 'text-generation'}",
        "tags: [playground, tiny, shakespeare]", "---", "",
        f"# {name}", "",
    ]
    if stage == "target":
        lines += ["The autoregressive **target** model of Decoder Playground: a tiny Llama-style "
                  "causal LM trained from scratch on Shakespeare's complete works.", ""]
    elif stage == "draft":
        lines += ["The **draft** model for speculative decoding against `tiny-shakespeare`: the "
                  "same tokenizer, about "
                  f"{_ratio(ev)}x fewer parameters, trained on the same data"
                  + (f" and **distilled from the target's logits** (loss = {1 - t['distill']:.2g}"
                     f" x cross-entropy + {t['distill']:.2g} x KL(target || draft))"
                     if t.get("distill") else "") + ".", ""]
    else:
        lines += ["A bidirectional **masked-diffusion LM** (MDLM / LLaDA objective) for the "
                  f"playground's diffusion decoders. It is a plain `{t['architecture']}` "
                  "(`AutoModelForMaskedLM`, no remote code); its mask token is `<|mask|>`.", ""]
    trained = f"minutes on {_machine(t)}"
    if t.get("finetuned_from"):
        trained = (f"minutes on {_machine(t['finetuned_from'])}, then "
                   f"{t['train_seconds'] / 60:.0f} minutes more on {_machine(t)}")
    lines += [
        f"**Not a useful language model** — {t['parameters'] / 1e6:.2f}M parameters trained for "
        f"{trained}. It exists so every decoder family runs on real, trained distributions "
        "offline, in tests and demos.", "",
        "## Recipe", "",
        f"- Architecture: `{t['architecture']}` ({arch}, vocab {f_vocab(ev)}, "
        "max_position_embeddings 512, tied input/output embeddings)",
        f"- Parameters: {t['parameters']:,}",
        f"- Tokenizer: byte-level BPE, 4,096 tokens, special tokens `<|endoftext|>` (eos/bos), "
        "`<|mask|>`, `<|pad|>`; shared by the three bundled models",
        "- Data: Shakespeare's complete works (public domain; `assets/corpus/`), training split "
        f"= all but the last 5% of every work ({t['train_tokens_available']:,} tokens)",
        f"- Training: {t['steps']} steps x {t['batch_size']} sequences x {t['seq_len']} tokens = "
        f"**{t['tokens_seen']:,} tokens seen**; AdamW (0.9, 0.95), lr {t['lr']} warmup "
        f"{t['warmup']} cosine to {t['min_lr']}, weight decay {t['weight_decay']}, grad clip 1.0"
        + (", bf16 autocast" if t.get("bf16_autocast") else "")
        + (f", residual dropout {t['dropout']} (training-time hooks; nothing in the config)"
           if t.get("dropout") else "")
        + (f"; capped at {t['max_seconds']:.0f} s, the cosine following the time"
           if t.get("max_seconds") else ""),
    ]
    if t.get("finetuned_from"):
        lines += _finetune_lines(t)
    elif t.get("early_stopping"):
        lines += [f"- Early stopping: the last {t['holdout_tokens']:,} tokens of the training "
                  "stream are held out (not trained on); their loss is measured periodically during training "
                  f"steps and the best weights are kept (step {t['best_step']}, held-out loss "
                  f"{t['holdout_loss']:.4f}). The validation split below is never used to choose."]
    if stage == "diffusion":
        grown = t.get("deepened")
        local = [str(i + 1) for i, kind in enumerate(t["arch"].get("layer_types", []))
                 if kind == "sliding_attention"]
        lines += [
            "- Attention: "
            + (f"layers {', '.join(local)} "
               "use sliding-window attention (+-8 tokens), the others (every layer inserted by "
               "the growth among them) full attention"
               if grown else "the first layers use sliding-window attention (+-8 tokens), the "
               "last ones full attention")
            + ". With full attention only (BertForMaskedLM, tried first) the "
            "model stayed on the unigram plateau for 900 steps — masked accuracy equal to the "
            "unigram baseline — while the local layers let it use its neighbours from the start.",
            f"- Objective: per sequence t ~ U({t['eps']}, 1), each token masked independently "
            "with probability t, cross-entropy on masked positions weighted 1/t (averaged over "
            f"all maskable positions). {t['prefix_share']:.0%} of the sequences keep a clean "
            "prefix of random length and only the suffix is masked (LLaDA SFT style), meant to "
            "match how the diffusion decoders use the model (prompt, then masks)"
            + (" — see the measurement below." if ev.get("ablation") else "."),
        ]
        if t.get("high_mask_share"):
            lines += [f"- High masking ratios: {t['high_mask_share']:.0%} of the sequences draw "
                      f"t ~ U({t['high_t']}, 1) instead, since diffusion decoding starts from a "
                      "fully masked canvas."]
    lines += [
        f"- Wall time: {t['train_seconds'] / 60:.1f} minutes of training on {t['hardware']}"
        + (f"; mean 1-minute load average during training {t['mean_load_avg']:.1f}"
           if t.get("mean_load_avg") is not None else "")
        + (" (the CPU was shared with other jobs, so the time is indicative)"
           if t.get("cpu_shared") else ""),
        f"- Seed: {t['seed']}. Retrain: `python -m playground.train_tiny --only {stage} "
        + ("--device cuda` (recipe `gpu`; the whole GPU run: `scripts/gpu_session.sh`)"
           if t.get("recipe") == "gpu" else
           f"--recipe {t['recipe']} --threads 2 --max-seconds {t.get('max_seconds', 0):.0f}` "
           "after the starting model's own recipe (`--device cuda`, recipe `gpu`)"
           if t.get("recipe") in ("finetune", "grow") else "--threads 2`")
        + " (see docs/models.md).", "",
        "## Validation figures", "",
        f"Measured in fp32 on {s['windows']} evenly spaced {s['seq_len']}-token windows "
        f"({s['tokens']:,} tokens) of the held-out split (last 5% of every work); recomputed by "
        "`tests/test_tiny_models.py` (slow) against `eval.json`.", "",
        "| figure | value |", "|---|---|",
    ]
    if stage == "target":
        lines += [f"| validation perplexity | {f['val_perplexity']:.2f} |",
                  f"| validation loss (nats/token) | {f['val_loss']:.4f} |"]
    elif stage == "draft":
        lines += [f"| validation perplexity (draft) | {f['val_perplexity']:.2f} |",
                  f"| validation perplexity (target) | {f['target_val_perplexity']:.2f} |",
                  f"| draft–target top-1 agreement | {f['agreement_top1']:.3f} |"]
    else:
        lines += [f"| top-1 accuracy on masked positions, {int(r * 100)}% masked | "
                  f"{f[f'masked_acc_{int(r * 100)}']:.3f} (unigram baseline "
                  f"{f[f'unigram_acc_{int(r * 100)}']:.3f}) |" for r in RATIOS]
        lines += [f"| cross-entropy on masked positions (nats), {int(r * 100)}% masked | "
                  f"{f[f'masked_ce_{int(r * 100)}']:.3f} (unigram baseline "
                  f"{f[f'unigram_ce_{int(r * 100)}']:.3f}) |" for r in RATIOS]
        lines += [f"| 128 clean tokens then 128 masks, one pass: accuracy on the masks | "
                  f"{f['suffix_masked_acc']:.3f} |",
                  f"| ... accuracy on the first masked token | {f['suffix_first_token_acc']:.3f} |"]
    if ev.get("ablation"):
        ab = ev["ablation"]
        keys = ab["figures"]
        lines += ["", f"### {ab['title']}", "", ab["note"], "",
                  "| " + " | ".join(["variant"] + keys) + " |",
                  "|" + "---|" * (len(keys) + 1)]
        lines += ["| " + " | ".join([row["variant"]] + [f"{row[k]:.3f}" for k in keys]) + " |"
                  for row in ab["rows"]]
    lines += ["", "## Samples", ""]
    if stage == "diffusion":
        lines += [f"{ev['sample_tokens']} masks after the prompt, filled one token per step, "
                  "the most confident position first (greedy: argmax; sampled: temperature 0.8, seed = "
                  "prompt index).", ""]
    else:
        lines += [f"{ev['sample_tokens']} new tokens; greedy, and sampled with temperature 0.8, "
                  "top-k 50 (seed = prompt index).", ""]
    for smp in ev["samples"]:
        for mode in ("greedy", "sampled"):
            lines += [f"**{mode}**, prompt `{smp['prompt']!r}`:", "", "```",
                      smp["prompt"] + smp[mode], "```", ""]
    return "\n".join(lines)


def _finetune_lines(t: dict) -> list[str]:
    """Card lines for a model fine-tuned from an earlier one (`train_tiny --recipe finetune`):
    how the starting model was trained, then how the fine-tuning chose its weights."""
    b, acc = t["finetuned_from"], t["holdout_acc"]
    return [
        f"- Starting model: {b['steps']} steps x {b['batch_size']} x {b['seq_len']} tokens "
        f"({b['tokens_seen']:,} tokens seen, recipe `{b.get('recipe')}`, lr {b['lr']} cosine to "
        f"{b['min_lr']}, dropout {b.get('dropout', 0.0)}, {b['train_seconds'] / 60:.1f} min on "
        f"{b['hardware']}); then **fine-tuned** (recipe `{t['recipe']}`) with the training line "
        "above.",
        f"- Early stopping: held-out windows ({t['holdout_tokens']:,} tokens) from the tail of "
        "the training split, not trained on, fixed masks; every few steps their masked accuracy "
        f"is measured and the step with the best `{t['selected_by']}` is kept among those still "
        f">= {t['guard_margin']} above the unigram baseline at 15 % and 50 % masking (step "
        f"{t['best_step']}: {acc['masked_acc_15']:.3f} / {acc['masked_acc_50']:.3f} / "
        f"{acc['masked_acc_90']:.3f} at 15 / 50 / 90 %, unigram {acc['unigram_acc_15']:.3f} / "
        f"{acc['unigram_acc_50']:.3f} / {acc['unigram_acc_90']:.3f}). Step 0, the starting "
        "model, is a candidate too. The validation split below is never used to choose.",
    ] + ([_growth_line(t["deepened"])] if t.get("deepened") else [])


def _machine(facts: dict) -> str:
    """'one GPU' or 'a CPU': where a training run recorded in `facts` ran."""
    return "one GPU" if "CUDA" in facts.get("hardware", "") else "a CPU"


def _growth_line(g: dict) -> str:
    """Card line for a model deepened before fine-tuning (`train_tiny --recipe grow`)."""
    return (f"- Growth: before that fine-tuning the starting model's {g['from_layers']} layers "
            f"became {g['to_layers']}: after each of layers "
            f"{', '.join(str(i + 1) for i in g['after'])} a copy of it was inserted "
            f"({g['layer_type'].replace('_', ' ')}), its attention and MLP output projections "
            "zeroed, so the deeper model started out computing exactly what the starting model "
            "computes (`train_tiny.deepen`).")


def _ratio(ev) -> str:
    return str(ev["training"].get("size_ratio", "?"))


def f_vocab(ev) -> str:
    return "4,096" if not ev["training"].get("smoke") else "512 (smoke)"
