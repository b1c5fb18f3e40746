"""``beam`` and ``diverse_beam``: beam search with transformers 5's rules, and its Hamming-diverse
group variant."""

from __future__ import annotations

from typing import Iterator

from decoders.base import Context, Decoder, Float, Int, register
from decoders.citation import Paper, arxiv
from decoders.constraint import constraint_params
from decoders.beam_batch import BeamParams, _beam_knobs, group_beam_search
from playground.core.trace import Step


@register
class Beam(Decoder):
    """Beam search with transformers 5's rules (``generate(num_beams=k, do_sample=False)``).

    Implements: top-``max(2, 1 + #stop tokens) * k`` expansion, finished-hypothesis pool with
    length penalty ``logprob / len^length_penalty``, ``early_stopping`` true/false/never and
    transformers' early-stop heuristic; verified token for token against ``generate``.
    ``patience`` (Kasai et al. 2022) counts the search as finished only at
    ``ceil(patience * k)`` finished hypotheses: 1.0 is transformers' behaviour, larger
    values search on past the first k finishes, smaller ones stop sooner.
    The output is the best finished hypothesis; the ``num_return_sequences`` best are in
    ``stats.sequences``. Simplifies: no logits processors inside the search; one prompt.
    """

    name = "beam"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = BeamParams(**_beam_knobs(4, 1), **constraint_params(words=False))
    reference = ("Beam search (Lowerre 1976; Graves 2012; Sutskever et al. 2014); transformers 5 semantics; "
                 "Kasai et al. 2022, A Call for Clarity in Beam Search: How It Works and When It Stops (patience)")
    papers = (
        Paper("Lowerre 1976, The Harpy Speech Recognition System (PhD thesis, CMU)", None),
        arxiv("Graves 2012, Sequence Transduction with Recurrent Neural Networks", "1211.3711"),
        arxiv("Sutskever et al. 2014, Sequence to Sequence Learning with Neural Networks "
              "(NeurIPS)", "1409.3215"),
        arxiv("Kasai et al. 2022, A Call for Clarity in Beam Search: How It Works and When It "
              "Stops (patience; LREC-COLING 2024)", "2204.05424"),
    )
    description = "Keep the k best partial sequences; return the best finished one"

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        yield from group_beam_search(self, ctx, p["num_beams"], 1, 0.0)


@register
class DiverseBeam(Decoder):
    """Diverse beam search (Vijayakumar et al. 2018) with Hamming diversity.

    The beams are split into ``num_beam_groups`` groups of equal size, each a beam search
    of its own (transformers' rules, see :class:`Beam`). At every step the groups are
    expanded in order, and group ``g`` has each token's log-probability lowered by
    ``diversity_penalty`` times the number of beams of groups ``0..g-1`` that chose it at
    this step; the penalised scores accumulate, as in the paper's doubly greedy objective
    and transformers 4's group beam search. The output is the best finished hypothesis of
    any group. Simplifies: Hamming diversity only (no n-gram or embedding diversity).
    """

    name = "diverse_beam"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = BeamParams(**_beam_knobs(4, 2),
                        num_beam_groups=Int(2, 1, 64, "groups the beams are split into"),
                        diversity_penalty=Float(1.0, 0.0, 20.0, "penalty per earlier-group choice of a token"))
    reference = ("Vijayakumar et al. 2018, Diverse Beam Search: Decoding Diverse Solutions from "
                 "Neural Sequence Models (AAAI)")
    papers = (
        arxiv("Vijayakumar et al. 2018, Diverse Beam Search: Decoding Diverse Solutions from "
              "Neural Sequence Models (AAAI)", "1610.02424"),
    )
    description = "Beam groups penalised for choosing what earlier groups chose at the same step"

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        yield from group_beam_search(self, ctx, p["num_beams"], p["num_beam_groups"], p["diversity_penalty"])
