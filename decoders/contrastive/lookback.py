"""Look-back decoding (Xu et al. 2023): KL divergence to earlier steps as a repetition alarm."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from decoders.ar import dist_evidence, draw, watch_field
from decoders.base import Context, Decoder, Float, Int, Params, check_stop, register
from decoders.citation import arxiv
from decoders.contrastive._common import rounded
from decoders.kv_cache import repeat_batch, select_rows
from playground.core.trace import Step

# A log-probability of -inf (a masked token) would make 0·(-inf) = NaN in a KL sum; this
# floor keeps every term finite, and a token of probability 0 still adds nothing.
_LOGP_FLOOR = -1e4


def kl_to_rows(logp: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q_j) for each row j of ``rows`` (log-probabilities, shape (J, V)); ``logp`` is
    log p, shape (V,) - or (K, V) for K distributions at once, giving shape (K, J). Float32:
    a long prompt keeps one row per position, so the rows are not widened to float64."""
    lp = logp.float().clamp(min=_LOGP_FLOOR)
    q = rows.float().clamp(min=_LOGP_FLOOR)
    p = torch.softmax(logp.float(), -1)
    if lp.dim() == 1:
        return (p * lp).sum(-1) - q @ p
    return (p * lp).sum(-1, keepdim=True) - p @ q.T


@register
class LookBack(Decoder):
    """Look-back decoding: greedy until the next-token distribution comes too close to an
    earlier one, then sample among the top candidates, favouring those that keep the next
    step close to the prompt.

    Algorithm (Xu et al. 2023, Algorithm 1), at every step t with p_t the model's
    next-token distribution:

    1. KL_min = min over the earlier steps j (the prompt's positions and the output so far,
       the last ``window`` of them) of KL(p_t ‖ p_j): a repetition alarm, since a loop
       replays distributions it has already produced;
    2. KL_min > ``alpha`` (or no earlier step): x_t = argmax p_t, greedy;
    3. KL_min <= ``alpha``: for each v of the ``k`` most probable tokens, feed v (one
       batched forward of the k candidates) and take its next-step distribution p_{t+1|v};
       d(v) = min over the prompt's positions j of KL(p_{t+1|v} ‖ p_j), the distance to the
       prompt (topic drift); sample x_t from softmax(-d) over the k candidates with the
       run's common random numbers. The chosen candidate's forward is the next step's, so
       the alarm costs no extra forward - only k tokens in one batch instead of one.

    A causal model has no distribution before the first token, so "the prompt's
    positions" are the m distributions its m tokens give (the last one is the first
    step's own). The most probable token stays a candidate on purpose (an alarm may be a
    false positive). Defaults: ``k`` = 8 and ``window`` = 128 from the paper's settings;
    the paper tunes ``alpha`` in [0.5, 1.6] for GPT-2 XL and OPT, and the KL scale of a
    model decides where it falls. Each step records under ``lookback`` the minimum KL, the
    earlier position it came from and the token that followed there, whether the alarm
    fired and, if so, the candidate table (p, distance to the prompt, q, picked).
    """

    name = "lookback"
    family = "contrastive"
    kind = "causal"
    params = Params(
        alpha=Float(0.6, 0.0, 100.0, "alarm threshold: sample when min KL to an earlier step <= alpha (0 = greedy)"),
        k=Int(8, 1, 100, "candidates sampled from when the alarm fires"),
        window=Int(128, 1, 4096, "earlier steps compared: the last this many positions"),
    )
    reference = "Xu et al. 2023, Look-back Decoding for Open-Ended Text Generation (EMNLP)"
    papers = (arxiv("Xu et al. 2023, Look-back Decoding for Open-Ended Text Generation (EMNLP)", "2305.13477"),)
    description = "Greedy until KL to an earlier step signals a loop, then sample the top-k by closeness to the prompt"
    force_mode = None
    force_refusal = "it re-ranks candidates by a look-ahead forward after the model has spoken"

    def run(self, ctx: Context) -> Iterator[Step]:
        view = ctx.target
        alpha = float(ctx.params["alpha"])
        k = min(int(ctx.params["k"]), view.vocab_size)
        window = int(ctx.params["window"])
        prompt = list(ctx.prompt_ids)
        first = view.forward(prompt, cache=view.new_cache())
        cache = first.cache
        prefix = torch.log_softmax(first.logits[0].float(), -1)  # (m, V): the prompt's distributions
        history = [row for row in prefix[:-1]]  # distributions before the current step, oldest first
        logits = first.logits[0, -1]
        output: list[int] = []
        for pos in range(ctx.max_new_tokens):
            ctx.check_cancel()
            logp = torch.log_softmax(logits.float(), -1)
            at = len(prompt) + pos  # the sequence index the current distribution predicts
            recent = history[-window:]
            ev: dict[str, Any] = {"threshold": alpha, "compared": len(recent)}
            triggered = False
            if recent:
                kl = kl_to_rows(logp, torch.stack(recent))
                j = int(torch.argmin(kl))
                closest = at - len(recent) + j  # history row r predicts sequence index r + 1
                seq = prompt + output
                triggered = float(kl[j]) <= alpha
                ev.update(kl_min=rounded(kl[j]), closest=closest, closest_token=int(seq[closest]),
                          closest_step=closest - len(prompt) if closest >= len(prompt) else None)
            else:
                ev.update(kl_min=None, closest=None, closest_token=None, closest_step=None)
            ev["triggered"] = triggered
            next_logits = None
            if triggered:
                top_p, top_ids = torch.topk(torch.softmax(logits.float(), -1), k)
                with torch.inference_mode():
                    repeat_batch(cache, k)
                cand = view.forward(top_ids.view(k, 1), cache=cache)
                cache = cand.cache
                d_all = kl_to_rows(torch.log_softmax(cand.logits[:, -1].float(), -1), prefix)  # (k, m)
                d, near = d_all.min(-1)
                score = torch.full_like(logp, float("-inf"))
                score[top_ids.to(score.device)] = -d.to(score.device)
                final = torch.softmax(score, -1)
                tok = draw(ctx, pos, final, score)
                i = top_ids.tolist().index(tok)
                with torch.inference_mode():
                    select_rows(cache, [i])
                next_logits = cand.logits[i, -1]
                ev["candidates"] = [
                    {"token": int(t), "p": rounded(p), "kl_prefix": rounded(dv), "closest_prefix": int(c) + 1,
                     "q": rounded(final[int(t)]), "picked": int(t) == tok}
                    for t, p, dv, c in zip(top_ids.tolist(), top_p.tolist(), d.tolist(), near.tolist())]
            else:
                tok = int(torch.argmax(logits))
                final = torch.zeros_like(logp)
                final[tok] = 1.0
            yield Step("token", [tok], dist=dist_evidence(view, logits, final.float(), tok, ctx.top_k_evidence),
                       lookback=ev, **watch_field(ctx, logits, final.float()))
            output.append(tok)
            history.append(logp)
            del history[:-window]  # only the window is ever compared
            reason = check_stop(ctx, output, view.decode)
            if reason:
                self.finish_reason = reason
                return
            if pos + 1 < ctx.max_new_tokens:
                if next_logits is None:
                    fw = view.forward([tok], cache=cache)
                    cache, next_logits = fw.cache, fw.logits[0, -1]
                logits = next_logits
        self.finish_reason = "length"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True
