"""Reward-guided sequential Monte Carlo (``smc``): N particles steered by programmatic
potentials, resampled when their effective sample size runs low.

The target is the model's distribution (at the proposal temperature) reweighted by a
potential, ``p(x) * exp(strength * phi(x))``; ``phi`` sums the active potentials, each at
most 0: the text still matches (or, finished, fully matches) a regex, the share of
keywords present, the distance to a target length. Every particle proposes its next token
from the model; its log weight grows by the change in ``strength * phi``. When the effective
sample size ``1 / sum(W^2)`` of the normalised weights ``W`` falls below ``ess_threshold * N``
the population is resampled (systematic or multinomial, on the run's common random numbers)
and the weights are reset to uniform. The output is one particle drawn by its final weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from decoders.kv_cache import repeat_batch
from decoders.ar import draw
from decoders.base import Choice, Context, Decoder, Float, Int, Params, Text, check_stop, register
from decoders.citation import arxiv
from decoders.constraint import constraint_params, stage_for
from decoders.processors import History, build_chain
from playground.core.errors import PlaygroundError
from playground.core.trace import Step

REGEX_TIMEOUT_S = 0.5  # a pathological pattern is refused, never a hang
RESAMPLERS = ("systematic", "multinomial")


# ---------------------------------------------------------------------- potentials
def compile_regex(pattern: str) -> Any:
    """``pattern`` compiled by the ``regex`` module (partial matching), or a PlaygroundError."""
    import regex

    try:
        return regex.compile(pattern)
    except (regex.error, ValueError, OverflowError) as e:
        raise PlaygroundError(f"knob 'match_regex' is not a valid regex: {e}") from None


def parse_keywords(text: str) -> list[str]:
    """The comma-separated keywords of the ``keywords`` knob (blank items dropped)."""
    return [w.strip() for w in str(text).split(",") if w.strip()]


@dataclass
class Potential:
    """``phi(text, finished)``, at most 0 (0 = fully satisfied): the sum of the active terms.

    ``regex``: 0 while the text can still be extended to a full match (a full match once
    finished), else -1. ``keywords``: minus the share of keywords (case-insensitive) not yet
    in the text. ``target_chars``: minus the relative overshoot of the length while running
    (a shorter text may still grow) and the relative distance to it once finished, not
    capped, so that texts far past the target still differ.
    """

    regex: Any = None
    keywords: list[str] = field(default_factory=list)
    target_chars: int = 0

    @property
    def active(self) -> bool:
        """Whether any potential is set."""
        return self.regex is not None or bool(self.keywords) or self.target_chars > 0

    def __call__(self, text: str, finished: bool) -> float:
        phi = 0.0
        if self.regex is not None:
            try:
                m = self.regex.fullmatch(text, partial=not finished, timeout=REGEX_TIMEOUT_S)
            except TimeoutError:
                raise PlaygroundError("knob 'match_regex' takes too long to match; simplify the pattern") from None
            phi -= 0.0 if m else 1.0
        if self.keywords:
            low = text.lower()
            phi -= sum(1 for w in self.keywords if w.lower() not in low) / len(self.keywords)
        if self.target_chars > 0:
            n, goal = len(text), self.target_chars
            off = abs(n - goal) if finished else max(0, n - goal)
            phi -= off / goal
        return phi

    def parts(self) -> list[str]:
        """The active potentials as short labels (for the trace's stats)."""
        out = []
        if self.regex is not None:
            out.append(f"regex {self.regex.pattern!r}")
        if self.keywords:
            out.append("keywords " + ", ".join(self.keywords))
        if self.target_chars:
            out.append(f"length ~{self.target_chars} chars")
        return out


def potential_from(params: dict[str, Any]) -> Potential:
    """The :class:`Potential` the ``smc`` knobs describe."""
    pat = str(params.get("match_regex", "") or "")
    return Potential(regex=compile_regex(pat) if pat else None, keywords=parse_keywords(params.get("keywords", "")),
                     target_chars=int(params.get("target_chars", 0)))


# ---------------------------------------------------------------------- weights
def normalise(log_w: Sequence[float]) -> np.ndarray:
    """Normalised weights from log weights (``-inf`` = weight 0; all ``-inf`` = uniform)."""
    lw = np.asarray(log_w, dtype=np.float64)
    top = np.max(lw) if lw.size else -np.inf
    if not np.isfinite(top):
        return np.full(lw.size, 1.0 / max(lw.size, 1))
    w = np.exp(lw - top)
    return w / w.sum()


def ess(weights: Sequence[float]) -> float:
    """Effective sample size ``1 / sum(W^2)`` of normalised weights (1 ... N)."""
    w = np.asarray(weights, dtype=np.float64)
    return float(1.0 / np.sum(w * w))


def log_mean_exp(log_w: Sequence[float]) -> float:
    """``log(mean(exp(log_w)))``, stable."""
    lw = np.asarray(log_w, dtype=np.float64)
    top = np.max(lw)
    if not np.isfinite(top):
        return float(top)
    return float(top + np.log(np.mean(np.exp(lw - top))))


def resample(weights: Sequence[float], uniforms: Sequence[float], how: str) -> list[int]:
    """Ancestor indices for a new population of ``len(weights)`` particles.

    ``systematic``: one uniform ``u``, points ``(k + u) / N`` (each particle gets ``floor`` or
    ``ceil`` of ``N * W_i`` copies); ``multinomial``: N independent uniforms. Exact for
    uniforms in [0, 1); ancestors come out in increasing order.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    cdf[-1] = 1.0  # rounding must never push a point past the last particle
    if how == "systematic":
        points = (np.arange(n) + float(uniforms[0])) / n
    elif how == "multinomial":
        points = np.sort(np.asarray(uniforms[:n], dtype=np.float64))
    else:
        raise PlaygroundError(f"unknown resampling {how!r}; choose one of: {', '.join(RESAMPLERS)}")
    idx = np.searchsorted(cdf, points, side="right")
    return [int(min(i, n - 1)) for i in idx]


def allowed_mass(processed: torch.Tensor, masked: torch.Tensor) -> float | None:
    """The proposal's probability of the tokens the constraint allows (``masked`` is the raw
    logits with forbidden tokens at ``-inf``); None at temperature 0, where the proposal is a
    point mass and no weight can correct for the mask."""
    live = torch.isfinite(processed)
    if int(live.sum()) <= 1:
        return None
    ok = torch.isfinite(masked) & live
    if not bool(ok.any()):
        return 0.0
    full = torch.logsumexp(processed.double()[live], 0)
    return float(torch.exp(torch.logsumexp(processed.double()[ok], 0) - full))


def pick(weights: Sequence[float], u: float) -> int:
    """The particle a uniform ``u`` in [0, 1) selects by inverse CDF of the weights."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    j = int(np.searchsorted(cdf / cdf[-1], u, side="right"))
    return min(j, len(cdf) - 1)


# ---------------------------------------------------------------------- the decoder
class SMCParams(Params):
    """SMC knobs; validation also compiles the regex, so a bad one is refused before the run."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        potential_from(out)
        return out


@dataclass
class Particle:
    """One particle: its tokens, raw-model log-probability, log weight and potential."""

    ids: list[int] = field(default_factory=list)
    logprob: float = 0.0
    log_w: float = 0.0
    phi: float = 0.0
    finished: bool = False
    reason: str = "length"
    row: Any = None  # the constraint stage's matcher state (decoders.constraint.Row)
    allowed_mass: float | None = None  # share of the proposal the constraint allowed, last step

    def copy(self) -> "Particle":
        """An independent copy (resampling duplicates particles)."""
        return Particle(list(self.ids), self.logprob, self.log_w, self.phi, self.finished, self.reason,
                        self.row.clone() if self.row is not None else None, self.allowed_mass)


@register
class SMC(Decoder):
    """Sequential Monte Carlo steering with programmatic potentials (Lew et al. 2023; Loula et al. 2025).

    N particles grow in one batched KV cache. At each step every live particle draws its
    next token from the model (at ``temperature``; particle 0 on the ``sample`` decoder's
    common random numbers, particle i on stream ``sample/i``) and its log weight grows by
    ``strength * (phi(new text) - phi(old text))``, so the population targets
    ``p(x) * exp(strength * phi(x))``. Potentials (each at most 0): ``match_regex`` (the
    text can still become a full match; finished, it must be one), ``keywords`` (share
    present, case-insensitive), ``target_chars`` (relative distance to that length, uncapped). A
    constraint knob (``regex``, ``json_schema``, ``grammar``: the constraint stage's syntax)
    is the hard potential "the text is in the constraint's language": each particle proposes
    from the model restricted to the tokens its matcher allows and its log weight gains the
    log of the probability those tokens had, so the population targets the model
    conditioned on the whole output satisfying the constraint rather than the token-by-token
    masked model (Loula et al.'s weighting; at temperature 0 there is no weight). When
    the effective sample size drops below ``ess_threshold * N`` the particles are resampled
    (systematic or multinomial; uniforms on stream ``smc/resample``) and weights reset;
    the evidence estimate ``log Z`` accumulates each resampling's mean weight. The output is
    one particle drawn by its final weight (stream ``smc/select``). With one particle and no
    potential it is the ``sample`` decoder, token for token (under a constraint, the
    constrained ``sample`` decoder). Steps are ``beam`` steps: every
    particle with its weight and parent, plus ``smc`` (weights, ESS, threshold, whether and
    how the population was resampled; under a constraint ``allowed_mass`` per particle and
    the heaviest constrained particle's ``constraint`` evidence).
    Simplifies: the proposal is the (masked) model itself, no learned look-ahead twist;
    potentials are evaluated on decoded text.
    """

    name = "smc"
    family = "guided"
    kind = "causal"
    step_kind = "beam"
    params = SMCParams(
        num_particles=Int(8, 1, 64, "particles grown in parallel"),
        ess_threshold=Float(0.5, 0.0, 1.0, "resample when the effective sample size < this × N (0 = never)"),
        resampling=Choice("systematic", RESAMPLERS, "systematic (one uniform, low variance) or multinomial"),
        temperature=Float(1.0, 0.0, 10.0, "proposal temperature; 0 = greedy"),
        strength=Float(5.0, 0.0, 100.0, "log weight per unit of potential (0 = plain sampling in parallel)"),
        match_regex=Text("", "potential: the output must be able to become (finished: be) a full match of this regex"),
        keywords=Text("", "potential: comma-separated words the output should contain (case-insensitive)"),
        target_chars=Int(0, 0, 100_000, "potential: output length in characters to aim for; 0 = off"),
        **constraint_params(words=False),
    )
    reference = ("Lew et al. 2023, Sequential Monte Carlo Steering of Large Language Models using "
                 "Probabilistic Programs; Loula et al. 2025, Syntactic and Semantic Control of Large "
                 "Language Models via Sequential Monte Carlo (ICLR)")
    papers = (
        arxiv("Lew et al. 2023, Sequential Monte Carlo Steering of Large Language Models using "
              "Probabilistic Programs", "2306.03081"),
        arxiv("Loula et al. 2025, Syntactic and Semantic Control of Large Language Models via "
              "Sequential Monte Carlo (ICLR)", "2504.13139"),
    )
    description = "N particles reweighted by regex/keyword/length potentials, resampled when ESS is low"
    shows = ("; plus `smc` per step: each particle's normalised weight, log weight and potential, the "
             "effective sample size against its threshold, and whether (and from which ancestors) the "
             "population was resampled")

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return True

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        n = int(p["num_particles"])
        pot = potential_from(p)
        beta = float(p["strength"]) if pot.active else 0.0
        chain = build_chain({"temperature": float(p["temperature"])})
        decode = ctx.target.decode
        prompt = list(ctx.prompt_ids)
        phi0 = pot("", False) if pot.active else 0.0
        stage = stage_for(ctx.target, p, ctx.max_new_tokens)
        parts = [Particle(phi=phi0, row=stage.row() if stage is not None else None) for _ in range(n)]
        log_z = 0.0
        resamples = 0

        first = ctx.target.forward(prompt, cache=ctx.target.new_cache())
        cache = first.cache
        if n > 1:
            repeat_batch(cache, n)  # every layer kind, recurrent ones included
        logits = first.logits[0, -1][None].expand(n, -1)
        rows = list(range(n))  # cache row of each live particle, in particle order
        parents: list[int] = list(range(n))
        for t in range(ctx.max_new_tokens):
            ctx.check_cancel()
            raw_logp = torch.log_softmax(logits.float(), -1)
            live = [i for i in range(n) if not parts[i].finished]
            cev: dict[int, dict[str, Any]] = {}
            for row, i in enumerate(live):
                pt = parts[i]
                h = History(ids=prompt + pt.ids, prompt_len=len(prompt), pos=t, uniform=ctx.uniform)
                if pt.row is not None:
                    masked, cev[i] = pt.row.apply(logits[row])
                    processed = chain(masked, h)
                    pt.allowed_mass = allowed_mass(chain(logits[row], h), masked)
                    if pt.allowed_mass is not None:
                        pt.log_w += math.log(pt.allowed_mass) if pt.allowed_mass > 0 else -math.inf
                else:
                    processed = chain(logits[row], h)
                tok = draw(ctx, t, torch.softmax(processed, -1), processed, "gumbel",
                           stream="sample" if i == 0 else f"sample/{i}")
                pt.ids.append(tok)
                pt.logprob += float(raw_logp[row, tok])
                reason = check_stop(ctx, pt.ids, decode)
                if pt.row is not None:
                    pt.row.advance(tok)
                    if not reason and pt.row.done:
                        reason = "constraint"
                if reason or t + 1 >= ctx.max_new_tokens:
                    pt.finished, pt.reason = True, reason or "length"
                if pot.active:
                    new_phi = pot(self._text(ctx, pt), pt.finished)
                    pt.log_w += beta * (new_phi - pt.phi)
                    pt.phi = new_phi
            w = normalise([q.log_w for q in parts])
            e = ess(w)
            alive_next = any(not q.finished for q in parts)
            # uniform weights give ESS = N only up to rounding: they must not count as degenerate
            do_resample = n > 1 and alive_next and e < float(p["ess_threshold"]) * n * (1 - 1e-9)
            ancestors: list[int] | None = None
            if do_resample:
                u = ctx.uniforms(t, n, "smc/resample")
                ancestors = resample(w, u, str(p["resampling"]))
                log_z += log_mean_exp([q.log_w for q in parts])
                resamples += 1
            yield Step("beam", [], beams=[
                {"ids": list(q.ids), "score": round(float(math.log(w[i])) if w[i] > 0 else -1e9, 5),
                 "logprob": round(q.logprob, 5), "parent": parents[i], "finished": q.finished,
                 "weight": round(float(w[i]), 6), "potential": round(q.phi, 5),
                 **({"allowed_mass": round(q.allowed_mass, 6)} if q.allowed_mass is not None else {})}
                for i, q in enumerate(parts)],
                smc={"n": n, "ess": round(e, 4), "threshold": round(float(p["ess_threshold"]) * n, 4),
                     "resampled": do_resample, "ancestors": ancestors,
                     "weights": [round(float(x), 6) for x in w],
                     "log_weights": [round(q.log_w, 5) for q in parts],
                     "potentials": [round(q.phi, 5) for q in parts], "log_z": round(log_z, 5)},
                **self._constraint_evidence(cev, w))
            if not alive_next:
                break
            # the next step's live particles: their cache rows, after resampling if any
            old_row = {i: r for r, i in enumerate(live)}
            if ancestors is not None:
                parts = [parts[a].copy() for a in ancestors]
                for q in parts:
                    q.log_w = 0.0
                parents = list(ancestors)
                src = [ancestors[j] for j in range(n) if not parts[j].finished]
            else:
                parents = list(range(n))
                src = [i for i in range(n) if not parts[i].finished]
            if not src:  # resampling kept only finished particles
                break
            rows = [old_row[a] for a in src]
            if rows != list(range(len(live))):
                cache.reorder_cache(torch.tensor(rows, dtype=torch.long))
            feed = [parts[j].ids[-1] for j in range(n) if not parts[j].finished]
            out = ctx.target.forward(torch.tensor(feed, dtype=torch.long)[:, None], cache=cache)
            cache, logits = out.cache, out.logits[:, -1]
        log_z += log_mean_exp([q.log_w for q in parts])
        w = normalise([q.log_w for q in parts])
        k = pick(w, ctx.uniform(0, "smc/select"))
        best = parts[k]
        self.output_override = list(best.ids)
        self.finish_reason = best.reason
        self.extra_stats.update(
            chosen_particle=k, resamples=resamples, log_z=round(log_z, 5), final_ess=round(ess(w), 4),
            potentials=pot.parts(),
            particles=[{"ids": q.ids, "weight": round(float(w[i]), 6), "logprob": round(q.logprob, 5),
                        "potential": round(q.phi, 5)} for i, q in enumerate(parts)])

    @staticmethod
    def _constraint_evidence(cev: dict[int, dict[str, Any]], w: np.ndarray) -> dict[str, Any]:
        """The step's ``constraint`` evidence: that of the heaviest particle which drew under it."""
        if not cev:
            return {}
        k = max(cev, key=lambda i: (w[i], -i))
        return {"constraint": {**cev[k], "particle": k}}

    @staticmethod
    def _text(ctx: Context, pt: Particle) -> str:
        """The particle's text for the potentials (a final stop token left out)."""
        ids = pt.ids[:-1] if pt.ids and pt.ids[-1] in ctx.stop_ids else pt.ids
        return ctx.target.decode(ids)


__all__ = ["Potential", "SMC", "ess", "normalise", "parse_keywords", "pick", "potential_from", "resample"]
