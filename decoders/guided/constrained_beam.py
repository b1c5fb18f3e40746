"""``constrained_beam``: lexically constrained beam search with dynamic beam allocation
(Post & Vilar 2018): the output contains every forced word or phrase."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from decoders.base import Context, Decoder, Float, Int, Params, PlaygroundError, Text, register
from decoders.citation import arxiv
from decoders.constraint import parse_words
from decoders.beam_batch import BatchState, hits_stop
from playground.core.trace import Step

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Progress:
    """Which forced phrases a hypothesis has produced, and how far into one it is."""

    met: frozenset[int] = frozenset()
    phrase: int = -1  # the phrase in progress (-1: none)
    at: int = 0       # tokens of it produced so far

    def count(self, phrases: Sequence[Sequence[int]]) -> int:
        """Forced tokens produced: the bank this hypothesis belongs to."""
        return sum(len(phrases[c]) for c in self.met) + (self.at if self.phrase >= 0 else 0)

    def after(self, tok: int, phrases: Sequence[Sequence[int]]) -> "Progress":
        """The progress after one more token (an interrupted phrase starts over)."""
        if self.phrase >= 0 and phrases[self.phrase][self.at] == tok:
            if self.at + 1 == len(phrases[self.phrase]):
                return Progress(self.met | {self.phrase})
            return Progress(self.met, self.phrase, self.at + 1)
        for c, ph in enumerate(phrases):
            if c not in self.met and ph[0] == tok:
                return Progress(self.met | {c}) if len(ph) == 1 else Progress(self.met, c, 1)
        return Progress(self.met)

    def wanted(self, phrases: Sequence[Sequence[int]]) -> list[int]:
        """Tokens that advance a forced phrase from here (the next of the one in progress,
        else the first of every unmet one)."""
        if self.phrase >= 0:
            return [phrases[self.phrase][self.at]]
        return sorted({ph[0] for c, ph in enumerate(phrases) if c not in self.met})


def phrases_of(view: Any, text: str) -> list[list[int]]:
    """Token sequences of the forced words: as written when they start with white space or
    punctuation, else with a leading space (a word inside running text)."""
    out: list[list[int]] = []
    for w in parse_words(text):
        t = w if not w[0].isalnum() else " " + w
        ids = [int(i) for i in view.tokenizer.encode(t, add_special_tokens=False)]
        if not ids:
            raise PlaygroundError(f"knob 'force_words': {w!r} has no tokens")
        if ids not in out:
            out.append(ids)
    return out


def bank_sizes(k: int, available: Sequence[int]) -> list[int]:
    """Dynamic beam allocation: ``k`` slots split evenly over the banks (the remainder to the
    banks with the most forced tokens), then slots a bank cannot fill handed to the others,
    most forced tokens first."""
    nb = len(available)
    quota = [k // nb] * nb
    for j in range(k - sum(quota)):
        quota[nb - 1 - j] += 1
    take = [min(q, a) for q, a in zip(quota, available)]
    spare = k - sum(take)
    for b in range(nb - 1, -1, -1):
        extra = min(spare, available[b] - take[b])
        take[b] += extra
        spare -= extra
    return take


@register
class ConstrainedBeam(Decoder):
    """Lexically constrained beam search with dynamic beam allocation (Post & Vilar 2018, A010).

    Every hypothesis tracks which forced phrases it has produced and how far into one it is.
    At each step each beam proposes its ``num_beams`` best next tokens, the tokens that would
    advance a forced phrase, and its single best token; candidates are grouped into banks by
    the number of forced tokens they have produced (0..C), the ``num_beams`` slots are split
    evenly over the banks (a bank with too few candidates hands its slots to the others), and
    each bank keeps its best candidates by summed log-probability. A phrase interrupted halfway
    starts over. EOS (any stop token) is allowed only once every phrase is in, and a finished
    hypothesis enters the pool with score ``logprob / len ** length_penalty``; the search ends
    when ``num_beams`` hypotheses finished or at the length limit, and returns the best
    finished one (else the running one with the most forced tokens). Simplifies: phrases are
    matched as token sequences (the same word tokenized differently does not count).
    """

    name = "constrained_beam"
    family = "guided"
    kind = "causal"
    step_kind = "beam"
    params = Params(
        force_words=Text("", "words or phrases the output must contain (JSON list of strings, or comma-separated); "
                             "a word starting with a letter or digit is matched with a leading space"),
        num_beams=Int(6, 1, 64, "hypotheses kept at each step, split over the banks of forced-token counts"),
        length_penalty=Float(1.0, -5.0, 5.0, "finished score = logprob / length^this"),
    )
    reference = ("Post & Vilar 2018, Fast Lexically Constrained Decoding with Dynamic Beam Allocation for "
                 "Neural Machine Translation (NAACL); Hokamp & Liu 2017 (grid beam search)")
    papers = (
        arxiv("Post & Vilar 2018, Fast Lexically Constrained Decoding with Dynamic Beam "
              "Allocation for Neural Machine Translation (NAACL)", "1804.06609"),
        arxiv("Hokamp & Liu 2017, Lexically Constrained Decoding for Sequence Generation Using "
              "Grid Beam Search (ACL)", "1704.07138"),
    )
    description = "Beam search whose output must contain the forced words; beams split into banks by progress"

    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        if not str(p.get("force_words") or "").strip():
            raise PlaygroundError("decoder 'constrained_beam' needs force_words (the words the output must contain)")
        phrases = phrases_of(ctx.target, str(p["force_words"]))
        total = sum(len(ph) for ph in phrases)
        k, lp_pow = int(p["num_beams"]), float(p["length_penalty"])
        state = BatchState(ctx.target, ctx.prompt_ids, k)
        logits = state.first[None].expand(k, -1)
        beams: list[list[int]] = [[] for _ in range(k)]
        prog = [Progress() for _ in range(k)]
        scores = torch.full((k,), NEG_INF)
        scores[0] = 0.0  # the k copies of the prompt would all propose the same tokens
        pool: list[tuple[float, list[int], float]] = []
        prev_pos: dict[int, int] = {}
        stops = sorted(t for t in ctx.stop_ids if t < logits.shape[-1])
        self.extra_stats["forced_phrases"] = [ctx.target.decode(ph) for ph in phrases]
        for t in range(ctx.max_new_tokens):
            ctx.check_cancel()
            logprobs = torch.log_softmax(logits.float(), -1).cpu()  # banks are sorted on the CPU
            cands: dict[tuple[int, int], float] = {}
            for b in range(k):
                if scores[b] == NEG_INF:
                    continue
                row = logprobs[b].clone()
                if len(prog[b].met) < len(phrases) and stops:
                    row[stops] = NEG_INF  # no ending before every phrase is in
                picks = torch.topk(row, min(k, row.numel())).indices.tolist() + prog[b].wanted(phrases)
                for tok in picks:
                    s = float(scores[b] + row[tok])
                    if s > NEG_INF:
                        cands[(b, int(tok))] = s
            if not cands:
                break
            banks: list[list[tuple[float, int, int, Progress]]] = [[] for _ in range(total + 1)]
            finished_ev: list[dict[str, Any]] = []
            for (b, tok), s in cands.items():
                gen = beams[b] + [tok]
                nxt = prog[b].after(tok, phrases)
                if hits_stop(ctx, gen):
                    if len(nxt.met) == len(phrases):
                        pool.append((s / (len(gen) ** lp_pow), gen, s))
                        finished_ev.append({"ids": gen, "score": round(s / (len(gen) ** lp_pow), 5),
                                            "parent": prev_pos.get(b), "finished": True, "group": total})
                    continue
                banks[nxt.count(phrases)].append((s, b, tok, nxt))
            for bank in banks:
                bank.sort(key=lambda c: (-c[0], c[1], c[2]))
            take = bank_sizes(k, [len(bank) for bank in banks])
            chosen = [c for bank, n in zip(banks, take) for c in bank[:n]]
            chosen.sort(key=lambda c: -c[0])
            pool.sort(key=lambda h: -h[0])
            del pool[k:]
            running_ev = [{"ids": beams[b] + [tok], "score": round(s, 5), "parent": prev_pos.get(b),
                           "finished": False, "group": nxt.count(phrases)} for s, b, tok, nxt in chosen]
            yield Step("beam", [], beams=running_ev + finished_ev, groups=total + 1,
                       banks={"sizes": take, "forced_tokens": total,
                              "met": [len(nxt.met) for *_, nxt in chosen]})
            if not chosen:
                break
            rows = [b for _, b, _, _ in chosen]
            feed = [tok for _, _, tok, _ in chosen]
            beams = [beams[b] + [tok] for _, b, tok, _ in chosen]
            prog = [nxt for *_, nxt in chosen]
            scores = torch.tensor([s for s, *_ in chosen], dtype=torch.float32)
            prev_pos = {j: j for j in range(len(chosen))}
            if len(pool) >= k or t + 1 >= ctx.max_new_tokens:
                break
            while len(rows) < k:  # fewer candidates than beams: dead rows keep the batch shape
                rows.append(rows[0])
                feed.append(feed[0])
                beams.append(list(beams[0]))
                prog.append(prog[0])
                scores = torch.cat([scores, torch.tensor([NEG_INF])])
            state.reorder(rows)
            logits = state.advance(feed)
        best_running = None
        if beams and scores.numel():
            live = [j for j in range(len(beams)) if scores[j] > NEG_INF]
            if live:
                j = max(live, key=lambda j: (len(prog[j].met), float(scores[j])))
                best_running = beams[j], prog[j]
        if pool:
            out = pool[0][1]
            met = len(phrases)
        elif best_running is not None:
            out, pr = best_running
            met = len(pr.met)
        else:
            out, met = [], 0
        self.output_override = list(out)
        self.extra_stats["forced_met"] = met
        self.extra_stats["forced_total"] = len(phrases)
        if out and out[-1] in ctx.stop_ids:
            self.finish_reason = "eos" if out[-1] in getattr(ctx.target, "eos_ids", set()) else "stop"
        elif out and hits_stop(ctx, out):
            self.finish_reason = "stop"
        else:
            self.finish_reason = "length"
