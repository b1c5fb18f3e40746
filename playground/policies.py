"""Lockstep policies: which lane of a race steps next, and what each lane is charged.

A race is only as honest as what it charges. Five policies, each named by what it equalises:

- ``"forwards"`` — **equal target forwards** (the default): the lane that has used the fewest
  full passes of its target model steps next. Draft forwards, tree width and the length of
  a pass are free, so a speculative lane that commits four tokens per target pass pulls
  ahead even where it is slower in wall time.
- ``"cost"`` — **equal cost**: the lane that has spent the least under the cost model below.
- ``"wall"`` — **equal wall time**: the lane that has spent the least time in its own steps
  (measured by the runner around each step, so time spent waiting for other lanes is not
  counted).
- ``"steps"`` — equal steps; ``"free"`` — round robin.

Ties go to lane order. Under ``"cost"`` and ``"wall"`` each step is stamped with what its
lane has spent so far — ``race_cost`` (target-token units) or ``own_s`` (seconds in its own
steps) — which the progress strip finds and plots on its x axis, live and in replays.

The cost model
--------------
Cost is counted in **target-token units**: one unit is the price of one token position
processed by the race's reference model (the target of the first lane ready to step — lane
1's, or the page model, whenever the lanes share it) in a forward pass. A lane pays

    cost = Σ over the models it ran:  tokens processed by that model × rate(model) / rate(reference)

- *tokens processed* are counted by the model views (``ModelView.tokens``): a prefill pays
  the prompt length, a one-token decode step pays 1, a speculative verification pays every
  position it verifies (the drafted tokens plus the bonus position, the whole tree for a
  tree), a diffusion denoising pass pays prompt + canvas (it has no cache);
- *rate(model)* is the model's measured time of one forward pass over a fixed
  ``RATE_TOKENS``-token input (the fastest of ``RATE_REPEATS`` after ``RATE_WARMUP`` passes; CPU seconds of
  the process for a model on the CPU, so other work on a shared machine does not count; wall
  time after synchronising for a model on a GPU), measured once per
  loaded model and kept (:func:`rate_of`; :func:`set_rate` pins it). So a draft token costs
  the draft's measured time ratio to the target, and a lane on a bigger target pays more;
- an early exit (a self-speculative draft running ``k`` of the target's ``N`` layers) pays
  ``k / N`` per token (its share of the layers; not timed separately).

This is a compute model (what the passes would cost if every position were paid for), not a
latency model: on a GPU a verification over five positions takes about as long as a pass
over one, which the ``"wall"`` policy shows and the cost model deliberately does not.
Forwards of models a decoder holds outside its ``target``/``draft`` views are not charged.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, Sequence

NAMES = ("forwards", "cost", "wall", "steps", "free")
DEFAULT = "forwards"
LABELS = {
    "forwards": "equal target forwards",
    "cost": "equal cost",
    "wall": "equal wall time",
    "steps": "equal steps",
    "free": "free running",
}
# What the progress strip counts on its x axis under each policy.
AXES = {
    "forwards": "target forward passes",
    "cost": "cost (target-token units)",
    "wall": "seconds in the lane's own steps",
    "steps": "steps",
    "free": "steps",
}
EXPLAIN = {
    "forwards": "Lanes race at equal target forward passes: draft forwards, tree width and long "
                "passes are free, so speculative lanes look as good as they can.",
    "cost": "Lanes race at equal cost: every token position a model processes is paid for, "
            "draft and diffusion models at their measured speed relative to the target.",
    "wall": "Lanes race at equal wall time: the lane that has spent the least time in its own "
            "steps goes next, so what is faster on this machine wins.",
    "steps": "Lanes race at equal steps, whatever a step costs.",
    "free": "Lanes take turns (round robin), whatever a step costs.",
}

RATE_TOKENS = 16
RATE_REPEATS = 7
RATE_WARMUP = 3

_rates: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()
_rates_lock = threading.Lock()


def label(policy: str) -> str:
    """The policy's name as the page and the CLI show it (``"equal target forwards"``)."""
    return LABELS.get(policy, policy)


def set_rate(handle: Any, seconds: float) -> None:
    """Pin ``handle``'s forward time (seconds per ``RATE_TOKENS``-token pass) instead of measuring it."""
    with _rates_lock:
        _rates[handle] = float(seconds)


def _clock(handle: Any) -> tuple[Callable[[], float], Callable[[], None]]:
    """(clock, sync) for timing ``handle``'s forwards: CPU seconds of this process for a model on
    the CPU (a busy machine delays a pass without making it dearer), else wall time after the
    accelerator has finished its queued work."""
    device = str(getattr(handle, "device", "cpu"))
    if device.startswith("cuda"):
        import torch  # only for a CUDA handle: the runner imports this module without torch

        return time.perf_counter, torch.cuda.synchronize
    if device == "cpu" or device.startswith("cpu"):
        return time.process_time, lambda: None
    return time.perf_counter, lambda: None


def measure_rate(handle: Any, tokens: int = RATE_TOKENS, repeats: int = RATE_REPEATS) -> float:
    """Seconds of one uncounted forward of ``handle`` over ``tokens`` positions: the fastest of
    ``repeats`` after a warm-up (CPU seconds for a model on the CPU, see :func:`_clock`)."""
    vocab = int(getattr(handle, "vocab_size", 0) or 2)
    ids = [(7 * j + 1) % max(vocab - 1, 1) for j in range(tokens)]
    clock, sync = _clock(handle)
    for _ in range(RATE_WARMUP):  # first passes pay for allocations and kernel selection
        handle.forward(ids)
    times = []
    for _ in range(repeats):
        sync()
        t0 = clock()
        handle.forward(ids)
        sync()
        times.append(clock() - t0)
    return max(min(times), 1e-9)


def rate_of(handle: Any) -> float:
    """``handle``'s forward time, measured on first use and kept while the model is loaded."""
    with _rates_lock:
        got = _rates.get(handle)
    if got is not None:
        return got
    r = measure_rate(handle)
    with _rates_lock:
        return _rates.setdefault(handle, r)


def _handle(view: Any) -> Any:
    return getattr(view, "handle", view)


def reference_rate(lanes: Sequence[Any], rate: Callable[[Any], float] = rate_of) -> float:
    """The rate of the race's reference model: the target of the first lane that has a run."""
    for lane in lanes:
        target = getattr(getattr(getattr(lane, "run", None), "ctx", None), "target", None)
        if target is not None and hasattr(target, "tokens"):
            return rate(_handle(target))
    return 1.0


def run_cost(run: Any, ref: float = 1.0, rate: Callable[[Any], float] = rate_of) -> float:
    """What ``run`` has spent under the cost model, in units of one token through the reference model.

    A run without model views (a stand-in) pays its target forwards."""
    ctx = getattr(run, "ctx", None)
    target = getattr(ctx, "target", None)
    if target is None or not hasattr(target, "tokens"):
        return float(getattr(run, "target_forwards", 0))
    cost = target.tokens * rate(_handle(target)) / ref
    layers = int(getattr(target, "num_layers", 0) or 0)
    exits = getattr(target, "draft_layer_tokens", 0) or 0
    if exits and layers:
        cost += exits / layers * rate(_handle(target)) / ref
    draft = getattr(ctx, "draft", None)
    if draft is not None and hasattr(draft, "tokens") and draft.tokens:
        cost += draft.tokens * rate(_handle(draft)) / ref
    return cost


class Policy:
    """Picks the next lane of a race and keeps what each lane has been charged.

    ``rate`` gives a model handle's forward time (tests pass known ones); the lanes are the
    runner's :class:`~playground.runner.Lane` objects (``run``, ``steps``, ``busy_s``).
    """

    def __init__(self, name: str = DEFAULT, rate: Callable[[Any], float] = rate_of) -> None:
        self.name = name
        self.rate = rate
        self._rr = -1
        self._ref: float | None = None

    def reference(self, lanes: Sequence[Any]) -> float:
        """The reference rate, fixed the first time a lane of the race has a run."""
        if self._ref is None and any(getattr(lane, "run", None) is not None for lane in lanes):
            self._ref = reference_rate(lanes, self.rate)
        return self._ref or 1.0

    def cost(self, lanes: Sequence[Any], k: int) -> float:
        """Lane ``k``'s cost so far (target-token units)."""
        return run_cost(lanes[k].run, self.reference(lanes), self.rate)

    def spent(self, lanes: Sequence[Any], k: int) -> float:
        """What lane ``k`` has spent in the quantity this policy equalises (its x axis)."""
        lane = lanes[k]
        if self.name == "forwards":
            return float(getattr(lane.run, "target_forwards", 0) if lane.run is not None else 0)
        if self.name == "cost":
            # rounded so equal costs tie (and go to lane order) despite float error
            return round(self.cost(lanes, k), 9) if lane.run is not None else 0.0
        if self.name == "wall":
            return float(getattr(lane, "busy_s", 0.0))
        return float(getattr(lane, "steps", 0))

    def charge(self, lanes: Sequence[Any], k: int, step: Any, seconds: float) -> None:
        """Book a step lane ``k`` just took (``seconds`` of its own time) and, under ``"cost"``
        and ``"wall"``, stamp the step with what the lane has spent so far (``race_cost``,
        ``own_s``): the progress strip plots the stamp it finds, so a live race and its replay
        show the quantity the race equalised."""
        lane = lanes[k]
        lane.busy_s = float(getattr(lane, "busy_s", 0.0)) + max(float(seconds), 0.0)
        evidence = getattr(step, "evidence", None)
        if not isinstance(evidence, dict) or lane.run is None:
            return
        if self.name == "wall":
            evidence["own_s"] = round(lane.busy_s, 6)
        elif self.name == "cost":
            evidence["race_cost"] = round(self.cost(lanes, k), 4)

    def pick(self, lanes: Sequence[Any], live: list[int]) -> int | None:
        """Index of the lane among ``live`` (ready, not done) that steps next, or None."""
        if not live:
            return None
        if self.name == "free":
            after = [k for k in live if k > self._rr]
            self._rr = after[0] if after else live[0]
            return self._rr
        return min(live, key=lambda k: (self.spent(lanes, k), k))
