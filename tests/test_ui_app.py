"""The Compare page's handlers, driven directly (no browser): run, stop, errors, save, share,
replay without a model, and the Sessions view. Uses the tiny random Llama of conftest."""

from __future__ import annotations

import json

import pytest

from playground.ui.page_session import FrameFlow
from playground.ui.sessions_view import replay_frame

pytestmark = pytest.mark.slow  # building the Gradio app imports gradio (~10 s on a busy CPU)

CONTRACT_IDS = ["model", "prompt", "watch", "seed", "max-new-tokens", "preset", "run", "stop", "step", "share",
                "share-link"] + [f"lane-{k}{s}" for k in (1, 2) for s in ("", "-decoder", "-output", "-stats")]


# demo, db, tiny: conftest.py
@pytest.fixture(scope="module")
def page(demo):
    """The Compare page object of the app (its handlers are called directly)."""
    return demo.compare_page


def run_args(page, lanes, prompt="ROMEO:", max_new=6, model="tiny-llama", policy="forwards"):
    args = [model, "", prompt, 0, max_new, policy, "auto", len(lanes), None]
    for j in range(page.max_lanes):
        dec, knobs = lanes[j] if j < len(lanes) else ("greedy", {})
        args += [dec, knobs, None, "(page model)"]
    return args


def raw_of(up, comp):
    v = up.get(comp)
    return v if isinstance(v, str) else (v.get("value") if isinstance(v, dict) else str(v))


def html_of(up, comp):
    """The text of an HTML update with entities decoded (messages are escaped on the page)."""
    import html

    return html.unescape(raw_of(up, comp))


def test_contract_element_ids_exist(demo):
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    assert set(CONTRACT_IDS) <= ids


def test_run_streams_and_saves_the_session(page, tiny, db):
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})])))
    final = frames[-1]
    status = html_of(final, page.status)
    assert "Done" in status and "Saved" in status
    traces = final[page.traces]
    assert len(traces) == 2 and all(t["done"] for t in traces)
    assert traces[0]["output_ids"] == traces[1]["output_ids"] and len(traces[0]["output_ids"]) == 6
    assert 'class="tok"' in html_of(final, page.lanes[0].output)
    assert "6 tokens" in html_of(final, page.lanes[1].stats)
    sid = final[page.sid]
    from playground.store import default_store

    stored = default_store().load_session(sid)
    assert [r["output_ids"] for r in stored["runs"]] == [t["output_ids"] for t in traces]
    assert stored["settings"]["lanes"][0]["decoder"] == "greedy"


def test_empty_prompt_is_a_one_line_error_and_runs_nothing(page, tiny, db):
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})], prompt="  ")))
    assert len(frames) == 1 and "prompt is empty" in html_of(frames[0], page.status)
    assert page.traces not in frames[0]


def test_a_bad_lane_shows_its_error_and_the_other_lane_runs(page, tiny, db):
    lanes = [("greedy", {}), ("top_k", {"k": -5})]
    final = list(page.on_run(None, *run_args(page, lanes)))[-1]
    assert "knob 'k'=-5 is out of range" in html_of(final, page.lanes[1].output)
    assert 'class="lane-error"' in html_of(final, page.lanes[1].output)
    assert len(final[page.traces][0]["output_ids"]) == 6


def test_unknown_decoder_and_missing_model_are_clear_errors(page, tiny, db):
    final = list(page.on_run(None, *run_args(page, [("greedy", {}), ("no_such", {})])))[-1]
    assert "unknown decoder 'no_such'" in html_of(final, page.lanes[1].output)
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})], model="missing-model")))
    assert "does not exist" in html_of(frames[-1], page.status)
    assert "Traceback" not in json.dumps({str(k): str(v) for k, v in frames[-1].items()})


def test_hosting_limit_refuses_with_a_message(page, tiny, db, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MAX_NEW_TOKENS", "4")
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})], max_new=6)))
    assert "over this instance's limit of 4" in html_of(frames[-1], page.status)


def test_replay_only_instance_refuses_to_run(page, tiny, db, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})])))
    assert "replay only" in html_of(frames[-1], page.status)


def run_and_stop(page, lanes, max_new=200):
    """Run ``lanes`` and press Stop at the fourth frame; the last frame (with
    ``frame_per_snapshot``, Stop then lands mid-run)."""
    final = None
    for k, up in enumerate(page.on_run(None, *run_args(page, lanes, max_new=max_new))):
        final = up
        if k == 3:
            page.on_stop(None, request=None)
    return final


def test_stop_keeps_what_was_made_and_saves(page, tiny, db, frame_per_snapshot):
    final = run_and_stop(page, [("greedy", {}), ("greedy", {})])
    traces = final[page.traces]
    assert all(t["stats"]["finish_reason"] == "cancelled" for t in traces)
    assert all(0 < len(t["output_ids"]) < 200 for t in traces)
    assert "Stopped" in html_of(final, page.status) and final[page.sid]


def test_share_link_uses_the_app_url(page, db):
    from playground.store import default_store
    from tests.test_store import make_trace

    class Req:
        request = None
        headers = {"origin": "http://example.org:8080"}

    sid = default_store().save_session("s", "tiny-llama", "ROMEO:", {}, [make_trace()])
    assert page.on_share(sid, False, None, Req()) == "http://example.org:8080/?session=" + sid
    assert page.on_share("", False, None, Req()) == ""
    assert page.on_share("A" * 32, False, None, Req()) == ""  # no such session: a warning, no link


def test_replay_needs_no_model_and_shows_every_lane(page, tiny, db, monkeypatch):
    final = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})])))[-1]
    sid = final[page.sid]
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    import playground.engine

    monkeypatch.setattr(playground.engine, "load_model", lambda *a, **k: pytest.fail("replay loaded a model"))
    up = page.open_session(sid)
    assert up[page.sid] == sid and up[page.traces] == final[page.traces]
    assert raw_of(up, page.lanes[0].output) == raw_of(final, page.lanes[0].output)
    assert raw_of(up, page.lanes[0].stats) == raw_of(final, page.lanes[0].stats)
    assert up[page.lanes[0].step_plots[0]]["visible"] is True
    assert up[page.step]["maximum"] >= 5
    assert "Replaying" in html_of(up, page.status)
    # the page shows no preset now: the preset box is cleared, and picking a preset applies it
    assert up[page.preset] is None and up[page.preset_state] is None
    assert page.lanes[0].nonce in page.on_preset("greedy-beam-sampling", up[page.preset_state])
    up = replay_frame(page, sid)  # a share link's page load, the Sessions tab's Open
    assert up[page.preset] is None and up[page.preset_state] is None


@pytest.mark.parametrize("sid, message", [("bad id!", "malformed session id"), ("A" * 32, "no session")])
def test_a_missing_or_malformed_session_gives_a_clear_message(page, db, sid, message):
    up = page.open_session(sid)
    assert message in html_of(up, page.status)
    assert "bad id!" not in html_of(up, page.status)  # the malformed value is not echoed


def test_script_tokens_are_escaped_in_a_replay(page, db):
    from playground.store import default_store
    from playground.runner import error_trace

    evil = "<script>window.__pwned=1</script>"
    tr = error_trace("x", decoder="greedy", model="m", prompt="p")
    tr["stats"] = {"new_tokens": 2, "target_forwards": 2, "finish_reason": "length"}
    tr.update(output_ids=[5, 6], text=evil + "<img src=x onerror=alert(1)>", tokens={"5": evil, "6": "<img src=x onerror=alert(1)>"},
              pieces=[evil, "<img src=x onerror=alert(1)>"],
              steps=[{"i": 0, "kind": "token", "t": 0.0, "target_forwards": 1, "draft_forwards": 0, "committed": [5],
                      "dist": {"top_ids": [5, 6], "top_tokens": [evil, "<b>"], "raw_probs": [0.6, 0.4],
                               "final_probs": [1.0, 0.0], "entropy": 0.6, "chosen": 5, "chosen_rank": 0, "kept_mass": 0.6}},
                     {"i": 1, "kind": "token", "t": 0.1, "target_forwards": 2, "draft_forwards": 0, "committed": [6]}])
    sid = default_store().save_session(evil, "m", evil, {}, [tr, dict(tr)])
    up = page.open_session(sid)
    out = raw_of(up, page.lanes[0].output)
    assert "&lt;script&gt;" in out and "<script" not in out and "<img" not in out
    import gradio as gr

    shown = " ".join(raw_of(up, c) for c in up if isinstance(c, (gr.HTML, gr.Markdown)))
    assert "<script" not in shown and "<img src=x" not in shown
    assert up[page.prompt] == evil  # the prompt box holds it as plain text


def download_export(sv, sid):
    """Press Export, then follow the link it shows through the page's export route."""
    import re

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from playground.ui.page_routes import page_routes
    from playground.ui.page_session import PageSessions

    link_up, msg = sv.on_export(sid)
    assert "Exported" in msg and link_up["visible"]
    href = re.search(r'href="([^"]+)"', link_up["value"]).group(1)
    r = TestClient(Starlette(routes=page_routes(sessions=PageSessions(), exports=sv.exports))).get("/" + href)
    assert r.status_code == 200 and r.headers["content-disposition"].startswith("attachment;")
    return r.json()


def test_sessions_view_rename_export_import_delete(demo, page, tiny, db, tmp_path):
    from playground.store import default_store
    from playground.ui.sessions_view import session_rows

    sv = demo.sessions_view
    final = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})])))[-1]
    sid = final[page.sid]
    rows = session_rows()
    assert rows[0][4] == sid and rows[0][2] == "greedy, greedy"
    assert "1 stored session" in sv.on_refresh()[2]

    assert "Renamed" in sv.on_rename(sid, "My comparison")[2]
    assert session_rows()[0][0] == "My comparison"
    assert "cannot be empty" in sv.on_rename(sid, "  ")[2]
    assert "select a session" in sv.on_rename(None, "x")[2]

    data = download_export(sv, sid)
    assert data["title"] == "My comparison" and len(data["runs"]) == 2

    before = session_rows()
    for bad, why in ((b"not json", "not valid JSON"), (b'{"format": "other"}', "not a session export"),
                     (json.dumps({**data, "runs": [{"schema": 1}]}).encode(), "missing field")):
        out = sv.on_import(bad)
        assert why in out[2] and "import refused" in out[2]
        assert session_rows() == before  # nothing changed
    rows, _ids, msg = sv.on_import(json.dumps(data).encode())
    assert "Imported" in msg and len(rows) == 2
    new_sid = next(r[4] for r in rows if r[4] != sid)
    assert default_store().load_session(new_sid)["runs"] == default_store().load_session(sid)["runs"]

    opened = sv.on_open(new_sid)
    assert opened[page.sid] == new_sid and opened[page.traces][0]["output_ids"]

    asked = sv.on_delete(sid)  # the first press asks; the second, for the same session, deletes
    assert "Confirm delete" in asked[2] and asked[6] == sid and default_store().count() == 2
    out = sv.on_delete(sid, None, None, asked[6])
    assert "Deleted" in out[2] and [r[4] for r in out[0]] == [new_sid] and out[1] == [new_sid]
    assert "no session" in sv.on_delete(sid, None, None, sid)[2]


def test_a_decoder_on_the_wrong_model_kind_is_a_lane_error(page, tiny, db):
    final = list(page.on_run(None, *run_args(page, [("greedy", {}), ("llada", {})])))[-1]
    assert "needs a diffusion model" in html_of(final, page.lanes[1].output)
    assert len(final[page.traces][0]["output_ids"]) == 6


def test_plot_pacer_keeps_plotting_a_small_share_of_the_time():
    from playground.ui.inspector import PlotPacer

    t = [0.0]
    pacer = PlotPacer(factor=5.0, clock=lambda: t[0])
    assert not pacer.due("strip", 0.0)  # the first frames show text only
    assert not pacer.due("strip", 1.0) and pacer.due("strip", 2.0)
    t[0] = 2.0
    with pacer.timed("strip"):
        t[0] = 3.0  # that redraw cost one second
    assert not pacer.due("strip", 7.0) and pacer.due("strip", 8.0)  # waits 5 x its cost


def test_an_unexpected_failure_is_one_line_not_a_traceback(page, tiny, db, monkeypatch):
    import playground.engine

    def boom(*a, **k):
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")

    monkeypatch.setattr(playground.engine, "load_model", boom)
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})])))
    msg = html_of(frames[-1], page.status)
    assert "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB" in msg and "\n" not in msg


def test_the_run_frames_carry_no_lane_text_while_streaming(page, tiny, db, monkeypatch, frame_per_snapshot):
    """One transport for lane text: a page that does not read the live feed (no script) gets
    its lanes' text in the last frame only, complete; the frames before it carry the status
    line and never a lane's output or stats."""
    import playground.ui.run_handlers as compare

    monkeypatch.setattr(compare, "STREAM_RATE", 0)  # a snapshot after every step, however fast
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})], max_new=12)))
    live = frames[1:-1]
    assert len(live) >= 2 and all(page.status in f for f in live)
    assert not [f for f in live for ui in page.lanes if ui.output in f or ui.stats in f]
    outs = [raw_of(frames[-1], ui.output) for ui in page.lanes[:2]]
    assert all(o.endswith("</div>") and o.count('class="tok"') == 12 for o in outs)


def test_a_tokenizer_that_produces_script_tokens_is_escaped_on_the_page(page, db, monkeypatch):
    """A real tokenizer whose tokens include ``<script>`` and an ``<img onerror>``: the model is
    steered to emit them, and the page shows them as text."""
    from transformers import LlamaForCausalLM

    import playground.engine
    from conftest import build_llama, build_tokenizer
    from playground.core.models import handle_from_model

    tok = build_tokenizer()
    tok.add_tokens(["<script>alert(1)</script>", "<img src=x onerror=alert(2)>"])
    evil_ids = tok.convert_tokens_to_ids(["<script>alert(1)</script>", "<img src=x onerror=alert(2)>"])

    class Steered(LlamaForCausalLM):
        def forward(self, *a, **k):
            out = super().forward(*a, **k)
            out.logits[..., evil_ids[0]] += 50.0
            out.logits[..., evil_ids[1]] += 49.0
            return out

    base = build_llama(tok)
    model = Steered(base.config).eval()
    model.load_state_dict(base.state_dict())
    handle = handle_from_model(model, tok, name="steered")
    monkeypatch.setattr(playground.engine, "load_model", lambda spec, **kw: handle)
    final = list(page.on_run(None, *run_args(page, [("greedy", {}), ("top_k", {"k": 5})], max_new=4)))[-1]
    traces = final[page.traces]
    assert evil_ids[0] in traces[0]["output_ids"]
    for ui in page.lanes[:2]:
        out = raw_of(final, ui.output)
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
        assert "<script" not in out and "<img" not in out
    drawn = page.on_draw(traces, None, None)  # the plots come from the draw chained after Run
    figures = [v["value"] for v in drawn.values() if isinstance(v, dict) and hasattr(v.get("value"), "to_json")]
    assert figures and all("<script" not in f.to_json() for f in figures)


# ---------------------------------------------------------------------- the streaming session
class Session:
    """Stands in for gr.Request: one browser session."""

    def __init__(self, name: str) -> None:
        self.session_hash = name


def _runner_of(page, key):
    return page.sessions.running_runner(key)


def _until_running(page, gen, key):
    """Advance a Run generator until its comparison's worker is registered and decoding."""
    for _ in range(10_000):
        frame = next(gen)
        r = _runner_of(page, key)
        if r is not None and any(t.get("steps") for t in r.latest()[1]):
            return r, frame
    raise AssertionError("the run never started decoding")


def test_closing_the_run_stream_ends_its_worker(page, tiny, db, frame_per_snapshot):
    """The page goes away mid-run (Gradio closes the generator): no decoding thread is left."""
    gen = page.on_run(Session("gone"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=200))
    runner, _ = _until_running(page, gen, "gone")
    thread = runner.thread
    gen.close()
    thread.join(60)
    assert not thread.is_alive() and runner.cancelled
    assert _runner_of(page, "gone") is None
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("playground-compare-gone")]


def test_stop_reaches_the_run_by_its_token_whatever_session_hash_it_comes_with(page, tiny, db, frame_per_snapshot):
    # In the browser, a Stop after a refused Shift+Enter arrived under another session hash than
    # its Run's; the token the Run wrote to #run-token (and Stop sends back) still reaches it.
    first = page.on_run(Session("tok"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=200))
    start = next(first)
    token = start[page.run_token]
    assert token and isinstance(token, str)
    runner, _ = _until_running(page, first, "tok")
    page.on_stop("not-this-run", Session("elsewhere"))  # a stranger's token stops nothing
    assert not runner._cancel.is_set()
    page.on_stop(token, Session("elsewhere"))
    final = list(first)[-1]
    assert "Stopped" in html_of(final, page.status)
    assert all(t["stats"]["finish_reason"] == "cancelled" for t in final[page.traces])


def test_a_second_run_in_the_same_page_is_refused_and_stop_still_reaches_the_first(page, tiny, db, frame_per_snapshot):
    first = page.on_run(Session("busy"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=200))
    runner, _ = _until_running(page, first, "busy")
    frames = list(page.on_run(Session("busy"), *run_args(page, [("greedy", {})], max_new=4)))
    assert len(frames) == 1 and "already running" in html_of(frames[0], page.status)
    assert page.run_btn not in frames[0]  # the refused run leaves the first one's buttons alone
    assert _runner_of(page, "busy") is runner
    page.on_stop(None, Session("busy"))
    final = list(first)[-1]
    assert "Stopped" in html_of(final, page.status)
    assert all(t["stats"]["finish_reason"] == "cancelled" for t in final[page.traces])


def test_stop_during_preparation_ends_the_run_at_once(page, tiny, db, frame_per_snapshot, monkeypatch):
    """Lane 2's model hangs while loading; Stop ends the run with lane 1's output kept."""
    import threading

    import playground.engine

    release = threading.Event()

    def load(spec, **kw):
        if spec == "hanging-model":
            release.wait(120)
        return tiny

    monkeypatch.setattr(playground.engine, "load_model", load)
    args = run_args(page, [("greedy", {}), ("greedy", {})], max_new=200)
    args[9 + 4 + 3] = "hanging-model"  # lane 2's own model
    gen = page.on_run(Session("prep"), *args)
    runner, _ = _until_running(page, gen, "prep")
    assert runner.lanes[1].preparing
    page.on_stop(None, Session("prep"))
    final = list(gen)[-1]
    release.set()
    traces = final[page.traces]
    assert "Stopped" in html_of(final, page.status)
    assert traces[0]["output_ids"] and traces[1]["stats"]["finish_reason"] == "cancelled"
    assert not traces[1]["output_ids"]


def test_live_frames_leave_the_state_and_the_plots_to_the_end(page, tiny, db, monkeypatch, frame_per_snapshot):
    import playground.ui.run_handlers as rs

    monkeypatch.setattr(rs, "STREAM_RATE", 0)
    frames = list(page.on_run(None, *run_args(page, [("greedy", {}), ("greedy", {})], max_new=12)))
    live = frames[1:-1]
    assert live and all(page.traces not in f for f in live)  # the state is filled in once, at the end
    # ...and the start frame leaves it (and the session id) alone: changing them set off their
    # listeners' events in the browser just as the first tokens should be drawn
    assert page.traces not in frames[0] and page.sid not in frames[0] and page.shown not in frames[0]
    final = frames[-1]
    assert final[page.traces] and final[page.shown] and final[page.sid]
    assert all(not any(c in f for c in page.lanes[0].run_plots) for f in live)
    # a lane's legend is sent once, when its colouring is first known
    assert sum(page.lanes[0].legend in f for f in live) == 1


def test_the_run_stream_is_a_short_list_and_the_plots_follow_done(page, tiny, db):
    """Run writes no inspector plot (Gradio builds a component per omitted output per frame);
    the chained draw fills every lane's plots at the scrubber's step, after Done."""
    frames = list(page.on_run(Session("draw"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=6)))
    short = set(page.run_outputs()) | {page.run_btn, page.stop_btn, page.notice, page.run_token}
    assert len(short) < 40 and all(set(f) <= short for f in frames)
    final = frames[-1]
    assert "Done" in html_of(final, page.status) and final[page.run_btn]["interactive"] is True
    assert final[page.step]["value"] == 5
    up = page.on_draw(final[page.traces], final[page.step]["value"], Session("draw"))
    assert set(up) <= set(page.draw_outputs())
    for ui in page.lanes[:2]:
        assert up[ui.step_plots[0]]["visible"] is True and up[ui.run_plots[0]]["visible"] is True
        assert "step 5 of 5" in html_of(up, ui.insp_header)
    assert page.on_draw([], 0, Session("draw")) == {}  # nothing to draw


def test_a_step_picked_while_the_plots_are_drawn_keeps_its_plots(page, tiny, db):
    frames = list(page.on_run(Session("scrub"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=6)))
    traces = frames[-1][page.traces]
    picked = page.on_step(2, traces, Session("scrub"))  # lands before the chained draw is done
    assert "step 2 of" in html_of(picked, page.lanes[0].insp_header)
    up = page.on_draw(traces, 5, Session("scrub"))
    assert page.lanes[0].insp_header not in up and page.lanes[0].step_plots[0] not in up
    assert up[page.lanes[0].run_plots[0]]["visible"] is True


def test_no_page_handler_is_a_public_api_endpoint(demo):
    page_fns = {getattr(f.fn, "__name__", "") for f in demo.fns.values() if f.api_visibility != "private"}
    assert not {n for n in page_fns if n.startswith("on_") or n in ("load_example", "_knobs")}
    named = demo.get_api_info()["named_endpoints"]
    assert not [n for n in named if "on_" in n]


def test_model_work_shares_one_concurrency_group(demo):
    """Run (button and prompt submit) and the model-info handler (page load, model pick) never
    load models outside the shared group (two threads loading at once once broke every Run)."""
    from playground.hosting import MODEL_CONCURRENCY_ID

    fns = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") in ("on_run", "on_model")]
    triggers = {(f.fn.__name__, t[1]) for f in fns for t in f.targets}
    assert {("on_run", "click"), ("on_run", "submit"), ("on_model", "load"), ("on_model", "change")} <= triggers
    assert all(f.concurrency_id == MODEL_CONCURRENCY_ID for f in fns)


# ---------------------------------------------------------------------- frames the page has drawn (issue 10)
def _frame_of(up, page):
    """The frame number a streamed frame's status line carries ("<token>:<n>"), or None."""
    import re

    m = re.search(r'data-frame="([^"]+)"', raw_of(up, page.status) or "") if page.status in up else None
    return m.group(1) if m else None


def test_a_page_that_acknowledges_frames_is_never_sent_more_than_the_window_ahead(page, tiny, db, monkeypatch, frame_per_snapshot):
    """Each live frame names itself; before sending frame n the stream waits until the page
    has drawn frame n - FLOW_WINDOW (so frames never queue up in a busy browser, where a click
    on Stop once waited behind them until the run had ended)."""
    import playground.ui.run_handlers as rs

    monkeypatch.setattr(rs, "STREAM_RATE", 0)
    asked: list[tuple[int, int]] = []
    wait = FrameFlow.wait_drawn

    def spy(self, frame, timeout, cancelled):
        ok = wait(self, frame, timeout, cancelled)
        asked.append((frame, self.drawn))
        return ok

    monkeypatch.setattr(FrameFlow, "wait_drawn", spy)
    monkeypatch.setattr(rs, "FLOW_WAIT_S", 120.0)  # a missing acknowledgement would stall the test
    names = []
    for up in page.on_run(Session("flow"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=24), "flow"):
        name = _frame_of(up, page)
        if name:
            names.append(name)
            page.sessions.frame_drawn(name)  # the page drew it
    assert len(names) > rs.FLOW_WINDOW + 1
    assert [int(n.rsplit(":", 1)[1]) for n in names] == list(range(1, len(names) + 1))
    assert asked and all(drawn >= frame for frame, drawn in asked)  # every wait ended with the frame drawn
    assert [f for f, _ in asked] == [n - rs.FLOW_WINDOW for n in range(1, len(asked) + 1)]
    assert page.sessions.get("flow").flow is None  # the run's flow leaves with it
    page.sessions.frame_drawn(names[-1])  # a late acknowledgement of an ended run is ignored
    page.sessions.frame_drawn("garbage")


def test_a_page_that_stops_acknowledging_slows_the_stream_but_never_stalls_it(page, tiny, db, monkeypatch, frame_per_snapshot):
    import playground.ui.run_handlers as rs

    monkeypatch.setattr(rs, "STREAM_RATE", 0)
    monkeypatch.setattr(rs, "FLOW_WAIT_S", 0.01)
    frames = list(page.on_run(Session("mute"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=12), "flow"))
    assert "Done" in html_of(frames[-1], page.status)
    assert all(len(t["output_ids"]) == 12 for t in frames[-1][page.traces])
    # a page without the acknowledging script (no flow flag) streams frames without names
    plain = list(page.on_run(Session("plain"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=6)))
    assert not [f for f in plain if _frame_of(f, page)]
    assert "data-run-end" not in raw_of(plain[-1], page.status)  # no feed, nothing to fence off


def test_stop_cuts_short_a_wait_for_the_page_to_draw(page, tiny, db, monkeypatch, frame_per_snapshot):
    """A page that stops acknowledging (its browser is swamped) still gets Stop at once. Lane 2's
    model never finishes loading, so only Stop can end this run."""
    import threading

    import playground.engine
    import playground.ui.run_handlers as rs

    release = threading.Event()

    def load(spec, **kw):
        if spec == "hanging-model":
            release.wait(120)
        return tiny

    monkeypatch.setattr(playground.engine, "load_model", load)
    monkeypatch.setattr(rs, "STREAM_RATE", 0)
    monkeypatch.setattr(rs, "FLOW_WAIT_S", 600.0)
    args = run_args(page, [("greedy", {}), ("greedy", {})], max_new=200)
    args[9 + 4 + 3] = "hanging-model"  # lane 2's own model
    gen = page.on_run(Session("swamped"), *args, "flow")
    try:
        for up in gen:  # the page draws the first frames, then falls silent
            if _frame_of(up, page):
                page.sessions.frame_drawn(_frame_of(up, page))
            runner = _runner_of(page, "swamped")
            if runner is not None and any(t.get("steps") for t in runner.latest()[1]):
                break
        frames: list = []
        consumer = threading.Thread(target=lambda: frames.extend(gen), daemon=True)
        consumer.start()
        consumer.join(0.5)  # it now waits for a frame the page never acknowledges
        assert consumer.is_alive()
        page.on_stop(None, Session("swamped"))
        consumer.join(120)
        assert not consumer.is_alive(), "Stop did not end a stream waiting for the page"
        assert "Stopped" in html_of(frames[-1], page.status)
    finally:
        release.set()


def test_the_page_script_talks_to_the_apps_own_routes(demo, monkeypatch):
    """Acknowledgements, Stop's direct path and the live feed's polls go to plain routes of
    the app (a Gradio event per request rebuilt the page's whole configuration first), which
    launch() adds ahead of Gradio's own."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    import playground.ui.run_handlers as rs
    from playground.ui import launch
    from playground.ui.page_routes import page_routes
    from playground.ui.page_session import PageSessions

    run = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "on_run")
    assert run.js == rs.FLOW_JS
    for what in ("ack", "stop", "live"):
        assert f"post('{what}'" in run.js
    assert "root + '/playground_api/' + what" in run.js and "'#stop'" in run.js
    seen = {}
    monkeypatch.setattr(type(demo), "launch", lambda self, **kw: seen.update(kw))
    monkeypatch.setattr(type(demo), "queue", lambda self, **kw: self)
    launch(demo)
    assert [r.path for r in seen["app_kwargs"]["routes"]] == [r.path for r in page_routes(sessions=demo.page_sessions, exports=demo.sessions_view.exports)] + \
        ["/vote", "/playground_api/vote/view", "/playground_api/vote/cast", "/playground_api/vote/study"]

    acked, stopped = [], []
    sessions = PageSessions()
    monkeypatch.setattr(sessions, "frame_drawn", acked.append)
    monkeypatch.setattr(sessions, "stop_run", stopped.append)
    client = TestClient(Starlette(routes=page_routes(sessions=sessions)))
    assert client.post("/playground_api/ack", json={"value": "tok:3"}).status_code == 204
    assert client.post("/playground_api/stop", json={"value": "tok"}).status_code == 204
    assert acked == ["tok:3"] and stopped == ["tok"]
    # an unknown run's poll says so at once; junk is refused without touching anything
    assert client.post("/playground_api/live", json={"value": "x" * 20 + ":0"}).json() == {"unknown": True}
    assert client.post("/playground_api/live", content=b"not json").json() == {"unknown": True}
    # a body over the limit is refused by its length, before it is read, and stops nothing
    assert client.post("/playground_api/stop", content=b"x" * 5000).status_code == 413
    assert stopped == ["tok"]


def test_the_launched_routes_serve_the_pages_own_runs(demo, monkeypatch):
    """The routes launch() adds read the very registry the page's runs are in: a feed the page
    opens is what a poll of its token finds (a separate registry answered every poll
    "unknown", and lane text then came only with the Run frames)."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from playground.ui import app_kwargs
    from playground.ui.page_session import PageSessions

    # the shared page has served other tests' pages; the bug was the empty (falsy) registry of
    # a freshly launched page, so give it one that holds no page yet
    monkeypatch.setattr(demo, "page_sessions", PageSessions())
    assert len(demo.page_sessions) == 0
    client = TestClient(Starlette(routes=app_kwargs(demo)["routes"]))
    token = "ab" * 16
    feed = demo.page_sessions.open_feed(token, lambda lane, trace: ("", ""), "some-page")
    assert feed is not None
    try:
        assert demo.page_sessions.find_feed(f"{token}:0")[0] is feed
        answer = client.post("/playground_api/live", json={"value": f"{token}:0"}).json()
        assert answer != {"unknown": True}
    finally:
        demo.page_sessions.end_run(token)
    assert client.post("/playground_api/live", json={"value": f"{token}:0"}).json() == {"unknown": True}


def test_stop_and_acks_get_through_while_the_same_address_holds_every_poll_slot(monkeypatch):
    """Five pages of one browser (or a class behind one school address) each hold a long poll;
    a Stop sent meanwhile from that address must reach its run, never a 429 (a lost Stop let
    a run the user stopped stream on to its end)."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    import playground.ui.page_routes as pr
    from playground.ui.page_session import PageSessions

    stopped, acked = [], []
    sessions = PageSessions()
    monkeypatch.setattr(sessions, "stop_run", stopped.append)
    monkeypatch.setattr(sessions, "frame_drawn", acked.append)
    monkeypatch.setattr(pr, "ClientSlots", lambda: _FullSlots())
    client = TestClient(Starlette(routes=pr.page_routes(sessions=sessions)))
    assert client.post("/playground_api/live", json={"value": "x" * 20 + ":0"}).status_code == 429
    assert client.post("/playground_api/stop", json={"value": "tok"}).status_code == 204
    assert client.post("/playground_api/ack", json={"value": "tok:1"}).status_code == 204
    assert stopped == ["tok"] and acked == ["tok:1"]
    assert pr.MAX_PER_CLIENT >= 30  # a classroom's pages behind one address all poll


class _FullSlots:
    """Per-client slots of an address whose every slot is taken."""

    def client(self, request):
        return "10.0.0.1"

    def enter(self, who):
        return False

    def leave(self, who):
        raise AssertionError("nothing was entered")


def test_stop_by_run_token_stops_that_run_and_no_other(page, tiny, db, monkeypatch, frame_per_snapshot):
    """What the page's click listener sends on Stop: the run token from the status line's
    frame name. A stranger's token and an ended run's stop nothing."""
    import threading

    import playground.ui.run_handlers as rs

    monkeypatch.setattr(rs, "STREAM_RATE", 0)
    gen = page.on_run(Session("direct"), *run_args(page, [("greedy", {}), ("greedy", {})], max_new=200), "flow")
    frames: list = []
    for up in gen:
        frames.append(up)
        if _frame_of(up, page):
            page.sessions.frame_drawn(_frame_of(up, page))
            break
    token = _frame_of(frames[-1], page).rpartition(":")[0]
    consumer = threading.Thread(target=lambda: frames.extend(gen), daemon=True)
    consumer.start()
    page.sessions.stop_run("not-" + token)
    page.sessions.stop_run("")
    consumer.join(0.3)
    assert consumer.is_alive()  # nothing stopped it
    page.sessions.stop_run(token)
    consumer.join(120)
    assert not consumer.is_alive() and "Stopped" in html_of(frames[-1], page.status)
    page.sessions.stop_run(token)  # the run has ended: nothing happens


def test_the_stats_line_says_when_a_lossless_lane_left_greedys_path():
    from visualizers import stats_line

    base = {"output_ids": [1, 2], "steps": [], "stats": {"new_tokens": 2, "target_forwards": 2}}
    assert "lossless_mismatch" not in stats_line(base)
    assert "lossless_mismatch: 3" in stats_line({**base, "stats": {**base["stats"], "lossless_mismatch": 3}})
    assert "lossless_mismatch" not in stats_line({**base, "stats": {**base["stats"], "lossless_mismatch": 0}})


def test_events_that_change_nothing_reach_gradio_as_skips(demo):
    """A handler's ``{}`` ("nothing to change") on an event with several outputs is read by
    Gradio as one output value and the event fails ("didn't return enough output values"):
    after a failed run, an empty page's scrub or token click. Every such event skips instead."""
    import asyncio

    page = demo.compare_page
    handlers = {"on_draw": ([], 0, Session("nothing")), "on_step": (0, []),
                "on_token": ([], "step", None), "on_metric": ("probability", [])}
    seen = set()
    for block_fn in demo.fns.values():
        name = getattr(getattr(block_fn.fn, "__wrapped__", None), "__name__", None)
        if name not in handlers or len(block_fn.outputs) < 2:
            continue
        args = handlers[name]
        if name == "on_step":
            args = (*args, Session("nothing"))
        if name == "on_token":
            args = (*args[:2], type("Evt", (), {"_data": {}})(), Session("nothing"))
        out = block_fn.fn(*args)
        asyncio.run(demo.postprocess_data(block_fn, out, None))  # raises on a bare {}
        seen.add(name)
        with pytest.raises(Exception, match="enough output values"):
            asyncio.run(demo.postprocess_data(block_fn, {}, None))  # what the bare handler gave
    assert seen == set(handlers)
    assert page.on_draw([], 0, Session("nothing")) == {}


def test_the_traces_state_has_no_change_listener(demo):
    """Gradio hashes a state with change listeners whole around every frame of every event
    that writes it; listeners that follow the shown run watch ``shown`` instead."""
    page = demo.compare_page
    targets = {t for f in demo.fns.values() for t in f.targets}
    assert (page.traces._id, "change") not in targets
    assert (page.shown._id, "change") in targets


def test_share_while_running_is_refused_in_one_line(page, tiny, db, monkeypatch):
    import playground.ui.run_handlers as rs

    monkeypatch.setattr(page.sessions, "running_runner", lambda key: object())
    warned = []
    monkeypatch.setattr(rs.gr, "Warning", lambda m: warned.append(m))
    assert page.on_share("some-session", Session("share")) == ""
    assert len(warned) == 1 and "still running" in warned[0] and "\n" not in warned[0]



def test_a_page_that_reads_the_live_feed_gets_every_token_once_and_frames_without_lane_text(page, tiny, db):
    """The page's script names the run ("flow:<token>") and long-polls its feed: the text it
    rebuilds from the answers (appends onto the first whole output) is the lane's final text,
    and while it follows the feed the Run frames leave the lanes' outputs alone."""
    import threading


    token = "f" * 32
    shown: dict[int, str] = {}
    answers: list[dict] = []
    stop = threading.Event()

    def poller() -> None:
        seq = 0
        while not stop.is_set():
            ans = page.sessions.poll_feed(f"{token}:{seq}")
            if ans.get("unknown"):
                continue  # the run has not registered yet (or has ended)
            answers.append(ans)
            for x in ans["lanes"]:
                shown[x["lane"]] = (shown.get(x["lane"], "") if x["op"] == "append" else "") + x["html"]
            seq = ans["seq"]
            if ans["done"]:
                return

    reader = threading.Thread(target=poller, daemon=True)
    reader.start()
    try:
        frames = list(page.on_run(Session("feed"), *run_args(page, [("greedy", {}), ("sample", {"temperature": 0.8})],
                                                             max_new=40), f"flow:{token}"))
    finally:
        reader.join(10)
        stop.set()
    assert "Done" in html_of(frames[-1], page.status)
    final = frames[-1][page.traces]
    assert all(len(t["output_ids"]) == 40 for t in final)
    ops = [x["op"] for a in answers for x in a["lanes"]]
    assert "append" in ops  # the lanes grew by appends, not resent whole
    for j, tr in enumerate(final):
        assert shown[j] == page.live_lane(j, tr, "auto")[0]  # every token, once, in order
    # the start frame leaves the lanes to the feed's first answer, and no frame after it carries
    # lane output until the last (the feed is the one path lane text takes while streaming)
    assert not any(ui.output in frames[0] or ui.stats in frames[0] for ui in page.lanes)
    assert not [f for f in frames[1:-1] if any(ui.output in f or ui.stats in f for ui in page.lanes)]
    assert any(ui.output in frames[-1] for ui in page.lanes)  # the final frame has everything
    # ...and names the run ended, so a feed answer still on its way is not applied over it
    assert f'data-run-end="{token}"' in raw_of(frames[-1], page.status)
    from playground.ui.run_handlers import FLOW_JS

    assert "data-run-end" in FLOW_JS
