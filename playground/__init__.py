"""Decoder Playground: decoding strategies side by side, with the evidence behind each step.

The Python API mirrors the command line::

    import playground
    trace = playground.generate(model="tiny-shakespeare", decoder="top_p", prompt="ROMEO:", p=0.9)
"""

from __future__ import annotations

from playground.core.errors import PlaygroundError

__version__ = "0.1.0"

# The forwarders import the API inside the call: importing the core (``playground.core``, all that
# decoders and visualizers import) runs this file, and the API pulls in torch, the engine and every
# decoder. Only the core is imported here at module level (tests/test_import_graph.py).


def generate(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Run one decoder; see :func:`playground.api.generate`."""
    from playground.api import generate as _generate

    return _generate(*args, **kwargs)


def compare(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Run a preset's lanes; see :func:`playground.api.compare`."""
    from playground.api import compare as _compare

    return _compare(*args, **kwargs)


def attribute(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Attribute a step's token to its context; see :func:`playground.attribution.attribute`."""
    from playground.attribution import attribute as _attribute

    return _attribute(*args, **kwargs)


__all__ = ["PlaygroundError", "attribute", "compare", "generate", "__version__"]
