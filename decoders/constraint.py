"""The constraint stage: what a decoder applies to the raw logits before its sampler chain.

One :class:`Stage` per run holds what the knobs compiled to — a grammar on llguidance (``regex``,
``json_schema`` or ``grammar``), a ``logit_bias`` vector, ``bad_words`` token sequences and the
token-healing prefix. Each hypothesis the decoder keeps (one for greedy and sampling, one per
beam, the path a speculative verification walks) gets a :class:`Row`: the grammar matcher's
state plus the tokens generated so far, which can be advanced, cloned and rolled back.

``Row.apply(logits)`` adds the bias, sets every token the constraint forbids to ``-inf`` and
returns the step's ``constraint`` evidence: how many tokens stayed allowed, the probability mass
the constraint removed (under the biased distribution) and the top allowed and blocked tokens.
EOS is allowed only where the grammar accepts; once the grammar can take no further token the
row is ``done`` and the decoder ends the run (finish reason ``constraint``).

Knob syntax. ``regex``: Rust regex syntax, matched against the whole output (``[A-Z][a-z]+\.``).
``json_schema``: a JSON Schema as text; compact JSON (no free whitespace) unless the schema's
``"x-guidance"`` says otherwise. ``grammar``: llguidance's Lark dialect, e.g.::

    start: "ROMEO: " NAME "!"
    NAME: /[a-z]+/

(rules in lower case, terminals in upper case, ``"literals"``, ``/regex/`` terminals, ``%json{...}``
to embed a JSON Schema; see https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).
``logit_bias``: ``{"token id or one-token text": bias}``; ``bad_words``: a JSON list or comma list.

``json_close`` (json_schema only; tokens, 0 = off): a lane that spends its budget inside an open
structure ends with text ``json.loads`` refuses. Once at most ``json_close`` tokens are left, the
mask keeps only tokens after which a *closing walk* reaches a state the grammar accepts within
the tokens still left (see :meth:`Row._narrow`), so the lane closes its strings, objects and
arrays in time. Simplified: the walk is greedy (forced tokens, else closing characters ``"}]``,
else the shortest JSON values, else the longest allowed token), not a shortest-path search, so
it can miss a completion that exists and narrow more than needed (what it keeps does complete);
only the ``CLOSE_CANDIDATES`` most likely allowed tokens (plus the walk's own first token and EOS
where the grammar accepts) are tried each step; and a window too short for the structure's
shortest closing still forces the walk's tokens, which gets the text closer but leaves the lane
incomplete (its stats say so). The narrowed steps record ``json_close`` evidence (tokens left,
whether the closing fits, its length, the tokens kept) and a ``json_close`` chain stage.

llguidance was chosen over xgrammar and outlines-core (see the pyproject commit): a CPU wheel
with no torch pin, regex, JSON Schema and Lark-style grammars in one engine, masks straight from
a Hugging Face fast tokenizer and matcher state that rolls back token by token.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from copy import copy
from typing import Any, Sequence

import numpy as np
import torch

from decoders.base import Bool, Int, Param, PlaygroundError, Text
from decoders.processors import gumbel_pick, stage_cut
from decoders.token_text import view_token

GRAMMAR_KNOBS = ("regex", "json_schema", "grammar")
WORD_KNOBS = ("logit_bias", "bad_words")
TOP_EVIDENCE = 5  # allowed and blocked tokens each step records
MAX_JSON_CLOSE = 256  # json_close's range: a closing window longer than any tiny-model budget is pointless
CLOSE_CANDIDATES = 8  # json_close checks this many most likely allowed tokens (each costs a closing walk)
# the closing walk's first preference: tokens made only of these characters end a string, an
# object or an array; a value position is filled by the shortest JSON values
CLOSERS = frozenset('"}]')
SHORT_VALUES = ("0", '""', "null", "[]", "{}", "true", "false", "1", "2", "3", "4", "5", "6", "7", "8", "9")
MAX_BIAS = 100.0  # OpenAI's range: -100 bans a token in practice, +100 all but forces it


def _one_line(text: str) -> str:
    """llguidance reports errors over several lines (with a caret picture); keep the gist."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip() and not set(ln.strip()) <= {"^"}]
    lines = [ln for ln in lines if not re.match(r"^\d+ \|", ln)]
    return " ".join(lines)[:300]


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - llguidance is a dependency
        raise PlaygroundError(f"constraints need the llguidance package ({e}); pip install llguidance") from None
    return llguidance


def grammar_of(knob: str, text: str) -> str:
    """The llguidance grammar a constraint knob's text compiles to (syntax not yet checked)."""
    m = _llg().LLMatcher
    if knob == "regex":
        return m.grammar_from_regex(text)
    if knob == "grammar":
        return m.grammar_from_lark(text)
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise PlaygroundError(f"knob 'json_schema' is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise PlaygroundError("knob 'json_schema' must be a JSON object (a JSON Schema)")
    try:
        # compact JSON unless the schema's own "x-guidance" says otherwise: with free whitespace a
        # small model happily spends its whole budget on spaces and newlines
        return m.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    except (ValueError, TypeError) as e:
        raise PlaygroundError(f"knob 'json_schema' is not a usable JSON Schema: {_one_line(str(e))}") from None


def check_grammar(knob: str, text: str, tokenizer: Any = None) -> str:
    """Compile and validate a constraint knob; return the grammar or raise one PlaygroundError line."""
    g = grammar_of(knob, text)
    err = _llg().LLMatcher.validate_grammar(g, tokenizer)
    if err:
        raise PlaygroundError(f"knob {knob!r} is invalid: {_one_line(err)}")
    return g


class CloseInt(Int):
    """The ``json_close`` knob: an :class:`~decoders.base.Int` that takes part in the stage's cross-check
    (``Int`` itself has no ``cross_check`` argument)."""

    def __init__(self, default: int, lo: int, hi: int, help: str = "") -> None:
        super().__init__(default, lo, hi, help)
        object.__setattr__(self, "cross_check", check_knobs)


class GrammarText(Text):
    """A constraint knob (``regex``/``json_schema``/``grammar``): its syntax is checked on validation."""

    def check(self, name: str, value: Any) -> str:
        v = super().check(name, value)
        if v.strip():
            check_grammar(name, v)
        return v


def constraint_params(words: bool = True, healing: bool = False) -> dict[str, Param]:
    """The knobs of the constraint stage, to splice into a decoder's ``Params``.

    ``words`` adds ``logit_bias`` and ``bad_words``; ``healing`` adds ``token_healing`` (only
    for decoders that generate from the prompt one token at a time).
    """
    specs: dict[str, Param] = dict(
        regex=GrammarText("", "constrain the output to match this regular expression (Rust regex syntax, "
                              "anchored at both ends); empty = off", cross_check=check_knobs),
        json_schema=GrammarText("", "constrain the output to JSON valid under this JSON Schema (as text); empty = off",
                                cross_check=check_knobs),
        grammar=GrammarText("", "constrain the output to this grammar, in llguidance's Lark syntax "
                                "(start: rule; \"literals\", /regex/ terminals, %json{...}); empty = off",
                            cross_check=check_knobs),
        json_close=CloseInt(0, 0, MAX_JSON_CLOSE,
                            "json_schema only: once this many tokens (or fewer) are left of the budget, keep only "
                            "tokens after which the JSON can still be closed in time (the rest of the budget); "
                            "0 = off"),
    )
    if words:
        specs.update(
            logit_bias=Text("", "additive bias per token: JSON object {\"token id or text\": bias}, "
                                "bias in [-100, 100]; a text key must be exactly one token", cross_check=check_knobs),
            bad_words=Text("", "never produce these (JSON list of strings, or comma-separated): each "
                               "word's token sequence, with and without a leading space, is banned",
                          cross_check=check_knobs),
        )
    if healing:
        specs["token_healing"] = Bool(False, "token healing: back the prompt up over its last token and "
                                             "make the first new token one that starts with that token's text",
                                       cross_check=check_knobs)
    return specs


def active(params: dict[str, Any]) -> bool:
    """Whether any constraint knob is set (the stage costs nothing when none is)."""
    return any(str(params.get(k) or "").strip() for k in GRAMMAR_KNOBS + WORD_KNOBS) or \
        bool(params.get("token_healing", False))


def check_knobs(decoder: str, params: dict[str, Any]) -> None:
    """Refuse knob combinations the stage cannot honour, in one line."""
    set_grammars = [k for k in GRAMMAR_KNOBS if str(params.get(k) or "").strip()]
    if len(set_grammars) > 1:
        raise PlaygroundError(f"decoder {decoder!r}: set only one of regex, json_schema, grammar "
                              f"(got {', '.join(set_grammars)})")
    close = params.get("json_close", 0) or 0
    if isinstance(close, bool) or not isinstance(close, int) or not 0 <= close <= MAX_JSON_CLOSE:
        raise PlaygroundError(f"knob 'json_close' must be an integer in [0, {MAX_JSON_CLOSE}], got {close!r}")
    if close and "json_schema" not in set_grammars:
        # the closing walk prefers JSON's closing characters: on a regex or Lark grammar it would be a guess
        raise PlaygroundError(f"decoder {decoder!r}: json_close needs json_schema (it closes a JSON structure "
                              "before the budget runs out)")
    if params.get("token_healing") and set_grammars:
        raise PlaygroundError(f"decoder {decoder!r}: token_healing cannot be combined with {set_grammars[0]} "
                              "(the healed token re-spells the prompt, which the constraint does not cover)")
    if str(params.get("logit_bias") or "").strip():
        _parse_bias_json(str(params["logit_bias"]))
    if str(params.get("bad_words") or "").strip():
        parse_words(str(params["bad_words"]))


def _parse_bias_json(text: str) -> dict[str, float]:
    try:
        obj = json.loads(text)
    except ValueError:
        raise PlaygroundError("knob 'logit_bias' must be a JSON object such as {\"the\": -5, \"42\": 3}") from None
    if not isinstance(obj, dict):
        raise PlaygroundError("knob 'logit_bias' must be a JSON object such as {\"the\": -5, \"42\": 3}")
    out: dict[str, float] = {}
    for k, v in obj.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (-MAX_BIAS <= float(v) <= MAX_BIAS):
            raise PlaygroundError(f"knob 'logit_bias': the bias of {k!r} must be a number in [-100, 100], got {v!r}")
        out[str(k)] = float(v)
    return out


def parse_words(text: str) -> list[str]:
    s = text.strip()
    if s.startswith("["):
        try:
            words = json.loads(s)
        except ValueError:
            raise PlaygroundError("knob 'bad_words' must be a JSON list of strings or a comma-separated list") from None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise PlaygroundError("knob 'bad_words' must be a JSON list of strings or a comma-separated list")
    else:
        words = s.split(",")
    words = [w.strip() for w in words if w.strip()]
    if not words:
        raise PlaygroundError("knob 'bad_words' names no word")
    return words


# ---------------------------------------------------------------------- tokenizer bridge
# llguidance tokenizers per HF tokenizer, kept beside it (not on it: an attribute would make the
# HF tokenizer impossible to deepcopy or pickle, which transformers and users do)
_LL_TOKENIZERS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_LL_LOCK = threading.Lock()


def ll_tokenizer(view: Any) -> Any:
    """The llguidance tokenizer of a model view (cached per HF tokenizer)."""
    tok = view.tokenizer
    n_vocab = int(view.vocab_size)
    eos = sorted(int(e) for e in getattr(view, "eos_ids", set()) or ())
    key = (n_vocab, tuple(eos))
    with _LL_LOCK:
        try:
            cache = _LL_TOKENIZERS.setdefault(tok, {})
        except TypeError:  # a tokenizer that cannot be weakly referenced is just not cached
            cache = {}
    if key in cache:
        return cache[key]
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise PlaygroundError(f"model {getattr(view, 'name', '?')!r} has no fast (tokenizers) tokenizer; "
                              "regex/json_schema/grammar constraints need one")
    try:
        b = copy(backend)
        b.no_padding()
        b.no_truncation()
        lt = _llg().LLTokenizer(b.to_str(), n_vocab=n_vocab, eos_token=eos or None)
    except PlaygroundError:
        raise
    except Exception as e:  # noqa: BLE001 - llguidance rejects tokenizers it cannot model
        raise PlaygroundError(f"constraints cannot use this model's tokenizer: {_one_line(str(e))}") from None
    cache[key] = lt
    return lt


def _tokens_of(view: Any, text: str) -> list[int]:
    return [int(t) for t in view.tokenizer.encode(text, add_special_tokens=False)]


# ---------------------------------------------------------------------- the stage
class Stage:
    """What the constraint knobs of one run compiled to; makes :class:`Row` states.

    ``budget`` is the run's ``max_new_tokens``: ``json_close`` counts the tokens left from it
    (a row's position is its token count), so without a budget ``json_close`` does nothing.
    """

    def __init__(self, view: Any, params: dict[str, Any], budget: int | None = None) -> None:
        self.view = view
        self.budget = int(budget) if budget is not None else None
        self.close = int(params.get("json_close", 0) or 0)
        self._closing_order: list[int] | None = None
        self._token_bytes = np.zeros(0, dtype=np.int64)  # each token's length in bytes (closing_order fills it)
        self.vocab = int(view.vocab_size)
        self.eos = sorted(int(e) for e in getattr(view, "eos_ids", set()) or ())
        self.knob = next((k for k in GRAMMAR_KNOBS if str(params.get(k) or "").strip()), None)
        self.lt = None
        self.grammar = None
        if self.knob:
            self.lt = ll_tokenizer(view)
            self.grammar = check_grammar(self.knob, str(params[self.knob]), self.lt)
        self.bias: torch.Tensor | None = None
        if str(params.get("logit_bias") or "").strip():
            self.bias = self._bias(_parse_bias_json(str(params["logit_bias"])))
        self.bad: list[list[int]] = []
        if str(params.get("bad_words") or "").strip():
            for w in parse_words(str(params["bad_words"])):
                for variant in (w, " " + w):
                    seq = _tokens_of(view, variant)
                    if seq and seq not in self.bad:
                        self.bad.append(seq)
        self.healing = bool(params.get("token_healing", False))
        self.heal_text = ""
        self.heal_mask: torch.Tensor | None = None

    def _bias(self, spec: dict[str, float]) -> torch.Tensor:
        b = torch.zeros(self.vocab, dtype=torch.float32)
        for key, value in spec.items():
            if re.fullmatch(r"\d+", key):
                tid = int(key)
                if tid >= self.vocab:
                    raise PlaygroundError(f"knob 'logit_bias': token id {tid} is outside the vocabulary (size {self.vocab})")
            else:
                ids = _tokens_of(self.view, key)
                if len(ids) != 1:
                    raise PlaygroundError(f"knob 'logit_bias': {key!r} is {len(ids)} tokens, not one; "
                                          "bias single tokens (or ban a sequence with bad_words)")
                tid = ids[0]
            b[tid] += value
        return b

    def heal(self, prompt_ids: Sequence[int]) -> list[int]:
        """The prompt the decoder should prefill: without its last token when healing is on."""
        ids = list(prompt_ids)
        if not self.healing or len(ids) < 2:
            return ids
        self.heal_text = view_token(self.view, ids[-1])
        special = set(getattr(self.view.tokenizer, "all_special_ids", []) or [])
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        for t in range(self.vocab):
            if t not in special and view_token(self.view, t).startswith(self.heal_text):
                mask[t] = True
        self.heal_mask = mask
        return ids[:-1]

    @property
    def closing(self) -> bool:
        """Whether ``json_close`` narrows the mask of this run's last steps."""
        return self.close > 0 and self.budget is not None and self.knob == "json_schema"

    def closing_order(self) -> list[int]:
        """Token ids the closing walk tries first, best first (computed once per stage).

        Tokens made only of ``"``, ``}`` and ``]`` come first, longer ones before shorter (one
        token that closes more is one step less); then the shortest JSON values (``0``, ``""``,
        ``null``, ...) for a value position the grammar leaves open.
        """
        if self._closing_order is None:
            special = set(self.eos) | set(getattr(self.view.tokenizer, "all_special_ids", []) or [])
            closers: list[tuple[int, int]] = []
            values: dict[str, int] = {}
            self._token_bytes = np.zeros(self.vocab, dtype=np.int64)
            for t in range(self.vocab):
                if t in special:
                    continue
                raw = bytes(self.lt.decode_bytes([t]))
                self._token_bytes[t] = len(raw)
                try:
                    text = raw.decode("utf-8")
                except (UnicodeDecodeError, ValueError, TypeError):
                    continue  # a partial UTF-8 byte closes nothing
                if text and set(text) <= CLOSERS:
                    closers.append((-len(text), t))
                elif text in SHORT_VALUES and text not in values:
                    values[text] = t
            self._closing_order = [t for _, t in sorted(closers)] + \
                [values[v] for v in SHORT_VALUES if v in values]
        return self._closing_order

    def row(self) -> "Row":
        """A fresh per-hypothesis state at the start of the output."""
        matcher = None
        if self.grammar is not None:
            matcher = _llg().LLMatcher(self.lt, self.grammar, log_level=0)
            if matcher.is_error():
                raise PlaygroundError(f"knob {self.knob!r} is invalid: {_one_line(matcher.get_error())}")
        return Row(self, matcher, [])


class Row:
    """One hypothesis's constraint state: the grammar matcher and the tokens generated so far."""

    def __init__(self, stage: Stage, matcher: Any, ids: list[int]) -> None:
        self.stage = stage
        self.matcher = matcher
        self.ids = ids

    # -------------------------------------------------------------- state
    def clone(self) -> "Row":
        """An independent copy (a beam that forks, a speculative path being tried)."""
        return Row(self.stage, self.matcher.deep_copy() if self.matcher is not None else None, list(self.ids))

    def advance(self, token: int) -> None:
        """Consume a committed token; one PlaygroundError line if the constraint forbids it."""
        token = int(token)
        if self.matcher is not None:
            if not self.matcher.consume_token(token):
                        # llguidance's own message is a parser dump: name the token instead
                raise PlaygroundError(f"token {token} ({view_token(self.stage.view, token)!r}) at output position "
                                      f"{len(self.ids)} is not allowed by the {self.stage.knob} constraint")
        self.ids.append(token)

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` consumed tokens."""
        if n <= 0:
            return
        n = min(n, len(self.ids))
        if self.matcher is not None and not self.matcher.rollback(n):
            raise PlaygroundError(f"constraint could not roll back {n} token(s): {_one_line(self.matcher.get_error())}")
        del self.ids[len(self.ids) - n:]

    @property
    def done(self) -> bool:
        """True when the grammar can take no further token (only EOS): the output is complete."""
        return self.matcher is not None and self.matcher.is_stopped() and not self.matcher.is_error()

    @property
    def accepting(self) -> bool:
        """True when the output so far satisfies the grammar (always, without one)."""
        return self.matcher is None or bool(self.matcher.is_accepting())

    # -------------------------------------------------------------- json_close
    def remaining(self) -> int | None:
        """Tokens left of the run's budget, the next one included (None without a budget)."""
        b = self.stage.budget
        return None if b is None else b - len(self.ids)

    def closing_walk(self, limit: int) -> list[int] | None:
        """A token path of at most ``limit`` tokens from this row's state to one the grammar
        accepts ([] when it accepts already), or None when the walk does not get there in time.

        The walk is greedy, not a shortest-path search: at each state it takes llguidance's
        forced tokens when the grammar leaves only one way on (``compute_ff_tokens``: ``"name":``
        of a required property), else the first allowed token of :meth:`Stage.closing_order`
        (closing characters, then the shortest values), else the longest allowed token (it fills a
        ``minLength`` or an enum soonest). Every token is checked by the matcher, so a path it
        returns is a real completion; one it misses may still exist.
        """
        if self.matcher is None:
            return []
        return _walk(self.stage, self.matcher.deep_copy(), limit)

    def _narrow(self, x: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any] | None]:
        """``json_close``: on the last ``json_close`` steps, the allowed tokens after which the
        JSON can still be closed within the rest of the budget (see :meth:`closing_walk`).

        Kept: EOS where the grammar accepts (the structure is complete), the first token of the
        closing walk from here when that walk fits (its tail fits from there by construction), and
        those of the :data:`CLOSE_CANDIDATES` most likely allowed tokens whose own walk fits in
        the tokens left after them. When nothing fits (the window opened too late for this
        structure) the first token of a longer walk is forced: the output gets as close to
        complete as the budget allows. Returns the mask and the step's ``json_close`` evidence
        (None on a step the knob leaves alone).
        """
        r = self.remaining()
        if not self.stage.closing or self.matcher is None or r is None or not 0 < r <= self.stage.close:
            return ok, None
        size = ok.numel()
        eos_ok = [e for e in self.stage.eos if e < size and bool(ok[e])]
        plan = self.closing_walk(r)
        q = x.float().masked_fill(~ok, float("-inf"))
        for e in eos_ok:
            q[e] = float("-inf")  # EOS is judged on its own: it fits exactly when the grammar accepts
        n_cand = min(CLOSE_CANDIDATES, int(torch.isfinite(q).sum()))
        cands = torch.topk(q, n_cand).indices.tolist() if n_cand else []
        keep: set[int] = set(eos_ok)
        if plan:
            keep.add(int(plan[0]))
        for t in cands:
            if t in keep:
                continue
            m = self.matcher.deep_copy()
            if m.consume_token(int(t)) and _walk(self.stage, m, r - 1) is not None:
                keep.add(int(t))
        fits = bool(keep)
        if not keep:
            longer = self.closing_walk(MAX_JSON_CLOSE)
            if longer:
                keep.add(int(longer[0]))
        info: dict[str, Any] = {"remaining": r, "fits": fits,
                                "closing_tokens": len(plan) if plan is not None else None}
        if not keep:  # no walk at all: leave the grammar's own mask rather than leave no token
            info["kept"] = int(ok.sum())
            return ok, info
        new = torch.zeros_like(ok)
        new[sorted(keep)] = True
        new &= ok
        info["kept"] = int(new.sum())
        return new, info

    # -------------------------------------------------------------- the mask
    def allowed(self, size: int) -> torch.Tensor:
        """Boolean mask over ``size`` token ids: which may come next."""
        ok = torch.ones(size, dtype=torch.bool)
        m = self.matcher
        if m is not None:
            if m.is_error():
                raise PlaygroundError(f"the {self.stage.knob} constraint failed: {_one_line(m.get_error())}")
            bits = _bits(m)
            n = min(size, bits.size)
            ok[:] = False
            ok[:n] = torch.from_numpy(bits[:n].astype(np.bool_))
            if not m.is_accepting():
                # llguidance offers EOS in a dead state too (an empty language); EOS is for complete text only
                for e in self.stage.eos:
                    if e < size:
                        ok[e] = False
        gen = self.ids
        for seq in self.stage.bad:
            head, last = seq[:-1], seq[-1]
            if last < size and (not head or (len(gen) >= len(head) and gen[len(gen) - len(head):] == head)):
                ok[last] = False
        if not gen and self.stage.heal_mask is not None:
            hm = self.stage.heal_mask
            ok[: hm.numel()] &= hm[:size]
        return ok

    def apply(self, logits: torch.Tensor, stages: list[dict[str, Any]] | None = None,
              noise: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Biased, masked logits (forbidden tokens ``-inf``) and the step's ``constraint`` evidence.

        With ``stages`` given, appends the bias and the mask as sampler-chain stages (the
        :func:`decoders.processors.stage_cut` evidence, ``noise`` as there), so the chain's
        stage-by-stage evidence starts from the model's own distribution.
        Raises one PlaygroundError line when the constraint leaves no token at all (an
        unsatisfiable constraint ends the run at once, never loops).
        """
        raw = x = logits.detach().float().reshape(-1)
        if self.stage.bias is not None:
            b = self.stage.bias
            x = x.clone()
            n = min(x.numel(), b.numel())
            x[:n] += b[:n].to(x.device)
        ok = self.allowed(x.numel())  # the matcher's mask is made on the CPU
        ok, closing = self._narrow(x.cpu(), ok)
        ok = ok.to(x.device)
        n_ok = int(ok.sum())
        if n_ok == 0:
            what = self.stage.knob or "bad_words/token_healing"
            raise PlaygroundError(f"the {what} constraint leaves no token of this model's vocabulary "
                                  f"after {len(self.ids)} generated token(s): it cannot be satisfied")
        masked = x.masked_fill(~ok, float("-inf"))
        if stages is not None:
            self._stages(raw, x, masked, stages, noise, closing is not None)
        ev = self.evidence(x, ok)
        if closing is not None:
            ev["json_close"] = closing
        return masked, ev

    def _stages(self, raw: torch.Tensor, biased: torch.Tensor, masked: torch.Tensor,
                stages: list[dict[str, Any]], noise: torch.Tensor | None, closing: bool = False) -> None:
        """The bias and the mask as chain stages (kept mass relative to the model's distribution)."""
        p_raw = torch.softmax(raw.float(), -1)
        steps = []
        if self.stage.bias is not None:
            steps.append(("logit_bias", raw, biased))
        what = [self.stage.knob] if self.stage.knob else []
        what += (["bad_words"] if self.stage.bad else []) + (["token_healing"] if self.stage.heal_mask is not None else [])
        what += ["json_close"] if closing else []
        steps.append((f"constraint({', '.join(what)})", biased, masked))
        pick = gumbel_pick(raw, noise) if noise is not None else None
        for name, before, after in steps:
            kept = torch.isfinite(after)
            nxt = gumbel_pick(after, noise) if noise is not None else None
            stages.append({"stage": name, "kept": int(kept.sum()), "kept_mass": round(float(p_raw[kept].sum()), 6),
                           **stage_cut(before, after, picks=None if noise is None else (pick, nxt))})
            pick = nxt

    def evidence(self, logits: torch.Tensor, ok: torch.Tensor) -> dict[str, Any]:
        """Allowed count, removed mass and the top allowed/blocked tokens under ``softmax(logits)``."""
        p = torch.softmax(logits.float(), -1)
        removed = float(p[~ok].sum())
        view = self.stage.view

        def top(sel: torch.Tensor) -> dict[str, list[Any]]:
            q = torch.where(sel, p, torch.full_like(p, -1.0))
            k = min(TOP_EVIDENCE, int(sel.sum()))
            ids = torch.topk(q, k).indices.tolist() if k else []
            return {"ids": ids, "tokens": [view_token(view, t) for t in ids],
                    "probs": [round(float(p[t]), 6) for t in ids]}

        ev: dict[str, Any] = {"allowed": int(ok.sum()), "vocab": int(ok.numel()),
                              "removed_mass": round(removed, 6), "kept_mass": round(1.0 - removed, 6),
                              "top_allowed": top(ok), "top_blocked": top(~ok)}
        if self.stage.knob:
            ev["kind"] = self.stage.knob
            ev["accepting"] = self.accepting
        if self.stage.bias is not None:
            ev["biased"] = True
        return ev


def stage_for(view: Any, params: dict[str, Any], budget: int | None = None) -> Stage | None:
    """The run's constraint stage, or None when no constraint knob is set.

    ``budget`` (the run's ``max_new_tokens``) lets ``json_close`` count the tokens left.
    """
    if not active(params):
        return None
    check_knobs("?", params)
    return Stage(view, params, budget)


def grammar_complete(view: Any, params: dict[str, Any], output_ids: Sequence[int]) -> bool | None:
    """Whether a finished output satisfies the run's grammar (``regex``/``json_schema``/``grammar``);
    None when no grammar knob is set or the output left the grammar (an error says so already).

    A lane that spends its token budget inside an unbounded piece of the grammar (a JSON integer
    under a tiny model, say) stops with ``length`` and an output the grammar does not accept yet;
    the stats say so rather than let the text pass for valid.
    """
    if not any(str(params.get(k) or "").strip() for k in GRAMMAR_KNOBS):
        return None
    row = Stage(view, params).row()
    try:
        for token in output_ids:
            row.advance(token)
    except PlaygroundError:
        return None
    return row.accepting


def _bits(matcher: Any) -> np.ndarray:
    """The matcher's next-token mask as one 0/1 byte per token id."""
    return np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")


def _walk(stage: Stage, m: Any, limit: int) -> list[int] | None:
    """:meth:`Row.closing_walk` on a matcher it may consume (a copy): the path, or None."""
    path: list[int] = []
    order = stage.closing_order()
    while not m.is_accepting():
        if len(path) >= limit or m.is_error() or m.is_stopped():
            return None
        forced = [int(t) for t in m.compute_ff_tokens()]
        if forced:
            # the grammar leaves one way on: take it whole (each forced token still counts)
            for t in forced:
                if len(path) >= limit or not m.consume_token(t):
                    return None
                path.append(t)
            continue
        bits = _bits(m)
        n = min(stage.vocab, bits.size)
        eos = set(stage.eos)
        pick = next((t for t in order if t < n and bits[t]), None)
        if pick is None:
            ids = np.array([t for t in np.flatnonzero(bits[:n]) if int(t) not in eos], dtype=np.int64)
            if not ids.size:
                return None
            # the longest allowed token (lowest id on ties): an enum's word or a minLength
            # string's filler, soonest
            pick = int(ids[int(np.argmax(stage._token_bytes[ids]))])
        if not m.consume_token(pick):
            return None
        path.append(pick)
    return path


# ---------------------------------------------------------------------- many rows (beam search)
def mask_rows(rows: Sequence[Row], scores: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """Constrain a (rows, V) score matrix row by row; the evidence is row 0's (the best beam).

    A row the constraint leaves no token (or whose matcher broke on a token a dead beam was
    handed) gets ``-inf`` everywhere: that beam dies. Only when every row is dead is it one
    PlaygroundError line.
    """
    out = torch.full_like(scores, float("-inf"))
    ev: dict[str, Any] | None = None
    first_error: PlaygroundError | None = None
    for i, r in enumerate(rows):
        try:
            masked, e = r.apply(scores[i])
        except PlaygroundError as err:
            first_error = first_error or err
            continue
        out[i] = masked.to(out.dtype)
        if ev is None:
            ev = e
    if ev is None:
        raise first_error or PlaygroundError("the constraint leaves no token for any beam")
    return out, ev


def follow_rows(rows: Sequence[Row], parents: Sequence[int], tokens: Sequence[int],
                stepped: Sequence[bool]) -> list[Row]:
    """The rows after a beam step: row ``i`` becomes a copy of ``rows[parents[i]]`` advanced by
    ``tokens[i]`` (rows whose group did not step stay as they are). A token the constraint forbids
    (handed to a dead beam by the top-k) leaves that row broken, i.e. dead at the next mask."""
    new: list[Row] = []
    for i, (par, tok) in enumerate(zip(parents, tokens)):
        if not stepped[i]:
            new.append(rows[i])
            continue
        r = rows[par].clone()
        try:
            r.advance(tok)
        except PlaygroundError:
            pass  # the matcher is now in its error state: the beam is dead
        new.append(r)
    return new
