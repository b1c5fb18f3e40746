"""Suite ``search``: search decoders' quality against target forwards, and how much of the text
the small model writes in the small-large collaborations against how far it strays.

Part 1, every search decoder on the bundled target: the bundled target's perplexity of the
output given the prompt, distinct-2 (unique bigrams / bigrams: low perplexity with low
distinct-n is repetition, not quality), agreement with beam search's answer (best-first must
match it), target forward passes and wall time; beam and best-first also with a newline stop,
where hypotheses finish early and best-first saves forwards.
Part 2, EAD and speculative cascades (small = ``tiny-shakespeare-draft``, large =
``tiny-shakespeare``) over a sweep of their knob: share of output tokens the small model wrote,
and agreement with the large model — positions equal to the large model's own greedy text,
and tokens the large model would itself choose in that context (teacher-forced) — plus target
forwards and wall time. DiffuSpec is listed for reference (lossless: agreement 1).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from playground.bench import machine_line
from playground.bench.diffusion import ar_perplexity
from playground.core.models import load_model
from playground.engine import run_to_end

DESCRIPTION = "search decoders: perplexity and distinct-n vs target forwards; EAD/cascades: small-model share vs agreement"

PROMPTS = [
    "Romeo.\nBut soft, what light through yonder window breaks?\n\nJuliet.\n",
    "Ham.\nTo be, or not to be, that is the question:\n",
    "Macbeth.\nTomorrow, and tomorrow, and tomorrow,\n",
    "Portia.\nThe quality of mercy is not strain'd,\n",
    "Othello.\nIt is the cause, it is the cause, my soul.\n",
    "Prospero.\nOur revels now are ended.\n",
]

NEWLINE = "\n"  # the stop of the rows where hypotheses finish early (one line of verse)

# (label, decoder, knobs, stop string or None)
SEARCH: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("greedy", "greedy", {}, None),
    ("beam k=4", "beam", {"num_beams": 4}, None),
    ("beam k=4 length_penalty 0", "beam", {"num_beams": 4, "length_penalty": 0.0}, None),
    ("beam k=4 patience 2 (early_stopping true)", "beam", {"num_beams": 4, "patience": 2.0, "early_stopping": "true"},
     None),
    ("best_first_beam k=4", "best_first_beam", {"num_beams": 4}, None),
    ("beam k=4 length_penalty 0, stop at newline", "beam", {"num_beams": 4, "length_penalty": 0.0}, NEWLINE),
    ("best_first_beam k=4, stop at newline", "best_first_beam", {"num_beams": 4}, NEWLINE),
    ("uid_beam k=4 λ=1", "uid_beam", {"num_beams": 4, "lam": 1.0}, None),
    ("diverse_beam 4/2", "diverse_beam", {"num_beams": 4, "num_beam_groups": 2}, None),
    ("arithmetic 8", "arithmetic", {"num_samples": 8}, None),
    ("superposed k=4 (corpus 3-grams, α 0.5)", "superposed", {"num_drafts": 4}, None),
    ("best_of_n 8", "best_of_n", {"num_samples": 8}, None),
    ("metric_match 8, surprisal 3.5", "metric_match", {"num_samples": 8}, None),
    ("mbr 8 n-gram F1", "mbr", {"num_hypotheses": 8}, None),
    ("mbr 8+8 chrF (epsilon refs)", "mbr", {"num_hypotheses": 8, "num_references": 8, "utility": "chrf",
                                            "ref_sampler": "epsilon"}, None),
    ("mbr 8+8 chrF, reference aggregation", "mbr", {"num_hypotheses": 8, "num_references": 8, "utility": "chrf",
                                                    "aggregation": "reference"}, None),
    ("cntp (H>4, 4 trials)", "cntp", {"entropy_threshold": 4.0}, None),
    ("adadec (H>4, top-3, lookahead 4)", "adadec", {"entropy_threshold": 4.0}, None),
    ("sample (T=1)", "sample", {}, None),
]
# what the "same as beam" column compares with: beam search's answer as best-first defines it
REFERENCE = ("beam", {"num_beams": 4, "length_penalty": 0.0})


def collab_configs() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(label, decoder, draft, knobs) of the collaboration sweep."""
    out = [(f"ead threshold {t}", "ead", "tiny-shakespeare-draft", {"entropy_threshold": t, "span": 4})
           for t in (0.0, 4.5, 5.0, 5.5, 6.0, 100.0)]
    out += [(f"spec_cascade {r} α={a}", "spec_cascade", "tiny-shakespeare-draft", {"rule": r, "alpha": a, "gamma": 4})
            for r, a in (("always", 0.0), ("opt", 0.1), ("opt", 0.3), ("chow", 0.2), ("chow", 0.5), ("diff", 0.1))]
    out.append(("diffuspec γ=4 (lossless)", "diffuspec", "tiny-shakespeare-diffusion",
                {"gamma": 4, "draft_steps": 2, "temperature": 0.0}))
    return out


def distinct_n(ids: list[int], n: int = 2) -> float:
    """Unique n-grams / n-grams of one output (1.0 when it is shorter than n + 1 tokens)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def teacher_forced_agreement(large: Any, prompt_ids: list[int], out: list[int]) -> float:
    """Share of output tokens that are the large model's greedy choice given what precedes them."""
    if not out:
        return 1.0
    logits = large.forward(torch.tensor([list(prompt_ids) + list(out)]), use_cache=False).logits[0]
    p = len(prompt_ids)
    best = logits[p - 1:-1].argmax(-1).tolist()
    return sum(int(a == b) for a, b in zip(best, out)) / len(out)


def positional_agreement(a: list[int], b: list[int]) -> float:
    """Share of positions of ``a`` holding ``b``'s token."""
    return sum(int(x == y) for x, y in zip(a, b)) / len(a) if a else 1.0


def search_rows(target: Any, prompts: list[str], n: int,
                configs: list[tuple[str, str, dict[str, Any], str | None]]) -> list[tuple[Any, ...]]:
    """(label, perplexity, distinct-2, same as beam, target forwards, wall s) per configuration,
    averaged over ``prompts``; *same as beam* = positions equal to :data:`REFERENCE`'s output
    under the same stop."""
    view = target.view()
    ref: dict[tuple[str, str | None], list[int]] = {}
    rows = []
    for label, dec, knobs, stop in configs:
        ppl, dist, same, fw, wall = [], [], [], [], []
        for prompt in prompts:
            stops = [stop] if stop else None
            if (prompt, stop) not in ref:
                ref[(prompt, stop)] = run_to_end(model=target, decoder=REFERENCE[0], prompt=prompt, max_new_tokens=n,
                                                 params=REFERENCE[1], stop=stops).output_ids
            t0 = time.perf_counter()
            tr = run_to_end(model=target, decoder=dec, prompt=prompt, max_new_tokens=n, params=knobs, seed=0,
                            stop=stops)
            wall.append(time.perf_counter() - t0)
            ppl.append(ar_perplexity(view, tr.prompt_ids, tr.output_ids) or float("nan"))
            dist.append(distinct_n(tr.output_ids))
            same.append(positional_agreement(tr.output_ids, ref[(prompt, stop)]))
            fw.append(tr.stats["target_forwards"])
        rows.append((label, statistics.mean(ppl), statistics.mean(dist), statistics.mean(same),
                     statistics.mean(fw), statistics.mean(wall)))
    return rows


def collab_rows(target: Any, prompts: list[str], n: int,
                configs: list[tuple[str, str, str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """(label, small share, same as large greedy, large would choose, target forwards, wall s) per
    collaboration configuration, averaged over ``prompts``."""
    view = target.view()
    greedy_of = {p: run_to_end(model=target, decoder="greedy", prompt=p, max_new_tokens=n).output_ids for p in prompts}
    rows = []
    for label, dec, draft, knobs in configs:
        share, pos, tf, fw, wall = [], [], [], [], []
        for prompt in prompts:
            t0 = time.perf_counter()
            tr = run_to_end(model=target, decoder=dec, prompt=prompt, max_new_tokens=n, params=knobs, seed=0,
                            draft=draft)
            wall.append(time.perf_counter() - t0)
            out = tr.output_ids
            share.append(float(tr.stats.get("small_share", tr.stats.get("acceptance_rate", 0.0)))
                         if dec != "diffuspec" else tr.stats.get("accepted_tokens", 0) / max(1, len(out)))
            pos.append(positional_agreement(out, greedy_of[prompt]))
            tf.append(teacher_forced_agreement(view, tr.prompt_ids, out))
            fw.append(tr.stats["target_forwards"])
        rows.append((label, statistics.mean(share), statistics.mean(pos), statistics.mean(tf), statistics.mean(fw),
                     statistics.mean(wall)))
    return rows


def run_suite(args: argparse.Namespace) -> str:
    """Measure and return the markdown section."""
    target = load_model("tiny-shakespeare")
    n = 24 if args.quick else 48
    prompts = PROMPTS[:2] if args.quick else PROMPTS
    t_all = time.perf_counter()
    rows = search_rows(target, prompts, n, SEARCH)
    crows = collab_rows(target, prompts, n, collab_configs())
    total = time.perf_counter() - t_all
    lines = [
        "## Search and collaboration", "",
        machine_line(),
        f"Bundled `tiny-shakespeare` (target/large), `tiny-shakespeare-draft` (small), `tiny-shakespeare-diffusion`; "
        f"{len(prompts)} prompts, {n} new tokens, seed 0; {total:.0f} s in all. Averages over prompts.",
        "",
        "*Perplexity* = the bundled target's, of the output given the prompt; *distinct-2* = unique bigrams / "
        "bigrams of the output; *same as beam* = positions equal to beam search's output (k=4, length_penalty 0, "
        "the same stop: the answer best-first beam search must return); *forwards* = target forward passes (a "
        "batched pass over several hypotheses counts once). The newline rows stop each hypothesis at its first "
        "line break, where best-first's lazy search skips what beam search would still extend.",
        "",
        "| decoder | perplexity | distinct-2 | same as beam | target forwards | wall (s) |",
        "|---|---|---|---|---|---|",
    ]
    for label, ppl, dist, same, fw, wall in rows:
        lines.append(f"| {label} | {ppl:.2f} | {dist:.2f} | {same:.2f} | {fw:.1f} | {wall:.2f} |")
    lines += [
        "",
        "*Small share* = output tokens written by the small model (EAD, cascades: drafted tokens kept; DiffuSpec: "
        "accepted diffusion drafts); *same as large greedy* = positions equal to the large model's greedy text; "
        "*large would choose* = tokens the large model itself picks given the text before them (teacher-forced).",
        "",
        "| configuration | small share | same as large greedy | large would choose | target forwards | wall (s) |",
        "|---|---|---|---|---|---|",
    ]
    for label, share, pos, tf, fw, wall in crows:
        lines.append(f"| {label} | {share:.2f} | {pos:.2f} | {tf:.2f} | {fw:.1f} | {wall:.2f} |")
    return "\n".join(lines) + "\n"
