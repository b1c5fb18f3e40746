"""Token Recycling: drafts from an adjacency table of the target's past top-k candidates."""

from __future__ import annotations

import torch

from decoders.base import Context, Int, register
from decoders.citation import arxiv
from decoders.draft_tree import ROOT, SpecDecoder, SpecParams, Tree, Verified, rule_params, sampling_params


@register
class TokenRecycling(SpecDecoder):
    """Token Recycling (Luo et al. 2024, A315).

    Implements: an adjacency table maps each token to the top-``row_k`` next-token
    candidates the target produced the last time it processed that token; every row of
    every verification pass (prompt, correction, all tree nodes, accepted or not) rewrites
    the row of its token. Each step a breadth-first walk from the last committed token
    builds a draft tree (``branch`` children at depth 1, then branch // depth, up to
    ``depth`` and ``budget`` nodes), verified in one pass with tree attention. Lossless.
    Simplifies: the paper's hand-tuned static tree template is replaced by that
    width-per-depth rule.
    """

    name = "token_recycling"
    lossless = True
    reference = "Luo et al. 2024, Turning Trash into Treasure: Accelerating Inference of LLMs with Token Recycling"
    papers = (
        arxiv("Luo et al. 2024, Turning Trash into Treasure: Accelerating Inference of Large "
              "Language Models with Token Recycling (ACL 2025)", "2408.08696"),
    )
    description = "Recycle the target's past top-k candidates into a draft tree (adjacency table + BFS)"
    params = SpecParams(
        row_k=Int(8, 1, 64, "candidates stored per token in the adjacency table"),
        branch=Int(4, 1, 32, "children of the root; depth d gets branch // d"),
        depth=Int(6, 1, 16, "maximum tree depth"),
        budget=Int(32, 1, 256, "maximum draft nodes"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        self.adj: dict[int, list[int]] = {}

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        k = ctx.params
        tree = Tree()
        depth_max = min(int(k["depth"]), max_depth)
        branch, budget = int(k["branch"]), int(k["budget"])
        level = [(ROOT, self.committed_ids[-1])]
        for d in range(1, depth_max + 1):
            width = max(1, branch // d)
            nxt = []
            for node, tok in level:
                for c in self.adj.get(tok, [])[:width]:
                    if len(tree) >= budget:
                        return tree
                    nxt.append((tree.add(c, node, None, "recycle"), c))
            if not nxt:
                break
            level = nxt
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        rk = int(ctx.params["row_k"])
        fed = (self.prompt + self.out)[: len(self.prompt) + len(self.out) - len(v.committed)][-v.n_pending:]
        fed = fed + v.tree.tokens
        top = torch.topk(v.rows, min(rk, v.rows.shape[-1]), dim=-1).indices.tolist()
        for tok, row in zip(fed, top):
            self.adj[int(tok)] = row
