"""Family ``collab``: a small and a large model (or a diffusion and a causal model) writing one
output together — entropy-adaptive hand-over, speculative cascades, diffusion drafts."""

from __future__ import annotations

from decoders.base import declare_family


declare_family(
    "collab", "Collaboration: a small and a large model (or a diffusion and a causal one) together",
    order=70, force_mode=None,
    primer="""\
Two models share the work: a small one writes where it can and a large one where it must, or a
diffusion model drafts for a causal one. **Plots:** the *Draft tree* for the decoders that
verify drafts (with the *Diffusion draft canvas* of `diffuspec`: its block after each
denoising forward), and for `ead` the distribution of each step with *Who wrote each token*
over the run (the small model's entropy against the threshold). Both models' forwards are
counted.

**Which one:** `diffuspec` (a masked-diffusion draft, verified losslessly); `spec_cascade`
(speculative cascades: a deferral rule lets the small model's token stand when the large one
would not do much better; lossy by design); `ead` (switch to the large model while the small
one's entropy is high).

**Knobs that matter:** `gamma`, the deferral `rule` and `alpha`, `entropy_threshold`.""",
)
