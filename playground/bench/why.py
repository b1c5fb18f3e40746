"""Suite ``why``: what the "why this token" evidence costs — trace size and run time with each
addition on against off, in one process.

Each row runs the same decoder, prompt and length twice per pair, once with the addition and
once without (the order swapped every other pair), and reports the median of the paired
wall-time ratios on / off with their spread, beside the trace's JSON size both ways. Additions
that cannot be switched off (the sampler chain's per-stage evidence, acceptance by draft
position, the diffusion *why now* plot, which reads fields every denoise step already records)
report their share of the trace instead. *Explain* is timed per explanation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

from playground.attribution import attribute
from playground.bench import machine_line
from playground.bench.overhead import load_average, spread
from playground.core.errors import PlaygroundError
from playground.core.models import BUNDLED_DIR, load_model
from playground.engine import prepare
from visualizers.why_now import why_now_figure

DESCRIPTION = "the cost of the why-evidence: trace size and time on vs off (paired ratios)"
PROMPT = "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
WATCH16 = [f"#{i}" for i in range(5, 21)]  # sixteen watched tokens, the most a run takes


def _run(model: Any, decoder: str, n: int, draft: Any = None, watch: Any = None, **params: Any) -> dict[str, Any]:
    run = prepare(model=model, decoder=decoder, prompt=PROMPT, max_new_tokens=n, seed=0, draft=draft,
                  params=params, watch=watch)
    run.ctx.stop_ids = set()  # fixed length both ways
    return run.finish().to_dict()


def size(trace: dict[str, Any]) -> int:
    """The trace's JSON size in bytes (as stored)."""
    return len(json.dumps(trace))


def field_bytes(trace: dict[str, Any], field: str) -> int:
    """Bytes the steps' ``field`` entries take in the trace's JSON."""
    return sum(len(json.dumps(s[field])) + len(field) + 4 for s in trace.get("steps") or [] if field in s)


def paired(on: Callable[[], Any], off: Callable[[], Any], repeats: int) -> dict[str, Any]:
    """Median and spread of the paired ratios time(on) / time(off), after a warm-up of each."""
    on(), off()
    ratios, t_on, t_off, loads = [], [], [], []
    for i in range(max(1, repeats)):
        loads.append(load_average())
        first, second = (on, off) if i % 2 == 0 else (off, on)
        times = {}
        for fn in (first, second):
            t0 = time.perf_counter()
            fn()
            times[fn] = time.perf_counter() - t0
        t_on.append(times[on])
        t_off.append(times[off])
        ratios.append(times[on] / times[off])
    low, high = spread(ratios)
    return {"ratio": statistics.median(ratios), "low": low, "high": high, "on_s": statistics.median(t_on),
            "off_s": statistics.median(t_off), "load": (min(loads), max(loads))}


def _verdict(r: dict[str, Any]) -> str:
    return "within noise" if r["high"] - r["low"] > abs(r["ratio"] - 1.0) else f"{(r['ratio'] - 1) * 100:+.0f} %"


def run_suite(args: argparse.Namespace) -> str:
    """Measure every addition and return the markdown section."""
    n = 8 if args.quick else 48
    if not args.threads:
        torch.set_num_threads(1)
    if not (BUNDLED_DIR / "tiny-shakespeare" / "config.json").exists():
        raise PlaygroundError("the why suite needs the bundled models; run `playground train-tiny` first")
    target, draft = load_model("tiny-shakespeare"), load_model("tiny-shakespeare-draft")
    diffusion = load_model("tiny-shakespeare-diffusion")
    reps = args.repeats
    rows: list[str] = []

    def timed_row(name: str, on: Callable[[], dict[str, Any]], off: Callable[[], dict[str, Any]]) -> None:
        r = paired(on, off, reps)
        s_on, s_off = size(on()), size(off())
        rows.append(f"| {name} | {s_off / 1024:.1f} | {s_on / 1024:.1f} ({(s_on / s_off - 1) * 100:+.0f} %) | "
                    f"{r['off_s']:.3f} | {r['on_s']:.3f} | **{r['ratio']:.3f}** ({r['low']:.3f}–{r['high']:.3f}) | "
                    f"{_verdict(r)} |")

    timed_row("watch 16 tokens (greedy)", lambda: _run(target, "greedy", n, watch=WATCH16),
              lambda: _run(target, "greedy", n))
    timed_row("logit lens (greedy)", lambda: _run(target, "greedy", n, logit_lens=True),
              lambda: _run(target, "greedy", n))
    timed_row("lens + 16 pinned tokens vs lens", lambda: _run(target, "greedy", n, watch=WATCH16, logit_lens=True),
              lambda: _run(target, "greedy", n, logit_lens=True))
    timed_row("sampler chain: top-k 40, top-p 0.9, min-p 0.05 vs plain sampling",
              lambda: _run(target, "sample", n, top_k=40, top_p=0.9, min_p=0.05),
              lambda: _run(target, "sample", n))

    chain = _run(target, "sample", n, top_k=40, top_p=0.9, min_p=0.05)
    spec = _run(target, "speculative", n, draft=draft)
    acc = json.dumps((spec.get("stats") or {}).get("acceptance_by_position"))
    canvas = _run(diffusion, "llada", 32, steps=32)
    t0 = time.perf_counter()
    why_now_figure(canvas)
    draw_s = time.perf_counter() - t0
    shares = [f"| sampler chain evidence (`chain`, 3 rules) | {field_bytes(chain, 'chain') / 1024:.1f} KiB of "
              f"{size(chain) / 1024:.1f} KiB ({field_bytes(chain, 'chain') / size(chain) * 100:.0f} %) |",
              f"| acceptance by draft position (`stats`, speculative) | {len(acc)} bytes of {size(spec) / 1024:.1f} KiB |",
              f"| *why now* (diffusion, 32 positions × 32 steps) | 0 bytes (reads `score`, `plan`, `unmasked`); "
              f"drawn in {draw_s * 1000:.0f} ms |"]

    greedy = _run(target, "greedy", n)
    explain = []
    for method in ("gradient_x_input", "integrated_gradients"):
        attribute(greedy, n - 1, method=method, model=target)  # warm-up
        ts = []
        for _ in range(max(1, reps)):
            t0 = time.perf_counter()
            res = attribute(greedy, n - 1, method=method, model=target)
            ts.append(time.perf_counter() - t0)
        explain.append(f"| {method.replace('_', ' ')} | {len(res['ids'])} | {statistics.median(ts):.3f} | "
                       f"{len(json.dumps(res)) / 1024:.1f} |")

    lines = [
        "## The why-evidence: what each addition costs (issue 31)",
        "",
        machine_line(),
        f"Bundled `tiny-shakespeare` (draft `tiny-shakespeare-draft`), prompt of {len(target.encode(PROMPT))} tokens, "
        f"{n} new tokens, no stop token, seed 0, one torch thread; after a warm-up of each side, {reps} pairs "
        f"on/off, order swapped every other pair. Load average {load_average():.2f} at the end.",
        "",
        "| addition | trace off (KiB) | trace on (KiB) | off (s) | on (s) | ratio on/off (IQR) | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        "Always on (no switch), as a share of the trace:",
        "",
        "| addition | size |",
        "|---|---|",
        *shares,
        "",
        f"*Explain* of the last token (step {n - 1}), per explanation (median of {reps}):",
        "",
        "| method | context tokens | time (s) | stored result (KiB) |",
        "|---|---:|---:|---:|",
        *explain,
    ]
    return "\n".join(lines)
