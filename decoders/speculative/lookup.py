"""Drafts from the text itself: prompt lookup with adaptive n-gram levels (``prompt_lookup``)
and ADED's online tri-gram table with exploration/exploitation (``ngram_adaptive``)."""

from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict
from typing import Sequence

import torch

from decoders.base import Context, Float, Int, register
from decoders.citation import Paper, arxiv
from decoders.draft_tree import ROOT, SpecDecoder, SpecParams, Tree, Verified, rule_params, sampling_params
from playground.core.trace import Step


def lookup_continuations(seq: Sequence[int], max_n: int, min_n: int, length: int,
                         branches: int) -> tuple[int | None, list[list[int]]]:
    """Continuations of the latest occurrences of the longest matching suffix n-gram.

    Tries n = max_n down to min_n (the highest level that matches wins, as in ANPD) and
    returns (n, up to ``branches`` distinct continuations of ``length`` tokens, most recent
    occurrence first). A continuation that reaches the end of ``seq`` goes on by copying
    itself, so a period-p repetition drafts a full ``length`` tokens.
    """
    L = len(seq)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        key = list(seq[L - n:])
        conts: list[list[int]] = []
        for i in range(L - n - 1, -1, -1):
            if seq[i] == key[0] and list(seq[i:i + n]) == key:
                # a match that runs into the end continues with its own draft (periodic text)
                cont: list[int] = []
                for j in range(length):
                    at = i + n + j
                    cont.append(int(seq[at]) if at < L else cont[at - L])
                if cont not in conts:
                    conts.append(cont)
                    if len(conts) >= branches:
                        break
        if conts:
            return n, conts
    return None, []


@register
class PromptLookup(SpecDecoder):
    """Prompt lookup decoding with adaptive n (Saxena 2023; ANPD, Ou et al. 2024, A293).

    Implements: find the latest occurrences, in prompt + output, of the longest suffix
    n-gram (n from ``max_ngram`` down to ``min_ngram``: the highest level that matches, as
    ANPD's multi-level module does), draft the ``num_draft`` tokens that followed them, and
    verify them in one target pass. With ``branches`` > 1 several distinct continuations
    are verified together as a token tree. Lossless: at temperature 0 it returns greedy's
    output; above, deterministic candidates are verified by rejection sampling.
    Simplifies: the n-gram table is rebuilt by a scan of the context each step.
    """

    name = "prompt_lookup"
    lossless = True
    reference = ("Saxena 2023, Prompt Lookup Decoding; Ou et al. 2024, Lossless Acceleration of LLMs "
                 "with Hierarchical Drafting / ANPD: Adaptive N-gram Parallel Decoding")
    papers = (
        Paper("Saxena 2023, Prompt Lookup Decoding", "https://github.com/apoorvumang/prompt-lookup-decoding"),
        arxiv("Ou et al. 2024, Lossless Acceleration of Large Language Model via Adaptive "
              "N-gram Parallel Decoding (ANPD; NAACL industry track)", "2404.08698"),
    )
    description = "Draft the continuation of the latest matching n-gram of prompt + output (adaptive n)"
    params = SpecParams(
        max_ngram=Int(3, 1, 10, "longest suffix n-gram tried first"),
        min_ngram=Int(1, 1, 10, "shortest suffix n-gram tried"),
        num_draft=Int(10, 1, 64, "tokens drafted after a match"),
        branches=Int(2, 1, 8, "distinct continuations verified together as a tree"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        self.level: int | None = None
        self.n_matches = 0

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        k = ctx.params
        tree = Tree()
        length = min(int(k["num_draft"]), max_depth)
        self.level, self.n_matches = None, 0
        if length <= 0:
            return tree
        lo = min(int(k["min_ngram"]), int(k["max_ngram"]))
        self.level, conts = lookup_continuations(self.committed_ids, int(k["max_ngram"]), lo, length,
                                                 int(k["branches"]))
        self.n_matches = len(conts)
        for cont in conts:
            tree.add_chain(cont, ROOT, "lookup")
        return tree

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        step.evidence["lookup"] = {"n": self.level, "matches": self.n_matches}
        return step


@register
class NgramAdaptive(SpecDecoder):
    """ADED: adaptive tri-gram drafting (Liu et al. 2024, A002).

    Implements: a tri-gram table T[(a, b)] -> counts of the next token, built from the
    prompt and updated online from the target's own verified predictions (every row of
    every verification pass adds the target's top-1 token for its context), so the table
    tracks the model's output distribution. Drafts are a token tree built best-first: a
    candidate's value is its empirical acceptance rate (prior: its share in the table)
    plus a UCB exploration bonus sqrt(ln N / (1 + n)) weighted by ``explore``, where n
    counts how often that tri-gram was tried by the target; the acceptance statistics are
    updated after each verification. Lossless (verified by the target).
    Simplifies: ADED's MCTS draft search is approximated by this UCB best-first expansion.
    """

    name = "ngram_adaptive"
    lossless = True
    reference = "Liu et al. 2024, Adaptive Draft-Verification for Efficient Large Language Model Decoding (ADED)"
    papers = (
        arxiv("Liu et al. 2024, Adaptive Draft-Verification for Efficient Large Language Model "
              "Decoding (ADED; AAAI 2025)", "2407.12021"),
    )
    description = "Drafts from an online tri-gram table of the model's own outputs, UCB exploration"
    params = SpecParams(
        depth=Int(6, 1, 16, "maximum draft length (tree depth)"),
        branch=Int(3, 1, 8, "children per node at most"),
        budget=Int(16, 1, 128, "maximum draft nodes"),
        explore=Float(0.3, 0.0, 5.0, "weight of the UCB exploration bonus"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        self.tri: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
        self.bi: dict[int, Counter[int]] = defaultdict(Counter)
        self.tries: Counter[tuple[int, int, int]] = Counter()
        self.hits: Counter[tuple[int, int, int]] = Counter()
        self.node_ctx: dict[int, tuple[int, int]] = {}
        p = self.prompt
        for i in range(2, len(p)):
            self._observe(p[i - 2], p[i - 1], p[i])

    def _observe(self, a: int, b: int, c: int) -> None:
        self.tri[(a, b)][c] += 1
        self.bi[b][c] += 1

    def _ranked(self, a: int | None, b: int, explore: float) -> list[tuple[float, int]]:
        table = self.tri.get((a, b)) if a is not None else None
        if not table:
            table = self.bi.get(b)
        if not table:
            return []
        total = sum(table.values())
        n_ctx = sum(self.tries[(a if a is not None else -1, b, c)] for c in table)
        out = []
        for c, cnt in table.items():
            key = (a if a is not None else -1, b, c)
            prior = cnt / total
            acc = (self.hits[key] + prior) / (self.tries[key] + 1)
            bonus = explore * math.sqrt(math.log(1 + n_ctx) / (1 + self.tries[key]))
            out.append((min(1.0, acc + bonus), c))
        out.sort(key=lambda t: (-t[0], t[1]))
        return out

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        k = ctx.params
        tree = Tree()
        self.node_ctx = {}
        depth_max = min(int(k["depth"]), max_depth)
        if depth_max <= 0:
            return tree
        seq = self.committed_ids
        a0 = seq[-2] if len(seq) >= 2 else None
        b0 = seq[-1]
        explore, branch, budget = float(k["explore"]), int(k["branch"]), int(k["budget"])
        # heap of candidate edges: (-path score, tiebreak, parent, a, b, token, edge score)
        heap: list[tuple[float, int, int, int | None, int, int, float]] = []
        tick = 0
        for s, c in self._ranked(a0, b0, explore)[:branch]:
            heapq.heappush(heap, (-s, tick, ROOT, a0, b0, c, s))
            tick += 1
        depth_of = {ROOT: 0}
        while heap and len(tree) < budget:
            neg, _t, parent, a, b, c, s = heapq.heappop(heap)
            node = tree.add(c, parent, round(s, 6), "ngram")
            self.node_ctx[node] = (a if a is not None else -1, b)
            depth_of[node] = depth_of[parent] + 1
            if depth_of[node] < depth_max:
                for s2, c2 in self._ranked(b, c, explore)[:branch]:
                    heapq.heappush(heap, (neg * s2, tick, node, b, c, c2, s2))
                    tick += 1
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        tree = v.tree
        for i, info in v.node_info.items():
            if info.get("accept_prob") is not None and i in self.node_ctx:
                key = (*self.node_ctx[i], tree.tokens[i])
                self.tries[key] += 1
                self.hits[key] += int(bool(info.get("accepted")))
        # the target's top-1 at every fed position is an observation of its distribution
        tops = torch.argmax(v.rows, -1).tolist()
        # pending rows: context = the two tokens ending at each pending token
        seq_before = self.prompt + self.out[: len(self.out) - len(v.committed)]
        base = len(seq_before) - v.n_pending
        for j in range(v.n_pending):
            pos = base + j
            if pos >= 1:
                self._observe(seq_before[pos - 1], seq_before[pos], tops[j])
        for i in range(len(tree)):
            if tree.aux[i]:
                continue
            par = tree.parents[i]
            prev = tree.tokens[par] if par != ROOT else v.root_token
            self._observe(prev, tree.tokens[i], tops[v.n_pending + i])
