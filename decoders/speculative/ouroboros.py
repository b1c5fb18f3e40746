"""Ouroboros: a draft model's drafts lengthened by phrases from a candidate pool that the
target's own verification passes fill (Zhao et al. 2024), as ``ouroboros``."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import torch

from decoders.base import Choice, Context, Int, register
from decoders.citation import arxiv
from decoders.draft_state import DraftState
from decoders.draft_tree import ROOT, SpecDecoder, SpecParams, Tree, Verified, rule_params, sampling_params
from decoders.speculative._chain import draft_chain
from decoders.speculative.draft_model import check_draft, check_draft_context
from playground.core.trace import Step

MODEL = "draft-model"  # the tree source of the draft model's tokens (as ``speculative`` names them)
POOL = "pool"  # ... and of the phrase pool's
ORIGINS = ("all", "text", "verify")
MAX_SHOWN = 32  # phrases a step's evidence lists (``added_count`` counts them all)


class PhrasePool:
    """Phrases keyed by the tokens just before them, least recently used evicted past ``cap``.

    A key holds one phrase (and where it came from: ``text`` or ``verify``). A new phrase
    for a key replaces the old one unless it is a prefix of it (the old one then says the
    same and more, and stays); either way the key becomes the most recently used, as it
    does when a lookup hits it.
    """

    def __init__(self, cap: int) -> None:
        self.cap = int(cap)
        self.items: OrderedDict[tuple[int, ...], tuple[tuple[int, ...], str]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, key: Sequence[int], phrase: Sequence[int], origin: str) -> bool:
        """Store ``phrase`` after ``key``; True when the pool's contents changed."""
        k, p = tuple(int(t) for t in key), tuple(int(t) for t in phrase)
        old = self.items.get(k)
        changed = old is None or old[0][:len(p)] != p
        if changed:
            self.items[k] = (p, origin)
        self.items.move_to_end(k)
        while len(self.items) > self.cap:
            self.items.popitem(last=False)
            self.evicted += 1
        return changed

    def get(self, key: Sequence[int]) -> tuple[tuple[int, ...], str] | None:
        """The phrase stored after ``key`` and its origin (None: a miss)."""
        k = tuple(int(t) for t in key)
        hit = self.items.get(k)
        if hit is not None:
            self.items.move_to_end(k)
        return hit


def text_phrases(seq: Sequence[int], start: int, key_len: int, phrase_len: int) -> list[tuple[list[int], list[int]]]:
    """(key, phrase) for every complete phrase of ``seq`` starting at ``start`` or later: the
    ``key_len`` tokens before position i and the ``phrase_len`` tokens from i."""
    out = []
    for i in range(max(start, key_len), len(seq) - phrase_len + 1):
        out.append((list(seq[i - key_len:i]), list(seq[i:i + phrase_len])))
    return out


def verify_phrases(context: Sequence[int], drafted: Sequence[int], target_next: Sequence[int], first: int,
                   key_len: int, phrase_len: int) -> list[tuple[list[int], list[int]]]:
    """The target's continuations of a verified chain past its accepted prefix.

    ``drafted`` is the chain fed after ``context``, ``target_next[j]`` the target's argmax
    after drafted token j. For every drafted token j from ``first`` (the first one not
    accepted) the target's next token after it starts a phrase, which goes on with the
    target's argmax after token j + 1 as long as drafted token j + 1 is the token the phrase
    just predicted (the target has then read the phrase itself), up to ``phrase_len``. The
    key is the ``key_len`` tokens ending at drafted token j.
    """
    seq = list(context) + list(drafted)
    base = len(context)
    out = []
    for j in range(first, len(drafted)):
        if base + j + 1 < key_len:
            continue
        phrase, t = [int(target_next[j])], j
        while len(phrase) < phrase_len and t + 1 < len(drafted) and int(drafted[t + 1]) == phrase[-1]:
            t += 1
            phrase.append(int(target_next[t]))
        out.append((seq[base + j + 1 - key_len:base + j + 1], phrase))
    return out


@register
class Ouroboros(SpecDecoder):
    """Ouroboros (Zhao et al. 2024): speculative decoding whose drafts a phrase pool lengthens.

    Implements: a candidate pool maps the ``key_len`` tokens before a phrase to a phrase of
    up to ``phrase_len`` tokens. It is filled from the prompt and the committed text (each
    complete phrase, ``text``), and from every verification pass (``verify``): past the
    accepted prefix, the target's argmax after each drafted token starts a phrase keyed by
    the drafted tokens ending there, continued while the draft went on with the token the
    target predicted (:func:`verify_phrases`) — the target's corrections of the rejected
    part of a draft, which a plain speculative step throws away. Each step the draft model
    drafts ``gamma`` tokens (``speculative``'s chain, with its sampling chain and draft
    stream); then up to ``phrases`` times the pool is looked up with the last ``key_len``
    tokens of the draft and, on a hit, the phrase is appended (so one phrase can lead to the
    next), at no draft-model cost. The target verifies the whole chain in one pass with the
    shared acceptance rule: at temperature 0 a token is accepted iff it is the target's
    argmax (greedy's output); above, the draft model's tokens are tested against their q
    and the pool's as deterministic proposals (q = one-hot, accepted with probability
    p(x)), which keeps the target's distribution, since what the pool holds and which phrase
    is appended depend only on earlier passes and on tokens already drafted. The pool keeps
    at most ``pool_size`` keys, least recently used first out.
    Evidence per step (``ouroboros``): the tokens from each source, every lookup (key, hit,
    phrase, tokens used), accepted tokens by source, the pool's size before and after, the
    phrases added and the keys evicted; the tree's nodes carry their source.
    Simplifies: the paper also has the small model draft whole phrases in parallel and
    shares the pool across requests; here the draft model drafts token by token, the pool
    only appends after it, and each run starts from an empty pool. Which verified positions
    give phrases, how they are keyed (one phrase per key: the newest, unless it is a prefix
    of the one held; an exact key of fixed length) and the text harvest are this project's.
    """

    name = "ouroboros"
    needs_draft = True
    lossless = True
    shows = ("; plus `ouroboros` per step: each draft token's source (draft model or pool phrase), the pool "
             "lookups with hit or miss, accepted tokens by source, the pool's size and the phrases added "
             "(step plot *Phrase-extended draft*, run plot *Phrase pool over the run*)")
    reference = ("Zhao et al. 2024, Ouroboros: Generating Longer Drafts Phrase by Phrase for Faster Speculative "
                 "Decoding (arXiv:2402.13720)")
    papers = (
        arxiv("Zhao et al. 2024, Ouroboros: Generating Longer Drafts Phrase by Phrase for Faster "
              "Speculative Decoding", "2402.13720"),
    )
    description = ("Speculative decoding whose drafts are lengthened by phrases from a pool filled by the "
                   "target's own verification passes")
    params = SpecParams(
        gamma=Int(4, 1, 32, "tokens the draft model drafts per step (γ), before any pool phrase"),
        phrases=Int(2, 0, 8, "most pool phrases appended after the draft model's tokens, one after another "
                             "(0 = plain speculative decoding)"),
        phrase_len=Int(4, 1, 16, "longest phrase the pool stores (tokens)"),
        key_len=Int(2, 1, 4, "tokens before a phrase that key it: the draft's last key_len tokens are looked up"),
        pool_size=Int(1024, 1, 65536, "most keys the pool keeps; the least recently used is evicted first"),
        pool_from=Choice("all", ORIGINS, "what fills the pool: all, text (prompt and committed text) or verify "
                                         "(the target's predictions on drafts it did not accept)"),
        **rule_params(), **sampling_params(0.0))

    def setup(self, ctx: Context) -> None:
        check_draft_context(ctx)
        self.d = DraftState(ctx.draft, check_draft(self.name, ctx))
        k = ctx.params
        self.key_len, self.phrase_len = int(k["key_len"]), int(k["phrase_len"])
        self.pool = PhrasePool(int(k["pool_size"]))
        self.from_text = k["pool_from"] in ("all", "text")
        self.from_verify = k["pool_from"] in ("all", "verify")
        self.text_done = 0  # phrases of the committed text before this position are in the pool
        self.lookups = self.hits = self.pool_drafted = self.pool_accepted = 0
        # phrases added since the last step was recorded (the first step's include the prompt's)
        self.added: list[dict[str, Any]] = []
        self.n_added = self.evicted_seen = 0
        self._harvest_text()
        self.round: dict[str, Any] = {}

    def _add(self, key: list[int], phrase: list[int], origin: str) -> None:
        if self.pool.add(key, phrase, origin):
            self.n_added += 1
            if len(self.added) < MAX_SHOWN:
                self.added.append({"key": key, "phrase": phrase, "from": origin})

    def _harvest_text(self) -> None:
        if not self.from_text:
            return
        seq = self.committed_ids
        for key, phrase in text_phrases(seq, self.text_done, self.key_len, self.phrase_len):
            self._add(key, phrase, "text")
        self.text_done = max(self.text_done, len(seq) - self.phrase_len + 1)

    def draft(self, ctx: Context, max_depth: int) -> Tree:
        gamma = min(int(ctx.params["gamma"]), max_depth)
        tree = draft_chain(self, ctx, self.d, gamma).tree
        lookups: list[dict[str, Any]] = []
        self.round = {"pool_size": len(self.pool), "lookups": lookups}
        tail = self.committed_ids + tree.tokens
        for _ in range(int(ctx.params["phrases"])):
            room = max_depth - len(tree)
            if room <= 0:
                break
            key = tail[-self.key_len:]
            found = self.pool.get(key)
            self.lookups += 1
            entry: dict[str, Any] = {"key": key, "hit": found is not None}
            lookups.append(entry)
            if found is None:
                break
            self.hits += 1
            phrase, origin = found
            used = list(phrase[:room])
            entry.update(phrase=list(phrase), used=len(used), **{"from": origin})
            # no dists entry under the phrase's parents: verification treats them as point masses
            parent = len(tree) - 1 if len(tree) else ROOT
            for t in used:
                parent = tree.add(t, parent, None, POOL)
            tail += used
        return tree

    def after_verify(self, ctx: Context, v: Verified) -> None:
        tree = v.tree  # as verified: the loop may have cut the draft to the context's room
        drafted = {MODEL: tree.sources.count(MODEL), POOL: tree.sources.count(POOL)}
        accepted = {MODEL: 0, POOL: 0}
        for i in v.path:
            accepted[tree.sources[i]] += 1
        self.pool_drafted += drafted[POOL]
        self.pool_accepted += accepted[POOL]
        if self.from_verify and len(v.path) < len(tree):
            # the tree is a chain: node j's row holds the target's prediction after drafted token j
            rows = v.rows[v.n_pending:v.n_pending + len(tree)]
            target_next = torch.argmax(rows, -1).tolist()
            before = self.prompt + self.out[:len(self.out) - len(v.committed)]
            for key, phrase in verify_phrases(before, tree.tokens, target_next, len(v.path),
                                              self.key_len, self.phrase_len):
                self._add(key, phrase, "verify")
        self._harvest_text()
        self.round.update(drafted=drafted, accepted=accepted)

    def make_step(self, ctx: Context, v: Verified) -> Step:
        step = super().make_step(ctx, v)
        r = self.round
        drafted = r.get("drafted", {})
        step.evidence["ouroboros"] = {
            "model_tokens": drafted.get(MODEL, 0), "pool_tokens": drafted.get(POOL, 0),
            "lookups": r.get("lookups", []), "hit": any(x["hit"] for x in r.get("lookups", [])),
            "accepted": r.get("accepted", {}), "pool_size": r.get("pool_size", 0),
            "pool_size_after": len(self.pool), "added": self.added, "added_count": self.n_added,
            "evicted": self.pool.evicted - self.evicted_seen,
        }
        self.added, self.n_added, self.evicted_seen = [], 0, self.pool.evicted
        self.extra_stats.update(
            pool_lookups=self.lookups, pool_hits=self.hits,
            pool_hit_rate=round(self.hits / self.lookups, 4) if self.lookups else 0.0,
            pool_tokens_drafted=self.pool_drafted, pool_tokens_accepted=self.pool_accepted,
            pool_size=len(self.pool))
        return step
