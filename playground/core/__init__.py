"""The core: what decoders and visualizers may import from the app.

``errors`` (the one-line :class:`PlaygroundError`), ``trace`` (the trace schema and the one
definition of each figure drawn from it), ``settings`` (limits and defaults read from the
environment) and ``models`` (the model handle, its counting views, loading). The core imports
nothing from the layers above it (the engine, the runner, the page).
"""
