"""``ead``: entropy-adaptive decoding — the small model writes until it grows unsure, then the
large model takes over for a span."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from decoders.ar import dist_evidence, watch_field
from decoders.base import Context, Decoder, Float, Int, Params, check_stop, register
from decoders.citation import arxiv
from decoders.collab._common import argmax, check_small_model, entropy_nats, share
from decoders.draft_state import DraftState, fit_logits
from playground.core.trace import Step


@register
class EAD(Decoder):
    """Entropy-adaptive decoding (EAD): a small model writes, a large one steps in when it is unsure.

    The small model (the draft slot) decodes greedily and keeps the rolling mean of its
    next-token entropy over the last ``window`` positions it was asked about. When that mean
    exceeds ``entropy_threshold`` (nats), the large model (the target) writes the next
    ``span`` tokens greedily, and hands back early once the rolling mean of its own entropy
    (same ``window``) falls below ``handback_threshold`` (the paper switches back when
    uncertainty drops; 0 keeps the fixed span only); then the small model resumes with an
    empty window. The window defaults to 3 so one odd position neither triggers nor ends a
    hand-over. Each model
    reads what the other wrote in one forward when its turn comes (its KV cache catches up),
    so the large model runs only inside spans. Every step is a token step from the model
    that wrote it, with ``source`` (``small``/``large``) and ``handover`` (the source, the
    small model's entropy and rolling mean where it was asked, ``trigger`` where a hand-over
    began, the large model's ``large_entropy``/``large_rolling_entropy`` where it wrote and
    ``handback`` where it handed back early); ``stats.small_share`` is the share
    of tokens the small model wrote. A threshold above any entropy gives the small model's
    greedy text, a threshold of 0 the large model's. Simplifies: greedy only (no sampling in
    either model), and ``span`` caps every hand-over.
    """

    name = "ead"
    family = "collab"
    kind = "causal"
    step_kind = "token"
    needs_draft = True
    params = Params(
        entropy_threshold=Float(6.0, 0.0, 100.0, "nats: the large model takes over when the small model's "
                                                 "rolling entropy exceeds this (0 = always the large model)"),
        window=Int(3, 1, 64, "positions in the small model's rolling entropy mean"),
        span=Int(4, 1, 1024, "most tokens the large model writes once triggered"),
        handback_threshold=Float(0.0, 0.0, 100.0, "nats: the large model hands back once its rolling entropy "
                                                  "falls below this (0 = only after span)"),
    )
    reference = ("Entropy-adaptive decoding: dynamic model switching for efficient inference "
                 "(Simonds et al. 2025, arXiv:2502.06833)")
    papers = (
        arxiv("Simonds et al. 2025, Entropy Adaptive Decoding: Dynamic Model Switching for "
              "Efficient Inference", "2502.06833"),
    )
    description = "The small model writes until its rolling entropy crosses a threshold; the large model then writes a span"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
        check_small_model(ctx, self.name)
        p = ctx.params
        thr, window, span = float(p["entropy_threshold"]), int(p["window"]), int(p["span"])
        back = float(p["handback_threshold"])
        small, large = DraftState(ctx.draft, decoder=self.name), DraftState(ctx.target, decoder=self.name)
        V = ctx.target.vocab_size
        prompt, out = list(ctx.prompt_ids), []
        recent: list[float] = []
        large_recent: list[float] = []
        large_left = 0
        n_small = triggers = 0
        for pos in range(ctx.max_new_tokens):
            ctx.check_cancel()
            ev: dict[str, Any] = {}
            if large_left == 0:
                s_logits = fit_logits(small.catch_up(prompt + out), V)
                h = entropy_nats(s_logits)
                recent = (recent + [h])[-window:]
                rolling = sum(recent) / len(recent)
                ev.update(small_entropy=round(h, 5), rolling_entropy=round(rolling, 5), threshold=thr)
                if rolling > thr:
                    large_left, recent, large_recent = span, [], []
                    triggers += 1
                    ev["trigger"] = True
            if large_left > 0:
                logits = large.catch_up(prompt + out)
                view, source = ctx.target, "large"
                large_left -= 1
                h_large = entropy_nats(logits)
                large_recent = (large_recent + [h_large])[-window:]
                large_rolling = sum(large_recent) / len(large_recent)
                ev.update(large_entropy=round(h_large, 5), large_rolling_entropy=round(large_rolling, 5))
                if large_left > 0 and large_rolling < back:
                    large_left = 0
                    ev["handback"] = True
            else:
                logits, view, source = s_logits, ctx.draft, "small"
                n_small += 1
            tok = argmax(logits)
            probs = torch.zeros_like(logits, dtype=torch.float32)
            probs[tok] = 1.0
            out.append(tok)
            self.extra_stats.update(small_tokens=n_small, large_tokens=len(out) - n_small,
                                    small_share=share(n_small, len(out)), triggers=triggers)
            yield Step("token", [tok], dist=dist_evidence(view, logits, probs, tok, ctx.top_k_evidence),
                       source=source, handover={"source": source, **ev}, **watch_field(ctx, logits, probs))
            reason = check_stop(ctx, out, ctx.target.decode)
            if reason:
                self.finish_reason = reason
                return
        self.finish_reason = "length"
