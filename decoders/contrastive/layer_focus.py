"""Decoders that read the layers through the logit lens and decide per step how to decode:
Dynamic Focus Decoding (a temperature from how much the layers disagree) and Confident Decoding
(the token from a near-final layer an entropy rule picks)."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from decoders.ar import draw, greedy_probs, token_loop
from decoders.base import Context, Decoder, Float, Int, Params, Text, register
from decoders.citation import Paper
from decoders.contrastive._common import rounded, text_config, with_hidden
from decoders.contrastive.dola import DolaParams, candidate_layers, divergences
from playground.core.errors import PlaygroundError
from playground.core.trace import Step


def lens_logits(view: Any, hidden: tuple[torch.Tensor, ...], layers: list[int]) -> torch.Tensor:
    """Next-token logits of hidden-state ``layers`` (0 = embeddings) at the last position,
    through the model's final norm and LM head (no forward: nothing is counted)."""
    if not hidden:
        raise PlaygroundError(f"model {getattr(view, 'name', '?')!r} returns no hidden states; "
                              "these decoders read the layers through the logit lens")
    return view.lm_head(torch.stack([hidden[j][0, -1] for j in layers])).float()


def focus_temperature(base: float, focus: float, divergence: float, reference: float,
                      lo: float, hi: float) -> float:
    """The step's temperature: ``base`` · exp(−``focus`` · (d / d_ref − 1)), clamped to [lo, hi].

    A step whose layers disagree more than usual (d above the running reference d_ref) is
    decoded sharper, one where they agree is relaxed; ``focus`` 0 is ``base`` throughout."""
    if focus == 0.0 or reference <= 0.0:
        return min(max(base, lo), hi)
    return min(max(base * math.exp(-focus * (divergence / reference - 1.0)), lo), hi)


@register
class DynamicFocus(Decoder):
    """Dynamic Focus Decoding: sample at a temperature set each step by how much the layers disagree.

    Algorithm (after the DFD paper, 2025), at every step, from one forward that returns every
    layer's hidden state:

    1. q_j = softmax(lens(h_j)) for the candidate layers ``dfd_layers`` (as ``dola``'s: low,
       high or indices), through the final norm and the LM head;
    2. d_t = max_j JSD(q_N ‖ q_j), the largest divergence of a candidate layer from the final
       layer (a knowledge-intensive step moves a lot across layers);
    3. d_ref = the mean of d over the steps so far (d_t itself at the first step);
    4. T_t = ``temperature`` · exp(−``focus`` · (d_t / d_ref − 1)), clamped to
       [``min_temperature``, ``max_temperature``]; x_t drawn from softmax(logits / T_t) with the
       run's common random numbers (T_t = 0 takes the argmax).

    Simplifies: the paper states the idea (large divergence → sharper focus for factuality,
    small → more diversity) without a formula in its abstract; the exponential map around the
    running mean is this project's. ``focus`` 0 is plain sampling at ``temperature``, token for
    token. Each step records every candidate layer's divergence, d_t, d_ref and T_t.
    """

    name = "dfd"
    family = "contrastive"
    kind = "causal"
    params = DolaParams(
        temperature=Float(1.0, 0.0, 5.0, "the base temperature (a step where the layers disagree as usual)"),
        focus=Float(1.0, 0.0, 10.0, "how strongly divergence moves the temperature (0 = plain sampling)"),
        min_temperature=Float(0.05, 0.0, 5.0, "the sharpest a step may get"),
        max_temperature=Float(2.0, 0.0, 10.0, "the flattest a step may get"),
        dola_layers=Text("high", "candidate layers: low, high, or hidden-state indices like 0,2,4 (as dola's)"),
    )
    reference = "Dynamic Focus Decoding (DFD, 2025): decoding focus from distributional differences across layers"
    papers = (Paper("Dynamic Focus Decoding: adaptive decoding focus from distributional differences across "
                    "layers (DFD, 2025)", "https://huggingface.co/papers?q=Dynamic+Focus+Decoding"),)
    description = "Sample at a temperature that drops where the layers disagree (logit lens)"

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        lo, hi = float(p["min_temperature"]), float(p["max_temperature"])
        if lo > hi:
            raise PlaygroundError(f"knob 'min_temperature' ({lo}) is above 'max_temperature' ({hi})")
        base, focus = float(p["temperature"]), float(p["focus"])
        cfg = text_config(ctx.target)
        n = int(getattr(cfg, "num_hidden_layers", 0) or ctx.target.num_layers)
        layers = candidate_layers(str(p["dola_layers"]), n, bool(getattr(cfg, "tie_word_embeddings", False)))
        hctx, hv = with_hidden(ctx)
        seen: list[float] = []
        evidence: dict[str, Any] = {}

        def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
            final_logits = logits.float()
            div = divergences(final_logits, lens_logits(ctx.target, hv.hidden, layers).to(final_logits.device))
            d = float(div.max())
            ref = sum(seen) / len(seen) if seen else d
            seen.append(d)
            temp = focus_temperature(base, focus, d, ref, lo, hi)
            # significant digits, not decimals: these divergences are per-vocabulary means, ~1e-5
            evidence["focus"] = {"layers": layers, "divergence": [float(f"{x:.5g}") for x in div.tolist()],
                                 "d": d, "reference": ref, "temperature": temp, "base": base}
            if temp == 0.0:
                return greedy_probs(final_logits)
            scaled = final_logits / temp
            final = torch.softmax(scaled, -1)
            return final, draw(ctx, pos, final, scaled)

        for step in token_loop(hctx, pick, self):
            step.evidence["focus"] = dict(evidence["focus"])
            yield step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True


def confident_layer(entropies: list[float], margin: float) -> int:
    """The conservative backward search: start at the last entry (the final layer) and step one
    layer back only while the earlier layer's entropy is lower by more than ``margin``; the
    index of the layer where it stops."""
    j = len(entropies) - 1
    while j > 0 and entropies[j - 1] < entropies[j] - margin:
        j -= 1
    return j


@register
class ConfidentDecoding(Decoder):
    """Confident Decoding: take each token from a near-final layer chosen by an entropy rule.

    Algorithm (after the Confident Decoding paper, 2025), at every step, from one forward that
    returns every layer's hidden state:

    1. for the final layer N and the ``window`` layers before it, p_j = softmax(lens(h_j))
       through the final norm and LM head, and its entropy H_j;
    2. the conservative backward search (an optimal-stopping rule): start at N and step back
       to j − 1 only while H_{j−1} < H_j − ``margin`` — a strictly more confident earlier
       layer; stop at the first layer where that fails;
    3. x_t = argmax of the chosen layer's distribution (``temperature`` 0), else drawn from
       softmax(lens logits / ``temperature``) with the run's common random numbers.

    Simplifies: the paper's abstract names the entropy-guided backward search but not its
    exact stopping rule or window; the margin rule above is this project's reading. ``window``
    0 (or a margin no layer beats) is greedy on the final layer, token for token. Each step
    records the window's layers and entropies, the chosen layer and whether its token differs
    from the final layer's.
    """

    name = "confident"
    family = "contrastive"
    kind = "causal"
    params = Params(
        window=Int(2, 0, 16, "near-final layers the search may step back through (0 = the final layer only)"),
        margin=Float(0.1, 0.0, 10.0, "nats an earlier layer's entropy must be lower by to be taken"),
        temperature=Float(0.0, 0.0, 5.0, "0 = argmax of the chosen layer; else sample its softmax(logits / T)"),
    )
    reference = "Confident Decoding: entropy-guided selection of a near-final layer (2025)"
    papers = (Paper("Confident Decoding: entropy-guided conservative backward search over near-final layers (2025)",
                    "https://huggingface.co/papers?q=Confident+Decoding+entropy+guided+layer"),)
    description = "Token from the most confident near-final layer (entropy-guided backward search)"

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        cfg = text_config(ctx.target)
        n = int(getattr(cfg, "num_hidden_layers", 0) or ctx.target.num_layers)
        w = min(int(p["window"]), n)
        margin, temp = float(p["margin"]), float(p["temperature"])
        layers = list(range(n - w, n + 1))  # hidden-state indices; n is the final layer
        hctx, hv = with_hidden(ctx)
        evidence: dict[str, Any] = {}

        def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
            final_logits = logits.float()
            # the final layer is the forward's own logits (already normed); earlier ones via the lens
            rows = [final_logits]
            if w:
                rows = list(lens_logits(ctx.target, hv.hidden, layers[:-1]).to(final_logits.device)) + rows
            logp = torch.log_softmax(torch.stack(rows), -1)
            ent = [float(-(lp.exp() * lp).nansum()) for lp in logp]
            j = confident_layer(ent, margin)
            chosen = rows[j]
            if temp == 0.0:
                final, tok = greedy_probs(chosen)
            else:
                scaled = chosen / temp
                final = torch.softmax(scaled, -1)
                tok = draw(ctx, pos, final, scaled)
            evidence["confident"] = {"layers": layers, "entropy": [rounded(e) for e in ent], "chosen": layers[j],
                                     "differs": tok != int(torch.argmax(final_logits)), "margin": margin}
            return final, tok

        for step in token_loop(hctx, pick, self):
            step.evidence["confident"] = dict(evidence["confident"])
            yield step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return int(params["window"]) > 0 or params["temperature"] not in (0.0, 1.0)
