"""The CLI: one clear line on stderr and exit status 2 for every bad input; JSON output."""

from __future__ import annotations

import json
import runpy
import sys

import pytest

from playground.cli import main


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer):
    from conftest import build_llama

    d = tmp_path_factory.mktemp("llama")
    build_llama(tokenizer).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory, tokenizer):
    from transformers import BertConfig, BertForMaskedLM

    d = tmp_path_factory.mktemp("bert")
    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertForMaskedLM(cfg).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return str(d)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_generate_json(capsys, llama_dir):
    code, out, err = run_cli(capsys, "generate", "--model", llama_dir, "--decoder", "greedy",
                             "--prompt", "ROMEO:", "--max-new-tokens", "6", "--json")
    assert code == 0, err
    trace = json.loads(out)
    assert trace["decoder"] == "greedy" and trace["schema"] == 1
    assert len(trace["output_ids"]) <= 6
    assert trace["stats"]["target_forwards"] == len(trace["steps"])


@pytest.mark.parametrize("argv,needles", [
    (["--decoder", "nope"], ["unknown decoder", "nope"]),
    (["--decoder", "greedy", "--param", "bogus=1"], ["no knob", "bogus"]),
    (["--prompt", ""], ["prompt is empty"]),
    (["--prompt", "   "], ["prompt is empty"]),
    (["--max-new-tokens", "0"], ["max_new_tokens"]),
    (["--max-new-tokens", "abc"], ["invalid int"]),
    (["--max-new-tokens", "1000"], ["exceeds the context"]),
    (["--param", "noequals"], ["NAME=VALUE"]),
    (["--decoder", "top_k", "--param", "k=inf"], ["'k' must be an integer"]),
    (["--decoder", "top_k", "--param", "k=nan"], ["'k' must be an integer"]),
    (["--decoder", "top_k", "--param", "k=2.5"], ["'k' must be an integer"]),
    (["--decoder", "top_k", "--param", "k=0"], ["out of range"]),
])
def test_generate_bad_input(capsys, llama_dir, argv, needles):
    base = ["generate", "--model", llama_dir, "--prompt", "ROMEO:", "--max-new-tokens", "4"]
    code, out, err = run_cli(capsys, *(base + argv))
    one_line_error(code, err, *needles)


def test_prompt_longer_than_context(capsys, llama_dir):
    code, _, err = run_cli(capsys, "generate", "--model", llama_dir, "--prompt", "Romeo " * 400,
                           "--max-new-tokens", "4")
    one_line_error(code, err, "exceeds the context")


def test_missing_model_path(capsys):
    code, _, err = run_cli(capsys, "generate", "--model", "/no/such/model", "--prompt", "hi")
    one_line_error(code, err, "does not exist")


def test_diffusion_model_for_ar_decoder(capsys, mlm_dir):
    code, _, err = run_cli(capsys, "generate", "--model", mlm_dir, "--decoder", "greedy", "--prompt", "hi")
    one_line_error(code, err, "is a diffusion model", "causal model is needed")


def test_hub_id_offline_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(capsys, "generate", "--model", "no-such-org/no-such-model-xyz", "--prompt", "hi")
    one_line_error(code, err, "could not load", "no-such-org/no-such-model-xyz")


def test_quantization_without_cuda(capsys, llama_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine can quantize")
    code, _, err = run_cli(capsys, "generate", "--model", llama_dir, "--prompt", "hi", "--quantization", "4bit")
    one_line_error(code, err, "CUDA")


def test_list_decoders_json(capsys):
    code, out, _ = run_cli(capsys, "list-decoders", "--json")
    assert code == 0
    specs = {s["name"]: s for s in json.loads(out)}
    assert "greedy" in specs
    for s in specs.values():
        assert {"name", "family", "kind", "params", "reference"} <= set(s)
        for knob in s["params"].values():
            assert {"type", "default", "help"} <= set(knob)


def test_list_models_json(capsys):
    code, out, _ = run_cli(capsys, "list-models", "--json")
    assert code == 0
    names = [m["name"] for m in json.loads(out)]
    assert {"tiny-shakespeare", "tiny-shakespeare-draft", "tiny-shakespeare-diffusion"} <= set(names)


def test_python_dash_m_is_the_same_program(llama_dir, monkeypatch, capsys):
    """``python -m playground`` (playground/__main__.py, run as the interpreter runs it, with
    the arguments in sys.argv) is the console script: same parser, same one-line error, same
    exit status. Run in this process: a fresh interpreter cost ~26 s of imports for one line."""
    monkeypatch.setattr(sys, "argv", ["playground", "generate", "--model", llama_dir, "--decoder", "nope",
                                      "--prompt", "x"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("playground", run_name="__main__", alter_sys=True)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: unknown decoder 'nope'; try `playground list-decoders`"]


def test_compare_numbers_lanes_from_1_as_the_page(capsys):
    """The CLI's lanes are the page's lane 1..N (a preset of four lanes, two tokens each)."""
    from playground.presets import load_preset

    lanes = load_preset("truncation-samplers")["lanes"]
    code, out, err = run_cli(capsys, "compare", "--preset", "truncation-samplers", "--max-new-tokens", "2")
    assert code == 0, err
    heads = [ln for ln in out.splitlines() if ln.startswith("== ")]
    assert [h.split(":")[0] for h in heads] == [f"== lane {j}" for j in range(1, len(lanes) + 1)]
    assert all(f": {lane['decoder']}:" in h for h, lane in zip(heads, lanes))
