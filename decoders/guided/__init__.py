"""Family ``guided``: decoding under constraints (regex, JSON schema, grammars, banned and forced
words, token healing), watermarks and reward-guided sequential Monte Carlo.

Submodules are discovered by ``decoders/__init__.py`` like any family module; helpers whose
name starts with ``_`` (the shared constraint stage) are imported by the decoders that use them.
"""

from __future__ import annotations

from decoders.base import declare_family


declare_family(
    "guided", "Guided decoding",
    order=60, force_mode=None,
    primer="""\
Guided decoders change what may be written, not how the model scores it. **Plots:** the
*Constraint* view of a step (allowed tokens, the probability mass the constraint removed, the
top allowed and blocked tokens) and *Constraint over the run*; a watermarked lane colours each
token green or red and plots its *Watermark z-score*; SMC shows its *Particles* (weights,
ancestry, resampling) and the *Effective sample size*. Any token-step or speculative decoder
also takes the constraint knobs (`regex`, `json_schema`, `grammar`): see
[Constraint knobs](#constraint-knobs).

**Which one:** a constraint knob on any decoder for structured output (it masks token by token,
which can distort the distribution); `smc` to sample from the model *conditioned* on a
constraint or potential, reweighting particles instead of masking greedily;
`constrained_beam` when the output must contain given words; `deal` to steer a beam search by a
reward (keywords, length, a regex) read on a short lookahead of each candidate; `watermark` to
mark text so that a detector with the key recognises it.

**Knobs that matter:** the constraint itself, `num_particles` and `ess_threshold` for SMC,
`watermark_gamma` and `watermark_delta` (detectability vs quality).""",
)
