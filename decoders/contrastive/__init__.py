"""Family ``contrastive``: decoders that pick a token by contrasting two views of the next
token - the candidate against its context (contrastive search), an expert model against an
amateur (contrastive decoding), a conditional pass against an unconditional one
(classifier-free guidance), the final layer against a premature one (DoLa).

One module per decoder; the shared evidence and helpers are in ``_common``.
"""

from __future__ import annotations

from decoders.base import declare_family


declare_family(
    "contrastive", "Contrastive",
    shows="; plus the paired distributions behind the contrast (`contrast`: which tokens it moved), the candidate table of contrastive search, DoLa's per-layer divergence and look-back's KL alarm with its candidates",
    order=30, force_mode="loop",
    primer="""\
Contrastive decoders score each token by how a second opinion moves it: a smaller *amateur*
model, an earlier layer, the prompt without its context, a negative prompt, or an n-gram model
of the text so far. A step is a token step and records both distributions. **Plots:**
*Paired distributions* (the model's own top tokens beside the contrasted ones, with the tokens
the contrast moved), *Layer divergence* for DoLa, *Candidates* for contrastive search, and the
chosen token's rank over the run. Second passes and amateur forwards are counted, so a race at
equal target forwards shows what the contrast costs.

**Which one:** `contrastive_search` against degenerate repetition with one model;
`contrastive` with a small amateur in the draft slot; `dola` for factual recall (final vs an
early layer); `cfg` to stay on the prompt's topic or away from a negative prompt; `cad` when the
prompt holds a context the answer must use; `fsd` and `lookback` as cheap anti-repetition.

**Knobs that matter:** the contrast strength (`alpha`, `beta`, `guidance_scale`), the
plausibility cut that keeps the contrast from promoting nonsense, and `temperature`.""",
)
