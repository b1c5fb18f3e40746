"""The inspector's branch panel and the compare strip's divergence figure, driven through the
page's handlers (no browser), with the tiny random Llama of conftest."""

from __future__ import annotations

import html

import pytest

pytestmark = pytest.mark.slow  # building the Gradio app imports gradio (~10 s on a busy CPU)

MAX_NEW = 8


class Session:
    """Stands in for gr.Request: one browser session."""

    def __init__(self, name: str) -> None:
        self.session_hash = name


class Click:
    """Stands in for the token click's gr.EventData."""

    def __init__(self, **data) -> None:
        self._data = data


@pytest.fixture(scope="module")
def page(demo):
    return demo.compare_page


def run_args(page, lanes, max_new=MAX_NEW):
    args = ["tiny-llama", "", "ROMEO:", 0, max_new, "forwards", "auto", len(lanes), None]
    for j in range(page.max_lanes):
        dec, knobs = lanes[j] if j < len(lanes) else ("greedy", {})
        args += [dec, knobs, None, "(page model)"]
    return args


def text_of(up, comp) -> str:
    v = up.get(comp)
    v = v if isinstance(v, str) else (v.get("value") if isinstance(v, dict) else str(v))
    return html.unescape(v or "")


@pytest.fixture()
def ran(page, tiny, db):
    """A stored two-lane comparison (greedy, top-k sampling): its final frame."""
    frames = list(page.on_run(Session("branch"), *run_args(page, [("greedy", {}), ("top_k", {"k": 20})])))
    final = frames[-1]
    assert final[page.sid] and all(len(t["output_ids"]) == MAX_NEW for t in final[page.traces])
    return final


def branch(page, final, lane, step, choice=None, typed="", scope="one"):
    return page.branch.on_branch(final[page.sid], final[page.traces], lane, step, choice, typed, scope)


def stored(sid):
    from playground.store import default_store

    return default_store().load_session(sid)


def test_picking_a_token_offers_the_steps_top_k(page, ran):
    traces = ran[page.traces]
    up = page.branch.on_click(traces, 0, Click(step=3, lane=1, pos=3))
    assert up[page.branch.accordion]["open"] is True and up[page.branch.lane]["value"] == 0
    choices = [tid for _label, tid in up[page.branch.choice]["choices"]]
    dist = traces[0]["steps"][3]["dist"]
    assert choices == [t for t in dist["top_ids"] if t != traces[0]["output_ids"][3]]
    assert "step 3" in text_of(up, page.branch.where) and "position 3" in text_of(up, page.branch.where)
    # the second lane's token: the panel follows the clicked lane
    assert page.branch.on_click(traces, 0, Click(step=2, lane=2, pos=2))[page.branch.lane]["value"] == 1


def test_forcing_the_token_that_was_chosen_reproduces_the_parent_exactly(page, ran):
    parent = ran[page.traces][0]
    step = 3
    chosen = parent["output_ids"][step]
    up = branch(page, ran, 0, step, typed=str(chosen))
    assert "Branch:" in text_of(up, page.branch.status), text_of(up, page.branch.status)
    b = stored(up[page.sid])
    kept, run = b["runs"]
    assert kept == parent
    assert run["output_ids"] == parent["output_ids"] and run["prompt_ids"] == parent["prompt_ids"]
    # the same distributions at every step: only the marker of the forced step differs
    assert [s.get("dist") for s in run["steps"]] == [s.get("dist") for s in parent["steps"]]
    assert run["steps"][step]["forced"] == [{"position": step, "token": chosen, "picked": chosen}]
    # the page shows both lanes identical and the divergence strip says 0 all along
    assert up[page.traces] == b["runs"]
    assert "identical to lane 1" in text_of(up, page.divergence)
    fig = up[page.compare_plots[0]]
    js = [y for t in fig.data if t.name and t.name.endswith(" JS") for y in t.y]
    assert js and all(y == 0 for y in js)


def test_forcing_another_token_changes_the_lane_from_that_step_on_and_nothing_before(page, ran):
    parent = ran[page.traces][0]
    step = 3
    up_pick = page.branch.on_pick(ran[page.traces], 0, step)
    other = up_pick[page.branch.choice]["choices"][0][1]
    assert other != parent["output_ids"][step]
    up = branch(page, ran, 0, step, choice=other)
    b = stored(up[page.sid])
    assert b["parent"] == ran[page.sid]
    assert b["branch"] == {**b["branch"], "lane": 0, "step": step, "position": step, "token": other, "lanes": "one"}
    kept, run = b["runs"]
    assert run["output_ids"][:step] == parent["output_ids"][:step] and run["output_ids"][step] == other
    assert [s.get("dist") for s in run["steps"][:step]] == [s.get("dist") for s in parent["steps"][:step]]
    # at the edited step the model saw the same prefix: the same distribution, another token chosen
    for key in ("top_ids", "raw_probs"):
        assert run["steps"][step]["dist"][key] == parent["steps"][step]["dist"][key]
    # after the edit the lane conditions on another prefix: its distributions move
    assert run["steps"][step + 1]["dist"] != parent["steps"][step + 1]["dist"]
    assert run["force"] == [[step, other]]
    # in the page: parent's lane beside the branch, the split and the forced token marked
    assert [t["output_ids"] for t in up[page.traces]] == [parent["output_ids"], run["output_ids"]]
    strip = text_of(up, page.divergence)
    assert f"first diverge at position {step}" in strip and f"forced at position {step}" in strip
    assert f'class="tok forced" data-lane="1" data-step="{step}"' in up[page.divergence]
    fig = up[page.compare_plots[0]]
    assert any(t.name == "forced token" and list(t.x) == [step] for t in fig.data)
    assert any(title == "Forced tokens" for title in _run_plot_titles(up, page.lanes[1]))
    status = text_of(up, page.branch.status)
    assert f"position {step}" in status and "\n" not in status


def _run_plot_titles(up, ui):
    return [up[c].get("label") for c in ui.run_plots if isinstance(up.get(c), dict) and up[c].get("visible")]


def test_a_branch_of_every_lane_continues_each_from_the_edited_prefix(page, ran):
    traces = ran[page.traces]
    step = 2
    other = page.branch.on_pick(traces, 1, step)[page.branch.choice]["choices"][0][1]
    up = branch(page, ran, 1, step, choice=other, scope="all")
    runs = stored(up[page.sid])["runs"]
    edited = traces[1]["output_ids"][:step] + [other]
    assert [r["decoder"] for r in runs] == ["greedy", "top_k"]
    assert all(r["output_ids"][:step + 1] == edited for r in runs)
    assert "every lane" in text_of(up, page.branch.status)


def test_the_branch_is_stored_with_its_parent_and_replays_without_a_model(page, ran, monkeypatch):
    parent_sid = ran[page.sid]
    other = page.branch.on_pick(ran[page.traces], 0, 4)[page.branch.choice]["choices"][1][1]
    bid = branch(page, ran, 0, 4, choice=other)[page.sid]
    b = stored(bid)
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    import playground.engine

    monkeypatch.setattr(playground.engine, "load_model", lambda *a, **k: pytest.fail("replay loaded a model"))
    up = page.open_session(bid)  # the share link and the Sessions view open it this way
    assert up[page.traces] == b["runs"] and "first diverge at position 4" in text_of(up, page.divergence)
    # the page offers the parent, and opens it
    offer = page.branch.on_sid(bid)
    assert offer[page.branch.parent] == parent_sid and offer[page.branch.parent_btn]["visible"] is True
    assert page.branch.on_sid(parent_sid)[page.branch.parent_btn]["visible"] is False
    back = page.branch.on_parent(parent_sid)
    assert back[page.sid] == parent_sid and back[page.traces] == ran[page.traces]
    from playground.store import default_store

    assert [k["id"] for k in default_store().branch_tree(parent_sid)["branches"]] == [bid]


def test_a_replay_only_instance_refuses_to_branch_in_one_line(page, ran, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    other = page.branch.on_pick(ran[page.traces], 0, 2)[page.branch.choice]["choices"][0][1]
    up = branch(page, ran, 0, 2, choice=other)
    status = text_of(up, page.branch.status)
    assert "replay only" in status and "\n" not in status and page.sid not in up
    assert up[page.branch.button]["interactive"] is True


@pytest.mark.parametrize("kw, message", [
    (dict(lane=0, step=2), "pick a token"),
    (dict(lane=0, step=2, typed="wherefore art thou Romeo"), "exactly one token"),
    (dict(lane=5, step=2, choice=3), "no lane 6"),
])
def test_bad_branch_input_is_one_line(page, ran, kw, message):
    up = branch(page, ran, **kw)
    status = text_of(up, page.branch.status)
    assert message in status and "\n" not in status and page.sid not in up


def test_typed_text_of_one_token_is_the_replacement(page, ran, tiny):
    tok = tiny.tokenizer
    one = tok.convert_tokens_to_string([tok.convert_ids_to_tokens(200)])
    up = branch(page, ran, 0, 1, typed=one)
    assert stored(up[page.sid])["runs"][1]["output_ids"][1] == 200


def test_a_session_not_stored_or_empty_cannot_be_branched(page, tiny, db):
    up = page.branch.on_branch("", [], 0, 0, 3, "", "one")
    assert "run a comparison" in text_of(up, page.branch.status)
    assert "run a comparison" in text_of(page.branch.on_pick([], 0, 0), page.branch.where)


def test_the_divergence_figure_is_in_the_compare_strip_and_zero_for_identical_lanes(page, tiny, db):
    frames = list(page.on_run(Session("div"), *run_args(page, [("greedy", {}), ("greedy", {})])))
    traces = frames[-1][page.traces]
    up = page.on_draw(traces, None, Session("div"))  # what the page draws when a run ends
    assert set(up) <= set(page.draw_outputs())
    fig = up[page.compare_plots[0]]
    assert fig.layout.title.text.startswith("Divergence from lane 1")
    curves = {t.name: list(t.y) for t in fig.data}
    assert len(curves) == 3 and all(len(ys) == MAX_NEW and all(y == 0 for y in ys) for ys in curves.values())
    # the same figure when the stored session is replayed
    replay = page.open_session(frames[-1][page.sid])
    assert {t.name: list(t.y) for t in replay[page.compare_plots[0]].data} == curves


def test_the_strip_elements_exist(demo, page):
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    assert {"divergence", "divergence-plot", "branch-panel", "branch-token", "branch-text", "branch-scope",
            "branch-run", "branch-status"} <= ids
    assert page.compare_plots[0].elem_id == "divergence-plot"
