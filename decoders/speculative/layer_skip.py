"""Self-speculation: the target's own first k layers (plus its final norm and LM head) draft,
the full model verifies (LayerSkip / DEL)."""

from __future__ import annotations

from typing import Any

import torch

from decoders.ar import sample_index
from decoders.base import Bool, Context, Float, Int, PlaygroundError, register
from decoders.citation import arxiv
from decoders.processors import History
from decoders.kv_cache import cache_len, crop_layers
from decoders.draft_tree import ROOT, SpecDecoder, SpecParams, Tree, Verified, rule_params, sampling_params
from playground.core.trace import Step


def final_norm(model: Any) -> Any:
    """The final normalisation module of a causal LM (None when it has none we know)."""
    for path in (("model", "norm"), ("transformer", "ln_f"), ("gpt_neox", "final_layer_norm"),
                 ("model", "decoder", "final_layer_norm")):
        mod = model
        for attr in path:
            mod = getattr(mod, attr, None)
            if mod is None:
                break
        if mod is not None:
            return mod
    return None


@register
class LayerSkip(SpecDecoder):
    """Self-speculative decoding with an early exit (LayerSkip, Elhoushi et al. 2024; DEL,
    A180).

    Implements: the draft is the target itself cut after its first ``exit_layer`` layers,
    followed by its own final norm and LM head; it drafts up to γ tokens (counted as draft
    forwards) and the full model verifies them in one pass, with the same acceptance
    rules and sampling chain as ``speculative``. The draft shares the target's KV cache
    (its k layers are the target's first k), and its extra entries are cut before
    verification. With ``dynamic`` (DEL), every verification also reads all layers' hidden
    states, keeps a running acceptance rate per exit layer (1 - TV between each layer's
    distribution and the target's, at the verified positions) and picks the exit layer and
    γ that maximise expected tokens per unit of compute (1 - a^(γ+1))/(1 - a) / (1 + γ k/L).
    Training-free: a model not trained for early exit drafts poorly from shallow layers.
    Simplifies: no reuse of the draft's KV entries in the verification pass.
    """

    name = "layer_skip"
    lossless = True
    reference = ("Elhoushi et al. 2024, LayerSkip: Enabling Early Exit Inference and Self-Speculative Decoding; "
                 "Zarch et al. 2025, DEL: Context-Aware Dynamic Exit Layer for Efficient Self-Speculative Decoding")
    papers = (
        arxiv("Elhoushi et al. 2024, LayerSkip: Enabling Early Exit Inference and "
              "Self-Speculative Decoding (ACL)", "2404.16710"),
        arxiv("Zarch et al. 2025, DEL: Context-Aware Dynamic Exit Layer for Efficient "
              "Self-Speculative Decoding", "2504.05598"),
    )
    description = "Draft with the target's own first k layers + LM head, verify with the full model"
    params = SpecParams(
        exit_layer=Int(0, 0, 256, "layers the draft runs, below the model's depth; 0 = half of them"),
        gamma=Int(4, 1, 32, "tokens drafted per step (the maximum when dynamic)"),
        dynamic=Bool(False, "DEL: choose exit layer and γ each step from running per-layer acceptance"),
        adaptive_h=Float(1.0, 0.0, 1.0, "stop drafting once 1 - prod q(x_i) exceeds this; 1 = always γ"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        L = ctx.target.num_layers
        k = int(ctx.params["exit_layer"]) or max(1, L // 2)
        if L < 2:
            raise PlaygroundError(f"layer_skip needs a model with at least 2 layers; {ctx.target.name!r} has {L}")
        if k >= L:
            raise PlaygroundError(f"knob 'exit_layer'={k} must be below the model's {L} layers")
        self.k, self.gamma = k, int(ctx.params["gamma"])
        self.alpha = {layer: 0.5 for layer in range(1, L)}  # running acceptance per exit layer
        self.seen = {layer: 0 for layer in range(1, L)}
        self.norm = final_norm(ctx.target.model)

    def forward_kwargs(self, ctx: Context) -> dict[str, Any]:
        return {"hidden_states": True} if ctx.params["dynamic"] else {}

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        tree = Tree()
        gamma = min(self.gamma, max_depth)
        if gamma <= 0:
            return tree
        h = float(ctx.params["adaptive_h"])
        past = cache_len(self.cache, ctx.target.num_layers - 1)
        out = ctx.target.forward(list(self.pending), cache=self.cache, num_layers=self.k)
        self.cache = out.cache
        logits = out.logits[0, -1]
        parent, drafted, conf = ROOT, [], 1.0
        for i in range(gamma):
            q = self.chain.probs(logits.float(), self.history(ctx, drafted))
            qr = torch.softmax(logits.float(), -1) if self.greedy else q
            x = sample_index(q, self.next_uniform(ctx, "draft"))
            tree.dists[parent], tree.rule_q[parent] = q, qr
            parent = tree.add(x, parent, float(qr[x]), f"layer-{self.k}")
            drafted.append(x)
            conf *= float(qr[x])
            if 1.0 - conf > h or i + 1 == gamma:
                break
            out = ctx.target.forward([x], cache=self.cache, num_layers=self.k)
            logits = out.logits[0, -1]
        crop_layers(self.cache, past, self.k)  # the verification pass rewrites these positions
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        if not ctx.params["dynamic"]:
            return
        hs = self.last_forward.hidden_states
        if not hs:
            return
        L = ctx.target.num_layers
        # verified positions: the root and the accepted nodes, whose contexts are all correct
        rows = ([v.n_pending - 1] + [v.n_pending + i for i in v.path])[: len(v.committed)]
        before = self.prompt + self.out[: len(self.out) - len(v.committed)]

        def probs(logits: torch.Tensor, j: int) -> torch.Tensor:
            ids = before + v.committed[:j]
            hist = History(ids=ids, prompt_len=len(self.prompt), pos=len(ids) - len(self.prompt),
                           uniform=ctx.uniform)
            return self.chain.probs(logits.float(), hist)

        head = ctx.target.model.get_output_embeddings()
        with torch.inference_mode():
            target = [probs(v.rows[r], j) for j, r in enumerate(rows)]
            for layer in range(1, L):
                h = hs[layer][0, rows]
                logits = head(self.norm(h) if self.norm is not None else h).float()
                for j, p in enumerate(target):
                    a = 1.0 - 0.5 * float((p - probs(logits[j], j)).abs().sum())
                    self.seen[layer] += 1
                    self.alpha[layer] += (a - self.alpha[layer]) / min(self.seen[layer], 20)
        gmax = int(ctx.params["gamma"])
        best = (0.0, self.k, self.gamma)
        for layer in range(1, L):
            a = min(self.alpha[layer], 0.999)
            for g in range(1, gmax + 1):
                value = (1 - a ** (g + 1)) / (1 - a) / (1 + g * layer / L)
                if value > best[0]:
                    best = (value, layer, g)
        _v, self.k, self.gamma = best

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        step.evidence["exit_layer"] = self.k
        if ctx.params["dynamic"]:
            step.evidence["layer_acceptance"] = {str(k): round(a, 4) for k, a in self.alpha.items()}
            step.evidence["next_gamma"] = self.gamma
        return step
