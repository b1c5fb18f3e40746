"""FreeDave: lossless self-speculative (draft-and-verify) decoding for masked diffusion LMs.

The reference is *static* decoding: LLaDA with one token per step (``steps = gen_length``),
which at each state commits the single most confident masked position of the current block.
FreeDave reproduces its output exactly with fewer forward calls (A161; SSD A297 is the
same idea with tree-shaped verification):

1. From the logits of the current state ``S``, the static rule's choice ``d1`` is known
   (it is what static decoding commits next). Draft the next ``draft_size - 1`` commits as
   the next most confident positions of the block, with the tokens the same logits give.
2. Verify in **one** forward call with a batch of the nested states ``S+d1``,
   ``S+d1+d2``, ...: the row of ``S+d1..dj`` gives the static rule's choice at that state;
   draft ``d(j+1)`` is accepted if it is exactly that choice (same position, same token).
3. Commit the accepted prefix (always at least ``d1``); the row of the last accepted state
   gives the next round's logits, so every round costs one call.

Sampling at temperature > 0 stays exact because the Gumbel noise of static step ``c`` is
the run's common random numbers keyed by ``c`` and the position, whichever decoder uses it.
One forward call with a batch of ``k`` canvases processes ``k`` times the tokens: the trace
shows both (``target_forwards`` and ``target_tokens_processed``).

Infilling (the ``fixed`` knob, :mod:`decoders.diffusion.fixed`): the fixed words are written
into the canvas before the first forward and are never masked, so neither the drafts nor the
static rule can ever choose them; the reference is then LLaDA with one commit per *masked*
position and the same ``fixed`` (static step ``c`` is still the ``c``-th commit).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

import torch

from decoders.base import Context, Float, Int, Params, register
from decoders.citation import arxiv
from decoders.diffusion._canvas import finish, gen_logits, make_layout, new_canvas
from decoders.diffusion._sampler import Proposal, Recipe, denoise_step, gumbel_tokens, propose, top_k_positions
from decoders.diffusion.fixed import fixed_param, place_fixed
from decoders.diffusion.named import DiffusionDecoder, block_length, gen_length
from playground.core.trace import Step


@register
class FreeDave(DiffusionDecoder):
    """FreeDave (A161): draft several commits from one pass, verify them in one batched pass;
    the output equals one-token-per-step LLaDA decoding exactly, in fewer forward calls."""

    name = "freedave"
    description = "FreeDave: lossless draft-and-verify; equals one-token-per-step decoding, fewer calls"
    reference = "FreeDave: lossless parallel decoding for diffusion LLMs via free draft-and-verification (A161)"
    papers = (
        arxiv("Wu & Zhang 2025, Free Draft-and-Verification: Toward Lossless Parallel Decoding "
              "for Diffusion Large Language Models (FreeDave)", "2510.00294"),
    )
    lossless = True
    params = Params(
        gen_length=gen_length(), block_length=block_length(),
        draft_size=Int(4, 1, 32, "commits drafted (and canvases verified in one batched call) per round"),
        temperature=Float(0.0, 0.0, 2.0, "Gumbel-max temperature of the static decoder it reproduces"),
        fixed=fixed_param(),
    )

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        rc = Recipe(gen_length=p["gen_length"], block_length=p["block_length"], plan="even",
                    temperature=p["temperature"])
        lay = make_layout(ctx, rc.gen_length, 0, rc.block_length)
        view, p0, g, mask = ctx.target, lay.prompt_len, lay.gen_length, lay.mask_id
        x = new_canvas(ctx, lay)
        fixed = place_fixed(ctx, p.get("fixed", ""), g, p0, x)
        # fixed cells are never masked: the static decoder it reproduces commits only the others
        n_static = g - len(fixed)
        extra: dict[str, Any] = {"fixed": fixed} if fixed else {}
        commit_step = [-1] * g
        per_step: list[int] = []
        if not n_static:  # every position fixed: nothing to decode, and no forward is needed
            finish(self, ctx, lay, x[p0:].tolist(), commit_step, per_step, static_steps=0,
                   draft_size=int(p["draft_size"]))
            return
        logits = gen_logits(view, x, lay)[0]
        c = 0  # commits so far = the static decoder's step index
        rnd = 0
        while c < n_static:
            ctx.check_cancel()
            pos = (x[p0:] == mask).nonzero().squeeze(1)
            s0, s1 = self._block(lay, pos)
            prop = propose(ctx, rc, logits, pos, c, c / g, None, {})
            drafts = self._draft(ctx, rc, prop, logits, s0, s1, c, int(p["draft_size"]))
            states = []
            y = x.clone()
            for q, t in drafts:
                y = y.clone()
                y[p0 + q] = t
                states.append(y)
            # the deepest state that still has masks needs a forward (its row = next logits)
            live = [j for j, s in enumerate(states) if bool((s[p0:] == mask).any())]
            accepted = 1
            nxt = None
            if live:
                rows = gen_logits(view, torch.stack([states[j] for j in live]), lay)
                by_state = {j: rows[n] for n, j in enumerate(live)}
                for j in range(len(drafts) - 1):
                    if j not in by_state:
                        break
                    if self._static_choice(ctx, rc, states[j], by_state[j], lay, c + j + 1) != drafts[j + 1]:
                        break
                    accepted += 1
                nxt = by_state.get(accepted - 1)
            keep = torch.tensor([int((prop.pos == q).nonzero()[0, 0]) for q, _ in drafts[:accepted]])
            sub = replace(prop, tokens=prop.tokens.clone())
            for n, (q, t) in enumerate(drafts[:accepted]):
                sub.tokens[keep[n]] = t
            st = denoise_step(lay, x, sub, keep, (s0, s1),
                              draft={"positions": [q for q, _ in drafts], "ids": [t for _, t in drafts],
                                     "accepted": accepted}, **extra)
            for q, _t in drafts[:accepted]:
                commit_step[q] = rnd
            per_step.append(accepted)
            self.output_override = x[p0:].tolist()
            yield st
            c += accepted
            rnd += 1
            if nxt is None and c < n_static:  # cannot happen: a canvas with masks left was forwarded
                raise RuntimeError("freedave lost its logits")
            logits = nxt if nxt is not None else logits
        finish(self, ctx, lay, x[p0:].tolist(), commit_step, per_step,
               static_steps=n_static, draft_size=int(p["draft_size"]))

    @staticmethod
    def _block(lay: Any, pos: torch.Tensor) -> tuple[int, int]:
        """The block static decoding is filling: the first one with a mask left (``pos``, the
        masked positions, ascending and not empty). Counting commits would be wrong once fixed
        cells fill part of a block, or a whole one, before any step."""
        return lay.block(int(pos[0]) // lay.block_length)

    @staticmethod
    def _static_choice(ctx: Context, rc: Recipe, state: torch.Tensor, logits: torch.Tensor,
                       lay: Any, step: int) -> tuple[int, int] | None:
        """(position, token) that one-token-per-step decoding commits at ``state``."""
        p0, mask = lay.prompt_len, lay.mask_id
        pos = (state[p0:] == mask).nonzero().squeeze(1)
        if pos.numel() == 0:
            return None
        s0, s1 = FreeDave._block(lay, pos)
        prop = propose(ctx, rc, logits, pos, step, 0.0, None, {})
        idx = ((prop.pos >= s0) & (prop.pos < s1)).nonzero().squeeze(1)
        best = idx[top_k_positions(prop.score[idx], 1)][0]
        return int(prop.pos[best]), int(prop.tokens[best])

    @staticmethod
    def _draft(ctx: Context, rc: Recipe, prop: Proposal, logits: torch.Tensor, s0: int, s1: int,
               c: int, k: int) -> list[tuple[int, int]]:
        """The static choice now, then the next most confident positions of the block.

        A drafted position's token is re-drawn with the noise of the static step that would
        commit it (step ``c + j``), the best guess at what that step will choose.
        """
        idx = ((prop.pos >= s0) & (prop.pos < s1)).nonzero().squeeze(1)
        order = idx[top_k_positions(prop.score[idx], min(k, int(idx.numel())))]
        out = []
        for j, n in enumerate(order.tolist()):
            q = int(prop.pos[n])
            if j == 0:
                t = int(prop.tokens[n])
            else:
                t = int(gumbel_tokens(ctx, logits[q:q + 1], torch.tensor([q]), c + j, rc.temperature)[0])
            out.append((q, t))
        return out
