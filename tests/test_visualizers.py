"""Visualizers draw what the trace says: on hand-built traces, each figure is checked
against the evidence it was built from (bars, tree nodes, heatmap cells, grid shape), every
function survives an empty trace, and token text is escaped."""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go
import pytest

import visualizers as V
import visualizers.beam
import visualizers.jacobi
from visualizers._common import ACCEPTED, REJECTED
from visualizers.compare import first_divergence

EVIL = "<script>alert(1)</script>"


# ---------------------------------------------------------------------- trace builders
def trace(steps, output_ids=None, tokens=None, decoder="x", done=True, **extra):
    """A trace dict as the engine writes it, with a token map covering every id used."""
    ids = set()
    for s in steps:
        ids.update(s.get("committed", []))
    out = output_ids if output_ids is not None else [t for s in steps if s["kind"] != "denoise"
                                                     for t in s["committed"]]
    toks = {str(i): f"t{i}" for i in range(200)}
    toks.update({str(k): v for k, v in (tokens or {}).items()})
    d = {"schema": 1, "model": "m", "decoder": decoder, "params": {}, "seed": 0, "prompt": "p",
         "prompt_ids": [1], "output_ids": out, "text": "", "stats": {}, "steps": [], "tokens": toks,
         "done": done}
    tf = 0
    for i, s in enumerate(steps):
        tf += s.pop("_fw", 1)
        d["steps"].append({"i": i, "t": 0.01 * (i + 1), "target_forwards": tf, "draft_forwards": 0, **s})
    d["stats"] = {"new_tokens": len(out), "target_forwards": tf, "draft_forwards": 0, "wall_s": 0.5,
                  "finish_reason": "length" if done else None}
    d.update(extra)
    return d


def token_step(chosen, top=(5, 6, 7, 8), raw=(0.5, 0.2, 0.2, 0.1), final=(0.7, 0.3, 0.0, 0.0),
               entropy=1.2, kept=0.7):
    top = list(top)
    return {"kind": "token", "committed": [chosen],
            "dist": {"top_ids": top, "top_tokens": [f"t{t}" for t in top], "raw_probs": list(raw),
                     "final_probs": list(final), "entropy": entropy, "chosen": chosen,
                     "chosen_rank": top.index(chosen), "kept_mass": kept}}


def draft_step(nodes, path, correction=None, kind=None):
    """nodes: (id, parent, token, accepted); committed = path tokens + correction."""
    ns = [{"id": a, "parent": b, "token": c, "q": 0.5, "p": 0.4, "accept_prob": 0.8 if acc is not None else None,
           "accepted": acc, "source": "draft-model"} for a, b, c, acc in nodes]
    tok = {a: c for a, _, c, _ in nodes}
    committed = [tok[n] for n in path] + ([correction] if correction is not None else [])
    return {"kind": "draft", "committed": committed,
            "tree": {"nodes": ns, "accepted_path": list(path), "correction": correction,
                     "correction_kind": kind}}


MASK = 99


def denoise_trace(n=6, schedule=((0, 3), (1, 4), (5,), (2,)), remask_at=None):
    """Positions committed per step (schedule); confidence = 0.1*(pos+1)."""
    canvas = [MASK] * n
    final = [10 + p for p in range(n)]
    steps = []
    for k, pos in enumerate(schedule):
        remasked = []
        if remask_at and remask_at[0] == k:
            remasked = [remask_at[1]]
            canvas[remask_at[1]] = MASK
        for p in pos:
            canvas[p] = final[p]
        steps.append({"kind": "denoise", "committed": list(pos), "canvas": list(canvas), "mask_id": MASK,
                      "unmasked": list(pos), "remasked": remasked,
                      "confidence": [round(0.1 * (p + 1), 2) if p in pos else None for p in range(n)],
                      "entropy": [0.5] * n, "margin": [0.3 if canvas[p] == MASK else None for p in range(n)],
                      "block": [0, n]})
    return trace(steps, output_ids=list(canvas))


def by_name(fig, name):
    return [t for t in fig.data if t.name == name]


def figure_text(fig) -> str:
    return fig.to_json()


# ---------------------------------------------------------------------- token steps
def test_distribution_bars_and_chosen_marker():
    tr = trace([token_step(5), token_step(7)])
    fig = V.distribution_figure(tr, 1)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 2 and all(len(b.y) == 4 for b in bars)
    assert list(bars[0].y) == [0.5, 0.2, 0.2, 0.1] and list(bars[1].y) == [0.7, 0.3, 0.0, 0.0]
    (chosen,) = by_name(fig, "chosen")
    assert list(chosen.x) == [2]  # token 7 is the third bar
    assert "30.0% of the raw mass" in fig.layout.title.subtitle.text
    assert list(fig.layout.xaxis.ticktext) == ["t5", "t6", "t7", "t8"]


def test_timeline_one_point_per_token_step():
    tr = trace([token_step(5, entropy=1.0), token_step(6, entropy=2.0), token_step(8, entropy=0.5)])
    fig = V.timeline_figure(tr)
    ent = by_name(fig, "entropy (nats)")[0]
    assert list(ent.y) == [1.0, 2.0, 0.5]
    prob = by_name(fig, "p(chosen), raw")[0]
    assert list(prob.y) == [0.5, 0.2, 0.1]


# ---------------------------------------------------------------------- draft steps
def _tree_trace():
    # chain 1-2-3 plus a sibling 4 of node 2; 1 and 2 accepted, 3 rejected, 4 never reached
    nodes = [(1, None, 11, True), (2, 1, 12, True), (3, 2, 13, False), (4, 1, 14, None)]
    return trace([token_step(5), draft_step(nodes, [1, 2], correction=15, kind="resample"),
                  draft_step([(1, None, 21, True), (2, 1, 22, True)], [1, 2], correction=23, kind="bonus")])


def test_draft_tree_nodes_path_and_correction():
    tr = _tree_trace()
    fig = V.draft_tree_figure(tr, 1)
    groups = {name: by_name(fig, name) for name in ("accepted", "rejected", "never reached")}
    assert sum(len(g[0].x) for g in groups.values() if g) == 4
    assert list(groups["accepted"][0].customdata) == ["1", "2"]
    assert list(groups["rejected"][0].customdata) == ["3"]
    assert list(groups["never reached"][0].customdata) == ["4"]
    assert groups["accepted"][0].marker.color == ACCEPTED and groups["rejected"][0].marker.color == REJECTED
    (corr,) = by_name(fig, "correction")
    assert list(corr.text) == ["t15"] and corr.x[0] == 3  # child of the last accepted node (depth 2)
    # depth on x: nodes 1,2,3 on depths 1,2,3
    xs = dict(zip(groups["accepted"][0].customdata, groups["accepted"][0].x))
    assert xs == {"1": 1, "2": 2}
    (bonus,) = by_name(V.draft_tree_figure(tr, 2), "bonus")
    assert list(bonus.text) == ["t23"]


def test_draft_step_shows_the_distribution_its_correction_came_from():
    step = draft_step([(1, None, 11, False)], [], correction=6, kind="resample")
    step["correction_dist"] = token_step(6)["dist"]
    tr = trace([step])
    assert [t for t, _ in V.step_figures(tr, 0)] == ["Draft tree", "Correction distribution"]
    fig = V.distribution_figure(tr, 0)
    assert fig.layout.title.text.startswith("Correction distribution") and list(by_name(fig, "chosen")[0].x) == [1]
    assert [t for t, _ in V.step_figures(trace([draft_step([(1, None, 11, True)], [1])]), 0)] == ["Draft tree"]


def test_draft_tree_siblings_spread_on_y():
    nodes = [(0, None, 11, True), (1, None, 12, False), (2, None, 13, None)]
    fig = V.draft_tree_figure(trace([draft_step(nodes, [0], correction=None)]), 0)
    ys = [y for t in fig.data if t.name in ("accepted", "rejected", "never reached") for y in t.y]
    assert len(set(ys)) == 3


def test_accepted_length_histogram_and_acceptance_timeline():
    tr = _tree_trace()
    h = V.accepted_length_histogram(tr)
    (bar,) = [t for t in h.data if t.type == "bar"]
    assert list(bar.x) == [0, 1, 2, 3] and list(bar.y) == [0, 0, 2, 0]
    assert "mean accepted length 2.00" in h.layout.title.text + h.layout.title.subtitle.text
    assert "tokens per verification 3.00" in h.layout.title.text + h.layout.title.subtitle.text
    a = V.acceptance_timeline(tr)
    assert list(by_name(a, "accepted")[0].y) == [2, 2]
    assert list(by_name(a, "correction")[0].y) == [1, 0]
    assert list(by_name(a, "bonus")[0].y) == [0, 1]
    assert list(by_name(a, "acceptance this step")[0].y) == pytest.approx([2 / 4, 2 / 2])
    assert by_name(a, "acceptance so far")[0].y[-1] == pytest.approx(4 / 6)  # 4 of 6 drafted tokens


def test_acceptance_has_one_definition_everywhere():
    """acceptance = accepted drafted tokens / drafted tokens (every node of a tree counts);
    the per-verification mean accepted length is a separate, named figure; the stats line,
    the plots and the decoders' stats function agree on both."""
    from playground.core.trace import speculative_figures

    wide = [(k, None, 30 + k, k == 0 or None) for k in range(6)]  # 6 siblings, the first accepted
    tr = trace([draft_step(wide, [0], correction=40, kind="resample"),
                draft_step([(1, None, 21, True), (2, 1, 22, True), (3, 2, 23, False)], [1, 2], correction=24,
                           kind="resample")])
    figs = speculative_figures(drafted=9, accepted=3, verifications=2, committed=5)
    assert figs == {"acceptance_rate": pytest.approx(3 / 9, abs=1e-4), "mean_accepted_length": 1.5,
                    "tokens_per_verification": 2.5}
    assert V.tree.trace_figures(tr) == figs
    line = V.stats_line(tr)
    assert "acceptance 33%" in line and "mean accepted length 1.50" in line
    a = V.acceptance_timeline(tr)
    assert "acceptance 33%" in a.layout.title.text and by_name(a, "acceptance so far")[0].y[-1] == pytest.approx(3 / 9)
    h = V.accepted_length_histogram(tr)
    assert "mean accepted length 1.50" in h.layout.title.text + (h.layout.title.subtitle.text or "")
    # a stored trace whose stats carry another definition: the line follows the steps
    tr["stats"]["acceptance_rate"] = 0.75
    assert "acceptance 33%" in V.stats_line(tr)



def test_speculative_bench_uses_the_same_definitions():
    from playground.bench.speculative import _agg
    from playground.core.trace import speculative_figures

    rows = [{"new": 10, "tf": 5, "df": 8, "wall": 1.0, "acc": 6, "drafted": 12, "verifications": 4},
            {"new": 9, "tf": 5, "df": 8, "wall": 1.0, "acc": 2, "drafted": 8, "verifications": 4}]
    a = _agg(rows)
    f = speculative_figures(drafted=20, accepted=8, verifications=8, committed=19)
    assert (a["acc"], a["mal"]) == (f["acceptance_rate"], f["mean_accepted_length"]) == (0.4, 1.0)


# ---------------------------------------------------------------------- denoise steps
def test_heatmap_cells_are_commit_steps():
    tr = denoise_trace()
    fig = V.unmask_heatmap(tr)
    (hm,) = by_name(fig, "committed")
    cells = {}
    for r, row in enumerate(hm.z):
        for p, v in enumerate(row):
            if not (isinstance(v, float) and math.isnan(v)):
                cells[p] = (hm.y[r], v)
    assert cells == {0: (0, 0.1), 3: (0, 0.4), 1: (1, 0.2), 4: (1, 0.5), 5: (2, 0.6), 2: (3, 0.3)}


def test_heatmap_shows_remasks():
    tr = denoise_trace(schedule=((0, 3), (1, 4), (5, 3), (2,)), remask_at=(2, 3))
    fig = V.unmask_heatmap(tr)
    (rm,) = by_name(fig, "remasked")
    assert list(rm.x) == [3] and list(rm.y) == [2]


def test_canvas_shows_masks_and_commits():
    tr = denoise_trace()
    html1 = V.canvas_html(tr, 1)  # after step 1: positions 0,1,3,4 filled; 2,5 masked
    assert html1.count('class="tok mask"') == 2
    assert html1.count("tok new") == 2
    spans = re.findall(r'<span class="tok[^"]*"[^>]*data-step="(\d+)" data-pos="(\d+)"', html1)
    assert dict((int(p), int(s)) for s, p in spans) == {0: 0, 1: 1, 2: 1, 3: 0, 4: 1, 5: 1}
    assert V.canvas_html(tr, 3).count('class="tok mask"') == 0


def test_position_metrics_and_commits_per_step():
    tr = denoise_trace()
    fig = V.position_metrics_figure(tr, 0)
    (now,) = by_name(fig, "committed this step")
    (masked,) = by_name(fig, "masked")
    assert list(now.x) == [0, 3] and list(now.y) == [0.1, 0.4]
    assert list(masked.x) == [1, 2, 4, 5] and all(v is None for v in masked.y)
    c = V.commits_per_step_figure(tr)
    assert list(by_name(c, "committed")[0].y) == [2, 2, 1, 1]
    assert list(by_name(c, "filled so far")[0].y) == [2, 4, 5, 6]


def test_tokens_html_diffusion_renders_canvas_with_masks():
    tr = denoise_trace()
    out = V.tokens_html(tr, "unmask_step", lane=1, upto_step=0)
    assert out.count('class="tok mask"') == 4
    assert len(re.findall(r'<span class="tok[^"]*" data-lane="1" data-step="\d+"', out)) == 6


# ---------------------------------------------------------------------- beam & jacobi
def test_beam_tree_node_count_and_edges():
    steps = [
        {"kind": "beam", "committed": [], "beams": [{"ids": [5], "score": -0.1, "parent": None, "finished": False},
                                                     {"ids": [6], "score": -0.9, "parent": None, "finished": False}]},
        {"kind": "beam", "committed": [], "beams": [{"ids": [5, 7], "score": -0.3, "parent": 0, "finished": False},
                                                     {"ids": [5, 8], "score": -1.0, "parent": 0, "finished": True}]},
        {"kind": "beam", "committed": [5, 7, 9], "beams": [{"ids": [5, 7, 9], "score": -0.5, "finished": False}]},
    ]
    tr = trace(steps)
    fig = V.beam_tree_figure(tr, 2)
    (nodes,) = by_name(fig, "beams")
    assert len(nodes.x) == 5
    assert list(nodes.marker.symbol).count("square") == 1
    bold = by_name(fig, "lineage")[0]
    # lineage of the live beam: 0@0 -> 0@1 -> 0@2 (parent inferred from ids at the last step)
    assert [v for v in bold.y if v is not None] == [0, 0, 0, 0]
    assert len(by_name(V.beam_tree_figure(tr, 0), "beams")[0].x) == 2


def test_jacobi_grid_shape():
    steps = [{"kind": "jacobi", "committed": [5], "guess": [5, 6, 7, 8], "converged": 1},
             {"kind": "jacobi", "committed": [6, 9], "guess": [6, 9, 10, 11], "converged": 2},
             {"kind": "jacobi", "committed": [10], "guess": [10, 11, 12], "converged": 1}]
    tr = trace(steps)
    fig = V.jacobi_grid_figure(tr, 2)
    (hm,) = [t for t in fig.data if t.type == "heatmap"]
    assert len(hm.z) == 3 and all(len(r) == 4 for r in hm.z)
    assert hm.z[1][0] == 0 and hm.z[1][1] == 0  # converged prefix of 2
    assert hm.z[1][2] == 1  # output position 3 was guessed 8, now 10: changed
    assert hm.z[2][1] == 2  # output position 4 stayed 11: unchanged
    assert math.isnan(hm.z[2][3])  # the last window is one shorter


# ---------------------------------------------------------------------- comparison strip
def test_progress_one_trace_per_lane():
    a = trace([token_step(5), token_step(6), token_step(7)])
    b = trace([draft_step([(1, None, 5, True), (2, 1, 6, True)], [1, 2], correction=7, kind="bonus")])
    fig = V.progress_figure([a, b, trace([])])
    assert len(fig.data) == 3
    assert list(fig.data[0].y) == [0, 1, 2, 3] and list(fig.data[1].y) == [0, 3]
    assert list(fig.data[0].x) == [0, 1, 2, 3]


def test_progress_credits_a_finished_beam_search_output():
    beams = [{"ids": [5, 7], "score": -0.9, "parent": 0, "finished": True}]
    tr = trace([{"kind": "beam", "committed": [], "beams": beams}], output_ids=[5, 7])
    assert list(V.progress_figure([tr]).data[0].y) == [0, 2]


def test_denoise_timeline_is_mean_commit_confidence():
    fig = V.timeline_figure(denoise_trace())
    (conf,) = by_name(fig, "mean confidence of commits")
    assert list(conf.y) == pytest.approx([0.25, 0.35, 0.6, 0.3])


def test_divergence_finds_first_differing_position():
    assert first_divergence([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) is None
    a = trace([token_step(5), token_step(6), token_step(7), token_step(8)])
    b = trace([token_step(5), token_step(6), token_step(8), token_step(8)])
    c = trace([token_step(5), token_step(6), token_step(7)])
    out = V.divergence_html([a, b, c])
    assert 'data-first="2"' in out
    assert 'data-lane="1" data-diverge="2"' in out and 'data-lane="2" data-diverge=""' in out


# ---------------------------------------------------------------------- output HTML
def test_tokens_html_escapes_and_every_span_has_step():
    tr = trace([token_step(5), token_step(6)], tokens={5: EVIL, 6: "a & b"})
    for metric in ("probability", "entropy", "acceptance", "unmask_step", "none", "bogus"):
        out = V.tokens_html(tr, metric, lane=2)
        assert "<script>" not in out and "&lt;script&gt;" in out and "a &amp; b" in out
        spans = re.findall(r"<span[^>]*>", out)
        assert len(spans) == 2 and all('data-step="' in s and 'data-lane="2"' in s for s in spans)
    plots = [V.distribution_figure(tr, 0), V.timeline_figure(tr)]
    assert all("<script>" not in f.to_json() for f in plots)


def test_newline_tokens_stay_visible():
    tr = trace([token_step(5), token_step(6)], tokens={5: "\n", 6: "a"})
    out = V.tokens_html(tr, "probability")
    first = re.search(r'<span class="tok"[^>]*>(.*?)</span>\n?</span>', out, re.S)
    assert "↵" in out and first is not None and "\n" in out


def test_tokens_html_steps_colours_and_upto():
    tr = _tree_trace()
    out = V.tokens_html(tr, "acceptance")
    steps = re.findall(r'data-step="(\d+)"', out)
    assert steps == ["0", "1", "1", "1", "2", "2", "2"]
    assert out.count("rgba(34,165,91") == 4 and out.count("rgba(240,122,26") == 1 and out.count("rgba(59,130,246") == 1
    assert len(re.findall(r'data-step="', V.tokens_html(tr, "none", upto_step=1))) == 4


def test_tokens_html_uses_final_output_and_pieces():
    tr = trace([token_step(5), token_step(6), token_step(7)], output_ids=[5, 6], pieces=["A", "B"])
    out = V.tokens_html(tr, "probability")
    assert re.findall(r">([^<]*)</span>", out) == ["A", "B"]


def test_running_beam_search_shows_its_best_hypothesis():
    beams = [{"ids": [5, 7], "score": -0.9, "parent": 0, "finished": False},
             {"ids": [6, 8], "score": -0.4, "parent": 1, "finished": False}]
    tr = trace([{"kind": "beam", "committed": [], "beams": beams}], output_ids=[], done=False)
    out = V.tokens_html(tr, "probability")
    assert re.findall(r'class="tok prov"[^>]*>([^<]*)<', out) == ["t6", "t8"]
    done = trace([{"kind": "beam", "committed": [], "beams": beams}], output_ids=[5, 7], done=True)
    assert "prov" not in V.tokens_html(done, "none") and V.tokens_html(done, "none").count('class="tok"') == 2


def test_plot_text_is_escaped_everywhere():
    nodes = [(1, None, 5, True)]
    tr = trace([draft_step(nodes, [1], correction=5, kind="resample")], tokens={5: EVIL})
    figs = [V.draft_tree_figure(tr, 0)] + [f for _, f in V.run_figures(tr)]
    for f in figs:
        assert "<script>" not in f.to_json()
    assert "<script>" not in V.divergence_html([tr, tr])


def test_stats_line():
    tr = trace([token_step(5), token_step(6)])
    line = V.stats_line(tr)
    assert "2 tokens" in line and "2 target forwards" in line and "1.00 tokens/forward" in line
    assert "4.0 tokens/s" in line
    assert "acceptance 67%" in V.stats_line(_tree_trace())  # 4 accepted of 6 drafted tokens
    assert "mean accepted length 2.00" in V.stats_line(_tree_trace())


def test_legend_for_every_metric():
    for m in ("probability", "entropy", "acceptance", "unmask_step", "none"):
        assert V.legend_html(m).startswith('<div class="tok-legend"')


# ---------------------------------------------------------------------- robustness
EMPTY_CASES = [trace([]), {}, {"steps": None}, {"steps": [{"kind": "token"}]},
               {"steps": [{"kind": "draft", "tree": {}}]}, {"steps": [{"kind": "denoise", "canvas": None}]},
               {"steps": [{"kind": "beam"}]}, {"steps": [{"kind": "jacobi", "guess": None}]},
               {"steps": [{"kind": "token", "dist": {"top_ids": [1], "raw_probs": [None]}}]},
               {"steps": [{"kind": "draft", "tree": {"nodes": [{"id": 1, "parent": 1}], "accepted_path": [7]}}]}]


@pytest.mark.parametrize("tr", EMPTY_CASES)
def test_every_function_survives_empty_and_partial_traces(tr):
    figs = [V.distribution_figure(tr, 0), V.timeline_figure(tr), V.draft_tree_figure(tr, 0),
            V.accepted_length_histogram(tr), V.acceptance_timeline(tr), V.unmask_heatmap(tr),
            V.position_metrics_figure(tr, 0), V.commits_per_step_figure(tr), V.beam_tree_figure(tr, 0),
            V.jacobi_grid_figure(tr, 5), V.progress_figure([tr, tr]), V.progress_figure([])]
    assert all(isinstance(f, go.Figure) for f in figs)
    for m in ("probability", "entropy", "acceptance", "unmask_step", "none"):
        assert isinstance(V.tokens_html(tr, m), str) and isinstance(V.tokens_html(tr, m, upto_step=3), str)
    assert isinstance(V.canvas_html(tr, 0), str) and isinstance(V.stats_line(tr), str)
    assert isinstance(V.divergence_html([tr, tr]), str) and isinstance(V.divergence_html([]), str)
    assert V.step_count(tr) == len(tr.get("steps") or [])
    for title, f in V.step_figures(tr, 0) + V.run_figures(tr):
        assert isinstance(title, str) and isinstance(f, (go.Figure, str))
        assert "could not draw" not in (f if isinstance(f, str) else f.to_json()), title
    for f in figs:
        assert "could not draw" not in f.to_json()


def test_wrong_kind_gives_a_note():
    tr = trace([token_step(5)])
    fig = V.draft_tree_figure(tr, 0)
    assert "token step" in fig.layout.annotations[0].text


def test_step_figures_follow_the_step_kind():
    tr = _tree_trace()
    assert [t for t, _ in V.step_figures(tr, 0)] == ["Distribution"]
    assert [t for t, _ in V.step_figures(tr, 1)] == ["Draft tree"]
    assert [t for t, _ in V.step_figures(tr, 99)] == ["Draft tree"]  # clamped
    titles = [t for t, _ in V.run_figures(tr)]
    assert titles == ["Entropy and probability", "Accepted length", "Acceptance over time", "Acceptance by draft position"]
    d = denoise_trace()
    kinds = [(t, type(f).__name__) for t, f in V.step_figures(d, 0)]
    assert kinds == [("Canvas", "str"), ("Per-position metrics", "Figure")]
    assert V.step_count(d) == 4


# ---------------------------------------------------------------------- real decoders
# One test per family: a real decoder on a tiny model, every plot of every step rendered.
# Each takes a few seconds on a busy CPU, together tens of seconds: marked slow.
def render_everything(tr: dict) -> None:
    """Every figure for every step, as the page would call them; raises on any error."""
    import json

    n = V.step_count(tr)
    assert n > 0
    figs: list = []
    metrics = ("probability", "entropy", "acceptance", "unmask_step", "none")
    for s in range(n):
        assert 'data-step="' in V.tokens_html(tr, metrics[s % len(metrics)], lane=0, upto_step=s)
        plots = V.step_figures(tr, s)
        assert 1 <= len(plots) <= V.MAX_STEP_PLOTS
        figs += [f for _, f in plots]
        assert not any(isinstance(f, go.Figure) and f.layout.annotations and "could not draw" in
                       str(f.layout.annotations[0].text) for _, f in plots)
    runs = V.run_figures(tr)
    assert 1 <= len(runs) <= V.MAX_RUN_PLOTS
    figs += [f for _, f in runs]
    figs += [V.progress_figure([tr, tr]), V.stats_line(tr), V.divergence_html([tr, tr])]
    for m in ("probability", "entropy", "acceptance", "unmask_step", "none"):
        figs.append(V.tokens_html(tr, m))
    for f in figs:
        if isinstance(f, go.Figure):
            assert "could not draw" not in f.to_json()
            json.loads(f.to_json())  # serialisable, as Gradio needs


def run_real(handle, decoder, n=8, draft=None, **params):
    from playground.engine import prepare

    run = prepare(model=handle, decoder=decoder, prompt="ROMEO: But soft", max_new_tokens=n, seed=0,
                  draft=draft, params=params)
    snap = None
    while run.step() is not None:
        if snap is None:
            snap = run.snapshot()  # a live snapshot: partial stats, no pieces yet
    if snap is not None:
        render_everything(snap)
    tr = run.snapshot()
    assert tr["done"]
    return tr


@pytest.fixture(scope="module")
def draft_handle(tokenizer):
    from conftest import build_llama
    from playground.core.models import handle_from_model

    return handle_from_model(build_llama(tokenizer, seed=1, layers=1, hidden=32), tokenizer, name="tiny-draft")


@pytest.fixture(scope="module")
def mlm_handle(tokenizer):
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from playground.core.models import handle_from_model

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)
    model = BertForMaskedLM(cfg).eval()
    with torch.no_grad():
        model.cls.predictions.decoder.weight.mul_(8.0)
    return handle_from_model(model, tokenizer, name="tiny-mlm")


@pytest.mark.slow
@pytest.mark.parametrize("decoder,params,plots", [("greedy", {}, ["Distribution"]),
                                                  ("top_p", {"p": 0.8}, ["Distribution", "Sampler chain"])])
def test_real_sampling_traces_render(llama_handle, decoder, params, plots):
    tr = run_real(llama_handle, decoder, **params)
    render_everything(tr)
    assert [t for t, _ in V.step_figures(tr, 0)] == plots  # a sampler's chain has its stage-by-stage plot


SPECULATIVE = [("speculative", {"gamma": 3}), ("speculative", {"gamma": 3, "temperature": 0.0}),
               ("spec_tree", {"depth": 3, "topk": 2, "width": 2, "budget": 8}), ("prompt_lookup", {}),
               ("ngram_adaptive", {}), ("token_recycling", {}), ("jacobi", {"window": 4}), ("lookahead", {}),
               ("layer_skip", {"exit_layer": 1}), ("mask_probe", {})]


@pytest.mark.slow
@pytest.mark.parametrize("decoder,params", SPECULATIVE)
def test_real_speculative_traces_render(llama_handle, draft_handle, decoder, params):
    import decoders
    from playground.core.trace import speculative_figures

    draft = draft_handle if decoders.REGISTRY[decoder].needs_draft else None
    tr = run_real(llama_handle, decoder, n=10, draft=draft, **params)
    render_everything(tr)
    # the decoder's stats and the figures drawn from its steps are one definition
    st = tr["stats"]
    figs = V.tree.trace_figures(tr)
    assert figs is not None and figs == speculative_figures(
        st["drafted_tokens"], st["accepted_tokens"], st["verifications"], st["new_tokens"])
    for k in ("acceptance_rate", "mean_accepted_length", "tokens_per_verification"):
        assert st[k] == figs[k], k
    assert f"acceptance {100 * st['acceptance_rate']:.0f}%" in V.stats_line(tr)
    drafts = [s for s in tr["steps"] if s["kind"] == "draft" and s["tree"]["nodes"]]
    for s in drafts[:3]:
        fig = V.draft_tree_figure(tr, s["i"])
        nodes = sum(len(t.x) for t in fig.data if t.name in ("accepted", "rejected", "never reached"))
        assert nodes == len(s["tree"]["nodes"])
        acc = by_name(fig, "accepted")
        assert (list(acc[0].customdata) if acc else []) == [str(x) for x in s["tree"]["accepted_path"]]
    jac = [s for s in tr["steps"] if s["kind"] == "jacobi"]
    if jac:
        (hm,) = [t for t in V.jacobi_grid_figure(tr, jac[-1]["i"]).data if t.type == "heatmap"]
        assert len(hm.z) == min(len(jac), visualizers.jacobi.WINDOW)


@pytest.mark.slow
@pytest.mark.parametrize("decoder,params", [("beam", {"num_beams": 3}), ("diverse_beam", {}),
                                            ("arithmetic", {"num_samples": 3})])
def test_real_search_traces_render(llama_handle, decoder, params):
    tr = run_real(llama_handle, decoder, n=6, **params)
    render_everything(tr)
    beam_steps = [s for s in tr["steps"] if s["kind"] == "beam"]
    if beam_steps:
        s = beam_steps[-1]
        (nodes,) = by_name(V.beam_tree_figure(tr, s["i"]), "beams")
        assert len(nodes.x) == sum(len(b["beams"]) for b in beam_steps[-V.beam.WINDOW:])


@pytest.mark.slow
@pytest.mark.parametrize("decoder,params", [("llada", {"steps": 4}), ("fast_dllm", {}), ("freedave", {}),
                                            ("masked_diffusion", {"steps": 4})])
def test_real_diffusion_traces_render(mlm_handle, decoder, params):
    tr = run_real(mlm_handle, decoder, n=8, **params)
    render_everything(tr)
    d = [s for s in tr["steps"] if s["kind"] == "denoise"]
    (hm,) = by_name(V.unmask_heatmap(tr), "committed")
    committed_cells = sum(1 for row in hm.z for v in row if not (isinstance(v, float) and math.isnan(v)))
    with_conf = sum(1 for s in d for p in s["unmasked"] if s["confidence"][p] is not None)
    assert committed_cells == with_conf
    first = V.canvas_html(tr, d[0]["i"])
    assert first.count('class="tok mask"') == sum(1 for t in d[0]["canvas"] if t == d[0]["mask_id"])


# ---------------------------------------------------------------------- figures that agree
def test_diffusion_new_tokens_count_committed_positions_only():
    """A diffusion run's output is its canvas: masked positions are not tokens, live or stopped."""
    from playground.core.trace import Step, Trace, TraceRecorder, committed_count

    class View:
        forwards, tokens = 4, 0

    rec = TraceRecorder(Trace(model="m", decoder="llada", params={}, seed=0, prompt="p", prompt_ids=[1]), View())
    canvas = [MASK] * 8
    for pos in ((0, 5), (1, 2)):
        for p in pos:
            canvas[p] = 10 + p
        rec.add(Step("denoise", [10 + p for p in pos], canvas=list(canvas), mask_id=MASK, unmasked=list(pos)))
    assert committed_count(canvas, rec.trace.steps) == 4
    assert committed_count(canvas, [s.to_dict() for s in rec.trace.steps]) == 4  # snapshots hold dicts
    assert committed_count([5, 6, MASK], []) == 3  # a causal run: every output id is a token
    st = rec.finish(canvas, "", "cancelled").stats
    assert st["new_tokens"] == 4 and st["masked_positions"] == 4 and st["tokens_per_target_forward"] == 1.0
    assert "4 tokens" in V.stats_line(rec.trace.to_dict()) and "4 positions still masked" in V.stats_line(rec.trace.to_dict())


@pytest.mark.slow
def test_diffusion_lane_stats_live_and_stopped(mlm_handle):
    from playground.engine import prepare

    run = prepare(model=mlm_handle, decoder="llada", prompt="ROMEO: But soft", max_new_tokens=8, seed=0,
                  params={"steps": 4})
    step = run.step()
    snap = run.snapshot()
    filled = sum(1 for t in step.evidence["canvas"] if t != step.evidence["mask_id"])
    assert 0 < filled < 8
    assert snap["stats"]["new_tokens"] == filled  # running with committed tokens: not 0
    assert f"{filled} tokens" in V.stats_line(snap)
    run.cancel()
    done = run.snapshot()
    st = done["stats"]
    assert st["finish_reason"] == "cancelled" and len(done["output_ids"]) == 8
    assert st["new_tokens"] == filled and st["masked_positions"] == 8 - filled  # stopped early: not 8
    assert st["tokens_per_target_forward"] == round(filled / st["target_forwards"], 4)


def _beam_trace():
    # beam search: running beams score by summed log-probs, finished ones by logprob / len ** 1.0
    # (and carry the sum as logprob)
    steps = [
        {"kind": "beam", "committed": [], "beams": [{"ids": [5], "score": -1.0, "parent": None, "finished": False},
                                                     {"ids": [6], "score": -2.0, "parent": None, "finished": False}]},
        {"kind": "beam", "committed": [], "beams": [{"ids": [5, 7], "score": -3.0, "parent": 0, "finished": False},
                                                     {"ids": [5, 8], "score": -1.25, "logprob": -2.5, "parent": 0,
                                                      "finished": True}]},
    ]
    return trace(steps, output_ids=[5, 8], decoder="beam", params={"length_penalty": 1.0})


def test_beam_plots_use_one_score_scale():
    tr = _beam_trace()
    assert V.beam.beam_logprob(tr, tr["steps"][1]["beams"][1]) == pytest.approx(-2.5)  # -1.25 * 2
    fig = V.timeline_figure(tr)
    assert list(by_name(fig, "best beam")[0].y) == pytest.approx([-1.0, -2.5])
    assert list(by_name(fig, "worst beam")[0].y) == pytest.approx([-2.0, -3.0])
    assert "log-prob" in fig.layout.yaxis.title.text
    (nodes,) = by_name(V.beam_tree_figure(tr, 1), "beams")
    assert list(nodes.marker.color) == pytest.approx([-1.0, -2.0, -3.0, -2.5])
    # a beam without logprob scores by its summed log-probability already
    assert V.beam.beam_logprob(tr, {"ids": [5, 8], "score": -1.25, "finished": True}) == pytest.approx(-1.25)
    assert V.beam.beam_logprob(tr, {"logprob": -7.0, "score": -1.0, "finished": True}) == -7.0


@pytest.mark.slow
@pytest.mark.parametrize("decoder,knobs", [("beam", {"num_beams": 3}),
                                           ("diverse_beam", {"num_beams": 4, "num_beam_groups": 2})])
def test_real_beam_scores_never_jump_up(llama_handle, decoder, knobs):
    """Extending a hypothesis only adds log-probabilities (<= 0): on one scale, no beam's
    plotted value is above its parent's (a length-normalised score would be)."""
    tr = run_real(llama_handle, decoder, n=8, early_stopping="never", **knobs)
    steps = [s for s in tr["steps"] if s["kind"] == "beam"]
    finished = 0
    for prev, cur in zip(steps, steps[1:]):
        for b in cur["beams"]:
            if isinstance(b.get("parent"), int):
                parent = prev["beams"][b["parent"]]
                assert V.beam.beam_logprob(tr, b) <= V.beam.beam_logprob(tr, parent) + 1e-3
                finished += b["finished"]
    assert finished > 0, "the run must finish some beams for the test to mean something"


def test_progress_lanes_numbered_from_one_with_end_labels():
    a = trace([token_step(5), token_step(6), token_step(7)])
    b = trace([draft_step([(1, None, 5, True), (2, 1, 6, True)], [1, 2], correction=7, kind="bonus")],
              decoder="spec")
    fig = V.progress_figure([a, b, trace([token_step(5), token_step(6), token_step(7)])])
    assert [t.name for t in fig.data] == ["1: x", "2: spec", "3: x"]
    labels = {(a_.x, a_.y): a_.text for a_ in fig.layout.annotations}
    assert labels == {(3, 3): "1=3", (1, 3): "2"}  # lanes 1 and 3 are the same line
    assert fig.data[0].line.dash == "solid" and fig.data[2].line.dash not in (None, "solid")
    assert "lanes 1 and 3 coincide" in fig.layout.title.subtitle.text
    assert "lane 2 3" in fig.layout.title.subtitle.text  # tokens at equal compute, by lane number
    # the page shows this figure under a gr.Plot label, which covers the top-left corner
    from visualizers._common import LABEL_CLEARANCE, top_margin

    assert fig.layout.title.pad.t == LABEL_CLEARANCE
    assert fig.layout.margin.t >= top_margin(fig.layout.title.subtitle.text.count("<br>") + 1, LABEL_CLEARANCE)
    html_ = V.divergence_html([a, b])
    assert "identical to lane 1" in html_ and 'data-lane="0"' in html_ and ">1: x<" in html_


def test_progress_nearby_ends_share_one_label():
    a = trace([token_step(5), token_step(6), token_step(7)])
    b = trace([token_step(5), token_step(6), token_step(8)])  # same counts: identical lines
    c = trace([token_step(5), token_step(6)])
    fig = V.progress_figure([a, b, c], x="steps")
    texts = sorted(a_.text for a_ in fig.layout.annotations)
    assert texts == ["1=2", "3"]
    assert "lanes 1 and 2 coincide" in fig.layout.title.subtitle.text


def _all_figures():
    d = denoise_trace()
    tr = _tree_trace()
    jac = trace([{"kind": "jacobi", "committed": [5], "guess": [5, 6, 7, 8], "converged": 1}])
    figs = [f for t in (tr, d, _beam_trace(), jac) for s in range(V.step_count(t))
            for _, f in V.step_figures(t, s)]
    figs += [f for t in (tr, d, _beam_trace(), jac) for _, f in V.run_figures(t)]
    figs.append(V.progress_figure([tr, d, tr, _beam_trace()]))
    return [f for f in figs if isinstance(f, go.Figure)]


def test_legends_sit_below_the_plot_clear_of_the_title():
    from visualizers._common import LEGEND, TEMPLATE, top_margin

    import plotly.io as pio

    tmpl = pio.templates[TEMPLATE].layout
    assert tmpl.legend.yref == "container" and tmpl.legend.y == 0 and tmpl.legend.yanchor == "bottom"
    assert tmpl.title.yref == "container" and tmpl.title.y == 1 and tmpl.title.yanchor == "top"
    figs = _all_figures()
    assert len(figs) >= 12
    for f in figs:
        assert f.layout.template.layout.legend.y == LEGEND["y"]
        # no figure moves its legend back up or hangs a note over the title row
        assert f.layout.legend.y is None and f.layout.legend.yanchor is None
        assert not any(a.yref == "paper" and (a.y or 0) >= 1 for a in f.layout.annotations)
        sub = f.layout.title.subtitle.text
        lines = sub.count("<br>") + 1 if sub else 0
        top = f.layout.margin.t if f.layout.margin.t is not None else tmpl.margin.t
        assert top >= top_margin(lines), f.layout.title.text


def test_titles_are_wrapped_to_fit_a_lane_card():
    from visualizers._common import SUBTITLE_CHARS, TITLE_CHARS, split_title

    head, sub = split_title("Draft tree · step 12 · accepted 4 of 24 drafted + correction", "source: ● draft-model")
    assert head == "Draft tree · step 12" and sub == ["accepted 4 of 24 drafted + correction · source: ● draft-model"]
    for f in _all_figures():
        assert len(f.layout.title.text) <= TITLE_CHARS, f.layout.title.text
        for line in (f.layout.title.subtitle.text or "").split("<br>"):
            assert len(line) <= SUBTITLE_CHARS, line


def test_draft_tree_root_label_is_not_cut():
    fig = V.draft_tree_figure(_tree_trace(), 1)
    (root,) = [t for t in fig.data if t.name == "context"]
    assert root.textposition == "bottom center" and root.cliponaxis is False
    assert fig.layout.xaxis.range[0] <= -0.5  # half a depth step left of the root for its label


def test_beam_tree_labels_only_the_chosen_step():
    steps = [{"kind": "beam", "committed": [], "beams": [{"ids": [5] * (k + 1), "score": -k, "parent": 0,
                                                          "finished": False} for _ in range(3)]}
             for k in range(20)]
    fig = V.beam_tree_figure(trace(steps), 19)
    (nodes,) = by_name(fig, "beams")
    shown = [t for t in nodes.text if t]
    assert len(nodes.x) == 3 * V.beam.WINDOW and len(shown) == 3  # the last column only
    assert all(x == 19 for x, t in zip(nodes.x, nodes.text) if t)
    assert fig.layout.xaxis.range[1] > 19 + 2  # room for those labels right of the column


def test_probability_colours_spread_on_a_small_model():
    """Chosen-token probabilities of a small model (0.01-0.3) get clearly different colours."""
    def alpha(p):
        tr = trace([token_step(5, raw=(p, 0.2, 0.2, 0.1))])
        return float(re.search(r"rgba\(229,72,77,([0-9.]+)\)", V.tokens_html(tr, "probability")).group(1))

    a = [alpha(p) for p in (1.0, 0.3, 0.1, 0.03, 0.01)]
    assert a == sorted(a) and all(y - x > 0.08 for x, y in zip(a, a[1:]))
    assert a[0] < 0.1 and alpha(1e-5) == pytest.approx(0.7)
    assert "log scale" in V.legend_html("probability")


@pytest.mark.slow
@pytest.mark.parametrize("family,decoder,params", [("ar", "top_p", {"p": 0.8}), ("ar", "beam", {"num_beams": 3}),
                                                   ("spec", "spec_tree", {"depth": 3, "topk": 2, "width": 2,
                                                                          "budget": 8}),
                                                   ("mlm", "llada", {"steps": 4})])
def test_a_live_snapshot_names_every_token_it_mentions(llama_handle, draft_handle, mlm_handle, family, decoder, params):
    """Streaming snapshots collect token texts from the steps added since the last snapshot
    only; at every step they must hold exactly what a walk of the whole trace gives."""
    from playground.engine import prepare, token_texts

    handle = mlm_handle if family == "mlm" else llama_handle
    run = prepare(model=handle, decoder=decoder, prompt="ROMEO: But soft", max_new_tokens=8, seed=0,
                  draft=draft_handle if family == "spec" else None, params=params)
    checked = 0
    while True:
        snap = run.snapshot()
        assert snap["tokens"] == token_texts(handle, snap)
        checked += 1
        if run.step() is None:
            break
    assert checked >= 3 and run.snapshot()["tokens"] == token_texts(handle, run.snapshot())
