"""Forced tokens (counterfactual branches): the API, the CLI, every decoder family, the trace."""

from __future__ import annotations

import json

import pytest

import playground
from playground.cli import main
from playground.core.errors import PlaygroundError
from playground.force import forced_positions, parse_force
from playground.core.trace import Trace

MODEL, DRAFT = "tiny-shakespeare", "tiny-shakespeare-draft"
BASE = dict(model=MODEL, prompt="ROMEO:", max_new_tokens=14, seed=3)
POS = 5


def _gen(decoder: str, **kw):
    return playground.generate(decoder=decoder, **{**BASE, **kw})


def _other(token: int) -> int:
    return 100 if token != 100 else 101


def _strip_times(steps):
    return [{k: v for k, v in s.items() if k != "t"} for s in steps]


@pytest.mark.parametrize("decoder,knobs", [("greedy", {}), ("top_p", {"p": 0.9}), ("cfg", {})])
def test_forcing_the_chosen_token_reproduces_the_parent_exactly(decoder, knobs):
    parent = _gen(decoder, **knobs)
    tok = parent["output_ids"][POS]
    branch = _gen(decoder, force=[[POS, tok]], **knobs)
    assert branch["output_ids"] == parent["output_ids"] and branch["text"] == parent["text"]
    assert branch["force"] == [[POS, tok]]
    # the evidence is the parent's, step for step; the forced step only gains its marker
    marked = [s for s in branch["steps"] if "forced" in s]
    assert [s["i"] for s in marked] == [POS]
    assert marked[0]["forced"] == [{"position": POS, "token": tok, "picked": tok}]
    for s in branch["steps"]:
        s.pop("forced", None)
    assert _strip_times(branch["steps"]) == _strip_times(parent["steps"])


@pytest.mark.parametrize("decoder,knobs", [("greedy", {}), ("top_p", {"p": 0.9}), ("fsd", {})])
def test_forcing_another_token_changes_the_lane_from_that_step_only(decoder, knobs):
    parent = _gen(decoder, **knobs)
    tok = _other(parent["output_ids"][POS])
    branch = _gen(decoder, force=[[POS, tok]], **knobs)
    assert branch["output_ids"][:POS] == parent["output_ids"][:POS]
    assert _strip_times(branch["steps"][:POS]) == _strip_times(parent["steps"][:POS])
    assert branch["output_ids"][POS] == tok
    step = branch["steps"][POS]
    assert step["forced"] == [{"position": POS, "token": tok, "picked": parent["output_ids"][POS]}]
    # the step keeps the model's own distribution: the same as the parent's at that step
    assert step["dist"]["top_ids"][:5] == parent["steps"][POS]["dist"]["top_ids"][:5]
    assert step["dist"]["chosen"] == tok


@pytest.mark.parametrize("decoder,knobs", [
    ("speculative", {"draft": DRAFT, "temperature": 0.0}),
    ("prompt_lookup", {}), ("jacobi", {}), ("lookahead", {}), ("layer_skip", {}),
])
def test_lossless_speculative_with_a_force_equals_greedy_with_it(decoder, knobs):
    parent = _gen("greedy")
    force = [[POS, _other(parent["output_ids"][POS])]]
    want = _gen("greedy", force=force)["output_ids"]
    got = _gen(decoder, force=force, **knobs)
    assert got["output_ids"] == want
    marked = [f for s in got["steps"] for f in s.get("forced", [])]
    assert marked == [{"position": POS, "token": force[0][1]}]
    # forcing what greedy picked anyway changes nothing
    assert _gen(decoder, force=[[POS, parent["output_ids"][POS]]], **knobs)["output_ids"] == parent["output_ids"]


def test_beam_search_keeps_the_forced_token_in_its_best_hypothesis():
    # A search is not a lane that picked one token per step: the force constrains every beam, so
    # which beams survive (and the best prefix) may change, even when forcing the token the best
    # hypothesis had. What holds is that the result carries the forced token.
    parent = _gen("beam", num_beams=3)
    for tok in (_other(parent["output_ids"][POS]), parent["output_ids"][POS]):
        branch = _gen("beam", num_beams=3, force=[[POS, tok]])
        assert branch["output_ids"][POS] == tok and branch["force"] == [[POS, tok]]


@pytest.mark.parametrize("decoder,model,why", [
    ("llada", "tiny-shakespeare-diffusion", "no fixed order"),
    ("contrastive_search", MODEL, "re-ranks"),
    ("lookback", MODEL, "re-ranks"),
])
def test_decoders_that_cannot_be_forced_refuse_in_one_line(decoder, model, why):
    with pytest.raises(PlaygroundError) as e:
        playground.generate(model=model, decoder=decoder, prompt="ROMEO:", max_new_tokens=8, force=[[1, 5]])
    assert why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("force,msg", [
    ([[20, 5]], "past max_new_tokens"),
    ([[1, 10**6]], "outside the vocabulary"),
    ([[1, 5], [1, 6]], "two tokens for position 1"),
    ([[-1, 5]], ">= 0"),
    ([[1.5, 5]], "whole number"),
    (["5-3"], "POSITION:TOKEN_ID"),
    ([[1, 2, 3]], "pair"),
    ("[[1,", "not valid JSON"),
])
def test_bad_forces_are_one_line_errors(force, msg):
    with pytest.raises(PlaygroundError, match=msg):
        playground.generate(model=MODEL, decoder="greedy", prompt="ROMEO:", max_new_tokens=8, force=force)


def test_force_forms_agree():
    want = {2: 7, 5: 1234}
    assert parse_force([[5, 1234], [2, 7]]) == want
    assert parse_force(["5:1234", "2:7"]) == want
    assert parse_force("5:1234, 2:7") == want
    assert parse_force("[[5, 1234], [2, 7]]") == want
    assert parse_force({"5": 1234, 2: 7}) == want
    assert parse_force(None) == {} and parse_force([]) == {}


def test_cli_force(capsys):
    parent = _gen("greedy", max_new_tokens=8)
    tok = _other(parent["output_ids"][2])
    assert main(["generate", "--model", MODEL, "--prompt", "ROMEO:", "--max-new-tokens", "8", "--seed", "3",
                 "--force", f"2:{tok}", "--json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert trace["output_ids"][2] == tok and trace["force"] == [[2, tok]]
    assert main(["generate", "--model", MODEL, "--prompt", "ROMEO:", "--force", "two:3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_a_forced_trace_replays_without_a_model():
    branch = _gen("greedy", force=[[POS, 100]])
    again = Trace.from_json(json.dumps(branch)).to_dict()
    assert forced_positions(again) == {POS: 100}
    assert again["steps"][POS]["forced"][0]["token"] == 100
    bad = dict(branch, force=[[POS, "x"]])
    with pytest.raises(ValueError, match="force"):
        Trace.from_dict(bad)


def test_every_decoder_honours_a_force_or_refuses_in_one_line():
    from decoders import all_decoders

    honoured, refused = [], []
    for cls in all_decoders():
        model = "tiny-shakespeare-diffusion" if cls.kind == "diffusion" else MODEL
        kw = {"draft": DRAFT} if cls.needs_draft else {}
        try:
            # (cad needs a blank line between context and question)
            trace = playground.generate(model=model, decoder=cls.name, prompt="Of Rome.\n\nROMEO:",
                                        max_new_tokens=6, seed=0, force=[[2, 100]], **kw)
        except PlaygroundError as e:
            assert "\n" not in str(e) and "cannot take forced tokens" in str(e), (cls.name, str(e))
            refused.append(cls.name)
            continue
        out = trace["output_ids"]
        assert len(out) <= 2 or out[2] == 100, cls.name  # a run may stop (eos) before the position
        assert trace["force"] == [[2, 100]]
        honoured.append(cls.name)
    # the autoregressive families at least
    for name in ("greedy", "sample", "top_p", "mirostat", "beam", "best_of_n", "speculative", "spec_tree",
                 "prompt_lookup", "jacobi", "lookahead", "cfg", "dola", "fsd"):
        assert name in honoured
    assert "llada" in refused
