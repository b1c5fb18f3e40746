"""The trace: what a decoder did, step by step, as versioned JSON (a contract).

A decoder yields :class:`Step` objects carrying the tokens they committed and the evidence
of their kind (``dist``, ``tree``, ``canvas`` ...). :class:`TraceRecorder` stamps each step
with its index, time and the *measured* forward counts of the model views, and builds the
final :class:`Trace` with its stats. See docs/architecture.md, "Trace schema", for the field list.

A run with forced tokens (a branch, ``playground/force.py``) keeps them as ``force``
(``[[position, token_id], ...]``, positions in generated tokens from 0), and each step that
committed one says so in ``forced`` (``[{"position", "token"}]``, plus ``picked``, the token
the decoder's own rule chose, where the decoder records it), so a replay shows the edits.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

SCHEMA = 1


@dataclass(frozen=True)
class StepKind:
    """A step kind as the rest of the app needs it: ``shows`` (one line for the catalogue: the
    evidence its steps carry) and ``id_keys`` (the evidence keys whose values are token ids, an
    id or a list of them, so a replay can show their text without a tokenizer)."""

    name: str
    shows: str
    id_keys: tuple[str, ...] = ()


# The registry of step kinds: the five built in here; a decoder module that yields steps of a
# new kind declares it with declare_step_kind (the catalogue, the validator and replays read it).
STEP_KINDS: dict[str, StepKind] = {k.name: k for k in (
    StepKind("token", "per-step distribution (top-K raw vs final probabilities, chosen token and rank, "
                      "entropy, kept mass)", ("top_ids", "chosen", "token",
                                              # the sampler chain's stages ([id, p] pairs)
                                              "top_removed", "top_kept", "gumbel_in", "gumbel_out")),
    StepKind("draft", "the draft tree of every step (q, p, acceptance probability, accepted path, correction "
                      "or bonus token, source)", ("token", "correction", "top_ids", "chosen")),
    StepKind("denoise", "the canvas at every step (which positions were unmasked, confidence, entropy and "
                        "margin per position, block)", ("canvas", "predicted")),
    StepKind("beam", "the beams at every step (ids, scores, parents, finished)", ("ids",)),
    StepKind("jacobi", "the Jacobi window at every iteration (guesses and converged prefix)", ("guess",)),
)}
# Token-id keys of every trace, whatever its steps: the trace's own ids, each step's commits
# and evidence any kind may carry (a forced token; the sequences of a search's stats).
BASE_ID_KEYS = ("prompt_ids", "output_ids", "committed", "token", "ids")


def declare_step_kind(name: str, shows: str, id_keys: Sequence[str] = ()) -> StepKind:
    """Register a new step kind (from the decoder module that yields it); declaring the same
    kind again with the same fields is a no-op, with other fields a ValueError."""
    kind = StepKind(str(name), str(shows), tuple(id_keys))
    if not kind.name or not kind.shows:
        raise ValueError("a step kind needs a name and a line saying what its steps show")
    if STEP_KINDS.get(kind.name, kind) != kind:
        raise ValueError(f"step kind {kind.name!r} is already declared differently")
    STEP_KINDS[kind.name] = kind
    return kind


def forget_step_kind(name: str) -> None:
    """Remove a declared step kind (for tests that declare one of their own)."""
    STEP_KINDS.pop(name, None)


def token_id_keys() -> frozenset[str]:
    """Every key whose value holds token ids, over all declared step kinds (for replays)."""
    return frozenset(BASE_ID_KEYS).union(*(k.id_keys for k in STEP_KINDS.values()))


FINISH_REASONS = ("length", "stop", "eos", "constraint", "cancelled", "error")
TRACE_FIELDS = (
    "schema", "model", "decoder", "params", "seed", "prompt", "prompt_ids",
    "output_ids", "text", "stats", "steps",
)


@dataclass
class Step:
    """One decoding step: its kind, the token ids it committed, and its evidence.

    ``evidence`` holds the kind-specific fields (``dist`` for token steps, ``tree`` for
    draft steps, ``canvas``/``unmasked``/... for denoise steps, ``beams``, ``guess``/
    ``converged``). ``i``, ``t`` and the forward counts are stamped by the recorder.
    """

    kind: str
    committed: list[int]
    evidence: dict[str, Any] = field(default_factory=dict)
    i: int = -1
    t: float = 0.0
    target_forwards: int = 0
    draft_forwards: int = 0

    def __init__(self, kind: str, committed: Iterable[int] = (), **evidence: Any) -> None:
        if kind not in STEP_KINDS:
            raise ValueError(f"unknown step kind {kind!r}")
        self.kind = kind
        self.committed = [int(x) for x in committed]
        self.evidence = evidence
        self.i, self.t, self.target_forwards, self.draft_forwards = -1, 0.0, 0, 0

    def to_dict(self) -> dict[str, Any]:
        """The step as the JSON object of the trace schema."""
        d = {
            "i": self.i, "kind": self.kind, "t": round(self.t, 6),
            "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
            "committed": list(self.committed),
        }
        d.update(self.evidence)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Step":
        """Rebuild a step from its JSON object."""
        base = {"i", "kind", "t", "target_forwards", "draft_forwards", "committed"}
        s = cls(d["kind"], d.get("committed", []), **{k: v for k, v in d.items() if k not in base})
        s.i, s.t = int(d.get("i", -1)), float(d.get("t", 0.0))
        s.target_forwards = int(d.get("target_forwards", 0))
        s.draft_forwards = int(d.get("draft_forwards", 0))
        return s


@dataclass
class Trace:
    """A finished (or stopped) run: everything needed to replay it without a model."""

    model: str
    decoder: str
    params: dict[str, Any]
    seed: int
    prompt: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    schema: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The trace as a JSON-ready dict (schema field first)."""
        d = {
            "schema": self.schema, "model": self.model, "decoder": self.decoder,
            "params": self.params, "seed": self.seed, "prompt": self.prompt,
            "prompt_ids": list(self.prompt_ids), "output_ids": list(self.output_ids),
            "text": self.text, "stats": self.stats,
            "steps": [s.to_dict() for s in self.steps],
        }
        d.update(self.extra)
        return d

    def to_json(self, **kw: Any) -> str:
        """Serialise to JSON text."""
        return json.dumps(self.to_dict(), ensure_ascii=False, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trace":
        """Rebuild a trace from its dict, after validating it against the schema."""
        validate_trace_dict(d)
        extra = {k: v for k, v in d.items() if k not in TRACE_FIELDS}
        return cls(
            model=d["model"], decoder=d["decoder"], params=dict(d["params"]),
            seed=int(d["seed"]), prompt=d["prompt"], prompt_ids=list(d["prompt_ids"]),
            output_ids=list(d["output_ids"]), text=d["text"], stats=dict(d["stats"]),
            steps=[Step.from_dict(s) for s in d["steps"]], schema=int(d["schema"]),
            extra=extra,
        )

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        """Parse a trace from JSON text."""
        return cls.from_dict(json.loads(text))


def validate_trace_dict(d: Any) -> None:
    """Raise ``ValueError`` with one line naming the first thing wrong with a trace dict."""
    if not isinstance(d, dict):
        raise ValueError("a trace must be a JSON object")
    missing = [k for k in TRACE_FIELDS if k not in d]
    if missing:
        raise ValueError(f"trace is missing field(s): {', '.join(missing)}")
    if not isinstance(d["schema"], int) or d["schema"] > SCHEMA or d["schema"] < 1:
        raise ValueError(f"unsupported trace schema {d['schema']!r} (this version reads 1..{SCHEMA})")
    for key, typ in (("model", str), ("decoder", str), ("prompt", str), ("text", str),
                     ("params", dict), ("stats", dict), ("prompt_ids", list),
                     ("output_ids", list), ("steps", list)):
        if not isinstance(d[key], typ):
            raise ValueError(f"trace field {key!r} must be {typ.__name__}")
    for j, s in enumerate(d["steps"]):
        if not isinstance(s, dict) or s.get("kind") not in STEP_KINDS:
            raise ValueError(f"trace step {j} has no valid kind")
        if not isinstance(s.get("committed", []), list):
            raise ValueError(f"trace step {j}: 'committed' must be a list")
    force = d.get("force")
    if force is not None and not (isinstance(force, list) and all(
            isinstance(f, list) and len(f) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                        for x in f) for f in force)):
        raise ValueError("trace field 'force' must be a list of [position, token_id] pairs")
    _check_consistency(d)


# Step kinds whose committed tokens, in order, are the output (the others' output is chosen at
# the end: a search's best hypothesis, a diffusion canvas).
OUTPUT_KINDS = ("token", "draft", "jacobi")


def _check_consistency(d: dict[str, Any]) -> None:
    """The counts of a trace agree with each other: ids are token ids (non-negative integers,
    and keys of the trace's own vocabulary, its ``tokens`` texts, where it carries one); the
    output of a run whose steps all commit output tokens is those tokens, in order (cut at
    ``max_new_tokens``); ``stats.new_tokens`` is :func:`committed_count` and ``stats.steps``
    the number of steps."""
    vocab = d.get("tokens")
    for key in ("prompt_ids", "output_ids"):
        bad = next((x for x in d[key] if not (isinstance(x, int) and not isinstance(x, bool) and x >= 0)), None)
        if bad is not None:
            raise ValueError(f"trace field {key!r} holds {bad!r}, which is not a token id")
    for j, s in enumerate(d["steps"]):
        bad = next((x for x in s.get("committed", []) if not (isinstance(x, int) and not isinstance(x, bool)
                                                               and x >= 0)), None)
        if bad is not None:
            raise ValueError(f"trace step {j}: 'committed' holds {bad!r}, which is not a token id")
    if isinstance(vocab, dict):
        for key in ("prompt_ids", "output_ids"):
            unknown = next((x for x in d[key] if str(x) not in vocab), None)
            if unknown is not None:
                raise ValueError(f"trace field {key!r} holds token {unknown}, which is not in the trace's "
                                 f"vocabulary ('tokens' names {len(vocab)} ids)")
    steps = d["steps"]
    if steps and all(s.get("kind") in OUTPUT_KINDS for s in steps):
        committed = [x for s in steps for x in s.get("committed", [])]
        out = d["output_ids"]
        if committed[:len(out)] != out:
            raise ValueError(f"trace output_ids ({len(out)} tokens) are not the tokens its steps committed "
                             f"({len(committed)})")
    stats = d["stats"]
    n = stats.get("new_tokens")
    if n is not None:
        want = committed_count(d["output_ids"], steps)
        if not isinstance(n, int) or isinstance(n, bool) or n != want:
            raise ValueError(f"trace stats.new_tokens is {n!r}, but its output holds {want} committed tokens")
    k = stats.get("steps")
    if k is not None and k != len(steps):
        raise ValueError(f"trace stats.steps is {k!r}, but it has {len(steps)} steps")


# ---------------------------------------------------------------------- figures
# Each figure has one definition, here; the decoders' stats, the plots, the lane's stats
# line and the benches compute it with these functions and show it under these names
# (docs/internals.md, "Stats and figures").
FIGURE_NAMES = {
    "new_tokens": "tokens",
    "tokens_per_target_forward": "tokens/forward",
    "acceptance_rate": "acceptance",
    "mean_accepted_length": "mean accepted length",
    "tokens_per_verification": "tokens per verification",
    "changed_tokens": "changed tokens",
    "lossy_tokens": "lossily accepted tokens",
    "watermark_z": "watermark z",
}


def speculative_figures(drafted: int, accepted: int, verifications: int, committed: int) -> dict[str, float]:
    """The speculative figures of ``verifications`` draft-then-verify steps.

    ``acceptance_rate`` = accepted drafted tokens / drafted tokens (every drafted token of a
    tree counts, so a wide tree scores lower than a chain that accepts as much);
    ``mean_accepted_length`` = accepted drafted tokens / verifications;
    ``tokens_per_verification`` = tokens the verifications committed (accepted plus the
    target's correction or bonus token) / verifications. 0.0 where the divisor is 0.
    """
    def ratio(a: int, b: int) -> float:
        return round(a / b, 4) if b else 0.0

    return {"acceptance_rate": ratio(accepted, drafted),
            "mean_accepted_length": ratio(accepted, verifications),
            "tokens_per_verification": ratio(committed, verifications)}


def _as_dict(step: Any) -> dict[str, Any]:
    """A step's JSON-shaped fields, for a :class:`Step` or its dict (anything else: empty)."""
    if isinstance(step, Step):
        return {**step.evidence, "kind": step.kind, "committed": step.committed}
    return step if isinstance(step, dict) else {}


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _node_id(x: Any) -> bool:
    """Whether ``x`` can name a tree node (hashable and not None)."""
    try:
        hash(x)
    except TypeError:
        return False
    return x is not None


def _ids(xs: Any) -> list[int]:
    return [x for x in xs if _int(x) is not None] if isinstance(xs, list) else []


def draft_nodes(tree: Any) -> list[dict[str, Any]]:
    """The drafted nodes of a ``tree`` evidence dict: every node with an ``id`` (each is a
    drafted token, whether the verifier reached it or not)."""
    if not isinstance(tree, dict) or not isinstance(tree.get("nodes"), list):
        return []
    return [n for n in tree["nodes"] if isinstance(n, dict) and _node_id(n.get("id"))]


def accepted_nodes(tree: Any) -> list[dict[str, Any]]:
    """The accepted drafted nodes of a tree, in path order (``accepted_path``, else the nodes
    flagged ``accepted``)."""
    nodes = draft_nodes(tree)
    path = tree.get("accepted_path") if isinstance(tree, dict) else None
    if isinstance(path, list):
        by_id = {n["id"]: n for n in nodes}
        return [by_id.get(i, {"id": i}) for i in path if _node_id(i)]
    return [n for n in nodes if n.get("accepted") is True]


def draft_counts(steps: Sequence[Any]) -> tuple[int, int, int, int] | None:
    """(drafted, accepted, verifications, committed) over the verifications of ``steps``
    (:class:`Step` objects or their dicts), or None when there is none.

    A draft step drafted every node of its tree (:func:`draft_nodes`) and accepted its path;
    a Jacobi iteration drafted its guess window and accepted its ``fixed`` prefix. The
    decoders' ``drafted_tokens``/``accepted_tokens``/``verifications`` stats count the same."""
    drafted = accepted = verifications = committed = 0
    for s in map(_as_dict, steps):
        if s.get("kind") == "draft" and isinstance(s.get("tree"), dict):
            drafted += len(draft_nodes(s["tree"]))
            accepted += len(accepted_nodes(s["tree"]))
        elif s.get("kind") == "jacobi" and isinstance(s.get("guess"), list):
            drafted += len(_ids(s["guess"]))
            accepted += _int(s.get("fixed")) or 0
        else:
            continue
        verifications += 1
        committed += len(_ids(s.get("committed")))
    return (drafted, accepted, verifications, committed) if verifications else None


def step_figures(steps: Sequence[Any]) -> dict[str, Any]:
    """Every figure a trace's steps define, by the definitions above, under the stats' names:
    the speculative figures and their counts (``drafted_tokens``, ``accepted_tokens``,
    ``verifications``) where there are verifications; ``changed_tokens`` (accepted drafted
    tokens flagged ``changed``: the verifier would have chosen another token) and
    ``lossy_tokens`` (accepted by a lossy rule, flagged ``lossy``) where a tree flags any
    node so; the watermark figures where steps carry ``watermark`` evidence
    (:func:`watermark_figures`). The decoders' stats, the stats line and the plots all
    equal these (``tests/test_figures_one_number.py``)."""
    out: dict[str, Any] = {}
    counts = draft_counts(steps)
    if counts is not None:
        drafted, accepted, verifications, _ = counts
        out.update(speculative_figures(*counts), drafted_tokens=drafted, accepted_tokens=accepted,
                   verifications=verifications)
        trees = [d["tree"] for d in map(_as_dict, steps) if d.get("kind") == "draft" and isinstance(d.get("tree"), dict)]
        for key, flag in (("changed_tokens", "changed"), ("lossy_tokens", "lossy")):
            if any(flag in n for t in trees for n in draft_nodes(t)):
                out[key] = sum(1 for t in trees for n in accepted_nodes(t) if n.get(flag) is True)
    wm = watermark_figures(steps)
    if wm is not None:
        out["watermark"] = wm
    return out


def z_score(green: int, scored: int, gamma: float) -> float:
    """The watermark detector's figure: how many standard deviations ``green`` of ``scored``
    tokens is above the ``gamma * scored`` expected of text written without the key."""
    if scored <= 0:
        return 0.0
    return (green - gamma * scored) / math.sqrt(scored * gamma * (1.0 - gamma))


def p_value(z: float) -> float:
    """One-sided p-value of a z-score under the null (text written without the key)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def watermark_figures(steps: Sequence[Any]) -> dict[str, Any] | None:
    """The watermark figures of the steps' ``watermark`` evidence (one scored token per
    step whose ``green`` is true or false; None means unscored): ``z``, ``p_value``,
    ``scored``, ``green``, ``green_fraction``, ``gamma``; None without watermark evidence.
    The ``watermark`` decoder's stats and the detector's result on the same token ids
    (:func:`decoders.guided.watermark.detect`) are these."""
    marks = [d["watermark"] for d in map(_as_dict, steps) if isinstance(d.get("watermark"), dict)]
    if not marks:
        return None
    gamma = marks[-1].get("gamma")
    if not isinstance(gamma, (int, float)) or not 0.0 < gamma < 1.0:
        return None
    flags = [m.get("green") for m in marks if isinstance(m.get("green"), bool)]
    scored, green = len(flags), sum(flags)
    z = z_score(green, scored, float(gamma))
    return {"z": round(z, 4), "p_value": p_value(z), "scored": scored, "green": green,
            "green_fraction": round(green / scored, 6) if scored else None, "gamma": gamma}


def mask_id_in(steps: Sequence[Any]) -> int | None:
    """The mask id of the last denoise step (a :class:`Step` or its dict), or None."""
    for s in reversed(steps):
        kind = s.kind if isinstance(s, Step) else (s.get("kind") if isinstance(s, dict) else None)
        if kind == "denoise":
            ev = s.evidence if isinstance(s, Step) else s
            m = ev.get("mask_id")
            return m if isinstance(m, int) and not isinstance(m, bool) else None
    return None


def committed_count(output_ids: Sequence[int], steps: Sequence[Any]) -> int:
    """The ``new_tokens`` figure: output positions holding a committed token.

    A causal run's output is all committed tokens. A diffusion run's output is its canvas,
    and a run stopped (or snapshotted) before the canvas is full still has masks there:
    those positions are not tokens, so they are not counted.
    """
    mask = mask_id_in(steps)
    if mask is None:
        return len(output_ids)
    return sum(1 for t in output_ids if t != mask)


class TraceRecorder:
    """Stamps steps as a decoder yields them and computes the trace's measured stats.

    The forward counts come from the model views (``target``/``draft``), which count
    every call themselves; the decoder never reports its own cost.
    """

    def __init__(self, trace: Trace, target: Any, draft: Any = None) -> None:
        self.trace = trace
        self.target, self.draft = target, draft
        self.start = time.perf_counter()
        self.first_token_s: float | None = None
        self.finish_reason = "length"
        # forced tokens of a branch ({position: token_id}); see playground/force.py
        self.force: dict[int, int] = {}
        self._position = 0

    def now(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    def draft_count(self, what: str) -> int:
        """Draft ``forwards``/``tokens``: the draft model's, plus the target's early-exit
        (self-speculative) forwards, which its view counts as draft work."""
        n = getattr(self.draft, what, 0) if self.draft is not None else 0
        return int(n) + int(getattr(self.target, f"draft_{what}", 0) or 0) if self.target is not None else int(n)

    def add(self, step: Step) -> Step:
        """Stamp ``step`` with index, time and cumulative forward counts; keep it."""
        step.i = len(self.trace.steps)
        step.t = self.now()
        step.target_forwards = self.target.forwards if self.target is not None else 0
        step.draft_forwards = self.draft_count("forwards")
        if self.first_token_s is None and step.committed:
            self.first_token_s = step.t
        if step.kind != "denoise":
            self._mark_forced(step)
        self.trace.steps.append(step)
        return step

    def _mark_forced(self, step: Step) -> None:
        """Mark a step that committed a forced position (``forced``), unless its decoder did."""
        start, self._position = self._position, self._position + len(step.committed)
        if not self.force or "forced" in step.evidence:
            return
        hits = [{"position": p, "token": t} for p, t in self.force.items() if start <= p < self._position]
        if hits:
            step.evidence["forced"] = hits

    def finish(self, output_ids: list[int], text: str, reason: str, **more: Any) -> Trace:
        """Close the trace: output, text and the stats the schema names (all measured)."""
        tr = self.trace
        tr.output_ids, tr.text = [int(x) for x in output_ids], text
        tf = self.target.forwards if self.target is not None else 0
        df = self.draft_count("forwards")
        n = committed_count(tr.output_ids, tr.steps)
        tr.stats = {
            "new_tokens": n,
            "target_forwards": tf,
            "draft_forwards": df,
            "tokens_per_target_forward": round(n / tf, 4) if tf else 0.0,
            "wall_s": round(self.now(), 4),
            "first_token_s": round(self.first_token_s, 4) if self.first_token_s is not None else None,
            "finish_reason": reason,
            "target_tokens_processed": self.target.tokens if self.target is not None else 0,
            "draft_tokens_processed": self.draft_count("tokens"),
            "steps": len(tr.steps),
        }
        if n < len(tr.output_ids):
            tr.stats["masked_positions"] = len(tr.output_ids) - n
        tr.stats.update(more)
        return tr


# ---------------------------------------------------------------------- acceptance by draft position
def draft_depths(nodes: Sequence[Any]) -> list[int]:
    """The depth of each draft-tree node (1 = a child of the root), from the ``tree`` evidence's
    ``nodes`` (``{"id", "parent", ...}``, parents listed before children; a parent missing from
    the list counts as the root)."""
    depth: dict[Any, int] = {}
    out = []
    for n in nodes:
        d = depth.get(n.get("parent"), 0) + 1 if isinstance(n, dict) else 1
        if isinstance(n, dict):
            depth[n.get("id")] = d
        out.append(d)
    return out


def acceptance_by_position(trees: Iterable[dict[str, Any]]) -> dict[str, list[Any]]:
    """The ``acceptance_by_position`` figure of a run's verifications (their ``tree`` evidence).

    Index ``i`` (position ``i + 1`` of the draft): ``offered`` = verifications whose draft reached
    that depth; ``accepted`` = verifications that accepted a token there (so that many accepted
    at least ``i + 1`` tokens); ``drafted`` = draft nodes at that depth (a tree drafts several);
    ``rate`` = accepted / offered. ``sum(accepted)`` is the run's ``accepted_tokens`` and
    ``sum(drafted)`` its ``drafted_tokens``; for a chain draft ``offered == drafted``. Under
    i.i.d. acceptance with per-token rate α, ``rate[i]`` is α^(i+1).
    """
    offered: list[int] = []
    accepted: list[int] = []
    drafted: list[int] = []
    for tree in trees:
        nodes = tree.get("nodes") if isinstance(tree.get("nodes"), list) else []
        depths = draft_depths(nodes)
        top = max(depths, default=0)
        path = tree.get("accepted_path") if isinstance(tree.get("accepted_path"), list) else []
        grow = max(top, len(path)) - len(offered)
        if grow > 0:
            for xs in (offered, accepted, drafted):
                xs.extend([0] * grow)
        for d in depths:
            drafted[d - 1] += 1
        for i in range(top):
            offered[i] += 1
        for i in range(len(path)):
            accepted[i] += 1
    rate = [round(a / o, 4) if o else 0.0 for a, o in zip(accepted, offered)]
    return {"offered": offered, "accepted": accepted, "drafted": drafted, "rate": rate}


def expected_tokens_per_verification(alpha: float, gamma: int) -> float:
    """Tokens one verification commits in expectation when each of ``gamma`` drafted tokens is
    accepted independently with probability ``alpha`` (Leviathan et al. 2023):
    ``(1 - alpha^(gamma + 1)) / (1 - alpha)``, i.e. ``gamma + 1`` at ``alpha = 1``."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(gamma + 1)
    return round((1.0 - alpha ** (gamma + 1)) / (1.0 - alpha), 4)
