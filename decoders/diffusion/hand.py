"""A hand on the canvas: the reader commits chosen positions at one step of a diffusion run.

A *hand* is ``{"step": s, "commit": [[position, token_id], ...]}`` (generated positions from 0).
The run decodes as usual up to step ``s``; at step ``s`` the model still runs and its plan still
picks, but the positions and tokens the reader chose are committed instead, and the step says
``hand: {"positions", "ids", "picked": {"positions", "ids"}}`` (``picked``: what the plan
would have committed). From step ``s + 1`` on the decoder continues with its own rule.

How the state before step ``s`` is reached: the run *replays* steps ``0 .. s-1`` (same seed,
the same common random numbers, so the same canvases: ``playground.branching`` checks the
replayed canvas against the parent's and refuses a run that parts from it). Replaying rather
than loading the parent's canvas keeps every piece of the sampler's state exact (a block's
schedule, CreditDecoding's credit, PC-Sampler's prior, a rule's stability counters) at the cost
of ``s`` forward passes, which the branch's trace counts.

After the hand, a fixed schedule (``even``, ``ascending``) re-spreads what is left of the block
over its remaining steps when the hand committed another number of positions than the plan
would have; a hand at a block's last step that leaves masks in the block adds one step that
commits them (by the plan's ranking, all of them). Threshold and rule plans need nothing: they
decide from the canvas each step. The hand is internal (the branch machinery passes it), not a
knob. Only the two shared loops (``run_recipe``, ``run_rule``) take it; a decoder with a loop of
its own (``apd``, ``dingo``, ``freedave``) is refused in one line.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypeVar

import torch

from playground.core.errors import PlaygroundError

TOP_K = 5  # candidate tokens recorded per masked position (what a reader may pick from)
MAX_HAND = 64  # positions one hand may commit

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Hand:
    """The reader's commits at one step: ``commit`` maps generated positions to token ids."""

    step: int
    commit: dict[int, int]

    def as_dict(self) -> dict[str, Any]:
        """The JSON form kept in a trace (``hand``) and a branch record."""
        return {"step": self.step, "commit": [[p, t] for p, t in sorted(self.commit.items())]}


def takes_hand(run: F) -> F:
    """Mark a decoder's ``run`` as a loop that honours :class:`Hand` (a subclass with a run of
    its own loses the mark, so it is refused rather than silently ignoring the hand)."""
    run.takes_hand = True  # type: ignore[attr-defined]
    return run


def hand_ok(decoder_cls: Any) -> None:
    """PlaygroundError (one line) unless the decoder's loop honours a hand."""
    if not getattr(getattr(decoder_cls, "run", None), "takes_hand", False):
        name = getattr(decoder_cls, "name", "?")
        why = ("it is not a diffusion decoder" if getattr(decoder_cls, "kind", "") != "diffusion"
               else "its loop is its own (only the shared sampler and rule loops take one)")
        raise PlaygroundError(f"decoder {name!r} cannot take a hand on its canvas: {why}")


def parse_hand(value: Any) -> Hand | None:
    """A :class:`Hand` from ``{"step": s, "commit": [[pos, tok], ...] or {pos: tok}}``; None
    for None/empty; one line of error for anything malformed."""
    if value is None or value == {} or isinstance(value, Hand):
        return value or None
    if not isinstance(value, dict) or set(value) - {"step", "commit"} or "step" not in value:
        raise PlaygroundError("a hand is {\"step\": S, \"commit\": [[position, token_id], ...]}")
    step = _whole("hand step", value["step"])
    raw = value.get("commit")
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise PlaygroundError("a hand commits at least one [position, token_id] pair")
    if len(pairs) > MAX_HAND:
        raise PlaygroundError(f"a hand commits at most {MAX_HAND} positions, not {len(pairs)}")
    commit: dict[int, int] = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise PlaygroundError(f"a hand's commit is a [position, token_id] pair, got {pair!r}")
        pos, tok = _whole("hand position", pair[0]), _whole("hand token id", pair[1])
        if pos in commit:
            raise PlaygroundError(f"the hand commits position {pos} twice")
        commit[pos] = tok
    return Hand(step, dict(sorted(commit.items())))


def _whole(what: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)) or not str(v).strip().isdigit():
        raise PlaygroundError(f"a {what} must be a whole number >= 0, got {v!r}")
    return int(v)


def check_hand(hand: Hand, gen_length: int, vocab_size: int) -> None:
    """Refuse a position past the canvas or a token id outside the vocabulary."""
    for p, t in hand.commit.items():
        if p >= gen_length:
            raise PlaygroundError(f"hand position {p} is past the canvas of {gen_length} positions")
        if t >= vocab_size:
            raise PlaygroundError(f"hand token id {t} is outside the vocabulary (size {vocab_size})")


def top_choices(logits: torch.Tensor, pos: torch.Tensor, g: int, k: int = TOP_K) -> dict[str, Any]:
    """The ``k`` most probable tokens of every masked position ``pos`` under the model's raw
    logits (the generated part's, (G, V)): ``top_ids`` and ``top_probs``, per generated position,
    None where the position was not masked. What the page offers a reader's hand."""
    ids: list[Any] = [None] * g
    probs: list[Any] = [None] * g
    if pos.numel():
        p = torch.softmax(logits[pos].double(), -1)
        val, idx = torch.topk(p, min(k, p.shape[-1]), -1)
        for q, vs, js in zip(pos.tolist(), val.tolist(), idx.tolist()):
            ids[q] = [int(j) for j in js]
            probs[q] = [round(float(v), 5) for v in vs]
    return {"top_ids": ids, "top_probs": probs}


def apply_hand(hand: Hand, step: int, prop: Any, chosen: torch.Tensor) -> tuple[Any, torch.Tensor, dict[str, Any]]:
    """At the hand's step: the proposal with the reader's tokens, the indices (into it) to
    commit, and the step's ``hand`` evidence; elsewhere ``(prop, chosen, {})`` unchanged.

    ``chosen`` is what the plan picked (recorded as ``picked``; ``proposed`` is the model's
    token at each hand position). A hand position that is not
    masked at this step is one line of error."""
    if step != hand.step:
        return prop, chosen, {}
    where = {int(p): j for j, p in enumerate(prop.pos.tolist())}
    missing = [p for p in hand.commit if p not in where]
    if missing:
        raise PlaygroundError(f"hand position {missing[0]} is not masked at step {step}")
    idx = torch.tensor([where[p] for p in hand.commit], dtype=torch.long)
    tokens = prop.tokens.clone()
    tokens[idx] = torch.tensor(list(hand.commit.values()), dtype=tokens.dtype)
    order = torch.argsort(prop.pos[chosen])
    picked = chosen[order]
    ev = {"positions": list(hand.commit), "ids": list(hand.commit.values()),
          "proposed": prop.tokens[idx].tolist(),
          "picked": {"positions": prop.pos[picked].tolist(), "ids": prop.tokens[picked].tolist()}}
    return dataclasses.replace(prop, tokens=tokens), idx, ev


def mark_hand(st: Any, ev: dict[str, Any]) -> None:
    """Record the hand on its ``denoise`` step; ``predicted`` keeps the model's proposals at the
    hand's positions (``ev["proposed"]``), the canvas and ``committed`` hold the reader's."""
    predicted = st.evidence.get("predicted")
    if isinstance(predicted, list):
        for p, t in zip(ev["positions"], ev["proposed"]):
            predicted[p] = int(t)
    st.evidence["hand"] = ev


def replan(schedule: list[int], i: int, left: int, steps_per_block: int, spread: Callable[[int, int], list[int]]) -> list[int]:
    """A fixed schedule after a hand at block step ``i`` that left ``left`` masks in the block:
    unchanged when the remaining steps still commit exactly ``left``; else ``left`` re-spread
    over the remaining steps by ``spread(count, steps)``, or one more step when none remain."""
    rest = schedule[i + 1:]
    if sum(rest) == left:
        return schedule
    n = max(steps_per_block - i - 1, 1 if left else 0)
    n = min(n, left)
    return schedule[:i + 1] + (spread(left, n) if n else [])


def unused(hand: Hand | None, steps: int) -> None:
    """PlaygroundError when the run ended before the hand's step."""
    if hand is not None and hand.step >= steps:
        raise PlaygroundError(f"the run ended after {steps} steps, before the hand's step {hand.step}")


__all__ = ["Hand", "MAX_HAND", "TOP_K", "apply_hand", "check_hand", "hand_ok", "mark_hand", "parse_hand", "replan",
           "takes_hand", "top_choices", "unused"]
