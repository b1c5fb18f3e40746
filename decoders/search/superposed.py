"""``superposed``: Superposed Decoding, k drafts grown by one forward pass per step."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from decoders.base import Choice, Context, Decoder, Float, Int, Params, PlaygroundError, register
from decoders.beam_batch import BIG, BatchState, finish_reason_of, hits_stop
from decoders.citation import arxiv
from playground.core.models.handle import Forward
from playground.core.corpus import CORPUS_DIR, corpus_split
from playground.core.trace import Step

MAX_ORDER = 4  # longest n-gram: keys are exact mixed-radix int64 numbers (see NgramTable)
BOUNDARY, UNSEEN = 0, 1  # ranks of a work boundary and of a token the table never saw


# ---------------------------------------------------------------------- the n-gram model
def training_works(corpus_dir: Any = CORPUS_DIR) -> list[str]:
    """The bundled corpus's training split, one string per work (the split the tiny models were
    trained and scored by)."""
    return corpus_split(corpus_dir)[0]


class NgramTable:
    """Counts of every j-gram (j = 1..order) of some token streams, for exact look-ups.

    Token ids are renamed to dense ranks (2.. for the ids the streams hold; 0 marks a stream
    boundary, 1 any id they never hold), so a j-gram is one exact int64 in radix
    ``R = distinct + 2``; one sorted array of distinct keys with their counts per order.
    A j-gram across a boundary holds a 0 digit, which no query holds: it never matches.
    """

    def __init__(self, streams: Sequence[Sequence[int]], order: int, vocab: int) -> None:
        ids = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in streams] + [np.zeros(0, np.int64)]))
        self.order, self.vocab = int(order), int(vocab)
        self.radix = len(ids) + 2
        if self.radix ** self.order >= 2 ** 63:
            raise PlaygroundError(f"superposed: {self.order}-grams over {len(ids)} distinct tokens do not fit "
                                  "a 64-bit key; lower ngram_order")
        self.ids = ids
        parts = [np.full(1, BOUNDARY, np.int64)]
        for s in streams:
            parts += [self.ranks(s), np.full(1, BOUNDARY, np.int64)]
        stream = np.concatenate(parts)
        self.total = int(sum(len(s) for s in streams))
        self.keys: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        for j in range(1, self.order + 1):
            n = len(stream) - j + 1
            key = np.zeros(max(n, 0), np.int64)
            for l in range(j):
                key = key * self.radix + stream[l:l + n]
            k, c = np.unique(key, return_counts=True)
            self.keys.append(k)
            self.counts.append(c.astype(np.int64))

    def ranks(self, ids: Sequence[int]) -> np.ndarray:
        """Dense ranks of token ids (``UNSEEN`` for an id the streams never hold)."""
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not len(self.ids):
            return np.full(len(a), UNSEEN, np.int64)
        pos = np.minimum(np.searchsorted(self.ids, a), len(self.ids) - 1)
        return np.where(self.ids[pos] == a, pos + 2, UNSEEN).astype(np.int64)

    def count(self, grams: np.ndarray) -> np.ndarray:
        """How often each j-gram (rows of ranks, shape (n, j)) occurs."""
        key = np.zeros(grams.shape[0], np.int64)
        for col in range(grams.shape[1]):
            key = key * self.radix + grams[:, col]
        keys, counts = self.keys[grams.shape[1] - 1], self.counts[grams.shape[1] - 1]
        if not len(keys):
            return np.zeros(len(key), np.int64)
        at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        return np.where(keys[at] == key, counts[at], 0)

    def probs(self, history: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Interpolated n-gram probability of each of ``tokens`` after ``history`` (token ids).

        The mean of the estimates of every order whose context occurs: the add-one unigram
        ``(c(x) + 1) / (N + V)`` (never zero) and, for ``m = 1..order-1`` context tokens,
        ``c(h_m x) / c(h_m)`` with ``h_m`` the last ``m`` tokens of the history.
        """
        x = self.ranks(tokens)
        est = [(self.count(x[:, None]) + 1.0) / (self.total + self.vocab)]
        hist = self.ranks(list(history)[max(0, len(history) - self.order + 1):] if self.order > 1 else [])
        for m in range(1, self.order):
            if len(hist) < m:
                break
            h = hist[-m:]
            ch = int(self.count(h[None])[0])
            if ch > 0:
                grams = np.concatenate([np.repeat(h[None], len(x), 0), x[:, None]], 1)
                est.append(self.count(grams) / ch)
        return np.mean(est, axis=0)


@functools.lru_cache(maxsize=4)
def _corpus_streams(tokenizer: Any) -> tuple[np.ndarray, ...]:
    """The training works in this tokenizer's ids, one array per work (read once per process)."""
    return tuple(np.asarray(tokenizer(d, add_special_tokens=False)["input_ids"], dtype=np.int64)
                 for d in training_works())


@functools.lru_cache(maxsize=8)
def corpus_table(tokenizer: Any, order: int, vocab: int) -> NgramTable:
    """The n-gram table of the bundled corpus's training split in this tokenizer's ids,
    tokenized and counted once per process (per tokenizer and order)."""
    return NgramTable(_corpus_streams(tokenizer), order, vocab)


# ---------------------------------------------------------------------- one superposed pass
def input_embeddings(view: Any) -> torch.nn.Module:
    """The model's input-embedding module, or a one-line refusal."""
    emb = view.model.get_input_embeddings() if hasattr(view.model, "get_input_embeddings") else None
    if emb is None:
        raise PlaygroundError(f"superposed needs the input embeddings of model {view.name!r}, which it does not expose")
    return emb


def superposed_forward(view: Any, cache: Any, tokens: Sequence[int], weights: Sequence[float]) -> Forward:
    """One counted forward pass at the cache's next position, whose input embedding is
    ``sum_i weights[i] * emb(tokens[i])`` (weights summed in float32, then cast to the model's dtype)."""
    emb = input_embeddings(view)
    with torch.inference_mode():
        e = emb(torch.tensor(list(tokens), dtype=torch.long, device=emb.weight.device)).float()
        w = torch.tensor(list(weights), dtype=torch.float32, device=e.device)
        mixed = (w[:, None] * e).sum(0)
    return view.forward(None, cache=cache, embeds=mixed[None, None])


def combine(lm: np.ndarray, ng: np.ndarray, alpha: float, mix: str) -> np.ndarray:
    """Log score of candidates from their LM and n-gram probabilities: ``(1-α) log p_lm +
    α log p_ng`` (geometric) or ``log((1-α) p_lm + α p_ng)`` (linear); log 0 is ``-BIG``."""
    def log(p: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.maximum(np.log(p), -BIG)

    if mix == "geometric":
        return (1.0 - alpha) * log(lm) + alpha * log(ng)
    return log((1.0 - alpha) * lm + alpha * ng)


def softmax_weights(scores: Sequence[float]) -> list[float]:
    """The drafts' normalised probabilities ``exp(s_i) / sum_j exp(s_j)``."""
    s = np.asarray(scores, dtype=np.float64)
    e = np.exp(s - s.max())
    return (e / e.sum()).tolist()


@dataclass
class Draft:
    """One draft: its tokens and running score (summed log of its candidates' combined scores)."""

    ids: list[int]
    score: float


class SuperposedParams(Params):
    """Superposed Decoding's knobs with the cross-check: the output draft must exist."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        if out["output_rank"] >= out["num_drafts"]:
            raise PlaygroundError(f"decoder {decoder!r}: output_rank ({out['output_rank']}) must be below "
                                  f"num_drafts ({out['num_drafts']})")
        return out


@register
class Superposed(Decoder):
    """Superposed Decoding (Shen et al. 2024): k drafts from one forward pass per token.

    The prompt is run once; after that each step is ONE forward pass of the model at the
    next position, whose input embedding is the superposition ``sum_i w_i * emb(last token
    of draft i)`` with ``w_i`` the drafts' normalised probabilities ``softmax(score_i)``; its
    key/value entries are appended to the single cache the drafts share. The top-k tokens of
    that one distribution extend each of the k drafts: k x k candidates, each scored by its
    draft's running score plus ``(1-α) log p_lm + α log p_ngram`` (the log of score times
    ``p_lm^(1-α) p_ngram^α``, the authors' geometric interpolation; ``mix=linear`` takes
    ``log((1-α) p_lm + α p_ngram)``), and the k best become the next drafts. On the first
    step the drafts are all the bare prompt, so only its row is expanded (k candidates).
    A candidate ending on a stop token or string leaves the drafts for a pool of finished
    ones; the run ends at ``max_new_tokens`` or once a finished draft scores at least as well
    as every running one (scores only fall, so none could overtake it). The lane's output is
    the draft of rank ``output_rank`` (0 = best) among finished and running ones by score;
    the others are in ``stats.drafts`` and in every step.

    The n-gram model: counts of 1..``ngram_order``-grams of the bundled corpus's training
    split (``assets/corpus``, split by ``split.json``), tokenized with the target's tokenizer
    once per process (``ngram_source=corpus``), or of the prompt alone (``prompt``); the
    orders whose context occurs are averaged with equal weights, the unigram add-one smoothed.
    With k = 1 and α = 0 the rule is greedy decoding, token for token.

    Steps are ``beam`` steps: the drafts (with their superposition weights) and, in
    ``superposed``, the k x k grid: the top-k tokens and their LM probability, each row's
    n-gram probabilities, combined scores and kept/stopped marks, and the next weights.
    Simplifies: the authors' n-gram models (orders up to 6 with tuned interpolation weights,
    and a penalty for drafts no n-gram matches) are the small equal-weight table above, at
    most 4-grams (exact 64-bit keys); no prompt batching, no sampling of drafts or tokens,
    and no temperature on the superposed distribution.
    """

    name = "superposed"
    family = "search"
    kind = "causal"
    step_kind = "beam"
    params = SuperposedParams(
        num_drafts=Int(3, 1, 16, "k: drafts kept; each step's top-k tokens extend them into k x k candidates"),
        ngram_weight=Float(0.5, 0.0, 1.0, "α: weight of the n-gram model against the LM; 0 = the LM alone"),
        ngram_order=Int(3, 1, MAX_ORDER, "longest n-gram (1 = unigram); the orders 1..n are averaged"),
        ngram_source=Choice("corpus", ("corpus", "prompt"),
                            "n-gram counts from the bundled corpus's training split, or from the prompt alone"),
        mix=Choice("geometric", ("geometric", "linear"),
                   "interpolation: p_lm^(1-α)·p_ng^α (the authors' code) or (1-α)·p_lm + α·p_ng"),
        output_rank=Int(0, 0, 15, "which draft is the lane's output, by final score: 0 = the best"),
    )
    reference = ("Shen et al. 2024, Superposed Decoding: Multiple Generations from a Single "
                 "Autoregressive Inference Pass (NeurIPS)")
    papers = (
        arxiv("Shen et al. 2024, Superposed Decoding: Multiple Generations from a Single "
              "Autoregressive Inference Pass (NeurIPS)", "2405.18400"),
    )
    description = "k drafts from one forward pass per step: feed the weighted sum of their last tokens' embeddings"
    shows = "; the k x k candidate grid (LM and n-gram probability, score, kept) and the superposition weights"

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return int(params.get("num_drafts", 3)) > 1 or float(params.get("ngram_weight", 0.5)) > 0

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        k, alpha, mix = p["num_drafts"], p["ngram_weight"], p["mix"]
        view = ctx.target
        input_embeddings(view)  # refuse before any forward
        vocab = int(view.vocab_size)
        if p["ngram_source"] == "corpus":
            table = corpus_table(view.tokenizer, p["ngram_order"], vocab)
        else:
            table = NgramTable([list(ctx.prompt_ids)], p["ngram_order"], vocab)
        state = BatchState(view, ctx.prompt_ids, 1)
        logits = state.first
        prompt = list(ctx.prompt_ids)
        drafts = [Draft([], 0.0)]
        pool: list[Draft] = []
        for t in range(ctx.max_new_tokens):
            ctx.check_cancel()
            probs = torch.softmax(logits.float(), -1).double().cpu()
            top_ids = [int(x) for x in torch.argsort(-probs, stable=True)[: min(k, probs.numel())]]
            lm = probs[top_ids].numpy()
            rows = drafts
            ngram = [table.probs(prompt + d.ids, top_ids) for d in rows]
            score = [d.score + combine(lm, ng, alpha, mix) for d, ng in zip(rows, ngram)]
            kept = [[False] * len(top_ids) for _ in rows]
            stopped = [[False] * len(top_ids) for _ in rows]
            running: list[tuple[Draft, int]] = []
            finished: list[tuple[Draft, int]] = []
            order = sorted(((float(row[j]), r, j) for r, row in enumerate(score) for j in range(len(top_ids))),
                           key=lambda c: (-c[0], c[1], c[2]))
            for sc, r, j in order:
                if len(running) >= k:
                    break
                new = Draft(rows[r].ids + [top_ids[j]], sc)
                if hits_stop(ctx, new.ids):
                    # only a stop among the k best candidates finishes; the others were never kept
                    if len(running) + len(finished) < k:
                        finished.append((new, r))
                        stopped[r][j] = True
                    continue
                running.append((new, r))
                kept[r][j] = True
            pool = sorted(pool + [f for f, _ in finished], key=lambda d: -d.score)[:k]
            drafts = [d for d, _ in running]
            weights = softmax_weights([d.score for d in drafts]) if drafts else []
            # the first step's row is the bare prompt, which is no beam of an earlier step
            beams = [{"ids": list(d.ids), "score": d.score, "parent": r if t else None, "finished": False,
                      "weight": w} for (d, r), w in zip(running, weights)]
            beams += [{"ids": list(d.ids), "score": d.score, "parent": r if t else None, "finished": True}
                      for d, r in finished]
            ev = {"top_ids": top_ids, "lm": lm.tolist(), "prev_scores": [d.score for d in rows],
                  "ngram": [ng.tolist() for ng in ngram], "score": [sc.tolist() for sc in score],
                  "kept": kept, "stopped": stopped, "weights": weights, "alpha": alpha, "mix": mix}
            self.output_override = list(self._pick(pool, drafts, p["output_rank"]).ids)
            yield Step("beam", [], beams=beams, superposed=ev)
            if not drafts or (pool and pool[0].score >= drafts[0].score) or t + 1 >= ctx.max_new_tokens:
                break
            logits = superposed_forward(view, state.cache, [d.ids[-1] for d in drafts], weights).logits[0, -1]
        best = self._pick(pool, drafts, p["output_rank"])
        ranked = sorted(pool + drafts, key=lambda d: -d.score)
        self.output_override = list(best.ids)
        self.finish_reason = finish_reason_of(ctx, best.ids)
        self.extra_stats["drafts"] = [{"ids": list(d.ids), "score": round(d.score, 5),
                                       "finished": any(d is f for f in pool)} for d in ranked]

    @staticmethod
    def _pick(pool: list[Draft], drafts: list[Draft], rank: int) -> Draft:
        """The draft of this rank by score among finished and running ones (the last if fewer)."""
        ranked = sorted(pool + drafts, key=lambda d: -d.score)
        return ranked[min(rank, len(ranked) - 1)]
