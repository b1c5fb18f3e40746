"""Pinning a token in the logit lens: a run's watched tokens are recorded at every layer of
every lens step (``lens.pinned``), the same numbers the lens gives the chosen token when the
pinned token is the chosen one, ending on the step's raw distribution; the run figure's menu
switches its heatmap to a pinned token."""

from __future__ import annotations

import pytest

from playground.core.models import load_model
from playground.engine import prepare
from visualizers.lens import lens_figure, lens_run_figure, pinned_ids


@pytest.fixture(scope="module")
def target():
    return load_model("tiny-shakespeare", device="cpu")


def run(handle, watch=None, n=6):
    return prepare(model=handle, decoder="greedy", prompt="ROMEO:\n", max_new_tokens=n, seed=0,
                   params={"logit_lens": True}, watch=watch).finish().to_dict()


def test_a_pinned_token_is_followed_through_every_layer_as_the_lens_follows_the_chosen_one(target):
    plain = run(target)
    first = plain["steps"][0]["lens"]["chosen"]
    t = run(target, watch=[f"#{first}", "#7"])
    assert pinned_ids(t) == [first, 7]
    for i, s in enumerate(t["steps"]):
        lens, watch = s["lens"], s["watch"]
        pin = lens["pinned"][str(first)]
        assert len(pin["probs"]) == len(lens["layers"]) == len(pin["ranks"])
        if lens["chosen"] == first:  # the same token: the same numbers as the chosen token's row
            assert pin["probs"] == pytest.approx(lens["chosen_probs"], rel=1e-3, abs=1e-6)
            assert pin["ranks"] == lens["chosen_ranks"]
        for tid in (str(first), "7"):  # the output layer is the step's raw distribution
            assert lens["pinned"][tid]["probs"][-1] == pytest.approx(watch[tid]["raw_p"], rel=1e-3, abs=1e-9)
            assert lens["pinned"][tid]["ranks"][-1] == watch[tid]["raw_rank"]
    assert [s["output_ids"] for s in (plain,)] == [t["output_ids"]]  # pinning changes nothing decoded


def test_the_run_figure_offers_the_chosen_token_and_each_pinned_one(target):
    t = run(target, watch=["#7", "#11"])
    fig = lens_run_figure(t)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label.split(" ")[0] for b in buttons] == ["the", "pinned", "pinned"]
    z = buttons[2].args[0]["z"][0]
    assert [row[0] for row in z] == pytest.approx(t["steps"][0]["lens"]["pinned"]["11"]["probs"], abs=1e-9)
    assert "pinned" in lens_figure(t, 0).data[0].hovertext[0][0]
    assert not run(target, n=2)["steps"][0]["lens"].get("pinned")
    assert not lens_run_figure(run(target, n=2)).layout.updatemenus
