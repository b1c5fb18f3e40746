"""``playground bench --suite gpu``: the decoders on a GPU, with models built from config.

Nothing is downloaded: every model is random-initialised from a config, directly on the device,
with the bundled tokenizer (vocabulary 4,096). Measured, each with its peak GPU memory:

- a ~1 B-parameter Llama-shaped target (TinyLlama's shape: 22 layers, hidden 2048, GQA 32/4) in
  bf16: tokens/s of the playground's traced ``greedy`` against transformers ``generate``, run
  alternately, and their ratio;
- the same weights loaded in 8-bit and 4-bit (NF4) through bitsandbytes: the same comparison;
- ``speculative`` with two ~100 M drafts of the same shape: an independent random one, and a
  truncated copy (the target's embeddings, first 2 layers and head, sharing its weights);
  tokens per target forward and speed against greedy;
- the diffusion sampler (``llada``) on a LLaDA-sized (~7 B) bidirectional masked model;
- ``device_map="auto"`` with a ``max_memory`` budget smaller than the model: layers split across
  the GPU and the CPU; it runs, and how fast.

Random weights make text and acceptance meaningless as quality; they are reported as measured.
Without CUDA the suite skips with one line; ``--quick`` with ``PLAYGROUND_BENCH_GPU_CPU=1``
runs the same code path at toy sizes on the CPU (what the tests do).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from playground.bench import machine_line
from playground.core.models import BUNDLED_DIR, handle_from_model
from playground.engine import prepare

DESCRIPTION = ("GPU: ~1B Llama bf16 / 8-bit / 4-bit, traced greedy vs generate, speculative with a "
               "~100M draft, diffusion on a ~7B masked model, device_map=auto over GPU+CPU, peak memory")

FORCE_CPU_ENV = "PLAYGROUND_BENCH_GPU_CPU"
PARTS_ENV = "PLAYGROUND_BENCH_GPU_PARTS"
PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks? It is the east, and"

# (name, config kwargs) at full size and at --quick-on-CPU size
TARGET = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
              num_attention_heads=32, num_key_value_heads=4)
DRAFT = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=4)
MASKED = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
              num_attention_heads=32)
TINY_TARGET = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2)
TINY_DRAFT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1)
TINY_MASKED = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4)
TRUNCATED_LAYERS = 2


def skip_reason(force_cpu: bool) -> str | None:
    """Why the suite cannot run here (None when it can)."""
    if force_cpu:
        return None
    if not torch.cuda.is_available():
        return (f"Skipped: no CUDA device (torch {torch.__version__} sees none); run it on a GPU "
                f"machine, or set {FORCE_CPU_ENV}=1 with --quick for a CPU smoke of the code path.")
    return None


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BUNDLED_DIR / "tiny-shakespeare")


def _ids(tok: Any) -> dict[str, int]:
    return dict(vocab_size=len(tok), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)


def build_causal(arch: dict[str, Any], tok: Any, device: str, dtype: torch.dtype) -> Any:
    """A random Llama built from config straight on ``device`` in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(max_position_embeddings=2048, tie_word_embeddings=False, **_ids(tok), **arch)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


def build_masked(arch: dict[str, Any], tok: Any, device: str, dtype: torch.dtype) -> Any:
    """A random bidirectional masked LM (ModernBERT, full attention everywhere) on ``device``."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    n = arch["num_hidden_layers"]
    config = ModernBertConfig(max_position_embeddings=2048, cls_token_id=tok.eos_token_id,
                              sep_token_id=tok.eos_token_id, layer_types=["full_attention"] * n,
                              **_ids(tok), **arch)
    with torch.device(device):
        model = ModernBertForMaskedLM._from_config(config, dtype=dtype)
    model.config.playground_kind = "diffusion"
    return model.eval()


def truncated_copy(target: Any, layers: int) -> Any:
    """A draft made of the target's embeddings, first ``layers`` layers, final norm and head;
    it shares the target's tensors, so it costs no memory."""
    from transformers import LlamaForCausalLM

    config = target.config.__class__(**{**target.config.to_dict(), "num_hidden_layers": layers})
    with torch.device("meta"):
        draft = LlamaForCausalLM(config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(list(target.model.layers[:layers]))
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    return draft.eval()


def n_params(model: Any) -> int:
    """Distinct parameters of a model."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def ours(handle: Any, decoder: str, n: int, draft: Any = None, params: dict[str, Any] | None = None
         ) -> dict[str, Any]:
    """One traced run of a playground decoder (fixed length); wall time includes preparation."""
    _sync(str(handle.device.type))
    t0 = time.perf_counter()
    r = prepare(model=handle, decoder=decoder, prompt=PROMPT, max_new_tokens=n, seed=0,
                draft=draft, params=params or {})
    r.ctx.stop_ids = set()  # fixed length, as generate with eos_token_id=None
    tr = r.finish()
    _sync(str(handle.device.type))
    s = tr.stats
    return {"wall": time.perf_counter() - t0, "new": s["new_tokens"], "tf": s["target_forwards"],
            "df": s.get("draft_forwards", 0), "out": list(tr.output_ids)}


def hf_generate(handle: Any, n: int) -> dict[str, Any]:
    """transformers ``generate``, greedy, fixed length, timed from the prompt text."""
    device = str(handle.device.type)
    _sync(device)
    t0 = time.perf_counter()
    ids = torch.tensor([handle.encode(PROMPT)], device=handle.device)
    with torch.inference_mode():
        out = handle.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                    min_new_tokens=n, do_sample=False, eos_token_id=None,
                                    pad_token_id=handle.tokenizer.pad_token_id)
    _sync(device)
    new = out[0, ids.shape[1]:].tolist()
    return {"wall": time.perf_counter() - t0, "new": len(new), "out": new}


def alternate(fns: dict[str, Callable[[], dict[str, Any]]], repeats: int) -> dict[str, dict[str, Any]]:
    """Run each function once to warm up, then ``repeats`` rounds alternating between them, so
    drifts in clocks or load hit all of them alike; keep the median wall time of each."""
    for fn in fns.values():
        fn()
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in fns}
    for _ in range(max(1, repeats)):
        for k, fn in fns.items():
            runs[k].append(fn())
    out = {}
    for k, rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        out[k] = {**rs[-1], "wall": wall, "tok_s": rs[-1]["new"] / wall}
    return out


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _gib(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def _section(name: str, fn: Callable[[], list[str]], lines: list[str], notes: list[str]) -> None:
    """Run one part; a failure becomes a one-line note instead of losing the other parts."""
    t0 = time.perf_counter()
    try:
        new = fn()
        lines += new
        # printed as it comes, so a run cut short by a time limit still leaves its figures
        print("\n".join(new), file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 — a bench part that fails is reported, not fatal
        traceback.print_exc()  # the whole story on stderr; the section keeps one line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        notes.append(f"- {name}: failed — {type(e).__name__}: {first}")
    print(f"[bench gpu] {name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)


def run_suite(args: argparse.Namespace) -> str:
    """Run the suite (or skip it with one line); return its markdown section."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    force_cpu = os.environ.get(FORCE_CPU_ENV, "") not in ("", "0")
    reason = skip_reason(force_cpu)
    if reason:
        args.no_write = True  # a skip must not overwrite the figures measured on a GPU
        return reason
    quick = bool(args.quick)
    device = "cpu" if force_cpu else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tiny = quick and device == "cpu"
    t_arch, d_arch, m_arch = (TINY_TARGET, TINY_DRAFT, TINY_MASKED) if tiny else (TARGET, DRAFT, MASKED)
    n = 16 if quick else 128
    reps = 1 if quick else max(1, min(args.repeats, 3))
    q_n = n if quick else 64  # 8-bit decoding is slow; fewer tokens, one timed run
    s_n = n if quick else 64  # a near-chance draft costs gamma draft forwards per token
    tok = _tokenizer()
    torch.manual_seed(0)
    lines: list[str] = []
    notes: list[str] = []
    started = time.perf_counter()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (forced, toy sizes)"
    header = ["## GPU: ~1B Llama, quantized, speculative, diffusion, offload", "",
              machine_line() + f" Device: {gpu}." + (" Quick run." if quick else ""), ""]

    state: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))

    def part_bf16() -> list[str]:
        _reset_peak(device)
        target = build_causal(t_arch, tok, device, dtype)
        state["target"] = target
        h = handle_from_model(target, tok, name="llama-1b-random", kind="causal")
        state["handle"] = h
        res = alternate({"ours": lambda: ours(h, "greedy", n), "hf": lambda: hf_generate(h, n)}, reps)
        same = res["ours"]["out"] == res["hf"]["out"]
        state["greedy"] = res["ours"]
        return [
            "### Traced greedy vs transformers `generate`", "",
            f"Target: random `LlamaForCausalLM` {_arch(t_arch)}, {n_params(target) / 1e9:.3f} B "
            f"parameters, {dtype_name(dtype)}; {n} new tokens, median of {reps} alternating runs.", "",
            _row("precision", "playground greedy tok/s", "generate tok/s", "ratio (ours / generate)",
                 "same tokens", "peak GPU memory (GiB)"),
            _row("---", "---:", "---:", "---:", "---", "---:"),
            _row(dtype_name(dtype), f"{res['ours']['tok_s']:.1f}", f"{res['hf']['tok_s']:.1f}",
                 f"{res['ours']['tok_s'] / res['hf']['tok_s']:.2f}", "yes" if same else "no",
                 _gib(_peak_gib(device))),
        ]

    def part_quant() -> list[str]:
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            return ["", "8-bit / 4-bit: skipped — bitsandbytes is not installed."]
        if device != "cuda":
            return ["", "8-bit / 4-bit: skipped — bitsandbytes' quantized layers need a GPU here."]
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        path = work / "target"
        state["target"].save_pretrained(path)
        tok.save_pretrained(path)
        state["target_path"] = path
        rows = ["", f"Same weights quantized at load time; {q_n} new tokens, one timed run after a warm-up.",
                "", _row("precision", "playground greedy tok/s", "generate tok/s", "ratio (ours / generate)",
                         "same tokens", "peak GPU memory (GiB)"),
                _row("---", "---:", "---:", "---:", "---", "---:")]
        for label, q in (("8-bit (LLM.int8)", BitsAndBytesConfig(load_in_8bit=True)),
                         ("4-bit (NF4, bf16 compute)", BitsAndBytesConfig(
                             load_in_4bit=True, bnb_4bit_quant_type="nf4",
                             bnb_4bit_compute_dtype=torch.bfloat16))):
            _free(device)
            _reset_peak(device)
            m = AutoModelForCausalLM.from_pretrained(path, quantization_config=q, device_map="cuda")
            h = handle_from_model(m.eval(), tok, name=label, kind="causal")
            res = alternate({"ours": lambda: ours(h, "greedy", q_n),
                             "hf": lambda: hf_generate(h, q_n)}, 1)
            rows.append(_row(label, f"{res['ours']['tok_s']:.1f}", f"{res['hf']['tok_s']:.1f}",
                             f"{res['ours']['tok_s'] / res['hf']['tok_s']:.2f}",
                             "yes" if res["ours"]["out"] == res["hf"]["out"] else "no",
                             _gib(_peak_gib(device))))
            del m, h
        return rows

    def part_spec() -> list[str]:
        h = state["handle"]
        _free(device)
        _reset_peak(device)
        indep = build_causal(d_arch, tok, device, dtype)
        trunc = truncated_copy(state["target"], TRUNCATED_LAYERS)
        out = ["", "### Speculative decoding (temperature 0, γ = 5)", "",
               f"{s_n} new tokens, one timed run after a warm-up, greedy timed alongside.", "",
               f"Target as above. Drafts: an independent random `LlamaForCausalLM` {_arch(d_arch)} "
               f"({n_params(indep) / 1e6:.1f} M parameters), and a truncated copy of the target "
               f"(its embeddings, first {TRUNCATED_LAYERS} layers, norm and head: "
               f"{n_params(trunc) / 1e6:.1f} M parameters, shared with the target). Random weights: "
               "the independent draft's guesses are near chance, so its acceptance is the floor.", "",
               _row("draft", "tokens / target forward", "draft forwards", "tok/s", "speed vs greedy",
                    "same tokens as greedy", "peak GPU memory (GiB)"),
               _row("---", "---:", "---:", "---:", "---:", "---", "---:")]
        for label, d in (("independent ~100M", indep), (f"truncated copy ({TRUNCATED_LAYERS} layers)", trunc)):
            dh = handle_from_model(d, tok, name=label, kind="causal")
            _reset_peak(device)
            res = alternate({"spec": lambda: ours(h, "speculative", s_n, draft=dh,
                                                  params={"gamma": 5, "temperature": 0.0}),
                             "greedy": lambda: ours(h, "greedy", s_n)}, 1)
            s, g = res["spec"], res["greedy"]
            out.append(_row(label, f"{s['new'] / max(1, s['tf']):.2f}", s["df"], f"{s['tok_s']:.1f}",
                            f"{s['tok_s'] / g['tok_s']:.2f}x", "yes" if s["out"] == g["out"] else "no",
                            _gib(_peak_gib(device))))
        return out

    def part_offload() -> list[str]:
        from transformers import AutoModelForCausalLM

        path = state.get("target_path")
        if path is None:
            path = work / "target"
            state["target"].save_pretrained(path)
            tok.save_pretrained(path)
        size = sum(p.numel() * p.element_size() for p in state["target"].parameters())
        budget_gpu = size // 3
        # free the bf16 copy first so the budget, not leftovers, decides where layers go
        state.pop("handle", None)
        state.pop("target", None)
        _free(device)
        _reset_peak(device)
        if device == "cuda":
            max_memory: dict[Any, Any] = {0: budget_gpu, "cpu": 4 * size}
        else:
            max_memory = {"cpu": 4 * size}
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map="auto",
                                                 max_memory=max_memory,
                                                 offload_folder=str(work / "offload"))
        placement = getattr(m, "hf_device_map", {})
        where = sorted({str(v) for v in placement.values()})
        h = handle_from_model(m.eval(), tok, name="offloaded", kind="causal")
        k = max(4, n // 8)
        res = alternate({"ours": lambda: ours(h, "greedy", k), "hf": lambda: hf_generate(h, k)}, 1)
        return ["", "### `device_map=\"auto\"` under a memory budget", "",
                f"The same {size / 2**30:.2f} GiB of weights, loaded with max_memory "
                + (f"GPU {budget_gpu / 2**30:.2f} GiB + CPU" if device == "cuda" else "CPU only")
                + f": modules placed on {', '.join(where) or 'one device'} "
                f"({sum(1 for v in placement.values() if str(v) in ('cpu', 'disk'))} of {len(placement)} "
                f"groups off the GPU). {k} new tokens.", "",
                _row("run", "tok/s", "same tokens", "peak GPU memory (GiB)"),
                _row("---", "---:", "---", "---:"),
                _row("playground greedy", f"{res['ours']['tok_s']:.2f}",
                     "yes" if res["ours"]["out"] == res["hf"]["out"] else "no", _gib(_peak_gib(device))),
                _row("generate", f"{res['hf']['tok_s']:.2f}", "", "")]

    def part_diffusion() -> list[str]:
        _free(device)
        _reset_peak(device)
        m = build_masked(m_arch, tok, device, dtype)
        h = handle_from_model(m, tok, name="masked-random", kind="diffusion",
                              mask_token_id=tok.mask_token_id)
        g = 16 if quick else 64
        res = alternate({"llada": lambda: ours(h, "llada", g, params={"steps": g, "block_length": g // 2})},
                        reps)["llada"]
        return ["", "### Diffusion sampler on a LLaDA-sized masked model", "",
                f"Random `ModernBertForMaskedLM` {_arch(m_arch)} (full attention), "
                f"{n_params(m) / 1e9:.2f} B parameters, {dtype_name(dtype)}; `llada`, {g} new tokens, "
                f"{g} steps, blocks of {g // 2}.", "",
                _row("denoising steps (forwards)", "tokens/s", "s per step", "peak GPU memory (GiB)"),
                _row("---:", "---:", "---:", "---:"),
                _row(res["tf"], f"{res['tok_s']:.1f}", f"{res['wall'] / max(1, res['tf']):.3f}",
                     _gib(_peak_gib(device)))]

    # PARTS_ENV="bf16,speculative": run only the parts whose names start so (a rerun of one part)
    only = [x.strip() for x in os.environ.get(PARTS_ENV, "").split(",") if x.strip()]
    try:
        # most wanted first: a time limit that cuts the run short loses the tail
        for name, fn in (("bf16 greedy vs generate", part_bf16), ("speculative", part_spec),
                         ("diffusion", part_diffusion), ("8-bit / 4-bit", part_quant),
                         ("device_map=auto", part_offload)):
            if only and not any(name.startswith(o) for o in only):
                continue
            if name != "bf16 greedy vs generate" and "target" not in state and name in (
                    "8-bit / 4-bit", "speculative", "device_map=auto"):
                notes.append(f"- {name}: not run (the bf16 target was not built)")
                continue
            _section(name, fn, lines, notes)
            _free(device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    foot = ["", f"Suite wall time {time.perf_counter() - started:.0f} s."]
    if notes:
        foot = ["", "Parts that did not complete:", *notes] + foot
    return "\n".join(header + lines + foot)


def _arch(a: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k.replace('num_', '').replace('_', ' ')} {v}" for k, v in a.items()) + ")"


def dtype_name(dtype: torch.dtype) -> str:
    """``bf16`` / ``fp32``."""
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}.get(dtype, str(dtype))
