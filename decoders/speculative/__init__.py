"""Family ``speculative``: draft-then-verify decoders (draft model, token trees, n-gram and
prompt lookup, token recycling, Jacobi, lookahead, layer-skip self-speculation, mask-token
probing) with pluggable acceptance rules. Shared mechanics live in ``_verify.py``."""
