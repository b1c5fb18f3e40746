"""Second-wave diffusion plans: each rule against a hand computation on a small canvas, each
decoder's trace against the rule recomputed from the trace's own per-position numbers, the
reductions to fast_dllm, the ascending schedule, and the views."""

from __future__ import annotations

import math

import pytest
import torch

from decoders.diffusion._rules import (Streaks, delimiter_boundary, ete_select, leap_select, spans,
                                       stable_select, window_select)
from decoders.diffusion._sampler import ascending_schedule, ascending_steps
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model
from test_diffusion import build_bert
from test_visualizers import render_everything

PROMPT = "ROMEO: But soft"
T = torch.tensor
B = lambda *v: torch.tensor(v, dtype=torch.bool)  # noqa: E731


@pytest.fixture(scope="module")
def mlm(tokenizer):
    return handle_from_model(build_bert(tokenizer), tokenizer, name="tiny-bert")


@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare-diffusion", device="cpu")


def run(handle, decoder, n=16, seed=0, prompt=PROMPT, **params):
    return prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                   params=params).finish()


def mask_ids(m: torch.Tensor) -> list[int]:
    return m.nonzero().squeeze(1).tolist()


def masked_before(trace) -> list[list[int]]:
    """Per step, the positions still masked when it began (those with a confidence)."""
    return [[p for p, c in enumerate(s.evidence["confidence"]) if c is not None] for s in trace.steps]


# ---------------------------------------------------------------------- the rules by hand
def test_ete_exploits_the_confident_set_and_explores_the_most_uncertain():
    conf = T([0.95, 0.5, 0.2, 0.92], dtype=torch.float64)
    ent = T([0.1, 2.0, 3.0, 0.2], dtype=torch.float64)
    every = B(1, 1, 1, 1)
    # exploit {0, 3} carries -log2(.95) - log2(.92) = 0.19 bits < 4: explore the top entropy, 2
    exploit, explore = ete_select(conf, ent, every, every, 0.9, 1, 4.0)
    assert mask_ids(exploit) == [0, 3] and mask_ids(explore) == [2]
    _, explore = ete_select(conf, ent, every, every, 0.9, 2, 4.0)
    assert mask_ids(explore) == [1, 2]
    # a budget the confident set already fills: no exploration
    _, explore = ete_select(conf, ent, every, every, 0.9, 1, 0.19)
    assert mask_ids(explore) == []
    # nothing above the threshold: the single most confident is exploited (Fast-dLLM's floor)
    exploit, explore = ete_select(conf, ent, every, every, 0.99, 1, 4.0)
    assert mask_ids(exploit) == [0] and mask_ids(explore) == [2]
    # exploration only where it may reach
    _, explore = ete_select(conf, ent, every, B(1, 1, 0, 1), 0.9, 1, 4.0)
    assert mask_ids(explore) == [1]
    # exploit only inside the block
    exploit, _ = ete_select(conf, ent, B(0, 1, 1, 1), every, 0.9, 0, 4.0)
    assert mask_ids(exploit) == [3]


def test_r2_windows_commit_confident_clusters():
    conf = T([0.8, 0.6, 0.2, 0.9, 0.9], dtype=torch.float64)
    pos = torch.arange(5)
    # windows of 2: [0,2) mean .7 fires, [1,3) .4, [2,4) .55, [3,5) .9 fires
    hit, fired = window_select(conf, pos, B(1, 1, 1, 1, 1), 2, 0.7)
    assert mask_ids(hit) == [0, 1, 3, 4] and fired == [[0, 2], [3, 5]]
    # a committed position (2 missing from the masked ones) leaves a gap the window spans
    hit, fired = window_select(T([0.8, 0.6, 0.9, 0.5], dtype=torch.float64), T([0, 1, 3, 4]),
                               B(1, 1, 1, 1), 2, 0.7)
    assert mask_ids(hit) == [0, 1, 2, 3] and fired == [[0, 2], [2, 4], [3, 5]]
    assert mask_ids(window_select(conf, pos, B(1, 1, 1, 1, 1), 0, 0.0)[0]) == []


def test_r2_stability_counts_unchanged_proposals():
    st = Streaks(3)
    st.update([0, 1, 2], [7, 8, 9], [0.5, 0.2, 0.9])
    st.update([0, 1, 2], [7, 5, 9], [0.7, 0.3, 0.9])
    st.update([0, 1, 2], [7, 5, 4], [0.9, 0.4, 0.9])
    assert st.count == [3, 2, 1] and st.mean(0) == pytest.approx(0.7) and st.mean(1) == pytest.approx(0.35)
    ok = B(1, 1, 1)
    assert mask_ids(stable_select(st, T([0, 1, 2]), ok, 2, 0.3)) == [0, 1]
    assert mask_ids(stable_select(st, T([0, 1, 2]), ok, 3, 0.3)) == [0]
    assert mask_ids(stable_select(st, T([0, 1, 2]), ok, 2, 0.5)) == [0]
    assert mask_ids(stable_select(st, T([0, 1, 2]), ok, 0, 0.0)) == []


def test_localleap_anchors_pull_neighbours_within_the_radius():
    conf = T([0.95, 0.6, 0.4, 0.6, 0.3, 0.6], dtype=torch.float64)
    pos, ok = torch.arange(6), B(1, 1, 1, 1, 1, 1)
    a, leap, fb = leap_select(conf, pos, ok, 0.9, 0.5, 2)
    assert (mask_ids(a), mask_ids(leap), fb) == ([0], [1], False)
    a, leap, _ = leap_select(conf, pos, ok, 0.9, 0.5, 3)
    assert mask_ids(leap) == [1, 3]
    # decay: at distance 2 of radius 2 the relaxed threshold is .5 + 1 * .4 * 1/2 = .7
    conf2 = T([0.95, 0.6, 0.65, 0.1], dtype=torch.float64)
    assert mask_ids(leap_select(conf2, torch.arange(4), B(1, 1, 1, 1), 0.9, 0.5, 2)[1]) == [1, 2]
    assert mask_ids(leap_select(conf2, torch.arange(4), B(1, 1, 1, 1), 0.9, 0.5, 2, decay=1.0)[1]) == [1]
    # distance is in canvas positions, not in masked positions
    a, leap, _ = leap_select(T([0.95, 0.6], dtype=torch.float64), T([0, 3]), B(1, 1), 0.9, 0.5, 2)
    assert mask_ids(leap) == []
    # no anchor: the single most confident commits
    a, leap, fb = leap_select(T([0.3, 0.8, 0.5], dtype=torch.float64), torch.arange(3), B(1, 1, 1), 0.9, 0.5, 2)
    assert (mask_ids(a), mask_ids(leap), fb) == ([1], [], True)
    assert spans([2, 4, 9], 1, 0, 10) == [[1, 6], [8, 10]]


def test_adablock_ends_the_block_at_the_most_confident_delimiter():
    delims = [(3, 0.5), (6, 0.2)]
    assert delimiter_boundary(0, 8, 8, delims, 0.3) == (4, 3)
    assert delimiter_boundary(0, 8, 8, delims, 0.6) == (8, None)
    assert delimiter_boundary(0, 5, 8, [(6, 0.9)], 0.3) == (8, None)  # outside the window
    assert delimiter_boundary(4, 8, 12, [(5, 0.7), (9, 0.7)], 0.3) == (6, 5)  # tie: leftmost
    assert delimiter_boundary(0, 8, 8, [], 0.0) == (8, None)


def test_ascending_schedule():
    assert ascending_schedule(127, 7) == [1, 2, 4, 8, 16, 32, 64]  # the authors' 2^S - 1 canvas
    assert ascending_schedule(128, 7) == [1, 2, 4, 8, 16, 32, 65]
    assert ascending_steps(127) == 7 and ascending_steps(16) == 5 and ascending_steps(1) == 1
    assert ascending_steps(10, 1.0) == 10
    for n in (1, 5, 16, 33, 100):
        for s in range(1, min(n, 12) + 1):
            for g in (1.0, 1.5, 2.0, 4.0):
                k = ascending_schedule(n, s, g)
                assert sum(k) == n and len(k) == s and min(k) >= 1, (n, s, g, k)
                if g > 1:
                    assert k[-1] == max(k), (n, s, g, k)
    assert ascending_schedule(12, 4, 1.0) == [3, 3, 3, 3]
    assert sum(ascending_schedule(4096, 12, 4.0)) == 4096  # no overflow on a long canvas
    with pytest.raises(PlaygroundError, match="ascending schedule"):
        ascending_schedule(4, 5)


# ---------------------------------------------------------------------- reductions to fast_dllm
@pytest.mark.parametrize("decoder,knobs,thr", [
    ("ete", {"explore": 0}, 0.4),
    ("r2_dllm", {"window": 0, "stable_steps": 0}, 0.4),
    ("localleap", {"tau_hi": 0.4, "tau_lo": 0.4, "radius": 3}, 0.4),
    ("adablock", {"delimiter_threshold": 1.0, "block_length": 4}, 0.4),
])
@pytest.mark.parametrize("which", ["mlm", "bundled"])
def test_plans_with_their_rule_off_are_fast_dllm(request, which, decoder, knobs, thr):
    handle = request.getfixturevalue(which)
    block = 4 if decoder == "adablock" else 8
    ref = run(handle, "fast_dllm", threshold=thr, block_length=block, temperature=0.5, seed=2)
    extra = {} if decoder == "localleap" else {"threshold": thr}
    if decoder != "adablock":
        extra["block_length"] = block
    got = run(handle, decoder, temperature=0.5, seed=2, **knobs, **extra)
    assert got.output_ids == ref.output_ids
    assert got.stats["commit_step"] == ref.stats["commit_step"]
    assert [s.evidence["block"] for s in got.steps] == [s.evidence["block"] for s in ref.steps]


# ---------------------------------------------------------------------- traces against the rules
def _tensors(st, masked):
    ev = st.evidence
    conf = T([ev["confidence"][p] for p in masked], dtype=torch.float64)
    ent = T([ev["entropy"][p] for p in masked], dtype=torch.float64)
    return T(masked), conf, ent


@pytest.mark.parametrize("knobs", [{"threshold": 0.5, "explore": 1, "budget": 4.0},
                                   {"threshold": 0.3, "explore": 2, "budget": 8.0, "block_length": 8,
                                    "cross_block": 4}])
def test_ete_trace_follows_its_rule(mlm, knobs):
    trace = run(mlm, "ete", n=16, seed=1, **knobs)
    explored_before = False
    bits_total = 0.0
    for st, masked in zip(trace.steps, masked_before(trace)):
        ev, e = st.evidence, st.evidence["ete"]
        lo, hi = ev["block"]
        pos, conf, ent = _tensors(st, masked)
        in_block = (pos >= lo) & (pos < hi)
        reach = (pos >= lo) & (pos < min(hi + knobs.get("cross_block", 0), 16))
        exploit, explore = ete_select(conf, ent, in_block, reach, knobs["threshold"], knobs["explore"],
                                      knobs["budget"])
        assert e["exploit"] == pos[exploit].tolist() and e["explore"] == pos[explore].tolist()
        assert sorted(ev["unmasked"]) == sorted(e["exploit"] + e["explore"])
        want_bits = sum(-math.log2(ev["confidence"][p]) for p in ev["unmasked"])
        assert e["bits"] == pytest.approx(want_bits, abs=1e-3)
        bits_total += e["bits"]
        if explored_before:
            assert e["cascade"] == sum(1 for p in e["exploit"] if ev["confidence"][p] > knobs["threshold"])
        else:
            assert e["cascade"] is None
        explored_before = bool(e["explore"])
    assert trace.stats["explored"] == sum(len(s.evidence["ete"]["explore"]) for s in trace.steps) > 0
    assert trace.stats["total_bits"] == pytest.approx(bits_total, abs=1e-2)


def test_ete_explores_past_the_block_when_allowed(mlm):
    inside = run(mlm, "ete", n=16, seed=1, threshold=0.99, explore=1, budget=64.0, block_length=4)
    across = run(mlm, "ete", n=16, seed=1, threshold=0.99, explore=1, budget=64.0, block_length=4, cross_block=12)
    def outside(tr):
        return sum(1 for s in tr.steps for p in s.evidence["ete"]["explore"] if p >= s.evidence["block"][1])
    assert outside(inside) == 0 and outside(across) > 0
    assert inside.stats["steps"] < 16  # two commits a round at least while positions remain


def test_r2_trace_follows_its_rules(bundled):
    knobs = {"threshold": 0.6, "window": 3, "window_threshold": 0.2, "stable_steps": 2, "stable_threshold": 0.12}
    trace = run(bundled, "r2_dllm", n=16, seed=3, block_length=8, **knobs)
    streaks = Streaks(16)
    fired_any = {"spatial": 0, "temporal": 0}
    for st, masked in zip(trace.steps, masked_before(trace)):
        ev, r = st.evidence, st.evidence["r2"]
        pos, conf, _ = _tensors(st, masked)
        streaks.update(masked, [ev["predicted"][p] for p in masked], [ev["confidence"][p] for p in masked])
        assert [ev["stability"][p] for p in masked] == [streaks.count[p] for p in masked]
        lo, hi = ev["block"]
        ok = (pos >= lo) & (pos < hi)
        thr = {p for p in pos[ok].tolist() if ev["confidence"][p] > knobs["threshold"]}
        if not thr:
            thr = {max(pos[ok].tolist(), key=lambda p: (ev["confidence"][p], -p))}
        spatial, fired = window_select(conf, pos, ok, knobs["window"], knobs["window_threshold"])
        temporal = stable_select(streaks, pos, ok, knobs["stable_steps"], knobs["stable_threshold"])
        assert r["windows"] == fired
        assert set(ev["unmasked"]) == thr | set(pos[spatial].tolist()) | set(pos[temporal].tolist())
        assert set(r["threshold"]) == thr and not set(r["spatial"]) & thr
        fired_any["spatial"] += len(r["spatial"])
        fired_any["temporal"] += len(r["temporal"])
    assert fired_any["spatial"] > 0 and fired_any["temporal"] > 0, fired_any
    assert trace.stats["commits_by_rule"] == {"threshold": sum(len(s.evidence["r2"]["threshold"]) for s in trace.steps),
                                              **fired_any}


def test_localleap_trace_follows_its_rule(bundled):
    trace = run(bundled, "localleap", n=16, seed=4, tau_hi=0.25, tau_lo=0.1, radius=2, block_length=8)
    leaps = 0
    for st, masked in zip(trace.steps, masked_before(trace)):
        ev, lp = st.evidence, st.evidence["leap"]
        pos, conf, _ = _tensors(st, masked)
        lo, hi = ev["block"]
        a, leap, fb = leap_select(conf, pos, (pos >= lo) & (pos < hi), 0.25, 0.1, 2)
        assert (lp["anchors"], lp["leap"], lp["fallback"]) == (pos[a].tolist(), pos[leap].tolist(), fb)
        assert sorted(ev["unmasked"]) == sorted(lp["anchors"] + lp["leap"])
        for p in lp["leap"]:
            assert any(z0 <= p < z1 for z0, z1 in lp["zones"])
        leaps += len(lp["leap"])
    assert leaps > 0
    fast = run(bundled, "fast_dllm", n=16, seed=4, threshold=0.25, block_length=8)
    assert trace.stats["steps"] <= fast.stats["steps"]


def test_adablock_blocks_follow_the_delimiters(bundled):
    tok = bundled.tokenizer
    trace = run(bundled, "adablock", n=24, prompt="ROMEO: But soft, what light", block_length=6,
                delimiter_threshold=0.05, threshold=0.9)
    blocks, ends_at_delim = [], 0
    for st in trace.steps:
        ev, ab = st.evidence, st.evidence["adablock"]
        lo, hi = ev["block"]
        assert all(lo <= p < hi for p in ev["unmasked"])
        if ab["new_block"]:
            blocks.append((lo, hi))
            w0, w1 = ab["window"]
            want = [[p, ev["confidence"][p]] for p in range(w0, w1) if ev["predicted"][p] is not None
                    and (tok.decode([ev["predicted"][p]]).strip(" \t") and
                         ("\n" in tok.decode([ev["predicted"][p]]) or
                          all(c in "\n.,;:!?" for c in tok.decode([ev["predicted"][p]]).strip(" \t"))))]
            assert ab["delimiters"] == want
            end, at = delimiter_boundary(lo, w1 - w0, min(lo + 6, 24), [tuple(d) for d in want], 0.05)
            assert (hi, ab["chosen"]) == (end, at)
            ends_at_delim += at is not None
    assert [b[0] for b in blocks] == [0] + [b[1] for b in blocks[:-1]] and blocks[-1][1] == 24
    assert ends_at_delim > 0 and trace.stats["block_sizes"] == [b - a for a, b in blocks]
    assert len(set(trace.stats["block_sizes"])) > 1  # the blocks really move


def test_ass_commits_its_ascending_schedule(mlm):
    trace = run(mlm, "ass", n=16)
    assert trace.stats["commits_per_step"] == ascending_schedule(16, ascending_steps(16)) == [1, 1, 2, 4, 8]
    semi = run(mlm, "ass", n=16, block_length=8, steps=6)
    assert semi.stats["commits_per_step"] == ascending_schedule(8, 3) * 2
    sc = semi.steps[1].evidence["schedule"]
    assert sc["planned"] == ascending_schedule(8, 3) and sc["even"] == [3, 3, 2] and sc["index"] == 1
    for st, masked in zip(trace.steps, masked_before(trace)):  # the most confident ones, as LLaDA
        ev = st.evidence
        left = [ev["confidence"][p] for p in masked if p not in ev["unmasked"]]
        assert not left or min(ev["confidence"][p] for p in ev["unmasked"]) >= max(left)
    md = run(mlm, "masked_diffusion", n=16, plan="ascending", steps=5)
    assert md.output_ids == trace.output_ids and md.stats["commit_step"] == trace.stats["commit_step"]


@pytest.mark.parametrize("decoder,knobs,msg", [
    ("localleap", {"tau_hi": 0.5, "tau_lo": 0.8}, "tau_lo"),
    ("adablock", {"delimiters": "  "}, "delimiters"),
    ("ass", {"steps": 32}, "exceed block_length"),
    ("ete", {"block_length": 5}, "multiple of block_length"),
])
def test_bad_knobs_are_one_line_errors(mlm, decoder, knobs, msg):
    with pytest.raises(PlaygroundError, match=msg) as e:
        run(mlm, decoder, n=16, **knobs)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------- views
@pytest.mark.parametrize("decoder,knobs,step_title,run_title", [
    ("ete", {"threshold": 0.5}, "Explore vs exploit", "Bits per round"),
    ("r2_dllm", {"window_threshold": 0.2, "stable_threshold": 0.12}, "Which rule committed", "Stability counters"),
    ("localleap", {"tau_hi": 0.25, "tau_lo": 0.1}, "Anchors and leap zones", "Anchors over the run"),
    ("adablock", {"delimiter_threshold": 0.05}, "Adaptive block", "Blocks over the run"),
    ("ass", {}, None, "Step-size schedule"),
])
def test_each_plan_gets_its_views(bundled, decoder, knobs, step_title, run_title):
    import visualizers as V

    d = run(bundled, decoder, n=16, seed=1, **knobs).to_dict()
    for i in range(len(d["steps"])):
        plots = dict(V.step_figures(d, i))
        if step_title:
            assert step_title in plots
            fig = plots[step_title]
            assert not any("could not draw" in (a.text or "") for a in fig.layout.annotations)
            names = {t.name for t in fig.data}
            committed = set(d["steps"][i]["unmasked"])
            assert committed and names - {"not committed"}, names
    runs = dict(V.run_figures(d))
    assert run_title in runs and runs[run_title].data
    assert not any("could not draw" in (a.text or "") for a in runs[run_title].layout.annotations)
    render_everything(d)  # every plot of every step as the page calls them, JSON-serialisable


def test_views_mark_what_the_rule_did(mlm, bundled):
    from visualizers.diffusion_plans import ete_run_figure, ete_step_figure, leap_step_figure

    d = run(mlm, "ete", n=16, seed=1, threshold=0.5).to_dict()
    i = next(k for k, s in enumerate(d["steps"]) if s["ete"]["explore"])
    fig = ete_step_figure(d, i)
    explore = next(t for t in fig.data if t.name == "explore")
    assert list(explore.x) == d["steps"][i]["ete"]["explore"]
    p = explore.x[0]
    assert explore.y[0] == pytest.approx(-math.log2(d["steps"][i]["confidence"][p]))
    rf = ete_run_figure(d)
    bars = {t.name: list(t.y) for t in rf.data if t.type == "bar"}
    assert bars["explore bits"][i] == pytest.approx(d["steps"][i]["ete"]["bits_explore"])
    leap = run(bundled, "localleap", n=16, seed=4, tau_hi=0.25, tau_lo=0.1).to_dict()
    j = next(k for k, s in enumerate(leap["steps"]) if s["leap"]["leap"])
    lf = leap_step_figure(leap, j)
    assert [t for t in lf.data if t.name == "leap"] and len(lf.layout.shapes) >= len(leap["steps"][j]["leap"]["zones"])


def test_views_survive_empty_and_partial_traces():
    from visualizers import diffusion_plans as DP

    for fn in (DP.ete_step_figure, DP.r2_step_figure, DP.leap_step_figure, DP.adablock_step_figure):
        assert fn({"steps": []}, 0).layout.annotations
        assert fn({"steps": [{"kind": "denoise", "i": 0, "canvas": [1]}]}, 0).layout.annotations
    for fn in (DP.ete_run_figure, DP.r2_run_figure, DP.leap_run_figure, DP.adablock_run_figure,
               DP.schedule_run_figure):
        assert fn({"steps": []}).layout.annotations
