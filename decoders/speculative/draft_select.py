"""Drafters as bandit arms (online draft selection, A358, inside ``bandit_spec``).

A *drafter* proposes a chain of up to γ tokens after the committed ones; the target then
verifies the chain exactly as every speculative decoder does, so which drafter drafted a
round never changes what the target accepts, only how many tokens it accepts. The drafters
here are the ones the project's speculative decoders already use:

- ``draft_model``: the draft model samples a chain (:func:`draft_chain`, as ``speculative``,
  ``bandit_spec`` and ``spec_contrastive`` do); a drafted token costs ``draft_cost``
  target forwards;
- ``prompt_lookup``: the continuation of the latest match of the longest suffix n-gram
  (n = 3 down to 1) of prompt + output (:func:`lookup_continuations`, as ``prompt_lookup``
  does, one branch); it costs nothing we model (a scan of the text, no forward);
- ``layer_skip`` / ``layer_skip:k``: the target's own first k layers plus its final norm and
  LM head (k = half the layers when omitted), as ``layer_skip`` drafts; a drafted token
  costs k / L target forwards (the share of the layers it runs).

The cost of a drafter is what the modelled reward charges per drafted token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from decoders.ar import sample_index
from decoders.base import Context, PlaygroundError
from decoders.draft_state import DraftState
from decoders.draft_tree import ROOT, SpecDecoder, Tree
from decoders.kv_cache import cache_len, crop_layers
from decoders.speculative._chain import draft_chain
from decoders.speculative.lookup import lookup_continuations

DRAFTERS = ("draft_model", "prompt_lookup", "layer_skip")
LOOKUP_MAX_N, LOOKUP_MIN_N = 3, 1  # prompt_lookup's own defaults


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter arm as written in the ``drafters`` knob: its ``kind`` (one of
    :data:`DRAFTERS`) and, for ``layer_skip``, the exit layer (0 = half the layers)."""

    kind: str
    exit_layer: int = 0

    @property
    def label(self) -> str:
        """The name as written (``layer_skip:2``), what the evidence calls the arm."""
        return f"{self.kind}:{self.exit_layer}" if self.kind == "layer_skip" and self.exit_layer else self.kind


def parse_drafters(text: str) -> list[DrafterSpec]:
    """The drafters of a comma list (``"draft_model,prompt_lookup,layer_skip:2"``), in the
    order given; a bad list is one line naming what is wrong."""
    names = [a.strip() for a in str(text).split(",") if a.strip()]
    if not names:
        raise PlaygroundError("knob 'drafters': give at least one drafter, e.g. draft_model,prompt_lookup,layer_skip")
    out: list[DrafterSpec] = []
    for name in names:
        kind, sep, arg = name.partition(":")
        kind = kind.strip()
        if kind not in DRAFTERS:
            raise PlaygroundError(f"knob 'drafters': unknown drafter {name!r}; known: {', '.join(DRAFTERS)} "
                                  f"(layer_skip:k picks the exit layer)")
        k = 0
        if sep:
            if kind != "layer_skip":
                raise PlaygroundError(f"knob 'drafters': {name!r} takes no ':' argument (only layer_skip:k does)")
            if not arg.strip().isdigit() or int(arg) < 1:
                raise PlaygroundError(f"knob 'drafters': {name!r}: k in layer_skip:k must be a whole number ≥ 1")
            k = int(arg)
        spec = DrafterSpec(kind, k)
        if spec in out:
            raise PlaygroundError(f"knob 'drafters' names {spec.label!r} twice")
        out.append(spec)
    return out


class Drafter:
    """A drafter bound to one run: :meth:`draft` gives a chain tree, ``cost`` is what one
    drafted token costs in target forwards (for the modelled reward)."""

    label: str = ""
    cost: float = 0.0

    def draft(self, dec: SpecDecoder, ctx: Context, gamma: int) -> Tree:
        """A chain of at most ``gamma`` tokens after ``dec``'s committed ones."""
        raise NotImplementedError


class DraftModelDrafter(Drafter):
    """The draft model's sampled chain; its state catches up lazily on the tokens committed
    while other arms were pulled (``DraftState.catch_up`` feeds only what it lacks)."""

    def __init__(self, state: DraftState, cost: float) -> None:
        self.label, self.state, self.cost = "draft_model", state, float(cost)

    def draft(self, dec: SpecDecoder, ctx: Context, gamma: int) -> Tree:
        return draft_chain(dec, ctx, self.state, gamma).tree


class LookupDrafter(Drafter):
    """Prompt lookup's chain: deterministic candidates (no ``dists``), which verification
    treats as point-mass proposals, as ``prompt_lookup`` does."""

    label = "prompt_lookup"
    cost = 0.0

    def draft(self, dec: SpecDecoder, ctx: Context, gamma: int) -> Tree:
        tree = Tree()
        if gamma <= 0:
            return tree
        _n, conts = lookup_continuations(dec.committed_ids, LOOKUP_MAX_N, LOOKUP_MIN_N, gamma, 1)
        if conts:
            tree.add_chain(conts[0], ROOT, "lookup")
        return tree


class LayerSkipDrafter(Drafter):
    """The target's first ``k`` layers draft in the target's own cache (those k layers are
    the full model's), and their extra entries are cut before verification rewrites them:
    the loop of ``layer_skip`` without its DEL and adaptive-stop options."""

    def __init__(self, label: str, k: int, n_layers: int) -> None:
        self.label, self.k, self.cost = label, k, k / n_layers

    def draft(self, dec: SpecDecoder, ctx: Context, gamma: int) -> Tree:
        tree = Tree()
        if gamma <= 0:
            return tree
        # the deepest layer is never touched by the early exit: its length is the true past
        past = cache_len(dec.cache, ctx.target.num_layers - 1)
        out = ctx.target.forward(list(dec.pending), cache=dec.cache, num_layers=self.k)
        dec.cache = out.cache
        logits = out.logits[0, -1]
        parent, drafted = ROOT, []
        row = dec.draft_constraint()
        for i in range(gamma):
            lg = logits.float()
            if row is not None:
                lg = row.apply(lg)[0]  # draft only what the constraint allows (q stays the draft's own)
            q = dec.chain.probs(lg, dec.history(ctx, drafted))
            qr = torch.softmax(lg, -1) if dec.greedy else q
            x = sample_index(q, dec.next_uniform(ctx, "draft"))
            tree.dists[parent], tree.rule_q[parent] = q, qr
            parent = tree.add(x, parent, float(qr[x]), f"layer-{self.k}")
            drafted.append(x)
            if row is not None:
                row.advance(x)
            if i + 1 == gamma or (row is not None and row.done):
                break
            logits = ctx.target.forward([x], cache=dec.cache, num_layers=self.k).logits[0, -1]
        crop_layers(dec.cache, past, self.k)  # the verification pass rewrites these positions
        return tree


def build_drafters(specs: Sequence[DrafterSpec], ctx: Context, state_of: Callable[[], DraftState], draft_cost: float,
                   decoder: str) -> list[Drafter]:
    """The run's drafters. ``state_of()`` makes the draft model's state (called only when a
    ``draft_model`` arm is listed, so a run without one never touches a draft model); a
    drafter that cannot run on these models is one line naming it."""
    out: list[Drafter] = []
    L = int(ctx.target.num_layers)
    for s in specs:
        if s.kind == "draft_model":
            if ctx.draft is None:
                raise PlaygroundError(f"{decoder}: drafter 'draft_model' needs a draft model, and none was given")
            out.append(DraftModelDrafter(state_of(), draft_cost))
        elif s.kind == "prompt_lookup":
            out.append(LookupDrafter())
        else:
            if L < 2:
                raise PlaygroundError(f"{decoder}: drafter {s.label!r} needs a model with at least 2 layers; "
                                      f"{ctx.target.name!r} has {L}")
            k = s.exit_layer or max(1, L // 2)
            if k >= L:
                raise PlaygroundError(f"{decoder}: drafter {s.label!r}: exit layer {k} must be below the "
                                      f"model's {L} layers")
            out.append(LayerSkipDrafter(s.label, k, L))
    return out


def drafter_reward(committed: int, drafted: int, cost: float, gamma: int, costs: Sequence[float]) -> float:
    """Tokens per unit of modelled time, in [0, 1]: a round costs one target forward plus
    ``cost`` (the pulled drafter's) per drafted token, so the reward is
    committed / (1 + cost · drafted), divided by the best any arm could earn (all γ + 1
    tokens committed by the cheapest drafter). Every cost is at most 1 (``draft_cost`` ≤ 1,
    k / L < 1), so (d + 1) / (1 + c · d) grows with d and no round can beat that best."""
    best = max((gamma + 1) / (1.0 + c * gamma) for c in costs)
    return committed / (1.0 + cost * drafted) / best

