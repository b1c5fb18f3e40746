"""Adding a plot is one module: a module that registers a plot with ``@step_plot`` (and one with
``@run_plot``) is all the app needs to draw it for steps of its kind.

The module is written to a temporary folder and imported, as a new visualizer module would be;
nothing outside it names the plots. The fixture unregisters them and forgets the module
afterwards, so other tests see the built-in plots only.
"""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

import visualizers as V

MODULE = "extra_steps_plot"
STEP_TITLE, RUN_TITLE = "Steps so far", "Tokens per step"
SOURCE = f'''
"""A new visualizer module: the number of steps up to the chosen one, and tokens per step."""

import plotly.graph_objects as go

from visualizers.registry import run_plot, step_plot


@step_plot("token", {STEP_TITLE!r}, order=15)
def steps_so_far_figure(trace, step):
    """One bar: how many steps the run took up to and including ``step``."""
    return go.Figure(go.Bar(x=["steps"], y=[step + 1]))


@run_plot({RUN_TITLE!r}, kind="token")
def tokens_per_step_figure(trace):
    """The number of tokens each step committed."""
    return go.Figure(go.Scatter(y=[len(s.get("committed", [])) for s in trace["steps"]]))
'''


@contextmanager
def imported_module(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Write the module into ``folder`` and import it; unregister its plots and forget it after."""
    (folder / f"{MODULE}.py").write_text(SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module(MODULE)
    try:
        yield module
    finally:
        V.unregister(module.steps_so_far_figure)
        V.unregister(module.tokens_per_step_figure)
        sys.modules.pop(MODULE, None)


@pytest.fixture()
def plot_module(tmp_path, monkeypatch) -> Iterator[Any]:
    with imported_module(tmp_path, monkeypatch) as module:
        yield module


@pytest.fixture(scope="module")
def greedy_trace(llama_handle) -> dict[str, Any]:
    """A real greedy run: token steps carrying only the distribution."""
    from playground.engine import prepare

    return prepare(model=llama_handle, decoder="greedy", prompt="hello there", max_new_tokens=4).finish().to_dict()


def _titles(plots: list[tuple[str, Any]]) -> list[str]:
    return [title for title, _ in plots]


def test_the_module_s_plot_is_drawn_for_every_step_of_its_kind(plot_module, greedy_trace):
    for i in range(V.step_count(greedy_trace)):
        plots = dict(V.step_figures(greedy_trace, i))
        assert list(plots) == ["Distribution", STEP_TITLE]  # order=15: after the distribution (10)
        assert list(plots[STEP_TITLE].data[0].y) == [i + 1]  # drawn by the module's function
    runs = dict(V.run_figures(greedy_trace))
    assert list(runs) == ["Entropy and probability", RUN_TITLE]  # no order: after the built-in ones
    assert list(runs[RUN_TITLE].data[0].y) == [len(s["committed"]) for s in greedy_trace["steps"]]


def test_its_order_places_it_among_the_built_in_plots(plot_module):
    step = {"i": 0, "kind": "token", "committed": [5], "contrast": {"top_ids": [5]}}
    assert _titles(V.step_figures({"steps": [step]}, 0)) == ["Distribution", STEP_TITLE, "Paired distributions"]
    assert [t for t, _fn, _need in V.STEP_PLOTS["token"]][:3] == ["Distribution", STEP_TITLE, "Paired distributions"]


def test_it_is_drawn_only_for_steps_of_its_kind(plot_module):
    for kind in ("draft", "denoise", "beam", "jacobi"):
        trace = {"steps": [{"i": 0, "kind": kind}]}
        assert STEP_TITLE not in _titles(V.step_figures(trace, 0))
        assert RUN_TITLE not in _titles(V.run_figures(trace))


def test_the_page_has_a_slot_for_it(plot_module, greedy_trace):
    from playground.ui.layout import RUN_SLOTS, STEP_SLOTS

    # the page's slots come from the registry's bounds, and every step's plots fit them
    assert STEP_SLOTS >= V.MAX_STEP_PLOTS and RUN_SLOTS >= V.MAX_RUN_PLOTS
    assert all(len(V.step_figures(greedy_trace, i)) <= STEP_SLOTS for i in range(V.step_count(greedy_trace)))
    crowded = {"i": 0, "kind": "token", "committed": [5],
               **{field: {"x": 1} for field in ("contrast", "dola", "candidates", "lens", "constraint")}}
    titles = _titles(V.step_figures({"steps": [crowded]}, 0))
    assert len(titles) == V.MAX_STEP_PLOTS <= STEP_SLOTS and STEP_TITLE in titles


def test_it_is_gone_after_cleanup(greedy_trace, tmp_path, monkeypatch):
    before = {k: list(v) for k, v in V.STEP_PLOTS.items()}, {k: list(v) for k, v in V.RUN_PLOTS.items()}
    with imported_module(tmp_path, monkeypatch):
        assert STEP_TITLE in _titles(V.step_figures(greedy_trace, 0))
    assert _titles(V.step_figures(greedy_trace, 0)) == ["Distribution"]
    assert _titles(V.run_figures(greedy_trace)) == ["Entropy and probability"]
    assert ({k: list(v) for k, v in V.STEP_PLOTS.items()}, {k: list(v) for k, v in V.RUN_PLOTS.items()}) == before
    assert MODULE not in sys.modules


@pytest.mark.parametrize("kinds, want", [
    (["draft", "denoise"], "unmask_step"), (["denoise", "draft"], "unmask_step"), (["jacobi", "denoise"], "unmask_step"),
    (["draft", "jacobi"], "acceptance"), (["token", "draft"], "acceptance"), (["beam", "token"], "probability"),
])
def test_auto_colouring_of_mixed_kinds_does_not_depend_on_registration_order(kinds, want):
    # the most specific colouring the trace's kinds suit wins, whichever plot registered first
    trace = {"steps": [{"i": i, "kind": k} for i, k in enumerate(kinds)]}
    assert V.auto_metric(trace) == want
    reordered = dict(reversed(list(V.KIND_METRICS.items())))
    saved = dict(V.KIND_METRICS)
    try:
        V.KIND_METRICS.clear()
        V.KIND_METRICS.update(reordered)
        assert V.auto_metric(trace) == want
    finally:
        V.KIND_METRICS.clear()
        V.KIND_METRICS.update(saved)
