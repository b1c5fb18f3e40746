"""Family ``guided``: decoding under constraints (regex, JSON schema, grammars, banned and forced
words, token healing), watermarks and reward-guided sequential Monte Carlo.

Submodules are discovered by ``decoders/__init__.py`` like any family module; helpers whose
name starts with ``_`` (the shared constraint stage) are imported by the decoders that use them.
"""
