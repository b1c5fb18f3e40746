"""The comparison views say what is true of the lanes: the divergence plot scores lanes that
agree 0 and names them identical, includes every lane kind that records probabilities
(speculative, Jacobi, diffusion), and names the lanes it leaves out with the reason; the
divergence strip's wording is singular for one token."""

from __future__ import annotations

import json

import pytest

from visualizers.compare import divergence_html
from visualizers.divergence import divergence_figure, lane_divergence, position_dists

OUT = [11, 12, 13, 14]


def _token_lane(out=OUT, decoder="greedy", final_one_hot=True):
    steps = []
    for i, t in enumerate(out):
        raw = [0.6, 0.3, 0.1]
        steps.append({"i": i, "kind": "token", "committed": [t],
                      "dist": {"top_ids": [t, 90, 91], "raw_probs": raw,
                               "final_probs": [1.0, 0.0, 0.0] if final_one_hot else raw}})
    return {"decoder": decoder, "params": {}, "prompt_ids": [1, 2], "output_ids": list(out), "steps": steps,
            "tokens": {}}


def _spec_lane(out=OUT, temperature=0.0):
    """Draft steps: tokens 0-1 accepted then a correction, token 2 accepted then a bonus."""
    def corr(t):
        return {"top_ids": [t, 90, 91], "raw_probs": [0.6, 0.3, 0.1], "final_probs": [1.0, 0.0, 0.0]}

    steps = [
        {"i": 0, "kind": "draft", "committed": out[:2],
         "tree": {"nodes": [{"id": 0, "parent": None, "token": out[0], "p": 0.6},
                            {"id": 1, "parent": 0, "token": 77, "p": 0.01}],
                  "accepted_path": [0], "correction": out[1], "correction_kind": "resample"},
         "correction_dist": corr(out[1])},
        {"i": 1, "kind": "draft", "committed": out[2:],
         "tree": {"nodes": [{"id": 0, "parent": None, "token": out[2], "p": 0.6}], "accepted_path": [0],
                  "correction": out[3], "correction_kind": "bonus"}, "correction_dist": corr(out[3])},
    ]
    return {"decoder": "speculative", "params": {"temperature": temperature}, "prompt_ids": [1, 2],
            "output_ids": list(out), "steps": steps, "tokens": {}}


def _beam_lane(out=OUT):
    return {"decoder": "beam", "params": {"num_beams": 2}, "prompt_ids": [1, 2], "output_ids": list(out),
            "steps": [{"i": i, "kind": "beam", "committed": [], "beams": []} for i in range(len(out))],
            "tokens": {}}


def _diffusion_lane(out=OUT, temperature=0.0):
    mask = 99
    canvas = [mask] * len(out)
    steps = []
    for i, p in enumerate([2, 0, 3, 1]):
        conf = [None] * len(out)
        conf[p] = 0.6
        canvas = list(canvas)
        canvas[p] = out[p]
        steps.append({"i": i, "kind": "denoise", "committed": [], "canvas": canvas, "mask_id": mask,
                      "unmasked": [p], "remasked": [], "confidence": conf})
    return {"decoder": "llada", "params": {"temperature": temperature}, "prompt_ids": [1, 2],
            "output_ids": list(out), "steps": steps, "tokens": {}}


def _names(fig):
    return [t.name for t in fig.data]


def _subtitle(fig):
    sub = fig.layout.title.subtitle
    return (sub.text or "") if sub else ""


@pytest.mark.parametrize("which", ["final", "raw"])
def test_lanes_that_agree_score_zero_and_are_named_identical(which):
    lanes = [_token_lane(), _token_lane(decoder="top_k"), _spec_lane(), _diffusion_lane()]
    if which == "final":  # a temperature-0 lane's final distribution is a point mass, as greedy's
        lanes.append({**_token_lane(), "decoder": "jacobi",
                      "steps": [{"i": 0, "kind": "jacobi", "committed": OUT, "guess": OUT, "fixed": 4}]})
    for other in lanes[1:]:
        rows = lane_divergence(lanes[0], other, which)
        assert [r["position"] for r in rows] == list(range(len(OUT)))
        assert all(r["js"] == 0 and r["kl_ab"] == 0 and r["kl_ba"] == 0 for r in rows), other["decoder"]
    fig = divergence_figure(lanes, which=which)
    js = [n for n in _names(fig) if n.endswith(" JS")]
    assert len(js) == len(lanes) - 1 and all("identical (0)" in n for n in js)


def test_a_lane_that_differs_is_not_called_identical():
    other = _token_lane(out=[11, 12, 50, 51])
    other["steps"][1]["dist"]["final_probs"] = [0.5, 0.5, 0.0]
    fig = divergence_figure([_token_lane(), other])
    assert not any("identical" in n for n in _names(fig))
    assert lane_divergence(_token_lane(), other)[1]["js"] > 0


def test_partial_records_are_the_distributions_the_lanes_drew_from():
    spec = position_dists(_spec_lane(temperature=1.0), "final")
    assert spec[0] == ([11], [0.6]) and spec[1] == ([12, 90, 91], [1.0, 0.0, 0.0]) and spec[2] == ([13], [0.6])
    assert position_dists(_spec_lane(temperature=0.0), "final")[0] == ([11], [1.0])
    diff = position_dists(_diffusion_lane(temperature=1.0), "raw")
    assert sorted(diff) == [0, 1, 2, 3] and diff[2] == ([13], [0.6])
    assert position_dists(_beam_lane()) == {}


def test_the_plot_names_the_lanes_it_cannot_include_and_why():
    fig = divergence_figure([_token_lane(), _spec_lane(), _beam_lane()])
    assert "not included: lane 3 (beam: a search picks whole hypotheses" in _subtitle(fig).replace("<br>", " ")
    fig = divergence_figure([_beam_lane(), _token_lane()])
    note = fig.layout.annotations[0].text
    assert "lane 1 (beam) cannot be compared: a search picks whole hypotheses" in note


def test_divergence_strip_wording_is_singular_for_one_token():
    a, b = _token_lane(out=[11, 12]), _token_lane(out=[11, 40])
    head = divergence_html([a, b])
    assert "agree on the first token" in head and "first 1 tokens" not in head
    assert "agree on the first 2 tokens" in divergence_html([_token_lane(out=[11, 12, 1]), _token_lane(out=[11, 12, 2])])
    assert "agree on the one token they share" in divergence_html([_token_lane(out=[11]), _token_lane(out=[11])])


@pytest.mark.slow
def test_lossless_check_lanes_are_identical_in_the_divergence_plot():
    """The bundled models at temperature 0: greedy, the draft chain, the tree and Jacobi write one
    text, and the plot scores each 0 against greedy (the page promised it; it said nothing)."""
    from playground.engine import run_to_end

    prompt = "Romeo.\nBut soft, what light"
    lanes = [("greedy", {}, None), ("speculative", {"temperature": 0.0}, "tiny-shakespeare-draft"),
             ("spec_tree", {"temperature": 0.0}, "tiny-shakespeare-draft"), ("jacobi", {}, None)]
    traces = [json.loads(run_to_end(model="tiny-shakespeare", decoder=d, prompt=prompt, max_new_tokens=12, draft=dr,
                                    params=k).to_json()) for d, k, dr in lanes]
    assert len({tuple(t["output_ids"]) for t in traces}) == 1
    fig = divergence_figure(traces)
    js = [n for n in _names(fig) if n.endswith(" JS")]
    assert len(js) == 3 and all("identical (0)" in n for n in js)
