"""``playground study``: one comparison per prompt of a prompt set, stored, then aggregated per lane.

    playground study --prompts FILE.jsonl --preset NAME (or --lanes ...) [--model M] --out study.db

Every prompt's comparison is stored in ``--out`` like a page session (``playground/store.py``;
``playground sessions --db study.db ...`` lists and opens them), with ``settings["study"]`` =
``{"key", "index", "fingerprint", ...}`` and, per lane, the output's score under the scorer model
(``trace["score"]`` = ``{"scorer", "nll_sum", "tokens"}``). Prompts already stored are skipped,
so a killed study resumes where it stopped; a session is saved in one transaction, so every
prompt ends up stored exactly once. The aggregate per lane (:func:`aggregate`) is a pure
function of the stored sessions.

Under ``accelerate launch`` (torchrun underneath: processes, GPUs, nodes) each rank takes the
prompts ``index % world == rank``, writes its own store ``OUT.rank<r>-of-<w>``, and rank 0
merges the shards into ``OUT`` when every rank is done (skipping prompts already there: a
restarted rank resumes its own shard, and a re-run merge adds nothing twice). See
``docs/studies.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from playground.core.errors import PlaygroundError
from playground.store import Store

# torch, accelerate, plotly and the API (the engine, the decoders) are imported inside the functions
# that run or draw a study: reading and aggregating a stored study (the Study tab) needs none of them.

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "presets" / "prompts" / "shakespeare-24.jsonl"
DEFAULT_SCORER = "tiny-shakespeare"
METRICS = (  # (key, column title, digits)
    ("tokens_per_target_forward", "tok/fwd", 3),
    ("wall_s", "wall s", 3),
    ("target_forwards", "forwards", 1),
    ("perplexity", "ppl", 2),
    ("distinct_1", "dist-1", 3),
    ("distinct_2", "dist-2", 3),
    ("agreement", "agree", 3),
)


# ---------------------------------------------------------------------- prompts
def read_prompts(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``(key, prompt)`` per line of a JSONL file: ``{"prompt": ..., "id": ...}`` (id optional,
    the line number otherwise) or a bare JSON string. Keys must be unique."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PlaygroundError(f"cannot read the prompt file {path}: {e.strerror or e}") from None
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlaygroundError(f"{p.name} line {n} is not JSON: {e.msg}") from None
        if isinstance(rec, str):
            rec = {"prompt": rec}
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"].strip():
            raise PlaygroundError(f"{p.name} line {n} needs a non-empty \"prompt\" text")
        key = str(rec.get("id", n))
        if key in seen:
            raise PlaygroundError(f"{p.name} line {n}: prompt id {key!r} appears twice")
        seen.add(key)
        out.append((key, rec["prompt"]))
    if not out:
        raise PlaygroundError(f"the prompt file {path} holds no prompts")
    return out


# ---------------------------------------------------------------------- one comparison
def fingerprint(plan: Any, scorer: str) -> str:
    """What makes two runs of a study comparable: model, seed, token budget, lanes, scorer."""
    body = {"model": plan.model, "seed": plan.seed, "max_new_tokens": plan.max_new_tokens,
            "lanes": [dict(lane) for lane in plan.lanes], "scorer": scorer}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def score_text(handle: Any, prompt: str, text: str) -> dict[str, Any]:
    """Summed negative log-likelihood (nats) of ``text`` after ``prompt`` under ``handle``, and the
    number of tokens scored (the scorer's own tokenisation; the output's last tokens if the
    whole does not fit its context)."""
    import torch

    p_ids = list(handle.encode(prompt))
    full = list(handle.encode(prompt + text))
    if full[:len(p_ids)] != p_ids:  # the join re-tokenised the boundary: score the parts as they are
        full = p_ids + list(handle.encode(text))
    n_out = len(full) - len(p_ids)
    keep = min(len(full), int(handle.context_length))
    ids = full[-keep:]
    n_scored = min(n_out, keep - 1)
    if n_scored <= 0:
        return {"nll_sum": 0.0, "tokens": 0}
    logits = handle.forward(ids).logits[0].double()
    logp = torch.log_softmax(logits[:-1], -1)
    targets = torch.tensor(ids[1:], dtype=torch.long, device=logp.device)
    nll = -logp.gather(1, targets[:, None])[:, 0]
    return {"nll_sum": round(float(nll[-n_scored:].sum()), 6), "tokens": int(n_scored)}


def run_one(plan: Any, scorer: Any, load_kwargs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every lane of one prompt's comparison to the end, each trace with its ``score``."""
    from playground.api import prepare_lanes

    traces = []
    for run in prepare_lanes(plan, load_kwargs=load_kwargs):
        d = run.finish().to_dict()
        d["score"] = {"scorer": scorer.name, **score_text(scorer, plan.prompt, d["text"])}
        traces.append(d)
    return traces


# ---------------------------------------------------------------------- stored studies
def study_sessions(store: Any) -> list[dict[str, Any]]:
    """The study's stored comparisons, by prompt index (sessions without study settings are left out)."""
    out = []
    for s in store.list_sessions():
        sess = store.load_session(s["id"])
        info = (sess.get("settings") or {}).get("study")
        if isinstance(info, dict) and "key" in info:
            out.append(sess)
    return sorted(out, key=lambda s: (s["settings"]["study"].get("index", 0), s["settings"]["study"]["key"]))


def stored_keys(store: Any, fp: str) -> set[str]:
    """Prompt keys already stored for this study; refuses a store holding another study."""
    keys: set[str] = set()
    for sess in study_sessions(store):
        info = sess["settings"]["study"]
        if info.get("fingerprint") != fp:
            raise PlaygroundError(f"{store.path} holds a study with other settings (model, seed, max new tokens, "
                                  "lanes or scorer); use another --out")
        keys.add(info["key"])
    return keys


def save_comparison(store: Any, plan: Any, key: str, index: int, fp: str, traces: list[dict[str, Any]],
                    extra: dict[str, Any]) -> str:
    """Store one prompt's comparison as a session (one transaction)."""
    settings = {"seed": plan.seed, "max_new_tokens": plan.max_new_tokens, "policy": plan.policy,
                "lanes": [dict(lane) for lane in plan.lanes], "preset": plan.preset,
                "study": {"key": key, "index": index, "fingerprint": fp, **extra}}
    return store.save_session(f"study {key}", plan.model, plan.prompt, settings, traces)


# ---------------------------------------------------------------------- aggregate
def _ngrams(ids: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


def distinct(outputs: Iterable[list[int]], n: int) -> float:
    """Distinct-n: unique n-grams / n-grams over all outputs (token ids); 0.0 with none."""
    grams = [g for ids in outputs for g in _ngrams(ids, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions (of the longer output) where two outputs hold the same token."""
    n = max(len(a), len(b))
    return sum(1 for x, y in zip(a, b) if x == y) / n if n else 1.0


def aggregate(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per lane over the study's sessions: tokens per target forward (total tokens / total
    forwards), mean wall time and target forwards per prompt, perplexity of the outputs under
    the scorer (exp of total NLL / total scored tokens), distinct-1/2, mean agreement with the
    first lane, finish reasons. Only the stored traces are read."""
    if not sessions:
        return {"prompts": 0, "lanes": [], "sessions": {}}
    n_lanes = max(len(s["runs"]) for s in sessions)
    lanes = []
    for j in range(n_lanes):
        runs = [(s, s["runs"][j]) for s in sessions if j < len(s["runs"])]
        stats = [r.get("stats") or {} for _, r in runs]
        outs = [[int(t) for t in r.get("output_ids") or []] for _, r in runs]
        firsts = [[int(t) for t in s["runs"][0].get("output_ids") or []] for s, _ in runs]
        tokens = sum(int(st.get("new_tokens") or 0) for st in stats)
        forwards = sum(int(st.get("target_forwards") or 0) for st in stats)
        nll = sum(float((r.get("score") or {}).get("nll_sum") or 0.0) for _, r in runs)
        scored = sum(int((r.get("score") or {}).get("tokens") or 0) for _, r in runs)
        first = runs[0][1]
        lanes.append({
            "lane": j + 1, "decoder": first.get("decoder"), "params": first.get("params"),
            "prompts": len(runs), "tokens": tokens,
            "tokens_per_target_forward": round(tokens / forwards, 4) if forwards else 0.0,
            "wall_s": round(sum(float(st.get("wall_s") or 0.0) for st in stats) / len(runs), 4),
            "target_forwards": round(forwards / len(runs), 4),
            "perplexity": round(math.exp(nll / scored), 4) if scored else None,
            "distinct_1": round(distinct(outs, 1), 4), "distinct_2": round(distinct(outs, 2), 4),
            "agreement": round(sum(agreement(f, o) for f, o in zip(firsts, outs)) / len(runs), 4),
            "finish_reasons": dict(sorted(Counter(str(st.get("finish_reason")) for st in stats).items())),
        })
    scorer = next((r.get("score", {}).get("scorer") for s in sessions for r in s["runs"] if r.get("score")), None)
    return {"prompts": len(sessions), "model": sessions[0]["model"], "scorer": scorer, "lanes": lanes,
            "sessions": {s["settings"]["study"]["key"]: s["id"] for s in sessions}}


def table(agg: dict[str, Any]) -> str:
    """The aggregate as a fixed-width text table, one row per lane."""
    head = f"{'lane':<4} {'decoder':<20} " + " ".join(f"{t:>9}" for _, t, _ in METRICS) + "  finish"
    rows = [head, "-" * len(head)]
    for lane in agg["lanes"]:
        cells = []
        for key, _, digits in METRICS:
            v = lane.get(key)
            cells.append(f"{'-':>9}" if v is None else f"{v:>9.{digits}f}")
        fin = ", ".join(f"{k} {v}" for k, v in lane["finish_reasons"].items())
        rows.append(f"{lane['lane']:<4} {str(lane['decoder'])[:20]:<20} " + " ".join(cells) + f"  {fin}")
    rows.append(f"{agg['prompts']} prompts · model {agg.get('model')} · perplexity under {agg.get('scorer')}")
    return "\n".join(rows)


def figures(agg: dict[str, Any]) -> dict[str, Any]:
    """Plotly figures of the aggregate: one bar chart per metric, and finish reasons stacked."""
    import plotly.graph_objects as go

    from visualizers._common import LANE_COLOURS, base_layout

    names = [f"{lane['lane']}: {lane['decoder']}" for lane in agg["lanes"]]
    colours = [LANE_COLOURS[k % len(LANE_COLOURS)] for k in range(len(names))]
    out: dict[str, Any] = {}
    for key, title, _ in METRICS:
        ys = [lane.get(key) for lane in agg["lanes"]]
        fig = go.Figure(go.Bar(x=names, y=ys, marker_color=colours, text=[f"{y:.3g}" if y is not None else "" for y in ys]))
        out[key] = base_layout(fig, f"{title} per lane", subtitle=f"{agg['prompts']} prompts · {agg.get('model')}")
    reasons = sorted({r for lane in agg["lanes"] for r in lane["finish_reasons"]})
    fig = go.Figure([go.Bar(x=names, y=[lane["finish_reasons"].get(r, 0) for lane in agg["lanes"]], name=r)
                     for r in reasons])
    fig.update_layout(barmode="stack")
    out["finish_reasons"] = base_layout(fig, "Finish reasons per lane", subtitle=f"{agg['prompts']} prompts")
    return out


def write_figures(agg: dict[str, Any], directory: str | os.PathLike[str]) -> list[Path]:
    """Write each figure as ``DIR/<metric>.html`` (plotly.js once, beside them); return the paths."""
    return write_html_figures(figures(agg), directory)


def write_html_figures(figs: dict[str, Any], directory: str | os.PathLike[str]) -> list[Path]:
    """Write each named plotly figure as ``DIR/<name>.html`` (plotly.js once, beside them); the
    paths. A folder that cannot be made is one line. (Studies and sweeps write theirs so.)"""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PlaygroundError(f"cannot create {directory}: {e.strerror or e}") from None
    paths = []
    for name, fig in figs.items():
        path = d / f"{name}.html"
        fig.write_html(path, include_plotlyjs="directory", full_html=True)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------- sharding
@dataclasses.dataclass
class Ranks:
    """This process's place in a data-parallel launch (rank 0 of 1 when not launched)."""

    rank: int = 0
    world: int = 1
    state: Any = None
    device: str | None = None

    def barrier(self) -> None:
        """Wait until every rank is here (no-op for one process)."""
        if self.state is not None and self.world > 1:
            self.state.wait_for_everyone()


def ranks() -> Ranks:
    """Under ``accelerate launch``/torchrun (``WORLD_SIZE`` > 1): accelerate's
    ``PartialState`` (CPU ranks use gloo: ``cpu=True`` when there is no CUDA)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return Ranks()
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    device = str(state.device) if state.device.type == "cuda" else None
    return Ranks(rank=int(state.process_index), world=int(state.num_processes), state=state, device=device)


def shard_path(out: str, rank: int, world: int) -> str:
    """The store of one rank's shard."""
    return f"{out}.rank{rank}-of-{world}"


def merge(out: str, world: int) -> int:
    """Copy every shard's comparisons into ``out`` (prompts already there are skipped); remove
    the shards once all are in. Returns how many comparisons were added."""
    added = 0
    with Store(out) as main:
        have = {s["settings"]["study"]["key"] for s in study_sessions(main)}
        for r in range(world):
            path = shard_path(out, r, world)
            if not os.path.exists(path):
                continue
            with Store(path) as shard:
                for s in study_sessions(shard):
                    key = s["settings"]["study"]["key"]
                    if key in have:
                        continue
                    main.save_session(s["title"], s["model"], s["prompt"], s["settings"], s["runs"])
                    have.add(key)
                    added += 1
    for r in range(world):
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(shard_path(out, r, world) + suffix)
            except FileNotFoundError:
                pass
    return added


# ---------------------------------------------------------------------- the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``study`` options to ``parser``."""
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS), metavar="FILE.jsonl",
                        help="one JSON object a line with a \"prompt\" (and an optional \"id\"); "
                             "default: the bundled shakespeare-24 set")
    parser.add_argument("--preset", default=None, help="the comparison's lanes (and defaults) from a preset")
    parser.add_argument("--lanes", default=None,
                        help="lanes as JSON ([{\"decoder\": ..., \"knobs\": {...}}, ...]) or decoder names, comma-separated")
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default="study.db", metavar="study.db", help="the study's store (SQLite)")
    parser.add_argument("--scorer", default=DEFAULT_SCORER, help="model that scores the outputs' perplexity")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N prompts")
    parser.add_argument("--report", action="store_true", help="only aggregate what --out holds; run nothing")
    parser.add_argument("--json", action="store_true", help="print the aggregate as JSON")
    parser.add_argument("--figures", default=None, metavar="DIR", help="write plotly figures as HTML into DIR")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (a launched rank takes its own GPU)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")


def _lanes_arg(text: str | None) -> Any:
    if text is None:
        return None
    t = text.strip()
    return t if t.startswith("[") else [x.strip() for x in t.split(",") if x.strip()]


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the study, then print its aggregate; user errors raise :class:`PlaygroundError`."""
    if not args.report and args.preset is None and args.lanes is None:
        raise PlaygroundError("study needs --preset NAME or --lanes")
    where = ranks()
    if not args.report:
        failed: Exception | None = None
        try:
            _run_study(args, where)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the other ranks are released
            if where.world == 1:
                raise
            # a rank that fails still reaches the barrier, so the others do not wait on it forever;
            # what every rank stored is merged, and a re-run resumes the rest
            failed = e
        where.barrier()
        if where.world > 1 and where.rank == 0:
            merge(args.out, where.world)
        where.barrier()
        if failed is not None:
            raise failed
    if where.rank != 0:
        return 0
    if args.report and not os.path.exists(args.out):
        raise PlaygroundError(f"no study at {args.out}")
    with Store(args.out) as store:
        agg = aggregate(study_sessions(store))
    agg["ranks"] = where.world
    if args.figures:
        write_figures(agg, args.figures)
    print(json.dumps(agg, ensure_ascii=False) if args.json else table(agg))
    return 0


def _run_study(args: argparse.Namespace, where: Ranks) -> None:
    from playground.api import plan_compare
    from playground.core.models import load_model

    prompts = read_prompts(args.prompts)
    if args.limit is not None:
        prompts = prompts[:max(args.limit, 0)]
    base = plan_compare(args.preset, _lanes_arg(args.lanes), model=args.model, prompt="", seed=args.seed,
                        max_new_tokens=args.max_new_tokens)
    fp = fingerprint(base, args.scorer)
    device = where.device if where.device and args.device == "auto" else args.device
    load_kwargs = {"device": device, "dtype": args.dtype}
    mine = [(i, key, text) for i, (key, text) in enumerate(prompts) if i % where.world == where.rank]
    path = shard_path(args.out, where.rank, where.world) if where.world > 1 else args.out
    done: set[str] = set()
    if where.world > 1 and os.path.exists(args.out):
        with Store(args.out) as merged:  # prompts an earlier, merged run already did
            done |= stored_keys(merged, fp)
    if os.path.exists(path) or where.world == 1:
        with Store(path) as store:
            done |= stored_keys(store, fp)
    todo = [m for m in mine if m[1] not in done]
    if not todo:
        return  # nothing left for this rank: no (empty) shard is created
    with Store(path) as store:
        scorer = load_model(args.scorer, **load_kwargs)
        bar = _progress(len(mine), len(mine) - len(todo), where, args.no_progress)
        try:
            for index, key, text in todo:
                plan = dataclasses.replace(base, prompt=text)
                try:
                    traces = run_one(plan, scorer, load_kwargs)
                except PlaygroundError as e:
                    raise PlaygroundError(f"prompt {key}: {e}") from None
                save_comparison(store, plan, key, index, fp, traces,
                                {"prompts": Path(args.prompts).name, "rank": where.rank, "world": where.world})
                bar.update(1)
        finally:
            bar.close()


def _progress(total: int, initial: int, where: Ranks, off: bool) -> Any:
    from tqdm import tqdm

    desc = f"study rank {where.rank}/{where.world}" if where.world > 1 else "study"
    return tqdm(total=total, initial=initial, desc=desc, unit="prompt", file=sys.stderr,
                disable=off, position=where.rank, leave=True, dynamic_ncols=True)
