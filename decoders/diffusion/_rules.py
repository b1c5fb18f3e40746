"""Commit rules that keep state across steps or move the block, and the loop that runs them.

The one sampler (``_sampler.run_recipe``) covers plans that look at a single step's scores.
The plans here need more: a rule that remembers earlier steps (stability counters), commits
by neighbourhood (anchors and their zones, windows of confident positions), mixes two kinds
of commit in one round (explore and exploit), or places the block boundary itself. Each is
a :class:`Rule` object: :func:`run_rule` proposes tokens exactly as the sampler does
(:func:`_sampler.propose`), asks the rule for the current block and for the positions to
commit, and writes the usual ``denoise`` step plus the rule's own evidence fields.

The selection functions (``*_select``, :func:`delimiter_boundary`) are pure functions of
per-position numbers, so the tests can check each rule against a hand computation.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from decoders.base import Context
from decoders.diffusion._canvas import Layout, finish, gen_logits, make_layout, new_canvas, r5
from decoders.diffusion._sampler import Proposal, Recipe, denoise_step, propose, top_k_positions
from decoders.diffusion.fixed import place_fixed
from decoders.diffusion.hand import apply_hand, check_hand, mark_hand, parse_hand, top_choices, unused
from playground.core.trace import Step


class Rule:
    """One commit rule. ``block`` gives the current block; ``select`` the positions to commit.

    The default block is the fixed semi-autoregressive one: the block of ``block_length``
    holding the leftmost still-masked position (blocks fill left to right).
    """

    def start(self, ctx: Context, lay: Layout) -> None:
        """Reset the rule's state for a new run."""

    def block(self, ctx: Context, lay: Layout, x: torch.Tensor, prop: Proposal) -> tuple[int, int]:
        """Half-open ``[start, end)`` of the current block, in generated positions."""
        return lay.block(int(prop.pos.min()) // lay.block_length)

    def select(self, ctx: Context, lay: Layout, prop: Proposal, eligible: torch.Tensor,
               block: tuple[int, int]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Indices into ``prop`` to commit (at least one) and the step's extra evidence.

        ``eligible`` marks the proposals inside ``block``."""
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """Run-level numbers for the trace's stats."""
        return {}


def run_rule(ctx: Context, rc: Recipe, rule: Rule, decoder: Any) -> Iterator[Step]:
    """Decode with ``rule`` choosing the commits, one ``denoise`` step per forward pass.

    ``rc`` gives the token sampling, score and canvas sizes (its ``plan`` is unused). Every
    step commits at least one position, so a canvas of ``g`` positions takes at most ``g``
    steps. Sets the decoder's output, finish reason and stats as ``run_recipe`` does.
    """
    rc.check()
    lay = make_layout(ctx, rc.gen_length, 0, rc.block_length, fixed_steps=False)
    p0, g = lay.prompt_len, lay.gen_length
    x = new_canvas(ctx, lay)
    fixed = place_fixed(ctx, rc.fixed, g, p0, x)
    # a reader's commits at one step replace the rule's pick there (the rule still selects, so its
    # state moves as it would have); decoders.diffusion.hand
    hand = parse_hand(ctx.hand)
    if hand is not None:
        check_hand(hand, g, int(ctx.target.vocab_size))
    commit_step = [-1] * g
    per_step: list[int] = []
    rule.start(ctx, lay)
    step = 0
    while bool((x[p0:] == lay.mask_id).any()):
        ctx.check_cancel()
        pos = (x[p0:] == lay.mask_id).nonzero().squeeze(1)
        logits = gen_logits(ctx.target, x, lay, rc.cfg_scale)[0]
        prop = propose(ctx, rc, logits, pos, step, 1.0 - pos.numel() / g, None, {})
        s0, s1 = rule.block(ctx, lay, x, prop)
        eligible = (prop.pos >= s0) & (prop.pos < s1)
        chosen, extra = rule.select(ctx, lay, prop, eligible, (s0, s1))
        if fixed:
            extra = {**extra, "fixed": fixed}
        if chosen.numel() == 0:
            raise RuntimeError(f"{type(rule).__name__} committed nothing at step {step}")
        extra = {**extra, **top_choices(logits, pos, g)}
        hand_ev: dict[str, Any] = {}
        if hand is not None:
            prop, chosen, hand_ev = apply_hand(hand, step, prop, chosen)
        st = denoise_step(lay, x, prop, chosen, (s0, s1), **extra)
        if hand_ev:
            mark_hand(st, hand_ev)
        for p in st.evidence["unmasked"]:
            commit_step[p] = step
        per_step.append(len(st.committed))
        decoder.output_override = x[p0:].tolist()
        yield st
        step += 1
    unused(hand, step)
    finish(decoder, ctx, lay, x[p0:].tolist(), commit_step, per_step, **rule.stats())


# ---------------------------------------------------------------------- shared pieces
def above(score: torch.Tensor, threshold: float) -> torch.Tensor:
    """Fast-dLLM's set: scores strictly above ``threshold``, or else the single best one."""
    keep = score > threshold
    if not bool(keep.any()) and score.numel():
        keep[top_k_positions(score, 1)] = True
    return keep


def bits(conf: torch.Tensor) -> torch.Tensor:
    """Information of committing the proposed token, ``-log2 p`` (0 where p is 1)."""
    return -torch.log2(conf.double().clamp_min(1e-300))


def positions(prop: Proposal, idx: torch.Tensor) -> list[int]:
    """The canvas positions of indices ``idx`` into ``prop``, ascending."""
    return sorted(int(p) for p in prop.pos[idx].tolist())


def spans(points: Sequence[int], radius: int, lo: int, hi: int) -> list[list[int]]:
    """Merged half-open ranges ``[p - radius, p + radius + 1)`` clipped to ``[lo, hi)``."""
    out: list[list[int]] = []
    for p in sorted(points):
        a, b = max(lo, p - radius), min(hi, p + radius + 1)
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


# ---------------------------------------------------------------------- ETE
def ete_select(conf: torch.Tensor, entropy: torch.Tensor, exploit_ok: torch.Tensor,
               explore_ok: torch.Tensor, threshold: float, explore_k: int,
               budget: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Explore-then-exploit: (exploit mask, explore mask) over the masked positions.

    Exploit is Fast-dLLM's set among ``exploit_ok`` (confidence above ``threshold``, else the
    most confident one). When those commits carry fewer than ``budget`` bits (``-log2 p``
    summed), the round also explores: the ``explore_k`` highest-entropy positions among
    ``explore_ok`` that exploit did not take (ties: leftmost).
    """
    exploit = torch.zeros_like(exploit_ok)
    idx = exploit_ok.nonzero().squeeze(1)
    if idx.numel():
        exploit[idx[above(conf[idx], threshold)]] = True
    explore = torch.zeros_like(explore_ok)
    if explore_k > 0 and float(bits(conf[exploit]).sum()) < budget:
        cand = (explore_ok & ~exploit).nonzero().squeeze(1)
        if cand.numel():
            explore[cand[top_k_positions(entropy[cand].double(), explore_k)]] = True
    return exploit, explore


class ETE(Rule):
    """ETE's rounds: exploit the confident set, explore high-entropy positions when it is
    poor in information; records bits per round and the cascade after each exploration."""

    def __init__(self, threshold: float, explore_k: int, budget: float, cross_block: int) -> None:
        self.threshold, self.explore_k, self.budget, self.cross = threshold, explore_k, budget, cross_block

    def start(self, ctx: Context, lay: Layout) -> None:
        self.explored_last = False
        self.rounds: list[float] = []
        self.cascades: list[int] = []
        self.explored = 0

    def select(self, ctx: Context, lay: Layout, prop: Proposal, eligible: torch.Tensor,
               block: tuple[int, int]) -> tuple[torch.Tensor, dict[str, Any]]:
        lo, hi = block[0], min(block[1] + self.cross, lay.gen_length)
        reach = (prop.pos >= lo) & (prop.pos < hi)
        exploit, explore = ete_select(prop.conf, prop.entropy, eligible, reach, self.threshold,
                                      self.explore_k, self.budget)
        b_exploit = float(bits(prop.conf[exploit]).sum())
        b_explore = float(bits(prop.conf[explore]).sum())
        # the cascade is what an exploration bought: positions confident enough to commit on
        # their own in the next round (the exploit fallback's single best does not count)
        cascade = int((exploit & (prop.conf > self.threshold)).sum()) if self.explored_last else None
        if cascade is not None:
            self.cascades.append(cascade)
        self.explored_last = bool(explore.any())
        self.explored += int(explore.sum())
        self.rounds.append(b_exploit + b_explore)
        chosen = (exploit | explore).nonzero().squeeze(1)
        return chosen, {
            "plan": {"plan": "ete", "threshold": self.threshold},
            "ete": {"exploit": positions(prop, exploit.nonzero().squeeze(1)),
                    "explore": positions(prop, explore.nonzero().squeeze(1)),
                    "bits_exploit": r5(b_exploit), "bits_explore": r5(b_explore),
                    "bits": r5(b_exploit + b_explore), "budget": r5(self.budget),
                    "threshold": r5(self.threshold), "cascade": cascade,
                    "explore_reach": [lo, hi]},
        }

    def stats(self) -> dict[str, Any]:
        return {"bits_per_round": [r5(b) for b in self.rounds], "total_bits": r5(sum(self.rounds)),
                "explored": self.explored, "cascades": list(self.cascades)}


# ---------------------------------------------------------------------- R²-dLLM
def window_select(conf: torch.Tensor, pos: torch.Tensor, ok: torch.Tensor, window: int,
                  threshold: float) -> tuple[torch.Tensor, list[list[int]]]:
    """R²'s spatial rule: every window of ``window`` consecutive canvas positions whose masked
    (``ok``) positions have a mean confidence of at least ``threshold`` commits all of them.

    Windows slide over the span of the ``ok`` positions; a window with no ``ok`` position is
    skipped. Returns the mask of positions committed and the ``[start, end)`` windows that fired.
    """
    hit = torch.zeros_like(ok)
    fired: list[list[int]] = []
    idx = ok.nonzero().squeeze(1)
    if window <= 0 or idx.numel() == 0:
        return hit, fired
    where = {int(pos[i]): int(i) for i in idx.tolist()}
    lo, hi = min(where), max(where) + 1
    for a in range(lo, max(hi - window, lo) + 1):
        inside = [where[p] for p in range(a, a + window) if p in where]
        if inside and float(conf[inside].double().mean()) >= threshold:
            hit[inside] = True
            fired.append([a, a + window])
    return hit, fired


class Streaks:
    """Per position: the token proposed at consecutive steps and how long it has held.

    ``update`` is called once per step with the proposals of the still-masked positions; a
    position whose proposal changed starts a new streak of 1. The streak's confidences are
    summed so its mean can be tested.
    """

    def __init__(self, g: int) -> None:
        self.token = [-1] * g
        self.count = [0] * g
        self.conf_sum = [0.0] * g

    def update(self, pos: Sequence[int], tokens: Sequence[int], conf: Sequence[float]) -> None:
        """Extend or restart the streak of each position with this step's proposal."""
        for p, t, c in zip(pos, tokens, conf):
            if self.token[p] == t:
                self.count[p] += 1
                self.conf_sum[p] += c
            else:
                self.token[p], self.count[p], self.conf_sum[p] = t, 1, c

    def mean(self, p: int) -> float:
        """Mean confidence over the current streak of position ``p``."""
        return self.conf_sum[p] / max(self.count[p], 1)


def stable_select(streaks: Streaks, pos: torch.Tensor, ok: torch.Tensor, steps: int,
                  threshold: float) -> torch.Tensor:
    """R²'s temporal rule: positions whose proposal has held for at least ``steps`` steps with
    a mean confidence over that streak of at least ``threshold``."""
    hit = torch.zeros_like(ok)
    if steps <= 0:
        return hit
    for i in ok.nonzero().squeeze(1).tolist():
        p = int(pos[i])
        hit[i] = streaks.count[p] >= steps and streaks.mean(p) >= threshold
    return hit


class R2(Rule):
    """R²-dLLM's three sets, unioned: the threshold set, confident windows (spatial) and
    temporally stable proposals; evidence names the rule behind each commit."""

    def __init__(self, threshold: float, window: int, window_threshold: float, stable_steps: int,
                 stable_threshold: float) -> None:
        self.threshold, self.window, self.window_threshold = threshold, window, window_threshold
        self.stable_steps, self.stable_threshold = stable_steps, stable_threshold

    def start(self, ctx: Context, lay: Layout) -> None:
        self.streaks = Streaks(lay.gen_length)
        self.by_rule = {"threshold": 0, "spatial": 0, "temporal": 0}

    def select(self, ctx: Context, lay: Layout, prop: Proposal, eligible: torch.Tensor,
               block: tuple[int, int]) -> tuple[torch.Tensor, dict[str, Any]]:
        self.streaks.update(prop.pos.tolist(), prop.tokens.tolist(), prop.conf.tolist())
        idx = eligible.nonzero().squeeze(1)
        thr = torch.zeros_like(eligible)
        thr[idx[above(prop.conf[idx], self.threshold)]] = True
        spatial, fired = window_select(prop.conf, prop.pos, eligible, self.window, self.window_threshold)
        temporal = stable_select(self.streaks, prop.pos, eligible, self.stable_steps, self.stable_threshold)
        chosen = (thr | spatial | temporal).nonzero().squeeze(1)
        sets = {"threshold": thr, "spatial": spatial & ~thr, "temporal": temporal & ~thr & ~spatial}
        for k, m in sets.items():
            self.by_rule[k] += int(m.sum())
        g = lay.gen_length
        stability: list[int | None] = [None] * g
        for p in prop.pos.tolist():
            stability[p] = self.streaks.count[p]
        return chosen, {
            "plan": {"plan": "r2", "threshold": self.threshold},
            "r2": {**{k: positions(prop, m.nonzero().squeeze(1)) for k, m in sets.items()},
                   "windows": fired, "window": self.window, "window_threshold": r5(self.window_threshold),
                   "stable_steps": self.stable_steps, "stable_threshold": r5(self.stable_threshold)},
            "stability": stability,
        }

    def stats(self) -> dict[str, Any]:
        return {"commits_by_rule": dict(self.by_rule)}


# ---------------------------------------------------------------------- LocalLeap
def leap_select(conf: torch.Tensor, pos: torch.Tensor, ok: torch.Tensor, tau_hi: float, tau_lo: float,
                radius: int, decay: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """LocalLeap: (anchor mask, leap mask, fallback) over the masked positions.

    Anchors are ``ok`` positions with confidence above ``tau_hi``. A non-anchor ``ok``
    position within ``radius`` canvas positions of an anchor leaps in when its confidence is
    above the relaxed threshold at its distance ``d`` to the nearest anchor,
    ``tau_lo + decay * (tau_hi - tau_lo) * (d - 1) / radius`` (``decay`` 0: flat ``tau_lo``).
    With no anchor, the single most confident ``ok`` position is committed (``fallback``).
    """
    anchors = ok & (conf > tau_hi)
    leap = torch.zeros_like(ok)
    idx = ok.nonzero().squeeze(1)
    if not bool(anchors.any()):
        if idx.numel():
            anchors[idx[top_k_positions(conf[idx], 1)]] = True
        return anchors, leap, True
    apos = pos[anchors]
    for i in (ok & ~anchors).nonzero().squeeze(1).tolist():
        d = int((apos - pos[i]).abs().min())
        if 1 <= d <= radius:
            tau = tau_lo + decay * (tau_hi - tau_lo) * (d - 1) / max(radius, 1)
            leap[i] = bool(conf[i] > tau)
    return anchors, leap, False


class LocalLeap(Rule):
    """LocalLeap: anchors above ``tau_hi`` pull neighbours within ``radius`` in above ``tau_lo``."""

    def __init__(self, tau_hi: float, tau_lo: float, radius: int, decay: float) -> None:
        self.tau_hi, self.tau_lo, self.radius, self.decay = tau_hi, tau_lo, radius, decay

    def start(self, ctx: Context, lay: Layout) -> None:
        self.anchors = self.leaps = 0

    def select(self, ctx: Context, lay: Layout, prop: Proposal, eligible: torch.Tensor,
               block: tuple[int, int]) -> tuple[torch.Tensor, dict[str, Any]]:
        anchors, leap, fallback = leap_select(prop.conf, prop.pos, eligible, self.tau_hi, self.tau_lo,
                                              self.radius, self.decay)
        self.anchors += int(anchors.sum())
        self.leaps += int(leap.sum())
        a = positions(prop, anchors.nonzero().squeeze(1))
        zones = [] if fallback else spans(a, self.radius, block[0], block[1])
        return (anchors | leap).nonzero().squeeze(1), {
            "plan": {"plan": "localleap", "tau_hi": r5(self.tau_hi), "tau_lo": r5(self.tau_lo)},
            "leap": {"anchors": a, "leap": positions(prop, leap.nonzero().squeeze(1)), "zones": zones,
                     "fallback": fallback, "tau_hi": r5(self.tau_hi), "tau_lo": r5(self.tau_lo),
                     "radius": self.radius, "decay": r5(self.decay)},
        }

    def stats(self) -> dict[str, Any]:
        return {"anchors": self.anchors, "leaps": self.leaps}


# ---------------------------------------------------------------------- AdaBlock
def delimiter_boundary(start: int, window: int, default_end: int, delims: Sequence[tuple[int, float]],
                       threshold: float) -> tuple[int, int | None]:
    """AdaBlock's block end: (end, delimiter position or None).

    ``delims`` are (position, confidence) of the positions in ``[start, start + window)``
    whose proposed token is a delimiter. The most confident one (ties: leftmost) ends the
    block just after itself when its confidence is at least ``threshold``; otherwise the
    block keeps its default end.
    """
    inside = [(p, c) for p, c in delims if start <= p < start + window]
    if not inside:
        return default_end, None
    best = max(inside, key=lambda pc: (pc[1], -pc[0]))
    if best[1] >= threshold:
        return best[0] + 1, best[0]
    return default_end, None


class AdaBlock(Rule):
    """AdaBlock-dLLM: each block's end is set, on its first step, at the most confident
    delimiter predicted in a look-ahead window if that one is confident enough; else
    ``block_length`` later. Inside the block, Fast-dLLM's threshold commits."""

    def __init__(self, threshold: float, block_length: int, delimiter_threshold: float,
                 window_frac: float, delimiters: str) -> None:
        self.threshold, self.default, self.dthr = threshold, block_length, delimiter_threshold
        self.window_frac, self.delimiters = window_frac, delimiters

    def start(self, ctx: Context, lay: Layout) -> None:
        self.cur: tuple[int, int] | None = None
        self.sizes: list[int] = []
        self.tok = ctx.target.tokenizer
        self.is_delim: dict[int, bool] = {}
        self.fresh: dict[str, Any] | None = None

    def _delimiter(self, t: int) -> bool:
        """Whether token ``t`` reads as a delimiter: a newline in it, or only delimiter
        characters once spaces are stripped."""
        if t not in self.is_delim:
            text = self.tok.decode([t])
            core = text.strip(" \t")
            self.is_delim[t] = bool(core) and (("\n" in text and "\n" in self.delimiters)
                                               or all(ch in self.delimiters for ch in core))
        return self.is_delim[t]

    def block(self, ctx: Context, lay: Layout, x: torch.Tensor, prop: Proposal) -> tuple[int, int]:
        p0, g = lay.prompt_len, lay.gen_length
        if self.cur is not None and bool((x[p0 + self.cur[0]:p0 + self.cur[1]] == lay.mask_id).any()):
            self.fresh = None
            return self.cur
        start = self.cur[1] if self.cur is not None else 0
        start = max(start, int(prop.pos.min()))
        default_end = min(start + self.default, g)
        window = max(1, min(int(self.window_frac * g), g - start))
        tokens = dict(zip(prop.pos.tolist(), prop.tokens.tolist()))
        confs = dict(zip(prop.pos.tolist(), prop.conf.tolist()))
        delims = [(p, confs[p]) for p in range(start, start + window) if p in tokens and self._delimiter(tokens[p])]
        end, at = delimiter_boundary(start, window, default_end, delims, self.dthr)
        self.cur = (start, end)
        self.sizes.append(end - start)
        self.fresh = {"window": [start, start + window], "delimiters": [[p, r5(c)] for p, c in delims],
                      "chosen": at, "default_end": default_end}
        return self.cur

    def select(self, ctx: Context, lay: Layout, prop: Proposal, eligible: torch.Tensor,
               block: tuple[int, int]) -> tuple[torch.Tensor, dict[str, Any]]:
        idx = eligible.nonzero().squeeze(1)
        chosen = idx[above(prop.conf[idx], self.threshold)]
        ev: dict[str, Any] = {"new_block": self.fresh is not None, "delimiter_threshold": r5(self.dthr),
                              "default_block_length": self.default}
        if self.fresh is not None:
            ev.update(self.fresh)
        return chosen, {"plan": {"plan": "adablock", "threshold": self.threshold}, "adablock": ev}

    def stats(self) -> dict[str, Any]:
        return {"block_sizes": list(self.sizes)}

