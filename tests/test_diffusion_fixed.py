"""Infilling: words fixed at canvas positions before denoising (the ``fixed`` knob of the
run-recipe and rule-plan diffusion decoders). A fixed position never changes and is never committed by a
plan; the schedule fills only the masked positions; a text of several tokens fills the
positions from its own on; the canvas draws fixed cells apart; every bad value is one line."""

from __future__ import annotations

import pytest

import playground.ui.rules as st
from decoders.diffusion.fixed import parse_fixed
from playground.api import generate
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from visualizers.canvas import canvas_html

PROMPT = "ROMEO: But soft"
RECIPES = ["llada", "dream", "fast_dllm", "sched", "prophet", "pc_sampler", "credit", "masked_diffusion",
           "ass", "ete", "r2_dllm", "localleap", "adablock"]


@pytest.fixture(scope="module")
def diffusion():
    return load_model("tiny-shakespeare-diffusion", device="cpu")


def run(handle, decoder, n=12, **params):
    return prepare(model=handle, decoder=decoder, prompt=PROMPT, max_new_tokens=n, seed=0,
                   params=params).finish().to_dict()


@pytest.mark.parametrize("decoder", RECIPES)
def test_a_fixed_position_never_changes_and_no_plan_commits_it(diffusion, decoder):
    ids = diffusion.tokenizer.encode(" love", add_special_tokens=False)
    assert len(ids) == 1
    t = run(diffusion, decoder, fixed="3: love; 9:\n")
    nl = diffusion.tokenizer.encode("\n", add_special_tokens=False)
    fixed = {3: ids[0], 9: nl[0]}
    for s in t["steps"]:
        assert s["fixed"] == [3, 9]
        assert all(s["canvas"][p] == tok for p, tok in fixed.items())
        assert not set(s["unmasked"]) & set(fixed)
    committed = sorted(p for s in t["steps"] for p in s["unmasked"])
    assert committed == [p for p in range(12) if p not in fixed]  # every other position, once
    assert t["params"]["fixed"] == "3: love;9:\n"


def test_the_schedule_fills_only_the_masked_positions(diffusion):
    t = run(diffusion, "llada", fixed="0:ROMEO")  # steps 0: one commit per masked position
    n_fixed = len(t["steps"][0]["fixed"])
    assert n_fixed >= 1 and t["stats"]["steps"] == 12 - n_fixed
    assert all(len(s["unmasked"]) == 1 for s in t["steps"])


def test_a_text_of_several_tokens_fills_the_positions_from_its_own(diffusion):
    text = " wherefore art thou"
    ids = diffusion.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 1
    t = run(diffusion, "fast_dllm", fixed=f"2:{text}")
    assert t["steps"][0]["fixed"] == list(range(2, 2 + len(ids)))
    assert t["steps"][-1]["canvas"][2:2 + len(ids)] == ids
    html = canvas_html(t, 0)
    assert html.count('class="tok fixed"') == len(ids) and "fixed before denoising" in html


def test_the_api_takes_a_dict_and_a_run_without_fixed_is_unchanged(diffusion):
    a = generate("tiny-shakespeare-diffusion", "llada", PROMPT, max_new_tokens=8, fixed={5: " love"})
    assert a["params"]["fixed"] == "5: love" and a["steps"][0]["fixed"] == [5]
    plain = run(diffusion, "llada", n=8)
    again = run(diffusion, "llada", n=8, fixed="")
    assert plain["output_ids"] == again["output_ids"] and "fixed" not in plain["steps"][0]


@pytest.mark.parametrize("value, line", [
    ("3 love", "is not position:text"),
    ("30:x", "runs past the canvas"),
    ("3:a;3:b", "fixed twice"),
    ("x:y", "is not position:text"),
    ("2:", "has no text"),
    ("1:" + "z" * 65, "at most 64"),
    (";".join(f"{i}:a" for i in range(33)), "at most 32"),
], ids=["no colon", "past the canvas", "twice", "not a number", "no text", "long text", "too many"])
def test_a_bad_value_is_one_line(diffusion, value, line):
    with pytest.raises(PlaygroundError, match=line) as e:
        run(diffusion, "llada", fixed=value)
    assert "\n" not in str(e.value)
    # the page refuses it next to the control, before anything runs (where the canvas size is not needed)
    if "canvas" not in line and "twice" not in line:
        assert line in (st.knob_error("llada", "fixed", value) or "")


def test_parse_keeps_the_text_after_the_colon_verbatim():
    assert parse_fixed("4: love;  7:Juliet ") == [(4, " love"), (7, "Juliet ")]
    assert parse_fixed({"2": "a", 5: "b"}) == [(2, "a"), (5, "b")]
