"""Hosting: limits from the environment refuse requests over them; the ZeroGPU decorator;
queue settings; the Space's README front-matter and requirements.txt."""

from __future__ import annotations

import re
import sys
import tomllib
import types
from pathlib import Path

import pytest

from playground import hosting
from playground.core.errors import PlaygroundError
from playground.core.settings import ALL_SOURCES, check_lanes, limits

ROOT = Path(__file__).resolve().parents[1]
HOSTING_VARS = ("PLAYGROUND_MAX_NEW_TOKENS", "PLAYGROUND_MAX_LANES", "PLAYGROUND_MAX_PROMPT_CHARS",
                "PLAYGROUND_MODEL_SOURCES", "PLAYGROUND_ALLOW_REMOTE_CODE", "PLAYGROUND_NO_MODELS",
                "PLAYGROUND_MAX_IMPORT_BYTES", "PLAYGROUND_CONCURRENCY", "PLAYGROUND_MODEL_CONCURRENCY",
                "PLAYGROUND_QUEUE_SIZE", "PLAYGROUND_GPU_DURATION", "PLAYGROUND_LIST_SESSIONS",
                "PLAYGROUND_HUB_TIMEOUT", "PLAYGROUND_MODEL_CACHE", "SPACE_ID")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in HOSTING_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny Llama saved as a local model directory (a 'path' source)."""
    from conftest import build_llama

    d = tmp_path_factory.mktemp("local-model")
    build_llama(tokenizer).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


# ---------------------------------------------------------------------- request limits
def test_max_new_tokens(monkeypatch, llama_handle) -> None:
    from playground.engine import prepare

    monkeypatch.setenv("PLAYGROUND_MAX_NEW_TOKENS", "8")
    with pytest.raises(PlaygroundError, match="^max_new_tokens=9 is over this instance's limit of 8$"):
        prepare(llama_handle, "greedy", "ROMEO:", max_new_tokens=9)
    assert len(prepare(llama_handle, "greedy", "ROMEO:", max_new_tokens=8).finish().output_ids) == 8


def test_max_prompt_chars(monkeypatch, llama_handle) -> None:
    from playground.engine import prepare

    monkeypatch.setenv("PLAYGROUND_MAX_PROMPT_CHARS", "12")
    with pytest.raises(PlaygroundError, match="^the prompt has 13 characters; the limit here is 12$"):
        prepare(llama_handle, "greedy", "ROMEO: Juliet", max_new_tokens=2)
    prepare(llama_handle, "greedy", "ROMEO: Julie", max_new_tokens=2)


def test_max_lanes(monkeypatch) -> None:
    monkeypatch.setenv("PLAYGROUND_MAX_LANES", "3")
    check_lanes(3)
    with pytest.raises(PlaygroundError, match="^4 lanes is over this instance's limit of 3$"):
        check_lanes(4)
    with pytest.raises(PlaygroundError, match="at least one lane"):
        check_lanes(0)


def test_model_sources(monkeypatch, model_dir: Path) -> None:
    from playground.core.models import load_model

    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "bundled,cache")
    with pytest.raises(PlaygroundError, match=r"^loading path models is disabled on this instance \(allowed: bundled, cache\)$"):
        load_model(str(model_dir))
    # A hub id is refused before anything is fetched.
    with pytest.raises(PlaygroundError, match="loading hub models is disabled"):
        load_model("some-org/some-model-that-is-not-cached")
    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "none")
    with pytest.raises(PlaygroundError, match=r"allowed: none"):
        load_model(str(model_dir))
    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "path")
    assert load_model(str(model_dir)).kind == "causal"


def test_remote_code(monkeypatch, model_dir: Path) -> None:
    from playground.core.models import load_model

    monkeypatch.setenv("PLAYGROUND_ALLOW_REMOTE_CODE", "0")
    with pytest.raises(PlaygroundError, match="^remote code is disabled on this instance$"):
        load_model(str(model_dir), trust_remote_code=True)


def test_remote_code_opt_in_is_offered_only_where_the_host_allows_it(monkeypatch) -> None:
    from playground import api

    assert hosting.remote_code_allowed() and api.remote_code_allowed()  # a local install
    monkeypatch.setenv("SPACE_ID", "someone/decoder-playground")
    assert not hosting.remote_code_allowed() and not api.remote_code_allowed()
    monkeypatch.setenv("PLAYGROUND_ALLOW_REMOTE_CODE", "1")  # the Space's owner opts in...
    assert not hosting.remote_code_allowed()  # ...but bundled models have no code of their own
    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "bundled,hub")
    assert hosting.remote_code_allowed()
    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")  # a replay-only instance loads nothing
    assert not hosting.remote_code_allowed()
    monkeypatch.delenv("PLAYGROUND_NO_MODELS")
    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "none")
    assert not hosting.remote_code_allowed()


def test_no_models(monkeypatch, model_dir: Path) -> None:
    from playground.engine import prepare
    from playground.core.models import load_model

    monkeypatch.setenv("PLAYGROUND_NO_MODELS", "1")
    with pytest.raises(PlaygroundError, match=r"^model loading is disabled on this instance \(replay only\)$"):
        load_model(str(model_dir))
    with pytest.raises(PlaygroundError, match="model loading is disabled"):
        prepare(str(model_dir), "greedy", "ROMEO:", max_new_tokens=2)


def test_space_defaults_are_safe(monkeypatch, model_dir: Path) -> None:
    from playground.core.models import load_model

    assert limits().model_sources == ALL_SOURCES and limits().allow_remote_code and limits().list_sessions
    monkeypatch.setenv("SPACE_ID", "someone/decoder-playground")
    lim = limits()
    assert lim.model_sources == ("bundled",) and not lim.allow_remote_code and not lim.list_sessions
    assert lim.max_new_tokens == 256 and lim.max_lanes == 4 and lim.queue_size == 32
    with pytest.raises(PlaygroundError, match="loading path models is disabled"):
        load_model(str(model_dir))
    monkeypatch.setenv("PLAYGROUND_MODEL_SOURCES", "bundled,path")  # the owner may open it up
    monkeypatch.setenv("PLAYGROUND_MAX_NEW_TOKENS", "64")
    assert limits().model_sources == ("bundled", "path") and limits().max_new_tokens == 64


@pytest.mark.parametrize("name, value, message", [
    ("PLAYGROUND_MAX_NEW_TOKENS", "256k", "PLAYGROUND_MAX_NEW_TOKENS='256k' is not a whole number"),
    ("PLAYGROUND_MAX_LANES", "0", "PLAYGROUND_MAX_LANES=0 must be at least 1"),
    ("PLAYGROUND_MODEL_SOURCES", "bundeld", "unknown source(s) bundeld"),
    ("PLAYGROUND_ALLOW_REMOTE_CODE", "maybe", "is not a flag"),
    ("PLAYGROUND_HUB_TIMEOUT", "soon", "PLAYGROUND_HUB_TIMEOUT='soon' is not a number of seconds"),
    ("PLAYGROUND_HUB_TIMEOUT", "0", "PLAYGROUND_HUB_TIMEOUT=0 must be a positive number of seconds"),
    ("PLAYGROUND_MODEL_CACHE", "0", "PLAYGROUND_MODEL_CACHE=0 must be at least 1"),
])
def test_misconfiguration_is_an_error_not_a_generous_default(monkeypatch, name, value, message) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(PlaygroundError) as e:
        limits()
    assert message in str(e.value)


# ---------------------------------------------------------------------- ZeroGPU decorator
def _fake_spaces(calls: list) -> types.ModuleType:
    mod = types.ModuleType("spaces")

    def GPU(fn=None, *, duration=None):  # noqa: N802 - the real name
        def wrap(f):
            def wrapped(*a, **kw):
                calls.append(("call", f.__name__, duration))
                return f(*a, **kw)
            wrapped.zero_gpu_duration = duration
            return wrapped
        return wrap(fn) if fn is not None else wrap

    mod.GPU = GPU
    return mod


def model_work(x: int) -> int:
    return x * 2


def test_gpu_is_a_no_op_without_spaces(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces -> ImportError
    assert not hosting.zero_gpu_available()
    assert hosting.gpu(model_work) is model_work
    assert hosting.gpu(duration=30)(model_work) is model_work


def test_gpu_wraps_with_spaces(monkeypatch) -> None:
    calls: list = []
    monkeypatch.setitem(sys.modules, "spaces", _fake_spaces(calls))
    assert hosting.zero_gpu_available()
    wrapped = hosting.gpu(model_work)
    assert wrapped is not model_work and wrapped(21) == 42
    assert calls == [("call", "model_work", None)]  # spaces' own default duration
    assert hosting.gpu(duration=120)(model_work).zero_gpu_duration == 120
    monkeypatch.setenv("PLAYGROUND_GPU_DURATION", "90")
    assert hosting.gpu(model_work).zero_gpu_duration == 90

    def stream(n: int):
        yield from range(n)

    assert list(hosting.gpu(stream)(3)) == [0, 1, 2]  # generators pass through


# ---------------------------------------------------------------------- queue & launch
def test_queue_and_event_settings(monkeypatch) -> None:
    assert hosting.queue_settings() == {"default_concurrency_limit": 4, "max_size": None}
    monkeypatch.setenv("PLAYGROUND_CONCURRENCY", "3")
    monkeypatch.setenv("PLAYGROUND_QUEUE_SIZE", "10")
    monkeypatch.setenv("PLAYGROUND_MODEL_CONCURRENCY", "1")
    assert hosting.queue_settings() == {"default_concurrency_limit": 3, "max_size": 10}
    assert hosting.model_event_settings() == {"concurrency_limit": 1,
                                              "concurrency_id": hosting.MODEL_CONCURRENCY_ID}


def test_launch_settings(monkeypatch) -> None:
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    monkeypatch.delenv("PORT", raising=False)
    monkeypatch.setenv("PLAYGROUND_MAX_IMPORT_BYTES", "1234")
    assert hosting.launch_settings() == {"server_name": "127.0.0.1", "server_port": 7860, "max_file_size": 1234,
                                        "ssr_mode": False}
    monkeypatch.setenv("SPACE_ID", "a/b")
    monkeypatch.setenv("PORT", "8080")
    assert hosting.launch_settings()["server_name"] == "0.0.0.0"
    assert hosting.launch_settings()["server_port"] == 8080
    monkeypatch.setenv("PORT", "eighty")
    with pytest.raises(PlaygroundError, match="server port"):
        hosting.launch_settings()


@pytest.mark.slow  # importing gradio takes seconds
def test_settings_are_accepted_by_the_installed_gradio() -> None:
    import inspect

    import gradio as gr

    inspect.signature(gr.Blocks.queue).bind(None, **hosting.queue_settings())
    inspect.signature(gr.Blocks.launch).bind(None, **hosting.launch_settings())
    inspect.signature(gr.Button.click).bind(None, lambda: None, **hosting.model_event_settings())


# ---------------------------------------------------------------------- Space files
def _front_matter(text: str) -> dict:
    import yaml

    assert text.startswith("---\n"), "README.md must start with the Space's YAML front-matter"
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end])


def test_readme_front_matter_is_a_gradio_space() -> None:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    meta = _front_matter((ROOT / "README.md").read_text(encoding="utf-8"))
    for key in ("title", "emoji", "colorFrom", "colorTo", "sdk", "sdk_version", "app_file", "license",
                "short_description"):
        assert meta.get(key), key
    assert meta["sdk"] == "gradio" and (ROOT / meta["app_file"]).is_file()
    assert meta["colorFrom"] in {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
    assert meta["colorTo"] in {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
    assert len(meta["short_description"]) <= 60 and meta["pinned"] is False
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    gradio = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "gradio")
    assert str(meta["sdk_version"]) in gradio.specifier  # the Space runs the gradio we support
    requires = SpecifierSet(project["requires-python"])
    assert str(meta.get("python_version", "3.10")) + ".0" in requires
    # docs/hosting.md shows the same block.
    hosting_md = (ROOT / "docs" / "hosting.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(---\n.*?\n---)\n```", hosting_md, re.S)
    assert block and _front_matter(block.group(1) + "\n") == meta


def test_requirements_match_pyproject() -> None:
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = [ln.split("#", 1)[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    reqs = [Requirement(ln) for ln in lines if ln and not ln.startswith("-")]
    want = {Requirement(d).name.lower(): Requirement(d) for d in project}
    got = {r.name.lower(): r for r in reqs}
    assert set(got) == set(want) and len(reqs) == len(got)
    for name, w in want.items():
        g = got[name]
        # requirements.txt may tighten a range (torch gets an upper bound) but never loosen it.
        assert {str(s) for s in w.specifier} <= {str(s) for s in g.specifier}, name
        assert str(g.marker) == str(w.marker), name
    assert any(s.operator == "<" for s in got["torch"].specifier)  # a known-good major range
    assert "2.13.0" in got["torch"].specifier  # the version .ci/run installs
