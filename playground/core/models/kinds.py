"""What kind of model a config describes (``causal`` or ``diffusion``) and diffusion metadata."""

from __future__ import annotations

from typing import Any

KINDS = ("causal", "diffusion")
LLADA_MASK_ID = 126336
# model types whose weights need the repository's own code (trust_remote_code)
REMOTE_CODE_TYPES = ("llada", "dream")


def detect_kind(config: Any) -> str:
    """``causal`` or ``diffusion`` from a config (explicit ``playground_kind`` wins)."""
    explicit = getattr(config, "playground_kind", None)
    if explicit in KINDS:
        return explicit
    mtype = (getattr(config, "model_type", "") or "").lower()
    archs = " ".join(getattr(config, "architectures", None) or []).lower()
    if any(t in mtype or t in archs for t in REMOTE_CODE_TYPES):
        return "diffusion"
    if "maskedlm" in archs or mtype in ("bert", "roberta", "modernbert", "distilbert", "xlm-roberta", "electra", "deberta-v2"):
        return "diffusion"
    return "causal"


def diffusion_meta(config: Any, tokenizer: Any) -> tuple[int | None, bool]:
    """Mask token id and logit shift of a diffusion model, from its config and tokenizer.

    LLaDA uses the fixed id 126336; Dream names its id in the config and predicts position
    ``i`` at index ``i - 1`` (shifted logits, adapted from an AR model); plain masked LMs
    (BERT, RoBERTa, ModernBERT, the bundled model) use the tokenizer's mask token.
    """
    mtype = (getattr(config, "model_type", "") or "").lower()
    mask_id = getattr(tokenizer, "mask_token_id", None)
    shifted = False
    if "llada" in mtype:
        mask_id = LLADA_MASK_ID
    if "dream" in mtype:
        shifted = True
        cfg_id = getattr(config, "mask_token_id", None)
        mask_id = cfg_id if cfg_id is not None else mask_id
    return mask_id, shifted
