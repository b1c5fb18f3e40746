"""``span_extract``: the output is an exact contiguous token span of a given passage, found
greedily (a copy-from-the-passage mask, step by step) or exactly (every span scored by the model,
best one returned), with the unconstrained greedy answer recorded beside it for comparison."""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import torch

from decoders.ar import ARState, dist_evidence
from decoders.base import Bool, Choice, Context, Decoder, Float, Int, Params, PlaygroundError, Text, register
from decoders.citation import arxiv
from decoders.kv_cache import check_rollback, crop_layers, repeat_batch, rollback_cache
from decoders.token_text import view_token
from playground.core.trace import Step

NAME = "span_extract"
MODES = ("greedy", "exact")
# The passage's token limit: the exact mode's heat map stores passage x max_span numbers in the
# trace, and the greedy mode scans every occurrence at every step; 200 tokens keeps both small.
MAX_PASSAGE_TOKENS = 200
MAX_SPAN = 48
# Start positions scored per batched forward in the exact mode (rows share the prompt's cache).
BATCH = 16
TOP_EVIDENCE = 8  # allowed and blocked tokens each step records for the Constraint view
NEG_INF = float("-inf")


# ---------------------------------------------------------------------- passage & spans
def passage_ids(view: Any, text: str) -> list[int]:
    """The passage's token ids. A passage starting with a letter or digit gets a leading space,
    so its first word has the spelling it has inside running text (the answer follows a prompt
    such as ``Answer:``, where every word is preceded by a space)."""
    t = text if not text[:1].isalnum() else " " + text
    return [int(i) for i in view.tokenizer.encode(t, add_special_tokens=False)]


def check_passage(ids: Sequence[int], stop_ids: set[int]) -> None:
    """Refuse, in one line, a passage that is empty, too long, or holds an end-of-text token
    (a span ending on one would end the output in its middle)."""
    if not ids:
        raise PlaygroundError(f"knob 'passage': the passage is empty; {NAME} copies its output from it")
    if len(ids) > MAX_PASSAGE_TOKENS:
        raise PlaygroundError(f"knob 'passage' is {len(ids)} tokens long; the limit is {MAX_PASSAGE_TOKENS}")
    if any(int(t) in stop_ids for t in ids):
        raise PlaygroundError("knob 'passage' holds an end-of-text token; remove it")


def continuations(passage: Sequence[int], live: Sequence[int], n: int) -> list[int]:
    """The tokens that extend some live occurrence (a start ``k`` with ``passage[k:k+n]`` equal to
    the output so far) by one more passage token, sorted."""
    return sorted({int(passage[k + n]) for k in live if k + n < len(passage)})


def follow(passage: Sequence[int], live: Sequence[int], n: int, tok: int) -> list[int]:
    """The occurrences still live once ``tok`` is the output's token ``n``."""
    return [k for k in live if k + n < len(passage) and passage[k + n] == tok]


def is_span(ids: Sequence[int], passage: Sequence[int]) -> bool:
    """Whether ``ids`` is a contiguous sub-sequence of ``passage`` (the empty one is)."""
    m = len(ids)
    return any(list(passage[k:k + m]) == list(ids) for k in range(len(passage) - m + 1))


def span_score(logp: float, length: int, alpha: float) -> float:
    """The ranking score of a span: its log-probability over ``length ** alpha`` (alpha 0: the
    log-probability itself, which favours short spans; 1: the mean per token)."""
    return logp / (length ** alpha) if alpha else logp


def _finite(x: float, digits: int = 4) -> float | None:
    """A rounded float for the trace, or None when it is not finite (strict JSON)."""
    return round(float(x), digits) if math.isfinite(float(x)) else None


def _mask_evidence(view: Any, logits: torch.Tensor, ok: torch.Tensor) -> dict[str, Any]:
    """The ``constraint`` field the Constraint views draw: allowed count, removed mass, and the
    top allowed and blocked tokens under the model's distribution."""
    p = torch.softmax(logits.float(), -1)

    def top(sel: torch.Tensor) -> dict[str, list[Any]]:
        q = torch.where(sel, p, torch.full_like(p, -1.0))
        k = min(TOP_EVIDENCE, int(sel.sum()))
        ids = torch.topk(q, k).indices.tolist() if k else []
        return {"ids": ids, "tokens": [view_token(view, t) for t in ids], "probs": [round(float(p[t]), 6) for t in ids]}

    removed = float(p[~ok].sum())
    return {"allowed": int(ok.sum()), "vocab": int(ok.numel()), "removed_mass": round(removed, 6),
            "kept_mass": round(1.0 - removed, 6), "top_allowed": top(ok), "top_blocked": top(~ok), "kind": "span"}


def allowed_mask(vocab: int, allowed: Sequence[int], ends: Sequence[int]) -> torch.Tensor:
    """The boolean mask of the tokens a copy constraint allows: the continuations, plus the end
    tokens where the span may end."""
    ok = torch.zeros(vocab, dtype=torch.bool)
    ok[list(allowed)] = True
    ok[list(ends)] = True
    return ok


def step_evidence(ctx: Context, logits: torch.Tensor, passage: Sequence[int], live: Sequence[int], n: int,
                  allowed: Sequence[int], end_ok: Sequence[int], tok: int,
                  mode: str) -> tuple[dict[str, Any], list[int]]:
    """One span step's evidence (``dist``, ``constraint``, ``span``) and the occurrences still
    live after ``tok``. ``allowed`` are the continuations the copy mask let through and
    ``end_ok`` the end tokens it let through. ``span`` holds the allowed set's size, the live
    occurrences before and after the step and their starts; the first step also carries the
    passage's ids, so the Passage view can draw them."""
    ok = allowed_mask(logits.shape[-1], allowed, end_ok)
    ended = tok in end_ok
    nxt = [] if ended else follow(passage, live, n, tok)
    span: dict[str, Any] = {"mode": mode, "at": n, "allowed": int(ok.sum()), "continuations": len(allowed),
                            "can_end": bool(end_ok), "live": len(live), "live_after": len(nxt),
                            "ended": ended, "starts": list(live)}
    if n == 0:
        span["passage"] = {"ids": list(passage)}
    ev: dict[str, Any] = {
        "dist": dist_evidence(ctx.target, logits, _one_hot(logits, tok), tok, ctx.top_k_evidence),
        "constraint": _mask_evidence(ctx.target, logits, ok),
        "span": span,
    }
    return ev, nxt


def _one_hot(logits: torch.Tensor, tok: int) -> torch.Tensor:
    final = torch.zeros(logits.shape[-1], dtype=torch.float32)
    final[tok] = 1.0
    return final


# ---------------------------------------------------------------------- the decoder
@register
class SpanExtract(Decoder):
    """Exact span extraction: the answer is a contiguous token span of the passage (Castel et
    al. 2022's exact-extract; the copy-from-input mask of Deußer et al. 2023).

    The model reads only the prompt (a question, say; put the passage into the prompt too if
    the model should read it) and the output is copied from the ``passage`` knob's tokens.
    ``greedy``: at each step only the tokens that continue some occurrence of the output so far
    in the passage are allowed, plus an end token once one span token is out; the argmax of the
    allowed ones is taken (the same as any token mask, so it can paint itself into a poor span).
    ``exact``: every span of up to ``max_span`` tokens is scored by its log-probability under the
    model after the prompt (plus the probability of ending there, with ``score_end``), and the
    best by ``logp / length ** length_penalty`` is returned, then its end token where
    ``max_new_tokens`` leaves room. One forward per
    start position teacher-forces the passage from there, which gives every prefix's
    log-probability at once: ``ceil(starts / 16)`` batched forwards after the prompt's (about
    passage length x ``max_span`` token positions in all, where greedy feeds ``max_span``).
    ``compare_free`` also runs plain greedy for the same length, whose answer and log-probability
    the run records beside the span's ("free greedy vs best span").

    Simplifies: spans are token spans of the passage as tokenized alone, so an answer spelled
    with other tokens does not count; the passage is not shown to the model; stop strings are
    ignored (a span ends on an end token or at the length limit); a passage holds at most 200
    tokens; the exact mode rescans shared prefixes once per start instead of using a trie, and
    there is no beam search over spans: at most 200 x 48 spans, scoring them all is cheap enough
    to be exact.
    """

    name = NAME
    family = "guided"
    kind = "causal"
    step_kind = "token"
    params = Params(
        passage=Text("", "the text the answer must be copied from, as an exact token span "
                         f"(at most {MAX_PASSAGE_TOKENS} tokens)"),
        mode=Choice("exact", MODES, "greedy: argmax over the tokens that continue the span, step by step; "
                                    "exact: score every span and return the most probable one"),
        max_span=Int(12, 1, MAX_SPAN, "longest span in tokens (also capped by max_new_tokens)"),
        length_penalty=Float(0.0, 0.0, 2.0, "exact mode ranks spans by logprob / length^this "
                                            "(0: plain log-probability, 1: per-token mean)"),
        score_end=Bool(True, "exact mode adds log P(end token) after the span, so a span is scored "
                             "as a whole answer and not as the prefix of a longer one"),
        compare_free=Bool(True, "also run unconstrained greedy for the same length and record its "
                                "answer and log-probability (extra forwards)"),
    )
    reference = ("Castel, Ram, Efrat & Levy 2022, How Optimal is Greedy Decoding for Extractive Question "
                 "Answering? (AKBC); Deußer et al. 2023, Informed Named Entity Recognition Decoding for "
                 "Generative Language Models")
    papers = (
        arxiv("Castel, Ram, Efrat & Levy 2022, How Optimal is Greedy Decoding for Extractive Question "
              "Answering? (AKBC)", "2108.05857"),
        arxiv("Deußer, Hillebrand, Bauckhage & Sifa 2023, Informed Named Entity Recognition Decoding for "
              "Generative Language Models", "2308.07791"),
    )
    description = "The answer is an exact span of the passage: greedy under a copy mask, or the best span of all"
    shows = ("; every step records the copy mask (``constraint``) and the passage occurrences still live "
             "(``span``); the exact mode's first step a start x length table of span log-probabilities "
             "(``span_scores``); the stats the free greedy answer beside the span")

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        ends = sorted(t for t in ctx.stop_ids if 0 <= t < int(ctx.target.vocab_size))
        text = str(p.get("passage") or "")
        # white space alone is no passage either: a span of it would be an empty answer
        passage = passage_ids(ctx.target, text) if text.strip() else []
        check_passage(passage, set(ends))
        # a span fits max_new_tokens; its end token follows where there is room left for it
        limit = min(int(p["max_span"]), ctx.max_new_tokens)
        if p["mode"] == "exact":
            check_rollback(NAME, ctx.target)  # refused before any work: its cache is cut back per batch
        free = self._free_greedy(ctx, limit, ends, passage) if p["compare_free"] else None
        if free is not None:
            self.extra_stats["free_greedy"] = free
        if p["mode"] == "greedy":
            yield from self._greedy(ctx, passage, ends, limit, free)
        else:
            yield from self._exact(ctx, passage, ends, limit, free)

    # ------------------------------------------------------------------ free greedy
    def _free_greedy(self, ctx: Context, limit: int, ends: Sequence[int], passage: Sequence[int]) -> dict[str, Any]:
        """Plain greedy for up to ``limit`` tokens (an end token included in its log-probability),
        for the "free greedy vs best span" comparison."""
        state = ARState(ctx.target)
        logits = state.prefill(ctx.prompt_ids)
        out: list[int] = []
        logp, ended = 0.0, False
        for n in range(limit + 1):
            ctx.check_cancel()
            lp = torch.log_softmax(logits.float(), -1)
            tok = int(torch.argmax(lp))
            if tok in ends:
                logp += float(lp[tok])  # the answer's end is part of its probability
                ended = True
                break
            if n == limit:
                break  # cut at the length limit: the last forward only asked whether it ends
            logp += float(lp[tok])
            out.append(tok)
            logits = state.advance([tok])
        return {"ids": out, "text": ctx.target.decode(out), "logprob": _finite(logp), "ended": ended,
                "is_span": is_span(out, passage)}

    # ------------------------------------------------------------------ greedy
    def _greedy(self, ctx: Context, passage: list[int], ends: list[int], limit: int,
                free: dict[str, Any] | None) -> Iterator[Step]:
        state = ARState(ctx.target)
        logits = state.prefill(ctx.prompt_ids)
        live = list(range(len(passage)))  # every position starts an occurrence of the empty output
        out: list[int] = []
        logp = 0.0
        self.finish_reason = "length"
        while len(out) < ctx.max_new_tokens:
            ctx.check_cancel()
            n = len(out)
            # after max_span span tokens only an end token may follow, as in the exact mode
            allowed = continuations(passage, live, n) if n < limit else []
            can_end = n > 0 and bool(ends)
            if not allowed and not can_end:
                # the span is as long as it may be, or every occurrence reached the passage's end,
                # and the model has no end token to close it with
                self.finish_reason = "length" if n >= limit else "constraint"
                break
            end_ok = ends if can_end else []
            ok = allowed_mask(logits.shape[-1], allowed, end_ok)
            masked = logits.float().masked_fill(~ok, NEG_INF)
            tok = int(torch.argmax(masked))  # lowest id on ties, as greedy
            logp += float(torch.log_softmax(logits.float(), -1)[tok])
            ended = tok in ends
            ev, nxt = step_evidence(ctx, logits, passage, live, n, allowed, end_ok, tok, "greedy")
            out.append(tok)
            yield Step("token", [tok], **ev)
            if ended:
                self.finish_reason = "eos" if tok in getattr(ctx.target, "eos_ids", set()) else "stop"
                break
            live = nxt
            if len(out) < ctx.max_new_tokens:
                logits = state.advance([tok])
        span = [t for t in out if t not in ends]
        start = live[0] if live and span else -1
        self._record(ctx, span, start, logp, free)

    # ------------------------------------------------------------------ exact
    def _exact(self, ctx: Context, passage: list[int], ends: list[int], limit: int,
               free: dict[str, Any] | None) -> Iterator[Step]:
        p = ctx.params
        alpha, with_end = float(p["length_penalty"]), bool(p["score_end"]) and bool(ends)
        # the prompt's cache is cut back to the prompt after every batch of starts
        cache = rollback_cache(ctx.target, check_rollback(NAME, ctx.target))
        first_out = ctx.target.forward(list(ctx.prompt_ids), cache=cache)
        cache = first_out.cache
        first = torch.log_softmax(first_out.logits[0, -1].float().cpu(), -1)
        P = len(passage)
        L = min(limit, P)  # no span is longer than the passage
        rows = min(BATCH, P)
        if rows > 1:
            repeat_batch(cache, rows)
        table: list[list[float | None]] = []
        best: tuple[int, int, float] = (-1, 0, NEG_INF)
        best_rows: torch.Tensor | None = None  # the best start's logits (length x V), for the steps
        plen = len(ctx.prompt_ids)
        for lo in range(0, P, rows):
            ctx.check_cancel()
            starts = list(range(lo, min(lo + rows, P)))
            # right-padded rows (padding with the passage's last token): a causal model's
            # positions before the padding do not see it, and padded positions are never read
            feed = [[passage[min(i + m, P - 1)] for m in range(L)] for i in starts]
            feed += [feed[-1]] * (rows - len(feed))  # a short last batch keeps the cache's rows
            out = ctx.target.forward(torch.tensor(feed, dtype=torch.long), cache=cache)
            crop_layers(out.cache, plen)
            cache = out.cache
            logits = out.logits.float()  # (rows, L, V): position m predicts the span's token m + 1
            # log-probabilities by gather minus logsumexp: no second rows x L x V tensor, which
            # matters for a large vocabulary; only these (rows, L) results go to the CPU
            lse = torch.logsumexp(logits, -1)
            nxt = torch.tensor([[passage[min(i + m + 1, P - 1)] for m in range(L)] for i in starts]
                               + [[0] * L] * (rows - len(starts)), dtype=torch.long, device=logits.device)
            tok_lp = (logits.gather(-1, nxt[..., None])[..., 0] - lse).cpu()
            end_lp = (torch.logsumexp(logits[..., ends], -1) - lse).cpu() if with_end else None
            for r, i in enumerate(starts):
                m_max = min(L, P - i)
                # log P(span of length m) = first token's + the next m - 1 teacher-forced ones
                cum = torch.cumsum(torch.cat([first[passage[i]].reshape(1), tok_lp[r, :m_max - 1]]), 0)
                if end_lp is not None:
                    cum = cum + end_lp[r, :m_max]
                row = [float(v) for v in cum]
                table.append([_finite(v) for v in row])
                for m, v in enumerate(row, start=1):
                    sc = span_score(v, m, alpha)
                    if sc > best[2]:
                        best, best_rows = (i, m, sc), logits[r, :m_max].detach().cpu()
        start, length, score = best
        if start < 0:
            raise PlaygroundError(f"{NAME}: no span of the passage has a finite log-probability under this model")
        span = passage[start:start + length]
        span_logp = float(table[start][length - 1] or 0.0)
        evidence = {"logp": table, "max_span": L, "best": [start, length], "best_score": _finite(score),
                    "best_logp": _finite(span_logp), "length_penalty": alpha, "score_end": with_end,
                    "free_greedy": free}
        # the answer is emitted as token steps along the best span: each step's distribution is
        # the one the scoring forward computed there (the first from the prompt's forward)
        assert best_rows is not None
        dists = [first_out.logits[0, -1].float().cpu()] + [best_rows[m] for m in range(length)]
        out_ids = list(span)
        if with_end and length < ctx.max_new_tokens:
            e = max(ends, key=lambda t: float(torch.log_softmax(dists[length], -1)[t]))
            out_ids.append(int(e))
        live = list(range(P))
        for n, tok in enumerate(out_ids):
            ctx.check_cancel()
            # the same mask evidence as the greedy mode: what a copy constraint would have allowed here
            allowed = continuations(passage, live, n) if n < L else []
            ev, live = step_evidence(ctx, dists[n], passage, live, n, allowed, ends if n > 0 else [], tok, "exact")
            ev["span"]["best"] = [start, length]
            if n == 0:
                ev["span_scores"] = evidence
            yield Step("token", [tok], **ev)
        if len(out_ids) > len(span):
            self.finish_reason = "eos" if out_ids[-1] in getattr(ctx.target, "eos_ids", set()) else "stop"
        else:
            self.finish_reason = "length"
        self._record(ctx, span, start, span_logp, free, score=score)

    def _record(self, ctx: Context, span: list[int], start: int, logp: float, free: dict[str, Any] | None,
                score: float | None = None) -> None:
        """The run's stats: the span (start, length, text, log-probability) and the free greedy
        answer's log-probability beside it."""
        rec: dict[str, Any] = {"start": start, "length": len(span), "text": ctx.target.decode(span),
                               "logprob": _finite(logp)}
        if score is not None:
            rec["score"] = _finite(score)
        self.extra_stats["span"] = rec
        if free is not None and free.get("logprob") is not None and rec["logprob"] is not None:
            self.extra_stats["span_minus_free_logprob"] = round(rec["logprob"] - free["logprob"], 4)
