"""Hosting glue for Hugging Face Spaces: the ZeroGPU decorator, queue and launch settings.

The UI calls these; everything is read from the environment (see ``playground/core/settings.py``
and ``docs/hosting.md``), so the same code runs locally, on a CPU Space and on ZeroGPU.

* :func:`gpu` wraps a function that runs models with ``spaces.GPU`` when the ``spaces``
  package is importable (it is preinstalled on Spaces, and its decorator does nothing outside
  ZeroGPU hardware) and returns the function unchanged when it is not.
* :func:`queue_settings` are the keyword arguments of ``demo.queue(...)``;
  :func:`model_event_settings` those of an event listener that runs models (one shared
  concurrency group, so lanes of different users never run more models at once than allowed);
  :func:`launch_settings` those of ``demo.launch(...)`` that hosting decides.
* :func:`remote_code_allowed` says whether users may opt in to a model's own code, i.e.
  whether the page shows its remote-code control.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, TypeVar, overload

from playground.core.errors import PlaygroundError
from playground.core.settings import limits, on_space

F = TypeVar("F", bound=Callable[..., Any])

MODEL_CONCURRENCY_ID = "playground-models"


def _spaces() -> Any | None:
    """The ``spaces`` module, or None when it is not installed (looked up on every call)."""
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def zero_gpu_available() -> bool:
    """Whether ``spaces`` is importable, so :func:`gpu` wraps (it acts only on ZeroGPU hardware)."""
    return _spaces() is not None


@overload
def gpu(fn: F) -> F: ...


@overload
def gpu(fn: None = None, *, duration: int | None = None) -> Callable[[F], F]: ...


def gpu(fn: F | None = None, *, duration: int | None = None) -> Any:
    """Mark ``fn`` as model work: ``spaces.GPU`` when ``spaces`` is importable, else a no-op.

    Use bare (``@gpu``) or with a time budget (``@gpu(duration=120)``); without one,
    ``PLAYGROUND_GPU_DURATION`` applies, and when that is 0 spaces' own default (60 s).
    ZeroGPU wants the decorated functions to exist when the app starts, so decorate at
    import time or inside ``build_app``, not per request. Generators are fine (spaces
    streams them).
    """
    def wrap(f: F) -> F:
        spaces = _spaces()
        if spaces is None:
            return f
        seconds = duration if duration is not None else limits().gpu_duration
        if seconds and seconds > 0:
            return spaces.GPU(duration=int(seconds))(f)
        return spaces.GPU(f)

    return wrap(fn) if fn is not None else wrap


def remote_code_allowed() -> bool:
    """Whether a request may ask for ``trust_remote_code`` on this instance.

    True where ``PLAYGROUND_ALLOW_REMOTE_CODE`` allows it (default locally, off on a Space) and
    a model other than the bundled ones (which need no code of their own) may be loaded. The
    page shows its remote-code opt-in only where this is true; elsewhere
    :func:`playground.core.models.load_model` refuses the opt-in in one line.
    """
    lim = limits()
    return lim.allow_remote_code and not lim.no_models and any(s != "bundled" for s in lim.model_sources)


def queue_settings() -> dict[str, Any]:
    """Keyword arguments for ``demo.queue(**queue_settings())``."""
    lim = limits()
    return {"default_concurrency_limit": lim.concurrency,
            "max_size": lim.queue_size if lim.queue_size > 0 else None}


def model_event_settings() -> dict[str, Any]:
    """Keyword arguments for an event that runs models (``btn.click(fn, ..., **model_event_settings())``).

    All such events share one concurrency group, limited by ``PLAYGROUND_MODEL_CONCURRENCY``.
    """
    return {"concurrency_limit": limits().model_concurrency, "concurrency_id": MODEL_CONCURRENCY_ID}


def launch_settings() -> dict[str, Any]:
    """Keyword arguments for ``demo.launch(...)`` that depend on where the app is hosted.

    Uploads are capped at the import size limit; on a Space the server listens on all
    interfaces (Spaces route to it), locally on 127.0.0.1 unless ``GRADIO_SERVER_NAME`` says
    otherwise. The port is ``$PORT``/``$GRADIO_SERVER_PORT``, else 7860. Server-side rendering
    is off everywhere (Gradio turns it on for Spaces): it puts a Node server in front that
    renders the page itself, so the share link's quick read (``playground/ui/quick_read.py``),
    which rides in the HTML Python serves, would not reach the reader.
    """
    default_host = "0.0.0.0" if on_space() else "127.0.0.1"
    port = os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or "7860"
    try:
        port_n = int(port)
    except ValueError:
        raise PlaygroundError(f"the server port {port!r} is not a number") from None
    return {"server_name": os.environ.get("GRADIO_SERVER_NAME", default_host),
            "server_port": port_n, "max_file_size": limits().max_import_bytes, "ssr_mode": False}
