"""APD: adaptive parallel decoding, a small causal model deciding how many tokens to take.

Israel, Van den Broeck & Grover 2025 (A094) invert speculative decoding: the diffusion LM
proposes a run of tokens in parallel from its marginals, and a *small* autoregressive
helper (the draft slot) says how long a prefix of that run to keep. The target is the
multiplicative mixture ``p_T ∝ p_D^w · p_AR^(1-w)`` of the diffusion marginal ``p_D`` and the
helper's conditional ``p_AR``; the proposal and a draw from ``p_T`` share their random numbers
(the universal coupling), and the proposal is accepted up to the first position where the
two draws differ. Where the dLLM is sure *and* the helper agrees, many tokens go in one pass.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from decoders.base import Context, Float, Int, Params, register
from decoders.citation import Paper, arxiv
from decoders.diffusion._canvas import finish, gen_logits, make_layout, new_canvas, r5
from decoders.diffusion._sampler import Recipe, denoise_step, gumbel_tokens, propose
from decoders.diffusion.named import DiffusionDecoder, gen_length, temperature
from decoders.draft_state import fit_logits
from playground.core.errors import PlaygroundError
from playground.core.trace import Step


def mixture_logits(dllm: torch.Tensor, helper: torch.Tensor, weight: float) -> torch.Tensor:
    """``w · dllm + (1 - w) · helper``: the logits of ``p_D^w · p_AR^(1-w)`` up to a constant per
    row (sampling ignores it). ``w`` 1 is the diffusion logits themselves, bit for bit (the
    helper has no say), so a helper ``-inf`` cannot turn into a NaN there."""
    if weight >= 1.0:
        return dllm
    return weight * dllm + (1.0 - weight) * helper


def accepted_length(proposed: list[int], mixture: list[int]) -> int:
    """APD's acceptance: the first proposal always stands; after it, proposals are kept while
    they equal the mixture's coupled draw at the same position (the longest agreeing prefix)."""
    k = 1
    while k < len(proposed) and proposed[k] == mixture[k]:
        k += 1
    return min(k, len(proposed))


@register
class AdaptiveParallelDecoding(DiffusionDecoder):
    """APD (A094): the diffusion LM proposes the next ``max_lookahead`` tokens in parallel, a
    small causal helper scores them in one pass, and the prefix on which the proposal agrees
    with the mixture ``p_D^w · p_AR^(1-w)`` is committed (at least one token per pass).

    Each step: (1) one forward of the diffusion LM on the prompt, the committed text and the
    next ``max_lookahead`` masks (the paper's cap on the masked input; 0 = the whole canvas);
    (2) a proposal at every masked position of that window, drawn from the diffusion
    marginals by Gumbel-max with the run's common random numbers; (3) one forward of the
    helper on the committed text followed by the proposal, giving ``p_AR`` at each window
    position given the proposals before it; (4) at each position a draw from the mixture
    with the *same* Gumbel noise; the proposal is accepted up to the first disagreement. The
    text fills left to right. ``mixture_weight`` 1 leaves the helper no say (every proposal
    of the window is kept: one pass per window); lower weights trust the helper more and take
    fewer tokens per pass where it disagrees. Simplifies: no KV cache for either model (the
    paper's third speed-up; every pass recomputes its prefix, so wall time is not the
    paper's), and no ``kv_window``. Evidence per step: the window, each position's proposal,
    the mixture's draw, the dLLM's and the helper's probability of the proposal, where they
    agree and how many were accepted. Views: *Helper vs dLLM* (both probabilities per window
    position, the accepted prefix marked) and *Parallel length per step*.
    """

    name = "apd"
    description = "APD: dLLM proposes a run in parallel, a small causal helper decides how much of it to keep"
    reference = ("Israel, Van den Broeck & Grover 2025, Accelerating Diffusion LLMs via Adaptive Parallel "
                 "Decoding (A094)")
    papers = (
        arxiv("Israel, Van den Broeck & Grover 2025, Accelerating Diffusion LLMs via Adaptive "
              "Parallel Decoding (APD)", "2506.00413"),
        Paper("APD's reference sampler (Dream), dream/generation_utils.py", "https://github.com/danielmisrael/apd"),
    )
    needs_draft = True
    shows = "; the helper's and the dLLM's probability of every proposal and the accepted prefix (apd)"
    params = Params(
        gen_length=gen_length(),
        mixture_weight=Float(0.5, 0.0, 1.0, "w in p_D^w · p_AR^(1-w): 1 = the diffusion LM alone (the helper "
                                            "has no say), 0 = the helper alone decides what stands"),
        max_lookahead=Int(16, 0, 4096, "masked positions the diffusion LM sees and proposes per pass; "
                                       "0 = the whole rest of the canvas"),
        temperature=temperature(),
    )

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        helper = ctx.draft
        if helper is None or getattr(helper, "kind", None) != "causal":
            raise PlaygroundError("decoder 'apd' needs a small causal model in the draft slot (--draft)")
        rc = Recipe(gen_length=p["gen_length"], plan="threshold", temperature=p["temperature"])
        lay = make_layout(ctx, rc.gen_length, 0, 0, fixed_steps=False)
        p0, g, mask = lay.prompt_len, lay.gen_length, lay.mask_id
        if p0 + g > int(getattr(helper, "context_length", 0) or p0 + g):
            raise PlaygroundError(f"prompt ({p0} tokens) plus gen_length ({g}) exceeds the context of the "
                                  f"helper {helper.name!r} ({helper.context_length} tokens)")
        w, look = float(p["mixture_weight"]), int(p["max_lookahead"]) or g
        x = new_canvas(ctx, lay)
        commit_step = [-1] * g
        per_step: list[int] = []
        agree_n = seen_n = 0
        cur, step = 0, 0
        while cur < g:
            ctx.check_cancel()
            right = min(cur + look, g)
            logits = gen_logits(ctx.target, x[:p0 + right], lay)[0]
            pos = torch.arange(cur, right)
            prop = propose(ctx, rc, logits, pos, step, cur / g, None, {})
            proposed = prop.tokens.tolist()
            # the helper reads the committed text and the proposal; its row j predicts token j + 1
            seq = torch.cat([x[:p0 + cur], prop.tokens])
            a = fit_logits(helper.forward(seq).logits[0].float().cpu(), logits.shape[-1])
            first = p0 + cur - 1
            rows = a[max(first, 0):p0 + right - 1]
            d = logits[pos]
            if first < 0:  # no prompt and nothing committed: the helper cannot score position 0
                rows = torch.cat([d[:1], rows])
            mix = mixture_logits(d, rows, w)
            drawn = gumbel_tokens(ctx, mix, pos, step, rc.temperature).tolist()
            k = accepted_length(proposed, drawn)
            agree = [bool(t == m) for t, m in zip(proposed, drawn)]
            agree_n += sum(agree[1:])
            seen_n += len(agree) - 1
            pd = torch.softmax(d.double(), -1)
            pa = torch.softmax(rows.double(), -1)
            pm = torch.softmax(mix.double(), -1)
            idx = pos - cur
            tok = prop.tokens
            ev = {"window": [cur, right], "proposed": proposed, "mixture": drawn, "agree": agree,
                  "accepted": k, "weight": r5(w),
                  "p_dllm": [r5(v) for v in pd[idx, tok].tolist()],
                  "p_helper": [r5(v) for v in pa[idx, tok].tolist()],
                  "p_mixture": [r5(v) for v in pm[idx, tok].tolist()]}
            if first < 0:
                ev["p_helper"][0] = None
            st = denoise_step(lay, x, prop, torch.arange(k), (cur, right),
                              plan={"plan": "apd", "mixture_weight": r5(w)}, apd=ev)
            for q in st.evidence["unmasked"]:
                commit_step[q] = step
            per_step.append(k)
            self.output_override = x[p0:].tolist()
            yield st
            cur += k
            step += 1
            if bool((x[p0:p0 + cur] == mask).any()):  # cannot happen: the accepted prefix is committed
                raise RuntimeError("apd left a mask behind its cursor")
        finish(self, ctx, lay, x[p0:].tolist(), commit_step, per_step,
               helper_forwards=len(per_step), max_lookahead=look,
               helper_agreement=round(agree_n / seen_n, 4) if seen_n else None)
