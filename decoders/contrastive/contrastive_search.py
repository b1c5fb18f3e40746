"""Contrastive search (Su et al. 2022)."""

from __future__ import annotations

from typing import Iterator

import torch

from decoders.ar import dist_evidence, watch_field
from decoders.base import Context, Decoder, Float, Int, Params, check_stop, register
from decoders.citation import arxiv
from decoders.contrastive._common import rounded
from decoders.kv_cache import repeat_batch, select_rows
from playground.core.trace import Step


@register
class ContrastiveSearch(Decoder):
    """Contrastive search: of the ``top_k`` most probable next tokens, take the one with the
    best trade-off between model confidence and being unlike its context.

    Algorithm (Su et al. 2022, eq. 5), at every step with context x<t and its last-layer
    hidden states h_1..h_{t-1}:

    1. V(k) = the ``top_k`` tokens of p(v | x<t);
    2. feed each candidate v in one batched forward (the cache repeated k times) and take
       its last-layer hidden state h_v;
    3. penalty(v) = max_j cos(h_v, h_j), the degeneration penalty;
    4. x_t = argmax over V(k) of (1 - ``penalty_alpha``) · p(v | x<t) - ``penalty_alpha`` · penalty(v);
    5. keep the chosen row of the cache, append h_{x_t} to the context; the chosen row's
       logits are the next step's distribution.

    One forward per token plus the prompt's, as in transformers 4.x ``generate(penalty_alpha=,
    top_k=)``, which it equals token for token. ``penalty_alpha=0`` is greedy decoding.
    Each step records the candidate table: token, p, degeneration penalty, score, and the
    context position the candidate is most similar to.
    """

    name = "contrastive_search"
    family = "contrastive"
    kind = "causal"
    params = Params(
        penalty_alpha=Float(0.6, 0.0, 1.0, "weight of the degeneration penalty (0 = greedy)"),
        top_k=Int(4, 1, 100, "candidates re-ranked at each step"),
    )
    reference = "Su et al. 2022, A Contrastive Framework for Neural Text Generation (NeurIPS)"
    papers = (
        arxiv("Su et al. 2022, A Contrastive Framework for Neural Text Generation (NeurIPS)", "2202.06417"),
    )
    description = "Of the top-k tokens, take the most probable one least similar to its context"
    force_mode = None
    force_refusal = "its degeneration penalty re-ranks candidates after the model has spoken"

    def run(self, ctx: Context) -> Iterator[Step]:
        view = ctx.target
        alpha = float(ctx.params["penalty_alpha"])
        k = min(int(ctx.params["top_k"]), view.vocab_size)
        out = view.forward(list(ctx.prompt_ids), cache=view.new_cache(), hidden_states=True)
        cache = out.cache
        context = out.hidden_states[-1][0]
        logits = out.logits[0, -1]
        output: list[int] = []
        for pos in range(ctx.max_new_tokens):
            ctx.check_cancel()
            top_p, top_ids = torch.topk(torch.softmax(logits, -1), k)
            with torch.inference_mode():
                repeat_batch(cache, k)  # every layer kind, recurrent ones included
            cand = view.forward(top_ids.view(k, 1), cache=cache, hidden_states=True)
            cache = cand.cache
            h = cand.hidden_states[-1][:, -1, :]
            cos = (h / h.norm(dim=-1, keepdim=True)) @ (context / context.norm(dim=-1, keepdim=True)).T
            penalty, closest = cos.max(-1)
            score = (1.0 - alpha) * top_p - alpha * penalty
            j = int(torch.argmax(score))
            tok = int(top_ids[j])
            with torch.inference_mode():
                select_rows(cache, [j])
            context = torch.cat([context, h[j:j + 1]])
            table = [{"token": int(t), "p": rounded(p), "penalty": rounded(d), "score": rounded(s),
                      "closest": int(c), "picked": i == j}
                     for i, (t, p, d, s, c) in enumerate(zip(top_ids.tolist(), top_p.tolist(),
                                                             penalty.tolist(), score.tolist(),
                                                             closest.tolist()))]
            final = torch.zeros_like(logits, dtype=torch.float32)
            final[tok] = 1.0
            yield Step("token", [tok], dist=dist_evidence(view, logits, final, tok, ctx.top_k_evidence),
                       candidates=table, penalty_alpha=alpha, **watch_field(ctx, logits, final))
            output.append(tok)
            reason = check_stop(ctx, output, view.decode)
            if reason:
                self.finish_reason = reason
                return
            logits = cand.logits[j, -1]
        self.finish_reason = "length"
