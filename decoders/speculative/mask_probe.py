"""Training-free multi-token prediction by probing with mask-like tokens (``mask_probe``)."""

from __future__ import annotations

import heapq

import torch

from decoders.base import Choice, Context, Int, register
from decoders.citation import arxiv
from decoders.draft_tree import ROOT, SpecDecoder, SpecParams, Tree, Verified, rule_params, sampling_params
from playground.core.trace import Step


def probe_token(ctx: Context, kind: str) -> int | None:
    """The id used as a probe: the tokenizer's mask (else pad, unk, eos) token, or its pad
    (else eos) token, or the eos token; None for ``repeat`` (each probe copies the token it
    follows). Ids outside the model's embedding table are skipped."""
    tok = ctx.target.tokenizer
    order = {"mask": ("mask_token_id", "pad_token_id", "unk_token_id", "eos_token_id"),
             "pad": ("pad_token_id", "eos_token_id"),
             "eos": ("eos_token_id",)}.get(kind, ())
    for attr in order:
        t = getattr(tok, attr, None)
        if isinstance(t, int) and 0 <= t < ctx.target.vocab_size:
            return t
    return None


@register
class MaskProbe(SpecDecoder):
    """Probing-based multi-token prediction (A311): mask-like probe tokens taken from the
    model's own embedding table predict several future tokens at once, without training.

    Implements: every verification pass also feeds ``probes`` probe tokens after the root
    and after every draft node (positions +1..+m, each probe attending to its node's
    ancestors and the probes before it). After verification, the probes that followed the
    last accepted node are read: probe i's logits guess the token i places after the
    correction token. The top-``topk`` guesses per depth form a product tree, pruned
    best-first by the product of the probes' probabilities to ``budget`` nodes; the next
    pass verifies it (lossless).
    Simplifies: the probe is an existing special token's embedding (mask, pad or eos) or a
    copy of the previous token, not a freshly sampled embedding vector.
    """

    name = "mask_probe"
    lossless = True
    reference = "Probing-based multi-token prediction with on-the-fly mask tokens (seed paper A311)"
    papers = (
        arxiv("Goel et al. 2026, Efficient Training-Free Multi-Token Prediction via "
              "Embedding-Space Probing", "2603.17942"),
    )
    description = "Mask-like probe tokens predict future tokens; a pruned tree of their top-K is verified"
    params = SpecParams(
        probes=Int(3, 1, 8, "probe tokens after each node (look-ahead depth)"),
        topk=Int(4, 1, 16, "candidates taken from each probe position"),
        budget=Int(12, 1, 64, "draft nodes kept after pruning"),
        probe=Choice("mask", ("mask", "pad", "eos", "repeat"), "which embedding the probes use"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        self.probe_id = probe_token(ctx, str(ctx.params["probe"]))
        self.guesses: list[list[tuple[int, float]]] = []

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        k = ctx.params
        tree = Tree()
        budget = int(k["budget"])
        depth_max = min(len(self.guesses), max_depth)
        # best-first product tree over the per-depth guesses
        heap: list[tuple[float, int, int, int, int, float]] = []
        tick = 0
        if depth_max > 0:
            for t, pr in self.guesses[0]:
                heapq.heappush(heap, (-pr, tick, ROOT, 1, t, pr))
                tick += 1
        while heap and len(tree) < budget:
            neg, _t, parent, d, t, pr = heapq.heappop(heap)
            node = tree.add(t, parent, round(pr, 6), "mask-probe")
            if d < depth_max:
                for t2, pr2 in self.guesses[d]:
                    heapq.heappush(heap, (neg * pr2, tick, node, d + 1, t2, pr2))
                    tick += 1
        m = int(k["probes"])
        for node in [ROOT] + list(range(len(tree))):
            prev = node
            base_tok = self.committed_ids[-1] if node == ROOT else tree.tokens[node]
            for i in range(m):
                tok = self.probe_id if self.probe_id is not None else base_tok
                prev = tree.add(tok, prev, None, "probe", aux=True)
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        tree = v.tree
        last = v.path[-1] if v.path else ROOT
        kk = int(ctx.params["topk"])
        first = self._first_probe(tree, last)
        self.guesses = []
        node = first
        while node is not None:
            probs = self.rule_probs(ctx, v.row(node))
            top = torch.topk(probs, min(kk, probs.numel()))
            self.guesses.append([(int(t), float(p)) for t, p in zip(top.indices, top.values)])
            kids = [c for c in tree.children(node, include_aux=True) if tree.aux[c]]
            node = kids[0] if kids else None

    @staticmethod
    def _first_probe(tree: Tree, node: int) -> int | None:
        kids = [c for c in tree.children(node, include_aux=True) if tree.aux[c]]
        return kids[0] if kids else None

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        step.evidence["probe_guesses"] = [[t for t, _p in g] for g in self.guesses]
        return step
