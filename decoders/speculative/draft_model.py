"""Speculative decoding with a draft model: a chain of γ drafted tokens (``speculative``)
and a dynamic token tree verified in one pass (``spec_tree``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from decoders.ar import sample_index
from decoders.base import Choice, Context, Float, Int, PlaygroundError, register
from decoders.kv_cache import CacheInfo, check_rollback, masks_by_type
from decoders.citation import arxiv
from decoders.draft_state import DraftState, fit_logits
from decoders.draft_tree import (ROOT, SpecDecoder, SpecParams, Tree, Verified, columns_mask,
                                          draw_without_replacement, rule_params, sampling_params)
from playground.core.trace import Step


def check_draft_context(ctx: Context) -> None:
    """The draft must hold the whole run (prompt + new tokens) in its own context."""
    need = len(ctx.prompt_ids) + ctx.max_new_tokens
    if need > ctx.draft.context_length:
        raise PlaygroundError(f"prompt plus max_new_tokens ({need} tokens) exceeds the context of the draft "
                              f"model {ctx.draft.name!r} ({ctx.draft.context_length} tokens)")


def check_draft(decoder: str, ctx: Context) -> CacheInfo:
    """Refuse a draft whose cache cannot be cut back, or one that cannot read the ids the
    target may commit (its embedding table is smaller than the tokenizer); else its cache info."""
    info = check_rollback(decoder, ctx.draft, role="draft model")
    emb = ctx.draft.model.get_input_embeddings() if hasattr(ctx.draft.model, "get_input_embeddings") else None
    rows = int(emb.weight.shape[0]) if emb is not None else ctx.draft.vocab_size
    tokens = len(ctx.target.tokenizer)
    if rows < min(tokens, ctx.target.vocab_size):
        raise PlaygroundError(f"draft model {ctx.draft.name!r} embeds {rows} token ids, fewer than the "
                              f"{min(tokens, ctx.target.vocab_size)} its tokenizer and {ctx.target.name!r} use")
    return info


STOPS = ("rules", "del")
DEL_ALPHA0 = 0.8     # the acceptance estimate before any round has been verified
DEL_KEEP = 0.7       # weight of the old estimate in the moving average ...
DEL_LEARN = 0.3      # ... and of the round just verified


def expected_goodput(alpha: float, k: int, cost: float) -> float:
    """Expected committed tokens per unit of cost of one round that drafts ``k`` tokens.

    DEL's goodput criterion (Zarch et al. 2025): with each drafted token accepted with
    probability ``alpha`` (independently), a round commits (1 - alpha^(k+1)) / (1 - alpha)
    tokens on average (the accepted prefix plus the correction or bonus), and costs one target
    forward plus ``cost`` target forwards per drafted token, so the goodput is
    (1 - alpha^(k+1)) / (1 - alpha) / (k · cost + 1). At ``alpha`` = 1 every draft is
    accepted and the expected count is its limit, k + 1.
    """
    a, k = float(alpha), int(k)
    # the geometric sum 1 + a + ... + a^k; its closed form divides by zero at a = 1
    tokens = float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    return tokens / (k * float(cost) + 1.0)


def goodput_draft_length(alpha: float, gamma: int, cost: float) -> int:
    """How many tokens DEL's rule drafts in a round: start at one (a round always drafts one)
    and draft token k + 1 only while it raises the expected goodput,
    ``expected_goodput(alpha, k + 1, cost) > expected_goodput(alpha, k, cost)``, up to ``gamma``."""
    k = 1
    while k < int(gamma) and expected_goodput(alpha, k + 1, cost) > expected_goodput(alpha, k, cost):
        k += 1
    return k


def parameter_count(model: Any) -> int:
    """Distinct parameters of a torch module (a tied embedding and LM head count once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def point_mass_token(q: torch.Tensor) -> int:
    """The token of a one-hot distribution (what the chain gives at temperature 0)."""
    return int(torch.argmax(q))


@dataclass
class DraftStop:
    """Why a step's draft ended, for its evidence: ``reason`` is ``confidence`` (the draft's
    probability of its own token fell below the floor), ``adaptive_h`` (SpecDec++: the chance
    that some drafted token is rejected passed h), ``goodput`` (DEL: one more token would
    not raise the expected goodput), ``gamma`` (the length cap), ``length`` (the
    run's remaining tokens), ``constraint`` (the grammar is complete) or ``budget`` (the tree's
    node budget); ``drafted`` tokens, the last one's draft probability ``q`` and the product
    of the draft's probabilities along the chain (the best path, for a tree)."""

    reason: str
    drafted: int
    q: float | None = None
    path_q: float | None = None

    def evidence(self) -> dict[str, Any]:
        """The ``draft_stop`` field of a draft step."""
        out: dict[str, Any] = {"reason": self.reason, "drafted": self.drafted}
        if self.q is not None:
            out["q"] = float(f"{self.q:.6g}")
        if self.path_q is not None:
            out["path_q"] = float(f"{self.path_q:.6g}")
        return out


@register
class Speculative(SpecDecoder):
    """Speculative sampling with a draft model (Leviathan et al. 2023; Chen et al. 2023).

    Implements: the draft samples γ tokens from its chain-processed distribution q; one
    target pass scores them; token i is accepted with probability min(1, p(x)/q(x)); the
    first rejection is replaced by a draw from norm(max(0, p - q)); if all are accepted a
    bonus token is drawn from p. The whole sampling chain (decoders/processors.py) is
    applied identically to p and q; at temperature 0 both are point masses, so a token is
    accepted iff it is the target's argmax and the output is greedy's.
    Draft length: up to γ tokens, but drafting stops after a token the draft itself gives
    probability below ``confidence`` (transformers' assisted generation stops on the same
    signal, its ``assistant_confidence_threshold``), or, SpecDec++-style (A150), once
    1 - prod q(x_i) exceeds ``adaptive_h``. A drafted token costs a draft forward whether or
    not it is accepted, so a draft that is unlikely to survive is not paid for; the step's
    ``draft_stop`` evidence says which rule ended the draft. Stopping looks only at the
    draft's own numbers, so verification stays exact.
    Simplifies: SpecDec++ predicts acceptance with a trained head; here the draft's own
    confidence q(x_i) stands in for it. Mirostat (stateful) is not offered.
    With ``stop=del`` the draft length follows DEL's goodput criterion (Zarch et al. 2025,
    A242) instead of those rules: a running acceptance estimate α (0.8 at first, then
    α ← 0.7·α + 0.3·accepted/drafted after each verified round) and the cost c of a drafted
    token in target forwards give the expected tokens per unit cost of a round of k drafts,
    ``expected_goodput``; a round drafts one token, then one more only while that raises
    the expected goodput, up to γ (the confidence and adaptive_h rules are not consulted; a
    constraint and the run's length still end a draft). α depends only on earlier rounds, so
    verification stays exact. Each step records ``del_goodput``: α, c, the chosen length, the
    goodput curve over k = 0..γ and α after the round.
    Simplifies (DEL): DEL picks the exit layer of a self-speculative model and its draft
    length together, from per-layer acceptance rates; here the draft is a separate model, so
    only the draft-length half is implemented, with c the ratio of the draft's parameter
    count to the target's rather than a measured or per-layer cost.
    """

    name = "speculative"
    needs_draft = True
    lossless = True
    reference = ("Leviathan et al. 2023, Fast Inference from Transformers via Speculative Decoding; "
                 "Chen et al. 2023, Accelerating LLM Decoding with Speculative Sampling; "
                 "Huang et al. 2024, SpecDec++ (adaptive length); "
                 "Zarch et al. 2025, DEL (goodput-based draft length)")
    papers = (
        arxiv("Leviathan et al. 2023, Fast Inference from Transformers via Speculative Decoding "
              "(ICML)", "2211.17192"),
        arxiv("Chen et al. 2023, Accelerating Large Language Model Decoding with Speculative "
              "Sampling", "2302.01318"),
        arxiv("Huang et al. 2024, SpecDec++: Boosting Speculative Decoding via Adaptive "
              "Candidate Lengths (adaptive draft length)", "2405.19715"),
        arxiv("Zarch et al. 2025, DEL: Context-Aware Dynamic Exit Layer for Efficient "
              "Self-Speculative Decoding (goodput-based draft length)", "2504.05598"),
    )
    description = "Draft γ tokens with a small model, verify in one target pass, resample at the first rejection"
    params = SpecParams(
        gamma=Int(10, 1, 32, "most tokens drafted per step (γ); the confidence rules may stop a draft sooner"),
        confidence=Float(0.4, 0.0, 1.0, "stop drafting after a token the draft gives probability below this "
                                        "(as transformers' assistant_confidence_threshold); 0 = never"),
        adaptive_h=Float(1.0, 0.0, 1.0, "SpecDec++: stop drafting once 1 - prod q(x_i) exceeds this; 1 = never"),
        stop=Choice("rules", STOPS, "what ends a draft before γ: rules (confidence and adaptive_h) or del "
                                    "(DEL: draft while one more token raises the expected goodput, from a "
                                    "running acceptance estimate; confidence and adaptive_h are ignored)"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        check_draft_context(ctx)
        self.d = DraftState(ctx.draft, check_draft(self.name, ctx))
        self.use_del = ctx.params.get("stop", "rules") == "del"
        if self.use_del:
            self.alpha = DEL_ALPHA0
            # a drafted token costs about a draft forward; with both models memory-bound that
            # is their size ratio, a fixed stand-in for DEL's measured per-layer cost
            self.cost = parameter_count(ctx.draft.model) / max(1, parameter_count(ctx.target.model))
            self.round: dict[str, Any] = {}

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        tree = Tree()
        gamma = min(int(ctx.params["gamma"]), max_depth)
        self.stop = DraftStop("length", 0)
        planned = None
        if self.use_del:
            # α is fixed for the round (it learns only from verified rounds), so the rule's
            # stopping point is known before the first draft forward
            cap = int(ctx.params["gamma"])
            planned = goodput_draft_length(self.alpha, cap, self.cost)
            self.round = {"alpha": self.alpha, "planned": planned,
                          "curve": [expected_goodput(self.alpha, k, self.cost) for k in range(cap + 1)]}
        if gamma <= 0:
            return tree
        h, floor = float(ctx.params["adaptive_h"]), float(ctx.params["confidence"])
        if planned is not None:
            h, floor = 1.0, 0.0  # DEL's length replaces the confidence rules
        V = ctx.target.vocab_size
        logits = self.d.catch_up(self.committed_ids)
        parent, drafted, conf = ROOT, [], 1.0
        row = self.draft_constraint()
        for i in range(gamma):
            logits = fit_logits(logits.float(), V)
            if row is not None:
                logits = row.apply(logits)[0]  # draft only what the constraint allows
            q = self.target_probs(ctx, logits, drafted)
            if self.greedy:
                # a point mass: its token needs no uniform, and the rules read the raw softmax
                qr = torch.softmax(logits, -1)
                x = point_mass_token(q)
            else:
                qr = q
                x = sample_index(q, self.next_uniform(ctx, "draft"))
            tree.dists[parent], tree.rule_q[parent] = q, qr
            qx = float(qr[x])
            parent = tree.add(x, parent, qx, "draft-model")
            drafted.append(x)
            conf *= qx
            if row is not None:
                row.advance(x)
            why = ("constraint" if row is not None and row.done else "confidence" if qx < floor
                   else "adaptive_h" if 1.0 - conf > h else None)
            if why is None and planned is not None and i + 1 == planned < int(ctx.params["gamma"]):
                why = "goodput"  # the rule's own stop, also where the run's length ends here
            if why is None and i + 1 == gamma:
                why = "gamma" if gamma == int(ctx.params["gamma"]) else "length"
            if why is not None:
                self.stop = DraftStop(why, len(drafted), qx, conf)
                break
            logits = self.d.feed([x])[-1]
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        if not self.use_del:
            return
        drafted = sum(1 for a in v.tree.aux if not a)
        if drafted:  # the run's last token drafts nothing and says nothing about acceptance
            self.alpha = DEL_KEEP * self.alpha + DEL_LEARN * (len(v.path) / drafted)
        self.round.update(drafted=drafted, accepted=len(v.path))

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        step.evidence["draft_stop"] = self.stop.evidence()
        if self.use_del:
            r = self.round
            step.evidence["del_goodput"] = {
                # α unrounded: the round's length is recomputed from it, and a rounded value
                # could land on the other side of a near tie in the goodput comparison
                "alpha": r["alpha"], "cost": self.cost, "gamma": int(ctx.params["gamma"]),
                "draft_length": r["planned"], "drafted": r["drafted"], "accepted": r["accepted"],
                "alpha_next": self.alpha,
                # goodput[k] = expected_goodput(alpha, k, cost) for k = 0..γ: the curve whose
                # first peak is the chosen length
                "goodput": [float(f"{g:.6g}") for g in r["curve"]],
            }
            self.extra_stats["del_alpha"] = round(self.alpha, 6)
        return step


@register
class SpecTree(SpecDecoder):
    """Token-tree speculation with a draft model, verified in one target pass.

    Implements (EAGLE-2 / Sequoia / SpecInfer style, A061/A259/A106): per depth the draft
    expands the ``width`` most promising nodes (by path probability under the draft) with
    ``topk`` children each, up to ``depth`` levels and ``budget`` nodes; one draft forward
    per depth uses a tree mask against the draft's cache. The target verifies every node in
    one forward with a tree attention mask and tree position ids; the longest accepted path
    is kept and the target cache is reduced to it. At temperature 0 the children are the
    draft's top-k and a child is accepted iff it is the target's argmax. At temperature > 0
    the children are drawn without replacement from q and tried in order by recursive
    rejection sampling (multi-candidate SD / RSD), which preserves the target distribution.
    Simplifies: SpecTr's optimal-transport selection is replaced by that recursive rule
    (the research notes' recommended stand-in); no final global re-ranking of nodes, which
    would break exactness at temperature > 0.
    """

    name = "spec_tree"
    needs_draft = True
    lossless = True
    reference = ("Li et al. 2024, EAGLE-2 (dynamic draft trees); Chen et al. 2024, Sequoia; Miao et al. 2024, "
                 "SpecInfer; Sun et al. 2023, SpecTr; Yang et al. 2023, Multi-candidate speculative decoding")
    papers = (
        arxiv("Li et al. 2024, EAGLE-2: Faster Inference of Language Models with Dynamic Draft "
              "Trees", "2406.16858"),
        arxiv("Chen et al. 2024, Sequoia: Scalable, Robust, and Hardware-aware Speculative "
              "Decoding", "2402.12374"),
        arxiv("Miao et al. 2024, SpecInfer: Accelerating Generative LLM Serving with Tree-based "
              "Speculative Inference and Verification (ASPLOS)", "2305.09781"),
        arxiv("Sun et al. 2023, SpecTr: Fast Speculative Decoding via Optimal Transport "
              "(NeurIPS)", "2310.15141"),
        arxiv("Yang et al. 2024, Multi-Candidate Speculative Decoding", "2401.06706"),
    )
    description = "Draft a dynamic token tree, verify all of it in one target pass with a tree mask"
    params = SpecParams(
        depth=Int(5, 1, 16, "maximum depth of the draft tree"),
        topk=Int(3, 1, 16, "children drafted under each expanded node"),
        width=Int(3, 1, 32, "most promising nodes expanded per depth"),
        budget=Int(24, 1, 256, "maximum number of draft nodes"),
        confidence=Float(0.4, 0.0, 1.0, "a node the draft gives probability below this stays a leaf (not "
                                        "expanded); the tree stops growing when no new node reaches it; 0 = never"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        check_draft_context(ctx)
        self.d = DraftState(ctx.draft, check_draft(self.name, ctx))

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        tree = Tree()
        k = ctx.params
        depth_max = min(int(k["depth"]), max_depth)
        self.stop = DraftStop("length", 0)
        if depth_max <= 0:
            return tree
        budget, topk, width = int(k["budget"]), int(k["topk"]), int(k["width"])
        floor = float(k["confidence"])
        V = ctx.target.vocab_size
        committed = self.committed_ids
        root_logits = self.d.catch_up(committed)
        base = len(self.d.ids)
        col: dict[int, int] = {}  # node -> its column in the draft cache
        colpos: dict[int, int] = {}  # draft cache column -> its position (windowed masks need it)
        frontier: list[tuple[int, float, torch.Tensor]] = [(ROOT, 1.0, root_logits)]
        for depth in range(1, depth_max + 1):
            new: list[tuple[int, float, float]] = []  # (node, path probability, its own q)
            for node, score, logits in sorted(frontier, key=lambda f: -f[1])[:width]:
                n_kids = min(topk, budget - len(tree))
                if n_kids <= 0:
                    break
                path = tree.path_tokens(node) if node != ROOT else []
                logits = fit_logits(logits.float(), V)
                q = None if self.greedy else self.target_probs(ctx, logits, path)  # top-k at T=0 reads qr
                qr = torch.softmax(logits, -1) if q is None else q
                if q is None:
                    kids = torch.topk(qr, min(n_kids, V)).indices.tolist()
                    tree.dists[node] = None  # deterministic top-k
                else:
                    us = [self.next_uniform(ctx, "draft") for _ in range(n_kids)]
                    kids = draw_without_replacement(q, n_kids, us)
                    tree.dists[node] = q
                tree.rule_q[node] = qr
                for x in kids:
                    qx = float(qr[x])
                    c = tree.add(x, node, qx, "draft-model")
                    new.append((c, score * qx, qx))
            best = max(new, key=lambda f: f[1], default=None)
            why = ("budget" if not new or len(tree) >= budget else
                   ("depth" if depth_max == int(k["depth"]) else "length") if depth == depth_max else None)
            # EAGLE-2's dynamic tree with the chain's stopping signal: only nodes the draft is
            # confident in grow children; a tree with none of them stops here
            sel = [f for f in sorted(new, key=lambda f: -f[1]) if f[2] >= floor][:width] if why is None else []
            if why is None and not sel:
                why = "confidence"
            if why is not None:
                self.stop = DraftStop(why, len(tree), None if best is None else best[2],
                                      None if best is None else best[1])
                break
            start = base + len(col)
            rows, toks, pos = [], [], []
            for r, (c, _s, _q) in enumerate(sel):
                anc, a = [], tree.parents[c]
                while a != ROOT:
                    anc.append(col[a])
                    a = tree.parents[a]
                rows.append(anc + [start + r])
                toks.append(tree.tokens[c])
                pos.append(base - 1 + tree.depth(c))
            mask = columns_mask(rows, base, start + len(sel), ctx.draft.dtype, ctx.draft.device)
            if self.d.info.kind == "windowed":
                kv_pos = list(range(base)) + [colpos[j] for j in range(base, start)] + pos
                mask = masks_by_type(mask.cpu(), torch.tensor(pos), torch.tensor(kv_pos), self.d.info)
            logits = self.d.feed(toks, attention_mask=mask,
                                 position_ids=torch.tensor([pos], device=ctx.draft.device))
            for r, (c, s, _q) in enumerate(sel):
                col[c] = start + r
                colpos[start + r] = pos[r]
            frontier = [(c, s, logits[r]) for r, (c, s, _q) in enumerate(sel)]
        self.d.crop(base)  # tree nodes out of the draft cache; accepted ones are re-fed next step
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        pass

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        step.evidence["draft_stop"] = self.stop.evidence()
        return step
