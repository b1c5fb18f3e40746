"""Jacobi fixed-point decoding (``jacobi``) and lookahead decoding (``lookahead``): parallel
decoding without a draft model, exact with respect to greedy."""

from __future__ import annotations

from collections import OrderedDict

import torch

from decoders.base import Choice, Context, Int, register
from decoders.citation import arxiv
from decoders.draft_tree import ROOT, SpecDecoder, SpecParams, Tree, Verified
from decoders.speculative.lookup import lookup_continuations
from playground.core.trace import Step


@register
class Jacobi(SpecDecoder):
    """Jacobi decoding (Santilli et al. 2023, A028): greedy decoding of a window of m tokens
    as the fixed point of y_i = argmax p(. | x, y_<i).

    Implements: each pass feeds the last committed token plus the current guesses of the
    window in one forward (causal mask); every position is re-predicted in parallel; the
    prefix of guesses that equals the new predictions, plus the first new prediction after
    it, is converged and committed (at least one token per pass); the remaining
    predictions become the next guesses (the Jacobi update), padded with ``init`` guesses.
    Exact with respect to greedy.
    Simplifies: committing the converged prefix at every pass (as CLLMs do) instead of
    iterating a fixed block to its full fixed point before moving on (same output).
    """

    name = "jacobi"
    lossless = True
    greedy_only = True
    step_kind = "jacobi"
    reference = ("Santilli et al. 2023, Accelerating Transformer Inference for Translation via Parallel "
                 "Decoding (Jacobi / Gauss-Seidel)")
    papers = (
        arxiv("Santilli et al. 2023, Accelerating Transformer Inference for Translation via "
              "Parallel Decoding (ACL)", "2305.10427"),
    )
    description = "Fixed-point iteration over a window of guesses; commit the converged prefix"
    params = SpecParams(
        window=Int(8, 1, 64, "guessed positions per pass (m)"),
        init=Choice("repeat", ("repeat", "lookup"),
                    "new guesses: copies of the last token, or a prompt-lookup continuation"),
    )

    def setup(self, ctx: Context) -> None:
        self.guess: list[int] = []

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        m = min(int(ctx.params["window"]), max_depth)
        tree = Tree()
        if m <= 0:
            return tree
        g = self.guess[:m]
        if len(g) < m:
            g = g + self._init(ctx, m - len(g), g)
        tree.add_chain(g, ROOT, "jacobi")
        return tree

    def _init(self, ctx: Context, n: int, head: list[int]) -> list[int]:
        seq = self.committed_ids + head
        if ctx.params["init"] == "lookup":
            _lvl, conts = lookup_continuations(seq, 3, 1, n, 1)
            if conts:
                return (conts[0] + [seq[-1]] * n)[:n]
        return [seq[-1]] * n

    def after_verify(self, ctx: Context, v: Verified) -> None:
        tree = v.tree
        a = len(v.path)
        # predictions after the accepted prefix are the next guesses (Jacobi update)
        self.new = [int(torch.argmax(v.row(ROOT)))] + [int(torch.argmax(v.row(i))) for i in range(len(tree))]
        self.guess = self.new[a + 1:]

    def make_step(self, ctx: Context, v: Verified) -> Step:
        return Step("jacobi", v.committed, guess=list(v.tree.tokens), new=list(self.new),
                    converged=len(v.committed), fixed=len(v.path), root=v.root_token)


@register
class Lookahead(SpecDecoder):
    """Lookahead decoding (Fu et al. 2024, A012).

    Implements: one forward pass per step holds (a) the lookahead branch, a 2-D window of
    N-1 Jacobi levels by W columns: token (l, c) sits at position root + 1 + c + l and
    attends to the committed context, level 0 up to column c and levels < l of its own
    column; its prediction is the Jacobi update of (l + 1, c); once N-1 levels are filled,
    every column yields an N-gram (level 0..N-2 tokens plus the new prediction) for the
    pool, keyed by its first token, and the window slides up one level; and (b) the
    verification branch: up to G pool n-grams that start with the last committed token,
    merged into a trie and verified like a draft tree. The longest greedy-consistent
    candidate is accepted. Exact with respect to greedy.
    Simplifies: the window is not re-aligned when several tokens are accepted at once (the
    reference implementation does not either); level 0 starts from prompt tokens.
    """

    name = "lookahead"
    lossless = True
    greedy_only = True
    reference = "Fu et al. 2024, Break the Sequential Dependency of LLM Inference Using Lookahead Decoding"
    papers = (
        arxiv("Fu et al. 2024, Break the Sequential Dependency of LLM Inference Using Lookahead "
              "Decoding (ICML)", "2402.02057"),
    )
    description = "Jacobi lookahead window + n-gram pool + verification branch, one forward per step"
    params = SpecParams(
        W=Int(5, 1, 32, "lookahead window width (columns)"),
        N=Int(4, 2, 8, "n-gram size (the window keeps N-1 levels)"),
        G=Int(5, 1, 64, "most n-grams verified per step"),
    )

    def setup(self, ctx: Context) -> None:
        W = int(ctx.params["W"])
        us = ctx.uniforms(0, W, "lookahead-init")
        p = self.prompt
        self.levels: list[list[int]] = [[p[int(u * len(p))] for u in us]]
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self.pool_total = 0
        self.aux_index: dict[tuple[int, int], int] = {}

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        k = ctx.params
        G, N = int(k["G"]), int(k["N"])
        tree = Tree()
        root_tok = self.committed_ids[-1]
        if max_depth > 0:
            cands = list(self.pool.get(root_tok, {}).keys())[::-1][:G]
            for c in cands:
                tree.add_chain(list(c[: min(N - 1, max_depth)]), ROOT, "ngram-pool")
        self.aux_index = {}
        for l, row in enumerate(self.levels):
            for c, tok in enumerate(row):
                if l == 0:
                    parent = ROOT if c == 0 else self.aux_index[(0, c - 1)]
                else:
                    parent = self.aux_index[(l - 1, c)]
                self.aux_index[(l, c)] = tree.add(tok, parent, None, "jacobi", aux=True)
        self.shown_levels = [list(r) for r in self.levels]
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        N, G = int(ctx.params["N"]), int(ctx.params["G"])
        tree = v.tree
        remap = self._remap(v)
        if not remap:
            return  # the window did not fit in the context this step
        top = len(self.levels) - 1
        W = len(self.levels[0])
        outs = [int(torch.argmax(v.row(remap[(top, c)]))) for c in range(W)]
        if len(self.levels) == N - 1:
            for c in range(W):
                gram = tuple(self.levels[l][c] for l in range(N - 1)) + (outs[c],)
                bucket = self.pool.setdefault(gram[0], OrderedDict())
                if gram[1:] in bucket:
                    bucket.move_to_end(gram[1:])
                else:
                    bucket[gram[1:]] = None
                    self.pool_total += 1
                    while len(bucket) > 4 * G:
                        bucket.popitem(last=False)
                        self.pool_total -= 1
            self.levels = self.levels[1:] + [outs]
        else:
            self.levels.append(outs)

    def _remap(self, v: Verified) -> dict[tuple[int, int], int]:
        """Window cell -> node index in the (possibly pruned) verified tree."""
        tree = v.tree
        aux = [i for i in range(len(tree)) if tree.aux[i]]
        if len(aux) != len(self.aux_index):
            return {}
        return dict(zip(self.aux_index.keys(), aux))

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        step.evidence["lookahead"] = {"levels": self.shown_levels, "pool_size": self.pool_total}
        return step
