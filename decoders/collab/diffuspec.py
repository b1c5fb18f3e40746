"""``diffuspec``: a masked-diffusion LM drafts a block for a causal target, which verifies it in
one pass (lossless)."""

from __future__ import annotations

from typing import Any

import torch

from decoders.ar import sample_index
from decoders.base import Context, Int, PlaygroundError, register
from decoders.citation import arxiv
from decoders.draft_state import fit_logits
from decoders.draft_tree import ROOT, SpecDecoder, SpecParams, Tree, Verified, sampling_params
from playground.core.trace import Step


def chunks(n: int, steps: int) -> list[range]:
    """``n`` block positions split left to right into ``steps`` nearly equal chunks."""
    steps = max(1, min(steps, n))
    sizes = [n // steps + (1 if i < n % steps else 0) for i in range(steps)]
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


@register
class DiffuSpec(SpecDecoder):
    """DiffuSpec: a masked-diffusion LM drafts a block, the causal target verifies it in one pass.

    The diffusion model (draft slot) sees the committed text followed by ``gamma`` mask
    tokens and fills the block in ``draft_steps`` denoising forwards, left to right: step
    ``s`` reads the canvas and draws every position of its chunk from the diffusion model's
    (chain-processed) distribution there, independently, the mask token excluded. The target
    then scores the whole block in one forward and the block is verified by speculative
    sampling (accept ``x`` with ``min(1, p(x)/q(x))``, resample from ``norm(max(0, p - q))`` at
    the first rejection, a bonus token when all stand). Because each drafted token's law ``q``
    depends only on the tokens left of its chunk — all of which precede it on the accepted
    path — the check is exact: the output follows the target's distribution (its greedy text
    at temperature 0). The draft view shows the diffusion canvas after every denoising step
    (``draft_canvas``) beside the verified draft tree.
    Simplifies: the paper's causal-consistency path search over several candidates per
    position is replaced by one left-to-right chain (which keeps the check exact); the
    draft length is fixed (no adaptive length controller).
    """

    name = "diffuspec"
    family = "collab"
    needs_draft = True
    draft_kind = "diffusion"
    lossless = True
    reference = ("Li et al. 2025, DiffuSpec: Unlocking Diffusion Language Models for Speculative Decoding "
                 "(arXiv:2510.02358)")
    papers = (
        arxiv("Li et al. 2025, DiffuSpec: Unlocking Diffusion Language Models for Speculative "
              "Decoding", "2510.02358"),
    )
    description = "A masked-diffusion LM drafts a block, the causal target verifies it in one pass (lossless)"
    params = SpecParams(
        gamma=Int(6, 1, 32, "tokens the diffusion model drafts per block"),
        draft_steps=Int(2, 1, 32, "denoising forwards per block (left-to-right chunks; 1 = all positions at once)"),
        **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        view = ctx.draft
        if view is None or getattr(view, "kind", None) != "diffusion":
            raise PlaygroundError("decoder 'diffuspec' needs a masked-diffusion model in the draft slot (--draft)")
        if view.mask_token_id is None:
            raise PlaygroundError(f"draft model {view.name!r} has no mask token; diffuspec needs one")
        need = len(ctx.prompt_ids) + ctx.max_new_tokens + int(ctx.params["gamma"])
        if need > view.context_length:
            raise PlaygroundError(f"prompt plus max_new_tokens plus gamma ({need} tokens) exceeds the context of "
                                  f"the diffusion draft {view.name!r} ({view.context_length} tokens)")
        self.canvases: list[dict[str, Any]] = []

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        tree = Tree()
        self.canvases = []
        g = min(int(ctx.params["gamma"]), max_depth)
        if g <= 0:
            return tree
        view, mask = ctx.draft, int(ctx.draft.mask_token_id)
        V = ctx.target.vocab_size
        base = self.committed_ids
        block: list[int | None] = [None] * g
        parent = ROOT
        for step, part in enumerate(chunks(g, int(ctx.params["draft_steps"]))):
            canvas = base + [mask if t is None else t for t in block]
            logits = fit_logits(view.forward(canvas).logits[0].float(), V)
            # the chunk's positions read the same canvas: independent draws given the text left of the chunk
            left = [t for t in block[: part.start]]
            for i in part:
                row = logits[len(base) + i].clone()
                if mask < V:
                    row[mask] = float("-inf")
                q = self.chain.probs(row, self.history(ctx, left))
                qr = torch.softmax(row, -1) if self.greedy else q
                x = sample_index(q, self.next_uniform(ctx, "draft"))
                tree.dists[parent], tree.rule_q[parent] = q, qr
                parent = tree.add(x, parent, float(qr[x]), "diffusion")
                block[i] = x
            self.canvases.append({"step": step, "unmasked": list(part), "canvas": list(block)})
        return tree

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        step.evidence["draft_canvas"] = {"mask_id": int(ctx.draft.mask_token_id), "steps": self.canvases}
        return step
