"""``playground sessions export ID --html``: one self-contained HTML page of a stored session."""

from __future__ import annotations

import json
import re

import pytest

from playground.api import compare
from playground.cli import main
from playground.html_export import session_html
from playground.store import Store
import visualizers

EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A stored two-lane session (greedy, speculative) whose first token reads as a script tag."""
    lanes = [{"decoder": "greedy"},
             {"decoder": "speculative", "knobs": {"gamma": 2}, "draft": "tiny-shakespeare-draft"}]
    traces = compare(lanes=lanes, prompt="ROMEO.\n<b>Soft</b>", seed=1, max_new_tokens=5)
    first = str(traces[0]["output_ids"][0])
    traces[0]["tokens"][first] = EVIL  # what a model's own token text could hold
    if isinstance(traces[0].get("pieces"), list):  # the per-position text the output is drawn from
        traces[0]["pieces"][0] = EVIL
    path = tmp_path_factory.mktemp("html") / "s.db"
    with Store(path) as s:
        sid = s.save_session("a <title> & more", "tiny-shakespeare", "ROMEO.\n<b>Soft</b>",
                             {"seed": 1, "max_new_tokens": 5}, traces)
        session = s.load_session(sid)
    return path, sid, session


@pytest.fixture(scope="module")
def page(stored, tmp_path_factory):
    path, sid, _ = stored
    out = tmp_path_factory.mktemp("page") / "session.html"
    assert main(["sessions", "--db", str(path), "export", sid, "--html", "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def _body(page: str) -> str:
    """The page after plotly.js (the library's own source is not ours to inspect)."""
    return page[page.index("</head>"):]


def _figures(page: str) -> dict[str, dict]:
    return {m.group(1): json.loads(m.group(2)) for m in
            re.finditer(r'<script type="application/json" data-figure="([^"]+)">(.*?)</script>', page, re.S)}


@pytest.mark.slow
def test_every_lane_text_is_there_escaped(stored, page):
    _, _, session = stored
    body = _body(page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert EVIL not in page
    assert "ROMEO.\n&lt;b&gt;Soft&lt;/b&gt;" in body and "<b>Soft" not in body
    assert "<title>a &lt;title&gt; &amp; more</title>" in page
    for j, run in enumerate(session["runs"]):
        assert f'<section class="lane" data-lane="{j}">' in body
        assert visualizers.tokens_html(run, visualizers.auto_metric(run), lane=j) in body
        assert visualizers.stats_line(run) in body
    # the speculative lane is coloured by draft acceptance, as on the page
    assert 'data-metric="acceptance"' in body


@pytest.mark.slow
def test_no_external_url_is_needed(page):
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page, re.I)
    assert not [t for t in tags if re.search(r"\b(src|href)\s*=", t, re.I)]
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", _body(page), re.I)
    # plotly.js itself is inlined, once
    head = page[:page.index("</head>")]
    assert head.count("<script>") == 1 and "plotly" in head.lower() and len(head) > 1_000_000


@pytest.mark.slow
def test_the_figures_json_is_embedded(stored, page):
    _, _, session = stored
    figs = _figures(page)
    for j, run in enumerate(session["runs"]):
        want = visualizers.run_figures(run)
        mine = {k: v for k, v in figs.items() if k.startswith(f"pg-lane{j}-plot")}
        assert len(mine) == len(want) >= 1
        for k, (_, fig) in enumerate(want):
            assert f'<div class="plot" id="pg-lane{j}-plot{k}"' in page
            assert mine[f"pg-lane{j}-plot{k}"]["data"] == json.loads(fig.to_json())["data"]
    assert "pg-compare0" in figs  # the plot across lanes
    assert "Plotly.newPlot" in _body(page)


@pytest.mark.slow
def test_every_steps_plots_are_embedded_for_the_scrubber(stored, page):
    _, _, session = stored
    blocks = {m.group(1): json.loads(m.group(2)) for m in
              re.finditer(r'<script type="application/json" data-steps="(\d+)">(.*?)</script>', page, re.S)}
    assert sorted(blocks) == [str(j) for j in range(len(session["runs"]))]
    for j, run in enumerate(session["runs"]):
        steps = blocks[str(j)]
        assert len(steps) == visualizers.step_count(run) > 0
        for i in (0, len(steps) - 1):
            want = visualizers.step_figures(run, i)
            assert [p["title"] for p in steps[i]] == [t for t, _ in want]
            for p, (_, fig) in zip(steps[i], want):
                if isinstance(fig, str):
                    assert p["html"] == fig
                else:
                    assert p["fig"]["data"] == json.loads(fig.to_json())["data"]
    top = max(visualizers.step_count(r) for r in session["runs"])
    assert f'<input type="range" id="pg-step" min="0" max="{top - 1}" value="{top - 1}"' in page


def test_an_empty_session_still_renders():
    text = session_html({"id": "x", "title": "empty", "model": "m", "prompt": "", "runs": []})
    assert "has no lanes" in text and text.rstrip().endswith("</html>")


@pytest.mark.slow
def test_a_missing_session_is_one_line(stored, tmp_path, capsys):
    path, _, _ = stored
    assert main(["sessions", "--db", str(path), "export", "A" * 32, "--html", "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert not (tmp_path / "x.html").exists()


@pytest.mark.slow
def test_a_branch_tree_and_a_study_export_as_one_page_each(tmp_path):
    """``sessions html ID --tree`` holds the root and every branch, ``--study`` every prompt; each
    session keeps its own scrubber and ids (prefixed), so nothing collides."""
    from playground.branching import branch_session

    db = tmp_path / "t.db"
    lanes = compare(lanes=[{"decoder": "greedy"}, {"decoder": "top_k"}], prompt="ROMEO.\n", seed=1, max_new_tokens=5)
    with Store(db) as s:
        root = s.save_session("the root", "tiny-shakespeare", "ROMEO.\n", {"seed": 1, "max_new_tokens": 5}, lanes)
        kid = branch_session(s, root, 0, int(lanes[0]["output_ids"][1]) + 1, step=1)
    out = tmp_path / "tree.html"
    assert main(["sessions", "--db", str(db), "html", kid, "--tree", "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count('<article class="pg-session"') == 2
    assert 'data-prefix="s0-"' in page and 'data-prefix="s1-"' in page
    assert 'id="s0-pg-step"' in page and 'id="s1-pg-step"' in page and 'id="pg-step"' not in page
    assert "Branch tree of “the root”" in page and 'href="#s1-session"' in page
    ids = re.findall(r'\bid="([^"]+)"', _body(page))
    assert len(ids) == len(set(ids))  # no element id twice

    study = tmp_path / "study.db"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "ROMEO.\\n"}\n{"id": "b", "prompt": "JULIET.\\n"}\n')
    assert main(["study", "--prompts", str(prompts), "--lanes", "greedy,top_p", "--max-new-tokens", "3",
                 "--no-progress", "--out", str(study)]) == 0
    out = tmp_path / "study.html"
    assert main(["sessions", "--db", str(study), "html", "--study", "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count('<article class="pg-session"') == 2 and "Study: 2 prompts" in page
    assert main(["sessions", "--db", str(study), "html", "-o", str(out)]) == 2  # neither an ID nor --study
