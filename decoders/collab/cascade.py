"""``spec_cascade``: speculative cascades — the small model drafts, the large one verifies, and a
deferral rule (not strict acceptance) decides which drafted tokens stand."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from decoders.base import Choice, Context, Decoder, Float, Int, Params, register
from decoders.citation import arxiv
from decoders.collab._common import argmax, check_small_model, share
from decoders.draft_state import DraftState, fit_logits
from playground.core.trace import Step, speculative_figures

RULES = ("chow", "diff", "opt", "always")


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
    nodes are the ``drafted_tokens`` the acceptance counts.
    Simplifies: greedy only; the paper's sampled token-level mixture is not implemented.
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
        alpha=Float(0.3, 0.0, 1.0, "the rule's threshold"),
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
                              "source": "draft-model", "deferred": d, "changed": ok and x != best})
                if not ok:
                    correction, kind = best, "resample"
                    break
                path.append(i)
                new.append(x)
                changed += int(x != best)
                if x in ctx.stop_ids:
                    break
            # every drafted token is a node of the tree (and counts as drafted), reached or not
            for i in range(len(nodes), len(toks)):
                nodes.append({"id": i, "parent": i - 1 if i else None, "token": toks[i],
                              "q": round(float(qs[i][toks[i]]), 6), "p": None, "accept_prob": None,
                              "accepted": False, "source": "draft-model"})
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
