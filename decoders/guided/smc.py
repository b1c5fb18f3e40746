"""Reward-guided sequential Monte Carlo (``smc``): N particles steered by programmatic
potentials, resampled when their effective sample size runs low.

The target is the model's distribution (at the proposal temperature) reweighted by a
potential, ``p(x) * exp(strength * phi(x))``; ``phi`` sums the active potentials, each at
most 0: the text still matches (or, finished, fully matches) a regex, the share of
keywords present, the distance to a target length. Every particle proposes its next token
from the model; its log weight grows by the change in ``strength * phi``. When the effective
sample size ``1 / sum(W^2)`` of the normalised weights ``W`` falls below ``ess_threshold * N``
the population is resampled (systematic or multinomial, on the run's common random numbers)
and the weights are reset to uniform. Optionally (``rejuvenate`` = k > 0) every resampled
particle then gets one Metropolis-Hastings move that proposes fresh last k tokens (resample-
move SMC; ``rejuvenate_at=every`` moves after every step, weights kept). The output is one
particle drawn by its final weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from decoders.kv_cache import repeat_batch
from decoders.ar import draw, sample_index
from decoders.base import Choice, Context, Decoder, Float, Int, Params, Text, check_stop, register
from decoders.citation import arxiv
from decoders.constraint import active as constraint_active, constraint_params, stage_for
from decoders.processors import History, build_chain
from playground.core.errors import PlaygroundError
from playground.core.trace import Step

REGEX_TIMEOUT_S = 0.5  # a pathological pattern is refused, never a hang
RESAMPLERS = ("systematic", "multinomial")
REJUVENATE_AT = ("resample", "every")


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
    # rounding must never push a point past the last particle of positive weight: the CDF is
    # exactly 1 from there on, and every point stays below 1 ((n - 1 + u) / n can round to 1)
    pos = np.flatnonzero(w > 0)
    cdf[int(pos[-1]) if pos.size else n - 1:] = 1.0
    if how == "systematic":
        points = (np.arange(n) + float(uniforms[0])) / n
    elif how == "multinomial":
        points = np.sort(np.asarray(uniforms[:n], dtype=np.float64))
    else:
        raise PlaygroundError(f"unknown resampling {how!r}; choose one of: {', '.join(RESAMPLERS)}")
    points = np.minimum(points, np.nextafter(1.0, 0.0))
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


# ---------------------------------------------------------------------- rejuvenation
def mh_rejuvenate(prefix: Sequence[int], seqs: Sequence[Sequence[int]], k: int,
                  logits_at: Callable[[list[list[int]]], torch.Tensor],
                  proposal: Callable[[torch.Tensor, list[int]], torch.Tensor],
                  log_potential: Callable[[list[int]], float | None],
                  uniforms: Callable[[int, int], Sequence[float]]) -> list[dict[str, Any]]:
    """One Metropolis-Hastings move per sequence that proposes a fresh copy of its last ``k`` tokens.

    ``seqs`` are the generated tokens of the particles to move (all the same length ``L``,
    after ``prefix``, the prompt); ``m = min(k, L)`` tokens are redrawn. The invariant target
    of a sequence ``x`` is ``gamma(x) = q(x) * exp(log_potential(x))`` with ``q`` the
    proposal model (``proposal(logits, generated)`` gives its log-probabilities for the next
    token): what the population approximates at this step (equally weighted right after a
    resampling; a weighted population keeps its weights through the move).
    Writing ``x = (a, y)`` with ``y`` the last ``m`` tokens, the move draws ``y'`` from
    ``q(. | a)`` token by token and accepts with probability ``min(1, r)``,

        r = gamma(a, y') q(y | a) / (gamma(a, y) q(y' | a)),

    which keeps ``gamma`` invariant (detailed balance). Since the target's token part is
    the proposal itself, ``r`` reduces to ``exp(log_potential(a, y') - log_potential(a, y))``,
    but each factor is computed and recorded on its own so the evidence shows the ratio
    whole. ``log_potential`` returns None for a sequence outside the moved set (one that
    would have finished: a stop token or stop string): such a proposal has target 0 and is
    refused, so the move never turns a live particle into a finished one.
    ``logits_at(batch)`` gives the model's logits (B, T, V) at every position of equal-length
    id lists; ``uniforms(i, n)`` gives sequence ``i`` its ``n`` uniforms (``m`` to draw, one to
    accept). Returns one record per sequence: ``particle`` (its index in ``seqs``), ``k``
    (= m), ``current`` / ``proposed`` (the last m tokens), ``log_q_current`` /
    ``log_q_proposed`` (``log q(y | a)``, ``log q(y' | a)``), ``log_potential_current`` /
    ``log_potential_proposed``, ``log_target_current`` / ``log_target_proposed`` (``log
    q + log_potential``, the target's unnormalised log density of the last m tokens given
    ``a``), ``log_ratio``, ``accept_prob``, ``u``, ``accepted``, ``valid``, and
    ``raw_delta`` (the change of the raw model's log-probability: ``logits_at``'s softmax)
    and ``ids`` (the sequence after the move).
    """
    if not seqs:
        return []
    pre = list(prefix)
    n_gen = len(seqs[0])
    m = min(int(k), n_gen)
    cut = n_gen - m
    P = len(pre)
    # one forward over every sequence scores the current last m tokens under the proposal;
    # its row before them is also where the proposal starts (the same prefix a)
    full = logits_at([pre + list(s[:-1]) for s in seqs])
    rows = [full[:, P + cut - 1 + j] for j in range(m)]
    us = [np.asarray(uniforms(b, m + 1), dtype=np.float64) for b in range(len(seqs))]
    cur_q, cur_raw = [0.0] * len(seqs), [0.0] * len(seqs)
    for b, s in enumerate(seqs):
        for j in range(m):
            tok = int(s[cut + j])
            cur_q[b] += float(proposal(rows[j][b], list(s[:cut + j]))[tok])
            cur_raw[b] += float(torch.log_softmax(rows[j][b].float(), -1)[tok])
    new = [list(s[:cut]) for s in seqs]
    new_q, new_raw = [0.0] * len(seqs), [0.0] * len(seqs)
    row = rows[0]
    for j in range(m):
        for b in range(len(seqs)):
            lp = proposal(row[b], new[b])
            tok = sample_index(torch.exp(lp), float(us[b][j]))
            new[b].append(tok)
            new_q[b] += float(lp[tok])
            new_raw[b] += float(torch.log_softmax(row[b].float(), -1)[tok])
        if j + 1 < m:
            row = logits_at([pre + s for s in new])[:, -1]
    out = []
    for b, s in enumerate(seqs):
        lphi_cur = log_potential(list(s))
        lphi_new = log_potential(new[b])
        valid = lphi_new is not None and lphi_cur is not None
        lt_cur = cur_q[b] + (lphi_cur or 0.0)
        lt_new = new_q[b] + (lphi_new or 0.0) if valid else -math.inf
        ratio = (lt_new - lt_cur) + (cur_q[b] - new_q[b]) if valid else -math.inf
        if math.isnan(ratio):  # -inf - -inf: a point-mass proposal met a token it rules out
            ratio = -math.inf
        a = 1.0 if ratio >= 0 else math.exp(ratio)
        ok = bool(float(us[b][m]) < a)
        out.append({"particle": b, "k": m, "current": list(s[cut:]), "proposed": new[b][cut:],
                    "log_q_current": cur_q[b], "log_q_proposed": new_q[b],
                    "log_potential_current": lphi_cur, "log_potential_proposed": lphi_new,
                    "log_target_current": lt_cur, "log_target_proposed": lt_new, "log_ratio": ratio,
                    "accept_prob": a, "u": float(us[b][m]), "accepted": ok, "valid": valid,
                    "raw_delta": new_raw[b] - cur_raw[b] if ok else 0.0,
                    "ids": new[b] if ok else list(s)})
    return out


# ---------------------------------------------------------------------- the decoder
class SMCParams(Params):
    """SMC knobs; validation also compiles the regex, so a bad one is refused before the run."""

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        potential_from(out)
        if int(out.get("rejuvenate", 0)) > 0 and constraint_active(out):
            raise PlaygroundError("knob 'rejuvenate' cannot be combined with a constraint knob "
                                  "(regex, json_schema, grammar): set one of them to off")
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
    ``rejuvenate`` = k > 0 adds resample-move rejuvenation: after every resampling each live
    particle gets one Metropolis-Hastings move that redraws its last k tokens from the
    proposal (the model at ``temperature``; uniforms on stream ``smc/rejuvenate/<i>``) and
    accepts it with ``min(1, r)``, ``r = gamma(a, y') q(y | a) / (gamma(a, y) q(y' | a))`` for
    the target ``gamma = q * exp(strength * phi)`` of the equally weighted population (see
    :func:`mh_rejuvenate`); so the move leaves the population's distribution unchanged while
    restoring the diversity that resampling duplicated away. A proposal that would finish
    the particle (a stop token or string) is refused. The step's ``smc`` evidence gains
    ``rejuvenation`` (``k``, ``proposals``, ``accepted``, ``acceptance_rate`` and each move's
    factors, :func:`mh_rejuvenate`, and ``after_resampling``); stats gain
    ``rejuvenation_proposals``/``_accepted``/``_rate``. Moved particles are re-encoded in a
    fresh batched forward. 0 (the default) is off and the run is exactly the one without the
    knob. ``rejuvenate_at=every`` moves after every step instead, the weights kept (an MH
    kernel invariant for the target leaves a weighted population's expectation unchanged);
    only then is the evidence-weighted output, ``sum_r Z_r [x_r = x] / sum_r Z_r`` over runs,
    exactly unbiased for any N: moving only when the ESS triggered a resampling makes the
    move depend on the population, a finite-N bias that vanishes as N grows (measured on a
    three-token bigram with N = 4 in ``tests/test_smc_rejuvenation.py``).
    Simplifies: the proposal is the (masked) model itself, no learned look-ahead twist;
    potentials are evaluated on decoded text; rejuvenation is one independence-style move
    per resampling (no tuning of k, no repeated sweeps) and is refused under a constraint
    knob (its matcher state would have to be rewound k tokens).
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
        rejuvenate=Int(0, 0, 64, "Metropolis-Hastings rejuvenation: one move per particle proposing its last k "
                                 "tokens afresh from the proposal, after each resampling (see rejuvenate_at); "
                                 "0 = off"),
        rejuvenate_at=Choice("resample", REJUVENATE_AT,
                             "when the moves run: resample (after each resampling) or every (after every step, "
                             "weights kept: the evidence-weighted output stays exactly unbiased)"),
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
        k_rejuv = int(p.get("rejuvenate", 0))
        every = str(p.get("rejuvenate_at", "resample")) == "every"
        moves_proposed = moves_accepted = 0

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
            resampled: list[Particle] | None = None
            rejuv: dict[str, Any] | None = None
            if k_rejuv > 0 and alive_next and (ancestors is not None or every):
                # the next population is built (and moved) now so that this step records the moves;
                # without resampling ("every") the moved copies keep their weights: an MH move
                # invariant for the target leaves a weighted population's expectation unchanged
                resampled = [parts[a].copy() for a in ancestors] if ancestors is not None else [q.copy() for q in parts]
                if ancestors is not None:
                    for q in resampled:
                        q.log_w = 0.0
                rejuv = self._rejuvenate(ctx, resampled, k_rejuv, chain, pot, beta, t)
                rejuv["after_resampling"] = ancestors is not None
                moves_proposed += rejuv["proposals"]
                moves_accepted += rejuv["accepted"]
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
                     "potentials": [round(q.phi, 5) for q in parts], "log_z": round(log_z, 5),
                     **({"rejuvenation": rejuv} if rejuv is not None else {})},
                **self._constraint_evidence(cev, w))
            if not alive_next:
                break
            # the next step's live particles: their cache rows, after resampling if any
            old_row = {i: r for r, i in enumerate(live)}
            if resampled is not None:
                parts = resampled
                parents = list(ancestors) if ancestors is not None else list(range(n))
                src = [parents[j] for j in range(n) if not parts[j].finished]
            elif ancestors is not None:
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
            if rejuv is not None and rejuv["accepted"]:
                # moved particles no longer match their cache rows: encode the live ones afresh
                # (all live particles have the same length, so no padding is needed)
                seqs = [prompt + parts[j].ids[:-1] for j in range(n) if not parts[j].finished]
                cache = ctx.target.forward(torch.tensor(seqs, dtype=torch.long), cache=ctx.target.new_cache()).cache
            elif rows != list(range(len(live))):
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
            **({"rejuvenation_proposals": moves_proposed, "rejuvenation_accepted": moves_accepted,
                "rejuvenation_rate": round(moves_accepted / moves_proposed, 4) if moves_proposed else 0.0}
               if k_rejuv > 0 else {}),
            potentials=pot.parts(),
            particles=[{"ids": q.ids, "weight": round(float(w[i]), 6), "logprob": round(q.logprob, 5),
                        "potential": round(q.phi, 5)} for i, q in enumerate(parts)])

    def _rejuvenate(self, ctx: Context, parts: list[Particle], k: int, chain: Any, pot: Potential, beta: float,
                    t: int) -> dict[str, Any]:
        """One MH move for each live particle of the next population ``parts`` (resampled, or
        the weighted one under ``rejuvenate_at=every``), in place; the step's ``rejuvenation``
        evidence."""
        prompt = list(ctx.prompt_ids)
        live = [i for i, q in enumerate(parts) if not q.finished]

        def logits_at(batch: list[list[int]]) -> torch.Tensor:
            return ctx.target.forward(torch.tensor(batch, dtype=torch.long), cache=ctx.target.new_cache()).logits

        def proposal(logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
            h = History(ids=prompt + generated, prompt_len=len(prompt), pos=len(generated), uniform=ctx.uniform)
            return torch.log_softmax(chain(logits.float(), h).double(), -1)

        def log_potential(ids: list[int]) -> float | None:
            # a sequence that would have finished along the way is outside the live set
            for j in range(1, len(ids) + 1):
                if check_stop(ctx, ids[:j], ctx.target.decode):
                    return None
            return beta * pot(ctx.target.decode(ids), False) if pot.active else 0.0

        moves = mh_rejuvenate(prompt, [parts[i].ids for i in live], k, logits_at, proposal, log_potential,
                              lambda b, m: ctx.uniforms(t, m, f"smc/rejuvenate/{live[b]}"))
        for mv in moves:
            i = live[mv["particle"]]
            mv["particle"] = i
            if mv["accepted"]:
                q = parts[i]
                q.ids = list(mv["ids"])
                q.logprob += mv["raw_delta"]
                q.phi = pot(self._text(ctx, q), False) if pot.active else q.phi
        accepted = sum(1 for mv in moves if mv["accepted"])
        return {"k": k, "proposals": len(moves), "accepted": accepted,
                "acceptance_rate": round(accepted / len(moves), 4) if moves else 0.0,
                # full precision, so the acceptance recomputes exactly from the record; -inf (a
                # refused proposal) is stored as None, which JSON can hold
                "moves": [{key: (None if isinstance(v, float) and not math.isfinite(v) else v)
                           for key, v in mv.items() if key not in ("ids", "raw_delta")} for mv in moves]}

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


__all__ = ["Potential", "SMC", "ess", "mh_rejuvenate", "normalise", "parse_keywords", "pick", "potential_from",
           "resample"]
