"""``bregman_top_k``: top-k sampling whose k is chosen per step by an l0-regularised Bregman
projection (A004), with the chosen k, the loss-vs-k curve and the binary search's probes as
evidence.

It is a sampling-family decoder; it lives here because the sampling family is one module
(``decoders/sampling.py``) and its rule, :class:`decoders.processors.BregmanTopK`, is not one
of the shared chain's built-in rules.
"""

from __future__ import annotations

from typing import Any, Iterator

from decoders.ar import token_loop
from decoders.base import Choice, Context, Decoder, Float, Int, Params, lens_param, register
from decoders.citation import Paper
from decoders.constraint import constraint_params
from decoders.processors import BREGMAN_DIVERGENCES, BregmanTopK, Chain, Temperature
from decoders.sampling import add_chain_evidence, chain_picker, coupling_param
from playground.core.trace import Step


@register
class BregmanTopKDecoder(Decoder):
    """Bregman top-k sampling: per step, keep the top ``k`` minimising ``D(q_k, p) + lambda * k``,
    then temperature, then draw with the run's common random numbers.

    ``q_k`` is the best distribution on the top ``k`` (the Bregman projection of ``p`` onto
    that face of the simplex). With ``divergence=kl`` it is ``p`` renormalised there, so the
    loss is ``-log(top-k mass) + lambda * k`` and the step is exactly ``top_k`` with the chosen
    ``k`` (same kept set, same draw under the same seed); ``sq_euclid`` spreads the removed mass
    evenly over the kept tokens instead. Both losses are discretely convex in ``k``, so a
    binary search on the first difference finds the minimiser (see
    :func:`decoders.processors.bregman_search`). ``lambda`` prices each kept token: larger is
    fewer (``lambda >= log 2`` is always greedy under ``kl``), 0 keeps every token up to
    ``k_max``. A token is kept when ``log(1 + p_next / kept mass) > lambda`` under ``kl``,
    so roughly while the next token adds more than a fraction ``lambda`` of the kept mass.

    Simplifies relative to the paper: primal form only, KL and squared Euclidean only (no
    general generator, no dual reweighting), one ``lambda`` for the whole run, and the full
    distribution is sorted each step (the paper counts loss evaluations, O(log K)).
    """

    name = "bregman_top_k"
    family = "sampling"
    kind = "causal"
    params = Params(
        **{"lambda": Float(0.05, 0.0, 1.0, "l0 weight: the loss each kept token costs (larger = fewer; "
                                           "0 = keep up to k_max)")},
        divergence=Choice("kl", BREGMAN_DIVERGENCES, "D(q_k, p): kl (plain top-k renormalised) or sq_euclid "
                                                     "(removed mass spread evenly over the kept tokens)"),
        k_max=Int(0, 0, 1_000_000, "largest k searched; 0 = every live token"),
        temperature=Float(1.0, 0.0, 10.0, "divide logits by this (applied after the cut); 0 = greedy"),
        coupling=coupling_param(),
        logit_lens=lens_param(),
        **constraint_params(healing=True),
    )
    reference = "Bregman top-k: adaptive k from an l0-regularised Bregman projection onto the simplex (A004)"
    papers = (
        # no title or identifier of the paper is known here: the link searches for the method by name
        Paper("Bregman top-k decoders: top-k as an l0-regularised Bregman projection onto the simplex, its loss "
              "discretely convex in k (binary search)", "https://huggingface.co/papers?q=Bregman+top-k+decoding"),
    )
    description = "Top-k with k chosen per step: min over k of D(q_k, p) + lambda k, by binary search"
    shows = ("; plus `bregman` per step: the chosen k, the tokens kept, the loss-vs-k curve and the k values "
             "the binary search read (plot *Bregman loss vs k*)")

    def chain(self, p: dict[str, Any]) -> tuple[Chain, BregmanTopK]:
        """The step's chain (the rule, then temperature as the top-k preset has it) and its rule."""
        rule = BregmanTopK(float(p["lambda"]), str(p["divergence"]), int(p["k_max"]))
        procs: list[Any] = [rule]
        if p["temperature"] != 1.0:
            procs.append(Temperature(float(p["temperature"])))
        return Chain(procs), rule

    def run(self, ctx: Context) -> Iterator[Step]:
        chain, rule = self.chain(ctx.params)
        self.extra_stats["chain"] = chain.labels
        stages: list[list[dict[str, Any]]] = [[]]
        ks: list[int] = []
        for step in token_loop(ctx, chain_picker(ctx, chain, stages), self):
            step = add_chain_evidence(step, stages[0])
            if rule.last is not None:
                step.evidence["bregman"] = rule.last
                ks.append(int(rule.last["k"]))
            yield step
        if ks:
            self.extra_stats["bregman_k"] = {"mean": round(sum(ks) / len(ks), 3), "min": min(ks), "max": max(ks)}

    def is_lossy(self, params: dict[str, Any]) -> bool:
        p = {**self.params.defaults(), **params}
        # lambda 0 without a cap keeps every token: plain sampling at temperature 1
        return bool(p["lambda"] > 0 or p["k_max"] > 0 or p["temperature"] != 1.0)


__all__ = ["BregmanTopKDecoder"]
