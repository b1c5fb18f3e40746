"""Hub ids fail fast: one bounded probe tells "offline", "no such model", "gated" and
"unreachable" apart in one line before transformers' own (slow, retrying) requests start."""

from __future__ import annotations

import importlib
import threading
from concurrent import futures
from concurrent.futures import Future
from typing import Any, Callable

from playground.core.errors import PlaygroundError
from playground.core.models._imports import _import, _import_lock
from playground.core.settings import limits


def check_hub(spec: str) -> None:
    """Fail in seconds, with one line, when the hub cannot serve ``spec``.

    Left to itself, huggingface_hub waits 10 s per request and retries with backoff, and
    transformers makes several requests: ~70 s on a network that drops packets. One HEAD of
    ``config.json`` with a short timeout (``PLAYGROUND_HUB_TIMEOUT``) and no retries tells the
    cases apart first.
    """
    timeout = limits().hub_timeout
    try:
        constants, get_hf_file_metadata, hf_hub_url = _import(
            "huggingface_hub", "constants", "get_hf_file_metadata", "hf_hub_url")
        with _import_lock:
            errors = importlib.import_module("huggingface_hub.errors")
    except Exception as e:  # noqa: BLE001
        raise PlaygroundError(f"cannot use the Hugging Face hub for {spec!r}: {first_line(e)}") from None
    if constants.HF_HUB_OFFLINE:
        raise PlaygroundError(f"could not load {spec!r}: it is not in the local Hugging Face cache, and hub access is "
                              f"off (HF_HUB_OFFLINE is set): download it first or unset HF_HUB_OFFLINE")
    try:
        _within(timeout, lambda: get_hf_file_metadata(hf_hub_url(spec, "config.json"), timeout=timeout))
    except errors.GatedRepoError:
        raise PlaygroundError(f"model {spec!r} is gated on the Hugging Face hub: accept its terms on its "
                              f"page and log in (`hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise PlaygroundError(f"no model {spec!r} on the Hugging Face hub (or it is private: log in "
                              f"with `hf auth login`)") from None
    except errors.EntryNotFoundError:
        raise PlaygroundError(f"{spec!r} on the Hugging Face hub has no config.json; is it a model?") from None
    except errors.HFValidationError:
        raise PlaygroundError(f"{spec!r} is not a bundled model, a local directory or a hub id "
                              f"(owner/name)") from None
    except errors.HfHubHTTPError as e:
        raise PlaygroundError(f"the Hugging Face hub refused {spec!r}: {first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - timeouts, DNS, refused connections
        raise PlaygroundError(f"cannot reach the Hugging Face hub for {spec!r} within {timeout:g} s "
                              f"(offline? HF_HUB_OFFLINE=1 uses only the local cache): "
                              f"{first_line(e)}") from None


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``, or TimeoutError after ``seconds`` (a stuck call finishes alone in the background).

    The request's own timeout applies per phase and per connection attempt, so a dead network
    can take several times longer than it; this bounds the whole call.
    """
    box: Future = Future()

    def run() -> None:
        try:
            box.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.set_exception(e)

    threading.Thread(target=run, name="hub probe", daemon=True).start()
    done, _ = futures.wait([box], timeout=seconds)
    if not done:
        raise TimeoutError("no answer")
    return box.result()


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), capped."""
    msg = str(e).strip()
    return (msg.splitlines()[0] if msg else type(e).__name__)[:200]
