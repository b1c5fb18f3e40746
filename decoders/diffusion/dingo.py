"""DINGO: regex-constrained diffusion decoding by dynamic programming over a token automaton.

Suresh et al. 2025 (A177): a diffusion LM predicts every position of the canvas at once, so
a constraint cannot be applied token by token from the left as a causal model's grammar
mask is. DINGO instead finds, among all token strings the regular expression accepts, the
one of highest probability under the per-position distributions — a Viterbi pass over
positions × automaton states. The regex becomes a character DFA (``interegular``, a
maintained regex→FSM library); each token's text is run through it from every state, so
the DP steps by whole tokens.

Infilling (the ``fixed`` knob, :mod:`decoders.diffusion.fixed`): a fixed token is a committed
position before the first step, so the DP keeps it exactly as it keeps a commit (its row is
0 at the token and -inf elsewhere) and every canvas it returns holds it. Fixed tokens that
no regex-valid canvas can hold are refused in one line before the first step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import interegular
import torch

from decoders.base import Context, Int, Params, Text, register
from decoders.citation import arxiv
from decoders.diffusion._canvas import finish, gen_logits, make_layout, new_canvas, r5, stop_set
from decoders.diffusion._sampler import Proposal, denoise_step, even_schedule, stats_of, top_k_positions
from decoders.diffusion.fixed import fixed_param, place_fixed
from decoders.diffusion.named import DiffusionDecoder, block_length, gen_length, steps
from playground.core.errors import PlaygroundError
from playground.core.trace import Step

NEG = float("-inf")
# The DP costs states x vocabulary per position: a regex whose DFA has more states is refused
MAX_STATES = 512
MAX_REGEX = 500
# Fixed positions tried one by one to name the one that breaks the regex (one DP each)
MAX_CULPRIT_CHECKS = 16


@dataclass
class TokenAutomaton:
    """The regex's DFA lifted to tokens: ``table[s, t]`` is the state after token ``t`` from
    state ``s`` (-1: dead). States ``0..n-1`` are the DFA's; the last one, ``done``, is
    reached by a stop token (EOS/pad) from an accepting state and loops on stop tokens only,
    so a match shorter than the canvas ends in a run of stop tokens."""

    table: torch.Tensor       # (S, V) long
    start: int
    accepting: torch.Tensor   # (S,) bool
    done: int

    @property
    def n_states(self) -> int:
        """States, ``done`` included."""
        return int(self.table.shape[0])


def compile_regex(regex: str) -> Any:
    """The minimal character DFA of ``regex`` (interegular), or a one-line PlaygroundError."""
    if not regex:
        raise PlaygroundError("dingo needs a regex (the pattern the whole output must match)")
    if len(regex) > MAX_REGEX:
        raise PlaygroundError(f"dingo's regex is {len(regex)} characters long; at most {MAX_REGEX}")
    try:
        fsm = interegular.parse_pattern(regex).to_fsm().reduce()
    except Exception as e:  # noqa: BLE001 - interegular's syntax errors carry no common type
        why = " ".join(str(e).split()) or type(e).__name__
        raise PlaygroundError(f"dingo cannot compile regex {regex!r} (Python regex syntax, no "
                              f"back-references): {why}") from None
    if len(fsm.states) > MAX_STATES:
        raise PlaygroundError(f"regex {regex!r} compiles to {len(fsm.states)} automaton states; dingo takes "
                              f"at most {MAX_STATES}")
    return fsm


def token_automaton(fsm: Any, texts: Sequence[str | None], stop_ids: set[int]) -> TokenAutomaton:
    """Lift the character DFA ``fsm`` to tokens whose texts are ``texts`` (None: never allowed,
    e.g. the mask token or a token that is not whole characters on its own)."""
    states = sorted(fsm.states)
    index = {q: i for i, q in enumerate(states)}
    n, v = len(states), len(texts)
    done = n
    table = torch.full((n + 1, v), -1, dtype=torch.long)
    finals = {index[q] for q in fsm.finals}
    for t, text in enumerate(texts):
        if t in stop_ids:
            for s in list(finals) + [done]:
                table[s, t] = done
            continue
        if not text:
            continue
        classes = [fsm.alphabet[ch] for ch in text]
        for q in states:
            cur = q
            for c in classes:
                cur = fsm.map.get(cur, {}).get(c)
                if cur is None:
                    break
            if cur is not None:
                table[index[q], t] = index[cur]
    accepting = torch.zeros(n + 1, dtype=torch.bool)
    accepting[sorted(finals) + [done]] = True
    return TokenAutomaton(table=table, start=index[fsm.initial], accepting=accepting, done=done)


def viterbi(auto: TokenAutomaton, logp: torch.Tensor) -> tuple[list[int] | None, float, torch.Tensor, list[int]]:
    """The most probable accepted token string under independent per-position log-probs.

    ``logp`` is (n, V); a committed position is a row with 0 at its token and -inf elsewhere.
    Returns (tokens or None if no string of n tokens is accepted, its log-probability, the
    lattice (n + 1, S) of the best log-probability reaching each state after each prefix,
    the states along the best path, start state first). Ties go to the lowest state, then
    the lowest token id."""
    n = int(logp.shape[0])
    s_n = auto.n_states
    lattice = torch.full((n + 1, s_n), NEG, dtype=torch.float64)
    lattice[0, auto.start] = 0.0
    back_s = torch.full((n, s_n), -1, dtype=torch.long)
    back_t = torch.full((n, s_n), -1, dtype=torch.long)
    table = auto.table
    v = int(table.shape[1])
    flat_to = table.flatten()
    live = flat_to >= 0
    to = flat_to[live]                      # target state of every live (state, token) pair
    src = torch.arange(s_n * v)[live]       # its flat index s * V + t
    big = s_n * v
    for i in range(n):
        scores = (lattice[i].unsqueeze(1) + logp[i].double().unsqueeze(0)).flatten()[live]
        best = torch.full((s_n,), NEG, dtype=torch.float64).scatter_reduce(0, to, scores, "amax")
        # the first (state, token) pair attaining each state's best: the lowest flat index
        hit = (scores == best[to]) & (scores > NEG)
        first = torch.full((s_n,), big, dtype=torch.long).scatter_reduce(
            0, to, torch.where(hit, src, torch.full_like(src, big)), "amin")
        reached = first < big
        lattice[i + 1] = torch.where(reached, best, torch.full_like(best, NEG))
        back_s[i] = torch.where(reached, first // v, back_s[i])
        back_t[i] = torch.where(reached, first % v, back_t[i])
    final = lattice[n].masked_fill(~auto.accepting, NEG)
    end = int(torch.argmax(final))
    if not final[end] > NEG:
        return None, NEG, lattice, []
    toks, path = [], [end]
    s = end
    for i in range(n - 1, -1, -1):
        toks.append(int(back_t[i, s]))
        s = int(back_s[i, s])
        path.append(s)
    return toks[::-1], float(final[end]), lattice, path[::-1]


def pin_rows(logp: torch.Tensor, pinned: dict[int, int]) -> torch.Tensor:
    """``logp`` (n, V) with each pinned position's row made 0 at its token and -inf elsewhere:
    the form :func:`viterbi` reads as "this position is already decided" (a commit or a fixed
    token), so the best path must go through that token there."""
    out = logp.clone()
    for q, t in pinned.items():
        out[q] = NEG
        out[q, int(t)] = 0.0
    return out


def satisfiable(auto: TokenAutomaton, n: int, pinned: dict[int, int]) -> bool:
    """Whether some canvas of ``n`` tokens that the automaton accepts has the ``pinned`` tokens
    at their positions (a DP over uniform rows: only the support matters)."""
    v = int(auto.table.shape[1])
    if any(not 0 <= int(t) < v for t in pinned.values()):  # past the model's logits: never allowed
        return False
    rows = pin_rows(torch.zeros(n, v, dtype=torch.float64), pinned)
    return viterbi(auto, rows)[0] is not None


def check_fixed(auto: TokenAutomaton, n: int, pinned: dict[int, int], regex: str,
                show: Callable[[int], str]) -> None:
    """Refuse, in one line and before any step, fixed tokens that no regex-valid canvas of
    ``n`` tokens can hold. Names the first fixed token that cannot fit even on its own
    (``show`` gives a token's text), else says the combination cannot; a regex that no
    canvas of ``n`` tokens matches at all gets dingo's usual message instead."""
    if not pinned or satisfiable(auto, n, pinned):
        return
    if not satisfiable(auto, n, {}):
        raise PlaygroundError(f"no canvas of {n} tokens matches regex {regex!r} with this "
                              "model's tokens; change gen_length or the regex")
    # bounded: one DP per fixed position, and only on this error path
    for q in sorted(pinned)[:MAX_CULPRIT_CHECKS]:
        if not satisfiable(auto, n, {q: pinned[q]}):
            raise PlaygroundError(f"knob 'fixed': {show(pinned[q])!r} at position {q} is in no canvas of {n} "
                                  f"tokens that matches regex {regex!r}; change the fixed words or the regex")
    raise PlaygroundError(f"knob 'fixed': no canvas of {n} tokens that matches regex {regex!r} holds all the "
                          f"fixed tokens at their positions; change the fixed words or the regex")


def token_texts(tokenizer: Any, v: int, banned: set[int]) -> list[str | None]:
    """Each token's text on its own; None for ``banned`` ids and for tokens that are not whole
    characters alone (a byte-level piece decodes to U+FFFD), which the automaton never takes."""
    out: list[str | None] = []
    for t in range(v):
        if t in banned:
            out.append(None)
            continue
        try:
            text = tokenizer.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:  # noqa: BLE001 - ids past the tokenizer's table (padded embeddings)
            text = None
        out.append(None if not text or "\ufffd" in text else text)
    return out


@register
class Dingo(DiffusionDecoder):
    """DINGO (A177): every step, the most probable canvas the regex accepts, found by dynamic
    programming over positions × automaton states; the plan commits some of its tokens.

    Each step runs the model once on the canvas, takes the log-probabilities at every
    position (a committed position keeps its token), and runs a Viterbi pass over positions ×
    states of the regex's token automaton: the best log-probability of reaching each state
    after each prefix, and the path that attains the best accepting state at the end. The
    tokens of that path are the proposals; like LLaDA, the ``steps`` schedule commits the most
    confident of them in the current block (confidence = the model's probability of the DP's
    token). Because the previous step's optimal canvas stays consistent with every commit,
    a valid completion always exists and the final canvas always matches. Fixed words
    (``fixed``) are decided positions from the start, kept by every DP and never committed by
    the schedule (which spreads only a block's masked positions); fixed tokens that no
    regex-valid canvas can hold are refused before the first step. The regex is
    matched against the whole generated text (``fullmatch``); a match shorter than the canvas
    is padded with EOS/pad tokens, which the output then trims.
    Simplifies: the paper's DP runs per block and keeps the mask token as a choice (positions
    left masked for later steps); here the DP always spans the whole canvas with every
    position filled, and only the commit schedule leaves positions masked — the guarantee
    (a regex-valid output) is the same. The regex is Python syntax as ``interegular`` reads
    it (no back-references), of at most 512 automaton states; the generated text is read as
    the concatenation of its tokens' texts (true of byte-level BPE: the bundled tokenizer,
    LLaDA's, Dream's; the trace's ``regex_match`` stat checks the decoded output with Python's
    ``re``); tokens that are not whole characters on their own are never used; there is no temperature (the DP returns the most probable string).
    Evidence: the DP lattice (best log-probability per position × state), the best path's
    states, the constrained and the unconstrained (per-position argmax) proposal and their
    log-probabilities. Views: *DP lattice* (position × automaton state, the best path drawn)
    and *Constrained vs unconstrained* (over the run).
    """

    name = "dingo"
    description = "DINGO: the most probable regex-valid canvas by DP over positions x automaton states"
    reference = "Suresh et al. 2025, DINGO: Constrained Inference for Diffusion LLMs (A177)"
    papers = (
        arxiv("Suresh et al. 2025, DINGO: Constrained Inference for Diffusion LLMs", "2505.23061"),
    )
    shows = "; the DP lattice over positions x automaton states and the constrained vs unconstrained proposal (dingo)"
    params = Params(
        regex=Text("[A-Z][a-z]+( [a-z]+)*[.!?]", "the whole generated text must match this regular expression "
                   "(Python syntax, no back-references); a shorter match is padded with EOS"),
        gen_length=gen_length(), steps=steps(), block_length=block_length(),
        fixed=fixed_param(),
    )

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        fsm = compile_regex(p["regex"])
        lay = make_layout(ctx, p["gen_length"], p["steps"], p["block_length"])
        view, p0, g, mask = ctx.target, lay.prompt_len, lay.gen_length, lay.mask_id
        x = new_canvas(ctx, lay)
        fixed = place_fixed(ctx, p.get("fixed", ""), g, p0, x)
        extra: dict[str, Any] = {"fixed": fixed} if fixed else {}
        logits = gen_logits(view, x, lay)[0]
        v = int(logits.shape[-1])
        stops = {t for t in stop_set(ctx) if t < v}
        special = set(getattr(view.tokenizer, "all_special_ids", []) or []) | {mask}
        auto = token_automaton(fsm, token_texts(view.tokenizer, v, special - stops), stops)
        check_fixed(auto, g, {q: int(x[p0 + q]) for q in fixed}, p["regex"],
                    lambda t: view.tokenizer.decode([t], skip_special_tokens=False,
                                                    clean_up_tokenization_spaces=False))
        commit_step = [-1] * g
        per_step: list[int] = []
        step = 0
        for b in range(lay.num_blocks):
            s0, s1 = lay.block(b)
            # like LLaDA, the schedule spreads the block's *masked* positions: fixed ones are not its to fill
            schedule = even_schedule(int((x[p0 + s0:p0 + s1] == mask).sum()), lay.steps_per_block)
            for i in range(lay.steps_per_block):
                if not bool((x[p0 + s0:p0 + s1] == mask).any()):  # fixed cells filled the rest
                    break
                ctx.check_cancel()
                if step:
                    logits = gen_logits(view, x, lay)[0]
                logp = torch.log_softmax(logits.double(), -1)
                # commits and fixed tokens alike are decided: the DP must route through them
                done = (x[p0:] != mask).nonzero().squeeze(1).tolist()
                toks, score, lattice, path = viterbi(auto, pin_rows(logp, {q: int(x[p0 + q]) for q in done}))
                if toks is None:
                    raise PlaygroundError(f"no canvas of {g} tokens matches regex {p['regex']!r} with this "
                                          "model's tokens; change gen_length or the regex")
                pos = (x[p0:] == mask).nonzero().squeeze(1)
                tokens = torch.tensor([toks[q] for q in pos.tolist()], dtype=torch.long)
                probs = torch.softmax(logits[pos].float(), -1)
                conf, margin, ent = stats_of(probs, tokens)
                top1 = probs.argmax(-1)
                prop = Proposal(pos=pos, tokens=tokens, conf=conf, margin=margin, entropy=ent,
                                gap=torch.zeros_like(conf), score=conf.clone(), top1=top1)
                ok = ((pos >= s0) & (pos < s1)).nonzero().squeeze(1)
                chosen = ok[top_k_positions(conf[ok], min(schedule[i], int(ok.numel())))]
                free = logp.argmax(-1)
                ev = {"regex": p["regex"], "n_states": auto.n_states, "done_state": auto.done,
                      "accepting": auto.accepting.nonzero().squeeze(1).tolist(),
                      "best": toks, "log_prob": r5(score), "path": path,
                      "unconstrained": free.tolist(),
                      "unconstrained_log_prob": r5(float(logp.max(-1).values.sum())),
                      "differs": [q for q in range(g) if toks[q] != int(free[q])],
                      "lattice": [[r5(val) for val in row] for row in lattice.tolist()]}
                st = denoise_step(lay, x, prop, chosen, (s0, s1), plan={"plan": "dingo", "k": schedule[i]}, dingo=ev,
                                  **extra)
                for q in st.evidence["unmasked"]:
                    commit_step[q] = step
                per_step.append(len(st.committed))
                self.output_override = x[p0:].tolist()
                yield st
                step += 1
        finish(self, ctx, lay, x[p0:].tolist(), commit_step, per_step, regex=p["regex"],
               automaton_states=auto.n_states)
        kept = [t for t in self.output_override or [] if t not in stops]
        text = view.tokenizer.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        self.extra_stats["regex_match"] = re.fullmatch(p["regex"], text) is not None
