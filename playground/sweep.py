"""``playground sweep``: one decoder over a grid of one or two knobs, same prompt, same random numbers.

    playground sweep --decoder top_p --knob temperature=0.3,0.6,0.9,1.2 --knob p=0.5:1.0:0.25 \\
        [--param NAME=VALUE ...] [--repeats N] [--model M] [--prompt TEXT] --out sweep.db

Every cell of the grid (each combination of the knob values) runs the decoder on the same prompt
with the same seed, so the cells differ by their knob values and not by their luck (the common
random numbers of :class:`decoders.base.Context`). ``--repeats N`` runs each cell with the seeds
``seed .. seed+N-1``: the spread over them is the run-to-run variance of that configuration.
Greedy runs once on the same prompt, the reference of the agreement metric (for a diffusion
decoder: ``llada`` committing one token per step, so a threshold sweep measures what parallel
commits cost; its perplexity is scored by the bundled causal model, which shares the tokenizer).

Every run is a session of the ``--out`` store (``playground/store.py``), one lane holding the
cell's decoder with its knob values, so any cell opens as a normal comparison (``playground
sessions --db sweep.db show|export ID``, the page with ``PLAYGROUND_DB=sweep.db``, a share link).
``settings["sweep"]`` records ``{"fingerprint", "role", "cell", "knobs", "repeat"}``; each lane's
trace carries its score under the scorer model (``trace["score"]``, as a study's do). Runs
already stored are skipped, so a killed sweep resumes. The per-cell aggregate
(:func:`aggregate`) is a pure function of the stored sessions. See docs/studies.md.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import sys
from decimal import Decimal, InvalidOperation
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from decoders import get_decoder
from playground.api import plan_compare, prepare_lanes
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.store import Store
from playground.study import agreement, distinct, read_prompts, score_text, write_html_figures, DEFAULT_PROMPTS
from visualizers.sweep import sweep_figure
from visualizers.tree import trace_figures

MAX_KNOBS = 2
MAX_CELLS = 64
MAX_REPEATS = 16
# cells x repeats x max new tokens: what one sweep may ask to generate in all
MAX_SWEEP_TOKENS = 8192
MAX_VALUES_TEXT = 2000
# (key, column title, digits); every metric is one number per run, averaged over the repeats
METRICS = (
    ("tokens_per_target_forward", "tok/fwd", 3),
    ("perplexity", "ppl", 2),
    ("distinct_2", "dist-2", 3),
    ("agreement", "agree", 3),
    ("acceptance_rate", "accept", 3),
    ("wall_s", "wall s", 3),
)
METRIC_KEYS = tuple(k for k, _, _ in METRICS)
# an export link naming a whole sweep (its fingerprint follows) rather than one session
SWEEP_LINK = "sweep:"
# the scorer of a sweep on a bundled diffusion model: the causal model with its tokenizer
DIFFUSION_SCORERS = {"tiny-shakespeare-diffusion": "tiny-shakespeare"}


# ---------------------------------------------------------------------- the grid
def _range_values(name: str, text: str) -> list[str]:
    """``START:STOP:STEP``, both ends included (decimal arithmetic, so 0.3:1.5:0.3 ends on 1.5)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise PlaygroundError(f"--knob {name}: a range is START:STOP:STEP, got {text!r}")
    try:
        start, stop, step = (Decimal(p.strip()) for p in parts)
    except InvalidOperation:
        raise PlaygroundError(f"--knob {name}: a range is START:STOP:STEP of numbers, got {text!r}") from None
    if not all(x.is_finite() for x in (start, stop, step)) or step <= 0 or stop < start:
        raise PlaygroundError(f"--knob {name}: a range needs START <= STOP and a STEP above 0, got {text!r}")
    count = int((stop - start) / step) + 1
    if count > MAX_CELLS:
        raise PlaygroundError(f"--knob {name}: the range {text!r} has {count} values; a sweep has at most {MAX_CELLS} cells")
    return [str(start + k * step) for k in range(count)]


def parse_knob(text: str) -> tuple[str, list[str]]:
    """``NAME=V1,V2,...`` or ``NAME=START:STOP:STEP`` as ``(name, [value text, ...])``; the values
    are checked against the decoder's knob spec by :func:`build_grid`."""
    if not isinstance(text, str) or "=" not in text or len(text) > MAX_VALUES_TEXT:
        raise PlaygroundError(f"--knob wants NAME=V1,V2,... or NAME=START:STOP:STEP, got {str(text)[:80]!r}")
    name, values = (s.strip() for s in text.split("=", 1))
    if not name:
        raise PlaygroundError(f"--knob wants NAME=V1,V2,..., got {text!r}")
    if ":" in values and "," not in values:
        out = _range_values(name, values)
    else:
        out = [v.strip() for v in values.split(",")]
    if not out or any(v == "" for v in out):
        raise PlaygroundError(f"--knob {name}: every value must be non-empty, got {values!r}")
    return name, out


def build_grid(decoder: str, knobs: list[tuple[str, list[str]]], fixed: dict[str, Any],
               repeats: int, max_new_tokens: int) -> dict[str, Any]:
    """The sweep's grid: the knobs' typed values (each checked by the decoder's own spec) and one
    cell per combination, first knob slowest: ``{"knobs": [{"name", "values"}], "cells":
    [{"index": [i, j], "knobs": {...}, "params": full knob values}]}``. Refuses in one line a
    bad knob or value, a knob swept twice or also fixed, too many cells or tokens."""
    cls = get_decoder(decoder)
    if not knobs:
        raise PlaygroundError("a sweep needs at least one --knob NAME=V1,V2,...")
    if len(knobs) > MAX_KNOBS:
        raise PlaygroundError(f"a sweep has one or two knobs, got {len(knobs)}")
    names = [n for n, _ in knobs]
    if len(set(names)) != len(names):
        raise PlaygroundError(f"knob {names[0]!r} is swept twice; give its values in one --knob")
    axes = []
    for name, values in knobs:
        if name not in cls.params:
            raise PlaygroundError(f"decoder {decoder!r} has no knob {name!r} (knobs: {', '.join(cls.params) or 'none'})")
        if name in fixed:
            raise PlaygroundError(f"knob {name!r} is both swept (--knob) and fixed (--param)")
        axes.append({"name": name, "values": [cls.params[name].check(name, v) for v in values]})
    n_cells = math.prod(len(a["values"]) for a in axes)
    if n_cells > MAX_CELLS:
        raise PlaygroundError(f"the sweep has {n_cells} cells; the limit is {MAX_CELLS}")
    if max_new_tokens < 1:
        raise PlaygroundError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if not 1 <= repeats <= MAX_REPEATS:
        raise PlaygroundError(f"--repeats must be between 1 and {MAX_REPEATS}, got {repeats}")
    tokens = n_cells * repeats * max_new_tokens
    if tokens > MAX_SWEEP_TOKENS:
        raise PlaygroundError(f"{n_cells} cells x {repeats} repeats x {max_new_tokens} tokens = {tokens} tokens; "
                              f"a sweep generates at most {MAX_SWEEP_TOKENS}")
    cells = []
    for index in itertools.product(*(range(len(a["values"])) for a in axes)):
        chosen = {a["name"]: a["values"][i] for a, i in zip(axes, index)}
        # the whole cell through the spec once more: combinations some decoders refuse
        params = cls.params.validate(decoder, {**fixed, **chosen})
        cells.append({"index": list(index), "knobs": chosen, "params": params})
    return {"decoder": decoder, "knobs": axes, "cells": cells}


def fingerprint(body: dict[str, Any]) -> str:
    """What makes two runs of a sweep the same sweep (model, prompt, seed, budget, grid, scorer)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_title(knobs: dict[str, Any], seed: int) -> str:
    """A cell's session title: its knob values and seed."""
    return "sweep " + " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in knobs.items()) \
        + f" · seed {seed}"


# ---------------------------------------------------------------------- stored sweeps
def sweep_sessions(store: Any, fp: str | None = None) -> list[dict[str, Any]]:
    """The store's sweep sessions (the greedy reference and every cell run), in stored order; of
    the sweep with fingerprint ``fp`` only, when given (found by the store, not by reading all)."""
    if fp is not None:
        return [store.load_session(sid) for sid in store.sessions_with_setting("$.sweep.fingerprint", fp)]
    out = []
    for s in reversed(store.list_sessions()):
        sess = store.load_session(s["id"])
        info = (sess.get("settings") or {}).get("sweep")
        if isinstance(info, dict) and "fingerprint" in info:
            out.append(sess)
    return out


def sweep_title(sessions: list[dict[str, Any]]) -> str:
    """A page title for a stored sweep: its decoder and knobs."""
    info = next(((s.get("settings") or {}).get("sweep") or {} for s in sessions), {})
    axes = " × ".join(str(a.get("name")) for a in info.get("axes") or [])
    return f"Sweep of {info.get('decoder', '?')} over {axes or 'its knobs'} ({len(sessions)} runs)"


def _run_key(info: dict[str, Any]) -> tuple[Any, ...]:
    return ("greedy",) if info.get("role") == "greedy" else ("cell", tuple(info.get("cell") or ()), info.get("repeat"))


def stored_runs(store: Any, fp: str) -> set[tuple[Any, ...]]:
    """Keys of the runs already stored for this sweep; refuses a store holding another sweep."""
    keys = set()
    for sess in sweep_sessions(store):
        info = sess["settings"]["sweep"]
        if info["fingerprint"] != fp:
            raise PlaygroundError(f"{store.path} holds a sweep with other settings (decoder, knobs, model, prompt, "
                                  "seed, repeats, max new tokens or scorer); use another --out")
        keys.add(_run_key(info))
    return keys


# ---------------------------------------------------------------------- metrics
def run_metrics(trace: dict[str, Any], greedy_ids: list[int] | None) -> dict[str, float | None]:
    """The sweep's metrics of one stored run (see :data:`METRICS`): tokens per target forward and
    wall time from its stats, perplexity from its score (exp of NLL per scored token), distinct-2
    and agreement with greedy (:mod:`playground.study`'s definitions), acceptance rate by the
    speculative figures' definition (None for a decoder without drafts)."""
    stats = trace.get("stats") or {}
    ids = [int(t) for t in trace.get("output_ids") or []]
    score = trace.get("score") or {}
    scored = int(score.get("tokens") or 0)
    figs = trace_figures(trace)
    acc = figs["acceptance_rate"] if figs is not None else stats.get("acceptance_rate")
    return {
        "tokens_per_target_forward": float(stats.get("tokens_per_target_forward") or 0.0),
        "perplexity": math.exp(float(score.get("nll_sum") or 0.0) / scored) if scored else None,
        "distinct_2": distinct([ids], 2),
        "agreement": agreement(greedy_ids, ids) if greedy_ids is not None else None,
        "acceptance_rate": float(acc) if acc is not None else None,
        "wall_s": float(stats.get("wall_s") or 0.0),
    }


def mean_spread(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (0.0 for one value) of the values that are not None."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return round(m, 6), round(sd, 6)


def aggregate(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cell over its repeats, from the stored sessions alone: each metric's mean and spread
    (sample standard deviation over the repeats), the outputs, and the session ids."""
    cells_runs = [s for s in sessions if s["settings"]["sweep"].get("role") == "cell"]
    greedy = next((s for s in sessions if s["settings"]["sweep"].get("role") == "greedy"), None)
    greedy_ids = [int(t) for t in greedy["runs"][0].get("output_ids") or []] if greedy else None
    first = (cells_runs or sessions or [{}])[0]
    info = (first.get("settings") or {}).get("sweep") or {}
    by_cell: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for s in cells_runs:
        by_cell.setdefault(tuple(s["settings"]["sweep"]["cell"]), []).append(s)
    cells = []
    for index in sorted(by_cell):
        runs = sorted(by_cell[index], key=lambda s: s["settings"]["sweep"]["repeat"])
        per_run = [run_metrics(s["runs"][0], greedy_ids) for s in runs]
        cell: dict[str, Any] = {"index": list(index), "knobs": runs[0]["settings"]["sweep"]["knobs"],
                                "repeats": len(runs), "seeds": [s["settings"]["seed"] for s in runs],
                                "sessions": [s["id"] for s in runs],
                                "texts": [s["runs"][0].get("text", "") for s in runs]}
        for key in METRIC_KEYS:
            cell[key], cell[key + "_spread"] = mean_spread([m[key] for m in per_run])
        cells.append(cell)
    scorer = next((r.get("score", {}).get("scorer") for s in cells_runs for r in s["runs"] if r.get("score")), None)
    return {"decoder": info.get("decoder"), "model": first.get("model"), "prompt": first.get("prompt"),
            "knobs": info.get("axes") or [], "scorer": scorer, "cells": cells,
            "greedy": {"session": greedy["id"], "text": greedy["runs"][0].get("text", "")} if greedy else None}


# ---------------------------------------------------------------------- printing
def _fmt(mean: float | None, spread: float | None, digits: int, repeats: int) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f"±{spread:.{digits}f}" if repeats > 1 and spread is not None else "")


def table(agg: dict[str, Any], metric: str = "perplexity") -> str:
    """One row per cell (every metric, mean ± spread over the repeats), then ``metric`` as a grid
    over the knobs (rows: the first knob, columns: the second)."""
    names = [a["name"] for a in agg["knobs"]]
    digits = {k: d for k, _, d in METRICS}
    knob_w = max([12] + [len(", ".join(f"{n}={v}" for n, v in c["knobs"].items())) for c in agg["cells"]])
    head = f"{'knobs':<{knob_w}} " + " ".join(f"{t:>15}" for _, t, _ in METRICS)
    rows = [head, "-" * len(head)]
    for c in agg["cells"]:
        label = ", ".join(f"{n}={c['knobs'][n]}" for n in names)
        rows.append(f"{label:<{knob_w}} " + " ".join(
            f"{_fmt(c[k], c[k + '_spread'], digits[k], c['repeats']):>15}" for k in METRIC_KEYS))
    repeats = max((c["repeats"] for c in agg["cells"]), default=0)
    title = dict((k, t) for k, t, _ in METRICS)[metric]
    rows.append("")
    at = {tuple(c["index"]): c for c in agg["cells"]}
    if len(names) == 2:
        cols = agg["knobs"][1]["values"]
        rows.append(f"{title}: rows {names[0]}, columns {names[1]}")
        rows.append(f"{'':>10} " + " ".join(f"{str(v):>15}" for v in cols))
        for i, v in enumerate(agg["knobs"][0]["values"]):
            line = []
            for j in range(len(cols)):
                c = at.get((i, j))
                line.append(f"{_fmt(c[metric], c[metric + '_spread'], digits[metric], c['repeats']) if c else '':>15}")
            rows.append(f"{str(v):>10} " + " ".join(line))
    elif names:
        rows.append(f"{title} by {names[0]}: " + ", ".join(
            f"{v}: {_fmt(at[(i,)][metric], at[(i,)][metric + '_spread'], digits[metric], at[(i,)]['repeats'])}"
            for i, v in enumerate(agg["knobs"][0]["values"]) if (i,) in at))
    rows.append(f"{agg.get('decoder')} · {len(agg['cells'])} cells x {repeats} repeat(s) · model {agg.get('model')} · "
                f"perplexity under {agg.get('scorer')}"
                + (" · agreement with the reference run" if agg.get("greedy") else " · no reference run (agreement -)")
                + (" · ± is the standard deviation over the repeats" if repeats > 1 else ""))
    return "\n".join(rows)


def write_figures(agg: dict[str, Any], directory: str | os.PathLike[str]) -> list[Path]:
    """Write the sweep figure of every metric as ``DIR/<metric>.html`` (plotly.js once, beside them)."""
    return write_html_figures({key: sweep_figure(agg, key, title) for key, title, _ in METRICS}, directory)


# ---------------------------------------------------------------------- the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sweep`` options to ``parser``."""
    parser.add_argument("--decoder", default=None, help="the decoder to sweep (not needed with --report)")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="a swept knob and its values (comma list, or START:STOP:STEP with both ends); "
                             "once or twice")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a knob held fixed in every cell")
    parser.add_argument("--draft", default=None, help="draft model for speculative decoders")
    parser.add_argument("--model", default=None, help="default tiny-shakespeare")
    parser.add_argument("--prompt", default=None, help="default: the first prompt of the bundled shakespeare-24 set")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, metavar="N", help="run each cell with seeds seed..seed+N-1")
    parser.add_argument("--scorer", default=None, help="model that scores perplexity (default: the sweep's model)")
    parser.add_argument("--metric", default="perplexity", choices=METRIC_KEYS, help="the metric of the printed grid")
    parser.add_argument("--out", default="sweep.db", metavar="sweep.db", help="the sweep's store (SQLite)")
    parser.add_argument("--report", action="store_true", help="only aggregate what --out holds; run nothing")
    parser.add_argument("--json", action="store_true", help="print the aggregate as JSON")
    parser.add_argument("--figures", default=None, metavar="DIR",
                        help="write a heatmap (two knobs) or a line (one knob) per metric as HTML into DIR")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the sweep, then print its grid; user errors raise :class:`PlaygroundError`."""
    if args.report:
        if not os.path.exists(args.out):
            raise PlaygroundError(f"no sweep at {args.out}")
    elif not args.decoder:
        raise PlaygroundError("sweep needs --decoder NAME (or --report to print a stored sweep)")
    else:
        _run_sweep(args)
    with Store(args.out) as store:
        agg = aggregate(sweep_sessions(store))
    if not agg["cells"]:
        raise PlaygroundError(f"{args.out} holds no sweep")
    if args.figures:
        write_figures(agg, args.figures)
    print(json.dumps(agg, ensure_ascii=False) if args.json else table(agg, args.metric))
    return 0


def _parse_params(items: list[str]) -> dict[str, str]:
    out = {}
    for text in items:
        if "=" not in text or not text.split("=", 1)[0].strip():
            raise PlaygroundError(f"--param wants NAME=VALUE, got {text!r}")
        k, v = text.split("=", 1)
        out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class SweepRequest:
    """What a sweep runs: one decoder over ``knobs`` (name and value texts, :func:`parse_knob`),
    other knobs ``fixed``, on one prompt, from ``seed`` (``repeats`` seeds per cell)."""

    decoder: str
    knobs: list[tuple[str, list[str]]]
    prompt: str
    fixed: dict[str, Any] = field(default_factory=dict)
    draft: str | None = None
    model: str | None = None
    seed: int = 0
    repeats: int = 1
    max_new_tokens: int = 32
    scorer: str | None = None


def reference_lane(decoder: str, grid: dict[str, Any]) -> dict[str, Any]:
    """The run the agreement metric compares with: greedy for a causal decoder; for a diffusion
    decoder ``llada`` committing one token per step on the first cell's canvas (the parallel
    decoding a threshold sweep measures against)."""
    if get_decoder(decoder).kind == "causal":
        return {"decoder": "greedy"}
    first = grid["cells"][0]["params"] if grid["cells"] else {}
    return {"decoder": "llada", "knobs": {k: first[k] for k in ("gen_length", "block_length") if k in first}}


def reference_name(decoder: str) -> str:
    """The reference run, in words."""
    return "greedy" if get_decoder(decoder).kind == "causal" else "llada, one token per step"


def plan_sweep(req: SweepRequest) -> tuple[dict[str, Any], Any]:
    """The grid (:func:`build_grid`) and the checked comparison plan of the first cell (prompt,
    model, seed, budget), before anything runs or is stored; one line for anything refused."""
    grid = build_grid(req.decoder, req.knobs, req.fixed, req.repeats, req.max_new_tokens)
    lanes = [{"decoder": req.decoder, "knobs": c["params"], "draft": req.draft} for c in grid["cells"]]
    # the prompt and the settings are checked once here; each run's lane by prepare_lanes
    return grid, plan_compare(lanes=lanes[:1], model=req.model, prompt=req.prompt, seed=req.seed,
                              max_new_tokens=req.max_new_tokens)


def run_sweep(store: Any, req: SweepRequest, load_kwargs: dict[str, Any] | None = None, owner: str | None = None,
              exclusive: bool = True, on_run: Callable[[int, int], None] | None = None) -> str:
    """Run every cell of ``req`` not yet in ``store`` (the reference first: :func:`reference_lane`) and store each as a one-lane session (of ``owner``); return the sweep's fingerprint.

    ``exclusive``: the store holds this sweep alone (the command line's ``--out``), so one with
    other settings is refused; the page's store holds many, told apart by fingerprint.
    ``on_run(done, total)`` is told after each stored run."""
    cls = get_decoder(req.decoder)
    grid, base = plan_sweep(req)
    load_kwargs = dict(load_kwargs or {})
    masked = cls.kind != "causal"
    # a diffusion model scores no text left to right: the bundled causal model shares its tokenizer
    scorer_name = req.scorer or (DIFFUSION_SCORERS.get(base.model, base.model) if masked else base.model)
    axes = [{"name": a["name"], "values": a["values"]} for a in grid["knobs"]]
    fp = fingerprint({"decoder": req.decoder, "axes": axes, "fixed": req.fixed, "draft": req.draft,
                      "model": base.model, "prompt": req.prompt, "seed": base.seed, "repeats": req.repeats,
                      "max_new_tokens": base.max_new_tokens, "scorer": scorer_name,
                      **({"owner": owner} if owner else {})})
    common = {"fingerprint": fp, "decoder": req.decoder, "axes": axes, "repeats": req.repeats}
    done = stored_runs(store, fp) if exclusive else {_run_key(s["settings"]["sweep"]) for s in sweep_sessions(store, fp)}
    todo: list[tuple[str, dict[str, Any] | None, int]] = []
    if ("greedy",) not in done:
        todo.append(("greedy", None, 0))
    reference = reference_lane(req.decoder, grid)
    todo += [("cell", c, r) for c in grid["cells"] for r in range(req.repeats)
             if ("cell", tuple(c["index"]), r) not in done]
    if not todo:
        return fp
    scorer = load_model(scorer_name, **load_kwargs)
    if scorer.kind != "causal":
        raise PlaygroundError(f"the scorer {scorer_name!r} is a {scorer.kind} model; give a causal --scorer")
    for n, (role, cell, r) in enumerate(todo, start=1):
        seed = base.seed + r
        lane = reference if cell is None else {"decoder": req.decoder, "knobs": cell["params"], "draft": req.draft}
        plan = plan_compare(lanes=[lane], model=base.model, prompt=req.prompt, seed=seed,
                            max_new_tokens=base.max_new_tokens)
        try:
            trace = prepare_lanes(plan, load_kwargs=load_kwargs)[0].finish().to_dict()
        except PlaygroundError as e:
            where = "greedy" if cell is None else cell_title(cell["knobs"], seed)
            raise PlaygroundError(f"{where}: {e}") from None
        trace["score"] = {"scorer": scorer.name, **score_text(scorer, req.prompt, trace["text"])}
        info = {**common, "role": role}
        if cell is not None:
            info.update(cell=cell["index"], knobs=cell["knobs"], repeat=r)
        settings = {"seed": seed, "max_new_tokens": plan.max_new_tokens, "policy": plan.policy,
                    "lanes": [dict(x) for x in plan.lanes], "preset": None, "sweep": info}
        title = f"sweep reference: {reference_name(req.decoder)}" if cell is None else cell_title(cell["knobs"], seed)
        store.save_session(title, plan.model, req.prompt, settings, [trace], owner=owner)
        if on_run is not None:
            on_run(n, len(todo))
    return fp


def _run_sweep(args: argparse.Namespace) -> None:
    prompt = args.prompt if args.prompt is not None else read_prompts(DEFAULT_PROMPTS)[0][1]
    req = SweepRequest(decoder=args.decoder, knobs=[parse_knob(k) for k in args.knob], fixed=_parse_params(args.param),
                       draft=args.draft, model=args.model, prompt=prompt, seed=args.seed, repeats=args.repeats,
                       max_new_tokens=args.max_new_tokens, scorer=args.scorer)
    plan_sweep(req)  # refused before the --out store is made
    with Store(args.out) as store:
        bar = None
        try:
            def step(done: int, total: int) -> None:
                nonlocal bar
                if bar is None:
                    bar = _progress(total, args.no_progress)
                bar.update(1)

            run_sweep(store, req, load_kwargs={"device": args.device, "dtype": args.dtype}, on_run=step)
        finally:
            if bar is not None:
                bar.close()


def _progress(total: int, off: bool) -> Any:
    return tqdm(total=total, desc="sweep", unit="run", file=sys.stderr, disable=off, leave=True, dynamic_ncols=True)
