"""The search and collaboration plots draw what the traces say: best-first's frontier, MBR's
utility matrix with the chosen row, the rollouts, the UID surprisal curve, EAD's hand-overs and
diffuspec's draft canvas — picked by the inspector from the evidence each step carries."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

import visualizers as V
from playground.engine import run_to_end
from visualizers.search import draft_canvas_html, handover_figure, mbr_figure, surprisal_figure

CASES = {
    "best_first_beam": ({}, None, "Frontier and pops", None),
    "uid_beam": ({"lam": 1.0}, None, None, "Surprisal curve"),
    "mbr": ({"num_hypotheses": 4, "num_references": 3, "utility": "chrf"}, None, "MBR utilities", None),
    "cntp": ({"entropy_threshold": 0.0, "num_trials": 3}, None, "Rollouts", None),
    "adadec": ({"entropy_threshold": 0.0}, None, "Rollouts", None),
    "ead": ({"entropy_threshold": 6.0}, "tiny-shakespeare-draft", None, "Who wrote each token"),
    "diffuspec": ({"gamma": 4}, "tiny-shakespeare-diffusion", "Diffusion draft canvas", None),
}


@pytest.fixture(scope="module")
def traces():
    return {d: run_to_end(model="tiny-shakespeare", decoder=d, prompt="ROMEO: <b>", max_new_tokens=8, params=p,
                          draft=dr).to_dict() for d, (p, dr, _s, _r) in CASES.items()}


def _broken(plot) -> bool:
    if isinstance(plot, go.Figure):
        return any("could not draw" in (a.text or "") for a in plot.layout.annotations)
    return "could not draw" in plot


@pytest.mark.parametrize("decoder", sorted(CASES))
def test_inspector_picks_and_draws_the_plots(traces, decoder):
    t = traces[decoder]
    _p, _d, step_plot, run_plot = CASES[decoder]
    titles = set()
    for i in range(V.step_count(t)):
        for title, plot in V.step_figures(t, i):
            assert not _broken(plot), (decoder, title)
            titles.add(title)
    if step_plot:
        assert step_plot in titles
    runs = V.run_figures(t)
    assert not any(_broken(f) for _t, f in runs)
    if run_plot:
        assert run_plot in [title for title, _f in runs]


def test_mbr_heatmap_is_the_matrix_with_the_chosen_row(traces):
    t = traces["mbr"]
    last = len(t["steps"]) - 1
    ev = t["steps"][last]["mbr"]
    fig = mbr_figure(t, last)
    heat = fig.data[0]
    assert [list(r) for r in heat.z] == ev["matrix"]
    rect = fig.layout.shapes[0]
    assert rect.y0 == ev["chosen"] - 0.5 and rect.y1 == ev["chosen"] + 0.5


def test_surprisal_curve_is_the_outputs(traces):
    t = traces["uid_beam"]
    fig = surprisal_figure(t)
    assert list(fig.data[0].y) == t["stats"]["surprisals"]


def test_handover_marks_who_wrote_each_token(traces):
    t = traces["ead"]
    fig = handover_figure(t)
    small = [s["i"] for s in t["steps"] if s["source"] == "small"]
    large = [s["i"] for s in t["steps"] if s["source"] == "large"]
    assert list(fig.data[0].x) == small and list(fig.data[1].x) == large


def test_draft_canvas_is_escaped_html(traces):
    t = traces["diffuspec"]
    html = draft_canvas_html(t, 0)
    assert "denoising step 1" in html and "<b>" not in html.replace("<b>denoising", "")
    assert "no diffusion draft canvas" in draft_canvas_html(traces["mbr"], 0)


def test_ead_tokens_are_coloured_by_the_model_that_wrote_them(traces):
    from visualizers.tokens import _ACCEPT_BG, legend_html, tokens_html

    t = traces["ead"]
    html = tokens_html(t, "acceptance")
    small = sum(1 for s in t["steps"] if s["source"] == "small")
    assert small > 0
    assert html.count(_ACCEPT_BG["small"]) == small
    assert "small model" in legend_html("acceptance")
