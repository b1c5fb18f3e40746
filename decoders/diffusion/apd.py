"""APD: adaptive parallel decoding, a small causal model deciding how many tokens to take.

Israel, Van den Broeck & Grover 2025 (A094) invert speculative decoding: the diffusion LM
proposes a run of tokens in parallel from its marginals, and a *small* autoregressive
helper (the draft slot) says how long a prefix of that run to keep. The target is the
multiplicative mixture ``p_T ∝ p_D^w · p_AR^(1-w)`` of the diffusion marginal ``p_D`` and the
helper's conditional ``p_AR``; the proposal and a draw from ``p_T`` share their random numbers
(the universal coupling), and the proposal is accepted up to the first position where the
two draws differ. Where the dLLM is sure *and* the helper agrees, many tokens go in one pass.

Infilling (the ``fixed`` knob, :mod:`decoders.diffusion.fixed`): fixed words are written into
the canvas before the first pass and are given context, never proposals: the window counts
only masked positions, both models read the fixed tokens in place, and the acceptance walks
over them (a fixed cell can neither be rejected nor end the accepted prefix).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from decoders.base import Context, Float, Int, Params, register
from decoders.citation import Paper, arxiv
from decoders.diffusion._canvas import finish, gen_logits, make_layout, new_canvas, r5
from decoders.diffusion._sampler import Recipe, denoise_step, gumbel_tokens, propose
from decoders.diffusion.fixed import fixed_param, place_fixed
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


def skip_given(given: Sequence[bool], q: int) -> int:
    """The first position from ``q`` on that is not given (fixed), or ``len(given)``."""
    while q < len(given) and given[q]:
        q += 1
    return q


def window_end(given: Sequence[bool], cur: int, look: int) -> int:
    """End (exclusive) of the pass's window from ``cur``: just past its ``look``-th masked
    position, then past any fixed cells right after it (context that adds no mask, so the
    dLLM sees it for free), or the canvas end. ``look`` caps the *masked* input, as the
    paper's cap does, so fixed cells never shrink a pass's proposals."""
    q, seen = cur, 0
    while q < len(given) and seen < look:
        seen += not given[q]
        q += 1
    return skip_given(given, q)


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
    agree and how many were accepted. Fixed words (``fixed``) are given context: the window
    counts ``max_lookahead`` *masked* positions and holds the fixed cells among them in place
    for both models; a window may only see a fixed word once it reaches it, unless
    ``max_lookahead`` is 0. The acceptance skips fixed cells (the first *masked* proposal
    always stands; later ones are kept while they agree, across any fixed cells), and the
    cursor jumps over them. The per-position evidence covers every window position: at a fixed
    cell the proposal and the draw are the fixed token, ``agree``, ``p_dllm`` and
    ``p_mixture`` are null and ``p_helper`` is the helper's probability of the fixed token;
    ``accepted`` is how far the pass moved along the window (fixed cells included),
    ``committed`` how many proposals it committed and ``given`` the window's fixed cells.
    Views: *Helper vs dLLM* (both probabilities per window position, the accepted prefix
    marked) and *Parallel length per step*.
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
        fixed=fixed_param(),
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
        fixed = place_fixed(ctx, p.get("fixed", ""), g, p0, x)
        given = [False] * g
        for q in fixed:
            given[q] = True
        extra: dict[str, Any] = {"fixed": fixed} if fixed else {}
        commit_step = [-1] * g
        per_step: list[int] = []
        agree_n = seen_n = 0
        cur, step = skip_given(given, 0), 0
        while cur < g:
            ctx.check_cancel()
            right = window_end(given, cur, look)
            logits = gen_logits(ctx.target, x[:p0 + right], lay)[0]
            # proposals only where the window is masked; fixed cells are read, not proposed
            pos = torch.tensor([q for q in range(cur, right) if not given[q]], dtype=torch.long)
            prop = propose(ctx, rc, logits, pos, step, cur / g, None, {})
            proposed = prop.tokens.tolist()
            win = x[p0 + cur:p0 + right].clone()
            win[pos - cur] = prop.tokens
            # the helper reads the committed text, then the window (proposals and fixed tokens in
            # place); its row j predicts token j + 1
            seq = torch.cat([x[:p0 + cur], win])
            a = fit_logits(helper.forward(seq).logits[0].float().cpu(), logits.shape[-1])
            first = p0 + cur - 1
            rows_win = a[max(first, 0):p0 + right - 1]
            if first < 0:  # no prompt and nothing committed: the helper cannot score position 0
                rows_win = torch.cat([logits[:1], rows_win])
            idx = pos - cur
            rows = rows_win[idx]
            d = logits[pos]
            mix = mixture_logits(d, rows, w)
            drawn = gumbel_tokens(ctx, mix, pos, step, rc.temperature).tolist()
            k = accepted_length(proposed, drawn)  # over the masked positions: fixed cells skipped
            agree = [bool(t == m) for t, m in zip(proposed, drawn)]
            agree_n += sum(agree[1:])
            seen_n += len(agree) - 1
            # the pass moves to its first rejected proposal, past any fixed cells before it
            moved = (int(pos[k]) if k < len(proposed) else right) - cur
            pd = torch.softmax(d.double(), -1)
            pa = torch.softmax(rows_win.double(), -1)
            pm = torch.softmax(mix.double(), -1)
            win_ids = win.tolist()
            ev_p_helper = [r5(v) for v in pa[torch.arange(right - cur), win].tolist()]
            if first < 0:
                ev_p_helper[0] = None
            at = {q - cur: n for n, q in enumerate(pos.tolist())}  # window index -> proposal index
            ev = {"window": [cur, right], "proposed": win_ids,
                  "mixture": [drawn[at[j]] if j in at else win_ids[j] for j in range(right - cur)],
                  "agree": [agree[at[j]] if j in at else None for j in range(right - cur)],
                  "accepted": moved, "committed": k, "weight": r5(w),
                  "p_dllm": [r5(float(pd[at[j], win_ids[j]])) if j in at else None for j in range(right - cur)],
                  "p_helper": ev_p_helper,
                  "p_mixture": [r5(float(pm[at[j], win_ids[j]])) if j in at else None
                                for j in range(right - cur)]}
            if fixed:
                ev["given"] = [q for q in range(cur, right) if given[q]]
            st = denoise_step(lay, x, prop, torch.arange(k), (cur, right),
                              plan={"plan": "apd", "mixture_weight": r5(w)}, apd=ev, **extra)
            for q in st.evidence["unmasked"]:
                commit_step[q] = step
            per_step.append(k)
            self.output_override = x[p0:].tolist()
            yield st
            cur = skip_given(given, cur + moved)
            step += 1
            if bool((x[p0:p0 + cur] == mask).any()):  # cannot happen: the accepted prefix is committed
                raise RuntimeError("apd left a mask behind its cursor")
        finish(self, ctx, lay, x[p0:].tolist(), commit_step, per_step,
               helper_forwards=len(per_step), max_lookahead=look,
               helper_agreement=round(agree_n / seen_n, 4) if seen_n else None)
