"""Family ``sampling``: greedy decoding (the reference every lossless decoder must match)."""

from __future__ import annotations

from typing import Iterator

from decoders.ar import greedy_probs, token_loop
from decoders.base import Context, Decoder, Params, register
from playground.trace import Step


@register
class Greedy(Decoder):
    """Greedy decoding: always the most probable next token (argmax, lowest id on ties)."""

    name = "greedy"
    family = "sampling"
    kind = "causal"
    params = Params()
    reference = "Argmax decoding (the temperature-0 limit of sampling)"
    lossless = True

    def run(self, ctx: Context) -> Iterator[Step]:
        yield from token_loop(ctx, lambda logits, pos, out: greedy_probs(logits), self)
