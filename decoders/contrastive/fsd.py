"""Frustratingly simple decoding (Yang et al. 2023): an n-gram anti-LM over the context."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator, Sequence

import torch

from decoders.ar import token_loop
from decoders.base import Context, Decoder, Float, Int, Params, lens_param, register
from decoders.citation import arxiv
from decoders.contrastive._common import contrast_evidence
from playground.core.trace import Step


class AntiLM:
    """An n-gram language model of one sequence, grown token by token.

    ``tables[i]`` maps each i-token context seen in the sequence to a counter of the tokens
    that followed it (i = 0 is the unigram table, keyed by the empty context), so adding a
    token costs n dictionary updates and scoring needs no pass over the sequence.
    """

    def __init__(self, n: int, beta: float, ids: Sequence[int] = ()) -> None:
        self.n, self.beta = int(n), float(beta)
        self.ids: list[int] = []
        self.tables: list[dict[tuple[int, ...], Counter[int]]] = [{} for _ in range(self.n)]
        self.extend(ids)

    def extend(self, ids: Sequence[int]) -> None:
        """Append tokens: each becomes the follower of the up-to-(n-1) tokens before it."""
        for t in ids:
            t = int(t)
            for i in range(min(self.n, len(self.ids) + 1)):
                key = tuple(self.ids[len(self.ids) - i:]) if i else ()
                self.tables[i].setdefault(key, Counter())[t] += 1
            self.ids.append(t)

    def probs(self, vocab: int) -> torch.Tensor:
        """p_anti(v) for every token id below ``vocab`` (0 for tokens the sequence never had).

        The orders back off from the longest context (n-1 tokens) down to the unigram, per
        token: an order whose context was followed by v takes ``beta`` of the weight still
        left, with its count over (followers + 1) - the +1 keeps a context seen once from
        claiming certainty; an order that never saw v after its context passes its whole
        weight down; the unigram takes all that remains with its plain frequency. Until the
        sequence holds n-1 tokens the anti-LM predicts nothing (all zeros).
        """
        out = torch.zeros(vocab, dtype=torch.float64)
        if len(self.ids) < self.n - 1:
            return out
        found: list[tuple[Counter[int], int, bool]] = []
        for i in range(self.n - 1, -1, -1):
            key = tuple(self.ids[len(self.ids) - i:]) if i else ()
            c = self.tables[i].get(key)
            if c:
                found.append((c, sum(c.values()), i == 0))
        tokens = {t for c, _, _ in found for t in c}
        for t in tokens:
            if not 0 <= t < vocab:
                continue
            remaining, score = 1.0, 0.0
            for c, total, unigram in found:
                if t not in c:
                    continue
                if unigram:
                    score += remaining * c[t] / total
                else:
                    score += remaining * self.beta * c[t] / (total + 1)
                remaining -= remaining * self.beta
            out[t] = score
        return out


def fsd_scores(logits: torch.Tensor, anti: torch.Tensor, alpha: float, k: int) -> torch.Tensor:
    """The FSD score of every token: (1 - alpha)·p_LM(v) - alpha·p_anti(v) on the ``k`` most
    probable tokens (torch.topk's choice among ties), -inf elsewhere."""
    p = torch.softmax(logits.double(), -1)
    cand = torch.topk(p, min(k, p.numel())).indices
    score = torch.full_like(p, float("-inf"))
    score[cand] = (1.0 - alpha) * p[cand] - alpha * anti.to(p.device)[cand]
    return score


@register
class FSD(Decoder):
    """Frustratingly simple decoding: penalise what an n-gram model of the text so far predicts.

    Algorithm (Yang et al. 2023, the discrete n-gram variant), at every step with the
    sequence s = prompt + output so far:

    1. p_anti = an n-gram model of order ``n`` built from s alone (no training, no extra
       parameters), smoothed by backing off over the orders with weight ``beta``
       (:meth:`AntiLM.probs`); it predicts what would repeat the text;
    2. V(k) = the ``k`` tokens most probable under the model;
    3. x_t = argmax over V(k) of (1 - ``alpha``)·p_LM(v) - ``alpha``·p_anti(v).

    ``alpha`` = 0 is greedy decoding. The authors' code weights the LM by 1 - alpha as
    above (the paper's p_LM - alpha'·p_anti ranks tokens alike with alpha' = alpha/(1 - alpha));
    English defaults from their recommendations (alpha 0.65, n 3, k 3, beta 0.9).
    Simplified: no stop-word list with its own penalty weight, no vectorised (hidden-state)
    anti-LM, and the end-of-text token is not suppressed. The rule is deterministic, so
    there is no temperature. One forward per token, as greedy. Each step records the LM,
    anti-LM and FSD rows under ``contrast`` (the FSD row is the softmax of the score over
    the k candidates, the raw scores under ``scores``).
    """

    name = "fsd"
    family = "contrastive"
    kind = "causal"
    params = Params(
        alpha=Float(0.65, 0.0, 1.0, "anti-LM weight: score = (1 − α)·p_LM − α·p_anti (0 = greedy)"),
        n=Int(3, 1, 8, "order of the n-gram anti-LM built from the prompt and the output"),
        k=Int(3, 1, 100, "candidates: the k most probable tokens are re-scored"),
        beta=Float(0.9, 0.0, 1.0, "backoff: share of the remaining weight each n-gram order that saw the token takes"),
        logit_lens=lens_param(),
    )
    reference = "Yang et al. 2023, A Frustratingly Simple Decoding Method for Neural Text Generation (LREC-COLING 2024)"
    papers = (
        arxiv("Yang et al. 2023, A Frustratingly Simple Decoding Method for Neural Text "
              "Generation (LREC-COLING 2024)", "2305.12675"),
    )
    description = "Greedy on (1 − α)·p_LM − α·p_anti, an n-gram anti-LM of the text so far"

    def run(self, ctx: Context) -> Iterator[Step]:
        alpha = float(ctx.params["alpha"])
        k = int(ctx.params["k"])
        anti_lm = AntiLM(int(ctx.params["n"]), float(ctx.params["beta"]), ctx.prompt_ids)
        evidence: dict[str, Any] = {}

        def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
            if out:
                anti_lm.extend(out[-1:])
            anti = anti_lm.probs(logits.numel())
            score = fsd_scores(logits, anti, alpha, k)
            tok = int(torch.argmax(score))
            final = torch.zeros_like(logits, dtype=torch.float32)
            final[tok] = 1.0
            evidence["contrast"] = contrast_evidence(
                ctx.target, {"LM": torch.softmax(logits.float(), -1), "anti-LM": anti.float(),
                             "FSD": torch.softmax(score, -1).float()}, tok, ctx.top_k_evidence, scores=score)
            return final, tok

        for step in token_loop(ctx, pick, self):
            step.evidence["contrast"] = evidence["contrast"]
            yield step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return params["alpha"] != 0
