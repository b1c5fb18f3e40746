"""CCD (history-consistent commits): the rule by hand, termination, the reduction to fast_dllm at
window 1, every step recomputed from the trace's own evidence, determinism, knob errors and the
shared views drawing its trace."""

from __future__ import annotations

import pytest
import torch

from decoders.diffusion.ccd import ccd_select
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model
from playground.engine import prepare
from test_diffusion import build_bert
from test_visualizers import render_everything

PROMPT = "ROMEO: But soft"
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


def ids(m: torch.Tensor) -> list[int]:
    return m.nonzero().squeeze(1).tolist()


# ---------------------------------------------------------------------- the rule by hand
def test_ccd_commits_consistent_confident_positions_and_rejects_the_rest():
    conf = torch.tensor([0.9, 0.8, 0.3, 0.95, 0.6], dtype=torch.float64)
    counts = torch.tensor([2, 1, 5, 3, 2])
    ok = B(1, 1, 1, 1, 0)  # position 4 lies outside the block
    commit, consistent, rejected, fb = ccd_select(conf, counts, ok, 2, 0.5)
    assert ids(consistent) == [0, 2, 3]       # counts >= 2 inside the block
    assert ids(commit) == [0, 3]              # ... and above the floor (2 is consistent but unsure)
    assert ids(rejected) == [1]               # above the floor but its argmax just flipped
    assert not fb
    # nothing consistent and confident: the block's single most confident position, leftmost on ties
    commit, _, rejected, fb = ccd_select(torch.tensor([0.7, 0.9, 0.9, 0.2]), torch.tensor([1, 1, 1, 4]),
                                         B(1, 1, 1, 1), 3, 0.5)
    assert ids(commit) == [1] and fb and ids(rejected) == [0, 1, 2]
    # window 1: every position is consistent, so the set is Fast-dLLM's
    commit, _, rejected, fb = ccd_select(conf, torch.ones(5, dtype=torch.long), ok, 1, 0.5)
    assert ids(commit) == [0, 1, 3] and not ids(rejected) and not fb


# ---------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("knobs", [{}, {"window": 8, "floor": 0.0}, {"window": 3, "floor": 0.05, "block_length": 4},
                                   {"window": 2, "floor": 1.0, "temperature": 0.8}])
@pytest.mark.parametrize("which", ["mlm", "bundled"])
def test_ccd_unmasks_every_position_within_the_step_limit(request, which, knobs):
    handle = request.getfixturevalue(which)
    trace = run(handle, "ccd", n=16, seed=1, **knobs)
    last = trace.steps[-1].evidence
    assert last["mask_id"] not in last["canvas"]
    assert trace.stats["steps"] == len(trace.steps) <= 16
    assert sorted(p for s in trace.steps for p in s.evidence["unmasked"]) == list(range(16))
    assert min(trace.stats["commit_step"]) >= 0
    assert all(s.evidence["ccd"]["budget"] == len(s.evidence["unmasked"]) >= 1 for s in trace.steps)


@pytest.mark.parametrize("floor", [0.0, 0.4])
@pytest.mark.parametrize("which", ["mlm", "bundled"])
def test_ccd_with_window_one_is_fast_dllm(request, which, floor):
    handle = request.getfixturevalue(which)
    ref = run(handle, "fast_dllm", threshold=floor, block_length=8, temperature=0.5, seed=2)
    got = run(handle, "ccd", window=1, floor=floor, block_length=8, temperature=0.5, seed=2)
    assert got.output_ids == ref.output_ids
    assert got.stats["commit_step"] == ref.stats["commit_step"]
    assert [s.evidence["block"] for s in got.steps] == [s.evidence["block"] for s in ref.steps]
    assert got.stats["rejected_inconsistent"] == 0


@pytest.mark.parametrize("window,floor", [(2, 0.1), (3, 0.05)])
def test_ccd_trace_follows_its_rule(bundled, window, floor):
    """Recompute each step from the recorded per-position argmax alone: the counters, the
    consistent and rejected sets, the commits, and that every commit but a fallback held its
    argmax for the last ``window`` recorded steps."""
    trace = run(bundled, "ccd", n=16, seed=3, block_length=8, window=window, floor=floor)
    seen: dict[int, list[int]] = {}  # per position, its argmax at every step it was still masked
    rejected = fallbacks = held = 0
    for st in trace.steps:
        ev, c = st.evidence, st.evidence["ccd"]
        masked = [p for p, t in enumerate(ev["argmax"]) if t is not None]
        assert masked == [p for p, v in enumerate(ev["confidence"]) if v is not None]
        assert all(ev["predicted"][p] == ev["argmax"][p] for p in masked)  # temperature 0
        counts = []
        for p in masked:
            hist = seen.setdefault(p, [])
            hist.append(ev["argmax"][p])
            run_len = 1
            while run_len < len(hist) and hist[-run_len - 1] == hist[-1]:
                run_len += 1
            counts.append(run_len)
        assert [ev["consistency"][p] for p in masked] == counts
        lo, hi = ev["block"]
        pos = torch.tensor(masked)
        conf = torch.tensor([ev["confidence"][p] for p in masked], dtype=torch.float64)
        commit, consistent, rej, fb = ccd_select(conf, torch.tensor(counts), (pos >= lo) & (pos < hi),
                                                 window, floor)
        assert sorted(ev["unmasked"]) == pos[commit].tolist()
        assert c["consistent"] == pos[consistent].tolist() and c["rejected"] == pos[rej].tolist()
        assert c["fallback"] == fb and c["budget"] == len(ev["unmasked"])
        if not fb:
            for p in ev["unmasked"]:
                assert len(seen[p]) >= window and len(set(seen[p][-window:])) == 1, (p, seen[p])
                held += 1
        for p in c["rejected"]:
            assert ev["consistency"][p] < window and ev["confidence"][p] > floor
        rejected += len(c["rejected"])
        fallbacks += fb
    # the setting exercises all three outcomes: consistent commits, rejections and fallbacks
    assert held > 0 and rejected > 0 and fallbacks > 0, (held, rejected, fallbacks)
    assert trace.stats["rejected_inconsistent"] == rejected
    assert trace.stats["fallback_steps"] == fallbacks
    assert trace.stats["argmax_flips"] == sum(len(s.evidence["ccd"]["flipped"]) for s in trace.steps)


def test_ccd_is_deterministic_for_a_seed(bundled):
    knobs = {"window": 2, "floor": 0.1, "temperature": 0.8, "block_length": 8}
    a, b = (run(bundled, "ccd", n=16, seed=5, **knobs) for _ in range(2))
    untimed = lambda t: {k: v for k, v in t.stats.items() if k not in ("wall_s", "first_token_s")}  # noqa: E731
    assert a.output_ids == b.output_ids and untimed(a) == untimed(b)
    assert [s.evidence for s in a.steps] == [s.evidence for s in b.steps]
    # and the seed is what fixes it: another seed samples other tokens at this temperature
    assert any(run(bundled, "ccd", n=16, seed=s, **knobs).output_ids != a.output_ids for s in (6, 7, 8))


def test_a_longer_window_never_commits_sooner_than_fast_dllm_allows(bundled):
    # consistency only removes commits from the threshold set (fallbacks aside), so the first
    # step, which has a one-step history, commits one position for any window above 1
    for w in (2, 4):
        trace = run(bundled, "ccd", n=16, seed=0, window=w, floor=0.0)
        assert trace.steps[0].evidence["ccd"]["fallback"] and len(trace.steps[0].evidence["unmasked"]) == 1
    assert run(bundled, "ccd", n=16, seed=0, window=1, floor=0.0).stats["steps"] == 1


@pytest.mark.parametrize("knobs,msg", [
    ({"window": 0}, "window"),
    ({"window": 9}, "window"),
    ({"floor": 1.5}, "floor"),
    ({"block_length": 5}, "multiple of block_length"),
])
def test_bad_knobs_are_one_line_errors(mlm, knobs, msg):
    with pytest.raises(PlaygroundError, match=msg) as e:
        run(mlm, "ccd", n=16, **knobs)
    assert "\n" not in str(e.value)


def test_the_shared_diffusion_views_draw_a_ccd_trace(bundled):
    import visualizers as V

    d = run(bundled, "ccd", n=16, seed=1, window=2, floor=0.1, block_length=8).to_dict()
    runs = dict(V.run_figures(d))
    assert "Unmasking heatmap" in runs and runs["Unmasking heatmap"].data
    render_everything(d)  # every plot of every step as the page calls them, JSON-serialisable
