"""Infilling: words fixed at canvas positions before denoising (the ``fixed`` knob of the
run-recipe and rule-plan diffusion decoders, and of ``apd``, ``dingo`` and ``freedave``). A
fixed position never changes and is never committed by a plan; the schedule fills only the
masked positions; a text of several tokens fills the positions from its own on; the canvas
draws fixed cells apart; every bad value is one line, the same for every decoder; ``freedave``
with fixed words is still exactly one-commit-per-step ``llada`` with the same words. The rules
of ``apd`` and ``dingo`` with fixed words are tested in their own files."""

from __future__ import annotations

import pytest

import playground.ui.rules as st
from decoders.diffusion.fixed import parse_fixed
from playground.api import generate
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from test_visualizers import render_everything
from visualizers.canvas import canvas_html

PROMPT = "ROMEO: But soft"
# decoders with their own loop (not run_recipe / run_rule): the knobs that make them run here
OWN_LOOPS = {"apd": {"max_lookahead": 4, "mixture_weight": 0.3},
             "dingo": {"regex": "[A-Za-z ,.!?;:'\n]+", "steps": 12},
             "freedave": {"block_length": 4}}
RECIPES = ["llada", "dream", "fast_dllm", "sched", "prophet", "pc_sampler", "credit", "masked_diffusion",
           "ass", "ete", "r2_dllm", "localleap", "adablock"]


@pytest.fixture(scope="module")
def diffusion():
    return load_model("tiny-shakespeare-diffusion", device="cpu")


@pytest.fixture(scope="module")
def helper():
    return load_model("tiny-shakespeare-draft", device="cpu")


def run(handle, decoder, n=12, draft=None, seed=0, **params):
    return prepare(model=handle, decoder=decoder, prompt=PROMPT, max_new_tokens=n, seed=seed, draft=draft,
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


@pytest.mark.parametrize("decoder", sorted(OWN_LOOPS))
def test_a_fixed_position_never_changes_on_the_decoders_with_their_own_loop(diffusion, helper, decoder):
    love = diffusion.tokenizer.encode(" love", add_special_tokens=False)[0]
    nl = diffusion.tokenizer.encode("\n", add_special_tokens=False)[0]
    fixed = {3: love, 9: nl}
    t = run(diffusion, decoder, draft=helper if decoder == "apd" else None, fixed="3: love; 9:\n",
            **OWN_LOOPS[decoder])
    assert t["steps"], "nothing ran"
    for s in t["steps"]:
        assert s["fixed"] == [3, 9]
        assert all(s["canvas"][p] == tok for p, tok in fixed.items())
        assert not set(s["unmasked"]) & set(fixed)
        assert not s["remasked"]
    committed = sorted(p for s in t["steps"] for p in s["unmasked"])
    assert committed == [p for p in range(12) if p not in fixed]  # every other position, once
    assert all(t["output_ids"][p] == tok for p, tok in fixed.items())  # and the output holds them
    assert t["params"]["fixed"] == "3: love;9:\n"
    assert [t["stats"]["commit_step"][p] for p in fixed] == [-1, -1]  # no step committed them
    html = canvas_html(t, 0)
    assert html.count('class="tok fixed"') == 2 and "fixed before denoising" in html
    render_everything(t)  # every view of the decoder takes a run with fixed cells


@pytest.mark.parametrize("temperature,block", [(0.0, 0), (0.0, 4), (0.8, 4), (1.0, 0)])
def test_freedave_with_fixed_words_is_one_commit_per_step_llada_with_them(diffusion, temperature, block):
    """Lossless still: the static decoder it reproduces is LLaDA committing one masked position
    per step around the same fixed words; positions 4-7 (ROMEO, four tokens) fill a whole block
    of 4 before the first step, so that block has no step at all."""
    knobs = {"temperature": temperature, "block_length": block, "fixed": "4:ROMEO; 10: love"}
    static = run(diffusion, "llada", n=16, seed=3, **knobs)
    fd = run(diffusion, "freedave", n=16, seed=3, draft_size=4, **knobs)
    assert fd["output_ids"] == static["output_ids"]
    assert fd["steps"][-1]["canvas"] == static["steps"][-1]["canvas"]
    assert fd["stats"]["static_steps"] == static["stats"]["steps"] == 16 - 5
    assert fd["stats"]["target_forwards"] <= static["stats"]["target_forwards"]
    assert all(s["fixed"] == [4, 5, 6, 7, 10] for s in fd["steps"])
    if block:  # the drafts stay in the block static decoding is filling, which skips the full one
        assert all(not 4 <= q < 8 for s in fd["steps"] for q in s["draft"]["positions"])
        assert all(s["block"] != [4, 8] for s in fd["steps"])


def test_every_position_fixed_leaves_nothing_to_decode(diffusion, helper):
    text = " wherefore art thou"
    ids = diffusion.tokenizer.encode(text, add_special_tokens=False)
    for decoder in sorted(OWN_LOOPS):
        knobs = {**OWN_LOOPS[decoder], "steps": len(ids)} if decoder == "dingo" else dict(OWN_LOOPS[decoder])
        knobs.pop("block_length", None)
        t = run(diffusion, decoder, n=len(ids), draft=helper if decoder == "apd" else None,
                fixed=f"0:{text}", **knobs)
        assert t["output_ids"] == ids and t["steps"] == [], decoder


BAD_VALUES = [
    ("3 love", "is not position:text"),
    ("30:x", "runs past the canvas"),
    ("3:a;3:b", "fixed twice"),
    ("x:y", "is not position:text"),
    ("2:", "has no text"),
    ("1:" + "z" * 65, "at most 64"),
    (";".join(f"{i}:a" for i in range(33)), "at most 32"),
]
BAD_IDS = ["no colon", "past the canvas", "twice", "not a number", "no text", "long text", "too many"]


@pytest.mark.parametrize("decoder", sorted(OWN_LOOPS))
@pytest.mark.parametrize("value, line", BAD_VALUES, ids=BAD_IDS)
def test_a_bad_value_is_the_same_line_on_the_decoders_with_their_own_loop(diffusion, helper, decoder, value, line):
    with pytest.raises(PlaygroundError, match=line) as e:
        run(diffusion, decoder, draft=helper if decoder == "apd" else None, fixed=value, **OWN_LOOPS[decoder])
    assert "\n" not in str(e.value)
    with pytest.raises(PlaygroundError) as ref:
        run(diffusion, "llada", fixed=value)
    assert str(e.value) == str(ref.value)  # word for word what the other plans say
    if "canvas" not in line and "twice" not in line:
        assert st.knob_error(decoder, "fixed", value) == st.knob_error("llada", "fixed", value)


@pytest.mark.parametrize("value, line", BAD_VALUES, ids=BAD_IDS)
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
