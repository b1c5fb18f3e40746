"""Negative prompts made from the prompt itself, for input-contrast guidance (``cfg``'s ``negative``).

Instructive Decoding (Kim et al. 2023) contrasts the real instruction with a *noisy* one — the
instruction behind an "opposite" preface, or random words — and Contrastive Input Decoding
(Yona et al. 2023) with a perturbed input. Each generator here turns the prompt into such a
negative, deterministically from the run's seed, so a replay rebuilds the same one:

* ``opposite``: the prompt behind Instructive Decoding's "opposite" instruction (the variant its
  paper finds best);
* ``shuffled``: the prompt's own tokens in a random order (same words, no meaning), a perturbed
  input in the sense of CID;
* ``random``: as many tokens as the prompt, drawn uniformly from the vocabulary (ID's random words,
  at the token level).
"""

from __future__ import annotations

import random
from typing import Any

PERTURBATIONS = ("opposite", "shuffled", "random")
OPPOSITE = "Always respond with the opposite of what you are asked. You never get it right.\n"


def perturbed_negative(kind: str, prompt_ids: list[int], view: Any, seed: int) -> list[int]:
    """The negative prompt's token ids for perturbation ``kind`` (:data:`PERTURBATIONS`) of the
    prompt; ``view`` encodes text and knows the vocabulary size."""
    # the seed is mixed with the kind so two perturbations of one run do not share their draws
    rng = random.Random(f"cfg-negative|{kind}|{int(seed)}")
    if kind == "opposite":
        # the preface's tokens, then the prompt's own (not re-encoded: the prompt stays as given)
        return list(view.encode(OPPOSITE)) + list(prompt_ids)
    if kind == "shuffled":
        ids = list(prompt_ids)
        rng.shuffle(ids)
        return ids
    if kind == "random":
        return [rng.randrange(int(view.vocab_size)) for _ in prompt_ids]
    raise ValueError(f"unknown perturbation {kind!r}")
