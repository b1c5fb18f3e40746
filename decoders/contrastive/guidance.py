"""Classifier-free guidance for causal language models (Sanchez et al. 2023)."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from decoders.ar import ARState, draw, greedy_probs, token_loop
from decoders.base import Choice, Context, Decoder, Float, Params, Text, lens_param, register
from decoders.citation import arxiv
from decoders.contrastive._common import contrast_evidence
from decoders.contrastive.perturb import PERTURBATIONS, perturbed_negative
from playground.core.errors import PlaygroundError
from playground.core.trace import Step


@register
class CFG(Decoder):
    """Classifier-free guidance: move the next-token distribution away from what the model
    predicts without the prompt (or with a negative prompt).

    Algorithm (Sanchez et al. 2023, eq. 7), at every step:

    1. c = log p(v | prompt, x<t), the conditional pass;
    2. u = log p(v | negative, x<t), the unconditional pass: the same model on the negative
       prompt followed by the tokens generated so far; with ``negative_prompt`` empty the
       negative is the last prompt token alone (as transformers does);
    3. x_t = argmax of g = u + ``guidance_scale`` · (c - u) at ``temperature`` 0; otherwise x_t
       is drawn from softmax(g / ``temperature``) with the run's common random numbers (the
       paper samples too; transformers applies its temperature after the guidance the same way).

    ``negative`` makes the negative from the prompt instead (:mod:`decoders.contrastive.perturb`,
    recorded in the stats as ``negative_ids``): Instructive Decoding's "opposite" instruction or
    random words (Kim et al. 2023) and a perturbed input (CID, Yona et al. 2023). Those papers
    score ``c − ε·u``; under argmax that is this rule with ``guidance_scale`` = 1/(1 − ε), so
    they are run here as guidance; their own decoding loops and prompts are simplified to this
    one perturbation per run.

    Both passes are KV-cached and both count as target forwards (two per token);
    ``guidance_scale=1`` is plain greedy decoding and runs no unconditional pass. Equals
    transformers 4.x ``generate(guidance_scale=, negative_prompt_ids=)`` (greedy) token for
    token. Each step records the conditional, unconditional and guided distributions;
    ``logit_lens`` records the conditional pass's layers.
    """

    name = "cfg"
    family = "contrastive"
    kind = "causal"
    params = Params(
        guidance_scale=Float(1.5, 0.0, 10.0, "gamma: 1 = no guidance, > 1 pushes away from the negative"),
        negative_prompt=Text("", "text the guidance pushes away from (empty = the last prompt token)"),
        negative=Choice("text", ("text", *PERTURBATIONS),
                        "the negative: negative_prompt as typed, or made from the prompt — opposite (Instructive "
                        "Decoding's 'opposite' instruction), shuffled (its tokens in a seeded random order), random "
                        "(as many random tokens)"),
        temperature=Float(0.0, 0.0, 10.0, "0 = greedy on the guided scores; else sample softmax(guided / T)"),
        logit_lens=lens_param(),
    )
    reference = "Sanchez et al. 2023, Stay on topic with Classifier-Free Guidance (ICML 2024)"
    papers = (
        arxiv("Sanchez et al. 2023, Stay on topic with Classifier-Free Guidance (ICML 2024)", "2306.17806"),
        arxiv("Kim et al. 2023, Instructive Decoding: Instruction-Tuned Large Language Models are Self-Refiner "
              "from Noisy Instructions", "2311.00233"),
        arxiv("Yona et al. 2023, Surfacing Biases in Large Language Models using Contrastive Input Decoding",
              "2305.07378"),
    )
    description = "Greedy on u + gamma·(c − u): conditional vs unconditional (or negative-prompt) pass"

    def run(self, ctx: Context) -> Iterator[Step]:
        view = ctx.target
        gamma, temp = float(ctx.params["guidance_scale"]), float(ctx.params["temperature"])
        text, how = str(ctx.params["negative_prompt"]), str(ctx.params["negative"])
        if how != "text":
            if text:
                raise PlaygroundError(f"knob 'negative_prompt' is for negative='text'; negative={how!r} makes the "
                                      "negative from the prompt (leave negative_prompt empty)")
            negative = perturbed_negative(how, list(ctx.prompt_ids), view, ctx.seed)
            self.extra_stats["negative_ids"] = list(negative)
        else:
            negative = view.encode(text) if text else list(ctx.prompt_ids[-1:])
        if not negative:
            raise PlaygroundError("the negative prompt encodes to no tokens")
        if len(negative) + ctx.max_new_tokens > view.context_length:
            raise PlaygroundError(f"negative prompt ({len(negative)} tokens) plus max_new_tokens "
                                  f"({ctx.max_new_tokens}) exceeds the context of {view.name!r} "
                                  f"({view.context_length} tokens)")
        uncond = ARState(view)
        evidence: dict[str, Any] = {}

        def sampled(scores: torch.Tensor, pos: int) -> tuple[torch.Tensor, int]:
            if temp == 0.0:
                return greedy_probs(scores)
            scaled = scores / temp
            final = torch.softmax(scaled, -1)
            return final, draw(ctx, pos, final, scaled)

        def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
            cond = torch.log_softmax(logits.float(), -1)
            if gamma == 1.0:
                evidence.clear()
                return sampled(cond, pos)
            u_logits = uncond.prefill(negative) if pos == 0 else uncond.advance(out[-1:])
            u = torch.log_softmax(u_logits.float(), -1)
            guided = gamma * (cond - u) + u
            final, tok = sampled(guided, pos)
            evidence["contrast"] = contrast_evidence(
                view, {"conditional": cond.exp(), "unconditional": u.exp(),
                       "guided": torch.softmax(guided, -1)}, tok, ctx.top_k_evidence, scores=guided)
            return final, tok

        for step in token_loop(ctx, pick, self):
            if "contrast" in evidence:
                step.evidence["contrast"] = evidence["contrast"]
            yield step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return params["guidance_scale"] != 1.0 or params["temperature"] not in (0.0, 1.0)
