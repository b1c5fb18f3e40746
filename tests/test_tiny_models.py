"""The bundled tiny models (assets/models/) and the training module that makes them."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

from playground import tiny_eval, train_tiny

MODELS = Path(__file__).resolve().parent.parent / "assets" / "models"
CAUSAL = ["tiny-shakespeare", "tiny-shakespeare-draft"]
ALL = CAUSAL + ["tiny-shakespeare-diffusion"]
TEXTS = [
    "ROMEO: Ô café — naïve 日本",
    "  two leading spaces,\ttabs\n\nand a trailing space ",
    "HAMLET.\nTo be, or not to be, that is the question:",
    "emoji 🎭 and <|mask|> and <|endoftext|> inside",
]


@pytest.fixture(scope="module")
def tokenizers():
    return {name: AutoTokenizer.from_pretrained(MODELS / name) for name in ALL}


def test_bundled_files_and_size():
    total = 0
    for name in ALL:
        d = MODELS / name
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "README.md", "eval.json"):
            assert (d / f).is_file(), f"{name}/{f} missing"
        total += sum(p.stat().st_size for p in d.iterdir() if p.is_file())
    assert total <= 40 * 1024 * 1024, f"bundled models take {total / 2**20:.1f} MB"


def test_share_one_tokenizer(tokenizers):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        texts = {(MODELS / n / f).read_text() for n in ALL}
        assert len(texts) == 1, f"the three models must ship the same {f}"
    vocabs = [t.get_vocab() for t in tokenizers.values()]
    assert all(v == vocabs[0] for v in vocabs)
    for tok in tokenizers.values():
        assert len(tok) == 4096
        assert (tok.eos_token, tok.mask_token, tok.pad_token) == ("<|endoftext|>", "<|mask|>",
                                                                  "<|pad|>")
        assert (tok.eos_token_id, tok.mask_token_id, tok.pad_token_id) == (0, 1, 2)
        assert tok("ROMEO.")["input_ids"] == tok("ROMEO.", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips(tokenizers, text):
    tok = tokenizers["tiny-shakespeare"]
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_models_load_offline_and_generate(tokenizers, name):
    model = AutoModelForCausalLM.from_pretrained(MODELS / name).eval()
    assert model.config.playground_kind == "causal"
    assert model.config.max_position_embeddings >= 512
    tok = tokenizers[name]
    ids = torch.tensor([tok("ROMEO.\n")["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                         do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (1, ids.shape[1] + 6)
    assert isinstance(tok.decode(out[0, ids.shape[1]:]), str)


def test_draft_is_five_to_ten_times_smaller():
    sizes = [train_tiny.n_params(AutoModelForCausalLM.from_pretrained(MODELS / n)) for n in CAUSAL]
    assert 5 <= sizes[0] / sizes[1] <= 10


def test_diffusion_model_loads_offline_and_unmasks(tokenizers):
    name = "tiny-shakespeare-diffusion"
    model = AutoModelForMaskedLM.from_pretrained(MODELS / name).eval()
    tok = tokenizers[name]
    assert model.config.playground_kind == "diffusion"
    assert model.config.max_position_embeddings >= 512
    assert tok.mask_token == "<|mask|>" and tok.mask_token_id == 1
    enc = tok("HAMLET.\n")
    assert set(enc) == {"input_ids", "attention_mask"}  # no token_type_ids to trip a model
    ids = torch.tensor([enc["input_ids"] + [tok.mask_token_id] * 8])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        with_types = model(input_ids=ids, token_type_ids=torch.ones_like(ids)).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.allclose(logits, with_types), "token_type_ids must be harmless"
    text = tiny_eval.diffusion_generate(model, tok, "HAMLET.\n", n_new=4)
    assert isinstance(text, str) and "<|mask|>" not in text


def test_models_load_by_name_through_the_playground():
    from playground.core.models import load_model

    for name in ALL:
        handle = load_model(name, device="cpu")
        assert handle.kind == ("diffusion" if "diffusion" in name else "causal")
        assert handle.vocab_size == 4096
        logits = handle.forward(handle.encode("JULIET.\n")).logits
        assert logits.shape[-1] == 4096
    assert load_model("tiny-shakespeare-diffusion", device="cpu").mask_token_id == 1


def test_train_tiny_smoke_end_to_end(tmp_path):
    """`train-tiny --smoke` writes three loadable model directories, then resumes."""
    import argparse

    parser = argparse.ArgumentParser()
    train_tiny.add_arguments(parser)
    assert train_tiny.run(parser.parse_args(["--smoke", "--out", str(tmp_path)])) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "tiny-shakespeare-diffusion")
    for name in ALL:
        d = tmp_path / name
        assert json.loads((d / "eval.json").read_text())["figures"]
        assert (d / "README.md").read_text().startswith("---")
        assert (d / "tokenizer.json").read_text() == (
            tmp_path / "tiny-shakespeare" / "tokenizer.json").read_text()
    causal = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny-shakespeare")
    ids = torch.tensor([tok("ROMEO.\n")["input_ids"]])
    assert causal.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                           do_sample=False).shape[1] == ids.shape[1] + 3
    masked = AutoModelForMaskedLM.from_pretrained(tmp_path / "tiny-shakespeare-diffusion")
    assert masked.config.playground_kind == "diffusion"
    assert tok.decode(tok(TEXTS[0])["input_ids"]) == TEXTS[0]

    # resume: the checkpoint of the 4-step run continues to 6 steps
    args = parser.parse_args(["--smoke", "--out", str(tmp_path), "--only", "target",
                              "--steps", "6", "--resume", "--no-eval"])
    assert train_tiny.run(args) == 0
    state = torch.load(tmp_path / "_checkpoints" / "target" / "ckpt.pt", weights_only=False)
    assert state["step"] == 6 and state["tokens_seen"] == 6 * 4 * 64


def test_only_parsing():
    assert train_tiny.parse_only(None) == list(train_tiny.STAGES)
    assert train_tiny.parse_only(["draft,target", "diffusion"]) == ["target", "draft",
                                                                     "diffusion"]
    with pytest.raises(SystemExit):
        train_tiny.parse_only(["nope"])


# ------------------------------------------------------------------- the model-card figures

@pytest.fixture(scope="module")
def corpus(tokenizers):
    return tiny_eval.corpus_ids(tokenizers["tiny-shakespeare"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["target", "draft", "diffusion"])
def test_model_card_figures_reproduce(corpus, stage):
    train_ids, val_ids = corpus
    saved = json.loads((MODELS / train_tiny.NAMES[stage] / "eval.json").read_text())
    again = tiny_eval.compute_figures(stage, MODELS, val_ids, train_ids,
                                      saved["sample"]["windows"], saved["sample"]["seq_len"])
    assert again["sample"]["tokens"] == saved["sample"]["tokens"]
    for key, value in saved["figures"].items():
        assert again["figures"][key] == pytest.approx(value, rel=0.01, abs=0.005), key
    f = saved["figures"]
    if stage == "draft":
        assert f["agreement_top1"] >= 0.5
        assert f["target_val_perplexity"] < 0.9 * f["val_perplexity"]
    if stage == "diffusion":
        for r in (15, 50, 90):  # the unigram baseline predicts the most frequent token
            assert f[f"masked_acc_{r}"] > 1.15 * f[f"unigram_acc_{r}"]
            assert f[f"masked_ce_{r}"] < f[f"unigram_ce_{r}"] - 0.1


# ------------------------------------------------------------------- the GPU recipe (issue 17)

def test_gpu_recipe_fits_the_size_budget(tokenizers):
    """Built at full size (not trained): each model.safetensors under 15 MB in fp32, all three
    under 60 MB, the draft at least 5x smaller than the target."""
    tok = tokenizers["tiny-shakespeare"]
    sizes = {}
    for stage in ("target", "draft", "diffusion"):
        model = train_tiny.build_model(stage, train_tiny.recipe(stage, False, "gpu")["arch"], tok)
        sizes[stage] = train_tiny.n_params(model)
    assert all(4 * n < 15e6 for n in sizes.values()), sizes
    assert 4 * sum(sizes.values()) < 60e6
    assert sizes["target"] >= 5 * sizes["draft"]


def test_gpu_recipe_smoke_keeps_the_best_held_out_weights(tmp_path):
    """`--recipe gpu` trains with held-out early stopping and says so in eval.json and the card."""
    import argparse
    import shutil

    for name in ALL:  # the shared tokenizer, as the GPU session starts from the bundled one
        (tmp_path / name).mkdir()
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(MODELS / name / f, tmp_path / name / f)
    parser = argparse.ArgumentParser()
    train_tiny.add_arguments(parser)
    args = parser.parse_args(["--smoke", "--recipe", "gpu", "--only", "target", "--out",
                              str(tmp_path), "--steps", "3", "--threads", "1"])
    assert train_tiny.run(args) == 0
    ev = json.loads((tmp_path / "tiny-shakespeare" / "eval.json").read_text())
    t = ev["training"]
    assert t["recipe"] == "gpu" and t["early_stopping"] and 1 <= t["best_step"] <= 3
    assert t["holdout_tokens"] > 0 and t["dropout"] > 0
    assert "Early stopping" in (tmp_path / "tiny-shakespeare" / "README.md").read_text()


def test_get_batch_windows_are_slices_of_the_stream():
    data = torch.arange(1000)
    batch = train_tiny.get_batch(data, 4, 16, torch.Generator().manual_seed(0))
    assert batch.shape == (4, 17)
    assert ((batch[:, 1:] - batch[:, :-1]) == 1).all()


# ------------------------------------------------------- the CPU fine-tuning recipe (issue 17)

def _smoke_diffusion(tmp_path):
    """A smoke tokenizer + diffusion model in tmp_path, with its eval.json, to fine-tune."""
    import argparse

    parser = argparse.ArgumentParser()
    train_tiny.add_arguments(parser)
    assert train_tiny.run(parser.parse_args(["--smoke", "--only", "tokenizer,diffusion",
                                             "--out", str(tmp_path), "--threads", "1"])) == 0
    return parser


def test_finetune_recipe_continues_from_the_model_and_keeps_the_best(tmp_path):
    """`--recipe finetune` starts from the model in --out (not a fresh init), selects by held-out
    90 % accuracy with step 0 as a candidate, and the card tells both runs and how to redo it."""
    parser = _smoke_diffusion(tmp_path)
    d = tmp_path / "tiny-shakespeare-diffusion"
    before = AutoModelForMaskedLM.from_pretrained(d).state_dict()
    args = parser.parse_args(["--smoke", "--recipe", "finetune", "--only", "diffusion",
                              "--out", str(tmp_path), "--steps", "3", "--threads", "1"])
    assert train_tiny.run(args) == 0
    t = json.loads((d / "eval.json").read_text())["training"]
    assert t["recipe"] == "finetune" and t["finetuned_from"]["recipe"] == "cpu"
    assert t["selected_by"] == "masked_acc_90" and t["best_step"] in (0, 3)
    assert set(t["holdout_acc"]) == {f"{k}_{p}" for k in ("masked_acc", "unigram_acc")
                                     for p in (15, 50, 90)}
    assert t["high_mask_share"] >= 0.5 and t["steps"] == 3
    after = AutoModelForMaskedLM.from_pretrained(d).state_dict()
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    assert unchanged == (t["best_step"] == 0)
    card = (d / "README.md").read_text()
    assert "fine-tuned" in card and "--recipe finetune" in card


def test_finetune_recipe_is_for_the_diffusion_model_only(tmp_path):
    with pytest.raises(SystemExit, match="finetune"):
        train_tiny.recipe("target", False, "finetune")
    import argparse

    parser = argparse.ArgumentParser()
    train_tiny.add_arguments(parser)
    args = parser.parse_args(["--smoke", "--recipe", "finetune", "--only", "diffusion", "--out",
                              str(tmp_path), "--init-from", str(tmp_path / "nothing")])
    for name in ALL:  # a tokenizer is there, a model to start from is not
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(
            (MODELS / name / "tokenizer.json").read_text())
    with pytest.raises(SystemExit, match="no model to start from"):
        train_tiny.run(args)


def test_deepen_starts_as_exactly_the_same_model_and_its_new_layers_learn(tokenizers):
    """`deepen` inserts full-attention copies with zeroed output projections: the deeper model's
    logits equal the original's bit for bit, yet gradients reach the inserted layers."""
    torch.manual_seed(0)
    arch = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                local_attention=16, layer_types=["sliding_attention", "full_attention",
                                                 "sliding_attention"])
    model = train_tiny.build_model("diffusion", arch, tokenizers["tiny-shakespeare"]).eval()
    for p in model.parameters():  # trained-looking weights, not the near-zero init
        p.data.normal_(0, 0.2)
    grown = train_tiny.deepen(model, after=[0, 2], layer_type="full_attention").eval()
    assert grown.config.num_hidden_layers == 5
    assert list(grown.config.layer_types) == ["sliding_attention", "full_attention",
                                              "full_attention", "sliding_attention",
                                              "full_attention"]
    assert grown.config.playground_kind == "diffusion"
    x = torch.randint(3, 4096, (2, 40))
    x[:, ::2] = tokenizers["tiny-shakespeare"].mask_token_id
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, grown(input_ids=x).logits)
    grown.train()
    grown(input_ids=x).logits.logsumexp(-1).sum().backward()
    for new in (1, 4):
        assert grown.model.layers[new].attn.Wo.weight.grad.abs().sum() > 0
        assert grown.model.layers[new].mlp.Wo.weight.grad.abs().sum() > 0
    assert same_weights(model.model.layers[2], grown.model.layers[3])


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_grow_recipe_deepens_then_fine_tunes_and_the_card_says_so(tmp_path):
    """`--recipe grow` starts from the model in --out, doubles its depth, fine-tunes with the
    held-out selection, and saves a loadable deeper model whose card tells the growth."""
    parser = _smoke_diffusion(tmp_path)
    d = tmp_path / "tiny-shakespeare-diffusion"
    layers = AutoModelForMaskedLM.from_pretrained(d).config.num_hidden_layers
    args = parser.parse_args(["--smoke", "--recipe", "grow", "--only", "diffusion",
                              "--out", str(tmp_path), "--steps", "3", "--threads", "1"])
    assert train_tiny.run(args) == 0
    t = json.loads((d / "eval.json").read_text())["training"]
    assert t["recipe"] == "grow" and t["finetuned_from"]["recipe"] == "cpu"
    assert t["deepened"]["from_layers"] == layers and t["deepened"]["to_layers"] == 2 * layers
    assert t["arch"]["num_hidden_layers"] == 2 * layers
    assert AutoModelForMaskedLM.from_pretrained(d).config.num_hidden_layers == 2 * layers
    card = (d / "README.md").read_text()
    assert "Growth:" in card and "--recipe grow" in card and "recipe `grow`" in card


def test_selection_refuses_trading_low_masking_accuracy_away():
    good = dict(masked_acc_15=0.40, unigram_acc_15=0.11, masked_acc_50=0.30, unigram_acc_50=0.11,
                masked_acc_90=0.15, unigram_acc_90=0.11)
    assert train_tiny.selection_score(good, "masked_acc_90") == 0.15
    worse_at_50 = dict(good, masked_acc_50=0.15, masked_acc_90=0.20)
    assert train_tiny.selection_score(worse_at_50, "masked_acc_90") == float("-inf")
