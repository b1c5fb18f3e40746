"""The sampler sandbox (no model): a typed distribution or a recorded step cut by the chain's own
processors. On a recorded step of a sampling run the sandbox draws what the run drew (same
processors, same noise); the stage evidence is the chain's; typed input and knobs are checked
in one line; the Sandbox tab's handlers load a step from a stored session and draw the plots."""

from __future__ import annotations

import html

import pytest
import torch

from decoders.processors import History, build_chain
from playground.api import generate
from playground.core.errors import PlaygroundError
from playground.sandbox import apply_chain, parse_distribution, recorded_step
from playground.store import default_store

pytestmark = pytest.mark.slow  # the handler tests build the Gradio app


@pytest.fixture(scope="module")
def sampled():
    return generate("tiny-shakespeare", "sample", "ROMEO:\n", max_new_tokens=12, seed=11, top_k=6, min_p=0.05,
                    temperature=0.9)


def test_on_a_recorded_step_the_sandbox_draws_what_the_run_drew(sampled):
    for i in range(len(sampled["steps"])):
        res = apply_chain(recorded_step(sampled, i), {"top_k": 6, "min_p": 0.05, "temperature": 0.9})
        assert res["drawn_id"] == sampled["output_ids"][i], i
        kept = {t for t, p in zip(sampled["steps"][i]["dist"]["top_ids"], sampled["steps"][i]["dist"]["final_probs"])
                if p > 0}
        labels = {sampled["tokens"][str(t)] for t in kept}
        assert set(res["final"]) == labels  # the same tokens survive the chain


def test_the_stage_evidence_is_the_chains_own():
    d = parse_distribution("the 0.4\na 0.3\nthou 0.2\nRomeo 0.1", seed=3)
    res = apply_chain(d, {"top_k": 3, "min_p": 0.6, "order": "top_k,min_p,temperature"})
    stages = res["trace"]["steps"][0]["chain"]
    want: list = []
    build_chain({"top_k": 3, "min_p": 0.6, "order": "top_k,min_p,temperature"})(
        d.logits.clone(), History(ids=[], prompt_len=0, pos=0), want)
    assert [s["stage"] for s in stages] == [s["stage"] for s in want] and [s["kept"] for s in stages] == [3, 2]
    assert stages[0]["top_removed"] == [[3, 0.1]]  # top-k cut Romeo (id 3) at p = 0.1
    assert set(res["final"]) == {"the", "a"} and res["drawn"] in {"the", "a"}
    assert res["final"]["the"] == pytest.approx(0.4 / 0.7, rel=1e-4)
    # the same seed draws the same, typed or not; logits give the same as their probabilities
    same = apply_chain(parse_distribution("the 0.4\na 0.3\nthou 0.2\nRomeo 0.1", seed=3), {"top_k": 3, "min_p": 0.6})
    assert same["drawn"] == res["drawn"]
    logits = "\n".join(f"{w} {float(torch.log(torch.tensor(p)))}" for w, p in
                       [("the", 0.4), ("a", 0.3), ("thou", 0.2), ("Romeo", 0.1)])
    assert apply_chain(parse_distribution(logits, "logits", 3), {"top_k": 3})["final"] == \
        pytest.approx(apply_chain(d, {"top_k": 3})["final"], rel=1e-5)


def test_a_mass_rule_on_a_recorded_step_says_its_cut_may_differ(sampled):
    res = apply_chain(recorded_step(sampled, 0), {"top_p": 0.5})
    assert "renormalised" in res["note"]
    assert apply_chain(recorded_step(sampled, 0), {"top_k": 3})["note"] == ""


@pytest.mark.parametrize("text, kind, line", [
    ("", "probabilities", "type a distribution"),
    ("the", "probabilities", "is not 'token value'"),
    ("the 0.5", "probabilities", "at least two tokens"),
    ("the 0.5\nthe 0.2", "probabilities", "listed twice"),
    ("the -1\na 2", "probabilities", "is not a probability"),
    ("the 0\na 0", "probabilities", "sum to 0"),
    ("\n".join(f"t{i} 1" for i in range(201)), "probabilities", "at most 200"),
    ("the 1\na 2", "odds", "values are"),
], ids=["empty", "no value", "one token", "twice", "negative", "zero", "too many", "kind"])
def test_bad_typed_input_is_one_line(text, kind, line):
    with pytest.raises(PlaygroundError, match=line) as e:
        parse_distribution(text, kind)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("knobs, line", [({"top_k": -1}, "top_k"), ({"top_p": 2}, "top_p"),
                                         ({"dry_multiplier": 1}, "no knob"), ({"order": "top_k,bogus"}, "bogus")])
def test_bad_knobs_are_one_line(knobs, line):
    with pytest.raises(PlaygroundError, match=line):
        apply_chain(parse_distribution("a 1\nb 1"), knobs)


def test_the_tab_loads_a_stored_step_and_draws_both_plots(demo, db, sampled):
    view = demo.sandbox_view
    sid = default_store().save_session("s", "tiny-shakespeare", "ROMEO:\n", {}, [sampled])
    up = view.on_load(sid, None, 1, 4)
    assert up[view.source] == "recorded" and "Loaded lane 1, step 4" in html.unescape(up[view.status])
    knobs = [0.9, 6, 1.0, 0.05, 1.0, 0.0, 0.0, 0.0, "penalties,dry,no_repeat_ngram,top_n_sigma,top_k,typical,top_p,"
             "min_p,epsilon,eta,xtc,temperature,mirostat"]
    out = view.on_apply("recorded", "", "probabilities", 0, up[view.recorded], *knobs)
    drawn = sampled["tokens"][str(sampled["output_ids"][4])]
    assert f"Drew {drawn!r}" in html.unescape(out[view.status])
    assert out[view.chain_plot].data and out[view.dist_plot].data
    # with no id, the Compare tab's session; a bad pick is one line
    assert "Loaded" in html.unescape(view.on_load("", sid, 1, 0)[view.status])
    for args, line in [(("", None, 1, 0), "give a session id"), ((sid, None, 3, 0), "lanes 1 to 1"),
                       ((sid, None, 1, 99), "steps 0 to"), (("A" * 32, None, 1, 0), "no session"),
                       ((sid, None, float("inf"), 0), "whole number"), ((sid, None, 1, float("nan")), "whole number")]:
        assert line in html.unescape(view.on_load(*args)[view.status])
    assert "load a recorded step first" in html.unescape(view.on_apply("recorded", "", "probabilities", 0, None,
                                                                       *knobs)[view.status])
