"""Family ``diffusion``: masked-diffusion LM decoding (LLaDA, Dream, Fast-dLLM, early exit ...).

The shared mechanics live in modules starting with ``_`` (not imported as families):
``_canvas`` (the canvas layout, the divisibility rules, step evidence, output trimming) and
``_sampler`` (the one composable sampler: pluggable score, plan, blocks and token sampling).
The named decoders, each a recipe of those choices, are in ``named`` and ``freedave``.
"""
