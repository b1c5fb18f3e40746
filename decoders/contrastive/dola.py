"""DoLa: decoding by contrasting layers (Chuang et al. 2024)."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from decoders.ar import greedy_probs, token_loop
from decoders.base import Context, Decoder, Float, Params, Text, lens_param, register
from decoders.citation import arxiv
from decoders.contrastive._common import contrast_evidence, rounded, text_config, with_hidden
from playground.core.errors import PlaygroundError
from playground.core.trace import Step

# Chuang et al.'s adaptive plausibility constraint (transformers' ``relative_top``).
RELATIVE_TOP = 0.1


class DolaParams(Params):
    """DoLa's knobs; ``dola_layers`` is checked for its syntax here, against the model at run time."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        parse_layers(out["dola_layers"])
        return out


def parse_layers(spec: str) -> str | list[int]:
    """``low``, ``high`` or a list of distinct non-negative layer indices, from the knob's text."""
    s = spec.strip().lower()
    if s in ("low", "high"):
        return s
    parts = [p.strip() for p in s.split(",") if p.strip()]
    if not parts:
        raise PlaygroundError("knob 'dola_layers' must be low, high or a comma list of layer indices")
    try:
        layers = [int(p) for p in parts]
    except ValueError:
        raise PlaygroundError(f"knob 'dola_layers'={spec!r}: expected low, high or layer indices like 0,2,4") from None
    if any(i < 0 for i in layers):
        raise PlaygroundError(f"knob 'dola_layers'={spec!r}: layer indices start at 0")
    if len(set(layers)) != len(layers):
        raise PlaygroundError(f"knob 'dola_layers'={spec!r} names a layer twice")
    return layers


def candidate_layers(spec: str, num_layers: int, tied: bool) -> list[int]:
    """The premature layers DoLa chooses from (indices into the hidden states, 0 = embeddings).

    As transformers 4.x: ``low`` is every second layer of the lower half, ``high`` of the
    upper half (the last 20 layers' for models deeper than 40). When the LM head shares its
    weights with the embeddings, an early exit at the embeddings is the identity map, so
    transformers 4.46 starts ``low`` at layer 2 (layer 1 for a 2-layer model, 0 for 1 layer).
    """
    n = num_layers
    start = 0 if not tied or n < 2 else (1 if n == 2 else 2)
    parsed = parse_layers(spec)
    if parsed == "low":
        layers = [start] if start == n // 2 else list(range(start, n // 2 if n <= 40 else 20, 2))
    elif parsed == "high":
        layers = list(range(n // 2 if n <= 40 else n - 20, n, 2))
    else:
        bad = [i for i in parsed if i >= n]
        if bad:
            raise PlaygroundError(f"knob 'dola_layers': layer {bad[0]} is out of range; this model's "
                                  f"premature layers are 0..{n - 1}")
        layers = list(parsed)
    if not layers:
        raise PlaygroundError(f"dola_layers={spec!r} leaves no premature layer in a {n}-layer model")
    return layers


def divergences(final_logits: torch.Tensor, premature_logits: torch.Tensor) -> torch.Tensor:
    """Each premature layer's divergence from the final layer (rows of ``premature_logits``).

    The quantity transformers 4.x maximises: 0.5·(KL(M‖P) + KL(M‖Q)) / V with M = (P + Q)/2,
    P the final and Q the premature distribution (the paper names it the Jensen-Shannon
    divergence; the ranking, not the scale, picks the layer).
    """
    m = 0.5 * (torch.softmax(final_logits, -1)[None, :] + torch.softmax(premature_logits, -1))
    kl1 = F.kl_div(torch.log_softmax(final_logits, -1)[None, :], m, reduction="none").mean(-1)
    kl2 = F.kl_div(torch.log_softmax(premature_logits, -1), m, reduction="none").mean(-1)
    return 0.5 * (kl1 + kl2)


def contrast(final_logits: torch.Tensor, base_logits: torch.Tensor) -> torch.Tensor:
    """log p_final - log p_premature over the tokens with p_final >= RELATIVE_TOP · max p_final,
    -inf elsewhere."""
    lf = torch.log_softmax(final_logits, -1)
    lb = torch.log_softmax(base_logits, -1)
    keep = lf >= lf.max() + math.log(RELATIVE_TOP)
    return torch.where(keep, lf - lb, torch.full_like(lf, -math.inf))


def repetition_penalty(scores: torch.Tensor, ids: list[int], penalty: float) -> torch.Tensor:
    """CTRL's penalty as transformers applies it: a seen token's score divided by ``penalty``
    if positive, multiplied if negative."""
    if penalty == 1.0 or not ids:
        return scores
    idx = torch.tensor(sorted(set(ids)), device=scores.device)
    seen = scores[idx]
    out = scores.clone()
    out[idx] = torch.where(seen < 0, seen * penalty, seen / penalty)
    return out


@register
class Dola(Decoder):
    """DoLa: contrast the final layer's next-token distribution with a premature layer's.

    Algorithm (Chuang et al. 2024, eq. 2-4), at every step, with one forward that returns
    every layer's hidden state:

    1. q_j = softmax(LM head(h_j)) for each candidate premature layer j in ``dola_layers``
       (the hidden state goes through the LM head without the final norm, as transformers
       4.x does; the final layer's own distribution is the model's);
    2. M = argmax_j JSD(q_N ‖ q_j), the premature layer that disagrees most with the final one;
    3. F(v) = log q_N(v) - log q_M(v) for v with q_N(v) >= 0.1 · max q_N, -inf elsewhere;
    4. the repetition penalty (``repetition_penalty``, the paper recommends 1.2) on F over
       the prompt and output, then x_t = argmax F.

    ``dola_layers``: ``low`` / ``high`` (every second layer of the lower / upper half) or a
    comma list of hidden-state indices (0 = embeddings). Equals transformers 4.x
    ``generate(dola_layers=, repetition_penalty=)`` (greedy) token for token. One forward
    per token; each step records every candidate layer's divergence, the chosen premature
    layer, and the final, premature and contrast distributions. ``logit_lens`` reads the
    same forward's hidden states (every layer through the final norm and head).
    """

    name = "dola"
    family = "contrastive"
    kind = "causal"
    params = DolaParams(
        dola_layers=Text("high", "premature layers: low, high, or hidden-state indices like 0,2,4"),
        repetition_penalty=Float(1.2, 1.0, 10.0, "CTRL repetition penalty on the contrast (1 = off)"),
        logit_lens=lens_param(),
    )
    reference = "Chuang et al. 2024, DoLa: Decoding by Contrasting Layers Improves Factuality (ICLR)"
    papers = (
        arxiv("Chuang et al. 2024, DoLa: Decoding by Contrasting Layers Improves Factuality in "
              "Large Language Models (ICLR)", "2309.03883"),
    )
    description = "Final layer minus the premature layer that diverges most from it"

    def run(self, ctx: Context) -> Iterator[Step]:
        cfg = text_config(ctx.target)
        n = int(getattr(cfg, "num_hidden_layers", 0) or ctx.target.num_layers)
        layers = candidate_layers(str(ctx.params["dola_layers"]), n, bool(getattr(cfg, "tie_word_embeddings", False)))
        penalty = float(ctx.params["repetition_penalty"])
        head = ctx.target.model.get_output_embeddings()
        hctx, hidden_view = with_hidden(ctx)
        prompt = list(ctx.prompt_ids)
        evidence: dict[str, Any] = {}

        def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
            final_logits = logits.float()
            with torch.inference_mode():
                h = torch.stack([hidden_view.hidden[j][0, -1].to(head.weight.device) for j in layers])
                premature = head(h).float().to(final_logits.device)
            div = divergences(final_logits, premature)
            m = int(torch.argmax(div))
            scores = repetition_penalty(contrast(final_logits, premature[m]), prompt + out, penalty)
            final, tok = greedy_probs(scores)
            evidence["dola"] = {"layers": layers, "divergence": [rounded(d) for d in div.tolist()],
                                "premature": layers[m], "num_layers": n}
            evidence["contrast"] = contrast_evidence(
                ctx.target, {"final": torch.softmax(final_logits, -1),
                             "premature": torch.softmax(premature[m], -1),
                             "contrast": torch.softmax(scores, -1)}, tok, ctx.top_k_evidence, scores=scores)
            return final, tok

        for step in token_loop(hctx, pick, self):
            step.evidence.update(evidence)
            yield step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True
