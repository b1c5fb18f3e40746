"""Helpers shared by the collaboration decoders."""

from __future__ import annotations

import math
from typing import Any

import torch

from decoders.base import Context, PlaygroundError


def entropy_nats(logits: torch.Tensor) -> float:
    """Entropy (nats) of softmax(logits), in float64 so a peaked distribution is not rounded to 0."""
    lp = torch.log_softmax(logits.double(), -1)
    p = lp.exp()
    return float(-(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum())


def check_small_model(ctx: Context, decoder: str) -> None:
    """The small (draft-slot) model must be there and hold the whole run in its context."""
    if ctx.draft is None:
        raise PlaygroundError(f"decoder {decoder!r} needs a small model in the draft slot (--draft)")
    need = len(ctx.prompt_ids) + ctx.max_new_tokens
    if need > ctx.draft.context_length:
        raise PlaygroundError(f"prompt plus max_new_tokens ({need} tokens) exceeds the context of the small "
                              f"model {ctx.draft.name!r} ({ctx.draft.context_length} tokens)")


def argmax(logits: torch.Tensor, vocab: int | None = None) -> int:
    """Greedy token (ties to the lowest id, as torch.argmax), over the first ``vocab`` ids."""
    x = logits if vocab is None else logits[:vocab]
    return int(torch.argmax(x.float()))


def share(part: int, whole: int) -> float:
    """``part / whole`` rounded for stats (0 when there is nothing)."""
    return round(part / whole, 4) if whole else 0.0


def finite(x: float) -> Any:
    """A float for JSON (None for inf/nan)."""
    return round(x, 5) if math.isfinite(x) else None
