"""Shared pieces of the contrastive family: the paired-distribution evidence every decoder
of the family records, and a view that keeps the hidden states of its last forward."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from decoders.base import Context
from decoders.token_text import view_token


def rounded(x: float) -> float | None:
    """``x`` rounded for a trace; None where it is not finite (traces are strict JSON)."""
    x = float(x)
    return round(x, 6) if x == x and abs(x) != float("inf") else None


def contrast_evidence(view: Any, rows: dict[str, torch.Tensor], chosen: int, k: int = 20,
                      scores: torch.Tensor | None = None) -> dict[str, Any]:
    """The ``contrast`` field of a step: paired distributions over the same tokens.

    ``rows`` maps a label to a probability vector, first the model's own distribution
    (expert, conditional, final layer), then what it is contrasted with, last the contrast
    the token is chosen from. The tokens shown are the ``k`` best under the contrast plus
    the ``k`` best under the first row, and the chosen token; ``ranks`` holds each token's
    rank under every row, so ``rank_changed`` lists the shown tokens the contrast moved.
    ``scores`` (optional) are the contrast's raw scores, ``None`` where a token is excluded.
    """
    labels = list(rows)
    first, last = rows[labels[0]].float().cpu(), rows[labels[-1]].float().cpu()
    n = min(k, last.numel())
    ids = torch.topk(last, n).indices.tolist()
    ids += [t for t in torch.topk(first, n).indices.tolist() if t not in ids]
    if chosen not in ids:
        ids.append(int(chosen))
    idx = torch.tensor(ids)
    probs: dict[str, list[float | None]] = {}
    ranks: dict[str, list[int]] = {}
    for label, row in rows.items():
        r = row.float().cpu()
        probs[label] = [rounded(v) for v in r[idx].tolist()]
        # rank = how many tokens are strictly more probable (0 = top), as dist_evidence counts it
        ranks[label] = (r.unsqueeze(0) > r[idx].unsqueeze(1)).sum(1).tolist()
    ev: dict[str, Any] = {
        "labels": labels,
        "top_ids": ids,
        "top_tokens": [view_token(view, t) for t in ids],
        "probs": probs,
        "ranks": ranks,
        "chosen": int(chosen),
        "rank_changed": [t for t, a, b in zip(ids, ranks[labels[0]], ranks[labels[-1]]) if a != b],
    }
    if scores is not None:
        ev["scores"] = [rounded(v) for v in scores.float().cpu()[idx].tolist()]
    return ev


class HiddenView:
    """A model view that asks every forward for hidden states and keeps the last ones.

    Lets a decoder that needs the layers' hidden states run on :func:`decoders.ar.token_loop`
    unchanged; the wrapped view still counts every forward.
    """

    def __init__(self, view: Any) -> None:
        self.view = view
        self.hidden: tuple[torch.Tensor, ...] = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)

    def forward(self, ids: Any, **kw: Any) -> Any:
        """The wrapped view's forward with ``hidden_states=True``; keeps them in ``hidden``."""
        out = self.view.forward(ids, **{**kw, "hidden_states": True})
        self.hidden = tuple(out.hidden_states or ())
        return out


def with_hidden(ctx: Context) -> tuple[Context, HiddenView]:
    """A copy of ``ctx`` whose target keeps its hidden states, and that target."""
    hv = HiddenView(ctx.target)
    return dataclasses.replace(ctx, target=hv), hv


def text_config(view: Any) -> Any:
    """The text part of a model's config (the config itself for a plain causal LM)."""
    cfg = view.config
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg
