"""Model loading under concurrency, failed loads, the meta-device check and unreachable hub ids.

These tests use real threads and real interpreters: the page loads models from several
threads at once (the model-status line and every lane of a Run), and a fresh ``python app.py``
has not imported transformers when the first loads arrive.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from playground.core import models
from playground.core.models import cache as model_cache
from playground.core.models import loading
from playground.core.errors import Cancelled, PlaygroundError

ROOT = Path(__file__).resolve().parent.parent
SIX = [name for name in models.BUNDLED for _ in range(2)]


@pytest.fixture
def empty_cache(monkeypatch):
    """A model cache of this test's own, so loads really load (restored afterwards)."""
    monkeypatch.setattr(model_cache, "_cache", OrderedDict())
    monkeypatch.setattr(model_cache, "_inflight", {})


def _load_together(specs: list[str]) -> list[object]:
    """Load ``specs`` from one thread each, all released at the same moment."""
    barrier = threading.Barrier(len(specs))
    out: list[object] = [None] * len(specs)

    def go(i: int, spec: str) -> None:
        barrier.wait()
        try:
            out[i] = models.load_model(spec)
        except BaseException as e:  # noqa: BLE001 - the test reports whatever a thread got
            out[i] = e

    threads = [threading.Thread(target=go, args=(i, s)) for i, s in enumerate(specs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return out


def _subprocess(script: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def test_six_threads_load_three_bundled_models_once_each(empty_cache):
    results = _load_together(SIX)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"loads failed: {[f'{type(e).__name__}: {e}' for e in errors]}"
    by_name: dict[str, set[int]] = {}
    for spec, handle in zip(SIX, results):
        by_name.setdefault(spec, set()).add(id(handle))
    assert {k: len(v) for k, v in by_name.items()} == {name: 1 for name in models.BUNDLED}
    assert model_cache._inflight == {}
    for spec, handle in zip(SIX, results):
        # a usable model, not one whose weights a racing load left behind
        assert not any(p.device.type == "meta" for p in handle.model.parameters())
        assert handle.forward([1, 2, 3]).logits.isfinite().all()


def test_six_threads_in_a_cold_interpreter():
    # A fresh process has not imported transformers yet: the first imports race too.
    script = """
        import json, sys, threading
        import torch
        torch.set_num_threads(1)
        from playground.core import models
        assert "transformers" not in sys.modules, "playground.core.models imported transformers eagerly"
        specs = [n for n in models.BUNDLED for _ in range(2)]
        barrier = threading.Barrier(len(specs))
        out = [None] * len(specs)
        def go(i, spec):
            barrier.wait()
            try:
                out[i] = models.load_model(spec)
            except BaseException as e:
                out[i] = e
        threads = [threading.Thread(target=go, args=(i, s)) for i, s in enumerate(specs)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(json.dumps({
            "errors": [f"{type(r).__name__}: {r}" for r in out if isinstance(r, BaseException)],
            "objects": {s: len({id(r) for sp, r in zip(specs, out) if sp == s}) for s in set(specs)},
        }))
    """
    proc = _subprocess(script, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == []
    assert report["objects"] == {name: 1 for name in models.BUNDLED}


def _tiny_dir(tmp_path: Path, tokenizer) -> Path:
    from conftest import build_llama

    build_llama(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_a_failed_load_does_not_poison_the_next(tmp_path, tokenizer, monkeypatch):
    path = str(_tiny_dir(tmp_path, tokenizer))
    real = loading._auto_class
    calls = {"n": 0}

    class Exploding:
        @staticmethod
        def from_pretrained(*a, **k):
            raise RuntimeError("disk on fire\nsecond line of a long traceback")

    def once(config, kind, trust_remote_code):
        calls["n"] += 1
        return Exploding if calls["n"] == 1 else real(config, kind, trust_remote_code)

    monkeypatch.setattr(loading, "_auto_class", once)
    with pytest.raises(PlaygroundError) as err:
        models.load_model(path)
    assert "disk on fire" in str(err.value) and "\n" not in str(err.value)
    assert model_cache._inflight == {}
    handle = models.load_model(path)
    assert handle.kind == "causal" and calls["n"] == 2
    assert handle.forward([1, 2]).logits.isfinite().all()
    assert models.load_model(path) is handle


def test_a_model_left_on_the_meta_device_is_refused_in_one_line(tmp_path, tokenizer, monkeypatch):
    from transformers import AutoModelForCausalLM

    path = str(_tiny_dir(tmp_path, tokenizer))

    class HalfLoaded:
        @staticmethod
        def from_pretrained(*a, **k):
            model = AutoModelForCausalLM.from_pretrained(*a, **k)
            model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight, device="meta"))
            return model

    monkeypatch.setattr(loading, "_auto_class", lambda *a: HalfLoaded)
    with pytest.raises(PlaygroundError, match=r"meta device.*lm_head\.weight") as err:
        models.load_model(path)
    assert "\n" not in str(err.value)
    monkeypatch.undo()
    assert models.load_model(path).forward([1]).logits.isfinite().all()


def test_waiting_for_a_load_can_be_stopped(tmp_path, tokenizer, monkeypatch):
    path = str(_tiny_dir(tmp_path, tokenizer))
    release = threading.Event()
    real = loading._auto_class

    class Slow:
        @staticmethod
        def from_pretrained(*a, **k):
            release.wait(60)
            return real(*state["args"]).from_pretrained(*a, **k)

    state: dict = {}

    def slow(*args):
        state["args"] = args
        return Slow

    monkeypatch.setattr(loading, "_auto_class", slow)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        models.load_model(path, cancel=stop)
    # the load itself goes on and fills the cache for whoever asks next
    release.set()
    handle = models.load_model(path)
    assert models.load_model(path) is handle
    assert model_cache._inflight == {}


def test_hub_id_while_offline_fails_in_one_line(monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(PlaygroundError, match=r"someorg/not-cached.*HF_HUB_OFFLINE") as err:
        models.load_model("someorg/not-cached")
    assert "\n" not in str(err.value)


class _SilentHub:
    """A TCP server that accepts connections and never answers: a hub behind a dead network."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "network-hangs"])
def test_unreachable_hub_id_fails_instead_of_hanging(tmp_path, offline):
    hub = _SilentHub()
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{hub.port}",
           "HF_HUB_OFFLINE": "1" if offline else "0", "TRANSFORMERS_OFFLINE": "1" if offline else "0"}
    script = """
        from playground.core.errors import PlaygroundError
        from playground.core.models import load_model
        try:
            load_model("someorg/some-model")
        except PlaygroundError as e:
            print("ERROR:", e)
    """
    try:
        # generous: a hang used to last ~70 s; this bounds the test, it does not time the load
        proc = _subprocess(script, env=env, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("loading an unreachable hub id hung for 60 s")
    finally:
        hub.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR:")]
    assert len(lines) == 1, proc.stdout + proc.stderr[-2000:]
    assert "someorg/some-model" in lines[0]
    expected = "HF_HUB_OFFLINE" if offline else "cannot reach the Hugging Face hub"
    assert expected in lines[0]


def test_model_info_reads_the_config_only(empty_cache):
    info = models.model_info("tiny-shakespeare")
    assert not model_cache._cache and not model_cache._inflight  # nothing was loaded
    handle = models.load_model("tiny-shakespeare")
    assert info["kind"] == "causal" and info["source"] == "bundled"
    assert info["context_length"] == handle.context_length
    assert info["parameters"] == sum(p.numel() for p in handle.model.parameters())
    assert models.model_info("tiny-shakespeare-diffusion")["kind"] == "diffusion"
    with pytest.raises(PlaygroundError, match="does not exist"):
        models.model_info("./no/such/dir")


def test_the_model_cache_keeps_as_many_models_as_configured(empty_cache, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MODEL_CACHE", "1")
    first = models.load_model("tiny-shakespeare")
    assert models.load_model("tiny-shakespeare") is first
    models.load_model("tiny-shakespeare-draft")
    assert len(model_cache._cache) == 1
    assert models.load_model("tiny-shakespeare") is not first  # dropped, so loaded again
