"""What follows the shown comparison runs as one event (playground.ui.events.Fanout).

Each event costs the page a pass over every component's loading status in Gradio's frontend,
so the listeners of the Compare page's ``shown`` state (the Branch, Explain and Notes panels'
lane pickers, the branch's parent, the position scrubber's range, the Watermark tab's lane
picker) are one event; these tests check that the one event does what the separate ones did.
"""

from __future__ import annotations

import gradio as gr
import pytest

from playground.ui.events import Fanout

pytestmark = pytest.mark.slow  # the app tests build the Gradio app (~10 s on a busy CPU)


class Comp:
    """A stand-in component: only its identity matters to a fan-out."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_each_handler_gets_its_own_inputs_and_the_updates_are_merged():
    a, b, c, x, y, z, w = (Comp(n) for n in "abcxyzw")
    fan = Fanout()
    seen = []
    fan.add(lambda va, vb: seen.append(("dict", va, vb)) or {x: va + vb}, [a, b], [x])
    fan.add(lambda vc: seen.append(("value", vc)) or vc * 2, [c], [y])  # a single output's value
    fan.add(lambda vb: gr.update(choices=[vb]), [b], [z])  # a gr.update of a single output
    fan.add(lambda va, vc: [va, vc], [a, c], [w, x])  # a list, in output order; x written again
    assert fan.inputs() == [a, b, c] and fan.outputs() == [x, y, z, w]
    up = fan(1, 10, 100)
    assert seen == [("dict", 1, 10), ("value", 100)]
    assert up[y] == 200 and up[w] == 1 and up[z]["choices"] == [10]
    assert up[x] == 100  # the later handler's update wins


def test_an_empty_dict_changes_nothing_and_adding_after_wiring_is_refused():
    a, x = Comp("a"), Comp("x")
    fan = Fanout()
    fan.add(lambda va: {}, [a], [x])
    assert fan(5) == {}
    wired = []
    fan.wire(lambda fn, ins, outs, **kw: wired.append((fn, ins, outs, kw)), show_progress="hidden")
    assert len(wired) == 1 and wired[0][1] == [a] and wired[0][2] == [x]
    assert wired[0][0](5) is not None  # nothing to change reaches Gradio as a skip, not as {}
    with pytest.raises(RuntimeError):
        fan.add(lambda va: {}, [a], [x])


@pytest.fixture(scope="module")
def page(demo):
    return demo.compare_page


def test_the_shown_comparison_has_one_listener_that_writes_every_panel(demo, page):
    listeners = [d for d in demo.fns.values()
                 if (page.shown._id, "change") in [tuple(t) for t in d.targets]]
    assert len(listeners) == 1
    outs = {o._id for o in listeners[0].outputs}
    wm = demo.watermark_view
    for comp in (page.branch.lane, page.branch.parent, page.branch.parent_btn, page.explain.lane,
                 page.notes.lane, page.position, wm.lane):
        assert comp._id in outs, comp
    # and the session id has no listener of its own: it is only written with a new `shown`
    assert not [d for d in demo.fns.values()
                if (page.sid._id, "change") in [tuple(t) for t in d.targets]]


def test_the_one_event_equals_the_panels_own_handlers(demo, page):
    traces = [{"decoder": "greedy", "prompt": "ROMEO:", "steps": [], "stats": {}}]
    values = {id(page.traces): traces, id(page.step): 0, id(page.sid): None}
    ins = page.on_shown.inputs()
    up = page.on_shown(*[values.get(id(c)) for c in ins])
    want = {**page.branch.on_pick(traces, None, 0), **page.explain.on_pick(traces, None, 0),
            **page.notes.on_pick(None, traces, None, 0), **page.branch.on_sid(None)}
    for comp, update in want.items():
        assert up[comp] == update, comp
    assert up[demo.watermark_view.lane] == demo.watermark_view.on_lanes(traces, None)
