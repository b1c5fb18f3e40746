"""ModelHandle: sources, kinds, counting, cache rollback, chat template, detokenization."""

from __future__ import annotations

import pytest
import torch

from playground.errors import PlaygroundError
from playground.models import (IncrementalDetokenizer, detect_kind, handle_from_model, load_model, resolve,
                               token_pieces)


def test_detokenizer_never_shows_broken_characters(tokenizer):
    text = "ROMEO: café — naïve 日本語 wherefore"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = token_pieces(tokenizer, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    # streaming one token at a time gives the same pieces
    det = IncrementalDetokenizer(tokenizer)
    assert [det.push(t) for t in ids] == pieces


def test_detokenizer_keeps_word_spacing_with_context(tokenizer):
    ctx = tokenizer.encode("JULIET: O", add_special_tokens=False)
    ids = tokenizer.encode(" Romeo, Romeo", add_special_tokens=False)
    assert "".join(token_pieces(tokenizer, ids, ctx)) == " Romeo, Romeo"


def test_view_counts_forwards_and_tokens(llama_handle):
    v1, v2 = llama_handle.view(), llama_handle.view()
    v1.forward([1, 2, 3])
    v1.forward(torch.tensor([[4]]))
    v2.forward([5, 6])
    assert (v1.forwards, v1.tokens) == (2, 4)
    assert (v2.forwards, v2.tokens) == (1, 2)


def test_cache_rollback_equals_fresh_prefix(llama_handle):
    from decoders.ar import ARState

    a = ARState(llama_handle.view())
    a.prefill([5, 6, 7, 8, 9])
    a.rollback(3)
    la = a.advance([20])
    b = ARState(llama_handle.view())
    lb = b.prefill([5, 6, 7, 20])
    assert torch.allclose(la, lb, atol=1e-5)
    assert a.ids == [5, 6, 7, 20]


def test_local_directory_and_kind(tmp_path, tokenizer):
    from conftest import build_llama

    build_llama(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    h = load_model(str(tmp_path))
    assert h.kind == "causal" and h.source == "path" and h.device.type == "cpu"
    assert h.dtype == torch.float32
    assert load_model(str(tmp_path)) is h  # LRU
    with pytest.raises(PlaygroundError, match="causal model"):
        load_model(str(tmp_path), kind="diffusion")
    h16 = load_model(str(tmp_path), dtype="bfloat16")
    assert h16.dtype == torch.bfloat16
    with pytest.raises(PlaygroundError, match="unknown dtype"):
        load_model(str(tmp_path), dtype="fp8x")


def test_hf_cache_entry_is_found_offline(tmp_path, tokenizer, monkeypatch):
    from conftest import build_llama

    cache = tmp_path / "hub"
    snap = cache / "models--someorg--tiny-llama" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    build_llama(tokenizer).save_pretrained(snap)
    tokenizer.save_pretrained(snap)
    (cache / "models--someorg--tiny-llama" / "refs").mkdir()
    (cache / "models--someorg--tiny-llama" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    assert resolve("someorg/tiny-llama") == ("cache", "someorg/tiny-llama")
    h = load_model("someorg/tiny-llama")
    assert h.kind == "causal" and h.source == "cache"
    from playground.models import list_cached_models

    assert "someorg/tiny-llama" in list_cached_models()


def test_detect_kind():
    from transformers import BertConfig, LlamaConfig

    assert detect_kind(LlamaConfig()) == "causal"
    assert detect_kind(BertConfig()) == "diffusion"
    cfg = LlamaConfig()
    cfg.playground_kind = "diffusion"
    assert detect_kind(cfg) == "diffusion"


def test_remote_code_models_need_opt_in(tmp_path, tokenizer):
    from transformers import BertConfig

    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64)
    cfg.save_pretrained(tmp_path)
    import json

    data = json.loads((tmp_path / "config.json").read_text())
    data["model_type"] = "llada"
    data["architectures"] = ["LLaDAModelLM"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(PlaygroundError):
        load_model(str(tmp_path))


def test_chat_template(llama_handle, tokenizer):
    with pytest.raises(PlaygroundError, match="no chat template"):
        llama_handle.encode("hello", chat=True)
    tok = type(tokenizer).from_pretrained if False else None  # noqa: F841
    import copy

    t2 = copy.deepcopy(tokenizer)
    t2.chat_template = "{% for m in messages %}USER: {{ m['content'] }}\n{% endfor %}ASSISTANT:"
    h = handle_from_model(llama_handle.model, t2, name="chat")
    ids = h.encode("hello", chat=True)
    assert h.decode(ids) == "USER: hello\nASSISTANT:"


def test_quantization_needs_cuda(tmp_path, tokenizer):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from conftest import build_llama

    build_llama(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(PlaygroundError, match="needs a CUDA GPU"):
        load_model(str(tmp_path), quantization="8bit")
    with pytest.raises(PlaygroundError, match="no CUDA GPU"):
        load_model(str(tmp_path), device="cuda")
