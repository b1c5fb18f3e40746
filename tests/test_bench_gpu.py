"""`playground bench --suite gpu`: one line and no write without CUDA; the code path at toy sizes
on the CPU (PLAYGROUND_BENCH_GPU_CPU=1 --quick), as the GPU run will take it."""

from __future__ import annotations

import argparse

import pytest
import torch

from playground import bench
from playground.bench import gpu


def _args(tmp_path, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(["--suite", "gpu", "--out", str(tmp_path / "bench.md"), *extra])


def test_gpu_suite_is_discovered():
    assert "gpu" in bench.suites()


def test_without_cuda_it_skips_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(gpu.FORCE_CPU_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    doc = tmp_path / "bench.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:gpu -->\nH200 figures\n<!-- /bench:gpu -->\n")
    assert bench.run(_args(tmp_path)) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("Skipped: no CUDA device") and len(out.splitlines()) == 1
    assert "H200 figures" in doc.read_text()  # the figures measured on a GPU stay


@pytest.fixture(scope="module")
def quick_cpu_section(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv(gpu.FORCE_CPU_ENV, "1")
    try:
        tmp = tmp_path_factory.mktemp("bench-gpu")
        args = _args(tmp, "--quick", "--no-write")
        return gpu.run_suite(args)
    finally:
        mp.undo()


def test_quick_cpu_path_runs_every_part(quick_cpu_section):
    text = quick_cpu_section
    assert "did not complete" not in text, text
    for title in ("### Traced greedy vs transformers `generate`", "### Speculative decoding",
                  "### `device_map=\"auto\"` under a memory budget",
                  "### Diffusion sampler on a LLaDA-sized masked model"):
        assert title in text
    assert "8-bit / 4-bit: skipped" in text  # bitsandbytes' layers are not run on the CPU


def _rows(text: str, first_cell: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(f"| {first_cell}")]


def test_traced_greedy_and_lossless_speculation_match_generate(quick_cpu_section):
    (greedy,) = _rows(quick_cpu_section, "fp32")
    assert greedy[4] == "yes"  # playground greedy == transformers generate, token for token
    spec = _rows(quick_cpu_section, "independent") + _rows(quick_cpu_section, "truncated copy")
    assert len(spec) == 2
    for row in spec:
        assert float(row[1]) >= 1.0  # tokens per target forward
        assert row[5] == "yes"  # speculative at temperature 0 equals greedy


def test_truncated_draft_shares_the_targets_weights():
    tok = gpu._tokenizer()
    target = gpu.build_causal(gpu.TINY_TARGET, tok, "cpu", torch.float32)
    draft = gpu.truncated_copy(target, 2)
    assert draft.config.num_hidden_layers == 2
    assert draft.model.layers[1].self_attn.q_proj.weight is target.model.layers[1].self_attn.q_proj.weight
    ids = torch.tensor([[5, 6, 7]])
    assert draft(input_ids=ids).logits.shape == (1, 3, len(tok))
