"""``playground study``: prompt sets, resumable runs, aggregates from stored traces, accelerate shards."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from playground.cli import main
from playground.core.errors import PlaygroundError
from playground.store import Store
from playground.study import (DEFAULT_PROMPTS, agreement, aggregate, distinct, read_prompts, study_sessions,
                              table)

ROOT = Path(__file__).resolve().parents[1]
LANES = "greedy,top_p"
ARGS = ["--lanes", LANES, "--max-new-tokens", "6", "--seed", "2", "--no-progress"]


def _env() -> dict[str, str]:
    # one thread per process: the machine is small and shared
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _prompts(tmp: Path, n: int) -> Path:
    path = tmp / f"prompts{n}.jsonl"
    recs = read_prompts(DEFAULT_PROMPTS)[:n]
    path.write_text("".join(json.dumps({"id": k, "prompt": p}) + "\n" for k, p in recs))
    return path


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """A four-prompt study run in this process: (its store, the JSON it printed)."""
    tmp = tmp_path_factory.mktemp("study")
    out = tmp / "study.db"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["study", "--prompts", str(_prompts(tmp, 4)), *ARGS, "--out", str(out), "--json",
                     "--figures", str(tmp / "figs")]) == 0
    return out, json.loads(buf.getvalue()), tmp


def _by_key(path: Path) -> dict[str, list[dict]]:
    with Store(path) as s:
        return {sess["settings"]["study"]["key"]: sess["runs"] for sess in study_sessions(s)}


def test_aggregates_recomputed_from_stored_traces_equal_the_printed_table(one_process, capsys):
    out, printed, tmp = one_process
    with Store(out) as s:
        again = aggregate(study_sessions(s))
    assert printed.pop("ranks") == 1
    assert again == printed
    assert printed["prompts"] == 4 and [lane["decoder"] for lane in printed["lanes"]] == ["greedy", "top_p"]
    lane1, lane2 = printed["lanes"]
    assert lane1["agreement"] == 1.0 and lane1["tokens"] == 24 and lane1["target_forwards"] == 6.0
    assert lane1["tokens_per_target_forward"] == 1.0 and lane1["finish_reasons"] == {"length": 4}
    assert lane1["perplexity"] > 1 and 0 < lane2["distinct_1"] <= 1
    # each comparison is a session: the sessions CLI opens it
    sid = printed["sessions"][next(iter(printed["sessions"]))]
    assert main(["sessions", "--db", str(out), "show", sid, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["score"]["scorer"] == "tiny-shakespeare"
    # the text table is the same aggregate
    assert main(["study", "--out", str(out), "--report"]) == 0
    assert capsys.readouterr().out.strip() == table(again)
    names = {p.name for p in (tmp / "figs").iterdir()}
    assert {"perplexity.html", "agreement.html", "finish_reasons.html", "plotly.min.js"} <= names


def test_rerun_skips_every_stored_prompt(one_process, capsys):
    out, printed, tmp = one_process
    before = _by_key(out)
    assert main(["study", "--prompts", str(_prompts(tmp, 4)), *ARGS, "--out", str(out), "--json"]) == 0
    assert _by_key(out) == before


def test_another_study_in_the_same_store_is_refused(one_process, capsys):
    out, _, tmp = one_process
    assert main(["study", "--prompts", str(_prompts(tmp, 4)), "--lanes", "greedy", "--max-new-tokens", "6",
                 "--out", str(out), "--no-progress"]) == 2
    assert "holds a study with other settings" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_after_a_kill_mid_study_runs_every_prompt_exactly_once(tmp_path):
    out = tmp_path / "study.db"
    cmd = [sys.executable, "-m", "playground", "study", "--prompts", str(_prompts(tmp_path, 8)), *ARGS,
           "--out", str(out)]
    child = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stored = 0
    try:
        while child.poll() is None and stored < 1:
            time.sleep(0.05)
            if out.exists():
                try:
                    conn = sqlite3.connect(out)
                    stored = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
                    conn.close()
                except sqlite3.OperationalError:
                    pass  # the child is still creating the schema
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert 1 <= len(_by_key(out)) < 8
    done = subprocess.run(cmd + ["--json"], cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    conn = sqlite3.connect(out)
    titles = [r[0] for r in conn.execute("SELECT title FROM sessions")]
    conn.close()
    keys = [k for k, _ in read_prompts(tmp_path / "prompts8.jsonl")]
    assert sorted(titles) == sorted(f"study {k}" for k in keys)  # every prompt, none twice
    assert json.loads(done.stdout)["prompts"] == 8


@pytest.mark.slow
def test_two_accelerate_processes_equal_one_process_prompt_for_prompt(one_process, tmp_path):
    ref_out, ref, tmp = one_process
    out = tmp_path / "two.db"
    # --multi_gpu on a CPU-only machine starts two torchrun workers (each a MULTI_CPU
    # PartialState); --cpu --num_processes 2 would start only one
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "playground", "study", "--prompts", str(_prompts(tmp, 4)), *ARGS, "--out", str(out), "--json"]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    printed = json.loads(r.stdout.strip().splitlines()[-1])
    assert printed["ranks"] == 2
    assert not list(tmp_path.glob("two.db.rank*"))  # rank 0 merged the shards and removed them
    two, one = _by_key(out), _by_key(ref_out)
    assert sorted(two) == sorted(one)
    with Store(out) as s:
        assert sorted({sess["settings"]["study"]["rank"] for sess in study_sessions(s)}) == [0, 1]
    for key in one:
        for a, b in zip(one[key], two[key], strict=True):
            assert (a["decoder"], a["output_ids"], a["text"], a["score"]) == \
                (b["decoder"], b["output_ids"], b["text"], b["score"])
    for lane_a, lane_b in zip(ref["lanes"], printed["lanes"], strict=True):
        for k in ("tokens", "tokens_per_target_forward", "target_forwards", "perplexity", "distinct_1",
                  "distinct_2", "agreement", "finish_reasons"):
            assert lane_a[k] == lane_b[k]


def test_metric_definitions():
    assert distinct([[1, 2, 1, 2]], 1) == 0.5 and distinct([[1, 2, 1, 2]], 2) == pytest.approx(2 / 3)
    assert distinct([[1, 2], [1, 2]], 2) == 0.5 and distinct([[]], 2) == 0.0
    assert agreement([1, 2, 3], [1, 5, 3, 4]) == 0.5 and agreement([], []) == 1.0
    assert aggregate([])["lanes"] == []


@pytest.mark.parametrize("text,msg", [
    ("{not json\n", "line 1 is not JSON"),
    ('{"id": 1}\n', "needs a non-empty"),
    ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', "appears twice"),
    ("\n\n", "holds no prompts"),
])
def test_bad_prompt_files(tmp_path, text, msg):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(PlaygroundError, match=msg):
        read_prompts(path)


def test_study_needs_lanes_and_report_needs_a_study(tmp_path, capsys):
    assert main(["study", "--out", str(tmp_path / "x.db")]) == 2
    assert "needs --preset NAME or --lanes" in capsys.readouterr().err
    assert main(["study", "--out", str(tmp_path / "x.db"), "--report"]) == 2
    assert "no study at" in capsys.readouterr().err


def test_bundled_prompt_set_is_scene_openings_from_the_held_out_split():
    from playground.study_prompts import scene_openings
    from playground.tiny_data import load_corpus

    shipped = [json.loads(line) for line in DEFAULT_PROMPTS.read_text().splitlines()]
    assert len(shipped) == 24 and shipped == scene_openings()
    train, val = load_corpus()
    for rec in shipped:
        assert any(rec["prompt"].strip() in v for v in val)
        assert not any(rec["prompt"].strip() in t for t in train)


def test_shards_resume_and_merge_exactly_once(one_process, tmp_path):
    """Two ranks simulated in this process: each writes its own shard (every other prompt); a
    rank run again resumes its shard; the merge adds each prompt once, and again adds nothing."""
    import argparse

    from playground.study import Ranks, _run_study, add_arguments, merge, shard_path

    ref_out, _, tmp = one_process
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = str(tmp_path / "s.db")
    args = parser.parse_args(["--prompts", str(_prompts(tmp, 4)), *ARGS, "--out", out])
    for rank in (0, 1, 1):  # rank 1 "restarted": its shard is complete, nothing runs twice
        _run_study(args, Ranks(rank=rank, world=2))
    shards = [_by_key(Path(shard_path(out, r, 2))) for r in (0, 1)]
    keys = [k for k, _ in read_prompts(tmp / "prompts4.jsonl")]
    assert sorted(shards[0]) == sorted(keys[0::2]) and sorted(shards[1]) == sorted(keys[1::2])
    assert merge(out, 2) == 4 and not list(tmp_path.glob("s.db.rank*"))
    assert merge(out, 2) == 0
    merged, one = _by_key(Path(out)), _by_key(ref_out)
    assert sorted(merged) == sorted(keys)
    for key in keys:
        assert [r["output_ids"] for r in merged[key]] == [r["output_ids"] for r in one[key]]
    # a later run of a rank finds its prompts in the merged store and runs nothing
    _run_study(args, Ranks(rank=0, world=2))
    assert not os.path.exists(shard_path(out, 0, 2))
