"""Contrastive decoding between an expert and an amateur model (Li et al. 2023)."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from decoders.ar import ARState, draw, token_loop
from decoders.base import Context, Decoder, Float, Int, Params, lens_param, register
from decoders.beam_batch import BIG, BatchState, group_beam_search
from decoders.citation import arxiv
from decoders.contrastive._common import contrast_evidence
from playground.core.errors import PlaygroundError
from playground.core.trace import Step

# sources cited by more than one decoder, named once so they cannot drift apart
CD_PAPER = arxiv("Li et al. 2023, Contrastive Decoding: Open-ended Text Generation as "
                 "Optimization (ACL)", "2210.15097")

# An amateur probability of exactly 0 would give an infinite score; this floor keeps the
# score finite (and such a token still wins by any margin a real probability could give).
_LOGP_FLOOR = -1e4


def cd_scores(expert_logits: torch.Tensor, amateur_logits: torch.Tensor, alpha: float,
              beta: float, amateur_temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The contrastive-decoding score of every token and the plausible set.

    plausible = {v : p_e(v) >= alpha · max p_e}; score(v) = log p_e(v) - beta · log p_a(v) on
    it, -inf elsewhere, where p_a is the amateur's softmax at ``amateur_temperature`` τ
    (Li et al. sharpen the amateur with τ < 1: p_a = softmax(logits_a / τ)). The last axis is
    the vocabulary: (V,) for one position, (rows, V) for a batch of beams.
    """
    le = torch.log_softmax(expert_logits.float(), -1)
    la = torch.log_softmax(amateur_logits.float() / amateur_temperature, -1).clamp(min=_LOGP_FLOOR)
    # per row: a batch of beams has one plausible set each
    cut = le.max(-1, keepdim=True).values + (math.log(alpha) if alpha > 0 else -math.inf)
    plausible = torch.isfinite(le) & (le >= cut)
    return torch.where(plausible, le - beta * la, torch.full_like(le, -math.inf)), plausible


class ContrastRows:
    """The amateur beside a batch of beams: each row's contrastive scores (:func:`cd_scores`)
    for :func:`decoders.beam_batch.group_beam_search`, outside the plausible set at -BIG."""

    def __init__(self, amateur: Any, prompt_ids: list[int], rows: int, vocab: int, alpha: float, beta: float,
                 tau: float) -> None:
        self.state = BatchState(amateur, prompt_ids, rows)
        self.logits = self.state.first[None].expand(rows, -1)
        self.vocab, self.alpha, self.beta, self.tau = vocab, alpha, beta, tau

    def scores(self, logprobs: torch.Tensor) -> torch.Tensor:
        """(rows, V) contrastive scores from the expert's log-probabilities."""
        v = self.vocab
        s, _plausible = cd_scores(logprobs[:, :v], self.logits[:, :v].float().cpu(), self.alpha, self.beta, self.tau)
        out = torch.full_like(logprobs, -BIG)
        out[:, :v] = torch.where(torch.isfinite(s), s, torch.full_like(s, -BIG))
        return out

    def reorder(self, rows: Any) -> None:
        """Follow the beams' reordering."""
        self.state.reorder(rows)

    def advance(self, tokens: Any) -> None:
        """Feed each row's token to the amateur."""
        self.logits = self.state.advance(tokens)


# the beam knobs contrastive beams run with (transformers' defaults)
_BEAM_SETTINGS = {"length_penalty": 1.0, "early_stopping": "false", "num_return_sequences": 1, "patience": 1.0}


@register
class Contrastive(Decoder):
    """Contrastive decoding: the expert's tokens the amateur does not also like.

    Algorithm (Li et al. 2023, eq. 2-4), at every step, with p_e the lane's model (the
    expert) and p_a the draft-slot model (the amateur; the bundled default is
    ``tiny-shakespeare-draft``):

    1. V_head = {v : p_e(v | x<t) >= ``alpha`` · max_w p_e(w | x<t)}, the plausibility constraint;
    2. score(v) = log p_e(v | x<t) - ``beta`` · log p_a(v | x<t) for v in V_head, -inf elsewhere,
       with p_a the amateur's softmax at ``amateur_temperature`` τ (the paper's τ; its runs
       use 0.5 and 1.0);
    3. ``temperature`` 0: x_t = argmax score (greedy over the contrast); otherwise draw x_t
       from softmax(score / ``temperature``) with the run's common random numbers.

    ``num_beams`` > 1 searches the objective with beam search, as the paper does (at
    ``temperature`` 0): each beam accumulates the step scores above, the amateur kept row for
    row beside the expert's beams; finished hypotheses rank by summed score / length
    (transformers' beam rules, :mod:`decoders.beam_batch`). ``num_beams`` 1 takes the best token
    per step (greedy over the contrast).

    ``beta`` = 1 is exactly Li et al.'s log p_e - log p_a; ``beta`` = 0 is greedy on the
    expert. O'Brien & Lewis (2023) write the score as (1 + b)·s_e - b·s_a on logits, which
    ranks tokens as ``beta`` = b / (1 + b) does (a logit differs from its log-probability by
    a constant per step); its ``temperature`` is theirs divided by 1 + b. Both models
    advance one token per step: the amateur's forwards count as draft forwards. Each step
    records the expert, amateur and contrast distributions and which tokens changed rank;
    ``logit_lens`` records the expert's layers.
    """

    name = "contrastive"
    family = "contrastive"
    kind = "causal"
    needs_draft = True
    params = Params(
        alpha=Float(0.1, 0.0, 1.0, "plausibility: keep tokens with p_expert >= alpha · max p_expert"),
        beta=Float(1.0, 0.0, 10.0, "amateur weight: score = log p_expert - beta · log p_amateur"),
        temperature=Float(0.0, 0.0, 10.0, "0 = greedy over the contrast; else sample softmax(score / T)"),
        amateur_temperature=Float(1.0, 0.05, 10.0, "τ: the amateur's softmax temperature in the score "
                                                    "(below 1 sharpens it; the paper uses 0.5 and 1.0)"),
        num_beams=Int(1, 1, 16, "1 = greedy over the contrast; more = beam search over the summed contrast "
                                "score (temperature 0 only)"),
        logit_lens=lens_param(),
    )
    reference = ("Li et al. 2023, Contrastive Decoding: Open-ended Text Generation as Optimization (ACL); "
                 "O'Brien & Lewis 2023, Contrastive Decoding Improves Reasoning in Large Language Models")
    papers = (
        CD_PAPER,
        arxiv("O'Brien & Lewis 2023, Contrastive Decoding Improves Reasoning in Large Language "
              "Models", "2309.09117"),
    )
    description = "Expert minus amateur log-probabilities over the expert's plausible tokens"

    def run(self, ctx: Context) -> Iterator[Step]:
        expert, amateur = ctx.target, ctx.draft
        if amateur is None:
            raise PlaygroundError("decoder 'contrastive' needs an amateur model in the draft slot (--draft)")
        vocab = min(expert.vocab_size, amateur.vocab_size)
        if len(expert.tokenizer) > vocab:
            raise PlaygroundError(f"amateur {amateur.name!r} scores {amateur.vocab_size} tokens and the expert "
                                  f"{expert.vocab_size}; contrastive decoding needs one vocabulary")
        need = len(ctx.prompt_ids) + ctx.max_new_tokens
        if need > amateur.context_length:
            raise PlaygroundError(f"prompt plus max_new_tokens ({need} tokens) exceeds the context of the "
                                  f"amateur {amateur.name!r} ({amateur.context_length} tokens)")
        alpha, beta, temp = (float(ctx.params[k]) for k in ("alpha", "beta", "temperature"))
        tau = float(ctx.params["amateur_temperature"])
        beams = int(ctx.params["num_beams"])
        if beams > 1:
            if temp != 0.0:
                raise PlaygroundError("contrastive beam search (num_beams > 1) runs at temperature 0")
            rows = ContrastRows(amateur, list(ctx.prompt_ids), beams, vocab, alpha, beta, tau)
            yield from group_beam_search(self, ctx, beams, 1, 0.0, scorer=rows, settings=_BEAM_SETTINGS)
            return
        state = ARState(amateur)
        evidence: dict[str, Any] = {}

        def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
            # the amateur is fed lazily, so it runs exactly as many forwards as the expert
            a_logits = state.prefill(ctx.prompt_ids) if pos == 0 else state.advance(out[-1:])
            e, a = logits[:vocab], a_logits[:vocab].to(logits.device)
            score, plausible = cd_scores(e, a, alpha, beta, tau)
            if temp == 0.0:
                tok = int(torch.argmax(score))
                final = torch.zeros_like(logits, dtype=torch.float32)
                final[tok] = 1.0
                contrast = torch.softmax(score, -1)
            else:
                scaled = score / temp
                contrast = torch.softmax(scaled, -1)
                tok = draw(ctx, pos, contrast, scaled)
                final = torch.zeros_like(logits, dtype=torch.float32)
                final[:vocab] = contrast
            evidence["contrast"] = contrast_evidence(
                expert, {"expert": torch.softmax(e, -1), "amateur": torch.softmax(a / tau, -1), "contrast": contrast},
                tok, ctx.top_k_evidence, scores=score)
            evidence["contrast"]["plausible"] = int(plausible.sum())
            return final, tok

        for step in token_loop(ctx, pick, self):
            step.evidence["contrast"] = evidence["contrast"]
            yield step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        # beta = 0 leaves the expert alone: greedy at temperature 0, the expert's own
        # distribution at temperature 1 with no plausibility cut
        t = params["temperature"]
        return (params["beta"] != 0 or t not in (0.0, 1.0) or (t == 1.0 and params["alpha"] > 0)
                or params.get("num_beams", 1) > 1)
