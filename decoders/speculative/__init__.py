"""Family ``speculative``: draft-then-verify decoders (draft model, token trees, n-gram and
prompt lookup, token recycling, Jacobi, lookahead, layer-skip self-speculation, mask-token
probing) with pluggable acceptance rules. Shared mechanics (the draft tree and its
verification) live in ``decoders/draft_tree.py``."""

from __future__ import annotations

from decoders.base import declare_family


declare_family(
    "speculative", "Speculative and parallel decoding",
    order=40, force_mode="view",
    primer="""\
Speculative decoders draft several tokens cheaply and let the target verify them all in one
forward, so each **draft step** commits one or more tokens per target forward. **Plots:** the
*Draft tree* of a step (each drafted token with its draft probability q and target probability
p, the accepted path in green, the correction or bonus token that ends it) and, over the run,
*Accepted length* and *Acceptance over time*; at a rejection the *Correction distribution*
max(0, p - q) appears, and *Acceptance by rule* puts every acceptance rule's probability for
each verified token side by side. With the default `strict` rule every decoder here is **lossless**: it
returns `greedy`'s text at temperature 0 and the target's distribution at temperature 1, just in
fewer target forwards. Corrections only appear when both models sample (temperature > 0).

**Which one:** `speculative` with a small draft model (the classic); `spec_tree` drafts a tree
and verifies all of it in one pass; `prompt_lookup`, `ngram_adaptive` and `token_recycling`
need no draft model (they copy from the prompt, an n-gram table or past candidates, so they
shine on repetitive text); `layer_skip` drafts with the target's own first layers; `mask_probe`
with mask-token probes; `jacobi` and `lookahead` iterate a window of guesses (greedy only); `bandit_spec` learns the
draft length as it goes (UCB or EXP3); `nest` drafts spans retrieved from a passage datastore
(a kNN-LM mixture, relaxed acceptance, each copied token attributed to its source);
`spec_contrastive` is `contrastive` at speculative speed
(it verifies against the contrast, so it is exact for `contrastive`, not for the target).

**Knobs that matter:** `gamma` (tokens drafted per step: too few wastes the verification, too
many wastes drafts), `temperature`, and `accept` (the lossy rules raise acceptance and say how
many tokens they changed). Races default to equal target forwards, where drafting is free: read
the wall-time and cost axes too.""",
)
