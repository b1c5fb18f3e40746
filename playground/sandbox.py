"""The sampler sandbox: a next-token distribution typed by hand (or taken from a recorded step)
run through the sampler chain stage by stage, with no model.

The chain is the decoders' own (:func:`decoders.processors.build_chain`, the same processors
and their per-stage evidence), and the draw is theirs too: Gumbel-max with the run's common
random numbers (:func:`decoders.base.gumbel_noise`). A typed distribution's tokens are ids
``0..N-1`` and their noise is that of position ``position`` of a run with ``seed``; a recorded
step keeps its token ids, its run's seed and position, so the sandbox's draw is the run's
whenever the run drew from the recorded top-K.

A recorded step holds only its top-K (K = 20 by default) of the raw distribution. Rules that
compare probabilities with each other (top-k, min-p, top-nσ, temperature) cut it as the run
did; rules that measure mass (top-p, typical, ε, η) see the top-K renormalised, so their cut can
differ from the run's: the result says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from decoders.ar import dist_evidence
from decoders.base import gumbel_noise
from decoders.processors import History, build_chain, chain_params, gumbel_pick
from playground.core.errors import PlaygroundError

MAX_TOKENS = 200  # tokens of one typed distribution
MAX_LABEL = 32  # characters of one token's label
MAX_TEXT = MAX_TOKENS * (MAX_LABEL + 24)
# The chain's rules that act on one distribution alone (penalties, DRY and n-gram bans need a
# context, mirostat and XTC a run's history or a second random stream): the sandbox's knobs.
KNOBS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon", "eta", "top_n_sigma", "order")
MASS_RULES = ("top_p", "typical_p", "epsilon", "eta")  # measured on the mass, not on ratios
KINDS = ("probabilities", "logits")
_LINE = re.compile(r"\s*(.+?)\s+(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|-?\.\d+(?:[eE][-+]?\d+)?)\s*")


@dataclass
class Distribution:
    """A distribution the sandbox cuts: each token's label and logit, the token ids the noise
    is keyed by, and the run's seed and position (the sandbox's own for a typed one)."""

    labels: list[str]
    logits: torch.Tensor
    ids: list[int]
    seed: int = 0
    position: int = 0
    recorded: bool = False  # a recorded step's top-K (mass rules see it renormalised)
    source: str = "typed"


def parse_distribution(text: Any, kind: str = "probabilities", seed: Any = 0) -> Distribution:
    """A typed distribution: one ``token value`` per line (the value last, the token's label
    before it, spaces inside kept; ``\\n`` and ``\\t`` in a label stand for those characters).
    Probabilities need not sum to 1 (they are normalised); logits are taken as they are."""
    if kind not in KINDS:
        raise PlaygroundError(f"values are {' or '.join(KINDS)}, not {kind!r}")
    if not isinstance(text, str) or not text.strip():
        raise PlaygroundError("type a distribution: one 'token value' per line, e.g. 'the 0.5'")
    if len(text) > MAX_TEXT:
        raise PlaygroundError(f"the distribution has {len(text)} characters; at most {MAX_TEXT}")
    labels, values = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise PlaygroundError(f"line {n}: {line.strip()[:40]!r} is not 'token value'")
        label = m.group(1).replace("\\n", "\n").replace("\\t", "\t")
        if len(label) > MAX_LABEL:
            raise PlaygroundError(f"line {n}: a token label has at most {MAX_LABEL} characters")
        if label in labels:
            raise PlaygroundError(f"line {n}: token {label!r} is listed twice")
        v = float(m.group(2))
        if not math.isfinite(v) or (kind == "probabilities" and v < 0):
            raise PlaygroundError(f"line {n}: {m.group(2)} is not a {'probability' if kind == 'probabilities' else 'logit'}")
        labels.append(label)
        values.append(v)
    if len(labels) > MAX_TOKENS:
        raise PlaygroundError(f"{len(labels)} tokens; the sandbox takes at most {MAX_TOKENS}")
    if len(labels) < 2:
        raise PlaygroundError("a distribution needs at least two tokens")
    x = torch.tensor(values, dtype=torch.float64)
    if kind == "probabilities":
        if float(x.sum()) <= 0:
            raise PlaygroundError("the probabilities sum to 0")
        logits = torch.log(x / x.sum()).float()
    else:
        logits = x.float()
    return Distribution(labels, logits, list(range(len(labels))), seed=_seed(seed), position=0)


def recorded_step(trace: Any, step: Any) -> Distribution:
    """The raw top-K distribution a token step recorded (``dist``), with its token ids, and the
    run's seed and the step's output position (its noise)."""
    steps = trace.get("steps") if isinstance(trace, dict) and isinstance(trace.get("steps"), list) else []
    if not steps:
        raise PlaygroundError("that lane has no steps")
    try:
        i = int(step)
    except (TypeError, ValueError, OverflowError):
        raise PlaygroundError(f"the step must be a whole number, got {step!r}") from None
    if not 0 <= i < len(steps):
        raise PlaygroundError(f"the lane has steps 0 to {len(steps) - 1}")
    s = steps[i]
    d = s.get("dist") if isinstance(s, dict) else None
    if s.get("kind") != "token" or not isinstance(d, dict):
        raise PlaygroundError(f"step {i} is not a token step with a recorded distribution")
    ids = [int(t) for t in d.get("top_ids") or []]
    probs = [float(p) for p in d.get("raw_probs") or []]
    if len(ids) < 2 or len(ids) != len(probs) or any(p <= 0 for p in probs):
        raise PlaygroundError(f"step {i} recorded no usable distribution")
    position = sum(len(x.get("committed") or []) for x in steps[:i])
    tokens = trace.get("tokens") or {}
    labels = [str(tokens.get(str(t), f"#{t}")) for t in ids]
    return Distribution(labels, torch.log(torch.tensor(probs, dtype=torch.float64)).float(), ids,
                        seed=_seed(trace.get("seed")), position=position, recorded=True,
                        source=f"step {i} of a {trace.get('decoder', '?')} lane")


def check_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """The sandbox's knobs checked by the chain's own specs (unknown ones refused)."""
    specs = chain_params()
    out = {}
    for k, v in (knobs or {}).items():
        if k not in KNOBS:
            raise PlaygroundError(f"the sandbox has no knob {k!r} (knobs: {', '.join(KNOBS)})")
        if v is None or v == "":
            continue
        out[k] = specs[k].check(k, v)
    return out


class _Labels:
    """A tokenizer stand-in whose tokens are the sandbox's labels (``dist_evidence`` reads text
    through a view's tokenizer)."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels

    def decode(self, ids: list[int], **_kw: Any) -> str:
        return "".join(self.labels[i] for i in ids)


@dataclass
class _LabelView:
    tokenizer: _Labels


def apply_chain(dist: Distribution, knobs: dict[str, Any]) -> dict[str, Any]:
    """Run ``dist`` through the chain of ``knobs`` and draw: a one-step trace the inspector's
    plots read (``chain``, ``dist``), its tokens labelled, plus ``drawn`` (label) and ``note``."""
    k = check_knobs(knobs)
    chain = build_chain(k)
    n = len(dist.labels)
    # the run's noise at the distribution's token ids (a typed one: ids 0..N-1)
    noise = gumbel_noise(dist.seed, dist.position, max(dist.ids) + 1)[dist.ids]
    stages: list[dict[str, Any]] = []
    out = chain(dist.logits.clone(), History(ids=[], prompt_len=0, pos=dist.position), stages, noise)
    final = torch.softmax(out, -1)
    pick = gumbel_pick(out, noise)
    ev = dist_evidence(_LabelView(_Labels(dist.labels)), dist.logits, final, pick, k=n)
    mass = [r for r in MASS_RULES if _acts(r, k)]
    note = ""
    if dist.recorded and mass:
        note = (f"{', '.join(mass)} measure mass: here on the recorded top-{n} renormalised, so the cut can "
                "differ from the run's")
    trace = {"decoder": "sandbox", "seed": dist.seed, "tokens": {str(i): lab for i, lab in enumerate(dist.labels)},
             "params": {**k, "coupling": "gumbel"}, "steps": [{"i": 0, "kind": "token", "committed": [pick],
                                                               "dist": ev, "chain": stages}]}
    return {"trace": trace, "drawn": dist.labels[pick], "drawn_id": dist.ids[pick], "chain": chain.labels,
            "final": {dist.labels[i]: round(float(final[i]), 6) for i in range(n) if float(final[i]) > 0},
            "note": note, "source": dist.source}


def _acts(rule: str, k: dict[str, Any]) -> bool:
    """Whether a mass rule is set away from its neutral value."""
    spec = chain_params()[rule]
    return k.get(rule, spec.default) != spec.default


def _seed(x: Any) -> int:
    try:
        return int(x)
    except (TypeError, ValueError, OverflowError):
        return 0


__all__ = ["KINDS", "KNOBS", "MAX_TOKENS", "Distribution", "apply_chain", "check_knobs", "parse_distribution",
           "recorded_step"]
