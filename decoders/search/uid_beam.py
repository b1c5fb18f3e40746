"""``uid_beam``: beam search regularised towards uniform information density."""

from __future__ import annotations

from typing import Iterator

from decoders.base import Context, Decoder, Float, register
from decoders.citation import arxiv
from decoders.beam_batch import BeamParams, _beam_knobs, group_beam_search
from playground.core.trace import Step


@register
class UidBeam(Decoder):
    """Beam search with the UID regulariser (Meister, Cotterell & Vieira 2020).

    Hypotheses are ranked by ``log p(y) - lam * Var(surprisal)``, where the variance is over
    the per-token surprisals ``-log p(y_t | y_<t)`` of the hypothesis so far: among equally
    likely continuations it prefers the one that spreads information evenly. Everything else
    is :class:`~decoders.search.beam.Beam` (transformers' expansion, pool, length penalty on
    the regularised score, early stopping, patience); ``lam = 0`` is ``beam`` bit for bit.
    Steps carry each beam's summed ``logprob`` beside its regularised ``score`` and a ``uid``
    field with the best hypothesis's surprisal curve, drawn as the run's surprisal view.
    Simplifies: only the variance regulariser of the paper (not the max or squared ones).
    """

    name = "uid_beam"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = BeamParams(**_beam_knobs(4, 1),
                        lam=Float(1.0, 0.0, 50.0, "weight of the surprisal variance subtracted from log p "
                                                  "(0 = plain beam search)"))
    reference = ("Meister, Cotterell & Vieira 2020, If Beam Search is the Answer, What was the Question? "
                 "(EMNLP; UID regulariser)")
    papers = (
        arxiv("Meister, Cotterell & Vieira 2020, If Beam Search is the Answer, What was the "
              "Question? (EMNLP)", "2010.02650"),
    )
    description = "Beam search ranked by log p minus the variance of the surprisals (uniform information density)"

    def is_lossy(self, params: dict) -> bool:
        return False

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        yield from group_beam_search(self, ctx, p["num_beams"], 1, 0.0, uid_lam=float(p["lam"]))
