"""Masked-diffusion plans of the second wave: ETE, R²-dLLM, LocalLeap, AdaBlock and ASS.

ETE, R²-dLLM, LocalLeap and AdaBlock decide their commits with a stateful rule
(``decoders.diffusion._rules``); ASS is a step-size schedule of the one sampler
(``_sampler``, plan ``ascending``). All propose tokens as LLaDA does (Gumbel-max at
``temperature``, confidence = softmax probability of the proposed token) and write one
``denoise`` step per forward pass with their rule's evidence beside the canvas.
"""

from __future__ import annotations

from typing import Any, Iterator

from decoders.base import Context, Float, Int, Params, Text, register
from decoders.citation import Paper, arxiv
from decoders.diffusion.fixed import fixed_param
from decoders.diffusion.hand import takes_hand
from decoders.diffusion._rules import ETE, R2, AdaBlock, LocalLeap, Rule, run_rule
from decoders.diffusion._sampler import Recipe
from decoders.diffusion.named import (ASS_PAPER, DiffusionDecoder, block_length, cfg_scale, eos_penalty, gen_length,
                                      temperature)
from playground.core.errors import PlaygroundError
from playground.core.trace import Step


def threshold(default: float = 0.9, what: str = "commit positions whose confidence exceeds this") -> Float:
    return Float(default, 0.0, 1.0, what)


class RuleDecoder(DiffusionDecoder):
    """Base of the decoders whose commits a :class:`_rules.Rule` decides."""

    def rule(self, p: dict[str, Any]) -> Rule:
        """The rule for these knob values."""
        raise NotImplementedError

    @takes_hand
    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        rc = Recipe(gen_length=p["gen_length"], block_length=p.get("block_length", 0), plan="threshold",
                    temperature=p["temperature"], cfg_scale=p.get("cfg_scale", 0.0), fixed=p.get("fixed", ""))
        yield from run_rule(ctx, rc, self.rule(p), self)


@register
class ExploreThenExploit(RuleDecoder):
    """ETE (A014): each round commits the confident set and, when that set carries little
    information, also a few of the most uncertain positions, whose commits reshape the
    other positions' distributions and can set off a cascade of confident ones.

    Exploit: Fast-dLLM's set inside the block (confidence above ``threshold``, else the most
    confident position). Explore: when the exploit commits carry fewer than ``budget`` bits
    (``-log2 p`` summed), the ``explore`` highest-entropy masked positions, taken from the
    block and up to ``cross_block`` positions past its end (cross-block exploration). The
    paper's budget is a per-round information budget; the when-to-explore rule (a bits
    floor) and the entropy ranking are our reading of its abstract. ``explore`` 0 is
    ``fast_dllm``. Evidence: bits committed per round (exploit and explore), which commits
    explored, and the cascade (confident commits in the round after an exploration).
    Views: *Explore vs exploit* (bits of every masked position at a round, the explored ones
    marked) and *Bits per round* (bits per round with the cascades, over the unmasking map
    with explore and exploit commits marked).
    """

    name = "ete"
    description = "ETE: confident commits plus a few highest-entropy ones per round (explore, then exploit)"
    reference = "Fu et al. 2025, From Bits to Rounds: Parallel Decoding with Exploration for Diffusion LMs (A014)"
    papers = (
        arxiv("Fu et al. 2025, From Bits to Rounds: Parallel Decoding with Exploration for "
              "Diffusion Language Models (ETE)", "2511.21103"),
    )
    params = Params(
        gen_length=gen_length(), block_length=block_length(),
        threshold=threshold(0.9, "exploit: commit positions whose confidence exceeds this"),
        explore=Int(1, 0, 16, "explore: highest-entropy positions added to a round that is poor in bits; 0 = fast_dllm"),
        budget=Float(4.0, 0.0, 64.0, "explore only when the round's confident commits carry fewer bits "
                                     "(-log2 p summed) than this"),
        cross_block=Int(0, 0, 4096, "exploration may reach this many positions past the current block"),
        temperature=temperature(), cfg_scale=cfg_scale(),
        fixed=fixed_param(),
    )

    def rule(self, p: dict[str, Any]) -> Rule:
        return ETE(p["threshold"], p["explore"], p["budget"], p["cross_block"])


@register
class R2DLLM(RuleDecoder):
    """R²-dLLM (A102): the threshold set plus two redundancy cuts, spatial and temporal.

    Each step commits, inside the block, the union of (a) Fast-dLLM's set (confidence above
    ``threshold``, else the most confident), (b) every masked position of a sliding window
    of ``window`` positions whose masked positions' mean confidence is at least
    ``window_threshold`` (a confident cluster is committed together), and (c) every position
    whose proposed token has stayed the same for ``stable_steps`` consecutive steps with a
    mean confidence over that streak of at least ``stable_threshold`` (a settled prediction
    is finalised instead of being predicted again). Follows the authors' inference rules;
    their redundancy-aware fine-tuning and token-cluster rule are left out. ``window`` 0 and
    ``stable_steps`` 0 is ``fast_dllm``. Evidence: which rule committed each position, the
    windows that fired and every masked position's stability counter. Views: *Which rule
    committed* (confidence per position coloured by rule, windows shaded, stability counters)
    and *Stability counters* (position x step).
    """

    name = "r2_dllm"
    description = "R²-dLLM: threshold + confident windows + proposals stable for s steps"
    reference = ("Du et al. 2026, R²-dLLM: Accelerating Diffusion LLMs via Spatio-Temporal Redundancy "
                 "Reduction (A102)")
    papers = (
        arxiv("Du et al. 2026, R²-dLLM: Accelerating Diffusion Large Language Models via "
              "Spatio-Temporal Redundancy Reduction", "2604.18995"),
        Paper("R²-dLLM's decoding rules, llada/generate.py", "https://github.com/GATECH-EIC/R2-dLLM"),
    )
    params = Params(
        gen_length=gen_length(), block_length=block_length(),
        threshold=threshold(0.9),
        window=Int(3, 0, 64, "spatial: window of consecutive positions judged together; 0 = off"),
        window_threshold=Float(0.7, 0.0, 1.0, "spatial: a window whose masked positions' mean "
                                              "confidence reaches this commits them all"),
        stable_steps=Int(3, 0, 64, "temporal: steps a proposal must hold unchanged; 0 = off"),
        stable_threshold=Float(0.5, 0.0, 1.0, "temporal: mean confidence over that streak it must reach"),
        temperature=temperature(), cfg_scale=cfg_scale(),
        fixed=fixed_param(),
    )

    def rule(self, p: dict[str, Any]) -> Rule:
        return R2(p["threshold"], p["window"], p["window_threshold"], p["stable_steps"], p["stable_threshold"])


@register
class LocalLeapDecoder(RuleDecoder):
    """LocalLeap (A134): confident anchors pull their neighbours in under a relaxed threshold.

    Each step, anchors are the block's masked positions with confidence above ``tau_hi``;
    a masked position within ``radius`` positions of an anchor is committed with it when
    its confidence is above ``tau_lo`` (local determinism spreads from anchors). Spatial
    consistency decays with distance: ``decay`` > 0 raises the relaxed threshold linearly
    towards ``tau_hi`` at the zone's edge. With no anchor the most confident position is
    committed, as one-token-per-step decoding would. Neighbours pulled in do not anchor
    further leaps in the same step. ``tau_lo`` = ``tau_hi`` is ``fast_dllm`` at that
    threshold. Evidence: anchors, leaps and the leap zones. Views: *Anchors and leap zones*
    (confidence per position against both thresholds, zones shaded) and *Anchors over the
    run* (position x step).
    """

    name = "localleap"
    description = "LocalLeap: anchors above tau_hi commit neighbours within r above tau_lo"
    reference = "Kong et al. 2025, Accelerating Diffusion LLM Inference via Local Determinism Propagation (A134)"
    papers = (
        arxiv("Kong et al. 2025, Accelerating Diffusion LLM Inference via Local Determinism "
              "Propagation (LocalLeap)", "2510.07081"),
    )
    params = Params(
        gen_length=gen_length(), block_length=block_length(),
        tau_hi=Float(0.9, 0.0, 1.0, "anchor threshold: positions above it commit and anchor a zone"),
        tau_lo=Float(0.5, 0.0, 1.0, "relaxed threshold inside an anchor's zone (at most tau_hi)"),
        radius=Int(2, 0, 64, "zone radius in positions around each anchor"),
        decay=Float(0.0, 0.0, 1.0, "raise the relaxed threshold towards tau_hi with distance (0 = flat)"),
        temperature=temperature(), cfg_scale=cfg_scale(),
        fixed=fixed_param(),
    )

    def rule(self, p: dict[str, Any]) -> Rule:
        if p["tau_lo"] > p["tau_hi"]:
            raise PlaygroundError(f"tau_lo ({p['tau_lo']}) must not exceed tau_hi ({p['tau_hi']})")
        return LocalLeap(p["tau_hi"], p["tau_lo"], p["radius"], p["decay"])


@register
class AdaBlockDecoder(RuleDecoder):
    """AdaBlock-dLLM (A195): semi-AR blocks whose boundary follows the model's delimiters.

    When a block starts, AdaBlock looks at the proposals over a window (``window`` of the
    canvas) from the block's start: among the positions whose proposed token is a
    delimiter (newline or punctuation in ``delimiters``), the most confident ends the block
    just after itself if its confidence reaches ``delimiter_threshold``; otherwise the
    block is ``block_length`` long. Inside the block, Fast-dLLM's threshold commits. The
    paper finds such delimiters in the confidence "volatility band", where confidence is
    still moving; like the authors' code we test the delimiter's confidence alone.
    ``delimiter_threshold`` 1 gives fixed blocks (``fast_dllm`` when ``block_length``
    divides the canvas). Evidence: the look-ahead window, the delimiter candidates, the
    chosen boundary and each block's size. Views: *Adaptive block* (confidence per position,
    the block, the window and the starred delimiter candidates) and *Blocks over the run*
    (the block band moving over position x step).
    """

    name = "adablock"
    description = "AdaBlock: each block ends at a confident predicted delimiter (adaptive block size)"
    reference = ("Lu et al. 2025, AdaBlock-dLLM: Semantic-Aware Diffusion LLM Inference via Adaptive "
                 "Block Size (A195)")
    papers = (
        arxiv("Lu et al. 2025, AdaBlock-dLLM: Semantic-Aware Diffusion LLM Inference via "
              "Adaptive Block Size", "2509.26432"),
        Paper("AdaBlock-dLLM's block-length rule, llada/generate_adablock.py",
              "https://github.com/lgxi24/AdaBlock-dLLM"),
    )
    params = Params(
        gen_length=gen_length(),
        block_length=Int(8, 1, 4096, "default block length when no delimiter is confident enough"),
        threshold=threshold(0.9),
        delimiter_threshold=Float(0.3, 0.0, 1.0, "a predicted delimiter this confident ends the block; "
                                                 "1 = never (fixed blocks)"),
        window=Float(0.25, 0.01, 1.0, "look-ahead window for delimiters, as a share of gen_length"),
        delimiters=Text("\\n.,;:!?", "characters that count as delimiters (\\n for a newline)"),
        temperature=temperature(), cfg_scale=cfg_scale(),
        fixed=fixed_param(),
    )

    def rule(self, p: dict[str, Any]) -> Rule:
        chars = p["delimiters"].replace("\\n", "\n")
        if not chars.strip(" "):
            raise PlaygroundError("delimiters must name at least one character")
        # a delimiter threshold of 1 can still be met by a certain delimiter; above 1 never is
        thr = p["delimiter_threshold"] if p["delimiter_threshold"] < 1.0 else float("inf")
        return AdaBlock(p["threshold"], p["block_length"], thr, p["window"], chars)

    @takes_hand
    def run(self, ctx: Context) -> Iterator[Step]:
        p = ctx.params
        rc = Recipe(gen_length=p["gen_length"], plan="threshold", temperature=p["temperature"],
                    cfg_scale=p["cfg_scale"], fixed=p.get("fixed", ""))
        yield from run_rule(ctx, rc, self.rule(p), self)


@register
class AscendingStepSize(DiffusionDecoder):
    """ASS (A149): few commits in the first steps, geometrically more later.

    Step ``i`` of a block commits about ``growth^i`` positions, the most confident ones,
    scaled so the block fills in ``steps`` steps (the authors' scheduler commits 1, 2, 4, ...
    on a canvas of ``2^steps - 1``). ``steps`` 0 takes the geometric count from one commit
    (``ceil(log2(block + 1))`` at growth 2). Meant for full-diffusion decoding without
    blocks, the paper's setting; ``block_length`` applies it per block. The EOS penalty is
    the paper's companion, EOS early rejection. Evidence: the planned schedule beside the
    even one. View: *Step-size schedule* (planned, committed and LLaDA's even step sizes).
    """

    name = "ass"
    description = "ASS: ascending step sizes, 1, 2, 4, ... commits per step (with EOS early rejection)"
    reference = ("Taming Masked Diffusion LMs via Consistency Trajectory RL with Fewer Decoding Steps: "
                 "EOSER and the ascending step-size scheduler (A149)")
    papers = (ASS_PAPER,)
    params = Params(
        gen_length=gen_length(),
        steps=Int(0, 0, 4096, "denoising steps in all, a multiple of the number of blocks and at most "
                              "gen_length; 0 = the geometric count from one commit (log2 of the block at growth 2)"),
        block_length=block_length(),
        growth=Float(2.0, 1.0, 4.0, "each step commits about this many times the previous one; 1 = even"),
        eos_penalty=eos_penalty(), temperature=temperature(), cfg_scale=cfg_scale(),
        fixed=fixed_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], steps=p["steps"], block_length=p["block_length"],
                      plan="ascending", growth=p["growth"], eos_penalty=p["eos_penalty"],
                      temperature=p["temperature"], cfg_scale=p["cfg_scale"])
