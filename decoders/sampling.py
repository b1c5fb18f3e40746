"""Family ``sampling``: greedy decoding, ``sample`` with the composable processor chain, and
the convenience presets of that chain (``top_k``, ``top_p``, ``min_p``, ``typical``,
``epsilon``, ``eta``, ``xtc``, ``mirostat``).

Every sampler draws with the run's common random numbers (see :func:`decoders.ar.draw`).
By default (``coupling=gumbel``) the token at position ``pos`` is ``argmax(logits + g)``
over the tokens the chain kept, with Gumbel noise ``g`` fixed per (seed, position, token):
two lanes run with the same seed draw the same token whenever the narrower one kept the
token the wider one drew, so wherever a truncation rule changes the text it is because it
cut the drawn token. ``coupling=inverse_cdf`` draws by inverse CDF on one shared uniform
per position instead (the same *rank* under similar distributions, but a filter that
renormalises the mass moves the draw even when it kept the token).
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterator

import torch

from decoders.ar import COUPLINGS, Picker, draw, greedy_probs, token_loop
from decoders.base import Choice, Context, Decoder, Float, Int, Param, Params, declare_family, lens_param, register
from decoders.citation import Paper, arxiv
from decoders.constraint import constraint_params
from decoders.processors import (EMPTIED_NOTE, Chain, ChainParams, History, active_items, build_chain,
                                 chain_defaults, chain_params, check_chain)
from playground.core.trace import Step

# sources cited by more than one decoder here, named once so they cannot drift apart
_HOLTZMAN = arxiv("Holtzman et al. 2020, The Curious Case of Neural Text Degeneration (ICLR)", "1904.09751")
_HEWITT = arxiv("Hewitt et al. 2022, Truncation Sampling as Language Model Desmoothing "
                "(Findings of EMNLP)", "2210.15191")


declare_family(
    "sampling", "Sampling: one composable processor chain",
    order=10, force_mode="loop",
    primer="""\
Each step is one target forward: the model gives a next-token distribution, a chain of rules
reshapes it, and one token is drawn. **Plots:** *Distribution* (the top-K tokens, the model's raw
probability beside the final one after the chain, the chosen token and its rank) and, over the
run, *Entropy and probability*. Lanes share their random numbers (`coupling=gumbel`), so a
filtered lane differs from `sample` only where its rule cut the token `sample` drew: race them
side by side and the first divergence shows exactly what the rule did.

**Which one:** `greedy` is the deterministic baseline and the reference every lossless
speculative decoder must reproduce. `top_p` and `min_p` are everyday sampling (min-p scales its
cut with the top token's probability: it keeps many tokens when the model is unsure and few when
it is sure). `typical`, `epsilon` and `eta` are other truncation rules on the same draws;
`mirostat` holds the surprise near a target; `xtc` removes the most likely choices to force
variety; `sample` composes any of them in any `order`.

**Knobs that matter:** `temperature` (0 = greedy), one truncation knob at a time (`top_k`,
`top_p`, `min_p`), the repetition controls (`repetition_penalty`, DRY) and `logit_lens`.""",
)


@register
class Greedy(Decoder):
    """Greedy decoding: always the most probable next token (argmax, lowest id on ties)."""

    name = "greedy"
    family = "sampling"
    kind = "causal"
    params = Params(logit_lens=lens_param(), **constraint_params(healing=True))
    reference = "Argmax decoding (the temperature-0 limit of sampling)"
    papers = (
        Paper("Greedy (argmax) decoding, the temperature-0 limit of sampling; see transformers' generation "
              "strategies",
              "https://huggingface.co/docs/transformers/generation_strategies"),
    )
    lossless = True

    def run(self, ctx: Context) -> Iterator[Step]:
        yield from token_loop(ctx, lambda logits, pos, out: greedy_probs(logits), self)


def coupling_param() -> Choice:
    """The ``coupling`` knob: how a lane's draw shares randomness with other lanes."""
    return Choice("gumbel", COUPLINGS,
                  "common random numbers: gumbel (a lane draws what an unfiltered lane drew whenever "
                  "its rules kept that token) or inverse_cdf (one shared uniform per position)")


def chain_picker(ctx: Context, chain: Chain, stages_out: list[list[dict[str, Any]]],
                 coupling: str | None = None) -> Picker:
    """A ``token_loop`` picker that runs ``chain`` and draws with the run's common random
    numbers at position ``pos`` (``coupling``: ``gumbel`` or ``inverse_cdf``; default: the
    ``coupling`` knob in ``ctx.params``, else ``gumbel``).

    The per-stage evidence of the latest step is left in ``stages_out[0]``.
    """
    prompt = list(ctx.prompt_ids)
    how = coupling or str(ctx.params.get("coupling", "gumbel"))

    def pick(logits: torch.Tensor, pos: int, out: list[int]) -> tuple[torch.Tensor, int]:
        h = History(ids=prompt + out, prompt_len=len(prompt), pos=pos, uniform=ctx.uniform)
        stages: list[dict[str, Any]] = []
        # the draw's own noise, so each stage's evidence says where it would put the draw
        noise = ctx.gumbel(pos, logits.numel()) if how == "gumbel" else None
        processed = chain(logits, h, stages, noise)
        final = torch.softmax(processed, -1)
        tok = draw(ctx, pos, final, processed, how)
        chain.observe(tok, final)
        stages_out[0] = stages
        return final, tok

    return pick


def add_chain_evidence(step: Step, stages: list[dict[str, Any]]) -> Step:
    """``step`` with the chain's ``stages`` in its ``chain`` evidence, after the constraint's
    (token_loop's, which act before the chain), and a ``dist`` note naming the rules that
    removed every token."""
    step.evidence["chain"] = step.evidence.get("chain", []) + stages
    emptied = [st["stage"] for st in stages if st.get("emptied")]
    if emptied:
        step.evidence["dist"]["note"] = f"{', '.join(emptied)} {EMPTIED_NOTE}"
    return step


class ChainDecoder(Decoder):
    """A causal sampler defined by a processor chain built from chain knobs."""

    family = "sampling"
    kind = "causal"

    def chain_knobs(self, params: dict[str, Any]) -> dict[str, Any]:
        """The full set of chain knobs these decoder knobs stand for."""
        return {**chain_defaults(), **params}

    def run(self, ctx: Context) -> Iterator[Step]:
        knobs = self.chain_knobs(ctx.params)
        chain = build_chain(knobs, ctx.target.tokenizer, ctx.target.vocab_size)
        self.extra_stats["chain"] = chain.labels
        stages: list[list[dict[str, Any]]] = [[]]
        for step in token_loop(ctx, chain_picker(ctx, chain, stages), self):
            yield add_chain_evidence(step, stages[0])

    def is_lossy(self, params: dict[str, Any]) -> bool:
        return bool(active_items(self.chain_knobs(params)))


@register
class Sample(ChainDecoder):
    """Ancestral sampling through one composable, user-ordered logits-processor chain.

    Implements: penalties (repetition as CTRL/transformers over the context; presence and
    frequency as OpenAI over generated tokens), DRY, no-repeat-n-gram, top-nσ, top-k,
    locally typical, top-p, min-p, ε, η, XTC, temperature (0 = greedy) and mirostat v2;
    each rule is active only when its knob is not neutral, and they run in ``order``
    (llama.cpp's default: penalties first, temperature last). If a rule would leave no
    token, the most probable live one stays and the step's evidence says so. The token is
    drawn with the run's common random numbers: by default Gumbel-max with noise fixed per
    (seed, position, token), so a lane with extra truncation rules draws the same token as
    this one whenever its rules kept it; ``coupling=inverse_cdf`` uses one shared uniform
    per position instead. Simplifies: rules act on one sequence (no batching); see each
    processor's docstring.
    """

    name = "sample"
    params = ChainParams(**chain_params(), coupling=coupling_param(), logit_lens=lens_param(),
                         **constraint_params(healing=True))
    reference = "Ancestral sampling; processor chain after llama.cpp's sampler chain (see each rule)"
    papers = (
        _HOLTZMAN,
        Paper("llama.cpp's sampler chain (the order and the rules of the processor chain)",
              "https://github.com/ggml-org/llama.cpp"),
    )
    description = "Sample through a user-ordered chain: penalties, DRY, top-k/p, min-p, typical, ε, η, top-nσ, XTC, mirostat"


class PresetParams(Params):
    """A preset's knobs; validation maps them onto the chain and checks it."""

    def __init__(self, mapping: dict[str, str], **specs: Param) -> None:
        super().__init__(**specs)
        self.mapping = mapping

    def validate(self, decoder: str, given: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(decoder, given)
        check_chain(decoder, {self.mapping.get(k, k): v for k, v in out.items()})
        return out


class Preset(ChainDecoder):
    """A named preset of the ``sample`` chain: its own knobs map onto chain knobs."""

    mapping: ClassVar[dict[str, str]] = {}
    fixed: ClassVar[dict[str, Any]] = {}

    def chain_knobs(self, params: dict[str, Any]) -> dict[str, Any]:
        mapped = {self.mapping.get(k, k): v for k, v in params.items()}
        return {**chain_defaults(), **self.fixed, **mapped}


def _temperature() -> Float:
    return Float(1.0, 0.0, 10.0, "divide logits by this (applied after the filter); 0 = greedy")


def _preset(name: str, mapping: dict[str, str], specs: dict[str, Param], reference: str,
            description: str, doc: str, fixed: dict[str, Any] | None = None,
            papers: tuple[Paper, ...] = ()) -> type[Preset]:
    cls = type(name.title().replace("_", ""), (Preset,), {
        "name": name, "mapping": mapping, "fixed": dict(fixed or {}),
        "params": PresetParams(mapping, **specs, temperature=_temperature(), coupling=coupling_param(),
                               logit_lens=lens_param(), **constraint_params(healing=True)),
        "reference": reference, "papers": tuple(papers), "description": description, "__doc__": doc,
        "__module__": __name__,
    })
    return register(cls)


TopK = _preset(
    "top_k", {"k": "top_k"}, {"k": Int(50, 1, 1_000_000, "keep the k most probable tokens")},
    "Fan et al. 2018, Hierarchical Neural Story Generation",
    "Sample from the k most probable tokens",
    """Top-k sampling: keep the k most probable tokens, then temperature, then draw.

    A preset of the ``sample`` chain (top_k then temperature). Ties with the k-th token
    are kept, as in transformers.""",
    papers=(arxiv("Fan et al. 2018, Hierarchical Neural Story Generation (ACL)", "1805.04833"),))

TopP = _preset(
    "top_p", {"p": "top_p"}, {"p": Float(0.9, 0.0, 1.0, "keep the smallest set with this much mass")},
    "Holtzman et al. 2020, The Curious Case of Neural Text Degeneration",
    "Nucleus sampling: the smallest top set holding p of the mass",
    """Nucleus (top-p) sampling: keep the smallest set of top tokens whose mass reaches p.

    A preset of the ``sample`` chain (top_p then temperature, llama.cpp's order; transformers
    applies temperature first).""",
    papers=(_HOLTZMAN,))

MinP = _preset(
    "min_p", {"p": "min_p"}, {"p": Float(0.1, 0.0, 1.0, "keep tokens with p >= this times p(top)")},
    "Nguyen et al. 2024, Turning Up the Heat: Min-p Sampling for Creative and Coherent LLM Outputs",
    "Keep tokens at least p times as probable as the top one",
    """Min-p sampling: keep tokens whose probability is at least p times the top token's.

    A preset of the ``sample`` chain (min_p then temperature, as the paper recommends).""",
    papers=(
        arxiv("Nguyen et al. 2024, Turning Up the Heat: Min-p Sampling for Creative and "
              "Coherent LLM Outputs (ICLR 2025)", "2407.01082"),
    ))

Typical = _preset(
    "typical", {"p": "typical_p"}, {"p": Float(0.9, 0.0, 1.0, "mass of the most typical tokens to keep")},
    "Meister et al. 2023, Locally Typical Sampling (TACL)",
    "Keep the tokens whose surprisal is closest to the entropy",
    """Locally typical sampling: keep the tokens whose surprisal is closest to the
    distribution's entropy, up to mass p. A preset of the ``sample`` chain.""",
    papers=(arxiv("Meister et al. 2023, Locally Typical Sampling (TACL)", "2202.00666"),))

Epsilon = _preset(
    "epsilon", {"epsilon": "epsilon"}, {"epsilon": Float(3e-4, 0.0, 1.0, "drop tokens below this probability")},
    "Hewitt et al. 2022, Truncation Sampling as Language Model Desmoothing",
    "Drop tokens below a fixed probability epsilon",
    """Epsilon sampling: drop every token whose probability is below epsilon (the top one
    always stays). A preset of the ``sample`` chain.""",
    papers=(_HEWITT,))

Eta = _preset(
    "eta", {"eta": "eta"}, {"eta": Float(2e-3, 0.0, 1.0, "epsilon of the entropy-dependent cut-off")},
    "Hewitt et al. 2022, Truncation Sampling as Language Model Desmoothing",
    "Drop tokens below min(eta, sqrt(eta)·e^-H)",
    """Eta sampling: drop tokens below min(eta, sqrt(eta) * exp(-entropy)), a cut-off that
    loosens when the distribution is flat. A preset of the ``sample`` chain.""",
    papers=(_HEWITT,))

XTC = _preset(
    "xtc", {"threshold": "xtc_threshold", "probability": "xtc_probability"},
    {"threshold": Float(0.1, 0.0, 0.5, "tokens at or above this probability are top choices"),
     "probability": Float(0.5, 0.0, 1.0, "chance per step of excluding the top choices")},
    "p-e-w 2024, Exclude Top Choices (XTC), text-generation-webui #6335",
    "Sometimes remove every top choice but the least probable one",
    """XTC (exclude top choices): with the given probability per step (coin = common random
    number ``uniform(pos, "xtc")``), remove all tokens at or above the threshold except the
    least probable of them. A preset of the ``sample`` chain.""",
    papers=(
        Paper("p-e-w 2024, Exclude Top Choices (XTC), text-generation-webui pull request #6335",
              "https://github.com/oobabooga/text-generation-webui/pull/6335"),
    ))

Mirostat = _preset(
    "mirostat", {"tau": "mirostat_tau", "eta": "mirostat_eta"},
    {"tau": Float(5.0, 0.01, 20.0, "target surprise (bits per token)"),
     "eta": Float(0.1, 0.0, 1.0, "learning rate of mu")},
    "Basu et al. 2021, Mirostat: A Neural Text Decoding Algorithm that Directly Controls Perplexity",
    "Mirostat v2: adapt a surprise cut-off so perplexity stays near tau",
    """Mirostat 2.0: truncate tokens whose surprise exceeds mu, draw, and move mu towards
    the target surprise tau. A preset of the ``sample`` chain (temperature, then mirostat,
    as in llama.cpp).""",
    papers=(
        arxiv("Basu et al. 2021, Mirostat: A Neural Text Decoding Algorithm that Directly "
              "Controls Perplexity (ICLR)", "2007.14966"),
    ))
