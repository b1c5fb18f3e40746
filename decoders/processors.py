"""The composable logits-processor chain of the ``sampling`` family.

One small class per rule, each mapping 1-D float32 logits to 1-D float32 logits (a
filtered-out token gets ``-inf``). :func:`build_chain` turns a decoder's knobs and the
user's ``order`` into a :class:`Chain`, keeping only the processors whose knob is not
neutral, in the order the user gave (like llama.cpp's sampler chain).

A rule is one class: it declares its ``order`` item, its slot in the default order, its knobs
(their defaults are the neutral values), when it acts and how it is built, and registers with
:func:`rule`; the chain's knobs, its ``order`` items and its factory all come from the
registered classes. A decoder's :class:`ChainParams` follow the registered rules, so a rule in
a module of its own (registered after ``sample`` was defined) is a knob of ``sample`` and of
every chain decoder from then on.

The rules follow their references and, where transformers implements the same rule,
transformers' arithmetic (``transformers.generation.logits_process``), so that the
filtered distributions agree exactly; ``tests/test_processors.py`` checks this.
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

import torch

from decoders.base import Choice, Float, Int, Param, Params, PlaygroundError, Text

NEG_INF = float("-inf")


@dataclass
class History:
    """What a processor may look at besides the logits, at one decoding position.

    ``ids`` is the whole context (prompt then generated tokens), ``prompt_len`` where the
    generated part starts, ``pos`` the index of the token being chosen (0 = first new
    token) and ``uniform(index, stream)`` the run's common random numbers.
    """

    ids: Sequence[int]
    prompt_len: int
    pos: int
    uniform: Callable[[int, str], float] = field(default=lambda i, s="sample": 0.5)

    @property
    def generated(self) -> Sequence[int]:
        """The tokens generated so far (no prompt)."""
        return self.ids[self.prompt_len:]


class Processor:
    """One rule of the chain. Subclasses implement ``__call__`` and, to join the chain that
    :func:`build_chain` builds from knobs, declare themselves in their class and register with
    :func:`rule`:

    - ``item``: its name in the ``order`` knob (the three penalties share ``penalties``);
    - ``slot``: where its item stands in the default order (lower first);
    - ``knobs``: the knobs it reads, name -> spec; each default is the knob's neutral value;
    - :meth:`active`: whether knob values make it act (False at the neutral values);
    - :meth:`from_knobs`: the processor those knob values build.
    """

    item: ClassVar[str] = ""
    title: ClassVar[str] = ""  # the name in the trace, when it differs from ``item``
    # True for a rule that only removes tokens (each logit kept as it is or set to -inf): the
    # chain's evidence then knows the draw's winner survives unless the rule removed it
    masks: ClassVar[bool] = False
    slot: ClassVar[int] = 0
    knobs: ClassVar[dict[str, Param]] = {}

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        """Whether the chain knobs ``k`` (every one present) make this rule act."""
        raise NotImplementedError

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> "Processor":
        """The processor for the chain knobs ``k``; ``tokenizer``/``vocab_size`` for a rule that
        reads token texts (DRY's breakers)."""
        raise NotImplementedError

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        raise NotImplementedError

    def observe(self, token: int, final_probs: torch.Tensor) -> None:
        """Learn from the token actually drawn (only stateful rules such as mirostat care)."""

    @property
    def label(self) -> str:
        """A short text for the trace, e.g. ``top_k(k=40)``."""
        args = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in vars(self).items() if not k.startswith("_"))
        return f"{self.title or self.item}({args})"


def _masked(logits: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(remove, NEG_INF)


def _keep_max(logits: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """Never remove the most probable token (transformers' ``min_tokens_to_keep=1``)."""
    return remove & (logits < logits.max())


# ---------------------------------------------------------------------- the rules' registry
# Every rule of the chain, in the order registered (the order of the knobs in a decoder's
# controls); their ``slot`` orders the chain.
RULES: list[type[Processor]] = []
# Every ChainParams made (weakly): a rule registered later adds its knobs to them.
_CHAIN_SPECS: "weakref.WeakSet[ChainParams]" = weakref.WeakSet()


def _follow_rules() -> None:
    for specs in list(_CHAIN_SPECS):
        specs.follow_rules()


def rule(cls: type[Processor]) -> type[Processor]:
    """Class decorator: add a rule to the chain (its item to ``order``, its knobs to
    :func:`chain_params`). A ValueError if its item or a knob is taken by another rule."""
    if not cls.item or cls.item == "order":
        raise ValueError(f"{cls.__name__} needs an item name (not 'order')")
    if cls in RULES:
        return cls
    for other in RULES:
        if other.item == cls.item and other.slot != cls.slot:
            raise ValueError(f"rules of item {cls.item!r} must share its slot ({other.slot}), {cls.__name__} says {cls.slot}")
        if other.item != cls.item and other.slot == cls.slot:
            raise ValueError(f"slot {cls.slot} is item {other.item!r}'s; give {cls.__name__} a slot of its own")
        taken = set(other.knobs) & set(cls.knobs)
        if taken:
            raise ValueError(f"knob(s) {', '.join(sorted(taken))} of {cls.__name__} belong to {other.__name__}")
    if "order" in cls.knobs:
        raise ValueError(f"{cls.__name__} may not declare the 'order' knob")
    RULES.append(cls)
    _follow_rules()
    return cls


def forget_rule(cls: type[Processor]) -> None:
    """Remove a registered rule (for tests that register one of their own)."""
    if cls in RULES:
        RULES.remove(cls)
        _follow_rules()


def order_items() -> tuple[str, ...]:
    """The ``order`` items of the registered rules, in their default order (by slot)."""
    items = {r.item: r.slot for r in RULES}
    return tuple(sorted(items, key=items.__getitem__))


def default_order() -> str:
    """The default value of the ``order`` knob: every item, by slot."""
    return ",".join(order_items())


# ---------------------------------------------------------------------- truncation & shape
# The rules register in this module's order, the order of their knobs in a decoder's controls
# (temperature and truncation first, then the penalties); ``slot`` orders the chain.
@rule
class Temperature(Processor):
    """Divide the logits by ``t``; ``t = 0`` keeps only the argmax (greedy, lowest id on ties)."""

    item = "temperature"
    slot = 120
    knobs = dict(temperature=Float(1.0, 0.0, 10.0, "divide logits by this; 0 = greedy (argmax)"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["temperature"] != 1.0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["temperature"])

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        if self.t == 0:
            keep = torch.zeros_like(logits, dtype=torch.bool)
            keep[int(torch.argmax(logits))] = True
            return _masked(logits, ~keep)
        out = logits / self.t
        live = torch.isfinite(logits)
        if bool((~torch.isfinite(out) & live).any()):
            # A tiny t overflows float32 (or is 0 in it); shifting by the max in float64 is the
            # same softmax and keeps the top token at 0 (the rest may go to -inf, as they should).
            shifted = (logits.double() - float(logits[live].max())) / self.t
            out = shifted.nan_to_num(nan=NEG_INF, neginf=NEG_INF).float()
        return out


@rule
class TopK(Processor):
    """Keep the ``k`` most probable tokens (ties with the k-th are kept, as transformers)."""

    item = "top_k"
    masks = True
    slot = 50
    knobs = dict(top_k=Int(0, 0, 1_000_000, "keep the k most probable tokens; 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["top_k"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["top_k"])

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        k = min(self.k, logits.numel())
        kth = torch.topk(logits, k).values[-1]
        return _masked(logits, logits < kth)


@rule
class TopP(Processor):
    """Nucleus sampling (Holtzman et al. 2020): the smallest top set with mass >= ``p``.

    Computed as transformers does: sort ascending, drop the tokens whose cumulative mass
    stays within ``1 - p``; the top token always survives.
    """

    item = "top_p"
    masks = True
    slot = 70
    knobs = dict(top_p=Float(1.0, 0.0, 1.0, "nucleus: smallest top set with this much mass; 1 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["top_p"] < 1.0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["top_p"])

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        sorted_logits, order = torch.sort(logits, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum <= (1 - self.p)
        drop_sorted[-1] = False
        remove = drop_sorted.scatter(0, order, drop_sorted)
        return _masked(logits, remove)


@rule
class MinP(Processor):
    """Min-p (Nguyen et al. 2024): keep tokens with probability >= ``p`` times the top one's."""

    item = "min_p"
    masks = True
    slot = 80
    knobs = dict(min_p=Float(0.0, 0.0, 1.0, "keep tokens with p >= min_p * p(top); 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["min_p"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["min_p"])

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        probs = logits.softmax(-1)
        remove = probs < self.p * probs.max()
        remove[int(torch.argmax(probs))] = False
        return _masked(logits, remove)


@rule
class Typical(Processor):
    """Locally typical sampling (Meister et al. 2023).

    Rank tokens by how far their surprisal ``-log p`` is from the entropy ``H``; keep the
    most typical ones until their mass reaches ``p`` (transformers' cut-off rule).
    """

    item = "typical"
    masks = True
    slot = 60
    knobs = dict(typical_p=Float(1.0, 0.0, 1.0, "locally typical: keep this much mass of the most typical tokens; 1 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["typical_p"] < 1.0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["typical_p"])

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        logp = torch.log_softmax(logits, -1)
        ent = -(logp * logp.exp()).nansum()
        shifted = torch.abs(-logp - ent)
        sorted_shift, order = torch.sort(shifted, descending=False)
        cum = logits.gather(0, order).softmax(-1).cumsum(-1)
        last = min(int((cum < self.p).sum()), sorted_shift.numel() - 1)
        drop_sorted = sorted_shift > sorted_shift[last]
        drop_sorted[0] = False
        remove = drop_sorted.scatter(0, order, drop_sorted)
        return _masked(logits, remove)


@rule
class Epsilon(Processor):
    """Epsilon sampling (Hewitt et al. 2022): drop tokens with probability below ``epsilon``."""

    item = "epsilon"
    masks = True
    slot = 90
    knobs = dict(epsilon=Float(0.0, 0.0, 1.0, "epsilon sampling: drop tokens with p < epsilon; 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["epsilon"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["epsilon"])

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        return _masked(logits, _keep_max(logits, logits.softmax(-1) < self.epsilon))


@rule
class Eta(Processor):
    """Eta sampling (Hewitt et al. 2022): drop tokens below ``min(eps, sqrt(eps)*exp(-H))``."""

    item = "eta"
    masks = True
    slot = 100
    knobs = dict(eta=Float(0.0, 0.0, 1.0, "eta sampling: drop p < min(eta, sqrt(eta) e^-H); 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["eta"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["eta"])

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        probs = logits.softmax(-1)
        logp = torch.log_softmax(logits, -1)
        ent = -(probs * torch.where(probs > 0, logp, torch.zeros_like(logp))).sum()
        eps = torch.tensor(self.epsilon, dtype=logits.dtype)
        eta = torch.minimum(eps, torch.sqrt(eps) * torch.exp(-ent))
        return _masked(logits, _keep_max(logits, probs < eta))


@rule
class TopNSigma(Processor):
    """Top-nσ (Tang et al. 2024): keep tokens whose logit is within ``n`` standard deviations
    of the maximum (σ over the finite logits, population form, as llama.cpp)."""

    item = "top_n_sigma"
    masks = True
    slot = 40
    knobs = dict(top_n_sigma=Float(0.0, 0.0, 20.0, "keep logits >= max - n * std(logits); 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["top_n_sigma"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["top_n_sigma"])

    def __init__(self, n: float) -> None:
        self.n = n

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        finite = logits[torch.isfinite(logits)]
        if finite.numel() == 0:
            return logits
        sigma = finite.std(correction=0) if finite.numel() > 1 else finite.new_tensor(0.0)
        return _masked(logits, logits < finite.max() - self.n * sigma)


@rule
class XTC(Processor):
    """Exclude Top Choices (p-e-w, text-generation-webui / llama.cpp).

    With probability ``probability`` (the coin is the run's common random number
    ``uniform(pos, "xtc")``), when at least two *live* tokens (not removed by an earlier
    rule) have probability >= ``threshold``, remove all of them except the least probable
    one. A removed token (probability 0) is never a top choice, even at threshold 0, as in
    llama.cpp whose earlier samplers drop removed tokens from the candidate list; so XTC
    always leaves at least one token. Simplification: webui's special case that never
    removes newline/EOS is not applied (llama.cpp does not apply it either).
    """

    item = "xtc"
    masks = True
    slot = 110
    knobs = dict(xtc_threshold=Float(0.1, 0.0, 1.0, "XTC: tokens at or above this probability are 'top choices'"),
                 xtc_probability=Float(0.0, 0.0, 1.0, "XTC: chance per step to exclude all top choices but the least; 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["xtc_probability"] > 0 and k["xtc_threshold"] <= 0.5

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["xtc_threshold"], k["xtc_probability"])

    def __init__(self, threshold: float, probability: float) -> None:
        self.threshold, self.probability = threshold, probability

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        if h.uniform(h.pos, "xtc") >= self.probability:
            return logits
        live = torch.isfinite(logits)
        probs = logits.softmax(-1)
        above = int((live & (probs >= self.threshold)).sum())
        if above < 2:
            return logits
        # Descending logits put removed tokens (-inf) last, behind live tokens whose
        # probability underflowed to 0, so the first ``above`` are exactly the top choices.
        order = torch.argsort(logits, descending=True, stable=True)
        remove = torch.zeros_like(logits, dtype=torch.bool)
        remove[order[: above - 1]] = True
        return _masked(logits, remove)


@rule
class Mirostat(Processor):
    """Mirostat 2.0 (Basu et al. 2021), as llama.cpp implements it.

    Keeps the tokens whose surprise ``-log2 p`` is at most ``mu`` (at least the top one);
    after each draw, ``mu -= eta * (surprise_of_drawn_token - tau)`` with the surprise
    measured on the final distribution the token was drawn from. ``mu`` starts at ``2 tau``.
    """

    item = "mirostat"
    masks = True
    slot = 130
    knobs = dict(mirostat_tau=Float(0.0, 0.0, 20.0, "mirostat v2 target surprise in bits; 0 = off"),
                 mirostat_eta=Float(0.1, 0.0, 1.0, "mirostat v2 learning rate"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["mirostat_tau"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["mirostat_tau"], k["mirostat_eta"])

    def __init__(self, tau: float, eta: float) -> None:
        self.tau, self.eta = tau, eta
        self.mu = 2.0 * tau

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        probs = logits.softmax(-1)
        remove = -torch.log2(probs) > self.mu
        remove[int(torch.argmax(probs))] = False
        return _masked(logits, remove)

    def observe(self, token: int, final_probs: torch.Tensor) -> None:
        p = float(final_probs[token])
        surprise = -math.log2(p) if p > 0 else 64.0
        self.mu -= self.eta * (surprise - self.tau)

    @property
    def label(self) -> str:
        return f"mirostat(tau={self.tau:g}, eta={self.eta:g}, mu={self.mu:.3f})"


# ---------------------------------------------------------------------- penalties
def _window(h: History, last_n: int) -> Sequence[int]:
    return h.ids[-last_n:] if last_n > 0 else h.ids


@rule
class RepetitionPenalty(Processor):
    """CTRL's repetition penalty (Keskar et al. 2019) as transformers applies it.

    Every token present in the context (prompt included; the last ``last_n`` tokens if
    set) has its logit divided by ``penalty`` when positive and multiplied when negative.
    """

    item = "penalties"
    title = "repetition_penalty"
    slot = 10
    knobs = dict(repetition_penalty=Float(1.0, 0.05, 10.0, "CTRL penalty on tokens in the context; 1 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["repetition_penalty"] != 1.0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["repetition_penalty"], k["penalty_last_n"])

    def __init__(self, penalty: float, last_n: int = 0) -> None:
        self.penalty, self.last_n = penalty, last_n

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        ids = _window(h, self.last_n)
        if not ids:
            return logits
        idx = torch.tensor(sorted(set(int(i) for i in ids if 0 <= int(i) < logits.numel())), dtype=torch.long)
        if idx.numel() == 0:
            return logits
        seen = logits[idx]
        out = logits.clone()
        out[idx] = torch.where(seen < 0, seen * self.penalty, seen / self.penalty)
        return out


def _counts(h: History, last_n: int, size: int) -> torch.Tensor:
    """How often each token was generated (OpenAI counts sampled tokens, not the prompt)."""
    gen = list(h.generated)
    if last_n > 0:
        gen = gen[-last_n:]
    gen = [t for t in gen if 0 <= t < size]
    c = torch.zeros(size, dtype=torch.float32)
    if gen:
        c.index_add_(0, torch.tensor(gen, dtype=torch.long), torch.ones(len(gen)))
    return c


@rule
class PresencePenalty(Processor):
    """OpenAI's presence penalty: subtract ``alpha`` once from every token generated before."""

    item = "penalties"
    title = "presence_penalty"
    slot = 10
    knobs = dict(presence_penalty=Float(0.0, -2.0, 2.0, "subtract once from every generated token; 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["presence_penalty"] != 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["presence_penalty"], k["penalty_last_n"])

    def __init__(self, alpha: float, last_n: int = 0) -> None:
        self.alpha, self.last_n = alpha, last_n

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        c = _counts(h, self.last_n, logits.numel())
        return logits - self.alpha * (c > 0).float()


@rule
class FrequencyPenalty(Processor):
    """OpenAI's frequency penalty: subtract ``alpha`` times the token's generated count."""

    item = "penalties"
    title = "frequency_penalty"
    slot = 10
    # penalty_last_n, read by all three penalties, is declared once: by the last, which lists it after them
    knobs = dict(frequency_penalty=Float(0.0, -2.0, 2.0, "subtract per occurrence of a generated token; 0 = off"),
                 penalty_last_n=Int(0, 0, 1_000_000, "penalties look at the last n tokens only; 0 = all"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["frequency_penalty"] != 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["frequency_penalty"], k["penalty_last_n"])

    def __init__(self, alpha: float, last_n: int = 0) -> None:
        self.alpha, self.last_n = alpha, last_n

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        return logits - self.alpha * _counts(h, self.last_n, logits.numel())


@rule
class NoRepeatNGram(Processor):
    """Ban every token that would complete an n-gram already present in the context."""

    item = "no_repeat_ngram"
    masks = True
    slot = 30
    knobs = dict(no_repeat_ngram_size=Int(0, 0, 64, "never repeat an n-gram of this size; 0 = off"))

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["no_repeat_ngram_size"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["no_repeat_ngram_size"])

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        n, ids = self.n, list(h.ids)
        if len(ids) < n:
            return logits
        t = torch.tensor(ids, dtype=torch.long)
        windows = t.unfold(0, n, 1)
        prefix = t[len(ids) - (n - 1):] if n > 1 else t[:0]
        match = (windows[:, :-1] == prefix).all(dim=1)
        banned = windows[match, -1]
        banned = banned[banned < logits.numel()]
        remove = torch.zeros_like(logits, dtype=torch.bool)
        remove[banned] = True
        return _masked(logits, remove)


@dataclass(frozen=True)
class Breakers:
    """DRY sequence breakers resolved against a vocabulary, as llama.cpp does.

    ``single``: tokens whose text contains a breaker string; each breaks a match alone and
    is never penalised. ``heads``: a token whose text ends with a proper prefix of a breaker
    (``"ROM"`` for ``"ROMEO:"``) maps to the token sequences ("tails") that spell the rest
    of it, so a breaker spanning several tokens is matched as a token sequence.
    """

    single: frozenset[int] = frozenset()
    heads: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)

    def limit(self, ids: Sequence[int]) -> int:
        """How many tokens at the end of ``ids`` come after the latest breaker (all of them
        if none): the longest repeat DRY may see (llama.cpp's ``rep_limit``)."""
        n = len(ids)
        for i in range(n):  # i: how many tokens follow the candidate head
            tok = ids[n - 1 - i]
            best = 0 if tok in self.single else -1
            for tail in self.heads.get(tok, ()):
                size = len(tail)
                if best < size <= i and tuple(ids[n - i:n - i + size]) == tail:
                    best = size
            if best >= 0:
                return i - best
        return n


_BREAKER_CACHE: dict[tuple[int, int, tuple[str, ...]], Breakers] = {}
MAX_BREAKER_CHARS, MAX_BREAKER_TAIL = 40, 20  # llama.cpp's caps
DEFAULT_BREAKERS = '"\\n", ":", "\\"", "*"'


def breaker_sequences(tokenizer: Any, breakers: Sequence[str], vocab_size: int) -> Breakers:
    """Resolve DRY breaker strings against a tokenizer (cached per tokenizer), as llama.cpp's
    ``get_overlapping_token_sequences``: a token containing a breaker is a single-token
    breaker; a token ending with a proper prefix of one is the head of a multi-token breaker
    whose tail is the tokenization of the rest (breakers cut to 40 characters, tails to 20
    tokens)."""
    strings = tuple(b[:MAX_BREAKER_CHARS] for b in breakers if b)
    key = (id(tokenizer), vocab_size, strings)
    hit = _BREAKER_CACHE.get(key)
    if hit is not None:
        return hit
    single: set[int] = set()
    heads: dict[int, list[tuple[int, ...]]] = {}
    tails: dict[str, tuple[int, ...]] = {}
    for i in range(vocab_size):
        try:
            text = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:  # noqa: BLE001 - ids past the tokenizer's table have no text
            continue
        for b in strings:
            if b in text:
                single.add(i)
                continue
            for k in range(min(len(b) - 1, len(text)), 0, -1):
                if not text.endswith(b[:k]):
                    continue
                rest = b[k:]
                if rest not in tails:
                    tails[rest] = tuple(tokenizer.encode(rest, add_special_tokens=False))[:MAX_BREAKER_TAIL]
                seqs = heads.setdefault(i, [])
                if tails[rest] and tails[rest] not in seqs:
                    seqs.append(tails[rest])
    hit = _BREAKER_CACHE[key] = Breakers(frozenset(single), {t: tuple(v) for t, v in heads.items() if v})
    return hit


@rule
class DRY(Processor):
    """DRY, "Don't Repeat Yourself" (p-e-w; text-generation-webui and llama.cpp).

    If the context ends with a token sequence that occurred before, the token that
    followed the earlier occurrence would extend the repetition. With ``L`` the length of
    the longest such match ending just before that token, its logit is lowered by
    ``multiplier * base ** (L - allowed_length)`` when ``L >= allowed_length``. As in
    llama.cpp, matches never reach back past the latest sequence breaker - a token whose
    text contains a breaker string, or a run of tokens spelling one that spans several
    tokens (``"ROMEO:"``; see :class:`Breakers`) - and a single-token breaker is never
    penalised. Simplifications: matches are capped at 50 tokens, the whole context is
    searched (no ``penalty_last_n``), and the exponent is clamped as llama.cpp does so the
    penalty stays finite.
    """

    item = "dry"
    slot = 20
    knobs = dict(
        dry_multiplier=Float(0.0, 0.0, 10.0, "DRY penalty strength; 0 = off"),
        dry_base=Float(1.75, 1.0, 10.0, "DRY: penalty grows as base^(match - allowed_length)"),
        dry_allowed_length=Int(2, 1, 64, "DRY: repeats up to this length are free"),
        dry_sequence_breakers=Text(DEFAULT_BREAKERS, "DRY: JSON strings that break a match, comma-separated"),
    )
    MAX_MATCH = 50

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["dry_multiplier"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        brk = breaker_sequences(tokenizer, parse_breakers(k["dry_sequence_breakers"]), vocab_size) \
            if tokenizer is not None else Breakers()
        return cls(k["dry_multiplier"], k["dry_base"], k["dry_allowed_length"], brk)

    def __init__(self, multiplier: float, base: float, allowed_length: int,
                 breakers: frozenset[int] | Breakers = frozenset()) -> None:
        self.multiplier, self.base, self.allowed_length = multiplier, base, allowed_length
        self._breakers = breakers if isinstance(breakers, Breakers) else Breakers(frozenset(breakers))

    def penalty(self, match: int) -> float:
        """The logit penalty for a repeat of ``match`` tokens (>= ``allowed_length``)."""
        exp = match - self.allowed_length
        if self.base > 1.000001:
            exp = min(exp, int(88.7228391 / math.log(self.base)))  # llama.cpp's FLOAT_MAX_LOG
        return min(self.multiplier * self.base ** exp, 3.0e38)

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        ids = list(h.ids)
        n = len(ids)
        if n < 2:
            return logits
        cap = min(self._breakers.limit(ids), self.MAX_MATCH)
        if cap < self.allowed_length:
            return logits
        last, single = ids[-1], self._breakers.single
        longest: dict[int, int] = {}
        for i in range(n - 1):  # i: an earlier occurrence of the last token
            if ids[i] != last:
                continue
            nxt = ids[i + 1]
            if nxt in single:
                continue
            m = 1
            while m < cap and i - m >= 0 and ids[i - m] == ids[n - 1 - m]:
                m += 1
            if m > longest.get(nxt, 0):
                longest[nxt] = m
        out = logits
        for tok, m in longest.items():
            if m >= self.allowed_length and tok < logits.numel():
                if out is logits:
                    out = logits.clone()
                out[tok] -= self.penalty(m)
        return out


# ---------------------------------------------------------------------- Bregman top-k (not a built-in rule)
BREGMAN_DIVERGENCES = ("kl", "sq_euclid")
BREGMAN_CURVE = 256  # loss-vs-k values a step records (a window around the chosen k past this)


def bregman_losses(sorted_probs: torch.Tensor, total_sq: float, lam: float, divergence: str) -> torch.Tensor:
    """The objective ``L(k) = D(q_k, p) + lam * k`` for ``k = 1..K`` (float64, index ``k - 1``).

    ``sorted_probs`` are the ``K`` largest probabilities of ``p``, descending (float64);
    ``total_sq`` is ``sum p_i^2`` over every live token (the squared-Euclidean tail needs the
    whole distribution, not only the ``K`` searched). ``q_k`` is the best distribution whose
    support is the top ``k``, i.e. the Bregman projection of ``p`` onto that face of the simplex:

    - ``kl``: ``q_k = p`` renormalised on the top ``k``, so ``D = KL(q_k || p) = -log S_k``
      with ``S_k`` the top-``k`` mass;
    - ``sq_euclid`` (``D = ||q - p||^2 / 2``): ``q_k = p + (1 - S_k) / k`` on the top ``k`` (the
      missing mass spread evenly), so ``D = ((1 - S_k)^2 / k + sum_{i>k} p_i^2) / 2``.

    Both are discretely convex in ``k``, so binary search on the first difference is exact
    (why, see :func:`bregman_search`); ``tests/test_bregman_topk.py`` checks it numerically.
    """
    k = torch.arange(1, sorted_probs.numel() + 1, dtype=torch.float64)
    mass = torch.cumsum(sorted_probs, 0)
    if divergence == "kl":
        # mass can round a hair above 1 over the whole vocabulary: -log of it is ~0, never < -1e-15
        div = -torch.log(mass)
    elif divergence == "sq_euclid":
        rest = (1.0 - mass).clamp_min(0.0)
        tail_sq = (total_sq - torch.cumsum(sorted_probs * sorted_probs, 0)).clamp_min(0.0)
        div = 0.5 * (rest * rest / k + tail_sq)
    else:
        raise PlaygroundError(f"unknown divergence {divergence!r}; choose one of: {', '.join(BREGMAN_DIVERGENCES)}")
    return div + lam * k


def bregman_search(losses: Sequence[float]) -> tuple[int, list[int]]:
    """The ``k`` minimising a discretely convex ``losses[k - 1]`` by binary search on its first
    difference, and the ``k`` values it read (in the order read).

    Convexity makes ``L(k+1) - L(k)`` non-decreasing, so the first ``k`` where it is ``>= 0``
    is the smallest minimiser: each probe reads ``L(mid)`` and ``L(mid+1)`` and halves the
    range, about ``2 log2 K`` reads in all (the full curve is only computed for the evidence).

    Why the two objectives are convex (``S_k`` the top-``k`` mass, ``p`` sorted descending):
    for ``kl`` the second difference is ``log(S_k^2 / (S_{k+1} S_{k-1}))`` and
    ``(S_k + p_{k+1})(S_k - p_k) <= S_k^2`` because ``p_{k+1} <= p_k``. For ``sq_euclid``
    write ``r`` for the mass left out at ``k`` and ``a = p_{k+1}``: twice the first difference
    is ``h(r, a, k) = (r-a)^2/(k+1) - r^2/k - a^2``, which falls as ``a`` grows; so the next
    difference, ``h(r-a, p_{k+2}, k+1) >= h(r-a, a, k+1)``, and ``h(r-a, a, k+1) >= h(r, a, k)``
    is ``(r-2a)^2/(k+2) + r^2/k >= 2 (r-a)^2/(k+1)``, Jensen for the jointly convex ``x^2/y``.
    """
    lo, hi = 1, len(losses)
    probes: list[int] = []

    def read(k: int) -> float:
        if k not in probes:
            probes.append(k)
        return losses[k - 1]

    while lo < hi:
        mid = (lo + hi) // 2
        if read(mid + 1) >= read(mid):
            hi = mid
        else:
            lo = mid + 1
    read(lo)
    return lo, probes


class BregmanTopK(Processor):
    """Bregman top-k (adaptive k): per step keep the top ``k`` that minimises
    ``D(q_k, p) + lam * k`` (A004's l0-regularised Bregman projection onto the simplex).

    ``p`` is the distribution entering the rule (its live tokens); ``k`` ranges over
    ``1..K`` with ``K`` the live tokens, capped by ``k_max`` (0 = no cap). Ties with the
    ``k``-th token are kept, exactly as :class:`TopK` keeps them, so under ``kl`` the rule *is*
    ``TopK(k)`` with the chosen ``k`` (only removes tokens; the kept logits are untouched and the
    softmax renormalises). Under ``sq_euclid`` the kept tokens are reweighted to ``q_k`` (each
    gets an equal share of the removed mass, which flattens the kept distribution).

    :attr:`last` holds the latest call's evidence: the chosen ``k``, the tokens kept, the
    loss-vs-``k`` curve (up to :data:`BREGMAN_CURVE` values, ``curve_k0`` the ``k`` of the
    first) and the probes the binary search read, each ``[k, L(k)]``.

    Simplifies relative to the paper: only the primal problem, two divergences (KL and
    squared Euclidean; no general separable generator or dual form), ``lam`` fixed for the
    run, and the distribution sorted in full each step (the paper's point is that the
    search needs ``O(log K)`` loss evaluations; here the sort dominates anyway).

    Not registered as a rule of the shared chain (the built-in chain's items are fixed);
    it declares ``item``/``slot``/``knobs`` so that ``rule(BregmanTopK)`` would make it one.
    """

    item = "bregman"
    masks = True
    slot = 55
    knobs = dict(
        bregman_lambda=Float(0.0, 0.0, 1.0, "Bregman top-k: l0 weight per kept token; 0 = off"),
        bregman_divergence=Choice("kl", BREGMAN_DIVERGENCES, "Bregman top-k: the divergence D(q_k, p)"),
        bregman_k_max=Int(0, 0, 1_000_000, "Bregman top-k: largest k searched; 0 = every live token"),
    )

    @classmethod
    def active(cls, k: dict[str, Any]) -> bool:
        return k["bregman_lambda"] > 0

    @classmethod
    def from_knobs(cls, k: dict[str, Any], tokenizer: Any, vocab_size: int) -> Processor:
        return cls(k["bregman_lambda"], k["bregman_divergence"], k["bregman_k_max"])

    def __init__(self, lam: float, divergence: str = "kl", k_max: int = 0) -> None:
        if divergence not in BREGMAN_DIVERGENCES:
            raise PlaygroundError(f"unknown divergence {divergence!r}; choose one of: {', '.join(BREGMAN_DIVERGENCES)}")
        if not (lam >= 0 and math.isfinite(lam)):
            raise PlaygroundError(f"Bregman top-k needs lambda >= 0, got {lam!r}")
        if k_max < 0:
            raise PlaygroundError(f"Bregman top-k needs k_max >= 0, got {k_max!r}")
        self.lam, self.divergence, self.k_max = float(lam), divergence, int(k_max)
        # an instance flag: sq_euclid rewrites the kept logits, so the chain's evidence must
        # not assume the draw's winner survives untouched
        self.masks = divergence == "kl"
        self._last: dict[str, Any] | None = None

    @property
    def last(self) -> dict[str, Any] | None:
        """The evidence of the latest call (None before the first)."""
        return self._last

    def __call__(self, logits: torch.Tensor, h: History) -> torch.Tensor:
        live = torch.isfinite(logits)
        n = int(live.sum())
        if n == 0:
            return logits
        cap = min(n, self.k_max) if self.k_max > 0 else n
        top = torch.topk(logits, cap)
        probs = torch.softmax(logits.double(), -1)
        sorted_p = probs[top.indices]
        total_sq = float((probs * probs).sum())
        losses = bregman_losses(sorted_p, total_sq, self.lam, self.divergence).tolist()
        k, probes = bregman_search(losses)
        # TopK's own arithmetic, so under kl the kept set (ties included) is top_k's bit for bit
        out = TopK(k)(logits, h)
        kept = torch.isfinite(out)
        if self.divergence == "sq_euclid":
            m = int(kept.sum())
            shift = max(0.0, 1.0 - float(probs[kept].sum())) / m
            q = probs + shift
            out = torch.where(kept, torch.log(q).float(), torch.full_like(logits, NEG_INF))
        k0 = 1 if cap <= BREGMAN_CURVE else max(1, min(k - BREGMAN_CURVE // 2, cap - BREGMAN_CURVE + 1))
        curve = losses[k0 - 1: k0 - 1 + BREGMAN_CURVE]
        self._last = {
            "k": k, "kept": int(kept.sum()), "k_max": cap, "live": n, "divergence": self.divergence,
            "lambda": self.lam, "search": "binary", "kept_mass": round(float(sorted_p[:k].sum()), 6),
            "loss": _loss(losses[k - 1]), "curve_k0": k0, "curve": [_loss(x) for x in curve],
            "probes": [[j, _loss(losses[j - 1])] for j in probes],
        }
        return out

    @property
    def label(self) -> str:
        cap = f", k_max={self.k_max}" if self.k_max else ""
        return f"bregman_top_k(lambda={self.lam:g}, {self.divergence}{cap})"


def _loss(x: float) -> float:
    """A loss value for the trace: eight significant digits (the curve's steps can be small)."""
    return float(f"{x:.8g}")


# ---------------------------------------------------------------------- chain
def chain_params() -> dict[str, Param]:
    """The knob specs of the whole chain, as the registered rules declare them, then ``order``
    (the ``sample`` decoder exposes all of them)."""
    specs: dict[str, Param] = {}
    for r in RULES:
        specs.update(r.knobs)
    specs["order"] = Text(default_order(), "order of the chain (comma list); penalties first by default",
                          items=order_items())
    return specs


def chain_defaults() -> dict[str, Any]:
    """Every chain knob at its default (the rules' neutral values, the default order)."""
    return {k: p.default for k, p in chain_params().items()}


def parse_breakers(text: str) -> list[str]:
    """The DRY breakers from their JSON-ish text (``"\\n", ":"``), or a PlaygroundError."""
    text = text.strip()
    if not text:
        return []
    try:
        items = json.loads(text if text.startswith("[") else f"[{text}]")
    except json.JSONDecodeError:
        raise PlaygroundError(f"knob 'dry_sequence_breakers' must be JSON strings separated by commas, "
                              f"got {text!r}") from None
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise PlaygroundError("knob 'dry_sequence_breakers' must list strings")
    return items


def active_items(knobs: dict[str, Any]) -> list[str]:
    """The order items whose knobs are not neutral (these make up the chain), in default order."""
    k = {**chain_defaults(), **knobs}
    on = {r.item for r in RULES if r.active(k)}
    return [item for item in order_items() if item in on]


def check_chain(decoder: str, knobs: dict[str, Any]) -> None:
    """Cross-knob checks: every active rule must appear in ``order``; breakers must parse."""
    order = [s for s in str(knobs.get("order", default_order())).split(",") if s]
    missing = [item for item in active_items(knobs) if item not in order]
    if missing:
        raise PlaygroundError(f"decoder {decoder!r}: knob(s) for {', '.join(missing)} are set "
                              f"but missing from 'order'")
    if knobs.get("dry_multiplier", 0) > 0:
        parse_breakers(str(knobs.get("dry_sequence_breakers", DEFAULT_BREAKERS)))


class ChainParams(Params):
    """Params whose validation also runs :func:`check_chain` on the result.

    The specs follow the chain: a rule registered after a decoder built its specs (a rule in
    a module of its own, imported after ``sampling.py``) adds its knobs to them, before
    ``order``, whose items and default follow too; a forgotten rule's knobs go again. The
    knobs a decoder took out or changed at construction (the speculative family drops
    mirostat, sets its own temperature) stay as it left them: only rules that were not
    registered then are added.
    """

    def __init__(self, **specs: Param) -> None:
        super().__init__(**specs)
        self._rules_at_start = set(RULES)
        self._added: dict[type[Processor], tuple[str, ...]] = {}
        _CHAIN_SPECS.add(self)

    def __hash__(self) -> int:  # a WeakSet member: identity, as any spec object
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def follow_rules(self) -> None:
        """Add the knobs of rules registered since these specs were made, drop those of
        rules forgotten since, and renew ``order``."""
        for r, names in list(self._added.items()):
            if r not in RULES:
                for k in names:
                    self.pop(k, None)
                del self._added[r]
        new: dict[str, Param] = {}
        for r in RULES:
            if r not in self._rules_at_start and r not in self._added:
                new.update(r.knobs)
                self._added[r] = tuple(r.knobs)
        if not new and "order" not in self:
            return
        # the new knobs go where the chain's knobs end (before ``order``), so a decoder's
        # controls keep their order
        rule_knobs = {k for r in RULES for k in r.knobs}
        items = list(self.items())
        at = next((i for i, (k, _) in enumerate(items) if k == "order"), None)
        if at is None:
            at = max((i + 1 for i, (k, _) in enumerate(items) if k in rule_knobs), default=len(items))
        fresh = [(k, chain_params()["order"] if k == "order" else p) for k, p in items]
        self.clear()
        self.update(fresh[:at] + list(new.items()) + fresh[at:])

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        check_chain(decoder, out)
        return out


EMPTIED_NOTE = "removed every token; kept the most probable one still live"
STAGE_TOP = 6  # removed and kept tokens each stage records (traces are stored and streamed)
# A distribution with at most this many live tokens is evidenced on its support alone (a small
# tensor) rather than over the vocabulary; past it, a stage costs a few full-vocabulary passes.
STAGE_SMALL = 1024


def _p(x: float) -> float:
    """A probability for the trace: four significant digits, so a tail token never reads as 0."""
    return float(f"{x:.4g}")


def _pairs(ids: list[int], probs: list[float]) -> list[list[Any]]:
    return [[t, _p(q)] for t, q in zip(ids, probs)]


def gumbel_pick(logits: torch.Tensor, noise: torch.Tensor) -> int:
    """The Gumbel-max draw from ``softmax(logits)`` with ``noise``: ``argmax(logits + noise)``
    over the tokens whose float32 probability is non-zero (the rule :func:`decoders.ar.draw`
    applies to the final distribution)."""
    x = logits.detach().cpu()
    noise = noise.detach().double().cpu()[: x.numel()]
    t = int(torch.argmax(x.double() + noise))
    probs = torch.softmax(x.float(), -1)  # one pass, as draw's final distribution is computed
    # a winner whose probability underflows to 0 is rare (its logit ~100 below the top's)
    if float(probs[t]) > 0:
        return t
    live = probs > 0
    return int(torch.argmax(torch.where(live, x.double(), torch.full_like(noise, NEG_INF)) + noise))


class _Dist:
    """One distribution along the chain (the logits ``x`` entering or leaving a stage, ``n``
    live tokens) and what the evidence knows of it.

    A large one is known by its probabilities over the vocabulary (computed when first
    needed). A small one is known on a short list of candidate ids ``on`` holding its whole
    support (the support of an earlier distribution of the chain: a rule never revives a
    removed token), as Python lists: ``vals`` its logits there (``-inf`` where removed),
    ``probs`` its probabilities, ``order`` the live positions, most probable first. A stage
    between small distributions then costs one gather and one softmax of the candidates."""

    def __init__(self, x: torch.Tensor, n: int, probs: torch.Tensor | None = None,
                 on: _Candidates | None = None) -> None:
        self.x, self.n, self._probs, self.on = x, n, probs, on
        self.vals: list[float] = []
        self.probs_l: list[float] = []
        self.order: list[int] = []
        self.pick: int | None = None
        self.winner: int | None = None  # argmax(x + noise) over every live token, underflowed or not
        if on is not None:
            v = x[on.ids]
            self.vals, self.probs_l = v.tolist(), torch.softmax(v, -1).tolist()
            vals = self.vals
            self.order = [i for i, e in enumerate(vals) if e != NEG_INF]
            if any(vals[i] < vals[j] for i, j in zip(self.order, self.order[1:])):  # a stage that reorders
                self.order.sort(key=vals.__getitem__, reverse=True)

    @property
    def probs(self) -> torch.Tensor:
        """``softmax(x)`` over the vocabulary."""
        if self._probs is None:
            self._probs = torch.softmax(self.x, -1)
        return self._probs

    def prob(self, t: int) -> float:
        """The probability of token ``t`` (0 when it is not live)."""
        if self.on is None:
            return float(self.probs[t])
        i = self.on.index(t)
        return 0.0 if i is None else self.probs_l[i]

    def gumbel(self, noise: torch.Tensor, masked_from: _Dist | None = None) -> None:
        """Set ``pick``, :func:`gumbel_pick` of this distribution (and ``winner``): on its
        candidates when it is small; when it is ``masked_from`` by a rule that only removes
        tokens and that rule kept the winner there, the winner without a pass (the maximum of
        a superset that survives is the subset's, the lowest id on ties too)."""
        src = masked_from
        if src is not None and src.winner is not None and bool(torch.isfinite(self.x[src.winner])):
            t = src.winner
            # its probability only grew: far from float32's underflow it is non-zero
            if src.prob(t) > 1e-30:
                self.winner = self.pick = t
                return
        if self.on is None:
            # float32 logits promote to float64 exactly: the sum is gumbel_pick's
            t = int(torch.argmax(torch.add(noise, self.x)))
        else:
            # Python floats are float64: the same sums; argmax's rule on ties, the lowest id
            g, ids = self.on.noise(noise), self.on.ids_l
            s = {i: self.vals[i] + g[i] for i in self.order}
            best = max(s.values())
            t = min(ids[i] for i, e in s.items() if e == best)
        self.winner = t
        # a winner whose probability underflowed is rare: then the full rule
        self.pick = t if self.prob(t) > 0 else gumbel_pick(self.x, noise)


class _Candidates:
    """A short list of token ids (a tensor to gather with, and a list), its positions by id and
    the run's noise there, each computed once for every distribution known on it."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids, self.ids_l = ids, ids.tolist()
        self._pos: dict[int, int] | None = None
        self._noise: list[float] | None = None

    def index(self, t: int) -> int | None:
        """The position of token ``t`` in the list (None if absent)."""
        if self._pos is None:
            self._pos = {t: i for i, t in enumerate(self.ids_l)}
        return self._pos.get(t)

    def noise(self, noise: torch.Tensor) -> list[float]:
        """The run's noise at the listed ids."""
        if self._noise is None:
            self._noise = noise[self.ids].tolist()
        return self._noise


def _top(ids: list[int], probs: list[float], flags: list[bool], k: int) -> tuple[list[list[Any]], list[list[Any]]]:
    """The first ``k`` removed and kept candidates (``flags``: kept), candidates most probable first."""
    sides: dict[bool, list[list[Any]]] = {True: [], False: []}
    for t, q, f in zip(ids, probs, flags):
        side = sides[f]
        if len(side) < k:
            side.append([t, _p(q)])
    return sides[False], sides[True]


def _masked_top(d: _Dist, drop: torch.Tensor, want: int) -> list[list[Any]]:
    top = torch.topk(d.x.masked_fill(drop, NEG_INF), want).indices
    return _pairs(top.tolist(), d.probs[top].tolist())


def _cut(d: _Dist, kept: torch.Tensor, n_out: int, k: int) -> tuple[dict[str, Any], torch.Tensor | None]:
    """``removed``, ``top_removed`` and ``top_kept`` of a stage that keeps ``kept`` (a mask,
    ``n_out`` tokens) of the large distribution ``d``, and the candidate ids when they hold the
    whole support leaving the stage (else None).

    The candidates are ``d``'s most probable tokens by ``topk`` (probability is monotone in the
    logit): the survivors and six more when that is few, so a cut that keeps a top set (top-k,
    top-p, min-p, ...) is read off them alone; else twelve, and a side they do not cover is
    taken by ``topk`` over the masked logits. A rule never revives a removed token (each maps
    -inf to -inf), so the removed tokens are those live in ``d`` and not kept."""
    n_cut = d.n - n_out
    m = min(d.n, n_out + k if n_out + k <= STAGE_SMALL else 2 * k)
    ids = torch.topk(d.x, m).indices
    ks = kept[ids]
    flags = ks.tolist()
    removed, top_kept = _top(ids.tolist(), d.probs[ids].tolist(), flags, k)
    # a side the candidates hold too few of is taken over the vocabulary, the other side masked
    if len(removed) < min(k, n_cut):
        removed = _masked_top(d, kept, min(k, n_cut))
    if len(top_kept) < min(k, n_out):
        top_kept = _masked_top(d, ~kept, min(k, n_out))
    out: dict[str, Any] = {"removed": n_cut, "top_removed": removed, "top_kept": top_kept}
    return out, (ids[ks] if sum(flags) == n_out else None)


def stage_cut(before: torch.Tensor, after: torch.Tensor, k: int = STAGE_TOP,
              picks: tuple[int, int] | None = None) -> dict[str, Any]:
    """What one stage did to the distribution entering it (``before`` -> ``after``, 1-D logits).

    ``removed``: tokens live before (finite logit) and removed after; ``top_removed`` the
    ``k`` most probable of them and ``top_kept`` the ``k`` most probable survivors, each as
    ``[[id, p], ...]`` with ``p`` the probability *entering* the stage (the cut is drawn
    from these). With ``picks`` (the :func:`gumbel_pick` of ``before`` and of ``after`` under
    the run's noise for this position; a chain computes each once, as stage j's ``after`` is
    stage j+1's ``before``): ``gumbel_in`` / ``gumbel_out``, ``[id, p]``: the token the noise
    draws from the distribution entering / leaving the stage, with its probability entering
    it, so a reader sees which stage moved the draw (and what plain sampling's token was worth).
    :class:`Chain` records the same evidence with its stages sharing the work.
    """
    x = before.float()
    kept = after > NEG_INF
    d = _Dist(x, int((x > NEG_INF).sum()))
    out, _ = _cut(d, kept, int(kept.sum()), k)
    if picks is not None:
        for key, t in zip(("gumbel_in", "gumbel_out"), picks):
            out[key] = [int(t), _p(d.prob(int(t)))]
    return out


class _Stages:
    """The stage-by-stage evidence of one chain call, each stage's :func:`stage_cut`, with the
    work shared along the chain: a stage's exit is the next one's entry, so each distribution
    is examined once (its probabilities, its Gumbel pick), and once one has at most
    :data:`STAGE_SMALL` live tokens (the candidates of a cut held them all, or one ``topk``
    finds them) every later stage and pick is computed on those few candidates, whatever the
    vocabulary's size."""

    def __init__(self, x: torch.Tensor, raw: torch.Tensor, n: int, noise: torch.Tensor | None, k: int) -> None:
        self.k = k
        self.noise = None if noise is None else noise.detach().to(x.device, torch.float64)[: x.numel()]
        self.cur = self._dist(x, n, None, raw)

    def _dist(self, x: torch.Tensor, n: int, on: _Candidates | None, probs: torch.Tensor | None = None,
              masked_from: _Dist | None = None) -> _Dist:
        if on is None and n <= STAGE_SMALL:
            on = _Candidates(torch.topk(x, n).indices)
        d = _Dist(x, n, probs, on)
        if d.on is not None and len(d.order) != n:  # a rule revived a token: know it over the vocabulary
            d = _Dist(x, n, probs)
        if self.noise is not None:
            d.gumbel(self.noise, masked_from if d.on is None else None)
        return d

    def stage(self, after: torch.Tensor, kept: torch.Tensor, n_out: int, masks: bool = False) -> dict[str, Any]:
        """The cut of the stage from the current distribution to ``after`` (``kept`` its live
        mask, ``n_out`` its size; ``masks``: the stage only removed tokens); ``after`` becomes
        the current distribution."""
        d, k = self.cur, self.k
        if d.on is not None:
            nxt = self._dist(after, n_out, d.on)
            live = [v != NEG_INF for v in nxt.vals] if nxt.on is d.on else kept[d.on.ids].tolist()
            removed, top_kept = _top([d.on.ids_l[i] for i in d.order], [d.probs_l[i] for i in d.order],
                                     [live[i] for i in d.order], k)
            out: dict[str, Any] = {"removed": d.n - n_out, "top_removed": removed, "top_kept": top_kept}
        else:
            out, ids = _cut(d, kept, n_out, k)
            nxt = self._dist(after, n_out, None if ids is None else _Candidates(ids), masked_from=d if masks else None)
        self.cur = nxt
        if self.noise is not None:
            out["gumbel_in"] = [d.pick, _p(d.prob(d.pick))]
            out["gumbel_out"] = [nxt.pick, _p(d.prob(nxt.pick))]
        return out


def _sane(logits: torch.Tensor) -> torch.Tensor:
    """Logits softmax can digest: NaN counts as removed, and if any logit is +inf only those
    tokens stay (equally likely), the limit softmax takes as the others fall behind."""
    if bool(torch.isnan(logits).any()):
        logits = torch.nan_to_num(logits, nan=NEG_INF, posinf=float("inf"), neginf=NEG_INF)
    top = torch.isposinf(logits)
    if bool(top.any()):
        logits = torch.where(top, torch.zeros_like(logits), torch.full_like(logits, NEG_INF))
    return logits


class Chain:
    """An ordered list of processors; turns raw logits into the final distribution.

    The chain never empties: if a rule would remove every live token (say top-k = 1 then
    no-repeat-n-gram banning that token), the most probable token that was live before the
    rule is kept instead, and the rule's stage in the evidence says so (``emptied``/``note``);
    :attr:`emptied` lists those rules for the latest call. NaN never leaves the chain.
    """

    def __init__(self, processors: list[Processor]) -> None:
        self.processors = processors
        self.emptied: list[str] = []

    def __call__(self, logits: torch.Tensor, h: History,
                 stages: list[dict[str, Any]] | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Processed logits (at least one finite). With ``stages`` given, append per-stage
        evidence to it: kept count and mass, and :func:`stage_cut` (what the stage removed,
        and with the run's Gumbel ``noise`` where the draw moved)."""
        out = _sane(logits.float())
        live = torch.isfinite(out)
        if not bool(live.any()):
            raise PlaygroundError("the model returned no finite logits for this position")
        raw = torch.softmax(out, -1) if stages is not None else None
        ev = _Stages(out, raw, int(live.sum()), noise, STAGE_TOP) if raw is not None else None
        self.emptied = []
        for proc in self.processors:
            label = proc.label if stages is not None else ""
            before = out
            out = _sane(proc(out, h))
            kept = torch.isfinite(out)
            emptied = not bool(kept.any())
            if emptied:
                keep = int(torch.argmax(before))
                out = torch.full_like(before, NEG_INF)
                out[keep] = before[keep]
                kept = torch.isfinite(out)
                self.emptied.append(proc.label)
            if stages is not None and ev is not None and raw is not None:
                n_kept = int(kept.sum())
                stage = {"stage": label, "kept": n_kept, "kept_mass": round(float(raw[kept].sum()), 6),
                         **ev.stage(out, kept, n_kept, masks=proc.masks or emptied)}
                if emptied:
                    stage.update(emptied=True, note=EMPTIED_NOTE)
                stages.append(stage)
        return out

    def probs(self, logits: torch.Tensor, h: History,
              stages: list[dict[str, Any]] | None = None) -> torch.Tensor:
        """The final distribution: softmax of the processed logits (removed tokens get 0)."""
        return torch.softmax(self(logits, h, stages), -1)

    def observe(self, token: int, final_probs: torch.Tensor) -> None:
        """Tell the stateful processors which token was drawn."""
        for proc in self.processors:
            proc.observe(token, final_probs)

    @property
    def labels(self) -> list[str]:
        """The chain as text, in order."""
        return [p.label for p in self.processors]


def build_chain(knobs: dict[str, Any], tokenizer: Any = None, vocab_size: int = 0) -> Chain:
    """The chain for these knobs (missing knobs are neutral), in the order of ``order``.

    ``tokenizer``/``vocab_size`` are needed only by DRY (to find the breaker tokens).
    """
    k = {**chain_defaults(), **knobs}
    check_chain("sample", k)
    order = [s for s in str(k["order"]).split(",") if s]
    # an item's rules in the order registered (repetition, presence, then frequency penalty)
    procs = [r.from_knobs(k, tokenizer, vocab_size) for item in order for r in RULES if r.item == item and r.active(k)]
    return Chain(procs)


__all__ = [
    "BREGMAN_DIVERGENCES", "Breakers", "BregmanTopK", "Chain", "ChainParams", "DRY", "Epsilon", "Eta",
    "FrequencyPenalty", "History", "MinP", "Mirostat", "NoRepeatNGram", "PresencePenalty", "Processor", "RULES",
    "RepetitionPenalty", "STAGE_TOP", "Temperature", "TopK", "TopNSigma", "TopP", "Typical", "XTC", "active_items",
    "bregman_losses", "bregman_search", "breaker_sequences",
    "build_chain", "chain_defaults", "chain_params", "check_chain", "default_order", "forget_rule",
    "gumbel_pick", "order_items", "rule", "stage_cut",
]
