"""The token-id bound an imported session is checked against: its model's vocabulary size,
read from a config on this machine, never from the network and never by loading weights.

An import names its model by spec (``tiny-shakespeare``, a path, a hub id). Where that
model's ``config.json`` is on disk (a bundled model; a local directory on an instance that
loads paths; a hub model already in the Hugging Face cache) every token id of the import must
be below its ``vocab_size``. Elsewhere (a hub model not cached, a config without one) the bound
is :data:`GENEROUS_VOCAB`, far above any real vocabulary, so a real export of such a model is
never refused while an id like 10**12 still is. A path is looked at only where this instance
loads path models (and the cache only where it loads cached models), so an import cannot probe
a hosted machine's directories.
"""

from __future__ import annotations

from typing import Any

from playground.core.errors import PlaygroundError
from playground.core.models.sources import local_config, local_dir, resolve
from playground.core.settings import limits

# The largest vocabularies in use are about 262k ids (Gemma 3); 2**24 leaves room for any
# padded or multimodal one while still catching ids no tokenizer hands out.
GENEROUS_VOCAB = 2 ** 24


def offline_vocab_size(spec: Any) -> int | None:
    """The ``vocab_size`` in ``spec``'s config on this machine, or None when it cannot be known
    offline (no such model here, a hub model not cached, a config without it)."""
    if not isinstance(spec, str) or not spec.strip():
        return None
    sources = limits().model_sources
    try:
        source, location = resolve(spec, paths="path" in sources)
    except PlaygroundError:
        return None
    # only where this instance loads models from: what an import names is never probed elsewhere
    config = local_config(local_dir(source, location) if source in sources and source != "hub" else None)
    if config is None:
        return None
    # a multimodal config keeps its text model's sizes under text_config
    for where in (config, config.get("text_config")):
        n = where.get("vocab_size") if isinstance(where, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def vocab_bound(spec: Any) -> tuple[int, bool]:
    """``(bound, known)``: every token id of ``spec`` is below ``bound``; ``known`` says the
    bound is the model's own vocabulary size rather than :data:`GENEROUS_VOCAB`."""
    n = offline_vocab_size(spec)
    return (n, True) if n is not None else (GENEROUS_VOCAB, False)
