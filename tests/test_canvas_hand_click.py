"""Clicking masked cells for a hand on the canvas, without a browser: what a click sends
(``clicked_cell``), what the canvas cells carry (``data-pos``), and how a click changes the
branch panel's canvas controls (``toggle_cell``) — the commit set is the clicked positions, each
click toggling one, and a token the reader picked from a position's top-K is never lost.
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest

import visualizers as V
from playground.ui.branch_panel import hand_commit, toggle_cell
from playground.ui.events import clicked_cell

MASK = 99
N = 6


def canvas_trace() -> dict:
    """A 6-position diffusion run: step 0 commits 0 and 3, step 1 commits 1 and 4, step 2 the
    rest; each step records the top-3 at every position still masked when it began
    (position p's candidates are 10p, 10p+1, 10p+2, most probable first)."""
    canvas, steps = [MASK] * N, []
    for k, pos in enumerate(((0, 3), (1, 4), (2, 5))):
        before = list(canvas)
        for p in pos:
            canvas[p] = 10 * p
        steps.append({"i": k, "kind": "denoise", "canvas": list(canvas), "mask_id": MASK, "unmasked": list(pos),
                      "remasked": [], "committed": list(pos),
                      "predicted": [10 * p if before[p] == MASK else None for p in range(N)],
                      "top_ids": [[10 * p, 10 * p + 1, 10 * p + 2] if before[p] == MASK else None for p in range(N)],
                      "top_probs": [[0.5, 0.3, 0.2] if before[p] == MASK else None for p in range(N)],
                      "confidence": [0.5 if p in pos else None for p in range(N)]})
    tokens = {str(t): f"w{t}" for p in range(N) for t in (10 * p, 10 * p + 1, 10 * p + 2)}
    return {"decoder": "llada", "model": "m", "steps": steps, "output_ids": list(canvas), "tokens": tokens,
            "done": True}


def test_a_hand_click_names_lane_step_and_position():
    ev = lambda **d: SimpleNamespace(_data=d)  # noqa: E731 - an event's data, as Gradio hands it over
    assert clicked_cell(ev(lane=2, step=3, pos=5, hand=True)) == (1, 3, 5)
    assert clicked_cell(ev(lane=1, step=None, pos=0, hand=True)) == (0, None, 0)  # a mask in the lane's output
    assert clicked_cell(ev(lane=1, step=3, pos=5)) is None  # a token click, not a hand
    for bad in ({"lane": 0}, {"lane": True}, {"pos": -1}, {"pos": "5"}, {"step": 1.5}, {"step": False}):
        assert clicked_cell(ev(**{"lane": 1, "step": 3, "pos": 5, "hand": True, **bad})) is None, bad
    assert clicked_cell(SimpleNamespace()) is None


def test_canvas_cells_carry_their_position_and_causal_tokens_do_not():
    tr = canvas_trace()
    out = V.tokens_html(tr, "unmask_step", lane=1, upto_step=0)
    cells = re.findall(r'<span class="(tok[^"]*)" data-lane="1" data-step="(\d+)" data-pos="(\d+)"', out)
    assert [int(p) for _c, _s, p in cells] == list(range(N))
    assert [int(p) for c, _s, p in cells if "mask" in c] == [1, 2, 4, 5]  # what step 0 left masked
    causal = {"steps": [{"i": 0, "kind": "token", "committed": [5]}, {"i": 1, "kind": "token", "committed": [6]}],
              "output_ids": [5, 6], "tokens": {"5": "a", "6": "b"}, "done": True}
    html_c = V.tokens_html(causal, "none", lane=1)
    assert html_c.count('class="tok"') == 2 and "data-pos" not in html_c


def test_clicks_tick_untick_and_pick_the_last_clicked():
    tr = canvas_trace()
    s = 1  # paused at step 1: positions 1, 2, 4, 5 still masked when it began
    a = toggle_cell(tr, s, 4, [], None, None)
    assert (a.positions, a.at, a.token) == ([4], 4, 40)  # ticked, and picked at its top-1
    b = toggle_cell(tr, s, 2, a.positions, a.at, a.token)
    assert (b.positions, b.at, b.token) == ([2, 4], 2, 20)
    c = toggle_cell(tr, s, 4, b.positions, b.at, b.token)  # a second click unticks
    assert (c.positions, c.at, c.token) == ([2], 2, 20)
    d = toggle_cell(tr, s, 2, c.positions, c.at, c.token)  # the picked one too: the pick clears
    assert (d.positions, d.at, d.token) == ([], None, None)


def test_a_token_the_reader_picked_survives_clicks_on_other_cells():
    tr = canvas_trace()
    s = 1
    # position 5 picked in the list at its second candidate, then cells 1 and 4 clicked
    a = toggle_cell(tr, s, 1, [], 5, 51)
    b = toggle_cell(tr, s, 4, a.positions, a.at, a.token)
    assert (b.positions, b.at, b.token) == ([1, 4], 5, 51)
    assert hand_commit(b.positions, b.at, b.token) == {1: None, 4: None, 5: 51}
    # a position picked only in the list (not ticked) at its top-1 stays committed, now ticked
    c = toggle_cell(tr, s, 1, [], 5, 50)
    assert (c.positions, c.at, c.token) == ([1, 5], 1, 10)


@pytest.mark.parametrize("seed", range(20))
def test_the_commit_set_is_the_positions_clicked_an_odd_number_of_times(seed):
    tr, s = canvas_trace(), 1
    rng = random.Random(seed)
    offered = [1, 2, 4, 5]
    positions, at, token = [], None, None
    odd: set[int] = set()
    picked: dict[int, int] = {}
    for _ in range(12):
        if rng.random() < 0.2:  # the reader picks a position's second candidate in the list
            at = rng.choice(offered)
            token = 10 * at + 1
            positions = [p for p in positions if p != at]
            odd, picked = set(positions) | {at}, {at: token}  # (a list pick is not a click)
        else:
            p = rng.choice(offered)
            pick = toggle_cell(tr, s, p, positions, at, token)
            positions, at, token = pick.positions, pick.at, pick.token
            odd ^= {p}
            picked = {q: t for q, t in picked.items() if q in odd}
        commit = hand_commit(positions, at, token) if odd else {}
        assert set(commit) == odd
        # each position at its top-1 (None or the top-1 id) unless the reader picked its token
        for q, t in commit.items():
            assert t == picked.get(q, t if t is None else 10 * q), (q, t, picked)
