"""Suite ``overhead``: the traced ``greedy`` decoder against ``model.generate(do_sample=False)``.

Same model, prompt and number of new tokens, in one process. The two run in pairs (the order
swapped every other pair, so neither always runs on a warmer cache), and each pair gives one
ratio ours / theirs: the cost of recording a full trace (top-K distribution, entropy,
counters) at every step. The section reports the median of those paired ratios with their
spread and the machine's load average, and calls a target "met" only when the spread is
smaller than the effect; otherwise the difference is "within noise".
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from playground.bench import machine_line
from playground.core.errors import PlaygroundError
from playground.core.models import BUNDLED_DIR, handle_from_model, load_model
from playground.engine import prepare

DESCRIPTION = "traced greedy vs transformers generate (median of paired wall-time ratios, with spread)"
PROMPT = "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."


def _llama_30m(tokenizer: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1376,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=1024, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def load_average() -> float:
    """The 1-minute load average (NaN where the platform has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def spread(ratios: list[float]) -> tuple[float, float]:
    """The interquartile range (q1, q3) of the paired ratios; min and max below four pairs."""
    xs = sorted(ratios)
    if len(xs) < 4:
        return xs[0], xs[-1]
    q1, _q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q3


def verdict(median: float, low: float, high: float, target: float) -> str:
    """``"within noise"`` when the spread (high - low) is larger than the effect |median - 1|;
    otherwise ``"met"`` or ``"missed"`` against ``target`` (a ratio ours / theirs)."""
    if high - low > abs(median - 1.0):
        return "within noise"
    return "met" if median <= target else "missed"


def compare_once(handle: Any, n_tokens: int, repeats: int) -> dict[str, Any]:
    """Run ``repeats`` pairs ours/theirs (after one warm-up pair); per-pair ratios and medians."""
    prompt_ids = handle.encode(PROMPT)

    # Both sides time the same span: tokenising the prompt, setting up, decoding.
    def ours() -> list[int]:
        run = prepare(model=handle, decoder="greedy", prompt=PROMPT, max_new_tokens=n_tokens)
        run.ctx.stop_ids = set()  # fixed length, as generate with min_new_tokens
        return run.finish().output_ids

    def theirs() -> list[int]:
        ids = torch.tensor([handle.encode(PROMPT)])
        with torch.inference_mode():
            out = handle.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                                        pad_token_id=handle.tokenizer.pad_token_id or 0)
        return out[0, len(prompt_ids):].tolist()

    def timed(fn: Any) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    same = ours() == theirs()  # also the warm-up
    t_ours, t_theirs, ratios, loads = [], [], [], []
    for i in range(max(1, repeats)):
        loads.append(load_average())
        if i % 2 == 0:
            a = timed(ours)
            b = timed(theirs)
        else:
            b = timed(theirs)
            a = timed(ours)
        t_ours.append(a)
        t_theirs.append(b)
        ratios.append(a / b)
    loads.append(load_average())
    params = sum(p.numel() for p in handle.model.parameters())
    low, high = spread(ratios)
    return {"params_m": params / 1e6, "tokens": n_tokens, "ours_s": statistics.median(t_ours),
            "theirs_s": statistics.median(t_theirs), "ratio": statistics.median(ratios), "low": low,
            "high": high, "min": min(ratios), "max": max(ratios), "pairs": len(ratios),
            "identical": same, "load": (min(loads), max(loads))}


def table(rows: list[tuple[str, dict[str, Any], float]]) -> list[str]:
    """The markdown table of (model name, result of :func:`compare_once`, target ratio) rows."""
    lines = ["| model | parameters | ours (s) | generate (s) | ratio (median of pairs) | spread (IQR) | "
             "min–max | target | verdict | identical tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|:--:|"]
    for name, r, target in rows:
        v = verdict(r["ratio"], r["low"], r["high"], target)
        lines.append(f"| {name} | {r['params_m']:.1f} M | {r['ours_s']:.3f} | {r['theirs_s']:.3f} | "
                     f"**{r['ratio']:.3f}** | {r['low']:.3f}–{r['high']:.3f} | {r['min']:.3f}–{r['max']:.3f} | "
                     f"≤ {target:.2f} | {v} | {'yes' if r['identical'] else 'NO'} |")
    return lines


def run_suite(args: argparse.Namespace) -> str:
    """Measure both models and return the markdown section."""
    n = 8 if args.quick else 128
    if not args.threads:
        torch.set_num_threads(1)  # both sides alike; on a shared machine extra threads mostly spin
    if not (BUNDLED_DIR / "tiny-shakespeare" / "config.json").exists():
        raise PlaygroundError("the overhead suite needs the bundled models; run `playground train-tiny` first")
    target = load_model("tiny-shakespeare")
    tok = target.tokenizer
    big = handle_from_model(_llama_30m(tok), tok, name="llama-30m-random")
    rows = [("Llama-shaped, random init (config)", compare_once(big, n, args.repeats), 1.10),
            ("bundled `tiny-shakespeare`", compare_once(target, n, args.repeats), 1.25)]
    lo = min(r["load"][0] for _n, r, _t in rows)
    hi = max(r["load"][1] for _n, r, _t in rows)
    lines = [
        "## Overhead of tracing: `greedy` vs `model.generate(do_sample=False)`",
        "",
        machine_line(),
        f"Prompt of {len(big.encode(PROMPT))} tokens, {n} new tokens, no stop token. After one warm-up pair, "
        f"{args.repeats} pairs ours/transformers (order swapped every other pair), both timed from the prompt "
        "text to the output ids. Ratio = ours / transformers per pair; the table gives the median of the "
        "paired ratios, its interquartile range (min–max below four pairs) and the median times. "
        "*Verdict*: \"within noise\" when the spread is larger than the effect |ratio − 1|, otherwise "
        "\"met\" or \"missed\" against the target.",
        "",
        *table(rows),
        "",
        f"1-minute load average during the pairs: {lo:.1f}–{hi:.1f} on {os.cpu_count()} cores"
        + (" (the machine was shared with other jobs: expect a wide spread)." if hi >= (os.cpu_count() or 1) / 2
           else "."),
    ]
    return "\n".join(lines) + "\n"
