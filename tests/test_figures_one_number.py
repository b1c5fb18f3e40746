"""One figure, one number: for every speculative, collab and guided decoder of the registry,
the figures the lane's stats line shows equal the trace's stored stats, and both equal the
definition in playground/core/trace.py applied to the trace's steps; the watermark detector on a
lane's token ids gives the lane's own z."""

from __future__ import annotations

import json
import re

import pytest

import decoders  # noqa: F401 - registers every family
from decoders.base import REGISTRY
from playground.engine import run_to_end
from playground.core.trace import FIGURE_NAMES, Step, draft_counts, step_figures
from visualizers.tokens import stats_figures, stats_line
from visualizers.tree import acceptance_timeline, accepted_length_histogram

FAMILIES = ("speculative", "collab", "guided")
DECODERS = sorted(n for n, c in REGISTRY.items() if c.family in FAMILIES)
PROMPT = "Romeo.\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
NEEDS = {"deal": {"keywords": "love"}, "constrained_beam": {"force_words": "Romeo"}, "span_extract": {"passage": "It is the east, and Juliet is the sun."}}
# knobs that make the lane reject and replace drafted tokens on this prompt, so the counts of a
# tree's never-reached nodes matter (the cascade's 36 of 39 vs 36 of 46)
KNOBS = {"spec_cascade": {"gamma": 4, "rule": "opt", "alpha": 0.3}}
SPEC_KEYS = ("acceptance_rate", "mean_accepted_length", "tokens_per_verification", "drafted_tokens",
             "accepted_tokens", "verifications")


def _title(fig) -> str:
    """A figure's title with its subtitle lines."""
    return f"{fig.layout.title.text} · {fig.layout.title.subtitle.text or ''}"


def _draft_for(cls) -> str | None:
    if not cls.needs_draft:
        return None
    return "tiny-shakespeare-diffusion" if getattr(cls, "draft_kind", "causal") == "diffusion" else "tiny-shakespeare-draft"


@pytest.fixture(scope="module")
def traces():
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cls = REGISTRY[name]
            tr = run_to_end(model="tiny-shakespeare", decoder=name, prompt=PROMPT, max_new_tokens=40, seed=0,
                            draft=_draft_for(cls), params={**NEEDS.get(name, {}), **KNOBS.get(name, {})})
            cache[name] = json.loads(tr.to_json())  # the stored form, as a session keeps it
        return cache[name]

    return get


def test_the_families_have_decoders():
    assert {"speculative", "spec_cascade", "watermark", "diffuspec"} <= set(DECODERS)


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODERS)
def test_stats_line_figures_equal_stored_stats_equal_the_definition(traces, name):
    tr = traces(name)
    stats, defined, shown = tr["stats"], step_figures(tr["steps"]), stats_figures(tr)
    line = stats_line(tr)
    drafts = any(s["kind"] in ("draft", "jacobi") for s in tr["steps"])
    assert ("acceptance_rate" in defined) == drafts
    for key in defined:
        assert stats.get(key) == defined[key] == shown[key], f"{name}: {key}"
    for key in SPEC_KEYS:
        if key in stats:  # a stored speculative figure always has its definition behind it
            assert stats[key] == defined.get(key), f"{name}: stored {key} has no equal in the steps"
    assert shown["new_tokens"] == stats["new_tokens"] and shown["target_forwards"] == stats["target_forwards"]
    assert shown["tokens_per_target_forward"] == stats["tokens_per_target_forward"]
    if stats["target_forwards"]:
        assert f"{stats['tokens_per_target_forward']:.2f} {FIGURE_NAMES['tokens_per_target_forward']}" in line
    if drafts:
        assert f"{FIGURE_NAMES['acceptance_rate']} {100 * stats['acceptance_rate']:.0f}%" in line
        assert f"{FIGURE_NAMES['mean_accepted_length']} {stats['mean_accepted_length']:.2f}" in line
    if any(s["kind"] == "draft" for s in tr["steps"]):  # the tree plots' titles state the same figures
        hist = _title(accepted_length_histogram(tr))
        assert f"{stats['mean_accepted_length']:.2f}" in hist and f"{stats['tokens_per_verification']:.2f}" in hist
        if stats["drafted_tokens"]:
            assert f"{100 * stats['acceptance_rate']:.0f}%" in _title(acceptance_timeline(tr))
    if "changed_tokens" in stats:
        assert f"{stats['changed_tokens']} {FIGURE_NAMES['changed_tokens']}" in line
    if "watermark" in stats:
        wm = stats["watermark"]
        assert f"{FIGURE_NAMES['watermark_z']} {wm['z']:.2f} ({wm['green']}/{wm['scored']} green)" in line


@pytest.mark.slow
def test_cascade_counts_every_drafted_token_and_shows_its_changed_tokens(traces):
    tr = traces("spec_cascade")
    stats = tr["stats"]
    counts = draft_counts(tr["steps"])
    assert counts is not None and counts[0] == stats["drafted_tokens"]
    # the preset's knobs replace some drafted tokens, so some tree nodes were never reached
    assert stats["acceptance_rate"] < 1.0
    assert any(n["accept_prob"] is None for s in tr["steps"] for n in s["tree"]["nodes"])
    assert stats["changed_tokens"] > 0 and f"{stats['changed_tokens']} changed tokens" in stats_line(tr)


@pytest.mark.slow
def test_watermark_detector_on_the_lanes_ids_gives_the_lanes_z(traces):
    from decoders.guided.watermark import detect_ids

    tr = traces("watermark")
    knobs = tr["params"]
    res = detect_ids(tr["model"], tr["output_ids"], tr["prompt_ids"], gamma=knobs["watermark_gamma"],
                     key=knobs["watermark_key"], seeding=knobs["watermark_seeding"],
                     context_width=knobs["watermark_context_width"])
    wm = tr["stats"]["watermark"]
    assert (res["green"], res["scored"]) == (wm["green"], wm["scored"])
    assert round(res["z"], 4) == wm["z"] == tr["steps"][-1]["watermark"]["z"]
    assert res["p_value"] == pytest.approx(wm["p_value"], rel=1e-12)


def test_watermark_cli_scores_a_saved_lane(tmp_path, capsys):
    """--trace scores the run's ids with its own settings: the lane's z, not its re-encoded text's."""
    from playground.cli import main

    tr = run_to_end(model="tiny-shakespeare", decoder="watermark", prompt="Romeo.\n", max_new_tokens=16, seed=7,
                    params={"watermark_gamma": 0.5, "watermark_delta": 4.0})
    session = {"runs": [json.loads(tr.to_json())]}
    path = tmp_path / "lane.json"
    path.write_text(json.dumps(session), encoding="utf-8")
    assert main(["watermark-detect", "--trace", str(path), "--lane", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    wm = tr.stats["watermark"]
    assert (res["green"], res["scored"], res["gamma"]) == (wm["green"], wm["scored"], 0.5)
    assert main(["watermark-detect", "--trace", str(path), "--lane", "2"]) == 2
    assert "lanes 1..1" in capsys.readouterr().err


def test_empty_text_message_names_no_cli_flag_outside_the_cli(capsys):
    from decoders.guided.watermark import detect_text
    from playground.cli import main
    from playground.core.errors import PlaygroundError

    with pytest.raises(PlaygroundError) as e:
        detect_text("tiny-shakespeare", "  ")
    assert "--" not in str(e.value) and "text" in str(e.value)
    assert main(["watermark-detect", "--text", ""]) == 2
    assert "--text" in capsys.readouterr().err


def _tree_step(nodes, path, committed):
    return {"kind": "draft", "committed": committed,
            "tree": {"nodes": nodes, "accepted_path": path, "correction": committed[-1], "correction_kind": "resample"}}


def test_step_figures_count_never_reached_nodes_and_flags():
    nodes = [{"id": 0, "parent": None, "token": 5, "accepted": True, "changed": True},
             {"id": 1, "parent": 0, "token": 6, "accepted": False, "changed": False},
             {"id": 2, "parent": 1, "token": 7, "accepted": False, "accept_prob": None}]
    steps = [_tree_step(nodes, [0], [5, 9]), Step("draft", [3], tree={"nodes": nodes[:1], "accepted_path": []})]
    f = step_figures(steps)
    assert (f["drafted_tokens"], f["accepted_tokens"], f["verifications"]) == (4, 1, 2)
    assert f["acceptance_rate"] == 0.25 and f["tokens_per_verification"] == 1.5
    assert f["changed_tokens"] == 1 and "lossy_tokens" not in f


def test_watermark_figures_recompute_z_from_the_green_flags():
    marks = [None, True, True, False, True]
    steps = [{"kind": "token", "committed": [1], "watermark": {"green": g, "gamma": 0.25}} for g in marks]
    wm = step_figures(steps)["watermark"]
    assert (wm["green"], wm["scored"]) == (3, 4)
    assert wm["z"] == round((3 - 1) / (4 * 0.25 * 0.75) ** 0.5, 4)
    line = stats_line({"stats": {"new_tokens": 5, "target_forwards": 5}, "steps": steps, "output_ids": [1] * 5})
    assert re.search(r"watermark z 2\.31 \(3/4 green\)", line)
