"""The canvas of a masked-diffusion run: layout rules, model calls, step evidence, output.

The canvas is the prompt ids followed by ``gen_length`` mask ids. Positions in this module
and in the trace are **relative to the generated part** (0 = first generated position); the
prompt is never part of a step's ``canvas``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from decoders.base import Context
from playground.core.errors import PlaygroundError
from playground.core.settings import limits


@dataclass(frozen=True)
class Layout:
    """Sizes of one run: prompt, canvas, blocks and steps.

    ``steps_per_block`` is 0 for plans whose number of steps is decided on the fly
    (confidence thresholds), which then take at most ``block_length`` steps per block.
    """

    prompt_len: int
    gen_length: int
    block_length: int
    num_blocks: int
    steps_per_block: int
    mask_id: int

    @property
    def total_steps(self) -> int:
        """Steps of a fixed schedule over all blocks (0 when the plan decides on the fly)."""
        return self.steps_per_block * self.num_blocks

    def block(self, b: int) -> tuple[int, int]:
        """Half-open range ``[start, end)`` of block ``b`` in generated positions."""
        return b * self.block_length, (b + 1) * self.block_length


def make_layout(ctx: Context, gen_length: int, steps: int, block_length: int,
                fixed_steps: bool = True) -> Layout:
    """Check the gen_length / steps / block_length rules and return the layout.

    ``gen_length`` 0 means ``ctx.max_new_tokens``; ``block_length`` 0 means one block;
    ``steps`` 0 means ``gen_length`` (one token per step). The rules are LLaDA's:
    ``gen_length % block_length == 0`` and ``steps % num_blocks == 0``; in addition a block
    may not have more steps than positions (a step that can commit nothing is wasted).
    """
    view = ctx.target
    mask_id = getattr(view, "mask_token_id", None)
    if mask_id is None:
        raise PlaygroundError(f"model {getattr(view, 'name', '?')!r} has no mask token; "
                              "a diffusion decoder needs one")
    g = int(gen_length) or int(ctx.max_new_tokens)
    if g < 1:
        raise PlaygroundError("gen_length must be at least 1")
    lim = limits()
    if g > lim.max_new_tokens:
        raise PlaygroundError(f"gen_length={g} is over this instance's limit of {lim.max_new_tokens}")
    b = int(block_length) or g
    if b > g:
        raise PlaygroundError(f"block_length ({b}) is longer than gen_length ({g})")
    if g % b:
        raise PlaygroundError(f"gen_length ({g}) must be a multiple of block_length ({b})")
    n = g // b
    spb = 0
    if fixed_steps:
        s = int(steps) or g
        if s % n:
            raise PlaygroundError(f"steps ({s}) must be a multiple of the number of blocks "
                                  f"(gen_length / block_length = {g} / {b} = {n})")
        spb = s // n
        if spb > b:
            raise PlaygroundError(f"steps per block ({s} / {n} = {spb}) exceed block_length ({b}); "
                                  "use at most gen_length steps in all")
    p = len(ctx.prompt_ids)
    ctx_len = int(getattr(view, "context_length", 0) or 0)
    if "roberta" in (getattr(getattr(view, "config", None), "model_type", "") or ""):
        ctx_len -= 2  # RoBERTa's positions start after its padding index (pad + 1)
    if ctx_len and p + g > ctx_len:
        raise PlaygroundError(f"prompt ({p} tokens) plus gen_length ({g}) exceeds the context of "
                              f"{getattr(view, 'name', 'the model')!r} ({ctx_len} tokens)")
    return Layout(prompt_len=p, gen_length=g, block_length=b, num_blocks=n,
                  steps_per_block=spb, mask_id=int(mask_id))


def new_canvas(ctx: Context, lay: Layout) -> torch.Tensor:
    """Prompt ids followed by ``gen_length`` mask ids (1-D, long, on CPU)."""
    return torch.tensor(list(ctx.prompt_ids) + [lay.mask_id] * lay.gen_length, dtype=torch.long)


def gen_logits(view: Any, canvases: torch.Tensor, lay: Layout, cfg_scale: float = 0.0) -> torch.Tensor:
    """One counted forward pass over a batch of canvases; logits of the generated part.

    ``canvases`` is (T,) or (B, T); returns float32 (B, gen_length, V) on CPU. With
    ``cfg_scale`` > 0 each canvas is paired with a copy whose prompt is re-masked and the
    logits are combined as LLaDA does, ``un + (cfg + 1) * (cond - un)``: still one call.
    Logits of a shifted model (Dream) are already shifted back by the handle.
    """
    x = canvases.unsqueeze(0) if canvases.dim() == 1 else canvases
    nb, p = x.shape[0], lay.prompt_len
    if cfg_scale > 0:
        un = x.clone()
        un[:, :p] = lay.mask_id
        x = torch.cat([x, un], 0)
    logits = view.forward(x).logits[:, p:].float().cpu()
    if cfg_scale > 0:
        cond, uncond = logits[:nb], logits[nb:]
        logits = uncond + (cfg_scale + 1.0) * (cond - uncond)
    return logits


def r5(v: float) -> float | None:
    """A float rounded for the trace, or None where it is not finite (JSON has no inf)."""
    v = float(v)
    return round(v, 5) if math.isfinite(v) else None


def per_position(g: int, pos: Sequence[int], values: Iterable[float]) -> list[float | None]:
    """A length-``g`` list with ``values`` at ``pos`` and None elsewhere."""
    out: list[float | None] = [None] * g
    for p, v in zip(pos, values):
        out[p] = r5(v)
    return out


def stop_set(ctx: Context) -> set[int]:
    """Ids that end an output: the model's EOS ids and its pad id."""
    ids = set(int(i) for i in getattr(ctx.target, "eos_ids", set()) or set())
    pad = getattr(ctx.target.tokenizer, "pad_token_id", None)
    if isinstance(pad, int):
        ids.add(pad)
    return ids


def trim_output(ids: Sequence[int], eos_ids: set[int], pad_ids: set[int]) -> tuple[list[int], str]:
    """The output of a finished canvas and its finish reason.

    A diffusion model fills the whole canvas, and a short answer ends in a run of EOS/pad
    tokens (LLaDA pads with EOS). That trailing run is cut; if it starts with an EOS, that
    one EOS is kept so the output ends on its stop token as a causal model's does
    (reason ``eos``). Tokens before the run are kept, EOS included, because the model wrote
    text after them. Every step's ``canvas`` in the trace keeps the full canvas, so the cut
    is visible (the demos' "shrinking output" is this cut, done silently there).
    """
    ids = [int(i) for i in ids]
    end = len(ids)
    ends = eos_ids | pad_ids
    while end > 0 and ids[end - 1] in ends:
        end -= 1
    if end == len(ids):
        return ids, "length"
    if ids[end] in eos_ids:
        return ids[:end + 1], "eos"
    return ids[:end], "eos" if any(t in eos_ids for t in ids[end:]) else "length"


def finish(decoder: Any, ctx: Context, lay: Layout, gen: Sequence[int], commit_step: list[int],
           per_step: list[int], **more: Any) -> None:
    """Set the decoder's output (the trimmed canvas), finish reason and diffusion stats."""
    eos = set(int(i) for i in getattr(ctx.target, "eos_ids", set()) or set())
    out, reason = trim_output(gen, eos, stop_set(ctx) - eos)
    decoder.output_override = out
    decoder.finish_reason = reason
    steps = len(per_step)
    decoder.extra_stats = {
        "steps": steps,
        "gen_length": lay.gen_length,
        "block_length": lay.block_length,
        "tokens_per_step": round(lay.gen_length / steps, 4) if steps else 0.0,
        "commits_per_step": list(per_step),
        "commit_step": list(commit_step),
        "trimmed_tokens": lay.gen_length - len(out),
        "left_to_right": left_to_right(commit_step),
        **more,
    }


def left_to_right(commit_step: Sequence[int]) -> float:
    """Share of positions committed no later than every position to their left.

    1.0 means the unmasking order was in effect left to right (what Dream users saw
    "silently collapse" with temperature); a random order scores much lower.
    """
    if not commit_step:
        return 0.0
    hits, latest = 0, -1
    for s in commit_step:
        if s >= latest:
            hits += 1
        latest = max(latest, s)
    return round(hits / len(commit_step), 4)
