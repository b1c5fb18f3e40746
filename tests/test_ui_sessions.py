"""The Sessions view and the replay of stored sessions, without a browser: a replay's first frame
has the text and no plot, the chained frame draws the step plots and the run plots, branches
are listed under their parent and open beside it with the point of divergence marked."""

from __future__ import annotations

import html

import gradio as gr
import pytest

MAX_NEW = 8


@pytest.fixture(scope="module")
def page(demo):
    return demo.compare_page


class Session:
    """Stands in for gr.Request: one browser session, optionally with the page's query string."""

    def __init__(self, name: str, **query: str) -> None:
        self.session_hash = name
        self.query_params = query
        self.headers = {"host": "127.0.0.1:7860"}
        self.url = "http://127.0.0.1:7860/"


def traces_of(decoders=("greedy", "top_k")):
    from playground.engine import prepare

    return [prepare(model="tiny-llama", decoder=d, prompt="ROMEO:", max_new_tokens=MAX_NEW, seed=0,
                    params={"k": 20} if d == "top_k" else {}).finish().to_dict() for d in decoders]


@pytest.fixture()
def stored(tiny, db):
    """A stored two-lane comparison (greedy, top-k): its id and traces."""
    from playground.store import default_store

    traces = traces_of()
    sid = default_store().save_session("parent run", "tiny-llama", "ROMEO:", {"max_new_tokens": MAX_NEW}, traces)
    return sid, traces


def other_token(trace, step):
    from playground.branching import token_choices

    return token_choices(trace, step)[0][1]


def text(up, comp):
    v = up.get(comp)
    v = v if isinstance(v, str) else (v.get("value") if isinstance(v, dict) else str(v))
    return html.unescape(v or "")


def figures(up):
    """The plot components of a frame that carry a figure."""
    out = []
    for comp, v in up.items():
        if isinstance(comp, gr.Plot):
            value = v.get("value") if isinstance(v, dict) else v
            if value is not None:
                out.append(comp)
    return out


# ---------------------------------------------------------------------- replay frames
def test_the_first_frame_shows_the_text_and_builds_no_plot(page, stored, monkeypatch):
    from playground.ui.sessions_view import replay_frame

    sid, traces = stored
    import visualizers

    for name in ("step_figures", "run_figures", "progress_figure"):
        monkeypatch.setattr(visualizers, name, lambda *a, **k: pytest.fail("the first frame built a figure"))
    up = replay_frame(page, sid)
    assert up[page.sid] == sid and up[page.traces] == traces
    assert "Replaying" in text(up, page.status)
    for j, tr in enumerate(traces):
        ui = page.lanes[j]
        assert tr["pieces"][0] in text(up, ui.output) and "tok" in text(up, ui.output)
        assert "tokens" in text(up, ui.stats) or "tok" in text(up, ui.stats)
        assert f"Lane {ui.k} · {tr['decoder']}" in text(up, ui.insp_header)
    assert figures(up) == []
    # opened over another comparison, its plots are hidden until the new ones arrive
    cleared = replay_frame(page, sid, clear=True)
    assert figures(cleared) == []
    for ui in page.lanes[: len(traces)]:
        assert all(cleared[c]["visible"] is False for c in [*ui.step_plots, *ui.run_plots])
    assert up[page.step]["maximum"] >= MAX_NEW - 1
    assert "data-first" in text(up, page.divergence)  # the divergence strip is text: it comes at once


def test_the_chained_frames_draw_the_step_plots_then_the_run_plots(page, stored):
    from playground.ui.sessions_view import (replay_frame, replay_run_plots, replay_step_plots, run_plot_outputs,
                                             step_plot_outputs)

    sid, traces = stored
    first = replay_frame(page, sid, Session("frames"))
    step = first[page.step]["value"]
    second = replay_step_plots(page, first[page.traces], step, Session("frames"))
    assert set(second) <= set(step_plot_outputs(page))
    assert page.progress_plot in figures(second)
    for ui in page.lanes[: len(traces)]:
        assert second[ui.step_plots[0]]["visible"] is True and ui.step_plots[0] in figures(second)
        assert f"step {step}" in text(second, ui.insp_header)
        assert not set(ui.run_plots) & set(second)  # the run plots come in the third frame
    third = replay_run_plots(page, first[page.traces], Session("frames"))
    assert set(third) <= set(run_plot_outputs(page))
    for ui in page.lanes[: len(traces)]:
        assert third[ui.run_plots[0]]["visible"] is True and ui.run_plots[0] in figures(third)


def test_a_step_picked_before_the_plots_arrive_keeps_its_plots(page, stored):
    from playground.ui.sessions_view import replay_frame, replay_step_plots

    sid, _ = stored
    first = replay_frame(page, sid, Session("picked"))
    picked = page.on_step(2, first[page.traces], Session("picked"))  # the user scrubs at once
    assert "step 2" in text(picked, page.lanes[0].insp_header)
    second = replay_step_plots(page, first[page.traces], first[page.step]["value"], Session("picked"))
    assert page.progress_plot in figures(second)
    assert page.lanes[0].step_plots[0] not in second and page.lanes[0].insp_header not in second


def test_nothing_to_draw_without_traces(page, db):
    from playground.ui.sessions_view import replay_run_plots, replay_step_plots

    assert replay_step_plots(page, [], 0, Session("empty")) == {}
    assert replay_run_plots(page, None, Session("empty")) == {}


def test_a_share_link_replays_in_one_frame(page, stored, monkeypatch):
    """A fresh page opening a link gets text and plots together: there, a second frame cost
    Chromium more than it saved (every plot drawn 12.4-13.5 s after navigation in two frames,
    8.4-12.2 s in one, 10.0-10.8 s merged, the text only ~0.5 s earlier; idle machine, 4 replays each)."""
    sid, traces = stored
    import playground.engine

    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    monkeypatch.setattr(playground.engine, "load_model", lambda *a, **k: pytest.fail("replay loaded a model"))
    up = page.on_load(Session("link", session=sid))
    assert up[page.sid] == sid and up[page.traces] == traces
    assert {page.progress_plot, page.lanes[0].step_plots[0], page.lanes[0].run_plots[0]} <= set(figures(up))
    assert "Replaying" in text(up, page.status)
    bad = page.on_load(Session("link", session="bad id!"))
    assert "malformed session id" in text(bad, page.status) and "bad id!" not in text(bad, page.status)


def test_sessions_open_chains_the_plot_frame(demo, page, stored):
    from playground.ui.sessions_view import replay_frame, replay_plots, run_plot_outputs, step_plot_outputs

    chained = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "plots"
               and getattr(fn.fn, "__module__", "") == "playground.ui.sessions_view"]
    assert len(chained) == 1  # after Sessions' Open (a share link's fresh page gets one frame)
    assert all(fn.trigger_after is not None for fn in chained)
    sid, traces = stored
    first = replay_frame(page, sid)
    up = replay_plots(page, first[page.traces], first[page.step]["value"], Session("all"))
    assert set(up) <= set(step_plot_outputs(page) + run_plot_outputs(page))
    assert {page.progress_plot, page.lanes[0].step_plots[0], page.lanes[0].run_plots[0]} <= set(figures(up))


# ---------------------------------------------------------------------- branches
@pytest.fixture()
def tree(stored):
    """The stored comparison, a one-lane branch of its lane 2 at step 3, a branch of that branch,
    a branch of every lane, and an unrelated newer session."""
    from playground.branching import branch_session
    from playground.store import default_store

    store = default_store()
    sid, traces = stored
    one = branch_session(store, sid, 1, other_token(traces[1], 3), step=3)
    b1 = store.load_session(one)
    nested = branch_session(store, one, 1, other_token(b1["runs"][1], 5), step=5)
    every = branch_session(store, sid, 0, other_token(traces[0], 2), step=2, lanes="all")
    later = store.save_session("later run", "tiny-llama", "JULIET:", {}, traces_of(("greedy",)))
    return {"root": sid, "one": one, "nested": nested, "all": every, "later": later}


def test_branches_are_listed_under_their_parent_with_where_they_branched(demo, tree):
    from playground.store import default_store
    from playground.ui.sessions_view import session_rows

    rows = session_rows()
    assert [r[4] for r in rows] == [tree["later"], tree["root"], tree["one"], tree["nested"], tree["all"]]
    store = default_store()
    one = store.load_session(tree["one"])["branch"]
    token = one["text"]
    assert rows[1][0] == "parent run"
    assert rows[2][0].startswith("↳ ") and \
        rows[2][0].endswith(f"— branch of “parent run”, lane 2, step 3, forced '{token}'")
    assert rows[3][0].startswith("\u2003↳ ") and ", lane 2, step 5, forced '" in rows[3][0]
    assert "every lane from lane 1, step 2, forced '" in rows[4][0]
    # selecting a branch's row puts its title alone in the rename box
    sv = demo.sessions_view
    sid, title, _label = sv.on_select([r[4] for r in rows], evt=gr.SelectData(None, {"index": [2, 0], "value": rows[2][0]}))
    assert sid == tree["one"] and title == store.load_session(tree["one"])["title"]


def test_a_branch_whose_parent_was_deleted_is_still_listed(demo, tree):
    from playground.store import default_store
    from playground.ui.sessions_view import session_rows

    default_store().delete_session(tree["root"])
    rows = {r[4]: r[0] for r in session_rows()}
    assert set(rows) == {tree["later"], tree["one"], tree["nested"], tree["all"]}
    assert "branch of a deleted session, lane 2, step 3" in rows[tree["one"]]


def test_opening_a_branch_shows_it_beside_its_parent_with_the_divergence_marked(demo, page, tree):
    from playground.store import default_store

    b = default_store().load_session(tree["one"])
    up = demo.sessions_view.on_open(tree["one"])
    assert up[page.sid] == tree["one"] and up[page.traces] == b["runs"]
    assert up[demo.sessions_view.tabs].selected == "compare"
    assert "parent" in text(up, page.lanes[0].stats) and "its lane 2" in text(up, page.lanes[0].stats)
    assert f"forced '{b['branch']['text']}' at step 3" in text(up, page.lanes[1].stats)
    assert "branch of “parent run”, lane 2, step 3" in text(up, page.status)
    pos = b["branch"]["position"]
    assert f"first diverge at position {pos}" in text(up, page.divergence)
    assert up[page.step]["value"] == 3  # the inspector opens on the forced step
    # both lanes agree before the forced step and part at it
    parent, branch = b["runs"]
    assert parent["output_ids"][:pos] == branch["output_ids"][:pos]
    assert parent["output_ids"][pos] != branch["output_ids"][pos] == b["branch"]["token"]


def test_a_branch_of_every_lane_opens_with_its_lanes_labelled(demo, page, tree):
    up = demo.sessions_view.on_open(tree["all"])
    assert up[page.sid] == tree["all"] and len(up[page.traces]) == 2
    assert all("from lane 1's prefix" in text(up, ui.stats) for ui in page.lanes[:2])
    assert "every lane from lane 1, step 2" in text(up, page.status)


def test_the_share_link_of_a_branch_opens_that_branch(page, tree):
    link = page.on_share(tree["nested"], Session("share"))
    assert link.endswith(f"?session={tree['nested']}")
    up = page.on_load(Session("open", session=tree["nested"]))
    assert up[page.sid] == tree["nested"] and "branch of “" in text(up, page.status)
