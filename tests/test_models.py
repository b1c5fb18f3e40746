"""ModelHandle: sources, kinds, counting, cache rollback, chat template, detokenization."""

from __future__ import annotations

import pytest
import torch

from playground.core.errors import PlaygroundError
from playground.core.models import (IncrementalDetokenizer, detect_kind, handle_from_model, load_model, resolve,
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
    # opting in to remote code changes nothing for a model without code of its own: one copy
    assert load_model(str(tmp_path), trust_remote_code=True) is h
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
    from playground.core.models import list_cached_models

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


# ---------------------------------------------------------------------- remote code, end to end
REMOTE_CONFIG = '''from transformers import BertConfig


class LLaDAConfig(BertConfig):
    model_type = "llada"
'''
REMOTE_MODEL = '''from transformers import BertForMaskedLM

from .configuration_llada import LLaDAConfig


class LLaDAModelLM(BertForMaskedLM):
    config_class = LLaDAConfig
'''


@pytest.fixture(scope="module")
def remote_code_dir(tmp_path_factory, tokenizer):
    """A LLaDA-typed masked LM whose config and model classes live in the folder's own code."""
    import json

    from transformers import BertConfig, BertForMaskedLM

    d = tmp_path_factory.mktemp("own-code-llada")
    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(cfg).save_pretrained(d)
    tokenizer.save_pretrained(d)
    (d / "configuration_llada.py").write_text(REMOTE_CONFIG)
    (d / "modeling_llada.py").write_text(REMOTE_MODEL)
    data = json.loads((d / "config.json").read_text())
    data.update(model_type="llada", architectures=["LLaDAModelLM"],
                auto_map={"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"})
    (d / "config.json").write_text(json.dumps(data))
    return str(d)


def test_a_model_with_its_own_code_loads_only_when_opted_in(remote_code_dir, monkeypatch):
    from playground.core.models import LLADA_MASK_ID, model_info

    for call in (lambda: load_model(remote_code_dir), lambda: model_info(remote_code_dir)):
        with pytest.raises(PlaygroundError, match=r"needs its own code: opt in to remote code") as err:
            call()
        assert "\n" not in str(err.value)
    info = model_info(remote_code_dir, trust_remote_code=True)
    assert info["remote_code"] is True and info["kind"] == "diffusion" and info["model_type"] == "llada"
    h = load_model(remote_code_dir, trust_remote_code=True)
    assert type(h.model).__name__ == "LLaDAModelLM" and h.kind == "diffusion"
    assert h.mask_token_id == LLADA_MASK_ID
    assert h.forward([1, 2, 3]).logits.shape[:2] == (1, 3)
    # where the host disallows remote code, both the opt-in and the model are refused in one line
    monkeypatch.setenv("PLAYGROUND_ALLOW_REMOTE_CODE", "0")
    with pytest.raises(PlaygroundError, match=r"^remote code is disabled on this instance$"):
        load_model(remote_code_dir, trust_remote_code=True)
    with pytest.raises(PlaygroundError, match=r"needs its own code \(trust_remote_code\), and remote code is "
                                              r"disabled on this instance$"):
        load_model(remote_code_dir)


def test_model_info_says_whether_chat_and_remote_code_apply(tmp_path, tokenizer):
    import copy

    from conftest import build_llama

    from playground.core.models import model_info

    plain, chat = tmp_path / "plain", tmp_path / "chat"
    t2 = copy.deepcopy(tokenizer)
    t2.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for folder, tok in ((plain, tokenizer), (chat, t2)):
        build_llama(tok).save_pretrained(folder)
        tok.save_pretrained(folder)
    assert model_info(str(plain))["chat_template"] is False and model_info(str(plain))["remote_code"] is False
    assert model_info(str(chat))["chat_template"] is True


def test_hub_id_with_remote_code_fails_fast_offline(monkeypatch):
    import huggingface_hub.constants as c

    from playground.core.models import model_info

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    for call in (lambda: load_model("GSAI-ML/LLaDA-8B-Instruct", trust_remote_code=True),
                 lambda: model_info("GSAI-ML/LLaDA-8B-Instruct", trust_remote_code=True)):
        with pytest.raises(PlaygroundError, match=r"'GSAI-ML/LLaDA-8B-Instruct'.*HF_HUB_OFFLINE is set") as err:
            call()
        assert "\n" not in str(err.value)


def test_end_of_turn_ids_from_the_generation_config(llama_handle, tokenizer):
    from transformers import GenerationConfig

    model = llama_handle.model
    before = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig(eos_token_id=[tokenizer.eos_token_id, 7])
    try:
        h = handle_from_model(model, tokenizer, name="eot")
    finally:
        model.generation_config = before
    assert h.eos_ids == {tokenizer.eos_token_id, 7}


def test_every_name_the_project_imports_from_playground_models_exists():
    # The package re-exports the public names of its modules (once a single models.py); scan the project so a
    # name someone imports (lazily, in a test, in a bench) cannot go missing unnoticed.
    import ast
    from pathlib import Path

    import playground.core.models as models

    root = Path(__file__).resolve().parent.parent
    wanted: set[str] = set()
    for folder in ("playground", "decoders", "visualizers", "tests"):
        for f in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "playground.core.models" and not node.level:
                    wanted.update(a.name for a in node.names)
    assert {"load_model", "handle_from_model", "BUNDLED_DIR", "crop_cache"} <= wanted
    assert sorted(n for n in wanted if not hasattr(models, n)) == []
