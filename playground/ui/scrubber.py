"""The Compare page's step and position scrubbers (:class:`Scrubber`).

Gradio writes a type stub (``scrubber.pyi``) next to the module of any class that subclasses
one of its components, when that class is defined: the class lives alone here so the stub is
small, and ``.gitignore`` keeps the generated file out of the repository.
"""

from __future__ import annotations

import gradio as gr


class Scrubber(gr.Slider):
    """A slider over the steps (or positions) of the run the page shows.

    Its range follows that run, so a value the browser still holds from a longer run can
    arrive past it (a run with fewer steps, a session opened, a branch, a scrub just after
    Run): it means the last step, and is taken as that, never refused with Gradio's "Value 31
    is greater than maximum value 15".
    """

    is_template = True  # drawn by Gradio's own slider (the block name is the parent's)

    def preprocess(self, payload: float | None) -> float | None:
        """The scrubbed value, brought within the present range."""
        if payload is None:
            return None
        lo = self.minimum if self.minimum is not None else payload
        hi = self.maximum if self.maximum is not None else payload
        return super().preprocess(min(max(payload, lo), max(hi, lo)))
