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

from decoders.base import Bool, Param, PlaygroundError, Text
from decoders.processors import gumbel_pick, stage_cut
from decoders.token_text import view_token

GRAMMAR_KNOBS = ("regex", "json_schema", "grammar")
WORD_KNOBS = ("logit_bias", "bad_words")
TOP_EVIDENCE = 5  # allowed and blocked tokens each step records
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
    """What the constraint knobs of one run compiled to; makes :class:`Row` states."""

    def __init__(self, view: Any, params: dict[str, Any]) -> None:
        self.view = view
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

    # -------------------------------------------------------------- the mask
    def allowed(self, size: int) -> torch.Tensor:
        """Boolean mask over ``size`` token ids: which may come next."""
        ok = torch.ones(size, dtype=torch.bool)
        m = self.matcher
        if m is not None:
            if m.is_error():
                raise PlaygroundError(f"the {self.stage.knob} constraint failed: {_one_line(m.get_error())}")
            bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
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
        ok = self.allowed(x.numel()).to(x.device)  # the matcher's mask is made on the CPU
        n_ok = int(ok.sum())
        if n_ok == 0:
            what = self.stage.knob or "bad_words/token_healing"
            raise PlaygroundError(f"the {what} constraint leaves no token of this model's vocabulary "
                                  f"after {len(self.ids)} generated token(s): it cannot be satisfied")
        masked = x.masked_fill(~ok, float("-inf"))
        if stages is not None:
            self._stages(raw, x, masked, stages, noise)
        return masked, self.evidence(x, ok)

    def _stages(self, raw: torch.Tensor, biased: torch.Tensor, masked: torch.Tensor,
                stages: list[dict[str, Any]], noise: torch.Tensor | None) -> None:
        """The bias and the mask as chain stages (kept mass relative to the model's distribution)."""
        p_raw = torch.softmax(raw.float(), -1)
        steps = []
        if self.stage.bias is not None:
            steps.append(("logit_bias", raw, biased))
        what = [self.stage.knob] if self.stage.knob else []
        what += (["bad_words"] if self.stage.bad else []) + (["token_healing"] if self.stage.heal_mask is not None else [])
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


def stage_for(view: Any, params: dict[str, Any]) -> Stage | None:
    """The run's constraint stage, or None when no constraint knob is set."""
    if not active(params):
        return None
    check_knobs("?", params)
    return Stage(view, params)


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
