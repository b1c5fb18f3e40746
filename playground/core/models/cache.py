"""The LRU of loaded models and the table of loads in flight.

Each model key has at most one load in flight (a :class:`Future` in ``_inflight`` that later
callers wait on; the cache is re-checked under ``_cache_lock``); the loading thread settles
the future and leaves the table whether it succeeded or failed, so a failed load never
poisons the next one. A cache hit takes no other lock than ``_cache_lock``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent import futures
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from playground.core.errors import Cancelled, PlaygroundError
from playground.core.settings import limits

if TYPE_CHECKING:
    from playground.core.models.handle import ModelHandle

_cache: "OrderedDict[tuple, ModelHandle]" = OrderedDict()
_inflight: dict[tuple, Future] = {}
_cache_lock = threading.Lock()  # guards _cache and _inflight; held only for dict operations
_WAIT_POLL_S = 0.1


def cached(key: tuple) -> "ModelHandle | None":
    """The loaded model under ``key`` (now the most recently used), or None."""
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
        return hit


def is_loaded(location: str) -> bool:
    """Whether some placement of the model at ``location`` is in the cache."""
    with _cache_lock:
        return any(k[0] == location for k in _cache)


def join_or_start(key: tuple, spec: str, job: Callable[[], "ModelHandle"]) -> Future:
    """The future of the load of ``key``: the one in flight, or a new one started here."""
    size = limits().model_cache  # read here: a misconfiguration must not leave a future unsettled
    with _cache_lock:
        fut = _inflight.get(key)
        if fut is not None:
            return fut
        fut = Future()
        hit = _cache.get(key)  # re-checked under the lock: a load may have finished meanwhile
        if hit is not None:
            fut.set_result(hit)
            return fut
        _inflight[key] = fut
    try:
        # a thread of its own, so that every caller (the first included) can stop waiting
        threading.Thread(target=_fill, args=(key, fut, job, size), name=f"load {spec}", daemon=True).start()
    except BaseException as e:  # noqa: BLE001 - e.g. no more threads: settle the future anyway
        _settle(key, fut, size, error=e)
    return fut


def _fill(key: tuple, fut: Future, job: Callable[[], "ModelHandle"], size: int) -> None:
    try:
        handle = job()
    except BaseException as e:  # noqa: BLE001 - the future must settle, or waiters hang forever
        _settle(key, fut, size, error=e)
    else:
        _settle(key, fut, size, handle=handle)


def _settle(key: tuple, fut: Future, size: int, handle: "ModelHandle | None" = None,
            error: BaseException | None = None) -> None:
    """Publish a load's outcome: cache it (on success, keeping at most ``size`` models) and
    leave the in-flight table, together."""
    with _cache_lock:
        if handle is not None:
            _cache[key] = handle
            _cache.move_to_end(key)
            while len(_cache) > max(1, size):
                _cache.popitem(last=False)
        if _inflight.get(key) is fut:
            del _inflight[key]
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(handle)


def wait(fut: Future, spec: str, cancel: threading.Event | None) -> "ModelHandle":
    """The outcome of a load; ``cancel`` (a run's Stop) ends the wait with :class:`Cancelled`."""
    while not fut.done():
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"loading {spec!r} was stopped")
        futures.wait([fut], timeout=None if cancel is None else _WAIT_POLL_S)
    try:
        return fut.result()
    except PlaygroundError as e:
        raise PlaygroundError(str(e)) from None  # each waiter gets its own exception object
