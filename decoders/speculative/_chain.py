"""Drafting a chain of tokens with a draft model: the loop shared by draft-model decoders that
draft a plain chain of a length they choose each step (``bandit_spec``, ``spec_contrastive``).

The draft samples each token from its chain-processed distribution with the run's ``draft``
stream, under the run's grammar constraint when it has one, and the tree records for each
drafted node the distribution it was drawn from (what verification needs to stay exact) and
the raw softmax the lossy rules look at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from decoders.ar import sample_index
from decoders.base import Context
from decoders.draft_state import DraftState, fit_logits
from decoders.draft_tree import ROOT, SpecDecoder, Tree


@dataclass
class DraftedChain:
    """A drafted chain and the draft's logits at each of its positions.

    ``logits[i]`` is the draft's (target-sized) logits after the committed tokens and the
    first ``i`` drafted ones: ``len(tree)`` rows, plus one more (after the last drafted
    token) when the chain was drafted with ``feed_last``.
    """

    tree: Tree
    logits: list[torch.Tensor] = field(default_factory=list)


def draft_chain(dec: SpecDecoder, ctx: Context, state: DraftState, gamma: int, source: str = "draft-model",
                q_of: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
                feed_last: bool = False) -> DraftedChain:
    """Draft up to ``gamma`` tokens after the committed ones with the draft model in ``state``.

    ``q_of(logits, drafted)`` is the distribution to draw from (default: the decoder's sampling
    chain at this context); ``feed_last`` also feeds the last drafted token to the draft, so
    the draft's logits after it are known (one more draft forward; with ``gamma`` 0 the
    chain is empty and ``logits`` holds the draft's logits after the committed tokens).
    """
    out = DraftedChain(Tree())
    if gamma <= 0 and not feed_last:
        return out
    V = ctx.target.vocab_size
    logits = state.catch_up(dec.committed_ids)
    if gamma <= 0:
        out.logits.append(fit_logits(logits.float(), V))
        return out
    parent, drafted = ROOT, []
    row = dec.draft_constraint()
    for i in range(gamma):
        logits = fit_logits(logits.float(), V)
        out.logits.append(logits)
        if row is not None:
            logits = row.apply(logits)[0]  # draft only what the constraint allows
        q = q_of(logits, drafted) if q_of is not None else dec.chain.probs(logits, dec.history(ctx, drafted))
        qr = torch.softmax(logits, -1) if dec.greedy else q
        x = sample_index(q, dec.next_uniform(ctx, "draft"))
        out.tree.dists[parent], out.tree.rule_q[parent] = q, qr
        parent = out.tree.add(x, parent, float(qr[x]), source)
        drafted.append(x)
        if row is not None:
            row.advance(x)
        last = i + 1 == gamma or (row is not None and row.done)
        if last and not feed_last:
            break
        logits = state.feed([x])[-1]
        if last:
            out.logits.append(fit_logits(logits.float(), V))
            break
    return out
