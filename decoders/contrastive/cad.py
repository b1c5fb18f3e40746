"""Context-aware decoding (Shi et al. 2023)."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from decoders.ar import ARState, draw, greedy_probs, token_loop
from decoders.base import Context, Decoder, Float, Params, Text, lens_param, register
from decoders.citation import arxiv
from decoders.contrastive._common import contrast_evidence
from playground.core.errors import PlaygroundError
from playground.core.trace import Step


def unescape(separator: str) -> str:
    """The separator knob's text with ``\\n`` and ``\\t`` read as a newline and a tab (a
    knob's text is typed on one line)."""
    return separator.replace("\\n", "\n").replace("\\t", "\t")


def split_prompt(view: Any, prompt_ids: list[int], separator: str) -> list[int]:
    """The question part's token ids: the prompt's text after the first ``separator``."""
    text = view.decode(prompt_ids)
    if not separator:
        raise PlaygroundError("knob 'separator' is empty; it marks where the context ends and the question starts")
    at = text.find(separator)
    if at < 0:
        raise PlaygroundError(f"the prompt has no separator {separator!r} between its context and its question")
    question = view.encode(text[at + len(separator):])
    if not question:
        raise PlaygroundError(f"the prompt has nothing after the separator {separator!r} (the question part)")
    return question


@register
class CAD(Decoder):
    """Context-aware decoding: amplify what the context adds to the model's prediction.

    Algorithm (Shi et al. 2023, eq. 2), with the prompt split at the first ``separator``
    into a context c and a question x:

    1. l_c = logits(y_t | c, x, y<t), the full prompt (the lane's ordinary pass);
    2. l_x = logits(y_t | x, y<t), the question alone followed by the output so far;
    3. y_t ~ softmax((1 + ``alpha``) · l_c - ``alpha`` · l_x); ``temperature`` 0 takes the
       argmax, otherwise the draw divides the score by it and uses the run's common random
       numbers.

    Both passes are KV-cached and count as target forwards (two per token); ``alpha=0`` is
    the model alone and runs no second pass. Each step records the with-context,
    question-only and adjusted distributions; ``logit_lens`` records the with-context pass's layers.
    """

    name = "cad"
    family = "contrastive"
    kind = "causal"
    params = Params(
        alpha=Float(0.5, 0.0, 10.0, "how much the context's contribution is amplified (0 = the model alone)"),
        separator=Text("\\n\\n", "the prompt's context ends at its first occurrence and the question follows "
                                   "(write \\n for a newline, \\t for a tab)"),
        temperature=Float(0.0, 0.0, 10.0, "0 = greedy over the adjusted logits; else sample softmax(score / T)"),
        logit_lens=lens_param(),
    )
    reference = "Shi et al. 2023, Trusting Your Evidence: Hallucinate Less with Context-aware Decoding (NAACL 2024)"
    papers = (
        arxiv("Shi et al. 2023, Trusting Your Evidence: Hallucinate Less with Context-aware "
              "Decoding (NAACL 2024)", "2305.14739"),
    )
    description = "(1+α)·logits with the context − α·logits without it"

    def run(self, ctx: Context) -> Iterator[Step]:
        view = ctx.target
        alpha, temp = float(ctx.params["alpha"]), float(ctx.params["temperature"])
        question = split_prompt(view, list(ctx.prompt_ids), unescape(str(ctx.params["separator"])))
        without = ARState(view)
        evidence: dict[str, Any] = {}

        def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
            lc = torch.log_softmax(logits.float(), -1)
            if alpha == 0.0:
                lx, score = lc, lc
            else:
                # log-probabilities differ from logits by a constant per step: same softmax
                lx = torch.log_softmax((without.prefill(question) if pos == 0 else without.advance(out[-1:])).float(), -1)
                score = (1 + alpha) * lc - alpha * lx
            if temp == 0.0:
                final, tok = greedy_probs(score)
                adjusted = torch.softmax(score, -1)
            else:
                adjusted = torch.softmax(score / temp, -1)
                tok = draw(ctx, pos, adjusted, score / temp)
                final = adjusted
            evidence["contrast"] = contrast_evidence(
                view, {"with context": lc.exp(), "question only": lx.exp(), "adjusted": adjusted},
                tok, ctx.top_k_evidence, scores=score)
            return final, tok

        for step in token_loop(ctx, pick, self):
            step.evidence["contrast"] = evidence["contrast"]
            step.evidence["question_tokens"] = len(question)
            yield step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return params["alpha"] != 0 or params["temperature"] not in (0.0, 1.0)
