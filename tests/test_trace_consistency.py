"""A trace's counts agree with each other (playground.core.trace.validate_trace_dict): ids are token
ids of the trace's own vocabulary, the output is what the steps committed, stats.new_tokens
and stats.steps count what is there; an import breaking any of these is refused in one line."""

from __future__ import annotations

import copy
import json

import pytest

from playground.core.errors import PlaygroundError
from playground.store import EXPORT_FORMAT, EXPORT_VERSION, Store
from playground.core.trace import Step, Trace, validate_trace_dict


def _trace(n: int = 4) -> dict:
    tr = Trace(model="tiny", decoder="greedy", params={}, seed=0, prompt="ab", prompt_ids=[5, 6])
    for i in range(n):
        s = Step("token", [10 + i], dist={"top_ids": [10 + i], "final_probs": [1.0], "chosen": 10 + i})
        s.i = i
        tr.steps.append(s)
    tr.output_ids = [10 + i for i in range(n)]
    tr.text = "x" * n
    tr.stats = {"new_tokens": n, "target_forwards": n, "finish_reason": "length", "steps": n}
    d = tr.to_dict()
    d["tokens"] = {str(t): f"<{t}>" for t in [5, 6] + tr.output_ids}
    return d


def _bad(**change) -> dict:
    d = copy.deepcopy(_trace())
    for key, value in change.items():
        d[key] = value
    return d


def test_a_recorded_trace_validates():
    validate_trace_dict(_trace())


@pytest.mark.parametrize("d,needle", [
    (_bad(output_ids=[999999, -5]), "-5, which is not a token id"),
    (_bad(output_ids=[10, 11, 12, True]), "True, which is not a token id"),
    (_bad(prompt_ids=[5, 6.0]), "6.0, which is not a token id"),
    (_bad(output_ids=[10, 11, 12, 999999]), "token 999999, which is not in the trace's vocabulary"),
    (_bad(prompt_ids=[5, 7]), "token 7, which is not in the trace's vocabulary"),
    (_bad(output_ids=[10, 11, 13, 12]), "are not the tokens its steps committed"),
    (_bad(output_ids=[10, 11, 12, 13, 13]), "are not the tokens its steps committed"),
])
def test_inconsistent_ids_are_refused_in_one_line(d, needle):
    with pytest.raises(ValueError, match="^[^\n]*$") as e:
        validate_trace_dict(d)
    assert needle in str(e.value)


def test_counts_must_agree_with_the_steps():
    d = _trace()
    d["stats"]["new_tokens"] = 64
    with pytest.raises(ValueError, match="new_tokens is 64, but its output holds 4"):
        validate_trace_dict(d)
    d = _trace()
    d["stats"]["steps"] = 9
    with pytest.raises(ValueError, match="stats.steps is 9, but it has 4 steps"):
        validate_trace_dict(d)
    d = _trace()
    d["steps"][1]["committed"] = [-1]
    with pytest.raises(ValueError, match="step 1: 'committed' holds -1"):
        validate_trace_dict(d)


def test_an_output_cut_at_max_new_tokens_and_a_chosen_output_are_consistent():
    d = _trace()
    d["output_ids"], d["stats"]["new_tokens"] = d["output_ids"][:3], 3  # a draft overshoot, cut
    validate_trace_dict(d)
    d = _trace()
    for s in d["steps"]:  # a search's steps: its output is the hypothesis it chose at the end
        s["kind"], s["committed"] = "beam", []
    d["output_ids"] = [13, 12, 11, 10]
    validate_trace_dict(d)


def test_an_error_trace_and_a_diffusion_canvas_validate():
    from playground.runner import error_trace

    validate_trace_dict(error_trace("boom", decoder="greedy", model="tiny"))
    d = _trace()
    d["steps"] = [{"kind": "denoise", "committed": [], "canvas": [3, 9, 9], "mask_id": 9}]
    d["output_ids"], d["stats"] = [3, 9, 9], {"new_tokens": 1, "masked_positions": 2}
    d["tokens"] = {"3": "a", "9": "<mask>", "5": "", "6": ""}
    validate_trace_dict(d)


def test_an_import_with_impossible_ids_is_refused_in_one_line(tmp_path):
    store = Store(tmp_path / "s.db")
    bad = _bad(output_ids=[999999, -5])
    export = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "title": "t", "created": 0, "model": "tiny",
              "prompt": "ab", "settings": {}, "runs": [bad]}
    with pytest.raises(PlaygroundError) as e:
        store.import_session(json.dumps(export))
    assert "\n" not in str(e.value) and "not a token id" in str(e.value)
    try:
        assert store.count() == 0
        export["runs"] = [_trace()]
        assert store.import_session(json.dumps(export))
    finally:
        store.close()
