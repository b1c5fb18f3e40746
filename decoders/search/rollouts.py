"""``cntp`` and ``adadec``: greedy decoding that, where the model's entropy crosses a threshold,
rolls out several continuations and keeps the best by the paper's score."""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import torch

from decoders.ar import dist_evidence, draw, watch_field
from decoders.base import Context, Decoder, Float, Int, Params, check_stop, register
from decoders.citation import arxiv
from decoders.draft_state import DraftState
from decoders.beam_batch import BatchState, hits_stop
from playground.core.trace import Step

PUNCTUATION = set(".,;:!?\n")


def entropy_nats(logits: torch.Tensor) -> float:
    """Entropy (nats) of softmax(logits), in float64."""
    lp = torch.log_softmax(logits.double(), -1)
    return float(-(lp.exp() * torch.nan_to_num(lp, neginf=0.0)).sum())


def ends_clause(text: str) -> bool:
    """Whether a token's text holds punctuation that ends a CNTP trial."""
    return any(c in PUNCTUATION for c in text)


def rollouts(ctx: Context, context: Sequence[int], first: Sequence[int], horizon: int, pick: Any,
             stop_at_punct: bool) -> tuple[list[list[int]], list[list[float]]]:
    """Continue ``len(first)`` trials from ``context`` in one batch: trial i starts with
    ``first[i]`` and then takes ``pick(i, t, logits)`` for up to ``horizon`` tokens in all,
    ending early at a stop token (and, with ``stop_at_punct``, after punctuation). Returns the
    trials and the model's log-probability of each of their tokens."""
    n = len(first)
    state = BatchState(ctx.target, list(context), n)
    logp0 = torch.log_softmax(state.first.float(), -1)
    seqs = [[int(t)] for t in first]
    lps = [[float(logp0[t])] for t in first]
    decode = ctx.target.decode

    def over(i: int) -> bool:
        s = seqs[i]
        return (len(s) >= horizon or hits_stop(ctx, s)
                or (stop_at_punct and ends_clause(decode([s[-1]]))))

    alive = [i for i in range(n) if not over(i)]
    if len(alive) < n and alive:
        state.select(alive)
    rows = alive
    while rows:
        ctx.check_cancel()
        logits = state.advance([seqs[i][-1] for i in rows])
        logp = torch.log_softmax(logits.float(), -1)
        for r, i in enumerate(rows):
            tok = int(pick(i, len(seqs[i]), logits[r]))
            seqs[i].append(tok)
            lps[i].append(float(logp[r, tok]))
        keep = [r for r, i in enumerate(rows) if not over(i)]
        if len(keep) < len(rows) and keep:
            state.select(keep)
        rows = [rows[r] for r in keep]
    return seqs, lps


class RolloutDecoder(Decoder):
    """Greedy decoding with an entropy trigger; subclasses say what happens when it fires."""

    family = "search"
    kind = "causal"
    step_kind = "token"

    def trigger(self, ctx: Context, committed: list[int], pos: int, logits: torch.Tensor,
                room: int) -> tuple[list[int], dict[str, Any]]:
        """Tokens to commit and the ``trials`` evidence at a triggered step."""
        raise NotImplementedError

    def run(self, ctx: Context) -> Iterator[Step]:
        thr = float(ctx.params["entropy_threshold"])
        main = DraftState(ctx.target, decoder=self.name)
        prompt, out = list(ctx.prompt_ids), []
        triggers = 0
        while len(out) < ctx.max_new_tokens:
            ctx.check_cancel()
            logits = main.catch_up(prompt + out)
            h = entropy_nats(logits)
            pos = len(out)
            room = ctx.max_new_tokens - pos
            if h > thr:
                triggers += 1
                toks, trials = self.trigger(ctx, prompt + out, pos, logits, room)
                extra: dict[str, Any] = {"trials": {**trials, "entropy": round(h, 5), "threshold": thr}, "trigger": True}
            else:
                toks, extra = [int(torch.argmax(logits))], {}
            probs = torch.zeros_like(logits, dtype=torch.float32)
            probs[toks[0]] = 1.0
            committed: list[int] = []
            for t in toks:
                committed.append(t)
                if check_stop(ctx, out + committed, ctx.target.decode):
                    break
            out.extend(committed)
            self.extra_stats.update(triggers=triggers)
            yield Step("token", committed, dist=dist_evidence(ctx.target, logits, probs, toks[0], ctx.top_k_evidence),
                       **extra, **watch_field(ctx, logits, probs))
            reason = check_stop(ctx, out, ctx.target.decode)
            if reason:
                self.finish_reason = reason
                return
        self.finish_reason = "length"


@register
class CNTP(RolloutDecoder):
    """Cautious next token prediction (Wang et al. 2025): sample several trials where unsure.

    Greedy decoding, except at a step whose next-token entropy exceeds ``entropy_threshold``
    (nats): there ``num_trials`` continuations are sampled independently (temperature
    ``temperature``, common random numbers per trial) in one batch, each until it has written
    punctuation or ``max_trial_tokens`` tokens, and the trial with the lowest perplexity
    (``exp`` of its mean surprisal) is committed whole. The step records every trial with
    its tokens and perplexity, the chosen one, the entropy and the threshold. Simplifies:
    a fixed number of trials instead of the paper's entropy-scaled count.
    """

    name = "cntp"
    params = Params(
        entropy_threshold=Float(3.0, 0.0, 100.0, "nats: steps above this entropy sample trials"),
        num_trials=Int(4, 1, 32, "trials sampled at a triggered step"),
        max_trial_tokens=Int(8, 1, 64, "a trial ends at punctuation or after this many tokens"),
        temperature=Float(1.0, 0.01, 10.0, "temperature of the trials"),
    )
    reference = "Wang et al. 2025, Cautious Next Token Prediction (Findings of ACL)"
    papers = (arxiv("Wang et al. 2025, Cautious Next Token Prediction (Findings of ACL)", "2507.03038"),)
    description = "Greedy, but where entropy is high sample trials to punctuation and keep the least perplexing"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def trigger(self, ctx: Context, committed: list[int], pos: int, logits: torch.Tensor,
                room: int) -> tuple[list[int], dict[str, Any]]:
        p = ctx.params
        n, temp = int(p["num_trials"]), float(p["temperature"])

        def pick(i: int, t: int, row: torch.Tensor) -> int:
            scaled = row.float() / temp
            return draw(ctx, pos + t, torch.softmax(scaled, -1), scaled, stream=f"cntp/{i}")

        first = [pick(i, 0, logits) for i in range(n)]
        seqs, lps = rollouts(ctx, committed, first, min(int(p["max_trial_tokens"]), room), pick, True)
        ppl = [math.exp(-sum(lp) / len(lp)) for lp in lps]
        best = min(range(n), key=lambda i: (ppl[i], i))
        return seqs[best], {"kind": "cntp", "chosen": best,
                            "items": [{"ids": s, "score": round(x, 5), "logprob": round(sum(lp), 5)}
                                      for s, x, lp in zip(seqs, ppl, lps)],
                            "score": "perplexity (lower is better)"}


@register
class AdaDec(RolloutDecoder):
    """AdaDec (He et al. 2025): pause where unsure, rerank the top candidates by a lookahead.

    Greedy decoding, except at a step whose next-token entropy exceeds ``entropy_threshold``
    (nats): there each of the ``top_k`` most probable tokens is extended greedily for
    ``lookahead`` more tokens (one batch), and the candidate whose rollout has the highest
    mean log-probability wins; only that one token is committed and decoding goes on. The
    step records every candidate with its rollout and score, the chosen one, the entropy
    and the threshold. Simplifies: the paper learns the entropy threshold per model by
    logistic regression; here it is a knob.
    """

    name = "adadec"
    params = Params(
        entropy_threshold=Float(3.0, 0.0, 100.0, "nats: steps above this entropy rerank by lookahead"),
        top_k=Int(3, 1, 32, "candidate tokens reranked at a triggered step"),
        lookahead=Int(4, 0, 64, "greedy tokens rolled out after each candidate"),
    )
    reference = ("He et al. 2025, Towards Better Code Generation: Adaptive Decoding with Uncertainty Guidance "
                 "(AdaDec, arXiv:2506.08980)")
    papers = (
        arxiv("He et al. 2025, Towards Better Code Generation: Adaptive Decoding with "
              "Uncertainty Guidance (AdaDec)", "2506.08980"),
    )
    description = "Greedy, but where entropy is high rerank the top-k tokens by a greedy lookahead's likelihood"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def trigger(self, ctx: Context, committed: list[int], pos: int, logits: torch.Tensor,
                room: int) -> tuple[list[int], dict[str, Any]]:
        p = ctx.params
        k = min(int(p["top_k"]), logits.numel())
        first = torch.topk(logits.float(), k).indices.tolist()
        horizon = 1 + min(int(p["lookahead"]), max(0, room - 1))
        seqs, lps = rollouts(ctx, committed, first, horizon, lambda i, t, row: int(torch.argmax(row)), False)
        score = [sum(lp) / len(lp) for lp in lps]
        best = max(range(k), key=lambda i: (score[i], -i))
        return [seqs[best][0]], {"kind": "adadec", "chosen": best,
                                 "items": [{"ids": s, "score": round(x, 5), "logprob": round(sum(lp), 5)}
                                           for s, x, lp in zip(seqs, score, lps)],
                                 "score": "mean log-probability of candidate + lookahead (higher is better)"}
