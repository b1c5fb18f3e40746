"""The Compare page's model options, driven through its handlers (no browser): the chat
template toggle with a system prompt in every lane, the remote-code opt-in present only where
the host allows it, and both travelling with the run into each lane's request, the saved
session and presets."""

from __future__ import annotations

import copy
import html
import json

import pytest

from playground.core.errors import PlaygroundError
from playground.ui import model_options as mo
from playground.ui import rules as st

pytestmark = pytest.mark.slow  # building the Gradio app imports gradio (~10 s on a busy CPU)

TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


# demo, db: conftest.py
@pytest.fixture(scope="module")
def page(demo):
    """The Compare page object of the app (its handlers are called directly)."""
    return demo.compare_page


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer):
    t = copy.deepcopy(tokenizer)
    t.chat_template = TEMPLATE
    return t


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, chat_tokenizer):
    """A tiny random Llama whose tokenizer has a chat template, as a local model directory."""
    from conftest import build_llama

    d = tmp_path_factory.mktemp("chat-llama")
    build_llama(chat_tokenizer).save_pretrained(d)
    chat_tokenizer.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def remote_dir(tmp_path_factory):
    """A local model directory whose config asks for the repository's own code (an auto_map
    for a model type transformers does not know); nothing is downloaded or run."""
    d = tmp_path_factory.mktemp("remote-code-model")
    (d / "config.json").write_text(json.dumps({
        "model_type": "tiny-remote", "architectures": ["TinyRemoteForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_tiny.TinyRemoteConfig",
                     "AutoModelForCausalLM": "modeling_tiny.TinyRemoteForCausalLM"}}))
    return str(d)


def run_args(page, model, lanes=("greedy", "greedy"), prompt="hello there", max_new=3, options=()):
    """The Run button's inputs: page settings, 4 per lane, then the model options."""
    args = [model, "", prompt, 0, max_new, "forwards", "auto", len(lanes), None]
    for j in range(page.max_lanes):
        args += [lanes[j] if j < len(lanes) else "greedy", {}, None, st.SAME_MODEL]
    return args + list(options)


def text(up, comp) -> str:
    v = up.get(comp)
    v = v if isinstance(v, str) else (v.get("value") if isinstance(v, dict) else str(v))
    return html.unescape(str(v))


def prop(up, comp, name):
    v = up.get(comp)
    return v.get(name) if isinstance(v, dict) else None


def test_chat_puts_the_template_and_system_prompt_in_every_lanes_prompt(page, db, chat_dir, chat_tokenizer):
    opts = [True, "Be brief."] + ([False] if page.trust_remote_code is not None else [])
    final = list(page.on_run(None, *run_args(page, chat_dir, lanes=("greedy", "top_k"), options=opts)))[-1]
    traces = final[page.traces]
    assert len(traces) == 2
    for t in traces:
        assert not (t.get("stats") or {}).get("error"), t.get("stats")
        assert chat_tokenizer.decode(t["prompt_ids"]) == "SYSTEM: Be brief.\nUSER: hello there\nASSISTANT:"
        assert t["chat"] is True and t["system_prompt"] == "Be brief."
    # the saved session says chat was used, with which system prompt, and shows it again
    from playground.store import default_store

    session = default_store().load_session(final[page.sid])
    assert session["settings"]["chat"] is True and session["settings"]["system_prompt"] == "Be brief."
    assert "trust_remote_code" not in session["settings"]  # a shared link never opts its viewer in
    up = page.open_session(final[page.sid])
    assert up[page.chat] is True
    assert prop(up, page.system_prompt, "value") == "Be brief." and prop(up, page.system_prompt, "visible") is True
    assert "Chat template on" in text(up, page.preset_info) and "Be brief." in text(up, page.preset_info)
    # a share link's page load (the Sessions view's replay) shows them the same way
    from playground.ui.sessions_view import replay_frame

    up = replay_frame(page, final[page.sid], None)
    assert up[page.chat] is True and prop(up, page.system_prompt, "value") == "Be brief."


def test_without_chat_the_prompt_is_plain_and_a_hidden_system_prompt_is_not_sent(page, chat_dir, chat_tokenizer):
    opts = [False, "left in the box"] + ([False] if page.trust_remote_code is not None else [])
    final = list(page.on_run(None, *run_args(page, chat_dir, options=opts)))[-1]
    for t in final[page.traces]:
        assert chat_tokenizer.decode(t["prompt_ids"]) == "hello there"
        assert "chat" not in t and "system_prompt" not in t


def test_a_model_without_a_chat_template_says_so_in_one_line(page):
    """The bundled models have no chat template: with chat on, each lane says so."""
    opts = [True, ""] + ([False] if page.trust_remote_code is not None else [])
    frames = list(page.on_run(None, *run_args(page, st.DEFAULT_MODEL, options=opts)))
    status = text(frames[-1], page.status)
    assert "has no chat template" in status and "\n" not in status.strip()
    for ui in page.lanes[:2]:
        assert "has no chat template" in text(frames[-1], ui.output)


def test_the_chat_box_says_whether_the_loaded_model_has_a_template(page, chat_dir):
    up = page.on_model(chat_dir, "", "hi", 8)
    assert "has a chat template" in prop(up, page.chat, "info")
    up = page.on_model(st.DEFAULT_MODEL, "", "hi", 8)
    assert "has none" in prop(up, page.chat, "info")


def test_the_system_prompt_box_follows_the_chat_checkbox(demo, page):
    fns = [fn for fn in demo.fns.values() if (page.chat._id, "change") in [tuple(t) for t in fn.targets]]
    assert fns and any(page.system_prompt._id in {b._id for b in fn.outputs} for fn in fns)
    assert page.system_prompt.visible is False and page.chat.elem_id == "chat"
    assert page.system_prompt.elem_id == "system-prompt"


def test_the_options_reach_each_lanes_request():
    lanes = st.with_options([st.LaneConfig("greedy"), st.LaneConfig("top_k", {"k": 5})], **mo.page_options(
        True, "Answer in verse.", False))
    for cfg in lanes:
        req = st.lane_request(cfg, "tiny-shakespeare", "hi", 0, 4)
        assert req["chat"] is True and req["system_prompt"] == "Answer in verse." and req["trust_remote_code"] is False
    assert mo.page_options(False, "ignored while chat is off") == {"chat": False, "system_prompt": None,
                                                                   "trust_remote_code": False}
    assert mo.page_options(True, "   ")["system_prompt"] is None


def test_a_preset_may_set_chat_and_a_system_prompt(page, tmp_path, monkeypatch):
    import playground.presets

    (tmp_path / "chatty.json").write_text(json.dumps({
        "title": "Chatty", "model": "tiny-shakespeare", "prompt": "Who art thou?", "chat": True,
        "system_prompt": "Speak as Hamlet.", "lanes": [{"decoder": "greedy"}, {"decoder": "top_k"}]}))
    (tmp_path / "plain.json").write_text(json.dumps({
        "title": "Plain", "model": "tiny-shakespeare", "prompt": "Who art thou?",
        "lanes": [{"decoder": "greedy"}, {"decoder": "top_k"}]}))
    monkeypatch.setattr(playground.presets, "PRESET_DIR", tmp_path)
    p = st.preset_page("chatty")
    assert p["chat"] is True and all(c.chat and c.system_prompt == "Speak as Hamlet." for c in p["lanes"])
    up = page.on_preset("chatty")
    assert up[page.chat] is True and prop(up, page.system_prompt, "value") == "Speak as Hamlet."
    up = page.on_preset("plain")
    assert up[page.chat] is False and prop(up, page.system_prompt, "visible") is False
    assert page.trust_remote_code not in up  # a preset never opts in to remote code


def test_a_remote_code_model_without_the_opt_in_is_one_line_saying_to_tick_it(page, remote_dir):
    assert page.trust_remote_code is not None and page.trust_remote_code.elem_id == "trust-remote-code"
    assert mo.needs_remote_code(remote_dir) is True and mo.needs_remote_code(st.DEFAULT_MODEL) is False
    up = page.on_model(remote_dir, "", "hi", 8, False)
    status = text(up, page.model_status)
    assert "tick “Allow remote code”" in status and "\n" not in status.strip()
    frames = list(page.on_run(None, *run_args(page, remote_dir, options=[False, "", False])))
    assert "tick “Allow remote code”" in text(frames[-1], page.status)
    for ui in page.lanes[:2]:
        assert "tick “Allow remote code”" in text(frames[-1], ui.output)
    with pytest.raises(PlaygroundError, match="Allow remote code"):
        st.lane_request(st.LaneConfig("greedy"), remote_dir, "hi", 0, 4)


def test_ticking_the_opt_in_passes_it_to_the_loader(page, remote_dir, llama_handle, monkeypatch):
    import playground.engine
    import playground.ui.lane_config

    seen: list[tuple[str, bool]] = []

    def fake_load(spec, trust_remote_code=False, **kw):
        seen.append((spec, trust_remote_code))
        return llama_handle

    monkeypatch.setattr(playground.ui.lane_config, "_load", fake_load)
    monkeypatch.setattr(playground.engine, "load_model", fake_load)
    up = page.on_model(remote_dir, "", "hi", 8, True)
    assert "✓" in text(up, page.model_status) and seen[-1] == (remote_dir, True)
    final = list(page.on_run(None, *run_args(page, remote_dir, options=[False, "", True])))[-1]
    assert all(t.get("steps") for t in final[page.traces])
    assert seen[-2:] == [(remote_dir, True), (remote_dir, True)]


def test_the_opt_in_is_absent_where_the_host_forbids_remote_code(monkeypatch, llama_handle):
    from playground.hosting import remote_code_allowed

    monkeypatch.setenv("PLAYGROUND_ALLOW_REMOTE_CODE", "0")
    assert remote_code_allowed() is False
    from playground.ui import build_app

    app = build_app()
    page = app.compare_page
    assert page.trust_remote_code is None
    assert not [b for b in app.blocks.values() if getattr(b, "elem_id", None) == "trust-remote-code"]
    assert [getattr(b, "elem_id", None) for b in mo.option_inputs(page)] == ["chat", "system-prompt"]
    # a request that claims the opt-in anyway is not trusted
    assert mo.page_options(False, "", True)["trust_remote_code"] is False


def test_a_host_with_only_bundled_models_offers_no_opt_in(monkeypatch):
    from playground.hosting import remote_code_allowed

    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "bundled")
    assert remote_code_allowed() is False


def test_the_run_reads_the_options_right_after_the_lanes(demo, page):
    """Their place in the Run's inputs is what split_options reads; anything after them (the
    page's flow flag, set by the browser) never lands in the remote-code opt-in."""
    fn = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "on_run")
    start = 9 + 4 * page.max_lanes
    opts = mo.option_inputs(page)
    assert [b._id for b in fn.inputs[start:start + len(opts)]] == [b._id for b in opts]
    assert mo.split_options(page, (True, "Be brief.", False, "flow")) == ((True, "Be brief.", False), ("flow",))
    assert mo.split_options(page, ("flow",)) == ((), ("flow",))  # a caller without options: defaults
    assert mo.page_options(True, "", "flow")["trust_remote_code"] is False
