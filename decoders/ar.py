"""Shared mechanics of autoregressive decoders: the KV-cached forward loop, drawing a token
with the run's common random numbers (Gumbel-max or inverse CDF), and the ``dist``
evidence of a token step.

Every causal decoder builds on these, so that caching, sampling and evidence are written
once.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import torch

from decoders.base import Context, check_stop
from decoders.constraint import Stage, stage_for
from decoders.token_text import view_token
from playground.core.errors import PlaygroundError
from playground.core.models import crop_cache
from playground.core.trace import Step


class ARState:
    """A causal model's KV cache plus the ids it holds, with prefill/advance/rollback."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.cache = view.new_cache()
        self.ids: list[int] = []
        # the hidden states of the last forward, when it was asked for them (hidden_states=True)
        self.hidden: tuple[torch.Tensor, ...] | None = None

    def prefill(self, ids: Sequence[int], **kw: Any) -> torch.Tensor:
        """Run the prompt; return the last position's logits (1-D, float32)."""
        return self.advance(ids, **kw)

    def advance(self, ids: Sequence[int], **kw: Any) -> torch.Tensor:
        """Feed ``ids`` after what the cache holds; return the last position's logits."""
        return self.advance_all(ids, **kw)[-1]

    def advance_all(self, ids: Sequence[int], **kw: Any) -> torch.Tensor:
        """Feed ``ids``; return logits for every fed position, shape (len(ids), V). Extra
        keywords go to the view's forward (``hidden_states=True`` keeps them in ``hidden``)."""
        out = self.view.forward(list(ids), cache=self.cache, **kw)
        self.cache = out.cache
        self.hidden = out.hidden_states
        self.ids.extend(int(i) for i in ids)
        return out.logits[0]

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` positions of the cache."""
        if length < len(self.ids):
            crop_cache(self.cache, length)
            del self.ids[length:]


COUPLINGS = ("gumbel", "inverse_cdf")


# Most draws land among the most likely few tokens: a draw is first looked for among these,
# found by a partial sort, before the whole vocabulary is sorted (a stable argsort of 4,096
# float64 probabilities was the largest cost of a T = 1 speculative step after the forwards).
PREFIX = 64


def sample_index(probs: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from ``probs`` (1-D) with uniform ``u``.

    Tokens are laid out in descending probability (ties by id), so the same ``u`` picks a
    token of the same rank under two similar distributions. Exact for any ``u ~ U(0,1)``;
    never returns a token of probability 0. A distribution with no finite positive mass
    (all zero, NaN or inf) is a bug upstream: it raises PlaygroundError rather than
    returning an arbitrary id.
    """
    p = checked_probs(probs)
    if int(torch.count_nonzero(p)) == 1:
        # a point mass (greedy): every u lands on its token; no sort needed
        return int(torch.argmax(p))
    total = float(p.sum())
    if p.numel() > 2 * PREFIX:
        head = head_order(p)
        if head is not None and float(torch.cumsum(p[head], 0)[-1]) >= u * total:
            # the draw lands in the head, whose cumulative sums are the full layout's own
            return pick_in_order(p, head, u, total)
    return pick_in_order(p, descending_order(p), u, total)


def checked_probs(probs: torch.Tensor) -> torch.Tensor:
    """``probs`` as float64 on the CPU; PlaygroundError when it has no finite positive mass."""
    p = probs.detach().double().cpu()
    total_all = float(p.sum()) if p.numel() else 0.0
    if not (total_all > 0.0 and total_all < float("inf")) or bool((p < 0).any()):
        raise PlaygroundError("cannot draw a token: the distribution has no finite probability mass")
    return p


def descending_order(p: torch.Tensor) -> torch.Tensor:
    """Token ids by descending probability, ties by id: the layout of :func:`sample_index`."""
    return torch.argsort(-p, stable=True)


def head_order(p: torch.Tensor, n: int = PREFIX) -> torch.Tensor | None:
    """The first ``n`` ids of :func:`descending_order` without sorting all of ``p`` (a partial
    sort, then ties by id); None when a tie straddles the ``n``-th place, where which of the
    tied ids come first is for the full sort to say."""
    vals, idx = torch.topk(p, n)
    if int(torch.count_nonzero(p >= vals[-1])) != n:
        return None
    ids = torch.sort(idx).values
    return ids[torch.argsort(-p[ids], stable=True)]


def pick_in_order(p: torch.Tensor, order: torch.Tensor, u: float, total: float | None = None) -> int:
    """The inverse-CDF draw of :func:`sample_index` over a layout ``order`` of ``p``: the first
    token whose cumulative probability reaches ``u`` times the total mass ``total`` (``p``'s
    sum when not given).

    ``order`` may be the layout of a distribution some of whose tokens were set to 0 since
    (draws without replacement sort once): a zero adds nothing to the cumulative sums, so
    the positive tokens' sums are the ones a fresh sort gives, bit for bit, and the draw is
    the same token. It may also be only the head of the layout (:func:`head_order`) when the
    draw is known to land there: the head's cumulative sums are the full layout's first ones."""
    if total is None:
        total = float(p.sum())
    cdf = torch.cumsum(p[order], 0)
    j = int(torch.searchsorted(cdf, torch.tensor([u * total], dtype=torch.float64)).item())
    j = min(j, len(order) - 1)
    if float(p[order[j]]) == 0.0:
        # a removed token: the first live one after it (only at u = 0), else the last live before
        live = torch.nonzero(p[order[j:]] > 0)
        if live.numel():
            return int(order[j + int(live[0, 0])])
    while float(p[order[j]]) == 0.0 and j > 0:  # never land on a removed token
        j -= 1
    return int(order[j])


def gumbel_index(scores: torch.Tensor, noise: torch.Tensor) -> int:
    """Gumbel-max draw: ``argmax(scores + noise)`` over the tokens with a finite score.

    With ``scores`` the log-probabilities (or any logits whose softmax is the distribution)
    and ``noise`` i.i.d. standard Gumbel, the result is an exact draw. Removed tokens
    (score ``-inf``) are never drawn; no finite score raises PlaygroundError.
    """
    s = scores.detach().double().cpu()
    s = torch.where(torch.isnan(s), float("-inf"), s)
    if not bool(torch.isfinite(s).any()):
        raise PlaygroundError("cannot draw a token: the distribution has no finite probability mass")
    # The noise is finite, so a removed token (-inf) stays -inf and never wins.
    return int(torch.argmax(s + noise.detach().double().cpu()[: s.numel()]))


def draw(ctx: Context, pos: int, final: torch.Tensor, logits: torch.Tensor | None = None,
         coupling: str = "gumbel", stream: str = "sample") -> int:
    """Draw the token at ``pos`` from the final distribution ``final`` with the run's
    common random numbers.

    ``gumbel`` (the default): ``argmax(logits + g)`` with the per-(seed, position, token)
    noise ``g = ctx.gumbel(pos, V, stream)`` shared by every lane, over the tokens ``final``
    keeps. ``logits`` are the processed logits ``final`` is the softmax of (their kept values
    are bit-identical across lanes that only truncate, so the coupling is exact); without
    them ``log(final)`` is used. A filter that keeps the token an unfiltered lane drew
    therefore draws it too. ``inverse_cdf``: :func:`sample_index` with ``ctx.uniform(pos,
    stream)`` (one shared uniform, tokens by descending probability).
    """
    if coupling == "inverse_cdf":
        return sample_index(final, ctx.uniform(pos, stream))
    if coupling != "gumbel":
        raise PlaygroundError(f"unknown coupling {coupling!r}; choose one of: {', '.join(COUPLINGS)}")
    f = final.detach().double().cpu()
    if logits is None:
        scores = torch.log(f)
    else:
        # A token whose probability underflowed to 0 counts as removed, so the drawn token
        # always has a non-zero final probability.
        scores = torch.where(f > 0, logits.detach().double().cpu(), torch.full_like(f, float("-inf")))
    return gumbel_index(scores, ctx.gumbel(pos, scores.numel(), stream))


def entropy_of(logits: torch.Tensor) -> float:
    """Entropy in nats of softmax(logits) (1-D)."""
    logp = torch.log_softmax(logits.float(), -1)
    return float(-(logp.exp() * torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))).sum())


def dist_evidence(view: Any, raw_logits: torch.Tensor, final_probs: torch.Tensor, chosen: int,
                  k: int = 20) -> dict[str, Any]:
    """The ``dist`` field of a token step: top-K raw vs final probabilities and more.

    ``top_ids`` are the K most probable tokens under the *raw* distribution, plus the
    chosen token if it is not among them.
    """
    # evidence is read on the CPU: the two inputs can live on different devices (a correction
    # drawn from a CPU residual against the target's CUDA logits)
    raw_logits = raw_logits.detach().float().cpu()
    final_probs = final_probs.detach().float().cpu()
    raw = torch.softmax(raw_logits, -1)
    top = torch.topk(raw, min(k, raw.numel())).indices.tolist()
    if chosen not in top:
        top.append(int(chosen))
    rank = int((raw > raw[chosen]).sum().item())
    kept = float((final_probs > 0).float().mul(raw).sum().item())
    at = torch.tensor(top)  # one gather per vector, not one indexing per token: this runs every step
    return {
        "top_ids": top,
        "top_tokens": [view_token(view, t) for t in top],
        "raw_probs": [round(x, 6) for x in raw[at].tolist()],
        "final_probs": [round(x, 6) for x in final_probs[at].tolist()],
        "entropy": round(entropy_of(raw_logits), 5),
        "chosen": int(chosen),
        "chosen_rank": rank,
        "kept_mass": round(kept, 6),
    }


def watch_evidence(raw_logits: torch.Tensor, final_probs: torch.Tensor, ids: Sequence[int]) -> dict[str, Any]:
    """The ``watch`` field of a token step: for each watched token id (the run's ``watch``
    list), its probability under the model (``raw_p``), after the decoder's rule
    (``final_p``) and its raw rank (``raw_rank``: tokens strictly more probable, 0 = top, as
    :func:`dist_evidence` counts it), however far outside the top-K it is. Keyed by the id as
    text (JSON object keys); probabilities to four significant digits."""
    raw = torch.softmax(raw_logits.detach().float().cpu().reshape(-1), -1)
    final = final_probs.detach().float().cpu().reshape(-1)
    out: dict[str, Any] = {}
    for t in ids:
        if 0 <= int(t) < raw.numel():
            out[str(int(t))] = {"raw_p": float(f"{float(raw[t]):.4g}"), "final_p": float(f"{float(final[t]):.4g}"),
                                "raw_rank": int((raw > raw[t]).sum())}
    return out


def watch_field(ctx: Context, raw_logits: torch.Tensor, final_probs: torch.Tensor) -> dict[str, Any]:
    """``{"watch": watch_evidence(...)}`` for a step's evidence when the run watches tokens, else ``{}``."""
    return {"watch": watch_evidence(raw_logits, final_probs, ctx.watch)} if ctx.watch else {}


Picker = Callable[[torch.Tensor, int, list[int]], "tuple[torch.Tensor, int]"]


LENS_TOP = 5  # tokens the logit lens records per layer


def lens_evidence(view: Any, hidden: Sequence[torch.Tensor] | None, logits: torch.Tensor, chosen: int,
                  k: int = LENS_TOP, pinned: Sequence[int] = ()) -> dict[str, Any]:
    """The ``lens`` field of a token step: what each layer's hidden state predicts.

    ``hidden`` are the forward's hidden states (embeddings, then after each decoder layer);
    each but the last goes through the model's final norm and LM head at the last position
    (``view.lm_head``: no forward, nothing counted). The last entry is the forward's own
    ``logits``: transformers returns the last hidden state already normed, and the final
    layer through the norm and head *is* the model's output, so the lens ends exactly on the
    step's raw distribution. Records per layer the top ``k`` tokens and their probabilities,
    and the chosen token's probability and rank; with ``pinned`` token ids (the run's watched
    tokens), each one's probability and rank per layer too (``pinned: {id: {"probs", "ranks"}}``),
    so a reader can follow a token of their choice through the layers.
    """
    if not hidden:
        raise PlaygroundError(f"model {getattr(view, 'name', '?')!r} returns no hidden states; "
                              "the logit lens needs them (set logit_lens=false)")
    rows = [torch.softmax(logits.float().reshape(-1), -1)]
    if len(hidden) > 1:
        inner = view.lm_head(torch.stack([h[0, -1] for h in hidden[:-1]]))
        rows = list(torch.softmax(inner.float().to(rows[0].device), -1)) + rows
    probs = torch.stack(rows)
    top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
    p_chosen = probs[:, int(chosen)]
    extra: dict[str, Any] = {}
    ids = [int(t) for t in pinned if 0 <= int(t) < probs.shape[-1]]
    if ids:
        # one token at a time: a layers x pinned x vocabulary comparison is large for a real model
        extra["pinned"] = {str(t): {"probs": [float(f"{float(p):.4g}") for p in probs[:, t]],
                                    "ranks": (probs > probs[:, t:t + 1]).sum(-1).tolist()} for t in ids}
    return {
        "layers": list(range(len(probs))),
        "top_ids": top.indices.tolist(),
        "top_tokens": [[view_token(view, t) for t in row] for row in top.indices.tolist()],
        "top_probs": [[round(float(p), 6) for p in row] for row in top.values],
        "chosen": int(chosen),
        "chosen_probs": [round(float(p), 6) for p in p_chosen],
        # rank = how many tokens are strictly more probable (0 = top), as dist_evidence counts it
        "chosen_ranks": (probs > p_chosen[:, None]).sum(-1).tolist(),
        **extra,
    }


def token_loop(ctx: Context, pick: Picker, decoder: Any) -> Iterator[Step]:
    """The plain autoregressive loop: one forward, one token, one ``token`` step.

    ``pick(raw_logits, position, output_so_far) -> (final_probs, token)`` is the rule that
    makes each decoder what it is. Sets ``decoder.finish_reason``. With the ``logit_lens``
    knob on, the same forwards also return their hidden states and every step records
    :func:`lens_evidence` under ``lens`` (no extra forward).
    """
    lens = bool(ctx.params.get("logit_lens", False))
    kw: dict[str, Any] = {"hidden_states": True} if lens else {}
    state = ARState(ctx.target)
    stage = constraint_stage(ctx)
    row = stage.row() if stage else None
    logits = state.prefill(stage.heal(ctx.prompt_ids) if stage else ctx.prompt_ids, **kw)
    if stage is not None and stage.heal_text:
        # the output starts by re-spelling the prompt's last token: say so, the page shows both
        decoder.extra_stats["token_healing"] = {"prompt_token": int(ctx.prompt_ids[-1]), "text": stage.heal_text}
    out: list[int] = []
    for pos in range(ctx.max_new_tokens):
        ctx.check_cancel()
        cev: dict[str, Any] | None = None
        pre: list[dict[str, Any]] = []
        if row is not None:
            # the constraint acts before the picker's chain: it sees only the allowed tokens;
            # its stages open the step's chain evidence (with the draw's noise where the
            # decoder draws by Gumbel-max: its ``coupling`` knob says so)
            noise = ctx.gumbel(pos, logits.numel()) if ctx.params.get("coupling") == "gumbel" else None
            masked, cev = row.apply(logits, pre, noise)
            final, tok = pick(masked, pos, out)
        else:
            final, tok = pick(logits, pos, out)
        picked, tok = tok, ctx.force.get(pos, tok)
        ev: dict[str, Any] = {"dist": dist_evidence(ctx.target, logits, final, tok, ctx.top_k_evidence)}
        if cev is not None:
            ev["constraint"] = cev
        if pre:
            ev["chain"] = pre
        ev.update(watch_field(ctx, logits, final))
        if pos in ctx.force:
            # a branch's forced token: the step keeps the model's distribution and what it picked
            ev["forced"] = [{"position": pos, "token": tok, "picked": picked}]
        if lens:
            ev["lens"] = lens_evidence(ctx.target, state.hidden, logits, tok, pinned=ctx.watch)
        if row is not None:
            row.advance(tok)
            decoder.extra_stats["constraint_complete"] = row.accepting
        yield Step("token", [tok], **ev)
        out.append(tok)
        reason = check_stop(ctx, out, ctx.target.decode)
        if reason:
            decoder.finish_reason = reason
            return
        if row is not None and row.done:
            decoder.finish_reason = "constraint"
            return
        if pos + 1 < ctx.max_new_tokens:
            logits = state.advance([tok], **kw)
    decoder.finish_reason = "length"


def constraint_stage(ctx: Context) -> Stage | None:
    """The run's constraint stage, or None when the decoder has no constraint knob set."""
    return stage_for(ctx.target, ctx.params, ctx.max_new_tokens)  # the budget: json_close counts from it


def greedy_probs(logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A one-hot final distribution on the argmax (lowest id on ties, like torch.argmax)."""
    tok = int(torch.argmax(logits))
    final = torch.zeros_like(logits, dtype=torch.float32)
    final[tok] = 1.0
    return final, tok
