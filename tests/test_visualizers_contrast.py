"""The contrastive family's views: paired distributions, contrastive search's candidates,
DoLa's layers; on hand-built traces (exact numbers, escaping, partial evidence) and on real
traces of the bundled models (tiny-shakespeare, tiny-shakespeare-draft as the amateur)."""

from __future__ import annotations

import json
from html import escape

import plotly.graph_objects as go
import pytest

import visualizers as V
from visualizers._common import CHOSEN, RAW, TITLE_CHARS, token_text, visible
from visualizers.contrast import (
    candidates_html, contrast_figure, contrast_run_figure, dola_figure, dola_run_figure, excluded, shown_tokens,
)

EVIL = "<b>&x"  # token text that must never reach a plot or the page as markup


def contrast_ev(chosen: int = 3) -> dict:
    """Expert / amateur / contrast over tokens 3, 4, 5, 6: the contrast lifts 5 above 4 and
    excludes 6."""
    return {
        "labels": ["expert", "amateur", "contrast"],
        "top_ids": [3, 4, 5, 6],
        "top_tokens": ["a", "b", EVIL, "d"],
        "probs": {"expert": [0.5, 0.3, 0.15, 0.05], "amateur": [0.2, 0.6, 0.05, 0.15],
                  "contrast": [0.7, 0.1, 0.2, 0.0]},
        "ranks": {"expert": [0, 1, 2, 3], "amateur": [1, 0, 3, 2], "contrast": [0, 2, 1, 3]},
        "chosen": chosen,
        "rank_changed": [4, 5],
        "scores": [0.9, -0.7, 1.1, None],
    }


def trace_of(*steps: dict, **more) -> dict:
    out = {"schema": 1, "decoder": "contrastive", "prompt_ids": [7, 8], "output_ids": [],
           "tokens": {"3": "a", "4": "b", "5": EVIL, "6": "d", "7": "ctx", "8": " <i>"}, "steps": []}
    for i, s in enumerate(steps):
        out["steps"].append({"i": i, "kind": "token", "committed": [s.get("tok", 3)], **s})
        out["output_ids"].append(s.get("tok", 3))
    out.update(more)
    return out


def dist(chosen: int = 3) -> dict:
    return {"top_ids": [3, 4], "top_tokens": ["a", "b"], "raw_probs": [0.6, 0.4], "final_probs": [1.0, 0.0],
            "chosen": chosen, "chosen_rank": 0, "entropy": 0.5, "kept_mass": 0.6}


def dola_ev(premature: int, div: list) -> dict:
    return {"layers": [0, 2, 4], "divergence": div, "premature": premature, "num_layers": 6}


def no_failure(f) -> None:
    text = f if isinstance(f, str) else f.to_json()
    assert "could not draw" not in text
    if isinstance(f, go.Figure):
        json.loads(f.to_json())


# ---------------------------------------------------------------------- hand-built
def test_paired_bars_are_the_traces_probabilities_with_the_chosen_token_starred():
    tr = trace_of({"dist": dist(5), "contrast": contrast_ev(chosen=5), "tok": 5})
    f = contrast_figure(tr, 0)
    no_failure(f)
    ev = tr["steps"][0]["contrast"]
    order = shown_tokens(ev)
    # by rank under the contrast: 3 (0), 5 (1), 4 (2), 6 (3)
    assert [ev["top_ids"][j] for j in order] == [3, 5, 4, 6]
    bars = [t for t in f.data if t.type == "bar"]
    assert [b.name for b in bars] == ["expert", "amateur", "contrast"]
    for b in bars:
        assert list(b.y) == [ev["probs"][b.name][j] for j in order]
    star = next(t for t in f.data if t.name == "chosen")
    assert list(star.x) == [1] and star.y[0] == pytest.approx(0.2)  # token 5's highest bar (the contrast)
    assert star.marker.color == CHOSEN
    # which tokens changed rank: 5 up one place, 4 down one, 6 excluded, 3 unchanged
    ticks = list(f.layout.xaxis.ticktext)
    assert "▲" not in ticks[0] and "▼" not in ticks[0] and "✕" not in ticks[0]
    assert "▲1" in ticks[1] and "▼1" in ticks[2] and "✕" in ticks[3]
    sub = f.layout.title.subtitle.text
    assert "2 of 4 shown tokens changed rank" in sub and "1 excluded" in sub
    assert excluded(ev, 3) and not excluded(ev, 0)


def test_token_text_is_escaped_in_every_view():
    tr = trace_of({"dist": dist(), "contrast": contrast_ev(), "dola": dola_ev(2, [0.1, 0.3, 0.2]),
                   "candidates": [{"token": 5, "p": 0.4, "penalty": 0.2, "score": 0.1, "closest": 1, "picked": True}],
                   "penalty_alpha": 0.5})
    f = contrast_figure(tr, 0)
    blob = f.to_json()
    assert "<b>&x" not in blob and "&lt;b&gt;&amp;x" in blob
    html = candidates_html(tr, 0)
    assert "<b>&x" not in html and "&lt;b&gt;&amp;x" in html
    assert "<i>" not in html and "&lt;i&gt;" in html  # the context token it is most like (position 1)
    for _, p in V.step_figures(tr, 0) + V.run_figures(tr):
        no_failure(p)
        assert "<b>&x" not in (p if isinstance(p, str) else p.to_json())


def test_the_chosen_token_is_shown_even_beyond_the_limit():
    ev = contrast_ev(chosen=6)
    order = shown_tokens(ev, limit=2)
    assert len(order) == 2 and ev["top_ids"][order[-1]] == 6 and ev["top_ids"][order[0]] == 3


def test_candidate_table_shows_p_penalty_score_and_the_pick():
    rows = [{"token": 3, "p": 0.5, "penalty": 0.9, "score": -0.34, "closest": 0, "picked": False},
            {"token": 5, "p": 0.25, "penalty": 0.1, "score": 0.04, "closest": 1, "picked": True}]
    tr = trace_of({"dist": dist(5), "candidates": rows, "penalty_alpha": 0.6, "tok": 5})
    html = candidates_html(tr, 0)
    assert html.count("<tr class=\"cand") == 2
    picked = html.split('class="cand picked"')[1].split("</tr>")[0]
    assert "&lt;b&gt;&amp;x" in picked and "0.2500" in picked and "0.1000" in picked and "0.0400" in picked
    assert "✓" in picked
    assert "0.5000" in html and "0.9000" in html and "-0.3400" in html
    assert "greedy would take ‘a’" in html  # the penalty moved the pick off the most probable
    assert "penalty_alpha 0.6" in html
    assert isinstance(dict(V.step_figures(tr, 0))["Candidates"], str)


def test_dola_bars_are_the_divergences_with_the_chosen_layer_highlighted():
    tr = trace_of({"dist": dist(), "dola": dola_ev(2, [0.1, 0.3, 0.2])},
                  {"dist": dist(), "dola": dola_ev(4, [0.1, 0.2, 0.5])},
                  {"dist": dist(), "dola": dola_ev(4, [0.1, None, 0.4])})
    f = dola_figure(tr, 0)
    no_failure(f)
    bar = f.data[0]
    assert list(bar.x) == [0, 2, 4] and list(bar.y) == [0.1, 0.3, 0.2]
    assert list(bar.marker.color) == [RAW, CHOSEN, RAW]
    star = next(t for t in f.data if t.name == "chosen premature layer")
    assert list(star.x) == [2]
    assert "premature layer 2" in f.layout.title.subtitle.text
    assert list(dola_figure(tr, 1).data[0].marker.color) == [RAW, RAW, CHOSEN]
    run = dola_run_figure(tr)
    no_failure(run)
    line = next(t for t in run.data if t.name == "chosen premature layer")
    assert list(line.x) == [0, 1, 2] and list(line.y) == [2, 4, 4]
    heat = next(t for t in run.data if t.type == "heatmap")
    assert list(heat.y) == [0, 2, 4] and heat.z[1][0] == 0.3 and heat.z[2][1] == 0.5
    assert "layer 4 chosen at 2 of 3 steps" in run.layout.title.subtitle.text


def test_rank_of_the_chosen_token_over_the_run():
    tr = trace_of({"dist": dist(), "contrast": contrast_ev(3)}, {"dist": dist(5), "contrast": contrast_ev(5), "tok": 5})
    f = contrast_run_figure(tr)
    no_failure(f)
    expert = next(t for t in f.data if t.name == "rank under expert")
    contrast = next(t for t in f.data if t.name == "rank under contrast")
    assert list(expert.y) == [0, 2] and list(contrast.y) == [0, 1]
    assert "1 of 2 steps" in f.layout.title.subtitle.text


def test_dispatch_by_evidence():
    plain = trace_of({"dist": dist()})
    assert [t for t, _ in V.step_figures(plain, 0)] == ["Distribution"]
    assert [t for t, _ in V.run_figures(plain)] == ["Entropy and probability"]
    dola = trace_of({"dist": dist(), "contrast": contrast_ev(), "dola": dola_ev(2, [0.1, 0.3, 0.2])})
    assert [t for t, _ in V.step_figures(dola, 0)] == ["Distribution", "Paired distributions", "Layer divergence"]
    assert [t for t, _ in V.run_figures(dola)] == ["Entropy and probability", "Chosen token's rank",
                                                   "Premature layer per step"]
    # more plots than the page's slots: the plain distribution gives way to the paired one
    crowded = trace_of({"dist": dist(), "contrast": contrast_ev(), "dola": dola_ev(2, [0.1, 0.3, 0.2]),
                        "candidates": [{"token": 3, "p": 0.5, "penalty": 0.1, "score": 0.2, "closest": 0,
                                        "picked": True}]})
    titles = [t for t, _ in V.step_figures(crowded, 0)]
    assert len(titles) == V.MAX_STEP_PLOTS and "Distribution" not in titles and "Paired distributions" in titles
    # an empty candidate list draws no table
    assert [t for t, _ in V.step_figures(trace_of({"dist": dist(), "candidates": []}), 0)] == ["Distribution"]


@pytest.mark.parametrize("bad", [
    {"contrast": {"labels": ["expert"]}},
    {"contrast": {"labels": ["a", "b"], "top_ids": [1, 2], "probs": {"a": [None, 0.3], "b": "x"}, "ranks": 5,
                  "chosen": 9}},
    {"contrast": {"top_ids": "nope", "probs": {}}},
    {"dola": {"layers": [1, "x"], "divergence": [None], "premature": "2"}},
    {"candidates": [{"token": None, "p": "high", "closest": 99}, 3]},
])
def test_partial_or_odd_evidence_draws_a_note_not_a_failure(bad):
    tr = trace_of({"dist": dist(), **bad})
    for fn in (contrast_figure, dola_figure, candidates_html):
        no_failure(fn(tr, 0))
    for fn in (contrast_run_figure, dola_run_figure):
        no_failure(fn(tr))
    for _, p in V.step_figures(tr, 0) + V.run_figures(tr):
        no_failure(p)
    empty = {"steps": []}
    for fn in (contrast_figure, dola_figure):
        no_failure(fn(empty, 0))
    assert "no steps yet" in candidates_html(empty, 0)


def test_titles_fit_a_lane_card_and_legends_sit_below():
    tr = trace_of({"dist": dist(), "contrast": contrast_ev(), "dola": dola_ev(2, [0.1, 0.3, 0.2])})
    for f in (contrast_figure(tr, 0), dola_figure(tr, 0), dola_run_figure(tr), contrast_run_figure(tr)):
        assert len(f.layout.title.text) <= TITLE_CHARS
        assert f.layout.template.layout.legend.yanchor == "bottom"  # the shared look: legend under the plot
        sub = f.layout.title.subtitle.text or ""
        assert all(len(line) <= 62 for line in sub.split("<br>"))


# ---------------------------------------------------------------------- real traces
@pytest.fixture(scope="module")
def real():
    """Short real traces of the family on the bundled models (prompt with markup characters)."""
    import playground

    prompt = "ROMEO:\n<b>What</b> say you & me?"
    out = {}
    for name, draft, params in (("dola", None, {"dola_layers": "0,1,2"}),
                                ("contrastive", "tiny-shakespeare-draft", {}),
                                ("contrastive_search", None, {"penalty_alpha": 0.6, "top_k": 4})):
        out[name] = playground.generate(model="tiny-shakespeare", decoder=name, prompt=prompt, max_new_tokens=4,
                                        draft=draft, **params)
    return out


def render_all(tr: dict) -> None:
    for s in range(V.step_count(tr)):
        plots = V.step_figures(tr, s)
        assert 1 <= len(plots) <= V.MAX_STEP_PLOTS
        for _, p in plots:
            no_failure(p)
    runs = V.run_figures(tr)
    assert 1 <= len(runs) <= V.MAX_RUN_PLOTS
    for _, p in runs:
        no_failure(p)


def test_real_dola_trace(real):
    from playground.core.trace import validate_trace_dict

    tr = real["dola"]
    validate_trace_dict(tr)
    render_all(tr)
    for i, s in enumerate(tr["steps"]):
        assert [t for t, _ in V.step_figures(tr, i)] == ["Distribution", "Paired distributions", "Layer divergence"]
        f = dola_figure(tr, i)
        bar = f.data[0]
        assert list(bar.x) == s["dola"]["layers"] and list(bar.y) == s["dola"]["divergence"]
        hot = [x for x, c in zip(bar.x, bar.marker.color) if c == CHOSEN]
        assert hot == [s["dola"]["premature"]]
        ev = s["contrast"]
        pf = contrast_figure(tr, i)
        order = shown_tokens(ev)
        for b in (t for t in pf.data if t.type == "bar"):
            assert list(b.y) == [ev["probs"][b.name][j] or 0.0 for j in order]
    run = dola_run_figure(tr)
    line = next(t for t in run.data if t.name == "chosen premature layer")
    assert list(line.y) == [s["dola"]["premature"] for s in tr["steps"]]


def test_real_contrastive_trace_with_the_draft_as_amateur(real):
    tr = real["contrastive"]
    render_all(tr)
    for i, s in enumerate(tr["steps"]):
        ev = s["contrast"]
        f = contrast_figure(tr, i)
        assert [b.name for b in f.data if b.type == "bar"] == ev["labels"] == ["expert", "amateur", "contrast"]
        order = shown_tokens(ev)
        for b in (t for t in f.data if t.type == "bar"):
            assert list(b.y) == [ev["probs"][b.name][j] or 0.0 for j in order]
        star = next(t for t in f.data if t.name == "chosen")
        assert ev["top_ids"][order[star.x[0]]] == ev["chosen"] == s["committed"][0]


def test_real_contrastive_search_candidate_tables(real):
    tr = real["contrastive_search"]
    render_all(tr)
    for i, s in enumerate(tr["steps"]):
        html = dict(V.step_figures(tr, i))["Candidates"]
        assert html.count('<tr class="cand') == len(s["candidates"]) == 4
        picked = [r for r in s["candidates"] if r["picked"]]
        assert len(picked) == 1 and picked[0]["token"] == s["committed"][0]
        row = html.split('class="cand picked"')[1].split("</tr>")[0]
        assert f'{picked[0]["score"]:.4f}' in row and f'{picked[0]["penalty"]:.4f}' in row
        # the context token each candidate is most like, escaped (the prompt holds markup)
        context = tr["prompt_ids"] + tr["output_ids"]
        for r in s["candidates"]:
            assert f'{r["closest"]} ({escape(visible(token_text(tr, context[r["closest"]])))})' in html
        assert "<b>" not in html
