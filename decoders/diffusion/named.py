"""Named masked-diffusion decoders: each paper's method as a recipe of the one sampler.

See ``decoders.diffusion._sampler`` for the sampler and its pluggable choices. All of these
need a diffusion model (the bundled ``tiny-shakespeare-diffusion``, LLaDA, Dream, or a plain
masked LM such as BERT/RoBERTa/ModernBERT) and write one ``denoise`` step per forward pass.
The output is the final canvas with its trailing EOS/pad run cut (one EOS kept); stop
strings do not apply, since a canvas is not written left to right.
"""

from __future__ import annotations

from typing import Any, Iterator

from decoders.base import Bool, Choice, Context, Decoder, Float, Int, Params, register
from decoders.citation import Paper, arxiv
from decoders.diffusion.block_cache import cache_param
from decoders.diffusion.fixed import fixed_param
from decoders.diffusion.hand import takes_hand
from decoders.diffusion._sampler import SCHED_SHAPES, SCORES, Recipe, run_recipe
from playground.core.trace import Step

# sources cited by more than one decoder, named once so they cannot drift apart
_LLADA = arxiv("Nie et al. 2025, Large Language Diffusion Models (LLaDA)", "2502.09992")
_DREAM = arxiv("Ye et al. 2025, Dream 7B: Diffusion Large Language Models", "2508.15487")
_FAST_DLLM = arxiv("Wu et al. 2025, Fast-dLLM: Training-free Acceleration of Diffusion LLM by "
                   "Enabling KV Cache and Parallel Decoding", "2505.22618")
_SCHED = arxiv("Mohamed et al. 2025, Fast-Decoding Diffusion Language Models via Progress-Aware "
               "Confidence Schedules (SchED)", "2512.02892")
_PROPHET = arxiv("Li et al. 2025, Diffusion Language Models Know the Answer Before Decoding "
                 "(Prophet)", "2508.19982")
_PC = arxiv("Huang et al. 2025, PC-Sampler: Position-Aware Calibration of Decoding Bias in "
            "Masked Diffusion Models", "2508.13021")
_CREDIT = arxiv("CreditDecoding: Accelerating Parallel Decoding in Diffusion Large Language "
                "Models with Trace Credits (2025)", "2510.06133")
ASS_PAPER = Paper("Taming Masked Diffusion Language Models via Consistency Trajectory Reinforcement Learning "
                  "with Fewer Decoding Steps: EOS early rejection and the ascending step-size scheduler "
                  "(authors' code)",
                  "https://github.com/yjyddq/EOSER-ASS-RL")


def gen_length() -> Int:
    return Int(0, 0, 4096, "canvas length: how many masked positions to fill; 0 = max_new_tokens")


def steps(extra: str = "") -> Int:
    return Int(0, 0, 4096, "denoising steps in all, a multiple of the number of blocks and at most "
                           "gen_length; 0 = gen_length (one token per step)" + extra)


def block_length(default_help: str = "0 = one block (no semi-autoregression)") -> Int:
    return Int(0, 0, 4096, "semi-autoregressive block length; must divide gen_length; " + default_help)


def temperature(default: float = 0.0) -> Float:
    return Float(default, 0.0, 2.0, "sampling temperature of the committed token; 0 = argmax")


def cfg_scale() -> Float:
    return Float(0.0, 0.0, 10.0, "classifier-free guidance with the prompt re-masked "
                                 "(LLaDA): un + (cfg + 1)(cond - un); 0 = off")


def eos_penalty() -> Float:
    return Float(0.0, 0.0, 50.0, "EOS early rejection (A149): subtract this from EOS/pad logits, "
                                 "fading linearly to 0 as the canvas fills; 0 = off")


class DiffusionDecoder(Decoder):
    """Base of the named decoders: ``recipe(params)`` says which sampler choices to use."""

    family = "diffusion"
    kind = "diffusion"
    step_kind = "denoise"

    def recipe(self, p: dict[str, Any]) -> Recipe:
        """The sampler choices for these knob values."""
        raise NotImplementedError

    @takes_hand
    def run(self, ctx: Context) -> Iterator[Step]:
        rc = self.recipe(ctx.params)
        rc.fixed = ctx.params.get("fixed", "")  # every named recipe takes the infilling knob
        yield from run_recipe(ctx, rc, self)


@register
class LLaDA(DiffusionDecoder):
    """LLaDA's ``generate``: semi-AR blocks, an even per-block schedule, low-confidence or
    random remasking, Gumbel-max sampling in float64, and unsupervised CFG.

    Implements ``generate.py`` of ML-GSAI/LLaDA: each block gets ``steps / num_blocks``
    steps; step ``i`` commits ``mask_count // steps`` positions (the remainder to the first
    steps), the most confident ones (softmax probability of the proposed token) or random
    ones, among the masked positions of the current block only. Ties go to the leftmost
    position (LLaDA's ``torch.topk`` leaves ties unspecified). The optional EOS penalty is
    EOS early rejection (A149), not part of LLaDA; LLaDA's own ``logits_eos_inf`` is the
    penalty taken to infinity. ``cache`` prefix/dual is Fast-dLLM's block KV cache applied
    to LLaDA's schedule, as Fast-dLLM applies it: an approximation (it changes the logits).
    """

    name = "llada"
    description = "LLaDA: semi-AR blocks, even schedule, low-confidence or random remasking"
    reference = "Nie et al. 2025, Large Language Diffusion Models (LLaDA), generate.py"
    papers = (
        _LLADA,
        Paper("LLaDA's reference sampler, generate.py", "https://github.com/ML-GSAI/LLaDA"),
    )
    params = Params(
        gen_length=gen_length(), steps=steps(), block_length=block_length(),
        remasking=Choice("low_confidence", ("low_confidence", "random"),
                         "which masked positions to commit: the most confident or random ones"),
        temperature=temperature(), cfg_scale=cfg_scale(), eos_penalty=eos_penalty(),
        fixed=fixed_param(), cache=cache_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], steps=p["steps"], block_length=p["block_length"],
                      score="prob" if p["remasking"] == "low_confidence" else "random", plan="even",
                      token="gumbel", temperature=p["temperature"], cfg_scale=p["cfg_scale"],
                      eos_penalty=p["eos_penalty"], cache=p["cache"])


@register
class Dream(DiffusionDecoder):
    """Dream's ``diffusion_generate``: ``1 - s/t`` schedule over ``linspace(1, eps, steps+1)``,
    per-position temperature/top-p/top-k sampling, and four unmasking orders.

    ``alg``: ``origin`` commits each masked position with probability ``1 - s/t`` (random
    order); ``maskgit_plus`` ranks by the sampled token's probability, ``topk_margin`` by
    top-1 minus top-2 probability, ``entropy`` by negative entropy, and these commit
    ``int(masked * (1 - s/t))`` positions per step (all on the last). ``alg_temp`` > 0 draws
    those positions from softmax(confidence / alg_temp) instead of taking the top ones.
    Dream has no blocks; ``block_length`` applies the same schedule inside each block.
    Dream's logit shift is done by the model handle (``logits_shifted``).
    """

    name = "dream"
    description = "Dream: 1 - s/t schedule, origin / maskgit_plus / topk_margin / entropy orders"
    reference = "Ye et al. 2025, Dream 7B: Diffusion Large Language Models (generation_utils.py)"
    papers = (
        _DREAM,
        Paper("Dream's reference sampler, generation_utils.py", "https://github.com/HKUNLP/Dream"),
    )
    params = Params(
        gen_length=gen_length(), steps=steps(), block_length=block_length("0 = one block (Dream's default)"),
        alg=Choice("entropy", ("origin", "maskgit_plus", "topk_margin", "entropy"),
                   "unmasking order: random (origin), top-1 probability, top-1 - top-2 margin, "
                   "negative entropy"),
        temperature=Float(0.2, 0.0, 2.0, "sampling temperature per position; 0 = argmax"),
        top_p=Float(0.95, 0.0, 1.0, "nucleus filter per position (1 = off)"),
        top_k=Int(0, 0, 1000, "keep the k most probable tokens per position (0 = off)"),
        alg_temp=Float(0.0, 0.0, 5.0, "> 0 draws the positions to commit from softmax(confidence / alg_temp)"),
        eps=Float(1e-3, 1e-5, 0.5, "the time grid ends at eps instead of 0"),
        fixed=fixed_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        alg = p["alg"]
        score = {"origin": "prob", "maskgit_plus": "prob", "topk_margin": "margin",
                 "entropy": "neg_entropy"}[alg]
        return Recipe(gen_length=p["gen_length"], steps=p["steps"], block_length=p["block_length"],
                      score=score, plan="origin" if alg == "origin" else "dream", token="categorical",
                      temperature=p["temperature"], top_p=p["top_p"], top_k=p["top_k"],
                      alg_temp=p["alg_temp"], eps=p["eps"])


@register
class FastDLLM(DiffusionDecoder):
    """Fast-dLLM's confidence-aware parallel decoding (threshold), with its block KV cache as a knob.

    Inside each block, every step commits every masked position whose confidence (softmax
    probability of the proposed token) *exceeds* the threshold, and always at least the most
    confident one, so the number of steps adapts to the model's certainty. Strictly greater,
    so ``threshold`` 1.0 commits exactly one position per step. ``cache`` prefix/dual is
    Fast-dLLM's block-wise KV cache (``decoders.diffusion.block_cache``): a full forward at
    each block start keeps every layer's keys/values, and the block's other steps run only
    the block and suffix (prefix) or the block (dual) against them. It is approximate:
    the logits differ from the uncached ones, so the output may too (default none). Only
    ModernBERT, BERT and RoBERTa models are supported; the paper runs it on LLaDA and Dream.
    """

    name = "fast_dllm"
    description = "Fast-dLLM: commit every position above a confidence threshold (>= 1 per step)"
    reference = "Wu et al. 2025, Fast-dLLM: Training-free Acceleration of Diffusion LLM (A043 family)"
    papers = (_FAST_DLLM,)
    params = Params(
        gen_length=gen_length(), block_length=block_length(),
        threshold=Float(0.9, 0.0, 1.0, "commit positions whose confidence exceeds this; 1 = one per step"),
        temperature=temperature(), cfg_scale=cfg_scale(),
        fixed=fixed_param(), cache=cache_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], block_length=p["block_length"], plan="threshold",
                      threshold=p["threshold"], temperature=p["temperature"], cfg_scale=p["cfg_scale"],
                      cache=p["cache"])


@register
class SchED(DiffusionDecoder):
    """SchED (A214): LLaDA decoding that stops early once the whole span is confident.

    Each step aggregates the top-1 minus top-2 probability margin over every still-masked
    position of the canvas (all blocks: the full span) by its mean. When that aggregate
    reaches a threshold that falls smoothly with progress (step / total steps) from
    ``tau_high`` to ``tau_low`` (linear, cosine or exponential shape), every masked position
    is committed at once with its current prediction. Otherwise the step is LLaDA's.
    The paper's exact threshold shape is not public in our notes; these are our choices.
    """

    name = "sched"
    description = "SchED: LLaDA steps, early exit when the mean margin passes a falling threshold"
    reference = "SchED: Fast decoding of diffusion LMs via progress-aware confidence schedules (A214)"
    papers = (_SCHED,)
    params = Params(
        gen_length=gen_length(), steps=steps(), block_length=block_length(),
        tau_high=Float(0.9, 0.0, 1.0, "threshold on the mean margin at the first step"),
        tau_low=Float(0.3, 0.0, 1.0, "threshold on the mean margin at the last step"),
        shape=Choice("cosine", SCHED_SHAPES, "how the threshold falls with progress"),
        temperature=temperature(),
        fixed=fixed_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], steps=p["steps"], block_length=p["block_length"],
                      exit="sched", sched_high=p["tau_high"], sched_low=p["tau_low"],
                      sched_shape=p["shape"], temperature=p["temperature"])


@register
class Prophet(DiffusionDecoder):
    """Prophet (A268): LLaDA decoding that goes "all-in" once the top-2 gap is large.

    Each step takes the gap between the top-1 and top-2 *logits* at every still-masked
    position, aggregated by its mean (or min). If it reaches the threshold of the current
    third of the decoding (``early``/``mid``/``late``, defaults 7.5/5.0/2.5 as in the
    authors' code), all masked positions are committed at once; otherwise the step is
    LLaDA's. Prophet watches a few answer positions; we watch the whole masked span.
    """

    name = "prophet"
    description = "Prophet: LLaDA steps, commit all once the top-1/top-2 logit gap is large"
    reference = "Li et al. 2025, Diffusion Language Models Know the Answer Before Decoding (A268)"
    papers = (_PROPHET,)
    params = Params(
        gen_length=gen_length(), steps=steps(), block_length=block_length(),
        early=Float(7.5, 0.0, 100.0, "gap threshold in the first third of the steps"),
        mid=Float(5.0, 0.0, 100.0, "gap threshold in the middle third"),
        late=Float(2.5, 0.0, 100.0, "gap threshold in the last third"),
        aggregate=Choice("mean", ("mean", "min"), "how the gaps of the masked positions are combined"),
        temperature=temperature(),
        fixed=fixed_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], steps=p["steps"], block_length=p["block_length"],
                      exit="prophet", prophet_early=p["early"], prophet_mid=p["mid"],
                      prophet_late=p["late"], prophet_aggregate=p["aggregate"],
                      temperature=p["temperature"])


@register
class PCSampler(DiffusionDecoder):
    """PC-Sampler (A157): rank by calibrated confidence times a position-aware weight.

    score = p(token) * min(-log prior(token), clip) * exp(-position_decay * position): the
    calibration demotes trivial tokens (frequent ones: newlines, commas, EOS) that masked
    models like to commit first, and the weight steers the global path left to right
    without hard blocks. Simplification: the token prior is the model's mean prediction
    over the masked canvas at the first step (a frequency estimate that needs no corpus),
    not a corpus count. The schedule is LLaDA's even one.
    """

    name = "pc_sampler"
    description = "PC-Sampler: calibrated confidence x position weight, no blocks needed"
    reference = "Huang et al. 2025, PC-Sampler: Position-Aware Calibration of Decoding Bias in MDMs (A157)"
    papers = (_PC,)
    params = Params(
        gen_length=gen_length(), steps=steps(), block_length=block_length(),
        position_decay=Float(0.05, 0.0, 2.0, "weight exp(-decay * position); 0 = no position weight"),
        calibrate=Bool(True, "divide out trivial tokens with the token prior (-log prior, clipped)"),
        clip=Float(10.0, 0.1, 50.0, "upper clip of -log prior"),
        temperature=temperature(),
        fixed=fixed_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], steps=p["steps"], block_length=p["block_length"],
                      position_decay=p["position_decay"], calibrate=p["calibrate"],
                      calib_clip=p["clip"], temperature=p["temperature"])


@register
class CreditDecoding(DiffusionDecoder):
    """CreditDecoding (A239): threshold decoding on logits fused with historical credit.

    Every position keeps a credit per token: each step it decays by ``credit_decay`` and the
    current top-1 token gains its probability. The next step's logits are fused as
    ``log_softmax(logits) + credit_weight * log(1 + credit)``, so a token the model keeps
    predicting crosses the Fast-dLLM threshold sooner instead of being remasked again.
    The decay/fusion forms are ours (the abstract does not give them).
    """

    name = "credit"
    description = "CreditDecoding: threshold decoding with accumulated per-token credit"
    reference = "CreditDecoding: Accelerating Parallel Decoding in Diffusion LLMs with Trace Credits (A239)"
    papers = (_CREDIT,)
    params = Params(
        gen_length=gen_length(), block_length=block_length(),
        threshold=Float(0.9, 0.0, 1.0, "commit positions whose fused confidence exceeds this"),
        credit_weight=Float(0.5, 0.0, 5.0, "weight of log(1 + credit) in the fused logits"),
        credit_decay=Float(0.7, 0.0, 1.0, "credit kept from one step to the next"),
        temperature=temperature(),
        fixed=fixed_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], block_length=p["block_length"], plan="threshold",
                      threshold=p["threshold"], credit_weight=p["credit_weight"],
                      credit_decay=p["credit_decay"], temperature=p["temperature"])


@register
class MaskedDiffusion(DiffusionDecoder):
    """The composable sampler with every choice exposed (score, plan, exit, token sampling).

    With plan ``ascending`` and ``steps`` 0 the step count is the geometric one, as in ``ass``.

    For experiments beyond the named recipes: e.g. Dream's schedule with LLaDA's Gumbel
    sampling, a margin-ranked threshold, or PC-Sampler's weight on top of Fast-dLLM.
    """

    name = "masked_diffusion"
    description = "The composable masked-diffusion sampler with every choice as a knob"
    reference = "Composition of LLaDA, Dream, Fast-dLLM, SchED, Prophet, PC-Sampler, CreditDecoding, ASS"
    papers = (
        _LLADA,
        _DREAM,
        _FAST_DLLM,
        _SCHED,
        _PROPHET,
        _PC,
        _CREDIT,
        ASS_PAPER,
    )
    params = Params(
        gen_length=gen_length(), steps=steps(" (unused by plan threshold)"), block_length=block_length(),
        score=Choice("prob", SCORES, "what ranks the masked positions"),
        plan=Choice("even", ("even", "dream", "origin", "ascending", "threshold"),
                    "how many to commit: LLaDA even, Dream 1 - s/t, Dream random origin, ascending "
                    "(ASS: 1, 2, 4, ... per step), threshold"),
        exit=Choice("none", ("none", "sched", "prophet"), "early exit rule (needs a fixed schedule)"),
        token=Choice("gumbel", ("gumbel", "categorical"),
                     "token sampling: LLaDA Gumbel-max in float64, or Dream per-position top-k/top-p"),
        temperature=temperature(),
        top_p=Float(1.0, 0.0, 1.0, "nucleus filter (token=categorical)"),
        top_k=Int(0, 0, 1000, "top-k filter (token=categorical; 0 = off)"),
        alg_temp=Float(0.0, 0.0, 5.0, "> 0 draws positions from softmax(score / alg_temp)"),
        threshold=Float(0.9, 0.0, 1.0, "plan threshold: commit scores above this"),
        growth=Float(2.0, 1.0, 4.0, "plan ascending: each step commits about this many times the previous one"),
        cfg_scale=cfg_scale(), eos_penalty=eos_penalty(),
        position_decay=Float(0.0, 0.0, 2.0, "PC-Sampler position weight exp(-decay * position)"),
        calibrate=Bool(False, "PC-Sampler calibration by -log token prior"),
        credit_weight=Float(0.0, 0.0, 5.0, "CreditDecoding fusion weight (0 = off)"),
        credit_decay=Float(0.7, 0.0, 1.0, "CreditDecoding credit decay"),
        fixed=fixed_param(),
    )

    def recipe(self, p: dict[str, Any]) -> Recipe:
        return Recipe(gen_length=p["gen_length"], steps=p["steps"], block_length=p["block_length"],
                      score=p["score"], plan=p["plan"], exit=p["exit"], token=p["token"],
                      temperature=p["temperature"], top_p=p["top_p"], top_k=p["top_k"],
                      alg_temp=p["alg_temp"], threshold=p["threshold"], growth=p["growth"],
                      cfg_scale=p["cfg_scale"],
                      eos_penalty=p["eos_penalty"], position_decay=p["position_decay"],
                      calibrate=p["calibrate"], credit_weight=p["credit_weight"],
                      credit_decay=p["credit_decay"])
