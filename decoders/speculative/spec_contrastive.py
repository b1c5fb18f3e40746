"""Speculative contrastive decoding: the amateur drafts, the expert verifies against the
contrastive distribution (Yuan et al. 2023)."""

from __future__ import annotations

from typing import Any

import torch

from decoders.base import Context, Float, Int, PlaygroundError, register
from decoders.citation import arxiv
from decoders.contrastive.expert_amateur import CD_PAPER, cd_scores
from decoders.draft_state import DraftState
from decoders.speculative._chain import draft_chain
from decoders.draft_tree import SpecDecoder, SpecParams, Tree, Verified, tree_evidence
from decoders.speculative.draft_model import check_draft, check_draft_context
from playground.core.trace import Step


def contrast_probs(expert_logits: torch.Tensor, amateur_logits: torch.Tensor, vocab: int, alpha: float,
                   beta: float, temperature: float,
                   amateur_temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The contrastive distribution over the expert's vocabulary, its scores and the size of
    the plausible set.

    Scores are ``contrastive``'s (:func:`decoders.contrastive.expert_amateur.cd_scores`) on the
    ids both models have; ids only the expert has are excluded. Temperature 0 gives a point
    mass on the best score (contrastive's greedy pick); otherwise softmax(score / T).
    """
    size = expert_logits.shape[-1]
    score = torch.full((size,), float("-inf"))
    s, plausible = cd_scores(expert_logits[:vocab].float().cpu(), amateur_logits[:vocab].float().cpu(), alpha, beta,
                            amateur_temperature)
    score[:vocab] = s
    if temperature == 0.0:
        probs = torch.zeros(size)
        probs[int(torch.argmax(score))] = 1.0
    else:
        probs = torch.softmax(score / temperature, -1)
    return probs, score, int(plausible.sum())


@register
class SpecContrastive(SpecDecoder):
    """Speculative contrastive decoding (SCD, Yuan et al. 2023).

    Implements: the amateur (draft slot) drafts γ tokens from its own distribution q
    (softmax of its logits at ``temperature``; its argmax at 0); one expert forward scores
    them; each drafted token is verified against the *contrastive* distribution
    p_cd = softmax(score / T), score = log p_e - ``beta`` · log p_a on the expert's plausible
    set {v : p_e(v) >= ``alpha`` · max p_e} (``contrastive``'s score, with the amateur's
    distribution at the same position): accept with min(1, p_cd(x)/q(x)), resample the first
    rejection from norm(max(0, p_cd - q)), and add a bonus token from p_cd when every draft is
    accepted. Verification is exact with respect to p_cd, so at temperature 0 the output is
    ``contrastive``'s token for token (a draft is accepted iff it is the best contrast score),
    and at temperature T > 0 its law is ``contrastive``'s at T, in fewer expert forwards.
    The amateur also reads its last drafted token, so its distribution at the bonus
    position is known: γ + 1 amateur forwards per step.
    Simplifies: the same amateur drafts and contrasts (as in the paper); no sampling chain
    beyond the temperature, so the law is comparable with ``contrastive``'s.
    """

    name = "spec_contrastive"
    needs_draft = True
    lossless = False  # exact for the contrastive distribution, not for the expert's own
    shows = "; plus `scd` per verified position: the expert, amateur and contrastive probabilities of the drafted token and the contrast's pick (plot *Contrastive verification*)"
    reference = ("Yuan et al. 2023, Speculative Contrastive Decoding (arXiv:2311.08981); "
                 "Li et al. 2023, Contrastive Decoding: Open-ended Text Generation as Optimization")
    papers = (
        arxiv("Yuan et al. 2023, Speculative Contrastive Decoding (ACL 2024)", "2311.08981"),
        CD_PAPER,
    )
    description = "The amateur drafts, the expert verifies against the contrastive distribution: contrastive's text in fewer expert passes"
    params = SpecParams(
        gamma=Int(4, 1, 32, "tokens the amateur drafts per step (γ)"),
        alpha=Float(0.1, 0.0, 1.0, "plausibility: keep tokens with p_expert >= alpha · max p_expert"),
        beta=Float(1.0, 0.0, 10.0, "amateur weight: score = log p_expert - beta · log p_amateur"),
        temperature=Float(0.0, 0.0, 10.0, "0 = greedy over the contrast (contrastive's output); else verify against "
                                          "softmax(score / T) with the amateur drafting from softmax(logits / T)"),
        amateur_temperature=Float(1.0, 0.05, 10.0, "τ: the amateur's softmax temperature in the contrast score "
                                                    "(as contrastive's; drafting keeps T)"),
    )

    def setup(self, ctx: Context) -> None:
        check_draft_context(ctx)
        vocab = min(ctx.target.vocab_size, ctx.draft.vocab_size)
        if len(ctx.target.tokenizer) > vocab:
            raise PlaygroundError(f"amateur {ctx.draft.name!r} scores {ctx.draft.vocab_size} tokens and the expert "
                                  f"{ctx.target.vocab_size}; contrastive decoding needs one vocabulary")
        self.vocab = vocab
        self.alpha, self.beta, self.temp = (float(ctx.params[k]) for k in ("alpha", "beta", "temperature"))
        self.tau = float(ctx.params["amateur_temperature"])
        self.d = DraftState(ctx.draft, check_draft(self.name, ctx))
        self.amateur: list[torch.Tensor] = []
        self.seen: dict[int, dict[str, Any]] = {}

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        gamma = min(int(ctx.params["gamma"]), max_depth)
        chain = draft_chain(self, ctx, self.d, gamma, source="amateur", feed_last=True)
        self.amateur = chain.logits
        self.seen = {}
        return chain.tree

    def target_probs(self, ctx: Context, logits: torch.Tensor, extra: Any = ()) -> torch.Tensor:
        depth = len(extra)
        probs, score, plausible = contrast_probs(logits, self.amateur[depth], self.vocab, self.alpha,
                                                 self.beta, self.temp, self.tau)
        if depth not in self.seen:
            # what the evidence shows: the contrast as a distribution even at temperature 0
            self.seen[depth] = {"contrast": torch.softmax(score / (self.temp or 1.0), -1),
                                "expert": torch.softmax(logits.float().cpu(), -1),
                                "amateur": torch.softmax(self.amateur[depth].float().cpu() / self.tau, -1),
                                "pick": int(torch.argmax(score)), "plausible": plausible}
        return probs.to(logits.device)

    def make_step(self, ctx: Context, v: Verified) -> Step:
        tree = tree_evidence(v)
        positions = []
        nodes = tree["nodes"]
        for depth in sorted(d for d in self.seen if d <= len(v.path)):  # the positions the walk verified
            s = self.seen[depth]
            node = nodes[depth] if depth < len(nodes) else None
            row: dict[str, Any] = {"depth": depth, "pick": s["pick"], "plausible": s["plausible"],
                                   "expert_pick": int(torch.argmax(s["expert"]))}
            if node is not None:
                x = int(node["token"])
                row.update(drafted=x, expert=round(float(s["expert"][x]), 6), amateur=round(float(s["amateur"][x]), 6),
                           contrast=round(float(s["contrast"][x]), 6), accepted=bool(node["accepted"]))
            positions.append(row)
        return Step("draft", v.committed, tree=tree, root=v.root_token, correction_dist=v.correction_dist,
                    scd={"alpha": self.alpha, "beta": self.beta, "positions": positions})

    def is_lossy(self, params: dict[str, Any]) -> bool:
        # as contrastive: only beta = 0 (and no plausibility cut when sampling) leaves the expert alone
        t = params["temperature"]
        return params["beta"] != 0 or t not in (0.0, 1.0) or (t == 1.0 and params["alpha"] > 0)
