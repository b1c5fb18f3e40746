"""Shared mechanics of the speculative family: draft trees, tree attention, acceptance rules,
verification with (multi-candidate) rejection sampling, KV-cache reduction, and the loop
every draft-then-verify decoder runs.

The loop (:class:`SpecDecoder.run`) keeps the target's KV cache plus the committed tokens it
has not yet seen (``pending``: the whole prompt at first, then the last correction token).
Each step asks the decoder for a :class:`Tree` of drafted tokens hanging from the last
committed token, feeds ``pending + tree`` to the target in **one** forward pass (a 4-D tree
attention mask and explicit position ids when the tree branches), walks the tree from the
root accepting children by the acceptance rule, draws the correction (resample) or bonus
token, keeps only the cache entries of the accepted path, and yields a ``draft`` step.
There is no separate prefill: like transformers' assisted generation, the first
verification pass also reads the prompt, so a run that never accepts a draft costs exactly
as many target forwards as ``greedy``.

Exactness. At temperature 0 the sampling chain keeps only the argmax, so a child is
accepted iff it is the target's argmax, and the output is greedy's. At temperature > 0 the
children of a node are tried in order with recursive rejection sampling (Chen et al. 2023
multi-candidate SD; Jeon et al. 2024 RSD): child ``j`` is accepted with probability
``min(1, p_j(x)/q_j(x))``; on rejection ``p_{j+1} = norm(max(0, p_j - q_j))`` and ``q_{j+1}``
is ``q_j`` without ``x`` (children drawn *without replacement* from the draft), or, for a
deterministic candidate (lookup, n-gram, recycled tokens), ``q_j`` is a point mass so
``p_{j+1}`` is ``p_j`` with ``x`` removed. Either way the committed token follows the
target's distribution exactly (each stage is a valid speculative-sampling step whose
residual is the next stage's target), for any tree shape fixed before the children's own
values are seen.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from decoders.kv_cache import (CacheInfo, cache_len, check_rollback, fit_tree_mask, rollback_cache,
                             select_cache)
from decoders.ar import (checked_probs, constraint_stage, descending_order, dist_evidence, pick_in_order,
                        sample_index, watch_evidence)
from decoders.base import Choice, Context, Decoder, Float, Int, Param
from decoders.constraint import constraint_params
from decoders.processors import ChainParams, History, build_chain, chain_defaults, chain_params
from playground.core.trace import Step, speculative_figures

NEG_INF = float("-inf")
ROOT = -1

# ---------------------------------------------------------------------- knobs
RULES = ("strict", "typical", "fuzzy", "top_m", "entropy", "cactus", "additive", "multiplicative")
LOSSY_RULES = ("typical", "fuzzy", "top_m", "entropy", "cactus", "additive", "multiplicative")


def rule_params() -> dict[str, Param]:
    """The acceptance-rule knobs shared by every draft-based decoder."""
    return dict(
        accept=Choice("strict", RULES, "acceptance rule: strict (lossless), typical (Medusa), fuzzy "
                                       "(divergence, FSD), top_m (relaxed), entropy (EASD), cactus (KL-budgeted), "
                                       "additive / multiplicative (relaxed level sets); all but strict are lossy"),
        typical_eps=Float(0.09, 0.0, 1.0, "typical: accept if p(x) > min(eps, delta*exp(-H(p)))"),
        typical_delta=Float(0.3, 0.0, 1.0, "typical: delta of the entropy-scaled threshold"),
        fuzzy_div=Float(0.3, 0.0, 0.7, "fuzzy: accept if the Jensen-Shannon divergence of p and q (nats) is below this"),
        top_m=Int(3, 1, 100, "top_m: accept if the drafted token is among the target's m most probable"),
        easd_entropy=Float(2.0, 0.0, 20.0, "entropy (EASD): both models count as uncertain above this entropy (nats)"),
        easd_top_n=Int(5, 1, 100, "entropy (EASD): size of the top-N sets whose overlap is measured"),
        easd_overlap=Float(0.6, 0.0, 1.0, "entropy (EASD): reject when both are uncertain and top-N overlap reaches this share"),
        cactus_delta=Float(1.0, 0.0, 10.0, "cactus: divergence budget δ; the drafted token's target probability p is raised "
                                           "to p + sqrt(2δ p (1 - p)) and the rest scaled down; 0 = strict; no effect at temperature 0"),
        relax_delta=Float(0.1, 0.0, 1.0, "additive: accept when p(x) >= max p - delta"),
        relax_rho=Float(0.5, 0.0, 1.0, "multiplicative: accept when p(x) >= rho · max p"),
    )


# the knobs each rule reads (a decoder with rule_params has them all)
_RULE_KNOBS: dict[str, tuple[str, ...]] = {
    "typical": ("typical_eps", "typical_delta"), "fuzzy": ("fuzzy_div",), "top_m": ("top_m",),
    "entropy": ("easd_entropy", "easd_top_n", "easd_overlap"), "cactus": ("cactus_delta",),
    "additive": ("relax_delta",), "multiplicative": ("relax_rho",),
}


def sampling_params(temperature: float = 0.0) -> dict[str, Param]:
    """The sampling chain of ``decoders/processors.py`` (without the stateful mirostat).

    Every draft-and-verify decoder defaults to temperature 0 — greedy-exact: the output equals
    the target's greedy output token for token; temperature 1 is speculative sampling, exact in
    distribution (the target's law)."""
    specs = chain_params()
    specs.pop("mirostat_tau", None)
    specs.pop("mirostat_eta", None)
    specs["temperature"] = Float(temperature, 0.0, 10.0,
                                 "divide logits by this; 0 (default) = greedy-exact (accept iff argmax), 1 = speculative sampling "
                                 "(the target's distribution); the same chain for p and q")
    return specs


class SpecParams(ChainParams):
    """Knob specs of a speculative decoder (validation also checks the chain's knobs), plus the
    grammar constraint knobs (``regex``/``json_schema``/``grammar``): the target's distribution
    is constrained before verification, so a lossless decoder stays equal to constrained greedy."""

    def __init__(self, **specs: Param) -> None:
        super().__init__(**specs, **constraint_params(words=False))


def is_greedy(params: dict[str, Any]) -> bool:
    """Whether these knobs make the sampling distribution a point mass on the argmax."""
    return float(params.get("temperature", 0.0)) == 0.0


# ---------------------------------------------------------------------- the draft tree
@dataclass
class Tree:
    """Drafted tokens hanging from the last committed token (parent ``ROOT`` = -1).

    ``aux`` nodes are fed to the target with the tree (lookahead windows, mask probes)
    but are never verified or committed. ``dists[parent]`` is the distribution the draft
    nodes under ``parent`` were drawn from, without replacement and in the order they were
    added; ``None`` means deterministic candidates (point masses). ``rule_q[parent]`` is the
    draft's distribution the lossy acceptance rules look at (raw softmax at temperature 0).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: list[float | None] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    aux: list[bool] = field(default_factory=list)
    dists: dict[int, torch.Tensor | None] = field(default_factory=dict)
    rule_q: dict[int, torch.Tensor | None] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int = ROOT, q: float | None = None, source: str = "draft",
            aux: bool = False) -> int:
        """Append a node; return its index."""
        if parent != ROOT and not (0 <= parent < len(self.tokens)):
            raise ValueError(f"bad parent {parent}")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.q.append(None if q is None else float(q))
        self.sources.append(source)
        self.aux.append(bool(aux))
        return len(self.tokens) - 1

    def add_chain(self, tokens: Sequence[int], parent: int = ROOT, source: str = "draft",
                  q: Sequence[float | None] | None = None) -> list[int]:
        """Append a chain of draft nodes under ``parent``, merging with existing children
        that carry the same token (so several candidates form a trie)."""
        out = []
        for j, t in enumerate(tokens):
            same = [c for c in self.children(parent) if self.tokens[c] == int(t)]
            parent = same[0] if same else self.add(t, parent, None if q is None else q[j], source)
            out.append(parent)
        return out

    def children(self, i: int, include_aux: bool = False) -> list[int]:
        """Children of node ``i`` (``ROOT`` for the top level) in the order they were added."""
        return [c for c, p in enumerate(self.parents) if p == i and (include_aux or not self.aux[c])]

    def depth(self, i: int) -> int:
        """1 for a child of the root."""
        d = 0
        while i != ROOT:
            i = self.parents[i]
            d += 1
        return d

    def path_tokens(self, i: int) -> list[int]:
        """Tokens from the root (exclusive) down to node ``i`` (inclusive)."""
        out = []
        while i != ROOT:
            out.append(self.tokens[i])
            i = self.parents[i]
        return out[::-1]

    def keep(self, ok: Sequence[bool]) -> "Tree":
        """A copy without the nodes where ``ok`` is False (and without their descendants)."""
        new, remap = Tree(), {ROOT: ROOT}
        for i in range(len(self.tokens)):
            if ok[i] and self.parents[i] in remap:
                remap[i] = new.add(self.tokens[i], remap[self.parents[i]], self.q[i], self.sources[i], self.aux[i])
        for old, d in self.dists.items():
            if old in remap:
                new.dists[remap[old]] = d
        for old, d in self.rule_q.items():
            if old in remap:
                new.rule_q[remap[old]] = d
        return new

    def pruned(self, max_depth: int, max_draft_depth: int) -> "Tree":
        """Drop nodes deeper than ``max_depth`` (any node) or draft nodes deeper than
        ``max_draft_depth`` (so a step never commits more tokens than allowed)."""
        ok = []
        for i in range(len(self.tokens)):
            d = self.depth(i)
            ok.append(d <= max_depth and (self.aux[i] or d <= max_draft_depth))
        return self if all(ok) else self.keep(ok)


# ---------------------------------------------------------------------- attention & cache
def ancestor_masks(parents: Sequence[int]) -> torch.Tensor:
    """(n, n) bool: ``m[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i`` (parents precede children)."""
    n = len(parents)
    m = torch.zeros((n, n), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            if p >= i:
                raise ValueError("a parent must come before its child")
            m[i] = m[p]
        m[i, i] = True
    return m


def is_chain(parents: Sequence[int]) -> bool:
    """Whether every fed token's parent is the token just before it (plain causal order)."""
    return all(p == i - 1 for i, p in enumerate(parents))


def tree_inputs(parents: Sequence[int], past_len: int, dtype: torch.dtype,
                device: Any = "cpu") -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The 4-D attention mask (1, 1, n, past_len + n) and position ids (1, n) that make each
    fed token see the cache and its own ancestors only; ``(None, None)`` for a plain chain.

    ``parents[i]`` is the index of token ``i``'s parent among the fed tokens, -1 for a token
    whose parent is the last cached position. Position = past_len + depth - 1.
    """
    if is_chain(parents):
        return None, None
    n = len(parents)
    anc = ancestor_masks(parents)
    mask = torch.full((1, 1, n, past_len + n), NEG_INF, dtype=dtype)
    mask[..., :past_len] = 0.0
    mask[0, 0, :, past_len:] = torch.where(anc, torch.zeros((), dtype=dtype), torch.full((), NEG_INF, dtype=dtype))
    depth = anc.sum(1)  # number of ancestors-or-self among the fed tokens
    pos = (past_len + depth - 1).unsqueeze(0).long()
    return mask.to(device), pos.to(device)


def columns_mask(rows: Sequence[Sequence[int]], prefix: int, kv_len: int, dtype: torch.dtype,
                 device: Any = "cpu") -> torch.Tensor:
    """A (1, 1, len(rows), kv_len) mask where row r sees columns ``[0, prefix)`` and ``rows[r]``."""
    mask = torch.full((1, 1, len(rows), kv_len), NEG_INF, dtype=dtype)
    mask[..., :prefix] = 0.0
    for r, cols in enumerate(rows):
        mask[0, 0, r, list(cols)] = 0.0
    return mask.to(device)


# ---------------------------------------------------------------------- drafting helpers
def draw_without_replacement(probs: torch.Tensor, k: int, us: Sequence[float]) -> list[int]:
    """Up to ``k`` distinct tokens drawn in sequence from ``probs`` without replacement
    (each draw from the renormalised rest, as :func:`sample_index` draws), using one
    uniform per draw. The layout is sorted once: removing a drawn token does not reorder
    the others (see :func:`pick_in_order`)."""
    p = probs.detach().double().cpu().clone()
    out: list[int] = []
    order = None
    for j in range(k):
        if float(p.sum()) <= 0.0:
            break
        if order is None:
            order = descending_order(checked_probs(p))
        t = pick_in_order(p, order, float(us[j]))
        out.append(t)
        p[t] = 0.0
    return out


def entropy(p: torch.Tensor) -> float:
    """Entropy in nats of a probability vector."""
    q = p.double()
    # xlogy(0, 0) = 0: zeros drop out without the boolean gather (~20x slower at 4,096 tokens)
    return float(-torch.xlogy(q, q).sum())


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """Jensen-Shannon divergence (nats) of two probability vectors."""
    p, q = p.double(), q.double()
    m = 0.5 * (p + q)

    def kl(a: torch.Tensor) -> float:
        # a log a - a log m, with 0 where a = 0 (m may be 0 there too): no boolean gathers, which
        # made this the costliest part of a speculative step's evidence
        return float((torch.xlogy(a, a) - torch.xlogy(a, m)).sum())

    return 0.5 * kl(p) + 0.5 * kl(q)


def one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    """A point mass on ``token`` with the size of ``like``."""
    out = torch.zeros_like(like, dtype=torch.float32)
    out[token] = 1.0
    return out


# ---------------------------------------------------------------------- acceptance rules
@dataclass
class Trial:
    """What verification did with one candidate."""

    accept_prob: float
    accepted: bool
    lossy: bool  # the rule decided against what strict would have done with the same uniform
    # the acceptance probability every rule the decoder's knobs define gives this candidate
    rule_probs: dict[str, float] = field(default_factory=dict)


def cactus_target(p: torch.Tensor, token: int, delta: float) -> torch.Tensor:
    """Cactus's modified target for a drafted ``token`` (Hao & Mou 2026): its probability
    p(x) is raised to h(x) = min(1, p(x) + sqrt(2 δ p(x) (1 - p(x)))) and every other token
    keeps its share of the rest, h(y) = p(y) (1 - h(x)) / (1 - p(x)) — the solution, to second
    order in the KL divergence, of raising the drafted token's acceptance under a divergence
    budget δ. A point mass (temperature 0) is left as it is."""
    p = p.double()
    px = float(p[token])
    hx = min(1.0, px + math.sqrt(max(0.0, 2.0 * delta * px * (1.0 - px))))
    h = p * ((1.0 - hx) / (1.0 - px)) if px < 1.0 else p.clone()
    h[token] = hx
    return h


class Rule:
    """An acceptance rule: ``decide`` returns True (force accept), False (force reject) or
    None (use the strict, distribution-preserving test)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.name = str(params.get("accept", "strict"))
        self.params = params
        # per sibling group: entropies, divergences and top-k sets of the group's p and q,
        # which every candidate of the group (and every rule side by side) shares
        self._memo: dict[tuple[Any, ...], Any] = {}

    def new_group(self) -> None:
        """Forget the previous sibling group's distributions (call before a new group)."""
        self._memo = {}

    def _once(self, tag: Any, objs: tuple[torch.Tensor, ...], fn: Any) -> Any:
        """``fn()`` for these tensors, computed once; the memo holds the tensors, so no other
        tensor can take their ids while it remembers them."""
        key = (tag, *map(id, objs))
        if key not in self._memo:
            self._memo[key] = (objs, fn())
        return self._memo[key][1]

    def _entropy(self, t: torch.Tensor) -> float:
        return self._once("H", (t,), lambda: entropy(t))

    def _top(self, t: torch.Tensor, n: int) -> torch.Tensor:
        return self._once(("top", n), (t,), lambda: torch.topk(t, n))

    @property
    def lossy(self) -> bool:
        """Whether the rule may change the output distribution."""
        return self.name in LOSSY_RULES

    def target(self, token: int, p: torch.Tensor) -> torch.Tensor:
        """The distribution the strict test and the residual use for ``token``: Cactus's
        modified target under ``cactus``, ``p`` itself under every other rule."""
        if self.name == "cactus":
            return cactus_target(p, token, float(self.params.get("cactus_delta", 0.0)))
        return p

    def side_by_side(self, token: int, p: torch.Tensor, qx: float, p_rule: torch.Tensor,
                     q_rule: torch.Tensor | None) -> dict[str, float]:
        """The probability with which each rule the knobs define would accept ``token``
        (drawn with probability ``qx``) against the target ``p``: strict min(1, p(x)/q(x)),
        Cactus min(1, h(x)/q(x)), and for the threshold rules 1 (forced accept), 0 (forced
        reject) or the strict probability."""
        def strict(t: torch.Tensor) -> float:
            tx = float(t[token])
            return min(1.0, tx / qx) if qx > 0 else (1.0 if tx > 0 else 0.0)

        out = {"strict": strict(p)}
        for name in RULES[1:]:
            if not all(k in self.params for k in _RULE_KNOBS[name]):
                continue
            other = Rule({**self.params, "accept": name})
            other._memo = self._memo  # one group's distributions, measured once for all rules
            if name == "cactus":
                out[name] = strict(other.target(token, p))
                continue
            verdict = other.decide(token, p_rule, q_rule)
            out[name] = out["strict"] if verdict is None else float(verdict)
        return {k: round(v, 6) for k, v in out.items()}

    def decide(self, token: int, p_rule: torch.Tensor, q_rule: torch.Tensor | None) -> bool | None:
        """The rule's own verdict on ``token`` (see the class doc)."""
        k = self.params
        if self.name == "typical":
            # Medusa's typical acceptance: p(x) > min(eps, delta * exp(-H(p)))
            thr = min(k["typical_eps"], k["typical_delta"] * math.exp(-self._entropy(p_rule)))
            return True if float(p_rule[token]) > thr else None
        if self.name == "top_m":
            m = min(int(k["top_m"]), p_rule.numel())
            kth = self._top(p_rule, m).values[-1]
            return True if float(p_rule[token]) >= float(kth) and float(p_rule[token]) > 0 else None
        if self.name == "fuzzy":
            if float(p_rule[token]) <= 0:
                return None  # a token the target's chain rules out (top-k, a banned n-gram) stays out
            if q_rule is None:  # deterministic candidates: q is a point mass on each
                div = js_divergence(p_rule, one_hot(token, p_rule))
            else:
                div = self._once("JS", (p_rule, q_rule), lambda: js_divergence(p_rule, q_rule))
            return True if div <= k["fuzzy_div"] else None
        if self.name in ("additive", "multiplicative"):
            # relaxed greedy acceptance: the rejection region is a lower level set of p
            top, px = self._once("max", (p_rule,), lambda: float(p_rule.max())), float(p_rule[token])
            thr = top - k["relax_delta"] if self.name == "additive" else k["relax_rho"] * top
            return True if px > 0 and px >= thr else None
        if self.name == "entropy":
            if q_rule is None:
                return None  # a deterministic draft is never "uncertain"
            tau = k["easd_entropy"]
            if self._entropy(p_rule) > tau and self._entropy(q_rule) > tau:
                n = min(int(k["easd_top_n"]), p_rule.numel())
                a = set(self._top(p_rule, n).indices.tolist())
                b = set(self._top(q_rule, n).indices.tolist())
                if len(a & b) / n >= k["easd_overlap"]:
                    return False
            return None
        return None


def verify_group(p: torch.Tensor, cands: Sequence[int], qdist: torch.Tensor | None,
                 uniforms: Sequence[float], rule: Rule | None = None,
                 p_rule: torch.Tensor | None = None,
                 q_rule: torch.Tensor | None = None) -> tuple[int | None, list[Trial], torch.Tensor, bool]:
    """Try sibling candidates in order by recursive rejection sampling.

    ``p``: the target's sampling distribution at the parent; ``qdist``: the distribution
    the candidates were drawn from without replacement (None: deterministic candidates).
    Returns (index of the accepted candidate or None, one :class:`Trial` per tried
    candidate, the distribution to draw the correction from when none is accepted, and
    whether the last decision was a forced rejection). With ``rule`` the lossy rules may
    override the strict test; the residual stays the strict one, except under Cactus, whose test
    and residual both use its modified target (:func:`cactus_target` of the current ``p_j``).
    Each trial also records every rule's acceptance probability for the candidate
    (:meth:`Rule.side_by_side`).
    """
    p_j = p.double().cpu()
    q_base = qdist.double().cpu().clone() if qdist is not None else None
    if rule is not None:
        rule.new_group()
    trials: list[Trial] = []
    for j, x in enumerate(cands):
        if q_base is not None:
            tot = float(q_base.sum())
            q_j = q_base / tot if tot > 0 else torch.zeros_like(q_base)
            qx = float(q_j[x])
        else:
            q_j, qx = None, 1.0
        px = float(p_j[x])
        strict_prob = min(1.0, px / qx) if qx > 0 else (1.0 if px > 0 else 0.0)
        u = float(uniforms[j])
        strict_ok = u < strict_prob
        # Cactus tests against (and resamples from) its modified target; the others keep p
        t_j = rule.target(x, p_j) if rule is not None else p_j
        tx = float(t_j[x])
        test_prob = min(1.0, tx / qx) if qx > 0 else (1.0 if tx > 0 else 0.0)
        pr = p_rule if p_rule is not None else p
        verdict = rule.decide(x, pr, q_rule) if rule is not None else None
        ok = (u < test_prob) if verdict is None else verdict
        prob = test_prob if verdict is None else float(verdict)
        side = rule.side_by_side(x, p_j, qx, pr, q_rule) if rule is not None else {}
        trials.append(Trial(prob, ok, ok != strict_ok, side))
        if ok:
            return j, trials, p_j, False
        if verdict is False:
            # EASD: the target re-draws from its own distribution
            return None, trials, p_j, True
        if q_j is None:
            res = t_j.clone()
            res[x] = 0.0
        else:
            res = torch.clamp(t_j - q_j, min=0.0)
            q_base[x] = 0.0
        if float(res.sum()) <= 1e-12:  # p == q up to rounding: fall back to p without x
            res = t_j.clone()
            res[x] = 0.0
            if float(res.sum()) <= 0:
                res = t_j.clone()
        p_j = res / res.sum()
    return None, trials, p_j, False


# ---------------------------------------------------------------------- the shared loop
@dataclass
class Verified:
    """Everything one verification step produced (given to ``after_verify``)."""

    tree: Tree
    rows: torch.Tensor            # target logits of every fed token (pending then tree nodes)
    n_pending: int
    path: list[int]               # accepted draft nodes, root to leaf
    committed: list[int]
    correction: int | None
    correction_kind: str | None
    node_info: dict[int, dict[str, Any]]
    past_len: int                 # cache length before this step's forward
    root_token: int
    stopped: str | None = None
    correction_dist: dict[str, Any] | None = None
    mismatches: int = 0           # committed tokens that were not the verified argmax (T=0)
    watch: list[dict[str, Any]] = field(default_factory=list)  # watch evidence per committed token

    def row(self, node: int) -> torch.Tensor:
        """Target logits at a tree node (``ROOT`` = the last committed token)."""
        return self.rows[self.row_index(node)]

    def row_index(self, node: int) -> int:
        """Which of ``rows`` holds the target logits at a tree node."""
        return self.n_pending - 1 + (0 if node == ROOT else node + 1)


class SpecDecoder(Decoder):
    """Base of the draft-then-verify decoders. Subclasses implement :meth:`draft` and may
    override :meth:`setup`, :meth:`after_verify` and :meth:`make_step`."""

    family = "speculative"
    kind = "causal"
    step_kind = "draft"
    greedy_only = False

    # ---------------------------------------------------------------- hooks
    def setup(self, ctx: Context) -> None:
        """Called once before the first step."""

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        """The tree to verify this step (draft nodes at most ``max_depth`` deep)."""
        raise NotImplementedError

    def after_verify(self, ctx: Context, v: Verified) -> None:
        """Learn from a verification (tables, windows, draft caches)."""

    def make_step(self, ctx: Context, v: Verified) -> Step:
        """The trace step of a verification."""
        return Step("draft", v.committed, tree=tree_evidence(v), root=v.root_token,
                    correction_dist=v.correction_dist)

    def _step(self, ctx: Context, v: Verified) -> Step:
        step = self.make_step(ctx, v)
        if v.watch:
            step.evidence["watch"] = v.watch
        if v.mismatches:
            step.evidence["lossless_mismatch"] = v.mismatches
        rules = next((list(i["rule_probs"]) for i in v.node_info.values() if i.get("rule_probs")), None)
        if rules and len(rules) > 1:
            # the rules whose acceptance probabilities the tree's nodes carry, side by side
            step.evidence["accept_rules"] = {"active": self.rule.name, "rules": rules,
                                             "lossy": [r for r in rules if r in LOSSY_RULES]}
        return step

    def is_lossy(self, params: dict[str, Any]) -> bool:
        rule = str(params.get("accept", "strict"))
        if rule == "cactus":
            # Cactus leaves a point mass alone, and δ = 0 is the strict test
            return float(params.get("cactus_delta", 0.0)) > 0 and not is_greedy(params)
        return rule in LOSSY_RULES

    # ---------------------------------------------------------------- helpers for subclasses
    @property
    def committed_ids(self) -> list[int]:
        """Prompt plus output so far."""
        return self.prompt + self.out

    def history(self, ctx: Context, extra: Sequence[int] = ()) -> History:
        """The chain's view of the context after the committed tokens plus ``extra``."""
        return History(ids=self.prompt + self.out + list(extra), prompt_len=len(self.prompt),
                       pos=len(self.out) + len(extra), uniform=ctx.uniform)

    def target_probs(self, ctx: Context, logits: torch.Tensor, extra: Sequence[int] = ()) -> torch.Tensor:
        """The sampling distribution of the chain at this context (one-hot at temperature 0)."""
        if self.plain_chain is not None:
            # the chain is temperature 0 alone (a point mass) or empty (the softmax): computed
            # without the chain's tensor passes, which every verified row and drafted token
            # pays; logits the chain would repair (NaN, +inf, none finite) still go through it
            top = int(torch.argmax(logits))
            if math.isfinite(float(logits[top])):
                return one_hot(top, logits) if self.plain_chain == "argmax" else torch.softmax(logits.float(), -1)
        return self.chain.probs(logits.float(), self.history(ctx, extra))

    def rule_probs(self, ctx: Context, logits: torch.Tensor, extra: Sequence[int] = ()) -> torch.Tensor:
        """The distribution rules and evidence look at: the chain's, or at temperature 0
        the raw softmax (the chain's would be a point mass)."""
        if self.greedy:
            return torch.softmax(logits.float(), -1)
        return self.target_probs(ctx, logits, extra)

    def draft_constraint(self) -> Any:
        """A copy of the run's constraint row to draft under (None without a constraint): mask
        the draft's logits with ``row.apply(logits)[0]`` and ``row.advance(x)`` each drafted
        token. q is the draft's own choice, so verification stays exact; drafts the constraint
        would reject are simply not proposed."""
        return self.crow.clone() if self.crow is not None else None

    def next_uniform(self, ctx: Context, stream: str) -> float:
        """A fresh common random number of ``stream`` (indexed by a per-run counter)."""
        self._counters[stream] = self._counters.get(stream, 0) + 1
        return ctx.uniform(self._counters[stream], stream)

    # ---------------------------------------------------------------- the loop
    def run(self, ctx: Context) -> Iterator[Step]:
        knobs = dict(ctx.params)
        if self.greedy_only:
            knobs["temperature"] = 0.0
        self.greedy = is_greedy(knobs)
        chain_knobs = {k: knobs[k] for k in chain_defaults() if k in knobs}
        chain_knobs["temperature"] = float(knobs.get("temperature", 0.0))
        self.chain = build_chain(chain_knobs, ctx.target.tokenizer, ctx.target.vocab_size)
        items = [p.item for p in self.chain.processors]
        self.plain_chain = "argmax" if self.greedy and items == ["temperature"] else "softmax" if not items else None
        self.rule = Rule(knobs)
        self.prompt = list(ctx.prompt_ids)
        self.out: list[int] = []
        self.cache_info: CacheInfo = check_rollback(self.name, ctx.target)
        self.cache = rollback_cache(ctx.target, self.cache_info)
        # at temperature 0 with the strict rule every committed token must be the verified
        # row's argmax: counted, never silently different text
        self.check_lossless = self.greedy and self.rule.name == "strict" and bool(self.lossless)
        self.pending: list[int] = list(self.prompt)
        self._counters: dict[str, int] = {}
        self.acc = _Stats()
        stage = constraint_stage(ctx)
        self.crow = stage.row() if stage else None
        self._cev: dict[str, Any] | None = None
        self.setup(ctx)
        while len(self.out) < ctx.max_new_tokens:
            ctx.check_cancel()
            remaining = ctx.max_new_tokens - len(self.out)
            past = cache_len(self.cache)
            room = max(0, ctx.target.context_length - past - len(self.pending))
            tree = self.draft(ctx, remaining - 1).pruned(room, remaining - 1)
            v = self._verify(ctx, tree)
            self.acc.add(v)
            self.out.extend(v.committed)
            self.after_verify(ctx, v)
            self.extra_stats = self.acc.stats(self)
            step = self._step(ctx, v)
            if self._cev is not None:
                # the constraint at the step's first position (allowed tokens, removed mass)
                step.evidence["constraint"] = self._cev
                self.extra_stats["constraint_complete"] = self.crow.accepting
            yield step
            if v.stopped:
                self.finish_reason = v.stopped
                return
        self.finish_reason = "length"

    def _verify(self, ctx: Context, tree: Tree) -> Verified:
        n_pend = len(self.pending)
        past = cache_len(self.cache)
        fed = list(self.pending) + tree.tokens
        parents = [i - 1 for i in range(n_pend)] + [n_pend - 1 if p == ROOT else n_pend + p for p in tree.parents]
        mask, pos = tree_inputs(parents, past, ctx.target.dtype, ctx.target.device)
        mask = fit_tree_mask(mask, pos, past, self.cache_info)
        out = ctx.target.forward(fed, cache=self.cache, attention_mask=mask, position_ids=pos,
                                 **self.forward_kwargs(ctx))
        self.cache = out.cache
        self.last_forward = out
        rows = out.logits[0]
        root_token = self.pending[-1]
        v = Verified(tree=tree, rows=rows, n_pending=n_pend, path=[], committed=[], correction=None,
                     correction_kind=None, node_info={}, past_len=past, root_token=root_token)
        self._walk(ctx, v)
        # evidence p for nodes whose parent the walk did not reach
        at_parent: dict[int, torch.Tensor] = {}
        unreached = [i for i in range(len(tree)) if not tree.aux[i] and i not in v.node_info]
        # where the rules' distribution is the rows' softmax, one batched softmax serves them all
        # (a long rejected lookup draft otherwise pays one softmax per node)
        batch = (torch.softmax(rows.float(), -1) if unreached and (self.greedy or self.plain_chain == "softmax")
                 and bool(torch.isfinite(rows).all()) else None)
        for i in unreached:
            par = tree.parents[i]
            if par not in at_parent:
                at_parent[par] = (batch[v.row_index(par)] if batch is not None else
                                  self.rule_probs(ctx, v.row(par), tree.path_tokens(par) if par != ROOT else ()))
            v.node_info[i] = {"p": float(at_parent[par][tree.tokens[i]]), "accept_prob": None, "accepted": False}
        # cache: everything before, the pending tokens, then the accepted path
        keep = list(range(past + n_pend)) + [past + n_pend + i for i in v.path]
        select_cache(self.cache, keep)
        self.pending = [v.correction] if v.correction is not None else []
        return v

    def forward_kwargs(self, ctx: Context) -> dict[str, Any]:
        """Extra arguments of the verification forward (layer_skip asks for hidden states)."""
        return {}

    def _walk(self, ctx: Context, v: Verified) -> None:
        tree, node, path_tokens = v.tree, ROOT, []
        while True:
            pos = len(self.out) + len(path_tokens)
            logits = raw = v.row(node)
            if self.crow is not None:
                # the constrained target: the walk commits as it goes, so the row's state is this node's
                logits, cev = self.crow.apply(logits)
                if not path_tokens:
                    self._cev = cev
            p = self.target_probs(ctx, logits, path_tokens)
            if ctx.watch:  # one entry per committed position: this node's token or the correction
                v.watch.append(watch_evidence(raw, p, ctx.watch))
            p_rule = torch.softmax(logits.float(), -1) if self.greedy else p
            kids = tree.children(node)
            for c in kids:
                v.node_info[c] = {"p": float(p_rule[tree.tokens[c]]), "accept_prob": None, "accepted": False}
            if kids:
                # at temperature 0 every acceptance probability is 0 or 1: no uniform decides
                us = [0.0] * len(kids) if self.greedy else [self.next_uniform(ctx, "accept") for _ in kids]
                idx, trials, residual, forced = verify_group(
                    p, [tree.tokens[c] for c in kids], tree.dists.get(node), us, self.rule, p_rule,
                    tree.rule_q.get(node))
                for c, t in zip(kids, trials):
                    v.node_info[c].update(accept_prob=round(t.accept_prob, 6), accepted=t.accepted,
                                          rule_probs=t.rule_probs)
                    if t.lossy:
                        v.node_info[c]["lossy"] = True
                if idx is not None:
                    child = kids[idx]
                    self._audit(v, p, tree.tokens[child])
                    v.path.append(child)
                    path_tokens.append(tree.tokens[child])
                    if self._commit(ctx, v, tree.tokens[child]):
                        return
                    node = child
                    continue
                kind = "resample"
                draw_from = residual
                lossy_reject = forced
            else:
                kind, draw_from, lossy_reject = "bonus", p, False
            tok = sample_index(draw_from, 0.0 if self.greedy else ctx.uniform(pos))  # a point mass at T=0
            v.correction, v.correction_kind = tok, kind
            v.correction_dist = dist_evidence(ctx.target, logits, draw_from.float(), tok,
                                              min(ctx.top_k_evidence, 10))
            if lossy_reject and tok != tree.tokens[kids[len(trials) - 1]]:
                self.acc.lossy_tokens += 1  # EASD rejected a token strict would have kept
            self._audit(v, p, tok)
            self._commit(ctx, v, tok)
            return

    def _audit(self, v: Verified, p: torch.Tensor, tok: int) -> None:
        """The runtime lossless check: at temperature 0 (strict rule) a committed token must
        be the argmax of the distribution it was verified against."""
        if self.check_lossless and int(torch.argmax(p)) != int(tok):
            v.mismatches += 1

    def _commit(self, ctx: Context, v: Verified, tok: int) -> bool:
        """Append a committed token; True when the run must stop after it."""
        v.committed.append(int(tok))
        if self.crow is not None:
            self.crow.advance(tok)
            if self.crow.done and int(tok) not in ctx.stop_ids:
                v.stopped = "constraint"
                if v.correction is None:
                    v.correction_kind = None
                return True
        if int(tok) in ctx.stop_ids:
            v.stopped = "eos" if int(tok) in getattr(ctx.target, "eos_ids", set()) else "stop"
            if v.correction is None:
                v.correction_kind = None
            return True
        if ctx.stop_strings:
            tail = ctx.target.decode((self.out + v.committed)[-32:])
            if any(s and s in tail for s in ctx.stop_strings):
                v.stopped = "stop"
                return True
        return False


def tree_evidence(v: Verified) -> dict[str, Any]:
    """The ``tree`` field of a draft step: draft nodes (renumbered), accepted path, correction."""
    tree = v.tree
    ids: dict[int, int] = {}
    nodes = []
    for i in range(len(tree)):
        if tree.aux[i]:
            continue
        ids[i] = len(nodes)
        info = v.node_info.get(i, {})
        node = {"id": ids[i], "parent": None if tree.parents[i] == ROOT else ids.get(tree.parents[i]),
                # six significant digits: a tiny probability must not read as 0 (ruled out)
                "token": tree.tokens[i], "q": None if tree.q[i] is None else float(f"{tree.q[i]:.6g}"),
                "p": None if info.get("p") is None else float(f"{info['p']:.6g}"),
                "accept_prob": info.get("accept_prob"), "accepted": bool(info.get("accepted", False)),
                "source": tree.sources[i]}
        if info.get("lossy"):
            node["lossy"] = True
        if info.get("rule_probs"):
            node["rule_probs"] = info["rule_probs"]
        nodes.append(node)
    return {"nodes": nodes, "accepted_path": [ids[i] for i in v.path],
            "correction": v.correction, "correction_kind": v.correction_kind}


class _Stats:
    """Running acceptance statistics of a run (merged into the trace's stats).

    The figures are :func:`playground.core.trace.speculative_figures` of the counts, the same
    function the plots and the stats line apply to the trace's draft steps.
    """

    def __init__(self) -> None:
        self.steps = 0
        self.drafted = 0
        self.tried = 0
        self.accepted = 0
        self.hist: Counter[int] = Counter()
        self.sources: Counter[str] = Counter()
        self.lossy_tokens = 0
        self.tokens = 0
        self.mismatches = 0

    def add(self, v: Verified) -> None:
        self.steps += 1
        self.drafted += sum(1 for a in v.tree.aux if not a)
        self.tried += sum(1 for i in v.node_info.values() if i.get("accept_prob") is not None)
        self.accepted += len(v.path)
        self.hist[len(v.path)] += 1
        for i, tok in zip(v.path, v.committed):
            self.sources[v.tree.sources[i]] += 1
        if v.correction is not None and len(v.committed) > len(v.path):
            self.sources["target"] += 1
        self.lossy_tokens += sum(1 for i in v.path if v.node_info.get(i, {}).get("lossy"))
        self.tokens += len(v.committed)
        self.mismatches += v.mismatches

    def stats(self, dec: SpecDecoder) -> dict[str, Any]:
        total = max(1, sum(self.sources.values()))
        out: dict[str, Any] = {
            **speculative_figures(self.drafted, self.accepted, self.steps, self.tokens),
            "drafted_tokens": self.drafted,
            "verified_tokens": self.tried,
            "accepted_tokens": self.accepted,
            "verifications": self.steps,
            "accepted_length_hist": {str(k): self.hist[k] for k in sorted(self.hist)},
            "source_share": {k: round(c / total, 4) for k, c in sorted(self.sources.items())},
        }
        if getattr(dec, "check_lossless", False):
            out["lossless_mismatch"] = self.mismatches
        if dec.rule.lossy:
            out["lossy_tokens"] = self.lossy_tokens
            out["accept_rule"] = dec.rule.name
        return out

