"""The green-list watermark of Kirchenbauer et al. 2023, as transformers implements it.

A watermark settings tuple (:class:`WatermarkScheme`: gamma, delta, hash key, seeding
scheme, context width) picks, before every token, a pseudo-random "green list" of
``int(V * gamma)`` token ids from the tokens before it; the ``watermark`` decoder adds
``delta`` to the green tokens' logits after its sampler chain (transformers applies its
``WatermarkLogitsProcessor`` after every other processor, too) and draws. The detector
counts how many scored tokens fall in their green list and reports the z-score of that
count against the ``gamma`` expected of text written without the key.

The green lists are bit-for-bit those of transformers' ``WatermarkLogitsProcessor`` (same
``torch.Generator`` seeding on the CPU, same ``randperm``, same ``selfhash`` table and int64
arithmetic), so transformers' ``WatermarkDetector`` detects our text and :func:`detect`
detects theirs (``tests/test_watermark.py`` checks both). Green lists are drawn on the CPU
whatever the model's device: transformers draws them on the model's device, so text it
watermarked on a GPU has other green lists than the same settings give on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator, Sequence

import torch

from decoders.ar import token_loop
from decoders.base import Choice, Context, Float, Int, lens_param, register
from decoders.citation import arxiv
from decoders.constraint import constraint_params
from decoders.processors import ChainParams, History, Processor, build_chain, chain_params
from decoders.sampling import ChainDecoder, add_chain_evidence, chain_picker, coupling_param
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.core.trace import Step, p_value, z_score  # the figures' one definition

DEFAULT_KEY = 15485863  # transformers' default hashing key (the millionth prime)
TABLE_SIZE = 1_000_003  # transformers' selfhash lookup table
SCHEMES = ("lefthash", "selfhash")
SELFHASH_CANDIDATES = 40  # transformers (after the paper's repository) tests the top 40 only
MAX_KEY = 2**63 - 1
# Said wherever the detector is asked about no text: the page and the CLI each name their own
# input (the CLI's --text/--text-file line is its own, in playground/watermark_cli.py).
EMPTY_TEXT = "there is no text to check: paste the text (or take a lane's output) and detect again"


@lru_cache(maxsize=4)
def _fixed_table(key: int) -> torch.Tensor:
    """transformers' selfhash table: a permutation of 0..TABLE_SIZE-1 seeded by the key."""
    g = torch.Generator(device="cpu")
    g.manual_seed(key)
    return torch.randperm(TABLE_SIZE, generator=g)


# Green lists repeat (the same previous token, the same candidate); a big vocabulary's list is
# ~V/4 int64s, so the cache stays small.
@lru_cache(maxsize=64)
def _greenlist(seed: int, vocab_size: int, size: int) -> torch.Tensor:
    """The first ``size`` ids of ``randperm(vocab_size)`` under a generator seeded ``seed``."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return torch.randperm(vocab_size, generator=g)[:size]


@dataclass(frozen=True)
class WatermarkScheme:
    """One watermark's settings, with transformers' ``WatermarkingConfig`` meanings.

    ``gamma`` is transformers' ``greenlist_ratio``, ``delta`` its ``bias``, ``key`` its
    ``hashing_key``, ``seeding`` its ``seeding_scheme`` and ``context_width`` its
    ``context_width``; ``vocab_size`` must be the model config's (transformers seeds its
    permutation with ``config.vocab_size``, not the logits' width).
    """

    vocab_size: int
    gamma: float = 0.25
    delta: float = 2.0
    key: int = DEFAULT_KEY
    seeding: str = "lefthash"
    context_width: int = 1

    def __post_init__(self) -> None:
        if self.seeding not in SCHEMES:
            raise PlaygroundError(f"watermark seeding {self.seeding!r} is not one of: {', '.join(SCHEMES)}")
        if not 0.0 < self.gamma < 1.0:
            raise PlaygroundError(f"watermark gamma={self.gamma:g} must be strictly between 0 and 1")
        if self.vocab_size < 2 or int(self.vocab_size * self.gamma) < 1:
            raise PlaygroundError(f"watermark gamma={self.gamma:g} leaves no green token in a vocabulary "
                                  f"of {self.vocab_size}")
        if not 0 <= self.key <= MAX_KEY:
            raise PlaygroundError(f"watermark key must be in [0, {MAX_KEY}]")
        if self.context_width < 1:
            raise PlaygroundError("watermark context width must be at least 1")

    @property
    def greenlist_size(self) -> int:
        """Green tokens per list: ``int(vocab_size * gamma)``, as transformers rounds it."""
        return int(self.vocab_size * self.gamma)

    @property
    def min_context(self) -> int:
        """Tokens a token needs before it (itself excluded) to have a green list."""
        return self.context_width - (1 if self.seeding == "selfhash" else 0)

    def seed(self, prefix: Sequence[int]) -> int:
        """The generator seed for the tokens ``prefix`` ends with (transformers' ``set_seed``).

        For ``selfhash`` the prefix ends with the token being tested; ``lefthash`` uses only
        the last token, whatever the context width (as transformers does).
        """
        if self.seeding == "selfhash":
            seq = torch.tensor(list(prefix[-self.context_width:]), dtype=torch.long)
            table = _fixed_table(self.key)
            a = table[seq % TABLE_SIZE] + 1
            b = table[seq[-1] % TABLE_SIZE] + 1
            # int64 products wrap around exactly as in transformers; the modulo is Python's
            s = int((self.key * a * b).min().item())
        else:
            s = self.key * int(prefix[-1])
        return s % (2**64 - 1)

    def greenlist(self, prefix: Sequence[int]) -> torch.Tensor:
        """The green token ids after ``prefix`` (selfhash: ``prefix`` ends with the candidate)."""
        if not prefix:
            raise PlaygroundError("a green list needs at least one token before it")
        return _greenlist(self.seed(prefix), self.vocab_size, self.greenlist_size)

    def is_green(self, context: Sequence[int], token: int) -> bool:
        """Whether ``token`` after ``context`` is green (the detector's rule)."""
        prefix = list(context) + [int(token)] if self.seeding == "selfhash" else list(context)
        return bool((self.greenlist(prefix) == int(token)).any())

    def green_ids(self, context: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """The ids that get ``delta`` at the next position (transformers' processor's choice):
        the green list after ``context`` (lefthash), or among the 40 best-scored tokens those
        green under their own seeding (selfhash)."""
        if self.seeding == "lefthash":
            ids = self.greenlist(context)
        else:
            _, order = logits.sort(dim=-1, descending=True)
            picked = [int(t) for t in order[:SELFHASH_CANDIDATES].tolist()
                      if bool((self.greenlist(list(context) + [int(t)]) == int(t)).any())]
            ids = torch.tensor(picked, dtype=torch.long)
        return ids[ids < logits.numel()]


def vocab_size_of(view: Any) -> int:
    """The vocabulary size transformers seeds green lists with: the (text) config's."""
    cfg = getattr(view, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    v = getattr(cfg, "vocab_size", None)
    return int(v) if isinstance(v, int) and v > 0 else int(view.vocab_size)


# ---------------------------------------------------------------------- generation
class WatermarkStage(Processor):
    """The chain's last stage: ``delta`` added to the green tokens' logits.

    Keeps, for the evidence, the green ids and the green mass before and after the bias.
    """

    item = "watermark"

    def __init__(self, scheme: WatermarkScheme) -> None:
        self.gamma, self.delta = scheme.gamma, scheme.delta
        self.seeding, self.context_width = scheme.seeding, scheme.context_width
        self._scheme = scheme
        self._last: dict[str, Any] = {}

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        ids = list(h.ids)
        if len(ids) < max(self._scheme.context_width, 1):
            # transformers skips seeding until the context is wide enough; so do we
            self._last = {"skipped": True}
            return logits
        green = self._scheme.green_ids(ids, logits)
        out = logits.clone()
        out[green] = out[green] + self.delta
        before, after = torch.softmax(logits.float(), -1), torch.softmax(out.float(), -1)
        self._last = {"green_mass": float(before[green].sum()), "green_mass_biased": float(after[green].sum()),
                      "green_count": int(green.numel())}
        return out

    @property
    def last(self) -> dict[str, Any]:
        """Evidence of the latest call: green mass before/after the bias (or ``skipped``)."""
        return self._last


def _wm_params() -> dict[str, Any]:
    return dict(
        watermark_gamma=Float(0.25, 0.01, 0.99, "share of the vocabulary on each green list "
                                                "(transformers' greenlist_ratio)"),
        watermark_delta=Float(2.0, 0.0, 20.0, "added to green tokens' logits after the chain (transformers' bias)"),
        watermark_seeding=Choice("lefthash", SCHEMES, "green list seeded by the previous token (lefthash) or "
                                                      "also by the candidate itself (selfhash)"),
        watermark_key=Int(DEFAULT_KEY, 0, MAX_KEY, "hashing key; the detector needs the same one"),
        watermark_context_width=Int(1, 1, 16, "tokens the seeding looks at (selfhash; lefthash uses the last one)"),
    )


def scheme_from_params(params: dict[str, Any], vocab_size: int) -> WatermarkScheme:
    """The :class:`WatermarkScheme` a ``watermark`` lane's knobs describe."""
    return WatermarkScheme(vocab_size=vocab_size, gamma=float(params.get("watermark_gamma", 0.25)),
                           delta=float(params.get("watermark_delta", 2.0)),
                           key=int(params.get("watermark_key", DEFAULT_KEY)),
                           seeding=str(params.get("watermark_seeding", "lefthash")),
                           context_width=int(params.get("watermark_context_width", 1)))


@register
class Watermark(ChainDecoder):
    """Green-list watermarking (Kirchenbauer et al. 2023) on top of the ``sample`` chain.

    Before each token, the tokens before it seed a pseudo-random green list of
    ``int(V * gamma)`` ids; after the whole sampler chain (as transformers orders it),
    ``delta`` is added to the green logits and the token is drawn with the run's common
    random numbers. The green lists are exactly those of transformers'
    ``WatermarkLogitsProcessor`` with the same settings (``lefthash``: seeded by
    ``key * previous token``; ``selfhash``: by the key and the min-hash of the last
    ``context_width`` tokens including the candidate, tried on the 40 best candidates), so
    transformers' ``WatermarkDetector`` detects the output and ``playground
    watermark-detect`` detects transformers' watermarked text. Each step records whether its
    token is green, the green mass before and after the bias, and the running z-score of the
    output (with the prompt as context for the first tokens). With ``watermark_delta = 0``
    it is the ``sample`` decoder. The constraint knobs (``regex``, ``json_schema``,
    ``grammar``, ...) mask the logits before the chain, as on ``sample``, so a constrained
    output can carry the watermark too. Simplifies: one sequence, CPU green lists.
    """

    name = "watermark"
    family = "guided"
    params = ChainParams(**chain_params(), **_wm_params(), coupling=coupling_param(), logit_lens=lens_param(),
                         **constraint_params(healing=True))
    reference = "Kirchenbauer et al. 2023, A Watermark for Large Language Models (ICML)"
    papers = (arxiv("Kirchenbauer et al. 2023, A Watermark for Large Language Models (ICML)", "2301.10226"),)
    description = "Sample with a green-list watermark (transformers-compatible) and track its z-score"
    shows = ("; plus `watermark` per step: whether the token fell in its green list, the green list's "
             "probability before and after delta, and the output's running z-score")

    def chain_knobs(self, params: dict[str, Any]) -> dict[str, Any]:
        return super().chain_knobs({k: v for k, v in params.items() if not k.startswith("watermark_")})

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return super().is_lossy(params) or float(params.get("watermark_delta", 2.0)) > 0

    def run(self, ctx: Context) -> Iterator[Step]:
        scheme = scheme_from_params(ctx.params, vocab_size_of(ctx.target))
        chain = build_chain(self.chain_knobs(ctx.params), ctx.target.tokenizer, ctx.target.vocab_size)
        stage = WatermarkStage(scheme)
        chain.processors.append(stage)
        self.extra_stats["chain"] = chain.labels
        stages: list[list[dict[str, Any]]] = [[]]
        context = list(ctx.prompt_ids)
        green = scored = 0
        for step in token_loop(ctx, chain_picker(ctx, chain, stages), self):
            add_chain_evidence(step, stages[0])
            tok = step.committed[0]
            ev: dict[str, Any] = {"gamma": scheme.gamma, "delta": scheme.delta}
            if len(context) >= scheme.min_context:
                is_green = scheme.is_green(context, tok)
                scored += 1
                green += int(is_green)
                ev["green"] = is_green
            else:
                ev["green"] = None
            last = stage.last
            if "green_mass" in last:
                ev["green_mass"] = round(last["green_mass"], 6)
                ev["green_mass_biased"] = round(last["green_mass_biased"], 6)
            ev.update(scored=scored, green_count=green, z=round(z_score(green, scored, scheme.gamma), 4))
            step.evidence["watermark"] = ev
            context.append(tok)
            yield step
        z = z_score(green, scored, scheme.gamma)
        self.extra_stats["watermark"] = {
            "z": round(z, 4), "p_value": p_value(z), "scored": scored, "green": green,
            "green_fraction": round(green / scored, 6) if scored else None, "gamma": scheme.gamma,
        }


# ---------------------------------------------------------------------- detection
def detect(ids: Sequence[int], scheme: WatermarkScheme, context: Sequence[int] = (),
           ignore_repeated_ngrams: bool = False, z_threshold: float = 4.0) -> dict[str, Any]:
    """Score token ``ids`` for the watermark ``scheme`` (transformers' ``WatermarkDetector``).

    Token ``j`` is scored when at least ``scheme.min_context`` tokens precede it
    (``context`` — say the prompt — then ``ids[:j]``); with no ``context`` the first
    ``context_width`` tokens (lefthash) are unscored, as in transformers. With
    ``ignore_repeated_ngrams`` each distinct (prefix, token) n-gram counts once.
    Returns ``z``, ``p_value``, ``green_fraction``, ``scored``, ``green``, ``prediction``
    (``z > z_threshold``) and ``tokens``: per token ``{"id", "green"}`` (``green`` None when
    unscored; ``repeat`` True when a repeated n-gram was not counted) with the running
    ``z`` after it.
    """
    ids = [int(t) for t in ids]
    ctx = [int(t) for t in context]
    need = scheme.min_context
    seen: set[tuple[int, ...]] = set()
    green = scored = 0
    tokens: list[dict[str, Any]] = []
    full = ctx + ids
    for j, tok in enumerate(ids):
        pos = len(ctx) + j
        rec: dict[str, Any] = {"id": tok, "green": None}
        if pos >= need:
            width = scheme.context_width if scheme.seeding == "selfhash" else scheme.context_width + 1
            ngram = tuple(full[max(0, pos + 1 - width): pos + 1])
            g = scheme.is_green(full[:pos], tok)
            rec["green"] = g
            if ignore_repeated_ngrams and ngram in seen:
                rec["repeat"] = True
            else:
                seen.add(ngram)
                scored += 1
                green += int(g)
        rec["z"] = round(z_score(green, scored, scheme.gamma), 4)
        tokens.append(rec)
    if scored == 0:
        raise PlaygroundError(f"too short to score: {len(ids)} token(s), and the first {need} only seed the "
                              f"green lists (give a longer text, or the prompt it followed)")
    z = z_score(green, scored, scheme.gamma)
    return {"z": z, "p_value": p_value(z), "green_fraction": green / scored, "scored": scored,
            "green": green, "gamma": scheme.gamma, "prediction": z > z_threshold,
            "z_threshold": z_threshold, "tokens": tokens}


def detect_text(model: str, text: str, prompt: str = "", gamma: float = 0.25, key: int = DEFAULT_KEY,
                seeding: str = "lefthash", context_width: int = 1, ignore_repeated_ngrams: bool = False,
                z_threshold: float = 4.0, **load_kwargs: Any) -> dict[str, Any]:
    """Detect the watermark in ``text`` written by ``model``'s tokenizer (see :func:`detect`).

    ``prompt``, when given, is the context the first tokens were written after, so they can
    be scored too. Adds each token's display text (``text`` per token) and the model name.
    """
    if not text or not text.strip():
        raise PlaygroundError(EMPTY_TEXT)
    return _detect_with(model, None, None, text, prompt, gamma, key, seeding, context_width,
                        ignore_repeated_ngrams, z_threshold, load_kwargs)


def detect_ids(model: str, ids: Sequence[int], prompt_ids: Sequence[int] = (), gamma: float = 0.25,
               key: int = DEFAULT_KEY, seeding: str = "lefthash", context_width: int = 1,
               ignore_repeated_ngrams: bool = False, z_threshold: float = 4.0, **load_kwargs: Any) -> dict[str, Any]:
    """Detect the watermark in the token ``ids`` ``model`` wrote after ``prompt_ids`` (a lane's
    ``output_ids`` after its ``prompt_ids``): the figure a ``watermark`` lane's own evidence
    and stats show (:func:`playground.core.trace.watermark_figures`), exactly.

    :func:`detect_text` re-encodes a text, and a sampled output need not be the tokenizer's
    own encoding of its text (it may hold ``The`` + ``ir`` where encoding gives ``Their``), so
    a lane's text can score other tokens, hence another z, than the lane did."""
    if not ids:
        raise PlaygroundError(EMPTY_TEXT)
    return _detect_with(model, [int(t) for t in ids], [int(t) for t in prompt_ids], "", "", gamma, key, seeding,
                        context_width, ignore_repeated_ngrams, z_threshold, load_kwargs)


def _detect_with(model: str, ids: list[int] | None, prompt_ids: list[int] | None, text: str, prompt: str,
                 gamma: float, key: int, seeding: str, context_width: int, ignore_repeated_ngrams: bool,
                 z_threshold: float, load_kwargs: dict[str, Any]) -> dict[str, Any]:
    handle = load_model(model, **load_kwargs)
    if getattr(handle, "kind", "causal") != "causal":
        raise PlaygroundError(f"model {model!r} is not a causal LM; the watermark is an autoregressive one")
    scheme = WatermarkScheme(vocab_size=vocab_size_of(handle), gamma=gamma, delta=0.0, key=key,
                             seeding=seeding, context_width=context_width)
    if ids is None:
        ids, prompt_ids = handle.encode(text), (handle.encode(prompt) if prompt else [])
    out = detect(ids, scheme, prompt_ids or (), ignore_repeated_ngrams, z_threshold)
    for rec in out["tokens"]:
        rec["text"] = handle.decode([rec["id"]])
    out.update(model=getattr(handle, "name", model), seeding=seeding, key=key, context_width=context_width)
    return out


__all__ = ["DEFAULT_KEY", "EMPTY_TEXT", "SCHEMES", "Watermark", "WatermarkScheme", "WatermarkStage", "detect",
           "detect_ids", "detect_text", "p_value", "scheme_from_params", "vocab_size_of", "z_score"]
