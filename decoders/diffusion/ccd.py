"""CCD: history-consistent commits for masked-diffusion decoding (a plan of the second wave).

The rule (:func:`ccd_select`) is a pure function of per-position numbers so the tests can
recompute every step from the trace; :class:`CCD` keeps the per-position history between
steps and :class:`CCDDecoder` registers the decoder ``ccd``. The loop, token proposals and
step layout are the shared ones of ``decoders.diffusion._rules``.
"""

from __future__ import annotations

from typing import Any

import torch

from decoders.base import Context, Float, Int, Params, register
from decoders.citation import Paper
from decoders.diffusion._canvas import Layout, r5
from decoders.diffusion._rules import Rule, Streaks, positions
from decoders.diffusion._sampler import Proposal, top_k_positions
from decoders.diffusion.fixed import fixed_param
from decoders.diffusion.named import block_length, cfg_scale, gen_length, temperature
from decoders.diffusion.plans import RuleDecoder

WINDOW_MAX = 8  # longer windows only delay every commit on a canvas this size


def ccd_select(conf: torch.Tensor, counts: torch.Tensor, ok: torch.Tensor, window: int,
               floor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """CCD's commit set over the masked positions: (commit, consistent, rejected, fallback).

    ``counts[i]`` is how many consecutive recorded steps, this one included, position ``i``'s
    argmax has stayed the same; ``ok`` marks the positions the step may commit (the block).
    A position is *consistent* when its count reaches ``window``; the step commits every
    consistent ``ok`` position whose confidence is strictly above ``floor``, so the budget
    is the number of such positions. *Rejected* are the ``ok`` positions above the floor
    that are not consistent (a threshold plan would have committed them). When nothing
    qualifies, the single most confident ``ok`` position is committed (``fallback`` True;
    ties: leftmost), consistent or not, so every step commits at least one position.
    """
    consistent = ok & (counts >= window)
    confident = ok & (conf > floor)
    commit = consistent & confident
    rejected = confident & ~consistent
    fallback = False
    if not bool(commit.any()):
        idx = ok.nonzero().squeeze(1)
        if idx.numel():
            commit[idx[top_k_positions(conf[idx], 1)]] = True
            fallback = True
    return commit, consistent, rejected, fallback


class CCD(Rule):
    """History-consistent commits: per position, the run of steps its argmax has held; commit
    the block's consistent positions above the confidence floor, else the most confident."""

    def __init__(self, window: int, floor: float) -> None:
        self.window, self.floor = window, floor

    def start(self, ctx: Context, lay: Layout) -> None:
        self.history = Streaks(lay.gen_length)
        self.rejected_total = 0
        self.fallbacks = 0
        self.flips = 0

    def select(self, ctx: Context, lay: Layout, prop: Proposal, eligible: torch.Tensor,
               block: tuple[int, int]) -> tuple[torch.Tensor, dict[str, Any]]:
        pos = prop.pos.tolist()
        argmax = prop.top1.tolist()
        # a flip is an argmax that differs from the one this position held at the previous
        # recorded step; the first record of a position is no flip
        flipped = [p for p, t in zip(pos, argmax) if self.history.token[p] not in (-1, t)]
        self.history.update(pos, argmax, prop.conf.tolist())
        counts = torch.tensor([self.history.count[p] for p in pos], dtype=torch.long)
        commit, consistent, rejected, fallback = ccd_select(prop.conf, counts, eligible, self.window,
                                                            self.floor)
        self.rejected_total += int(rejected.sum())
        self.fallbacks += fallback
        self.flips += len(flipped)
        g = lay.gen_length
        counters: list[int | None] = [None] * g
        tops: list[int | None] = [None] * g
        for p, t in zip(pos, argmax):
            counters[p], tops[p] = self.history.count[p], int(t)
        chosen = commit.nonzero().squeeze(1)
        return chosen, {
            "plan": {"plan": "ccd", "threshold": r5(self.floor)},
            "ccd": {"consistent": positions(prop, consistent.nonzero().squeeze(1)),
                    "rejected": positions(prop, rejected.nonzero().squeeze(1)),
                    "flipped": sorted(flipped), "budget": int(chosen.numel()), "fallback": fallback,
                    "window": self.window, "floor": r5(self.floor)},
            # per position, like R²'s ``stability``: the argmax the history tracks and its run
            "consistency": counters,
            "argmax": tops,
        }

    def stats(self) -> dict[str, Any]:
        return {"rejected_inconsistent": self.rejected_total, "fallback_steps": self.fallbacks,
                "argmax_flips": self.flips}


@register
class CCDDecoder(RuleDecoder):
    """CCD (A229): commit only predictions that have held over the last few denoising steps,
    with a per-step budget that follows how many of them are consistent.

    The paper's rule: keep the model's predictions over a history of recent steps, treat a
    masked position whose prediction is consistent over that history as safe to finalise
    and reject a path whose prediction flips, and let the number of positions unmasked per
    step adapt to that consistency. Ours is a simplification: consistency is the argmax
    token staying the same for the last ``window`` recorded steps (not a divergence between
    the history's distributions), and the budget is every consistent position in the block
    whose confidence is above ``floor``; with none, the single most confident position of
    the block commits (the one exception to consistency, so the run always ends within
    ``gen_length`` steps). The committed token is the proposed one, the argmax at
    ``temperature`` 0. ``window`` 1 is ``fast_dllm`` with ``threshold`` = ``floor``.
    Evidence per step: every masked position's consistency counter and argmax, the
    consistent positions, those rejected for inconsistency (above the floor, not yet
    consistent), the argmax flips, the budget and whether it fell back. The *Unmasking
    heatmap* and *Commits per step* show the order and budget.
    """

    name = "ccd"
    description = "CCD: commit predictions whose argmax held for the last h steps (adaptive budget)"
    reference = ("Coherent contextual decoding for diffusion LMs: history-consistent commits with an "
                 "adaptive unmasking budget (A229)")
    papers = (
        Paper("Beyond Confidence: Adaptive and Coherent Decoding for Diffusion Language Models "
              "(CCD, 2025)",
              "https://huggingface.co/papers?q=Beyond+Confidence+Adaptive+and+Coherent+Decoding"),
    )
    params = Params(
        gen_length=gen_length(), block_length=block_length(),
        window=Int(2, 1, WINDOW_MAX, "history window h: a position commits only once its argmax has "
                                     "been the same for the last h steps; 1 = fast_dllm"),
        floor=Float(0.5, 0.0, 1.0, "confidence floor: consistent positions commit when their "
                                   "confidence exceeds this"),
        temperature=temperature(), cfg_scale=cfg_scale(),
        fixed=fixed_param(),
    )

    def rule(self, p: dict[str, Any]) -> Rule:
        return CCD(int(p["window"]), float(p["floor"]))
