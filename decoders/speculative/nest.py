"""Nearest neighbour speculative decoding (``nest``): a kNN-LM mixture over a small datastore of
the model's own hidden states, whose retrieved neighbours also propose the passage span that
follows them; the model verifies the span in one forward with a relaxed acceptance test, and
every accepted token keeps the passage and offset it was copied from."""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from decoders.ar import dist_evidence, sample_index
from decoders.base import Choice, Context, Decoder, Float, Int, Params, PlaygroundError, Text, register
from decoders.citation import arxiv
from decoders.kv_cache import cache_len, check_rollback, crop_layers, rollback_cache
from playground.core.trace import Step, speculative_figures

NAME = "nest"
MAX_PASSAGES = 16
MAX_PASSAGE_TOKENS = 256
MAX_DATASTORE_TOKENS = 2048
MAX_PASSAGES_CHARS = 20000
SOURCES = ("passages", "prompt", "both")
LAMBDA_MODES = ("rrc", "fixed")
METRICS = ("l2", "ip")
PROMPT_SOURCE = "prompt"
# encoded datastores kept between runs, keyed by (model, passage text): re-encoding the same
# passages with the same model gives the same keys, and a lane re-run should not pay it again
_STORES: "OrderedDict[tuple[Any, ...], Datastore]" = OrderedDict()
_STORES_KEPT = 4

DEFAULT_PASSAGES = """\
To be, or not to be,--that is the question:--
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune
Or to take arms against a sea of troubles,
And by opposing end them?

Friends, Romans, countrymen, lend me your ears;
I come to bury Caesar, not to praise him.
The evil that men do lives after them;
The good is oft interred with their bones:
So let it be with Caesar.

Now is the winter of our discontent
Made glorious summer by this sun of York;
And all the clouds that lour'd upon our house
In the deep bosom of the ocean buried."""


# ---------------------------------------------------------------------- the datastore
@dataclass
class Datastore:
    """Keys (the model's last hidden state after token ``j`` of a passage), values (token
    ``j + 1``) and sources (passage name, offset of the value token in its passage).

    ``passages`` maps a passage name to its token ids, so the span after a neighbour can be read."""

    keys: torch.Tensor                      # (N, H) float32, CPU
    values: torch.Tensor                    # (N,) long
    names: list[str]                        # passage name of each entry
    offsets: list[int]                      # offset of each value token in its passage
    passages: dict[str, list[int]] = field(default_factory=dict)
    encode_forwards: int = 0
    encode_tokens: int = 0

    def __len__(self) -> int:
        return int(self.values.numel())

    def extended(self, name: str, ids: Sequence[int], hidden: torch.Tensor) -> "Datastore":
        """A new store with the entries of one more passage (``hidden[j]`` after ``ids[j]``)."""
        ids = [int(t) for t in ids]
        n = len(ids) - 1
        if n <= 0:
            return self
        keys = hidden[:n].detach().float().cpu()
        return Datastore(torch.cat([self.keys, keys]) if len(self) else keys,
                         torch.cat([self.values, torch.tensor(ids[1:], dtype=torch.long)]),
                         self.names + [name] * n, self.offsets + list(range(1, n + 1)),
                         {**self.passages, name: ids}, self.encode_forwards, self.encode_tokens)


def split_passages(text: str) -> list[str]:
    """The passages of the ``passages`` knob: blocks separated by blank lines, each stripped."""
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", str(text)) if p.strip()]


def passage_token_ids(view: Any, text: str) -> list[int]:
    """A passage's token ids, encoded as written (no special tokens)."""
    return [int(i) for i in view.tokenizer.encode(text, add_special_tokens=False)]


def check_passages(view: Any, text: str) -> list[list[int]]:
    """The passages' token ids, or a one-line PlaygroundError when they are empty, too many or
    too long."""
    if len(text) > MAX_PASSAGES_CHARS:
        raise PlaygroundError(f"knob 'passages' is {len(text)} characters long; the limit is {MAX_PASSAGES_CHARS}")
    parts = split_passages(text)
    if not parts:
        raise PlaygroundError("knob 'passages' holds no passage (passages are separated by blank lines); "
                              "give one, or set source=prompt")
    if len(parts) > MAX_PASSAGES:
        raise PlaygroundError(f"knob 'passages' holds {len(parts)} passages; the limit is {MAX_PASSAGES}")
    ids = [passage_token_ids(view, p) for p in parts]
    for i, p in enumerate(ids):
        if len(p) < 2:
            raise PlaygroundError(f"knob 'passages': passage {i + 1} is {len(p)} token(s) long; a datastore "
                                  f"entry needs a token and the one after it")
        if len(p) > min(MAX_PASSAGE_TOKENS, view.context_length):
            raise PlaygroundError(f"knob 'passages': passage {i + 1} is {len(p)} tokens long; the limit is "
                                  f"{min(MAX_PASSAGE_TOKENS, view.context_length)}")
    total = sum(len(p) for p in ids)
    if total > MAX_DATASTORE_TOKENS:
        raise PlaygroundError(f"knob 'passages' is {total} tokens long in all; the limit is {MAX_DATASTORE_TOKENS}")
    return ids


def passage_name(i: int) -> str:
    """The name of passage ``i`` (0-based) in the evidence: ``p1``, ``p2``, ..."""
    return f"p{i + 1}"


def build_datastore(view: Any, text: str) -> Datastore:
    """Encode the passages of ``text`` with the model of ``view``, one forward per passage (the
    datastore's keys are the last hidden states). Cached by (model, text): the same passages
    are encoded once. Forwards go to the model handle: building the index is not decoding, so
    they are reported apart (``encode_forwards``), not counted as the run's target forwards."""
    ids = check_passages(view, text)
    handle = getattr(view, "handle", view)
    key = (getattr(handle, "name", ""), id(getattr(handle, "model", handle)), hashlib.sha256(text.encode()).hexdigest())
    if key in _STORES:
        _STORES.move_to_end(key)
        return _STORES[key]
    store = Datastore(torch.zeros((0, 0)), torch.zeros(0, dtype=torch.long), [], [], {})
    forwards = tokens = 0
    for i, p in enumerate(ids):
        out = handle.forward(p, hidden_states=True, use_cache=False)
        if not out.hidden_states:
            raise PlaygroundError(f"{NAME}: model {view.name!r} returns no hidden states to build a datastore from")
        store = store.extended(passage_name(i), p, out.hidden_states[-1][0])
        forwards, tokens = forwards + 1, tokens + len(p)
    store.encode_forwards, store.encode_tokens = forwards, tokens
    _STORES[key] = store
    while len(_STORES) > _STORES_KEPT:
        _STORES.popitem(last=False)
    return store


# ---------------------------------------------------------------------- retrieval and mixture
def retrieve(store: Datastore, h: torch.Tensor, k: int, metric: str = "l2") -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest entries to the query ``h``: (indices, distances), nearest first.

    ``l2``: the squared Euclidean distance; ``ip``: the negated inner product (a larger inner
    product is nearer). Exact search over the whole store (brute force)."""
    q = h.detach().float().cpu().reshape(-1)
    if metric == "ip":
        d = -(store.keys @ q)
    else:
        d = (store.keys - q).pow(2).sum(-1)
    k = min(int(k), len(store))
    d, idx = torch.topk(d, k, largest=False)
    return idx, d


def knn_probs(store: Datastore, idx: torch.Tensor, d: torch.Tensor, temperature: float, vocab: int) -> torch.Tensor:
    """p_kNN over the vocabulary: softmax(-d / temperature) over the neighbours, summed by the
    neighbours' next tokens."""
    w = torch.softmax(-d.double() / float(temperature), -1)
    p = torch.zeros(vocab, dtype=torch.float64)
    p.scatter_add_(0, store.values[idx].clamp(max=vocab - 1), w)
    return p


def rrc_lambda(l2: torch.Tensor, alpha: float, tau: float) -> tuple[float, float]:
    """(lambda, r): the kNN weight from the relative retrieval confidence r = d_min / d_max of the
    retrieved neighbours' squared L2 distances (r near 0: the nearest is far nearer than the rest,
    a confident retrieval; near 1: all alike). The LM keeps sigmoid((r - alpha) / tau), the kNN
    distribution gets the rest."""
    dmax = float(l2.max()) if l2.numel() else 0.0
    r = float(l2.min()) / dmax if dmax > 0 else 1.0
    lm = 0.5 * (1.0 + math.tanh(0.5 * (r - alpha) / tau))  # the sigmoid, without overflow at tiny tau
    return 1.0 - lm, r


@dataclass
class Mixed:
    """The mixture at one position: p = lam p_kNN + (1 - lam) p_LM, with what went into it."""

    p: torch.Tensor          # mixture (float64, CPU)
    p_lm: torch.Tensor
    p_knn: torch.Tensor
    lam: float
    rrc: float | None
    idx: torch.Tensor        # neighbour indices, nearest first
    d: torch.Tensor          # their distances under the metric
    logits: torch.Tensor


# ---------------------------------------------------------------------- the decoder
@register
class Nest(Decoder):
    """NEST, nearest neighbour speculative decoding (Li et al. 2024).

    Implements, per step: (1) the kNN-LM mixture: the ``k`` datastore keys nearest to the
    model's last hidden state (squared L2 or inner product, brute force), p_kNN = their next
    tokens weighted by softmax(-d / ``knn_temperature``), p = lam p_kNN + (1 - lam) p_LM, with
    lam from the relative retrieval confidence (the LM keeps sigmoid((d_min/d_max - alpha)/tau),
    as the paper's released code computes it) or fixed; (2) span selection: the next token y
    is drawn from the mixture (its argmax at temperature 0) and, when lam reaches
    ``span_min_lambda``, the nearest neighbour whose next token is y proposes the
    ``span_length`` passage tokens that follow y; (3) relaxed speculative acceptance: one
    forward feeds y and the span, each span token is accepted while its mixture probability at
    its position is at least ``relax`` times that position's largest one (the released code's
    relaxed test, p(x) > c · max p with c = 0.025 there; 0.1 here), and the next token is drawn
    from the mixture after the accepted prefix. Committed tokens copied from a passage keep
    their source (passage, offset); a drawn token is attributed to the neighbour that proposes
    the next span.
    A fixed lam of 0 is greedy token for token at temperature 0 (no kNN weight, no span);
    ``relax`` 1 accepts only the mixture's argmax, so the output is the greedy kNN-LM's, in
    fewer forwards.
    Simplifies: the datastore is a few passages (at most 16, 2048 tokens) encoded with the same
    model once per run (each passage on its own, cached by content), or the prompt's own hidden
    states; no large corpus, no FAISS index, and the paper's two-stage retrieval (passages
    first, then tokens within them) is one exact token-level search; keys are the last hidden
    state, not an intermediate layer's; no masking of already-used entries and no streaming of
    a fully accepted span past the next retrieval.
    """

    name = NAME
    family = "speculative"
    step_kind = "draft"
    lossless = False
    force_mode = None
    force_refusal = "its kNN mixture re-weights the target's distribution after the model has spoken"
    shows = ("; plus `nest`: the retrieved neighbours (distance, token, passage, offset), lambda, the verified "
             "span and its accepted prefix, attribution per committed token (plots *Retrieved neighbours and "
             "span*, *NEST mixture weight and spans*)")
    reference = "Li et al. 2024, Nearest Neighbor Speculative Decoding for LLM Generation and Attribution (NeurIPS)"
    papers = (
        arxiv("Li et al. 2024, Nearest Neighbor Speculative Decoding for LLM Generation and Attribution "
              "(NEST; NeurIPS 2024)", "2405.19325"),
    )
    description = "kNN-LM mixture over a passage datastore; retrieved spans verified in one forward, with attribution"
    params = Params(
        passages=Text(DEFAULT_PASSAGES, "the datastore's passages, separated by blank lines (at most 16, "
                                        "2048 tokens in all)"),
        source=Choice("passages", SOURCES, "datastore: the passages, the prompt's own tokens, or both"),
        k=Int(8, 1, 256, "neighbours retrieved per position"),
        metric=Choice("l2", METRICS, "retrieval distance: squared L2, or negated inner product"),
        knn_temperature=Float(0.0, 0.0, 1e6, "softmax(-d / this) over the neighbours; 0 = the square root of the "
                                             "hidden size (the released code's scale)"),
        lambda_mode=Choice("rrc", LAMBDA_MODES, "kNN weight lambda: from the relative retrieval confidence, or fixed"),
        lam=Float(0.3, 0.0, 1.0, "fixed: the kNN weight lambda"),
        rrc_alpha=Float(0.1, -10.0, 10.0, "rrc: offset alpha of sigmoid((d_min/d_max - alpha) / tau), the LM's weight"),
        rrc_tau=Float(0.1, 0.001, 10.0, "rrc: scale tau of the sigmoid"),
        span_length=Int(8, 0, 32, "passage tokens proposed after the chosen neighbour's token"),
        span_min_lambda=Float(0.3, 0.0, 1.0, "propose a span (and attribute the token) only when lambda reaches this"),
        relax=Float(0.1, 0.0, 1.0, "accept a span token while p_mix(token) >= relax · max p_mix; 1 = only the argmax"),
        temperature=Float(0.0, 0.0, 10.0, "0 = the mixture's argmax; else sample from the mixture sharpened by 1/T"),
    )

    # ---------------------------------------------------------------- setup
    def setup(self, ctx: Context) -> None:
        """Check the model and knobs, build the datastore (passages part) and the cache."""
        k = ctx.params
        self.cache_info = check_rollback(self.name, ctx.target)
        self.cache = rollback_cache(ctx.target, self.cache_info)
        self.src = str(k["source"])
        if self.src in ("passages", "both"):
            self.store = build_datastore(ctx.target, str(k["passages"]))
        else:
            self.store = Datastore(torch.zeros((0, 0)), torch.zeros(0, dtype=torch.long), [], [], {})
        if self.src in ("prompt", "both") and len(ctx.prompt_ids) < 2:
            raise PlaygroundError(f"{NAME}: source={self.src} needs a prompt of at least 2 tokens for its datastore")
        self.k, self.metric = int(k["k"]), str(k["metric"])
        self.temp_knn = float(k["knn_temperature"]) or math.sqrt(float(getattr(ctx.target.config, "hidden_size", 0) or 1))
        self.fixed = None if k["lambda_mode"] == "rrc" else float(k["lam"])
        self.alpha, self.tau = float(k["rrc_alpha"]), float(k["rrc_tau"])
        self.span_len, self.span_min = int(k["span_length"]), float(k["span_min_lambda"])
        self.relax, self.temperature = float(k["relax"]), float(k["temperature"])
        self.vocab = int(ctx.target.vocab_size)

    def mixture(self, h: torch.Tensor, logits: torch.Tensor) -> Mixed:
        """The kNN-LM mixture at a position with hidden state ``h`` and LM ``logits``."""
        p_lm = torch.softmax(logits.detach().double().cpu(), -1)
        if len(self.store) == 0:
            return Mixed(p_lm, p_lm, torch.zeros_like(p_lm), 0.0, None, torch.zeros(0, dtype=torch.long),
                         torch.zeros(0), logits)
        idx, d = retrieve(self.store, h, self.k, self.metric)
        p_knn = knn_probs(self.store, idx, d, self.temp_knn, p_lm.numel())
        if self.fixed is not None:
            lam, r = self.fixed, None
        else:
            l2 = d if self.metric == "l2" else (self.store.keys[idx] - h.detach().float().cpu()).pow(2).sum(-1)
            lam, r = rrc_lambda(l2, self.alpha, self.tau)
        return Mixed(lam * p_knn + (1.0 - lam) * p_lm, p_lm, p_knn, lam, r, idx, d, logits)

    def draw(self, ctx: Context, m: Mixed, pos: int) -> tuple[int, torch.Tensor]:
        """The next token and the distribution it was drawn from: the mixture's argmax at
        temperature 0 (the mixture itself is returned, for the evidence), else a draw from
        p^(1/T) normalised."""
        if self.temperature == 0.0:
            return int(torch.argmax(m.p)), m.p.float()
        w = m.p.clamp_min(0.0).pow(1.0 / self.temperature)
        q = (w / w.sum()).float()
        return sample_index(q, ctx.uniform(pos)), q

    def propose(self, m: Mixed, y: int) -> tuple[list[int], tuple[str, int] | None, int | None]:
        """(span, source of ``y``, the neighbour's rank) for a chosen token ``y``: the passage
        tokens after the nearest neighbour whose next token is ``y`` (when lambda reaches
        ``span_min_lambda``); no span and no source otherwise."""
        if m.lam < self.span_min or m.lam <= 0.0 or not m.idx.numel():
            return [], None, None
        for rank, j in enumerate(m.idx.tolist()):
            if int(self.store.values[j]) == y:
                name, off = self.store.names[j], self.store.offsets[j]
                ids = self.store.passages[name]
                return ids[off + 1: off + 1 + self.span_len], (name, off), rank
        return [], None, None

    # ---------------------------------------------------------------- the loop
    def run(self, ctx: Context) -> Iterator[Step]:
        self.setup(ctx)
        prompt = [int(t) for t in ctx.prompt_ids]
        out: list[int] = []
        pending, span, span_src, span_rank = list(prompt), [], None, None
        y_src: tuple[str, int] | None = None
        tally = Counter()
        hist: Counter[int] = Counter()
        lams: list[float] = []
        first = True
        while len(out) < ctx.max_new_tokens:
            ctx.check_cancel()
            past = cache_len(self.cache)
            room = min(ctx.max_new_tokens - len(out) - 1, ctx.target.context_length - past - len(pending))
            span = span[:max(0, room)]
            fed = pending + span
            fwd = ctx.target.forward(fed, cache=self.cache, hidden_states=True)
            self.cache = fwd.cache
            if not fwd.hidden_states:
                raise PlaygroundError(f"{NAME}: model {ctx.target.name!r} returns no hidden states to retrieve with")
            hid, rows = fwd.hidden_states[-1][0], fwd.logits[0]
            if first and self.src in ("prompt", "both"):
                # the prompt's own positions are datastore entries: its hidden states come with this forward
                self.store = self.store.extended(PROMPT_SOURCE, prompt, hid[:len(prompt)])
            first = False
            base = len(pending) - 1
            mixes = [self.mixture(hid[base + i], rows[base + i]) for i in range(len(span) + 1)]
            accepted = 0
            nodes: list[dict[str, Any]] = []
            for i, tok in enumerate(span):
                m = mixes[i]
                top = float(m.p.max())
                ok = accepted == i and float(m.p[tok]) >= self.relax * top and float(m.p[tok]) > 0
                reached = accepted == i
                node = {"id": i, "parent": i - 1 if i else None, "token": int(tok), "q": None,
                        "p": float(f"{float(m.p[tok]):.6g}"), "accept_prob": (1.0 if ok else 0.0) if reached else None,
                        "accepted": bool(ok), "source": f"{span_src[0]}" if span_src else "datastore"}
                if ok:
                    # the verifier's own choice here was another token: a relaxed acceptance
                    node["changed"] = int(torch.argmax(m.p)) != int(tok)
                    accepted += 1
                nodes.append(node)
            m = mixes[accepted]
            pos = len(out) + accepted
            y, drawn = self.draw(ctx, m, pos)
            committed = [int(t) for t in span[:accepted]] + [y]
            attribution: list[list[Any] | None] = [[span_src[0], span_src[1] + 1 + i] if span_src else None
                                                   for i in range(accepted)]
            next_span, y_src, rank = self.propose(m, y)
            attribution.append([y_src[0], y_src[1]] if y_src else None)
            step_lams = [round(mixes[i].lam, 6) for i in range(accepted)] + [round(m.lam, 6)]
            # stop at a stop token or string inside the committed tokens
            stopped = None
            for j in range(len(committed)):
                out.append(committed[j])
                stopped = self._stopped(ctx, out)
                if stopped:
                    committed, attribution, step_lams = committed[:j + 1], attribution[:j + 1], step_lams[:j + 1]
                    break
            n_acc = min(accepted, len(committed))
            for nd in nodes[n_acc:]:
                nd["accepted"] = False  # accepted by the test, but the run stopped before it
            crop_layers(self.cache, past + len(pending) + accepted)
            tally["drafted"] += len(span)
            tally["accepted"] += n_acc
            tally["steps"] += 1
            tally["tokens"] += len(committed)
            tally["attributed"] += sum(1 for a in attribution if a)
            tally["changed"] += sum(1 for nd in nodes[:n_acc] if nd.get("changed"))
            tally["flagged"] += sum(1 for nd in nodes if "changed" in nd)
            hist[n_acc] += 1
            lams.extend(step_lams)
            ev = self._evidence(ctx, m, y, span, span_src, span_rank, accepted, mixes, attribution, step_lams,
                                next_span, y_src, rank)
            tree = {"nodes": nodes, "accepted_path": list(range(n_acc)),
                    "correction": y if len(committed) > n_acc else None,
                    "correction_kind": ("resample" if accepted < len(span) else "bonus") if len(committed) > n_acc else None}
            self.extra_stats = self._stats(tally, hist, lams)
            yield Step("draft", committed, tree=tree, root=int(pending[-1]),
                       correction_dist=dist_evidence(ctx.target, m.logits, drawn, y, min(ctx.top_k_evidence, 10)),
                       nest=ev)
            if stopped:
                self.finish_reason = stopped
                return
            pending, span, span_src, span_rank = [y], next_span, y_src, rank
        self.finish_reason = "length"

    def _stopped(self, ctx: Context, out: list[int]) -> str | None:
        """``eos``/``stop`` when the output just ended on a stop token or string."""
        if out[-1] in ctx.stop_ids:
            return "eos" if out[-1] in getattr(ctx.target, "eos_ids", set()) else "stop"
        if ctx.stop_strings:
            tail = ctx.target.decode(out[-32:])
            if any(s and s in tail for s in ctx.stop_strings):
                return "stop"
        return None

    def _neighbours(self, m: Mixed) -> list[dict[str, Any]]:
        return [{"token": int(self.store.values[j]), "d": round(float(dd), 6), "passage": self.store.names[j],
                 "offset": int(self.store.offsets[j])} for j, dd in zip(m.idx.tolist(), m.d.tolist())]

    def _evidence(self, ctx: Context, m: Mixed, y: int, span: list[int], span_src: tuple[str, int] | None,
                  span_rank: int | None, accepted: int, mixes: list[Mixed], attribution: list[Any],
                  step_lams: list[float], next_span: list[int], y_src: tuple[str, int] | None,
                  rank: int | None) -> dict[str, Any]:
        """The ``nest`` evidence of a step (see the class doc)."""
        nz = torch.nonzero(m.p_knn > 0).flatten().tolist()
        nz.sort(key=lambda t: (-float(m.p_knn[t]), t))
        ev: dict[str, Any] = {
            "lam": round(m.lam, 6), "rrc": None if m.rrc is None else round(m.rrc, 6),
            "neighbours": self._neighbours(m),
            "knn": {"ids": nz, "probs": [round(float(m.p_knn[t]), 6) for t in nz]},
            "choice": {"token": y, "p_mix": round(float(m.p[y]), 6), "p_lm": round(float(m.p_lm[y]), 6),
                       "p_knn": round(float(m.p_knn[y]), 6)},
            "span": None, "lams": step_lams, "attribution": attribution,
            "next_span": {"ids": [int(t) for t in next_span], "passage": y_src[0] if y_src else None,
                          "offset": y_src[1] + 1 if y_src else None, "neighbour": rank},
            "relax": self.relax, "span_min_lambda": self.span_min,
        }
        if span:
            ev["span"] = {"ids": [int(t) for t in span], "passage": span_src[0] if span_src else None,
                          "offset": span_src[1] + 1 if span_src else None, "neighbour": span_rank,
                          "accepted": accepted,
                          "p": [round(float(mixes[i].p[t]), 6) for i, t in enumerate(span)],
                          "max": [round(float(mixes[i].p.max()), 6) for i in range(len(span))]}
        return ev

    def _stats(self, tally: Counter, hist: Counter, lams: list[float]) -> dict[str, Any]:
        out: dict[str, Any] = {
            **speculative_figures(tally["drafted"], tally["accepted"], tally["steps"], tally["tokens"]),
            "drafted_tokens": tally["drafted"], "accepted_tokens": tally["accepted"],
            "verifications": tally["steps"],
            "accepted_length_hist": {str(k): hist[k] for k in sorted(hist)},
            "attribution_share": round(tally["attributed"] / tally["tokens"], 4) if tally["tokens"] else 0.0,
            "mean_lambda": round(sum(lams) / len(lams), 4) if lams else 0.0,
            "datastore_entries": len(self.store),
            "datastore_encode_forwards": self.store.encode_forwards,
        }
        if tally["flagged"]:  # as the steps define it: only where some node carries the flag
            out["changed_tokens"] = tally["changed"]
        return out
