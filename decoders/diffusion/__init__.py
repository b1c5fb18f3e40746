"""Family ``diffusion``: masked-diffusion LM decoding (LLaDA, Dream, Fast-dLLM, early exit ...).

The shared mechanics live in modules starting with ``_`` (not imported as families):
``_canvas`` (the canvas layout, the divisibility rules, step evidence, output trimming) and
``_sampler`` (the one composable sampler: pluggable score, plan, blocks and token sampling).
The named decoders, each a recipe of those choices, are in ``named`` and ``freedave``.
"""

from __future__ import annotations

from decoders.base import declare_family


declare_family(
    "diffusion", "Diffusion LM decoding",
    order=50, force_mode=None, force_refusal="a diffusion decoder fills its canvas in no fixed order",
    primer="""\
A masked-diffusion LM writes on a **canvas** of mask tokens and fills it in over denoising
steps, several positions per step and in any order; each **denoise step** is one forward over
the whole canvas. **Plots:** the *Canvas* at a step (committed tokens, positions unmasked at
this step highlighted, still-masked ones greyed), *Per-position metrics* (confidence, entropy,
margin), and over the run the *Unmasking heatmap* (position x step: read the order the model
chose), *Commits per step* (the parallelism) and confidence over steps. These decoders run on
the bundled `tiny-shakespeare-diffusion` model, on LLaDA and Dream (remote code) and on plain
masked LMs.

**Which one:** `llada` (the reference sampler: a fixed number of commits per step, most
confident first) and `dream` (its own schedule and token sampling); `fast_dllm` commits every
position above a confidence threshold (many per step when the model is sure); `sched` and
`prophet` stop refining early once the whole span, or the top-2 gap, is confident;
`pc_sampler` reweights positions to avoid committing trivial tokens first; `credit` carries
confidence across steps; `freedave` is lossless: the same text as one-token-per-step decoding
in fewer forwards; `masked_diffusion` exposes every choice as a knob. Plans that decide
with more than one step's scores, each with its own plots: `ete` also commits a few of the
most uncertain positions to set off cascades of confident ones (bits per round);
`r2_dllm` commits confident windows and proposals that stayed stable; `localleap` lets
confident anchors pull their neighbours in at a lower threshold; `adablock` ends each
block at a confident predicted delimiter; `ccd` commits only positions whose argmax held
for the last few steps (read it on the unmasking heatmap); `ass` commits 1, 2, 4, ...
positions per step.
`apd` takes a small causal model in the draft slot as a helper: the dLLM proposes a run of
tokens, and the prefix on which the helper's mixture agrees commits in one pass. `dingo`
constrains the canvas to a regular expression: every step, the most probable regex-valid
canvas by dynamic programming over positions x automaton states (the *DP lattice*).

**Knobs that matter:** `gen_length` (canvas size), `steps` (fewer steps = more tokens per
step), `block_length` (semi-autoregressive blocks), `threshold` for the threshold plans and
`temperature`.""",
)
