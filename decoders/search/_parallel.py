"""N continuations grown in parallel in one batched cache (arithmetic sampling, best-of-N, MBR)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch

from decoders.ar import draw
from decoders.base import Context, Float, Int
from decoders.processors import History, build_chain, chain_defaults
from decoders.beam_batch import BatchState, hits_stop
from playground.core.trace import Step


def _filter_knobs() -> dict[str, Any]:
    return dict(
        temperature=Float(1.0, 0.0, 10.0, "divide logits by this before drawing; 0 = greedy"),
        top_k=Int(0, 0, 1_000_000, "keep the k most probable tokens first; 0 = off"),
        top_p=Float(1.0, 0.0, 1.0, "nucleus filter first; 1 = off"),
        min_p=Float(0.0, 0.0, 1.0, "min-p filter first; 0 = off"),
    )


def _filter_chain(p: dict[str, Any], epsilon: float = 0.0):
    """The samplers' chain: top-k, top-p, min-p, then epsilon (MBR's epsilon sampler), then temperature."""
    return build_chain({**chain_defaults(), **{k: p[k] for k in ("temperature", "top_k", "top_p", "min_p")},
                        "epsilon": epsilon, "order": "top_k,top_p,min_p,epsilon,temperature"})


def _filters_lossy(p: dict[str, Any]) -> bool:
    return p["temperature"] != 1.0 or p["top_k"] > 0 or p["top_p"] < 1.0 or p["min_p"] > 0


@dataclass
class Samples:
    """N sequences grown in parallel, with their raw-model log-probabilities."""

    seqs: list[list[int]]
    logp: list[float]


Chooser = Any  # (sample index, position, final probs) -> (token, extra beam evidence)


def parallel_samples(ctx: Context, n: int, choose: Chooser, commit_first: bool, chain: Any = None,
                     label: str | None = None) -> Iterator[Step]:
    """Grow ``n`` continuations in one batched cache, one ``beam`` step per position.

    ``choose(i, t, probs)`` picks sample ``i``'s token at position ``t`` from its processed
    distribution (``chain``, by default the decoder's temperature/top-k/top-p/min-p). A
    finished sample leaves the batch. With ``commit_first`` the steps commit sample 0's
    tokens (it is the output); otherwise they commit nothing. ``label`` names the set in
    each step's ``set`` field (MBR's hypotheses and references). Returns :class:`Samples`
    (``result = yield from parallel_samples(...)``).
    """
    chain = chain or _filter_chain(ctx.params)
    tag = {"set": label} if label else {}
    seqs: list[list[int]] = [[] for _ in range(n)]
    logp = [0.0] * n
    done = [False] * n
    alive = list(range(n))  # sample index of each cache row
    state = BatchState(ctx.target, ctx.prompt_ids, n)
    logits = state.first[None].expand(n, -1)
    prompt = list(ctx.prompt_ids)
    for t in range(ctx.max_new_tokens):
        ctx.check_cancel()
        raw_logp = torch.log_softmax(logits.float(), -1)
        info: dict[int, dict[str, Any]] = {}
        feed: list[int] = []
        for row, i in enumerate(alive):
            h = History(ids=prompt + seqs[i], prompt_len=len(prompt), pos=t, uniform=ctx.uniform)
            tok, info[i] = choose(i, t, chain.probs(logits[row], h))
            seqs[i].append(tok)
            logp[i] += float(raw_logp[row, tok])
            feed.append(tok)
            if t + 1 >= ctx.max_new_tokens or hits_stop(ctx, seqs[i]):
                done[i] = True
        beams = [{"ids": list(seqs[i]), "score": round(logp[i], 5), "parent": i, "finished": done[i],
                  **info.get(i, {})} for i in range(n)]
        yield Step("beam", [seqs[0][-1]] if commit_first and 0 in info else [], beams=beams, **tag)
        keep = [row for row, i in enumerate(alive) if not done[i]]
        if not keep:
            break
        if len(keep) < len(alive):
            state.select(keep)
            feed = [feed[r] for r in keep]
            alive = [alive[r] for r in keep]
        logits = state.advance(feed)
    return Samples(seqs, logp)


def iid_chooser(ctx: Context, stream: str = "sample") -> Chooser:
    """Independent draws: sample 0 reads the `sample` decoder's common random numbers
    (Gumbel-max on stream ``sample``), sample ``i > 0`` its own stream (``sample/<i>``).
    Another ``stream`` gives a second, independent set (``<stream>/<i>`` for every i)."""
    def name(i: int) -> str:
        return ("sample" if i == 0 else f"sample/{i}") if stream == "sample" else f"{stream}/{i}"

    def choose(i: int, t: int, probs: torch.Tensor) -> tuple[int, dict[str, Any]]:
        return draw(ctx, t, probs, stream=name(i)), {}

    return choose


def length_normalised(logp: float, length: int, alpha: float) -> float:
    """``logp / length ** alpha`` (alpha 0 = total log-probability, 1 = per-token mean)."""
    return logp / (max(length, 1) ** alpha)
