"""``spec_cascade``: speculative cascades — the small model drafts, the large one verifies, and a
deferral rule (not strict acceptance) decides which drafted tokens stand.

Two verifications: ``greedy`` (the default; a drafted token stands when the large model agrees
or the rule keeps the position with the small model) and ``mixture`` (the paper's speculative
cascade: per position the rule picks the small or the large model's distribution as the
target, and speculative sampling against that target makes the output follow it exactly).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from decoders.ar import sample_index
from decoders.base import Choice, Context, Decoder, Float, Int, Params, register
from decoders.citation import arxiv
from decoders.collab._common import argmax, check_small_model, share
from decoders.draft_state import DraftState, fit_logits
from decoders.processors import History, build_chain
from playground.core.trace import Step, speculative_figures

RULES = ("chow", "diff", "opt", "always")
VERIFY = ("greedy", "mixture")


def defers(rule: str, alpha: float, p: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether the deferral rule hands this position to the large model.

    ``chow``: the small model is unsure, max q < alpha (Chow's rule). ``diff``: the large
    model is surer by more than alpha, max p - max q > alpha. ``opt``: the paper's optimal
    token-level rule, max q < max p - alpha * TV(p, q). ``always``: every position.
    """
    if rule == "always":
        return True
    mq, mp = float(q.max()), float(p.max())
    if rule == "chow":
        return mq < alpha
    if rule == "diff":
        return mp - mq > alpha
    tv = 0.5 * float((p - q).abs().sum())
    return mq < mp - alpha * tv


def rule_inputs(p: torch.Tensor, q: torch.Tensor) -> dict[str, float]:
    """What every deferral rule reads: ``max_q``, ``max_p`` and ``tv`` = D_TV(p, q).

    Plain Python floats of the same float32 tensors :func:`defers` reads, so a rule
    recomputed from these recorded numbers gives the same decision.
    """
    return {"max_q": float(q.max()), "max_p": float(p.max()), "tv": 0.5 * float((p - q).abs().sum())}


def decide(rule: str, alpha: float, x: dict[str, float]) -> bool:
    """:func:`defers` on recorded :func:`rule_inputs` (``max_q``, ``max_p``, ``tv``)."""
    if rule == "always":
        return True
    if rule == "chow":
        return x["max_q"] < alpha
    if rule == "diff":
        return x["max_p"] - x["max_q"] > alpha
    return x["max_q"] < x["max_p"] - alpha * x["tv"]


def accept_probability(target: torch.Tensor, q: torch.Tensor, x: int) -> float:
    """Speculative sampling's acceptance ``min(1, target(x) / q(x))`` of a token ``x`` drawn from ``q``."""
    qx = float(q[x])
    return 1.0 if qx <= 0 else min(1.0, float(target[x]) / qx)


def residual(target: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution a rejected position redraws from: ``max(0, target - q)``, normalised.

    Accept-with-``min(1, target/q)`` then redraw-from-this gives exactly ``target``. An empty
    residual means ``target == q`` (nothing is ever rejected then); ``target`` is returned so
    rounding can never hand :func:`sample_index` an all-zero vector.
    """
    r = (target.double() - q.double()).clamp_min(0.0)
    total = float(r.sum())
    return target if total <= 0 else (r / total).float()


def mixture_target(rule: str, alpha: float, p: torch.Tensor, q: torch.Tensor,
                   rule_p: torch.Tensor | None = None,
                   rule_q: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """The per-position target of the mixture cascade and the evidence of its decision.

    The rule reads ``rule_p``/``rule_q`` (default ``p``/``q``: at temperature 0 the caller
    passes the raw softmaxes, since point masses would make every rule degenerate); the
    target is the large model's ``p`` where it defers, else the small model's ``q``.
    """
    x = rule_inputs(p if rule_p is None else rule_p, q if rule_q is None else rule_q)
    d = decide(rule, alpha, x)
    return (p if d else q), {"deferred": d, **x}


def add_unreached(nodes: list[dict[str, Any]], toks: list[int], qs: Any) -> None:
    """Append the drafted tokens verification never reached (after a rejection) as nodes of
    the draft tree, so the tree shows every drafted token."""
    for i in range(len(nodes), len(toks)):
        nodes.append({"id": i, "parent": i - 1 if i else None, "token": toks[i],
                      "q": round(float(qs[i][toks[i]]), 6), "p": None, "accept_prob": None,
                      "accepted": False, "source": "draft-model"})


@register
class SpecCascade(Decoder):
    """Speculative cascades (Narasimhan et al. 2024): draft-verify with a deferral rule.

    The small model (draft slot) drafts ``gamma`` tokens greedily; the large model (the
    target) scores them all in one forward. Walking the draft, a token stands if the large
    model's greedy choice agrees with it or the deferral ``rule`` keeps the position with
    the small model (it is "easy"); at the first position the rule defers and the models
    disagree, the large model's token replaces the draft and the block ends; if every drafted
    token stands the large model adds a bonus token. The cascade is lossy — it keeps small-
    model tokens the large model would not have chosen — so the trace is flagged and
    ``stats.changed_tokens`` counts them; the rule ``always`` defers everywhere and is exactly
    the large model's greedy text (speculative decoding at temperature 0). Steps are draft
    steps (the draft tree view) whose nodes also carry ``deferred`` and ``changed``; the
    drafted tokens after the first replaced one are nodes too (never reached), so the tree's
    nodes are the ``drafted_tokens`` the acceptance counts. Each verified node also records
    the rule's inputs ``max_q``, ``max_p`` and ``tv`` (= D_TV(p, q)).

    ``verify=mixture`` is the paper's speculative cascade: the small model *samples* the
    draft from ``q`` (at ``temperature``), and at every position the rule picks the target
    ``pi = p`` (defer) or ``pi = q`` (keep); each drafted token is accepted with probability
    ``min(1, pi(x) / q(x))`` (always, where the rule keeps ``q``), the first rejected one is
    redrawn from ``max(0, pi - q)`` normalised, and after a fully accepted draft the bonus
    token is drawn from that position's ``pi`` (the small model is fed the last drafted
    token so the rule can be evaluated there too). Every committed token therefore follows
    the per-position mixture exactly. With ``opt`` this is the plug-in optimal rule: defer
    when ``max q < max p - alpha * D_TV(p, q)``; ``alpha`` >= 1 never defers there (``max p -
    max q`` never exceeds D_TV), ``alpha = -1`` keeps ``q`` only where both models share the
    greedy token and all of q's surplus over p lies on it (so at temperature 0 it is the large
    model's greedy text). The rule called "token-specific" in the issue is this ``opt`` rule.
    Stats add ``deferred_positions``/``checked_positions``; ``small_tokens`` counts committed
    tokens drawn from ``q``. At temperature 0 the rule reads the raw softmaxes.
    Simplifies: the deferral is a hard 0/1 choice per position from the models' own
    probabilities (the paper's plug-in estimate, no learned deferral); the paper's further
    token-specific variants, which keep only some drafted tokens of a position, are not
    implemented; ``greedy`` (the default) is the earlier agree-or-keep rule.
    """

    name = "spec_cascade"
    family = "collab"
    kind = "causal"
    step_kind = "draft"
    needs_draft = True
    params = Params(
        gamma=Int(4, 1, 32, "tokens the small model drafts per step"),
        rule=Choice("opt", RULES, "deferral rule: chow (max q < alpha), diff (max p - max q > alpha), "
                                  "opt (max q < max p - alpha * TV(p, q)), always (= the large model's greedy)"),
        alpha=Float(0.3, -1.0, 1.0, "the rule's threshold (opt: 1 never defers, -1 keeps q only where its greedy "
                                    "token is p's and carries all of q's surplus)"),
        verify=Choice("greedy", VERIFY, "greedy: keep a drafted token if the large model agrees or the rule keeps it; "
                                        "mixture: sample, and verify against the rule's per-position target "
                                        "(p if deferred, else q) so the output follows that mixture exactly"),
        temperature=Float(1.0, 0.0, 10.0, "mixture only: both models' temperature (0 = greedy)"),
    )
    reference = ("Narasimhan et al. 2024, Faster Cascades via Speculative Decoding (ICLR 2025)")
    papers = (
        arxiv("Narasimhan et al. 2024, Faster Cascades via Speculative Decoding (ICLR 2025)", "2405.19261"),
    )
    description = "Small model drafts, large model verifies; a deferral rule decides which drafted tokens stand (lossy)"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return params.get("rule") != "always"

    def run(self, ctx: Context) -> Iterator[Step]:
        check_small_model(ctx, self.name)
        if ctx.params.get("verify", "greedy") == "mixture":
            yield from self._run_mixture(ctx)
            return
        p = ctx.params
        gamma, rule, alpha = int(p["gamma"]), str(p["rule"]), float(p["alpha"])
        small, large = DraftState(ctx.draft, decoder=self.name), DraftState(ctx.target, decoder=self.name)
        V = ctx.target.vocab_size
        prompt, out = list(ctx.prompt_ids), []
        drafted = accepted = verifications = changed = small_tokens = 0
        while len(out) < ctx.max_new_tokens:
            ctx.check_cancel()
            committed = prompt + out
            room = ctx.max_new_tokens - len(out) - 1
            # the small model drafts greedily
            toks, qs = [], []
            logits = small.catch_up(committed)
            for i in range(min(gamma, room)):
                q = torch.softmax(fit_logits(logits.float(), V), -1)
                x = argmax(q)
                toks.append(x)
                qs.append(q)
                if i + 1 < min(gamma, room):
                    logits = small.feed([x])[-1]
            # the large model scores the block in one forward
            n = large.keep_common(committed)
            rows = large.feed(committed[n:] + toks)
            base = len(committed) - n - 1
            nodes, path, new = [], [], []
            correction = kind = None
            for i, x in enumerate(toks):
                pd = torch.softmax(rows[base + i].float(), -1)
                best = argmax(pd)
                d = defers(rule, alpha, pd, qs[i])
                ok = x == best or not d
                nodes.append({"id": i, "parent": i - 1 if i else None, "token": x, "q": round(float(qs[i][x]), 6),
                              "p": round(float(pd[x]), 6), "accept_prob": 1.0 if ok else 0.0, "accepted": ok,
                              "source": "draft-model", "deferred": d, "changed": ok and x != best,
                              **rule_inputs(pd, qs[i])})
                if not ok:
                    correction, kind = best, "resample"
                    break
                path.append(i)
                new.append(x)
                changed += int(x != best)
                if x in ctx.stop_ids:
                    break
            # every drafted token is a node of the tree (and counts as drafted), reached or not
            add_unreached(nodes, toks, qs)
            if correction is None and not (new and new[-1] in ctx.stop_ids):
                correction, kind = argmax(rows[base + len(toks)]), "bonus"
            drafted += len(toks)
            accepted += len(path)
            small_tokens += len(path)
            verifications += 1
            if correction is not None:
                new.append(correction)
            out.extend(new)
            self.extra_stats = {
                **speculative_figures(drafted, accepted, verifications, len(out)),
                "drafted_tokens": drafted, "accepted_tokens": accepted, "verifications": verifications,
                "changed_tokens": changed, "small_tokens": small_tokens, "small_share": share(small_tokens, len(out)),
                "deferral_rule": rule,
            }
            yield Step("draft", new, tree={"nodes": nodes, "accepted_path": path, "correction": correction,
                                           "correction_kind": kind}, root=committed[-1])
            stop = next((j for j, t in enumerate(new) if t in ctx.stop_ids), None)
            if stop is not None:
                self.finish_reason = "eos" if new[stop] in getattr(ctx.target, "eos_ids", set()) else "stop"
                return
            if ctx.stop_strings and any(s and s in ctx.target.decode(out[-32:]) for s in ctx.stop_strings):
                self.finish_reason = "stop"
                return
        self.finish_reason = "length"

    def _run_mixture(self, ctx: Context) -> Iterator[Step]:
        """``verify=mixture``: sampled drafts verified against the rule's per-position target."""
        p = ctx.params
        gamma, rule, alpha = int(p["gamma"]), str(p["rule"]), float(p["alpha"])
        temp = float(p["temperature"])
        greedy = temp == 0.0
        chain = build_chain({"temperature": temp})
        small, large = DraftState(ctx.draft, decoder=self.name), DraftState(ctx.target, decoder=self.name)
        V = ctx.target.vocab_size
        prompt, out = list(ctx.prompt_ids), []
        drafted = accepted = verifications = small_tokens = deferred_n = checked = 0
        draws = {"draft": 0, "accept": 0, "residual": 0}

        def uniform(stream: str) -> float:
            # one counter per stream: a position redrafted after a rejection gets fresh numbers
            i = draws[stream]
            draws[stream] += 1
            return ctx.uniform(i, stream)

        def history(ids: list[int]) -> History:
            return History(ids=ids, prompt_len=len(prompt), pos=len(ids) - len(prompt), uniform=ctx.uniform)

        while len(out) < ctx.max_new_tokens:
            ctx.check_cancel()
            committed = prompt + out
            g = min(gamma, ctx.max_new_tokens - len(out) - 1)
            # the small model samples the draft; it is also fed the last drafted token, so the
            # rule can be evaluated at the bonus position (its q is part of the mixture there)
            toks: list[int] = []
            qs, rqs = [], []
            logits = fit_logits(small.catch_up(committed).float(), V)
            for i in range(g + 1):
                q = chain.probs(logits, history(committed + toks))
                qs.append(q)
                rqs.append(torch.softmax(logits, -1) if greedy else q)
                if i == g:
                    break
                x = sample_index(q, uniform("draft"))
                toks.append(x)
                logits = fit_logits(small.feed([x])[-1].float(), V)
            # the large model scores the block in one forward
            n = large.keep_common(committed)
            rows = large.feed(committed[n:] + toks)
            base = len(committed) - n - 1
            nodes: list[dict[str, Any]] = []
            path: list[int] = []
            new: list[int] = []
            positions: list[dict[str, Any]] = []
            correction = kind = None
            for i in range(g + 1):
                pl = rows[base + i].float()
                pd = chain.probs(pl, history(committed + toks[:i]))
                target, ev = mixture_target(rule, alpha, pd, qs[i], torch.softmax(pl, -1) if greedy else None, rqs[i])
                checked += 1
                deferred_n += int(ev["deferred"])
                if i == len(toks):  # every drafted token stood: the bonus token, drawn from this position's target
                    correction, kind = sample_index(target, uniform("residual")), "bonus"
                    positions.append({"position": i, "bonus": True, **ev, "token": correction})
                    small_tokens += int(not ev["deferred"])
                    break
                x = toks[i]
                a = accept_probability(target, qs[i], x)
                # a kept position has target q, accepted with certainty: no uniform is spent on it
                ok = a >= 1.0 or uniform("accept") < a
                nodes.append({"id": i, "parent": i - 1 if i else None, "token": x, "q": round(float(qs[i][x]), 6),
                              "p": round(float(pd[x]), 6), "accept_prob": round(a, 6), "accepted": ok,
                              "source": "draft-model", **ev})
                positions.append({"position": i, "bonus": False, **ev, "token": x, "p_token": float(pd[x]),
                                  "q_token": float(qs[i][x]), "accept_prob": a, "accepted": ok})
                if not ok:
                    correction, kind = sample_index(residual(target, qs[i]), uniform("residual")), "resample"
                    positions[-1]["correction"] = correction  # only a deferred position rejects: drawn from p's side
                    break
                path.append(i)
                new.append(x)
                small_tokens += int(not ev["deferred"])
                if x in ctx.stop_ids:
                    break
            add_unreached(nodes, toks, qs)
            drafted += len(toks)
            accepted += len(path)
            verifications += 1
            if correction is not None:
                new.append(correction)
            out.extend(new)
            self.extra_stats = {
                **speculative_figures(drafted, accepted, verifications, len(out)),
                "drafted_tokens": drafted, "accepted_tokens": accepted, "verifications": verifications,
                "small_tokens": small_tokens, "small_share": share(small_tokens, len(out)),
                "deferred_positions": deferred_n, "checked_positions": checked,
                "deferral_rule": rule, "verify": "mixture",
            }
            yield Step("draft", new, tree={"nodes": nodes, "accepted_path": path, "correction": correction,
                                           "correction_kind": kind}, root=committed[-1],
                       cascade={"rule": rule, "alpha": alpha, "temperature": temp, "positions": positions})
            stop = next((j for j, t in enumerate(new) if t in ctx.stop_ids), None)
            if stop is not None:
                self.finish_reason = "eos" if new[stop] in getattr(ctx.target, "eos_ids", set()) else "stop"
                return
            if ctx.stop_strings and any(s and s in ctx.target.decode(out[-32:]) for s in ctx.stop_strings):
                self.finish_reason = "stop"
                return
        self.finish_reason = "length"
