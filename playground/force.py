"""Forced tokens: a run told to emit given tokens at given output positions.

A *force* is a list of ``[position, token_id]`` pairs, the position counted in generated tokens
from 0. It is how a counterfactual branch continues a lane from an edited prefix
(``playground.generate(..., force=[[5, 1234]])``, ``playground generate --force 5:1234``).

Two ways to honour it, chosen per decoder (:func:`force_mode`):

* ``loop``: decoders built on :func:`decoders.ar.token_loop` (greedy, the sampling family, most
  of the contrastive family). The loop still asks the decoder's rule for its pick, records the
  step's real distribution, and commits the forced token instead; the step says
  ``forced: [{"position", "token", "picked"}]``. Forcing the token the rule picked anyway
  changes nothing but that marker.
* ``view``: decoders that verify or search (speculative, search). The target's logits that
  predict a forced position are replaced by a point mass on the forced token
  (:class:`ForcedView`), so a lossless speculative decoder returns exactly what greedy returns
  with the same force, and every beam or sample takes the forced token there. The recorder
  marks the step that committed the position.

Decoders whose order of commitment is not left to right (diffusion), or that re-rank candidates
after the model has spoken (contrastive search, look-back), are refused with one line.

Nothing here lists decoders: a family declares its decoders' mode (and why it refuses) with
:func:`decoders.base.declare_family`, and a decoder that differs from its family sets the class
attributes ``force_mode`` and ``force_refusal``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Sequence

import torch

from decoders.base import FORCE_MODES, FROM_FAMILY, family_of
from playground.core.errors import PlaygroundError

# Mass given to the tokens a forced row rules out: finite, so log-softmax and beam scores stay
# finite (no NaN from -inf - -inf), yet far enough below that no noise or penalty revives them.
_RULED_OUT = -1.0e4

_PAIR = re.compile(r"\s*(\d+)\s*:\s*(\d+)\s*")


def force_mode(decoder_cls: Any) -> str:
    """``"loop"`` or ``"view"`` for a decoder class that can take forced tokens; else
    :class:`PlaygroundError` with one line saying why not.

    The class's own ``force_mode``/``force_refusal`` attributes decide when it sets them;
    otherwise its family's declaration (:func:`decoders.base.family_of`) does.
    """
    name = getattr(decoder_cls, "name", "?")
    family = family_of(getattr(decoder_cls, "family", "") or "?")
    mode = getattr(decoder_cls, "force_mode", FROM_FAMILY)
    why = getattr(decoder_cls, "force_refusal", "")
    if mode == FROM_FAMILY:
        mode, why = family.force_mode, why or family.force_refusal
    if mode not in FORCE_MODES:
        why = why or family.force_refusal or "it does not declare how to honour them (force_mode)"
        raise PlaygroundError(f"decoder {name!r} cannot take forced tokens: {why}")
    return mode


def parse_force(value: Any) -> dict[int, int]:
    """Forced tokens as ``{position: token_id}`` from a list of ``[position, token_id]`` pairs,
    ``"5:1234"`` strings, a dict, or JSON text of any of these. None or empty -> ``{}``."""
    if value is None or value == "" or value == [] or value == {}:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{")):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise PlaygroundError(f"force is not valid JSON: {e.msg}") from None
        else:
            value = [p for p in re.split(r"[,\s]+", text) if p]
    pairs: list[Any] = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, (list, tuple)):
        raise PlaygroundError(f"force must be a list of [position, token_id] pairs, got {type(value).__name__}")
    out: dict[int, int] = {}
    for raw in pairs:
        pos, tok = _pair(raw)
        if out.get(pos, tok) != tok:
            raise PlaygroundError(f"force gives two tokens for position {pos}")
        out[pos] = tok
    return dict(sorted(out.items()))


def _pair(raw: Any) -> tuple[int, int]:
    if isinstance(raw, str):
        m = _PAIR.fullmatch(raw)
        if not m:
            raise PlaygroundError(f"a forced token is POSITION:TOKEN_ID (e.g. 5:1234), got {raw!r}")
        return int(m.group(1)), int(m.group(2))
    if not isinstance(raw, (list, tuple)) or len(raw) != 2:
        raise PlaygroundError(f"a forced token is a [position, token_id] pair, got {raw!r}")
    vals = []
    for what, v in zip(("position", "token id"), raw):
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise PlaygroundError(f"a forced {what} must be a whole number, got {v!r}")
        try:
            f = float(v)
        except ValueError:
            raise PlaygroundError(f"a forced {what} must be a whole number, got {v!r}") from None
        if not f.is_integer() or f < 0:
            raise PlaygroundError(f"a forced {what} must be a whole number >= 0, got {v!r}")
        vals.append(int(f))
    return vals[0], vals[1]


def check_force(force: dict[int, int], max_new_tokens: int, vocab_size: int) -> None:
    """Refuse a forced position past ``max_new_tokens`` or a token id outside the vocabulary."""
    for pos, tok in force.items():
        if pos >= max_new_tokens:
            raise PlaygroundError(f"forced position {pos} is past max_new_tokens={max_new_tokens} "
                                  "(positions count generated tokens from 0)")
        if tok >= vocab_size:
            raise PlaygroundError(f"forced token id {tok} is outside the vocabulary (size {vocab_size})")


def as_pairs(force: dict[int, int]) -> list[list[int]]:
    """The JSON form kept in a trace: ``[[position, token_id], ...]`` by position."""
    return [[int(p), int(t)] for p, t in sorted(force.items())]


class ForcedView:
    """A model view whose logits predicting a forced position are a point mass on the forced token.

    Everything else (counts, tokenizer, cache helpers) is the wrapped view's, so forward counts
    stay measured. Early exits (``num_layers``, a self-speculative draft) are left alone: a
    draft may propose anything, the verification decides.
    """

    def __init__(self, view: Any, prompt_len: int, force: dict[int, int]) -> None:
        self.view, self.prompt_len, self.force = view, int(prompt_len), dict(force)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)

    def forward(self, ids: Any, cache: Any = None, **kw: Any) -> Any:
        """The wrapped forward; rows predicting a forced position are rewritten."""
        past = _cache_len(cache)
        out = self.view.forward(ids, cache=cache, **kw)
        if kw.get("num_layers") is not None and kw["num_layers"] < getattr(self.view, "num_layers", 1 << 30):
            return out
        logits = out.logits
        b, t = logits.shape[0], logits.shape[1]
        pos = kw.get("position_ids")
        if pos is None:
            pos = torch.arange(past, past + t).expand(b, t)
        else:
            pos = pos.reshape(-1, pos.shape[-1]).expand(b, t).cpu()
        # the logits at sequence position q predict the token at q + 1
        gen = pos + 1 - self.prompt_len
        hits = [(p, tok, (gen == p).to(logits.device)) for p, tok in self.force.items()]
        hits = [h for h in hits if bool(h[2].any())]
        if not hits:
            return out
        # the model ran under inference mode: rewrite a copy
        logits = logits.clone()
        for _p, tok, hit in hits:
            row = torch.full((logits.shape[-1],), _RULED_OUT, dtype=logits.dtype, device=logits.device)
            row[tok] = 0.0
            logits[hit] = row
        return dataclasses.replace(out, logits=logits) if dataclasses.is_dataclass(out) else out._replace(logits=logits)


def _cache_len(cache: Any) -> int:
    if cache is None:
        return 0
    get = getattr(cache, "get_seq_length", None)
    return int(get()) if callable(get) else 0


def attach(run: Any, force: dict[int, int], mode: str) -> Any:
    """Make a prepared :class:`~playground.engine.Run` honour ``force``; return it.

    Records the force in the trace (``force``: ``[[position, token_id], ...]``) and hands it to
    the recorder, which marks the step that committed each forced position.
    """
    if not force:
        return run
    ctx = run.ctx
    check_force(force, ctx.max_new_tokens, int(ctx.target.vocab_size))
    if mode == "view":
        # a lossy acceptance rule may accept a drafted token the forced row rules out (a decoder
        # lossy for another reason, as spec_contrastive's contrast, verifies strictly against the forced row)
        if (run.decoder.family == "speculative" and str(ctx.params.get("accept", "strict")) != "strict"
                and run.decoder.is_lossy(ctx.params)):
            raise PlaygroundError(f"decoder {run.decoder.name!r} with a lossy acceptance rule cannot take "
                                  "forced tokens (use accept=strict)")
        ctx.target = ForcedView(ctx.target, len(ctx.prompt_ids), force)
    else:
        ctx.force = dict(force)
    run.trace.extra["force"] = as_pairs(force)
    run.recorder.force = dict(force)
    return run


def forced_positions(trace: dict[str, Any]) -> dict[int, int]:
    """``{position: token_id}`` of a trace dict's forced tokens (empty for an unforced run)."""
    pairs: Sequence[Any] = trace.get("force") or []
    return {int(p): int(t) for p, t in pairs}
