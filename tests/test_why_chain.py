"""The sampler chain stage by stage: each stage's recorded cut (``removed``, ``top_removed``,
``top_kept``) equals an independent computation of that rule on the distribution entering it;
the stages chained reproduce the final distribution; the Gumbel picks say which stage moved the
draw; constraint and bias stages open the chain; the cut-off chart draws one row per stage."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import playground
import visualizers
from decoders import processors as P
from decoders.processors import STAGE_TOP
from playground.presets import load_preset
from visualizers.chain import chain_figure, first_mover

MODEL = "tiny-shakespeare"
PROMPT = "ROMEO: But soft"


def softmax(x: np.ndarray) -> np.ndarray:
    live = np.isfinite(x)
    e = np.where(live, np.exp(x - x[live].max()), 0.0)
    return e / e.sum()


# independent cuts: the kept set of each rule on the logits entering it (numpy, by definition)
def keep_top_k(x: np.ndarray, k: int) -> np.ndarray:
    kth = np.sort(x)[::-1][k - 1]
    return np.isfinite(x) & (x >= kth)


def keep_top_p(x: np.ndarray, p: float) -> np.ndarray:
    """Smallest top set whose mass reaches p (the top token always stays)."""
    q = softmax(x)
    order = np.argsort(-q, kind="stable")
    keep = np.zeros_like(q, dtype=bool)
    mass = 0.0
    for t in order:
        if not np.isfinite(x[t]):
            break
        keep[t] = True
        mass += q[t]
        if mass >= p - 1e-7:
            break
    return keep


def keep_min_p(x: np.ndarray, p: float) -> np.ndarray:
    q = softmax(x)
    return np.isfinite(x) & (q >= p * q.max())


def pairs_of(probs: np.ndarray, sel: np.ndarray, k: int = STAGE_TOP) -> list[tuple[int, float]]:
    ids = [int(t) for t in np.argsort(-np.where(sel, probs, -1.0), kind="stable")[: min(k, int(sel.sum()))]]
    return [(t, float(probs[t])) for t in ids]


def check_stage(stage: dict, x_in: np.ndarray, keep: np.ndarray) -> None:
    """The recorded stage against the independent cut ``keep`` of the logits ``x_in``."""
    q = softmax(x_in)
    live = np.isfinite(x_in)
    cut = live & ~keep
    assert stage["removed"] == int(cut.sum())
    assert stage["kept"] == int((live & keep).sum())
    for key, sel in (("top_removed", cut), ("top_kept", live & keep)):
        got, want = stage[key], pairs_of(q, sel)
        assert len(got) == len(want) == min(STAGE_TOP, int(sel.sum()))
        # same tokens (ties may order differently), each with its probability entering the stage
        assert {t for t, _ in got} == {t for t, _ in want} or \
            sorted(round(p, 4) for _, p in got) == sorted(round(p, 4) for _, p in want)
        for t, p in got:
            assert p == pytest.approx(q[t], rel=1e-3, abs=1e-12)
            assert sel[t]


@pytest.mark.parametrize("seed", range(6))
def test_each_stage_records_the_cut_an_independent_computation_makes(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(200, generator=g) * 3
    chain = P.build_chain({"top_k": 40, "top_p": 0.7, "min_p": 0.05, "temperature": 0.7,
                           "order": "top_k,top_p,min_p,temperature"})
    stages: list[dict] = []
    out = chain(logits, P.History(ids=[1, 2], prompt_len=2, pos=0), stages)
    assert [s["stage"].split("(")[0] for s in stages] == ["top_k", "top_p", "min_p", "temperature"]
    x = logits.double().numpy()
    for stage, rule in zip(stages, (lambda v: keep_top_k(v, 40), lambda v: keep_top_p(v, 0.7),
                                    lambda v: keep_min_p(v, 0.05), lambda v: np.isfinite(v))):
        keep = rule(x)
        check_stage(stage, x, keep)
        x = np.where(keep, x, -np.inf)
    x = x / 0.7
    assert np.array_equal(np.isfinite(x), torch.isfinite(out).numpy())
    assert stages[-1]["removed"] == 0 and stages[-1]["top_removed"] == []


def test_on_a_small_vocabulary_the_stages_chained_reproduce_the_final_distribution():
    """With the vocabulary no larger than the per-stage bound, a stage's kept and removed lists
    are its whole input: each stage's survivors are exactly what enters the next one, with the
    probabilities renormalised, and the last survivors are the final distribution's support."""
    logits = torch.tensor([2.0, 1.5, 1.4, 0.3, 0.2, -0.5, -1.0, -3.0])
    chain = P.build_chain({"top_k": 6, "min_p": 0.2, "top_p": 0.8, "order": "top_k,min_p,top_p"})
    stages: list[dict] = []
    final = chain.probs(logits, P.History(ids=[0], prompt_len=1, pos=0), stages)
    prev = {t: p for t, p in stages[0]["top_kept"] + stages[0]["top_removed"]}
    assert set(prev) == set(range(8)) and sum(prev.values()) == pytest.approx(1.0, abs=1e-3)
    for st in stages:
        entering = {t: p for t, p in st["top_kept"] + st["top_removed"]}
        assert entering == pytest.approx(prev, rel=1e-3)
        kept = {t: p for t, p in st["top_kept"]}
        mass = sum(kept.values())
        prev = {t: p / mass for t, p in kept.items()}
    support = {int(t) for t in torch.nonzero(final).flatten()}
    assert set(prev) == support
    assert prev == pytest.approx({t: float(final[t]) for t in support}, rel=2e-3)


def test_an_emptying_stage_records_what_it_really_removed():
    logits = torch.tensor([3.0, 1.0, 0.0, -1.0])
    chain = P.Chain([P.TopK(1), P.NoRepeatNGram(1)])  # top-1 leaves token 0, the 1-gram ban removes it
    stages: list[dict] = []
    chain(logits, P.History(ids=[0], prompt_len=0, pos=1), stages)
    assert stages[1]["emptied"] and stages[1]["removed"] == 0 and stages[1]["top_kept"][0][0] == 0


@pytest.fixture(scope="module")
def runs():
    common = dict(model=MODEL, prompt=PROMPT, max_new_tokens=6, seed=3)
    return {
        "plain": playground.generate(decoder="sample", **common),
        "chain": playground.generate(decoder="sample", top_k=20, top_p=0.8, min_p=0.05, **common),
        "bad": playground.generate(decoder="sample", top_k=30, bad_words="the", logit_bias='{" and": -3}', **common),
        "inverse": playground.generate(decoder="sample", top_k=20, coupling="inverse_cdf", **common),
    }


def test_the_gumbel_picks_follow_the_draw_through_the_chain(runs):
    """The first stage's pick entering is what plain sampling drew (same seed, same noise) at a
    step where the lanes share their context; the last stage's pick leaving is the lane's own
    token; consecutive stages hand the pick on; a stage moves the pick only by removing it."""
    plain, lane = runs["plain"]["output_ids"], runs["chain"]
    shared = next((i for i, (a, b) in enumerate(zip(plain, lane["output_ids"])) if a != b), len(plain))
    for j, s in enumerate(lane["steps"]):
        stages = s["chain"]
        assert stages[-1]["gumbel_out"][0] == s["committed"][0]
        if j <= shared:
            assert stages[0]["gumbel_in"][0] == plain[j]
        for a, b in zip(stages, stages[1:]):
            assert a["gumbel_out"][0] == b["gumbel_in"][0]
        for st in stages:
            moved = st["gumbel_in"][0] != st["gumbel_out"][0]
            if moved:  # the pick entering was removed by this stage (probability > 0 entering)
                assert st["gumbel_in"][1] > 0 and st["removed"] > 0
        m = first_mover(stages)
        assert (m is None) == (stages[0]["gumbel_in"][0] == s["committed"][0])
    # where the lane first differs from plain sampling, some stage moved the draw
    if shared < len(plain):
        assert first_mover(lane["steps"][shared]["chain"]) is not None


def test_inverse_cdf_lanes_record_no_gumbel_picks(runs):
    for s in runs["inverse"]["steps"]:
        assert all("gumbel_in" not in st and "top_removed" in st for st in s["chain"])


def test_constraint_and_bias_stages_open_the_chain(runs):
    from playground.core.models import load_model

    model = load_model(MODEL)
    banned = set()
    for variant in ("the", " the"):
        seq = model.tokenizer.encode(variant, add_special_tokens=False)
        if len(seq) == 1:
            banned.add(seq[0])
    bias_id = model.tokenizer.encode(" and", add_special_tokens=False)[0]
    tr = runs["bad"]
    for s in tr["steps"]:
        names = [st["stage"] for st in s["chain"]]
        assert names[:3] == ["logit_bias", "constraint(bad_words)", "top_k(k=30)"]
        bias, mask = s["chain"][0], s["chain"][1]
        assert bias["removed"] == 0 and bias["top_removed"] == []
        assert {t for t, _ in mask["top_removed"]} == banned and mask["removed"] == len(banned)
        # the mask's probabilities entering are the biased distribution's, as the constraint evidence says
        blocked = dict(zip(s["constraint"]["top_blocked"]["ids"], s["constraint"]["top_blocked"]["probs"]))
        for t, p in mask["top_removed"]:
            assert p == pytest.approx(blocked[t], rel=1e-3, abs=1e-6)  # that evidence has 6 decimals
        assert bias_id not in {t for t, _ in mask["top_removed"]}


def test_chain_evidence_stays_small(runs):
    for s in runs["chain"]["steps"]:
        assert len(json.dumps(s["chain"])) < 400 * len(s["chain"])


def test_the_cut_off_chart_draws_one_row_per_stage_and_reaches_the_inspector(runs):
    tr = runs["chain"]
    titles = [t for t, _ in visualizers.step_figures(tr, 1)]
    assert "Sampler chain" in titles
    fig = chain_figure(tr, 1)
    stages = tr["steps"][1]["chain"]
    bars = [d for d in fig.data if d.type == "bar"]
    assert len(bars) == len(stages)
    for bar, st in zip(bars, stages):
        assert len(bar.y) >= len(st["top_kept"]) + len(st["top_removed"])
        assert list(bar.y[: len(st["top_kept"])]) == sorted((p for _, p in st["top_kept"]), reverse=True)
    assert "step 1" in fig.layout.title.text
    # a plain lane has no stage: no chart; partial evidence draws a note, never raises
    assert "Sampler chain" not in [t for t, _ in visualizers.step_figures(runs["plain"], 0)]
    assert chain_figure({}, 0).layout.annotations
    broken = {"steps": [{"kind": "token", "chain": [{"stage": "x", "top_kept": [["a", None]], "gumbel_in": 5}]}]}
    assert chain_figure(broken, 0) is not None


def test_the_truncation_preset_has_a_lane_in_another_order():
    preset = load_preset("truncation-samplers")
    orders = [lane for lane in preset["lanes"] if "order" in lane["params"]]
    assert orders and orders[0]["params"]["order"].split(",") == ["top_p", "top_k"]
    lane = orders[0]
    common = dict(model=preset["model"], prompt=preset["prompt"], max_new_tokens=3, seed=preset["seed"])
    flipped = playground.generate(decoder=lane["decoder"], **common, **lane["params"])
    default = playground.generate(decoder=lane["decoder"], **common,
                                  **{k: v for k, v in lane["params"].items() if k != "order"})
    assert [st["stage"].split("(")[0] for st in flipped["steps"][0]["chain"]] == ["top_p", "top_k"]
    assert [st["stage"].split("(")[0] for st in default["steps"][0]["chain"]] == ["top_k", "top_p"]
    assert flipped["output_ids"] != default["output_ids"]  # the order matters on this preset


def test_a_crowded_step_gives_the_constraint_slot_to_the_chain_which_holds_its_stage():
    tr = playground.generate(model=MODEL, decoder="top_p", prompt=PROMPT, max_new_tokens=2, p=0.9,
                             logit_lens=True, regex="[A-Za-z ,]+")
    titles = [t for t, _ in visualizers.step_figures(tr, 1)]
    assert titles == ["Distribution", "Logit lens", "Sampler chain"]
    assert tr["steps"][1]["chain"][0]["stage"] == "constraint(regex)"
    plain = playground.generate(model=MODEL, decoder="greedy", prompt=PROMPT, max_new_tokens=2, regex="[A-Za-z ,]+")
    assert [t for t, _ in visualizers.step_figures(plain, 1)] == ["Distribution", "Constraint", "Sampler chain"]
