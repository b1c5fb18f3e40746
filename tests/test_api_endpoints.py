"""The app's public API, called as a user of a Space would: ``gradio_client`` against the app
started here (127.0.0.1, a free port, a temporary session database), on the bundled models;
and, without a server, how :mod:`playground.api` reads a comparison request.

Each endpoint is checked against the front door it mirrors: ``/generate`` against
``playground.generate``, ``/compare`` against ``playground compare --json``, ``/session``
against ``playground sessions export``, ``/decoders`` against ``list-decoders --json``.
"""

from __future__ import annotations

import json
import socket

import pytest

slow = pytest.mark.slow  # the tests that build and serve the whole Gradio app

PUBLIC = {"/generate", "/compare", "/compare_stream", "/session", "/decoders"}
PRESET = "lossless-check"  # greedy and its lossless speculative twins: four causal lanes
TOKENS = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """The app as ``python app.py`` serves it, and a ``gradio_client.Client`` on it."""
    from gradio_client import Client

    db = tmp_path_factory.mktemp("api") / "sessions.db"
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"PLAYGROUND_DB": str(db), "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
                     "GRADIO_ANALYTICS_ENABLED": "False"}.items():
            mp.setenv(k, v)
        for k in ("SPACE_ID", "PORT", "PLAYGROUND_MAX_NEW_TOKENS", "PLAYGROUND_MAX_LANES", "PLAYGROUND_NO_MODELS",
                  "PLAYGROUND_MODEL_SOURCES"):
            mp.delenv(k, raising=False)
        from playground.ui import build_app, launch

        demo = build_app()
        launch(demo, prevent_thread_lock=True, quiet=True)
        try:
            client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            yield {"demo": demo, "client": client, "db": str(db), "url": f"http://127.0.0.1:{port}"}
        finally:
            demo.close()


@pytest.fixture(scope="module")
def client(served):
    return served["client"]


@pytest.fixture(scope="module")
def compared(client):
    """One /compare of the preset (shared by the tests that compare against it)."""
    return client.predict(preset=PRESET, max_new_tokens=TOKENS, api_name="/compare")


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str):
    from playground.cli import main

    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def app_error(client, **kwargs) -> str:
    """The error message a client gets for this call (it must fail)."""
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as e:
        client.predict(**kwargs)
    return str(e.value)


def ids_by_lane(traces: list[dict]) -> list[tuple[str, list[int]]]:
    return [(t["decoder"], t["output_ids"]) for t in traces]


# ---------------------------------------------------------------------- the API page
@slow
def test_view_api_lists_exactly_the_public_endpoints(client):
    info = client.view_api(return_format="dict", print_info=False)
    assert set(info["named_endpoints"]) == PUBLIC
    assert not info["unnamed_endpoints"]
    params = {name: [p["parameter_name"] for p in ep["parameters"]] for name, ep in info["named_endpoints"].items()}
    assert params["/generate"] == ["model", "decoder", "prompt", "max_new_tokens", "seed", "draft", "knobs"]
    assert params["/compare"] == ["preset", "lanes", "prompt", "model", "seed", "max_new_tokens", "policy"]
    assert params["/compare_stream"] == params["/compare"]
    assert params["/session"] == ["session_id"]
    assert params["/decoders"] == ["family"]


@slow
def test_model_endpoints_share_the_pages_model_concurrency_group(served):
    from playground.hosting import MODEL_CONCURRENCY_ID
    from playground.core.settings import limits

    fns = {f.api_name: f for f in served["demo"].fns.values() if f.api_visibility == "public"}
    for name in ("generate", "compare", "compare_stream"):
        assert fns[name].concurrency_id == MODEL_CONCURRENCY_ID
        assert fns[name].concurrency_limit == limits().model_concurrency
    ui_model_events = [f for f in served["demo"].fns.values()
                       if f.api_visibility == "private" and f.concurrency_id == MODEL_CONCURRENCY_ID]
    assert ui_model_events, "the page's Run shares the same group"


# ---------------------------------------------------------------------- results
@slow
def test_generate_equals_the_python_api(client):
    import playground

    for decoder, draft, knobs in (("top_p", None, {"p": 0.9, "temperature": 1.3}),
                                  ("speculative", "tiny-shakespeare-draft", {})):
        got = client.predict(model="tiny-shakespeare", decoder=decoder, prompt="ROMEO:", max_new_tokens=TOKENS,
                             seed=7, draft=draft, knobs=knobs, api_name="/generate")
        want = playground.generate(model="tiny-shakespeare", decoder=decoder, prompt="ROMEO:",
                                   max_new_tokens=TOKENS, seed=7, draft=draft, **knobs)
        assert got["output_ids"] == want["output_ids"] and len(got["output_ids"]) > 0
        assert got["text"] == want["text"]
        assert got["params"] == want["params"]
        assert got["stats"]["target_forwards"] == want["stats"]["target_forwards"]
        assert got["steps"] and got["schema"] == want["schema"]


@slow
def test_knobs_may_come_as_json_text(client):
    a = client.predict(decoder="top_k", prompt="ROMEO:", max_new_tokens=6, seed=1, knobs='{"k": 3}',
                       api_name="/generate")
    b = client.predict(decoder="top_k", prompt="ROMEO:", max_new_tokens=6, seed=1, knobs={"k": 3},
                       api_name="/generate")
    assert a["params"]["k"] == 3 and a["output_ids"] == b["output_ids"]


@slow
def test_compare_with_a_preset_equals_the_cli(compared, served, capsys):
    want = cli_json(capsys, "compare", "--preset", PRESET, "--max-new-tokens", str(TOKENS), "--json")
    assert ids_by_lane(compared["traces"]) == ids_by_lane(want)
    assert [t["decoder"] for t in want] == ["greedy", "speculative", "spec_tree", "jacobi"]
    assert all(len(t["output_ids"]) == TOKENS for t in want)
    sid = compared["session_id"]
    assert sid and compared["share_link"] == f"{served['url']}/?session={sid}"


@slow
def test_compare_with_own_lanes(client):
    lanes = [{"decoder": "greedy"}, {"decoder": "top_k", "knobs": {"k": 5}},
             {"decoder": "prompt_lookup", "knobs": {}}]
    got = client.predict(lanes=lanes, prompt="JULIET:", max_new_tokens=6, seed=2, policy="steps",
                         api_name="/compare")
    assert [t["decoder"] for t in got["traces"]] == ["greedy", "top_k", "prompt_lookup"]
    assert got["traces"][1]["params"]["k"] == 5
    assert all(t["prompt"] == "JULIET:" and t["seed"] == 2 for t in got["traces"])
    import playground

    alone = playground.generate(model="tiny-shakespeare", decoder="top_k", prompt="JULIET:", max_new_tokens=6,
                                seed=2, k=5)
    assert got["traces"][1]["output_ids"] == alone["output_ids"]


@slow
def test_session_returns_what_sessions_export_writes(client, compared, served, capsys):
    sid = compared["session_id"]
    got = client.predict(session_id=sid, api_name="/session")
    want = cli_json(capsys, "sessions", "--db", served["db"], "export", sid)
    assert got == want
    assert got["format"] == "decoder-playground-session"
    assert ids_by_lane(got["runs"]) == ids_by_lane(compared["traces"])
    assert got["settings"]["preset"] == PRESET


@slow
def test_decoders_equals_list_decoders_json(client, capsys):
    assert client.predict(api_name="/decoders") == cli_json(capsys, "list-decoders", "--json")
    spec = client.predict(family="speculative", api_name="/decoders")
    assert spec and {d["family"] for d in spec} == {"speculative"}


@slow
def test_compare_stream_yields_snapshots_ending_with_the_compare_result(client, compared):
    job = client.submit(preset=PRESET, max_new_tokens=TOKENS, api_name="/compare_stream")
    job.result()
    frames = job.outputs()
    assert len(frames) > 1
    assert not frames[0]["done"] and frames[0]["session_id"] is None
    last = frames[-1]
    assert last["done"] and last["session_id"] and last["session_id"] != compared["session_id"]
    assert ids_by_lane(last["traces"]) == ids_by_lane(compared["traces"])
    for frame in frames[:-1]:  # every lane only ever grows towards its final output
        for lane, final in zip(frame["traces"], last["traces"]):
            assert final["output_ids"][: len(lane["output_ids"])] == lane["output_ids"]


# ---------------------------------------------------------------------- errors and limits
@slow
def test_bad_knob_and_unknown_decoder_are_one_clear_line(client):
    import playground
    from playground.core.errors import PlaygroundError

    for decoder, knobs in (("top_p", {"p": 5.0}), ("top_p", {"q": 1}), ("no_such_decoder", {})):
        with pytest.raises(PlaygroundError) as want:
            playground.generate(model="tiny-shakespeare", decoder=decoder, prompt="ROMEO:", max_new_tokens=4, **knobs)
        msg = app_error(client, decoder=decoder, prompt="ROMEO:", max_new_tokens=4, knobs=knobs,
                        api_name="/generate")
        assert msg == str(want.value) and "\n" not in msg
    assert "no_such_decoder" in msg
    msg = app_error(client, lanes=[{"decoder": "greedy"}, {"decoder": "no_such_decoder"}], prompt="ROMEO:",
                    api_name="/compare")
    assert msg.startswith("lane 2 (no_such_decoder): ") and "\n" not in msg
    assert "lane 1 has unknown field(s) 'temp'" in app_error(
        client, lanes=[{"decoder": "greedy", "temp": 1}], prompt="ROMEO:", api_name="/compare")
    assert "unknown preset 'nope'" in app_error(client, preset="nope", api_name="/compare")
    assert app_error(client, lanes="[{", prompt="x", api_name="/compare").startswith("lanes is not valid JSON")
    assert app_error(client, session_id="not-an-id", api_name="/session") == "malformed session id"


@slow
def test_hosting_limits_apply(client, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MAX_NEW_TOKENS", "8")
    monkeypatch.setenv("PLAYGROUND_MAX_LANES", "3")
    monkeypatch.setenv("PLAYGROUND_MAX_PROMPT_CHARS", "20")
    assert app_error(client, prompt="ROMEO:", max_new_tokens=9, api_name="/generate") == \
        "max_new_tokens=9 is over this instance's limit of 8"
    assert app_error(client, preset=PRESET, max_new_tokens=4, api_name="/compare") == \
        "4 lanes is over this instance's limit of 3"
    assert "the limit here is 20" in app_error(client, prompt="x" * 21, max_new_tokens=4, api_name="/generate")
    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "bundled")
    from playground.core.models import BUNDLED_DIR

    as_path = str((BUNDLED_DIR / "tiny-shakespeare").resolve())  # the bundled model, named by its path
    assert app_error(client, model=as_path, prompt="ROMEO:", max_new_tokens=4, api_name="/generate") == \
        "loading path models is disabled on this instance (allowed: bundled)"


@slow
def test_replay_only_instance_refuses_models_but_serves_sessions(client, compared, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    assert "model loading is disabled on this instance" in app_error(
        client, prompt="ROMEO:", max_new_tokens=4, api_name="/generate")
    assert "model loading is disabled on this instance" in app_error(
        client, preset=PRESET, max_new_tokens=4, api_name="/compare")
    got = client.predict(session_id=compared["session_id"], api_name="/session")
    assert ids_by_lane(got["runs"]) == ids_by_lane(compared["traces"])


# ---------------------------------------------------------------------- reading a request (no server)
def test_plan_from_a_preset_takes_its_settings_and_the_overrides():
    from playground.api import plan_compare
    from playground.presets import load_preset

    p = load_preset(PRESET)
    plan = plan_compare(PRESET)
    assert (plan.model, plan.prompt, plan.seed, plan.max_new_tokens, plan.policy) == \
        (p["model"], p["prompt"], p["seed"], p["max_new_tokens"], p.get("policy", "forwards"))
    assert [r["decoder"] for r in plan.requests()] == [lane["decoder"] for lane in p["lanes"]]
    assert plan.preset == PRESET and plan.title == p["title"]
    plan = plan_compare(PRESET, model="m", prompt="P", seed="3", max_new_tokens=12.0, policy="free")
    assert {(r["model"], r["prompt"], r["seed"], r["max_new_tokens"]) for r in plan.requests()} == {("m", "P", 3, 12)}
    assert plan.policy == "free"


def test_plan_reads_lanes_as_objects_json_text_or_names():
    from playground.api import plan_compare

    lanes = [{"decoder": "top_k", "knobs": {"k": 5}}, {"decoder": "speculative", "draft": "d", "model": "x"}]
    a = plan_compare(lanes=lanes, prompt="hi")
    assert a.requests() == plan_compare(lanes=json.dumps(lanes), prompt="hi").requests()
    assert a.requests()[0]["params"] == {"k": 5} and a.requests()[1]["model"] == "x"
    assert a.requests()[1]["draft"] == "d" and a.requests()[0]["model"] == "tiny-shakespeare"
    assert [r["decoder"] for r in plan_compare(lanes=["greedy", "beam"], prompt="hi").requests()] == ["greedy", "beam"]
    b = plan_compare(PRESET, lanes=["greedy"])  # lanes replace the preset's; the rest stays
    assert [r["decoder"] for r in b.requests()] == ["greedy"] and b.prompt == plan_compare(PRESET).prompt


@pytest.mark.parametrize("kwargs, message", [
    ({}, "a comparison needs a preset or lanes"),
    ({"lanes": [{"decoder": "greedy", "temp": 1}]}, "lane 1 has unknown field(s) 'temp'; use decoder, knobs, draft, model"),
    ({"lanes": [{"decoder": "greedy", "knobs": {}, "params": {}}]}, "lane 1 gives both knobs and params; use knobs"),
    ({"lanes": [{"knobs": {}}]}, "lane 1 needs a decoder name"),
    ({"lanes": [{"decoder": "top_k", "knobs": [1]}]}, "lane 1 knobs must be a JSON object of knob values, got list"),
    ({"lanes": "[1,"}, "lanes is not valid JSON"),
    ({"lanes": ["greedy"], "policy": "fastest"}, "unknown lockstep policy 'fastest'"),
    ({"lanes": ["greedy"], "max_new_tokens": 2.5}, "max_new_tokens must be a whole number, got 2.5"),
    ({"lanes": ["greedy"], "seed": True}, "seed must be a whole number, got true/false"),
])
def test_plan_refuses_a_bad_request_with_one_line(kwargs, message):
    from playground.api import plan_compare
    from playground.core.errors import PlaygroundError

    with pytest.raises(PlaygroundError) as e:
        plan_compare(**kwargs)
    assert str(e.value).startswith(message)


def test_plan_applies_the_lane_limit(monkeypatch):
    from playground.api import plan_compare
    from playground.core.errors import PlaygroundError

    monkeypatch.setenv("PLAYGROUND_MAX_LANES", "2")
    assert len(plan_compare(lanes=["greedy", "greedy"]).lanes) == 2
    with pytest.raises(PlaygroundError, match="3 lanes is over this instance's limit of 2"):
        plan_compare(lanes=["greedy"] * 3)
