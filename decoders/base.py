"""Decoder registry, parameter specs and the run context.

A decoder is a class with a name, family, kind (``causal``/``diffusion``), a parameter
spec, a reference and a ``run(ctx)`` generator that yields :class:`~playground.core.trace.Step`
objects. The parameter spec is data: the CLI, the UI controls and input validation all
come from it.
"""

from __future__ import annotations

import math
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

import numpy as np
import torch

from decoders.citation import Paper
from playground.core.errors import Cancelled, PlaygroundError
from playground.core.trace import Step


# ---------------------------------------------------------------------- parameter specs
@dataclass(frozen=True)
class Param:
    """One knob: its default, allowed range or choices, and a one-line help text.

    ``cross_check(decoder, knobs)`` (optional) checks this knob together with its siblings once
    every knob is valid (the constraint stage refuses two grammars at once, say): a
    :class:`Params` runs each distinct cross-check of its knobs once per validation.
    """

    default: Any
    help: str = ""
    cross_check: Callable[[str, dict[str, Any]], None] | None = None
    type: ClassVar[str] = "any"

    def check(self, name: str, value: Any) -> Any:
        """Return ``value`` converted to this knob's type, or raise PlaygroundError."""
        return value

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON (for ``list-decoders --json`` and the UI)."""
        return {"type": self.type, "default": self.default, "help": self.help}


@dataclass(frozen=True)
class Float(Param):
    """A real-valued knob in ``[lo, hi]``."""

    lo: float = float("-inf")
    hi: float = float("inf")
    type: ClassVar[str] = "float"

    def __init__(self, default: float, lo: float, hi: float, help: str = "") -> None:
        object.__setattr__(self, "default", float(default))
        object.__setattr__(self, "lo", float(lo))
        object.__setattr__(self, "hi", float(hi))
        object.__setattr__(self, "help", help)

    def check(self, name: str, value: Any) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise PlaygroundError(f"knob {name!r} must be a number, got {value!r}") from None
        if not (self.lo <= v <= self.hi) or v != v:
            raise PlaygroundError(f"knob {name!r}={v:g} is out of range [{self.lo:g}, {self.hi:g}]")
        return v

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "min": self.lo, "max": self.hi}


@dataclass(frozen=True)
class Int(Param):
    """An integer knob in ``[lo, hi]``."""

    lo: int = 0
    hi: int = 2**31
    type: ClassVar[str] = "int"

    def __init__(self, default: int, lo: int, hi: int, help: str = "") -> None:
        object.__setattr__(self, "default", int(default))
        object.__setattr__(self, "lo", int(lo))
        object.__setattr__(self, "hi", int(hi))
        object.__setattr__(self, "help", help)

    def check(self, name: str, value: Any) -> int:
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise PlaygroundError(f"knob {name!r} must be an integer, got {value!r}") from None
        if not math.isfinite(f) or f != int(f):
            raise PlaygroundError(f"knob {name!r} must be an integer, got {value!r}")
        v = int(f)
        if not (self.lo <= v <= self.hi):
            raise PlaygroundError(f"knob {name!r}={v} is out of range [{self.lo}, {self.hi}]")
        return v

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "min": self.lo, "max": self.hi}


@dataclass(frozen=True)
class Bool(Param):
    """An on/off knob."""

    type: ClassVar[str] = "bool"

    def check(self, name: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise PlaygroundError(f"knob {name!r} must be true or false, got {value!r}")


@dataclass(frozen=True)
class Choice(Param):
    """A knob that takes one of a fixed set of strings."""

    choices: tuple[str, ...] = ()
    type: ClassVar[str] = "choice"

    def __init__(self, default: str, choices: tuple[str, ...] | list[str], help: str = "") -> None:
        object.__setattr__(self, "default", default)
        object.__setattr__(self, "choices", tuple(choices))
        object.__setattr__(self, "help", help)

    def check(self, name: str, value: Any) -> str:
        v = str(value)
        if v not in self.choices:
            raise PlaygroundError(f"knob {name!r}={v!r} is not one of: {', '.join(self.choices)}")
        return v

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "choices": list(self.choices)}


@dataclass(frozen=True)
class Text(Param):
    """A free-text knob, optionally restricted to comma lists of allowed items."""

    items: tuple[str, ...] = ()
    type: ClassVar[str] = "str"

    def __init__(self, default: str, help: str = "", items: tuple[str, ...] | list[str] = (),
                 cross_check: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        object.__setattr__(self, "default", default)
        object.__setattr__(self, "help", help)
        object.__setattr__(self, "items", tuple(items))
        object.__setattr__(self, "cross_check", cross_check)

    def check(self, name: str, value: Any) -> str:
        v = str(value)
        if self.items:
            parts = [p.strip() for p in v.split(",") if p.strip()]
            bad = [p for p in parts if p not in self.items]
            if bad:
                raise PlaygroundError(f"knob {name!r}: unknown item(s) {', '.join(bad)}; "
                                      f"allowed: {', '.join(self.items)}")
            if len(set(parts)) != len(parts):
                raise PlaygroundError(f"knob {name!r} names an item twice")
            v = ",".join(parts)
        return v

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.items:
            d["items"] = list(self.items)
        return d


def lens_param() -> Bool:
    """The ``logit_lens`` knob of the token-step decoders (see :func:`decoders.ar.lens_evidence`)."""
    return Bool(False, "logit lens: record, at every step, the top tokens each layer's hidden state "
                       "gives through the final norm and LM head (no extra forward)")


class Params(dict):
    """An ordered mapping knob name -> :class:`Param` (``Params(p=Float(...), ...)``)."""

    def __init__(self, **specs: Param) -> None:
        super().__init__(specs)

    def defaults(self) -> dict[str, Any]:
        """Every knob at its default."""
        return {k: p.default for k, p in self.items()}

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults overlaid with ``given``; unknown knobs and bad values raise PlaygroundError."""
        out = self.defaults()
        for k, v in (given or {}).items():
            if k not in self:
                known = ", ".join(self) or "none"
                raise PlaygroundError(f"decoder {decoder!r} has no knob {k!r} (knobs: {known})")
            out[k] = self[k].check(k, v)
        # each family of knobs refuses its bad combinations in one place (the constraint stage's
        # knobs declare its check), for every decoder that has them
        for check in dict.fromkeys(p.cross_check for p in self.values() if p.cross_check is not None):
            check(decoder, out)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON."""
        return {k: p.to_dict() for k, p in self.items()}


# ---------------------------------------------------------------------- run context
def random_stream(seed: int, index: int, stream: str) -> np.random.Generator:
    """The generator of the common random numbers of (seed, stream, index)."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(stream.encode()), int(index)])


def gumbel_noise(seed: int, index: int, n: int, stream: str = "sample") -> torch.Tensor:
    """:meth:`Context.gumbel` without a run: the noise of token ids ``0..n-1`` at position
    ``index`` of a run with ``seed`` (the first ``m`` of them do not depend on ``n``), so a
    recorded step's draw can be replayed on its top-K with no model (the sandbox)."""
    u = random_stream(seed, index, f"gumbel/{stream}").random(n)
    # u = 0 (chance 2^-53) would give -inf noise: the token could never be drawn.
    np.maximum(u, np.finfo(np.float64).tiny, out=u)
    return torch.from_numpy(-np.log(-np.log(u)))


@dataclass
class Context:
    """Everything one run of a decoder needs.

    ``target``/``draft`` are counting :class:`~playground.core.models.ModelView` objects.
    Randomness comes from :meth:`uniform`, :meth:`uniforms` and :meth:`gumbel`: the same
    seed gives every decoder the same numbers for the same (stream, index), the *common
    random numbers* that make two samplers differ by their rule and not by their luck.
    """

    target: Any
    prompt_ids: list[int]
    max_new_tokens: int
    params: dict[str, Any]
    seed: int = 0
    draft: Any = None
    stop_ids: set[int] = field(default_factory=set)
    stop_strings: list[str] = field(default_factory=list)
    top_k_evidence: int = 20
    cancel: threading.Event = field(default_factory=threading.Event)
    # forced tokens {position: token_id} that token_loop commits instead of its pick (playground/force.py)
    force: dict[int, int] = field(default_factory=dict)
    # a reader's commits at one step of a diffusion run (decoders.diffusion.hand.Hand), or None
    hand: Any = None
    # watched token ids (the run's ``watch`` list, resolved): token steps record their probabilities
    watch: tuple[int, ...] = ()

    def _rng(self, index: int, stream: str) -> np.random.Generator:
        return random_stream(self.seed, index, stream)

    def uniform(self, index: int, stream: str = "sample") -> float:
        """A uniform in [0, 1) fixed by (seed, stream, index): common random numbers."""
        return float(self._rng(index, stream).random())

    def uniforms(self, index: int, n: int, stream: str) -> np.ndarray:
        """``n`` uniforms fixed by (seed, stream, index)."""
        return self._rng(index, stream).random(n)

    def gumbel(self, index: int, n: int, stream: str = "sample") -> torch.Tensor:
        """Standard Gumbel noise for token ids ``0..n-1``, fixed by (seed, stream, index).

        The noise of token ``j`` depends only on the seed, the stream, the index (the
        position) and ``j`` - not on ``n``, the lane or its processor chain - so every lane
        that draws ``argmax(log p + g)`` at a position shares it (Gumbel-max coupling).
        Float64, from a stream of its own (``gumbel/<stream>``), never ``-inf``.
        """
        return gumbel_noise(self.seed, index, n, stream)

    def check_cancel(self) -> None:
        """Raise :class:`Cancelled` if the user pressed Stop."""
        if self.cancel.is_set():
            raise Cancelled()


# ---------------------------------------------------------------------- decoders & registry
# How a decoder may honour forced tokens (playground/force.py), and the marker that defers to its family.
FORCE_MODES = ("loop", "view")
FROM_FAMILY = "from_family"


class Decoder:
    """Base class of every decoder.

    Subclasses set the class attributes and implement :meth:`run`, yielding one
    :class:`Step` per decoding step, committed tokens in output order. ``run`` may set
    ``self.finish_reason`` (``eos``/``stop``/``length``) and ``self.extra_stats``.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    kind: ClassVar[str] = "causal"
    params: ClassVar[Params] = Params()
    reference: ClassVar[str] = ""
    # the linked sources behind the decoder (the catalogue links them; see decoders/citation.py)
    papers: ClassVar[tuple[Paper, ...]] = ()
    description: ClassVar[str] = ""
    needs_draft: ClassVar[bool] = False
    lossless: ClassVar[bool] = False
    step_kind: ClassVar[str] = "token"
    # How the decoder honours forced tokens (playground/force.py): "loop", "view", or None to
    # refuse them, saying ``force_refusal``. FROM_FAMILY defers to the family's declaration, so
    # a decoder that differs from its family says so here and nowhere else.
    force_mode: ClassVar[str | None] = FROM_FAMILY
    force_refusal: ClassVar[str] = ""
    # What its steps record beyond its step kind's and its family's evidence, for the catalogue
    # (a clause starting with "; ", or empty).
    shows: ClassVar[str] = ""

    def __init__(self) -> None:
        self.finish_reason = "length"
        self.extra_stats: dict[str, Any] = {}
        self.output_override: list[int] | None = None

    def run(self, ctx: Context) -> Iterator[Step]:
        """Decode, yielding steps. Subclasses implement this."""
        raise NotImplementedError

    def is_lossy(self, params: dict[str, Any]) -> bool:
        """Whether these knob values make the decoder change the target distribution."""
        return False

    @classmethod
    def spec(cls) -> dict[str, Any]:
        """The decoder's description as JSON (for ``list-decoders --json``)."""
        return {
            "name": cls.name, "family": cls.family, "kind": cls.kind,
            "params": cls.params.to_dict(), "reference": cls.reference,
            "description": cls.description or (cls.__doc__ or "").strip().split("\n")[0],
            "needs_draft": cls.needs_draft, "lossless": cls.lossless, "step_kind": cls.step_kind,
        }


REGISTRY: dict[str, type[Decoder]] = {}


def register(cls: type[Decoder]) -> type[Decoder]:
    """Class decorator: add a decoder to the registry under its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"decoder name {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


@dataclass(frozen=True)
class Family:
    """A decoder family, as its own module declares it (:func:`declare_family`).

    ``title`` and ``primer`` open the family's section of the catalogue (the primer says what
    its plots show, which decoder when, the knobs that matter); ``shows`` is what its steps
    record beyond their step kind's evidence (a clause starting with "; ", or empty); ``order``
    places the section (lower first; families with equal order by name). ``force_mode`` is how
    its decoders honour forced tokens by default (``"loop"``, ``"view"``, or None: refused,
    saying ``force_refusal``).
    """

    name: str
    title: str
    primer: str = ""
    shows: str = ""
    order: int = 1000
    force_mode: str | None = None
    force_refusal: str = ""


# Every family declared by its own module (declare_family); the catalogue and playground.force
# read their facts from here, so a new family touches nothing but its module.
FAMILY_INFO: dict[str, Family] = {}


def declare_family(name: str, title: str, primer: str = "", shows: str = "", *, order: int = 1000,
                   force_mode: str | None = None, force_refusal: str = "") -> Family:
    """Declare a family from its own module: its catalogue title, primer, extra evidence, place
    in the catalogue and default force mode. The same declaration twice is a no-op (a module
    imported again), a different one a ValueError."""
    if force_mode not in (None, *FORCE_MODES):
        raise ValueError(f"force_mode must be one of {FORCE_MODES} or None, got {force_mode!r}")
    fam = Family(str(name), str(title), str(primer), str(shows), int(order), force_mode, str(force_refusal))
    if not fam.name or not fam.title:
        raise ValueError("a family needs a name and a title")
    if FAMILY_INFO.get(fam.name, fam) != fam:
        raise ValueError(f"family {fam.name!r} is already declared differently")
    FAMILY_INFO[fam.name] = fam
    return fam


def forget_family(name: str) -> None:
    """Remove a declared family (for tests that declare one of their own)."""
    FAMILY_INFO.pop(name, None)


def family_of(name: str) -> Family:
    """The declared family ``name``, or an undeclared one titled by its name (no primer, forced
    tokens refused)."""
    return FAMILY_INFO.get(name) or Family(name, name.title())


def unregister(name: str) -> None:
    """Remove decoder ``name`` from the registry (for tests that register one of their own)."""
    REGISTRY.pop(name, None)


def get_decoder(name: str) -> type[Decoder]:
    """The decoder class registered as ``name``, or a PlaygroundError naming the choices.

    Every family is registered already: importing this module first ran ``decoders/__init__``,
    which imports them all."""
    if name not in REGISTRY:
        raise PlaygroundError(f"unknown decoder {name!r}; try `playground list-decoders`")
    return REGISTRY[name]


def all_decoders() -> list[type[Decoder]]:
    """Every registered decoder, by family then name (all families: see :func:`get_decoder`)."""
    return sorted(REGISTRY.values(), key=lambda c: (c.family, c.name))


def check_stop(ctx: Context, output: list[int], decode: Any = None) -> str | None:
    """``eos``/``stop`` if the output just ended on a stop token or stop string, else None."""
    if output and output[-1] in ctx.stop_ids:
        return "eos" if output[-1] in getattr(ctx.target, "eos_ids", set()) else "stop"
    if ctx.stop_strings and decode is not None:
        tail = decode(output[-32:])
        if any(s and s in tail for s in ctx.stop_strings):
            return "stop"
    return None


__all__ = [
    "Bool", "Cancelled", "Choice", "Context", "Decoder", "FAMILY_INFO", "FORCE_MODES", "FROM_FAMILY", "Family", "Float", "Int", "Param", "Params",
    "PlaygroundError", "REGISTRY", "Text", "all_decoders", "check_stop", "declare_family", "family_of", "forget_family", "get_decoder",
    "lens_param", "register", "unregister",
]
