"""The one composable masked-diffusion sampler.

Each step runs the model once on the canvas (prompt + generated part, mask id where still
masked), proposes a token for every masked position, scores the positions, and commits
some of them. Four choices are pluggable (a :class:`Recipe` holds them):

* **token** -- ``gumbel`` (LLaDA): argmax of ``exp(logits) / (-log u) ** temperature`` in
  float64, confidence = softmax probability of that token under the raw logits;
  ``categorical`` (Dream): logits / temperature, top-p then top-k per position, then a draw
  (argmax at temperature 0), confidence = probability under that processed distribution.
* **score** -- ``prob`` (top-1 probability of the proposed token), ``margin`` (top-1 minus
  top-2 probability), ``neg_entropy``, ``random``; optionally PC-Sampler's calibration
  (A157) and position weight, and CreditDecoding's accumulated credit (A239).
* **plan** -- ``even`` (LLaDA: ``mask_count // steps`` per step of each block, the
  remainder to the first steps), ``dream`` (``1 - s/t`` of the masked positions over
  ``linspace(1, eps, steps + 1)``, the rest on the last step), ``origin`` (Dream's random
  order: each masked position with probability ``1 - s/t``), ``ascending`` (ASS, A149: few
  commits in the first steps of a block and geometrically more later), ``threshold``
  (Fast-dLLM, A043: every position scoring above the threshold, and at least the best one);
  on top of these an early **exit** (SchED A214, Prophet A268) commits everything at once.
* **blocks** -- semi-autoregressive blocks of ``block_length``; positions after the current
  block are never committed early (except by an early exit, which commits all); optionally
  with Fast-dLLM's prefix or dual KV cache (``cache``, approximate: see
  ``decoders.diffusion.block_cache``), refreshed at each block's first step.

Randomness comes from the run's common random numbers, keyed by the step index and the
generated position (``ctx.uniforms``), so a run is deterministic per seed and two decoders
with the same seed see the same noise at the same step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from decoders.base import Context
from decoders.diffusion._canvas import (Layout, finish, gen_logits, make_layout, new_canvas,
                                        per_position, r5, stop_set)
from decoders.diffusion.block_cache import CACHE_MODES, make_cache
from decoders.diffusion.fixed import place_fixed
from decoders.diffusion.hand import apply_hand, check_hand, mark_hand, parse_hand, replan, top_choices, unused
from playground.core.errors import PlaygroundError
from playground.core.trace import Step

SCORES = ("prob", "margin", "neg_entropy", "random")
PLANS = ("even", "dream", "origin", "ascending", "threshold")
EXITS = ("none", "sched", "prophet")
TOKEN_SAMPLERS = ("gumbel", "categorical")
SCHED_SHAPES = ("linear", "cosine", "exp")


@dataclass
class Recipe:
    """Every choice of the sampler (see the module docstring); defaults are LLaDA's."""

    gen_length: int = 0
    steps: int = 0
    block_length: int = 0
    score: str = "prob"
    plan: str = "even"
    token: str = "gumbel"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    alg_temp: float = 0.0
    cfg_scale: float = 0.0
    eps: float = 1e-3
    threshold: float = 0.9
    # Ascending step size (A149): ratio of one step's commits to the previous step's
    growth: float = 2.0
    # PC-Sampler (A157)
    position_decay: float = 0.0
    calibrate: bool = False
    calib_clip: float = 10.0
    # CreditDecoding (A239)
    credit_weight: float = 0.0
    credit_decay: float = 0.7
    # EOS early rejection (A149)
    eos_penalty: float = 0.0
    # early exit
    exit: str = "none"
    sched_high: float = 0.9
    sched_low: float = 0.3
    sched_shape: str = "cosine"
    prophet_early: float = 7.5
    prophet_mid: float = 5.0
    prophet_late: float = 2.5
    prophet_aggregate: str = "mean"
    # infilling: "pos:text; ..." written into the canvas before the first step (decoders.diffusion.fixed)
    fixed: str = ""
    # Fast-dLLM's block KV cache, approximate: none | prefix | dual (decoders.diffusion.block_cache)
    cache: str = "none"

    def check(self) -> None:
        """Reject unknown choices (a bug in a named decoder, or a bad generic knob)."""
        for name, val, allowed in (("score", self.score, SCORES), ("plan", self.plan, PLANS),
                                   ("exit", self.exit, EXITS), ("token", self.token, TOKEN_SAMPLERS),
                                   ("sched_shape", self.sched_shape, SCHED_SHAPES),
                                   ("cache", self.cache, CACHE_MODES)):
            if val not in allowed:
                raise PlaygroundError(f"{name} {val!r} is not one of: {', '.join(allowed)}")
        if self.exit != "none" and self.plan == "threshold":
            raise PlaygroundError("an early exit needs a fixed step schedule; use plan even, dream or origin")


# ---------------------------------------------------------------------- schedules
def even_schedule(mask_count: int, steps: int) -> list[int]:
    """LLaDA's ``get_num_transfer_tokens``: ``mask_count // steps`` each, remainder first."""
    base, rem = divmod(int(mask_count), int(steps))
    return [base + (1 if i < rem else 0) for i in range(steps)]


def ascending_schedule(mask_count: int, steps: int, growth: float = 2.0) -> list[int]:
    """ASS: commits per step growing by ``growth`` each step, summing to ``mask_count``.

    The cumulative count after step ``i`` is ``n * (growth^(i+1) - 1) / (growth^steps - 1)``
    rounded half up, so with ``n = 2^steps - 1`` and growth 2 the steps commit exactly
    1, 2, 4, ..., 2^(steps-1), as the authors' scheduler does; for another ``n`` the last step
    takes what is left. ``growth`` 1 spreads the commits evenly. Every step commits at least
    one position (``steps`` may not exceed ``mask_count``).
    """
    n, s = int(mask_count), int(steps)
    if s <= 0 or n < s:
        raise PlaygroundError(f"an ascending schedule needs 1 to {n} steps, not {s}")
    g = float(growth)
    out, prev = [], 0
    for i in range(s):
        if i == s - 1:
            cum = n
        else:
            # (g^(i+1) - 1) / (g^s - 1), written with negative powers so a long canvas cannot overflow
            frac = (i + 1) / s if g <= 1.0 + 1e-9 else (g ** (i + 1 - s) - g ** -s) / (1 - g ** -s)
            cum = min(max(math.floor(n * frac + 0.5), prev + 1), n - (s - 1 - i))
        out.append(cum - prev)
        prev = cum
    return out


def ascending_steps(mask_count: int, growth: float = 2.0) -> int:
    """The fewest steps of a pure geometric schedule from one commit: the smallest ``s`` with
    ``1 + growth + ... + growth^(s-1) >= mask_count`` (``mask_count`` steps at growth 1)."""
    n, g = int(mask_count), float(growth)
    if g <= 1.0 + 1e-9:
        return max(n, 1)
    s, total, k = 0, 0.0, 1.0
    while total < n:
        total += k
        k *= g
        s += 1
    return max(min(s, n), 1)


def dream_timesteps(steps: int, eps: float) -> torch.Tensor:
    """Dream's time grid ``linspace(1, eps, steps + 1)`` (float32, as Dream computes it)."""
    return torch.linspace(1.0, eps, steps + 1, dtype=torch.float32)


def dream_count(n_masked: int, ts: torch.Tensor, i: int) -> int:
    """Positions Dream commits at step ``i``: ``int(n * (1 - s/t))``, all on the last step."""
    if i >= len(ts) - 2:
        return int(n_masked)
    t, s = ts[i], ts[i + 1]
    return int(float(torch.tensor(float(n_masked), dtype=torch.float32) * (1 - s / t)))


def sched_threshold(progress: float, hi: float, lo: float, shape: str) -> float:
    """SchED's smooth threshold: from ``hi`` at progress 0 down to ``lo`` at progress 1."""
    p = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        f = p
    elif shape == "cosine":
        f = 0.5 * (1 - math.cos(math.pi * p))
    else:  # exp: falls fast early, then flattens
        f = (1 - math.exp(-5 * p)) / (1 - math.exp(-5))
    return hi + (lo - hi) * f


def prophet_threshold(progress: float, early: float, mid: float, late: float) -> float:
    """Prophet's staged gap threshold: thirds of the decoding progress."""
    return early if progress < 1 / 3 else mid if progress < 2 / 3 else late


# ---------------------------------------------------------------------- token proposal
@dataclass
class Proposal:
    """What one forward says about the masked positions ``pos`` (all 1-D, aligned)."""

    pos: torch.Tensor          # generated positions (long)
    tokens: torch.Tensor       # proposed token per position (long)
    conf: torch.Tensor         # probability of the proposed token (float64)
    margin: torch.Tensor       # top-1 minus top-2 probability
    entropy: torch.Tensor      # nats
    gap: torch.Tensor          # top-1 minus top-2 logit (raw logits)
    score: torch.Tensor        # what the plan ranks by
    top1: torch.Tensor         # argmax of the processed distribution (for credit)


def gumbel_tokens(ctx: Context, rows: torch.Tensor, pos: torch.Tensor, step: int,
                  temperature: float) -> torch.Tensor:
    """LLaDA's ``add_gumbel_noise`` + argmax, in float64, with common random numbers.

    The noise of (step, position) is ``ctx.uniforms`` keyed by both, so the one-token-per-
    step decoder and a self-speculative decoder that verifies the same step agree.
    """
    if temperature <= 0:
        return rows.argmax(-1)
    v = rows.shape[-1]
    u = np.stack([ctx.uniforms((step << 20) + int(p), v, "diffusion-gumbel") for p in pos.tolist()])
    noise = torch.from_numpy(u)
    gumbel = (-torch.log(noise)) ** temperature
    return (rows.double().exp() / gumbel).argmax(-1)


def top_p_filter(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """Dream's ``top_p_logits``: keep the smallest descending set with mass >= top_p."""
    if top_p >= 1.0:
        return z
    sorted_z, idx = torch.sort(z, -1, descending=True)
    cum = torch.softmax(sorted_z, -1).cumsum(-1)
    drop = cum > top_p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    mask = torch.zeros_like(drop).scatter(-1, idx, drop)
    return z.masked_fill(mask, float("-inf"))


def top_k_filter(z: torch.Tensor, top_k: int) -> torch.Tensor:
    """Dream's ``top_k_logits``: keep the ``top_k`` largest logits per row."""
    if top_k <= 0 or top_k >= z.shape[-1]:
        return z
    kth = torch.topk(z, top_k, -1).values[..., -1:]
    return z.masked_fill(z < kth, float("-inf"))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row-wise inverse-CDF draw in descending-probability order (like ``ar.sample_index``)."""
    order = torch.argsort(-probs, dim=-1, stable=True)
    sp = torch.gather(probs, -1, order)
    cdf = sp.cumsum(-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    j = torch.searchsorted(cdf, target).squeeze(-1)
    nonzero = (sp > 0).sum(-1)
    j = torch.minimum(j, (nonzero - 1).clamp(min=0))
    return order.gather(-1, j.unsqueeze(-1)).squeeze(-1)


def stats_of(probs: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(confidence of ``tokens``, top1 - top2 margin, entropy in nats) per row, float64."""
    p = probs.double()
    conf = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    top2 = torch.topk(p, min(2, p.shape[-1]), -1).values
    margin = top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0)
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    ent = -(p * logp).sum(-1)
    return conf, margin, ent


class Credit:
    """CreditDecoding's trace credit (A239): per position, per token, a decayed sum.

    After each step, every position's credit decays by ``decay`` and the token that is
    top-1 now gains its probability. Before the next step's choice the credit is fused into
    the logits as ``log_softmax(logits) + weight * log(1 + credit)``, so a token the model
    has kept predicting reaches the threshold sooner than its current confidence alone.
    """

    def __init__(self, g: int, v: int, weight: float, decay: float) -> None:
        self.c = torch.zeros(g, v, dtype=torch.float32)
        self.weight, self.decay = weight, decay

    def fuse(self, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits fused with the credit accumulated so far at ``pos``."""
        return torch.log_softmax(rows, -1) + self.weight * torch.log1p(self.c[pos])

    def update(self, raw_probs: torch.Tensor, pos: torch.Tensor) -> None:
        """Decay, then credit each position's current top-1 token with its probability."""
        top_p, top_i = raw_probs.max(-1)
        self.c[pos] *= self.decay
        self.c[pos, top_i] += top_p.float()


def propose(ctx: Context, rc: Recipe, logits: torch.Tensor, pos: torch.Tensor, step: int,
            progress: float, credit: Credit | None, prior: dict[str, Any]) -> Proposal:
    """Token, statistics and score of every masked position ``pos`` from one forward.

    ``logits`` are the generated part's (G, V); ``progress`` is the committed fraction
    (it scales the EOS penalty); ``prior`` caches PC-Sampler's token prior between steps.
    """
    raw = logits[pos].float()
    rows = raw
    if rc.eos_penalty > 0:
        ids = sorted(stop_set(ctx))
        if ids:
            pen = torch.zeros(rows.shape[-1])
            pen[ids] = rc.eos_penalty * (1.0 - progress)
            rows = rows - pen
    if credit is not None:
        rows = credit.fuse(rows, pos)
    g = logits.shape[0]
    if rc.token == "categorical":
        z = rows.double()
        if rc.temperature > 0:
            z = z / rc.temperature
        z = top_k_filter(top_p_filter(z, rc.top_p), rc.top_k)
        probs = torch.softmax(z, -1)
        if rc.temperature > 0:
            u = torch.from_numpy(ctx.uniforms(step, g, "diffusion-token"))[pos]
            tokens = inverse_cdf(probs, u)
        else:
            tokens = probs.argmax(-1)
    else:
        probs = torch.softmax(rows.float(), -1)  # float32, as LLaDA's confidence
        tokens = gumbel_tokens(ctx, rows, pos, step, rc.temperature)
    conf, margin, ent = stats_of(probs, tokens)
    if credit is not None:
        credit.update(torch.softmax(raw, -1), pos)
    top2 = torch.topk(raw.double(), min(2, raw.shape[-1]), -1).values
    gap = top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0)
    if rc.score == "prob":
        score = conf.clone()
    elif rc.score == "margin":
        score = margin.clone()
    elif rc.score == "neg_entropy":
        p = probs.double()
        score = (p * torch.log(p + 1e-10)).sum(-1)
    else:
        score = torch.from_numpy(ctx.uniforms(step, g, "diffusion-order"))[pos]
    if rc.calibrate:
        if "logprior" not in prior:
            # The token prior is the model's average prediction over the masked canvas at the
            # first step: a corpus-frequency estimate that needs no corpus and no extra pass.
            prior["logprior"] = torch.softmax(raw.double(), -1).mean(0).clamp_min(1e-300).log()
        score = _scale(score, (-prior["logprior"][tokens]).clamp(min=1e-6, max=rc.calib_clip))
    if rc.position_decay > 0:
        score = _scale(score, torch.exp(-rc.position_decay * pos.double()))
    return Proposal(pos=pos, tokens=tokens, conf=conf, margin=margin, entropy=ent, gap=gap,
                    score=score, top1=probs.argmax(-1))


def _scale(score: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Weight a score by ``w`` > 0 so that a smaller weight always ranks lower.

    Multiplying works for positive scores; a negative score (negative entropy) is divided
    instead, which moves it away from zero, i.e. down the ranking, as the weight shrinks.
    """
    return torch.where(score >= 0, score * w, score / w)


# ---------------------------------------------------------------------- selection
def top_k_positions(score: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest scores (ties: the leftmost first)."""
    return torch.argsort(-score, stable=True)[:k]


def sample_positions(ctx: Context, score: torch.Tensor, k: int, alg_temp: float, step: int,
                     pos: torch.Tensor, g: int) -> torch.Tensor:
    """Dream's ``alg_temp``: ``k`` positions drawn without replacement from softmax(score/T).

    Drawn with the Gumbel-top-k trick (the same law as ``torch.multinomial`` without
    replacement) so that it uses the run's common random numbers.
    """
    logw = torch.log_softmax(score.double() / alg_temp, -1)
    u = torch.from_numpy(ctx.uniforms(step, g, "diffusion-alg"))[pos].clamp(1e-300, 1 - 1e-16)
    keys = logw - torch.log(-torch.log(u))
    return top_k_positions(keys, k)


def select(ctx: Context, rc: Recipe, lay: Layout, prop: Proposal, eligible: torch.Tensor,
           i: int, step: int, ts: torch.Tensor | None, schedule: list[int]) -> tuple[torch.Tensor, dict]:
    """Indices (into ``prop``) to commit this step under the plan, and the plan's evidence."""
    idx = eligible.nonzero().squeeze(1)
    n = int(idx.numel())
    g = lay.gen_length
    if rc.plan == "threshold":
        s = prop.score[idx]
        best = top_k_positions(s, 1)
        keep = (s > rc.threshold)
        keep[best] = True
        return idx[keep], {"plan": "threshold", "threshold": rc.threshold}
    if rc.plan == "origin":
        last = i >= lay.steps_per_block - 1
        p_transfer = 1.0 if last else float(1 - ts[i + 1] / ts[i])
        u = torch.from_numpy(ctx.uniforms(step, g, "diffusion-order"))[prop.pos[idx]]
        return idx[u < p_transfer], {"plan": "origin", "p_transfer": r5(p_transfer)}
    k = schedule[i] if rc.plan in ("even", "ascending") else dream_count(n, ts, i)
    k = min(k, n)
    if k <= 0:
        return idx[:0], {"plan": rc.plan, "k": 0}
    if rc.alg_temp > 0:
        chosen = sample_positions(ctx, prop.score[idx], k, rc.alg_temp, step, prop.pos[idx], g)
    else:
        chosen = top_k_positions(prop.score[idx], k)
    return idx[chosen], {"plan": rc.plan, "k": k}


def early_exit(rc: Recipe, prop: Proposal, progress: float) -> dict[str, Any] | None:
    """SchED / Prophet: the aggregate over every masked position and its threshold."""
    if rc.exit == "none" or prop.pos.numel() == 0:
        return None
    if rc.exit == "sched":
        agg = float(prop.margin.mean())
        thr = sched_threshold(progress, rc.sched_high, rc.sched_low, rc.sched_shape)
    else:
        agg = float(prop.gap.mean() if rc.prophet_aggregate == "mean" else prop.gap.min())
        thr = prophet_threshold(progress, rc.prophet_early, rc.prophet_mid, rc.prophet_late)
    return {"rule": rc.exit, "aggregate": r5(agg), "threshold": r5(thr), "exit": bool(agg >= thr)}


# ---------------------------------------------------------------------- the loop
def denoise_step(lay: Layout, x: torch.Tensor, prop: Proposal, chosen: torch.Tensor,
                 block: tuple[int, int], **extra: Any) -> Step:
    """Commit ``chosen`` (indices into ``prop``) into ``x`` and build the ``denoise`` step.

    Step fields (positions relative to the generated part; the prompt is not included):
    ``committed`` the token ids committed, in position order; ``canvas`` the generated part
    after this step, ``mask_id`` where still masked; ``unmasked`` the positions committed;
    ``remasked`` always empty (these samplers never take back a committed token);
    ``predicted`` the token proposed at every position that was masked when the step began;
    ``confidence`` (probability of that token), ``entropy`` (nats), ``margin`` (top-1 minus
    top-2 probability) and ``score`` (what the plan ranked by) at those positions, null
    elsewhere; ``block`` the current block as ``[start, end)``; plus the plan's evidence
    (and ``cache`` where a block KV cache is on: see :meth:`BlockCache.logits`).
    """
    p0, g = lay.prompt_len, lay.gen_length
    order = torch.argsort(prop.pos[chosen])
    chosen = chosen[order]
    cpos = prop.pos[chosen]
    x[p0 + cpos] = prop.tokens[chosen]
    pos = prop.pos.tolist()
    predicted: list[int | None] = [None] * g
    for p, t in zip(pos, prop.tokens.tolist()):
        predicted[p] = int(t)
    return Step(
        "denoise", prop.tokens[chosen].tolist(),
        canvas=x[p0:].tolist(), mask_id=lay.mask_id,
        unmasked=cpos.tolist(), remasked=[],
        predicted=predicted,
        confidence=per_position(g, pos, prop.conf.tolist()),
        entropy=per_position(g, pos, prop.entropy.tolist()),
        margin=per_position(g, pos, prop.margin.tolist()),
        score=per_position(g, pos, prop.score.tolist()),
        block=[int(block[0]), int(block[1])],
        **extra,
    )


def run_recipe(ctx: Context, rc: Recipe, decoder: Any) -> Iterator[Step]:
    """Decode with the sampler ``rc``, yielding one ``denoise`` step per forward pass.

    Sets ``decoder.output_override`` (the canvas so far after each step; the trimmed final
    canvas at the end, see :func:`_canvas.trim_output`), ``finish_reason`` and
    ``extra_stats`` (``steps``, ``tokens_per_step``, ``commits_per_step``,
    ``commit_step`` per position, and ``early_exit_step`` where an exit rule is set).
    """
    rc.check()
    steps = rc.steps
    if rc.plan == "ascending" and not steps:  # 0 = the geometric schedule's own step count
        free = make_layout(ctx, rc.gen_length, 0, rc.block_length, fixed_steps=False)
        steps = free.num_blocks * ascending_steps(free.block_length, rc.growth)
    lay = make_layout(ctx, rc.gen_length, steps, rc.block_length, fixed_steps=rc.plan != "threshold")
    view, p0, g = ctx.target, lay.prompt_len, lay.gen_length
    x = new_canvas(ctx, lay)
    fixed = place_fixed(ctx, rc.fixed, g, p0, x)
    hand = parse_hand(ctx.hand)  # a reader's commits at one step (decoders.diffusion.hand)
    if hand is not None:
        check_hand(hand, g, int(view.vocab_size))
    cache = make_cache(view, rc.cache)
    commit_step = [-1] * g
    per_step: list[int] = []
    credit: Credit | None = None
    prior: dict[str, Any] = {}
    step = 0
    exit_step: int | None = None
    spb = lay.steps_per_block
    ts = dream_timesteps(spb, rc.eps) if rc.plan in ("dream", "origin") else None
    for b in range(lay.num_blocks):
        s0, s1 = lay.block(b)
        # LLaDA counts the block's masked positions: fixed ones are not the schedule's to fill
        n_masked = int((x[p0 + s0:p0 + s1] == lay.mask_id).sum())
        schedule = (even_schedule(n_masked, spb) if rc.plan == "even" else
                    ascending_schedule(n_masked, min(spb, n_masked), rc.growth)
                    if rc.plan == "ascending" and n_masked else [])
        i = 0
        spare = 0  # a hand at the block's last step that left masks adds one step
        while bool((x[p0 + s0:p0 + s1] == lay.mask_id).any()):
            ctx.check_cancel()
            pos = (x[p0:] == lay.mask_id).nonzero().squeeze(1)
            extra: dict[str, Any] = {"fixed": fixed} if fixed else {}
            if cache is None:
                logits = gen_logits(view, x, lay, rc.cfg_scale)[0]
            else:  # the cache is refreshed by the block's first forward
                logits, extra["cache"] = cache.logits(x, lay, (s0, s1), i == 0, step, rc.cfg_scale)
            if credit is None and rc.credit_weight > 0:
                credit = Credit(g, logits.shape[-1], rc.credit_weight, rc.credit_decay)
            progress = 1.0 - pos.numel() / g
            prop = propose(ctx, rc, logits, pos, step, progress, credit, prior)
            ex = early_exit(rc, prop, step / max(lay.total_steps, 1))
            if ex is not None:
                extra["early_exit"] = ex
            if ex is not None and ex["exit"]:
                chosen = torch.arange(pos.numel())
                extra["plan"] = {"plan": "exit"}
                exit_step = step
            else:
                eligible = (prop.pos >= s0) & (prop.pos < s1)
                chosen, plan_ev = select(ctx, rc, lay, prop, eligible, i, step, ts, schedule)
                extra["plan"] = plan_ev
                if rc.plan == "ascending":
                    extra["schedule"] = {"planned": schedule, "even": even_schedule(n_masked, spb),
                                         "index": i, "growth": r5(rc.growth)}
            extra.update(top_choices(logits, pos, g))
            hand_ev: dict[str, Any] = {}
            if hand is not None:
                prop, chosen, hand_ev = apply_hand(hand, step, prop, chosen)
            st = denoise_step(lay, x, prop, chosen, (s0, s1), **extra)
            if hand_ev:
                mark_hand(st, hand_ev)
                exit_step = None  # the reader's commits replace an exit's commit-all
                left = int((x[p0 + s0:p0 + s1] == lay.mask_id).sum())
                spare = int(bool(left) and i >= spb - 1)
                if rc.plan in ("even", "ascending"):
                    schedule = replan(schedule, i, left, spb, even_schedule if rc.plan == "even" else
                                      lambda n, k: ascending_schedule(n, k, rc.growth))
            for p in st.evidence["unmasked"]:
                commit_step[p] = step
            per_step.append(len(st.committed))
            decoder.output_override = x[p0:].tolist()
            yield st
            step += 1
            i += 1
            if exit_step is not None:
                break
            if spb and i > spb + spare:  # a fixed schedule always empties its block in spb steps
                raise RuntimeError("diffusion schedule did not empty its block")
        if exit_step is not None:
            break
    unused(hand, step)
    more: dict[str, Any] = {}
    if rc.exit != "none":
        more["early_exit_step"] = exit_step
    finish(decoder, ctx, lay, x[p0:].tolist(), commit_step, per_step, **more)
