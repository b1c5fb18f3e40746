"""Shared fixtures: tiny randomly initialised models built from configs (no downloads)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

# The browser tests' fixtures (browser, app, page) and helpers live in browser_helpers.py.
pytest_plugins = ["browser_helpers"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n``, on by default in pyproject.toml): each test module runs on one
    worker (``--dist loadgroup``), so its module fixtures are built once. A worker that runs
    browser modules starts its own app and Chromium (session fixtures of browser_helpers). One
    worker for every browser test was tried: their half hour in a row was then the whole
    suite's time, the other worker idle for most of it."""
    if not config.pluginmanager.hasplugin("xdist") or not config.getoption("numprocesses", None):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    # the longest modules first (the browser ones: a minute to several each), so that the last
    # module handed out is a short one and the workers finish together; a module stays in order
    items.sort(key=lambda item: item.get_closest_marker("browser") is None)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; on a shared 2-core machine extra threads only spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SAMPLE_TEXT = (
    "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun.\n"
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father and refuse thy name.\n"
    "HAMLET: To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.\n"
    "MACBETH: Tomorrow, and tomorrow, and tomorrow, creeps in this petty pace from day to day.\n"
) * 4


def build_tokenizer(vocab_size: int = 320):
    """A small byte-level BPE fast tokenizer with eos, mask and pad tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<|endoftext|>", "<|mask|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([SAMPLE_TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   mask_token="<|mask|>", pad_token="<|pad|>")


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


def build_llama(tokenizer, seed: int = 0, layers: int = 2, hidden: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    # Random init gives near-uniform distributions; sharpen them so argmax is well defined.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def build_gpt2(tokenizer, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=256,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.transformer.wte.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def llama_handle(tokenizer):
    from playground.core.models import handle_from_model

    return handle_from_model(build_llama(tokenizer), tokenizer, name="tiny-llama")


@pytest.fixture(scope="session")
def gpt2_handle(tokenizer):
    from playground.core.models import handle_from_model

    return handle_from_model(build_gpt2(tokenizer), tokenizer, name="tiny-gpt2")


# ---------------------------------------------------------------------- the Compare page's handlers
@pytest.fixture(scope="module")
def demo():
    """The whole Gradio app, built once per module (its handlers are driven without a browser)."""
    from playground.ui import build_app

    return build_app()


@pytest.fixture()
def db(tmp_path, monkeypatch):
    """A fresh session database for this test (``PLAYGROUND_DB``)."""
    path = tmp_path / "ui.db"
    monkeypatch.setenv("PLAYGROUND_DB", str(path))
    return path


@pytest.fixture()
def tiny(monkeypatch, llama_handle):
    """Every model name loads the tiny random Llama (no files needed), in the runs and in the
    page's model-info handler; ``missing-model`` fails as a missing path does."""
    import playground.engine
    import playground.ui.lane_config

    def fake_load(spec, **kw):
        if spec == "missing-model":
            from playground.core.errors import PlaygroundError

            raise PlaygroundError("model path 'missing-model' does not exist or has no config.json")
        return llama_handle

    monkeypatch.setattr(playground.engine, "load_model", fake_load)
    monkeypatch.setattr(playground.ui.lane_config, "_load", lambda spec: fake_load(spec))
    return llama_handle


@pytest.fixture
def frame_per_snapshot(monkeypatch):
    """The Run stream sends a frame (its status line) for every snapshot it reads, as it did when
    lane text rode in the frames: a test that acts between frames then acts mid-run, not after
    a tiny model's 200 tokens (a second at the page's own status pace)."""
    import playground.ui.run_handlers as rs

    monkeypatch.setattr(rs, "STATUS_S", 0.0)
