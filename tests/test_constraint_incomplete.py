"""A constrained lane that runs out of tokens before its constraint is complete says so (stats
``constraint_complete`` false, the stats line 'constraint incomplete: ran out of tokens'), and the
``json_close`` knob (decoders/constraint.py) closes a json_schema lane's structure in its last
steps: outputs checked with ``json.loads``, the closing walk and the knob's errors (issue 33)."""

from __future__ import annotations

import json

import pytest

from decoders import all_decoders
from decoders.base import get_decoder
from decoders.constraint import MAX_JSON_CLOSE, Stage
from playground.core.errors import PlaygroundError
from playground.engine import prepare
from visualizers.tokens import stats_line

INCOMPLETE = "constraint incomplete: ran out of tokens"
# an object around an unbounded integer: the number can go on for ever, the object never closes
INT_OBJECT = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
TWO_STRINGS = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "line": {"type": "string"}},
                          "required": ["name", "line"]})


@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare")


@pytest.fixture(scope="module")
def bundled_draft():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare-draft")


def run(handle, decoder, n, seed=0, draft=None, prompt="ROMEO:", **params):
    r = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                draft=draft if get_decoder(decoder).needs_draft else None, params=params)
    return r.finish()


def text_of(handle, tr):
    return handle.tokenizer.decode(tr.output_ids, skip_special_tokens=True)


def is_json(text):
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------- constraint incomplete
def test_unbounded_integer_out_of_budget_is_incomplete(bundled):
    tr = run(bundled, "greedy", 6, json_schema=INT_OBJECT)
    assert tr.stats["finish_reason"] == "length"
    assert tr.stats["constraint_complete"] is False
    assert not is_json(text_of(bundled, tr))
    assert INCOMPLETE in stats_line(tr.to_dict())


def test_regex_without_its_end_is_incomplete(llama_handle):
    # 'x' is allowed by the grammar but biased away: greedy writes digits until the budget ends
    tr = run(llama_handle, "greedy", 5, regex="[0-9]+x", logit_bias=json.dumps({"x": -100}))
    text = text_of(llama_handle, tr)
    assert text.isdigit() and tr.stats["finish_reason"] == "length"
    assert tr.stats["constraint_complete"] is False
    assert INCOMPLETE in stats_line(tr.to_dict())


def test_a_completed_constraint_is_complete_and_a_free_lane_has_no_flag(llama_handle, bundled):
    done = run(llama_handle, "greedy", 12, regex="(yes|no)")
    assert done.stats["constraint_complete"] is True
    assert "incomplete" not in stats_line(done.to_dict())
    closed = run(bundled, "greedy", 16, json_schema=INT_OBJECT, json_close=6)
    assert closed.stats["constraint_complete"] is True and "incomplete" not in stats_line(closed.to_dict())
    free = run(llama_handle, "greedy", 4)
    assert "constraint_complete" not in free.stats and "constraint" not in stats_line(free.to_dict())


# ---------------------------------------------------------------------- json_close
@pytest.mark.parametrize("schema,n,close", [(INT_OBJECT, 16, 6), (TWO_STRINGS, 24, 18), (TWO_STRINGS, 32, 18)])
def test_json_close_ends_with_valid_json_where_the_plain_lane_does_not(bundled, schema, n, close):
    plain = run(bundled, "greedy", n, json_schema=schema)
    assert plain.stats["finish_reason"] == "length" and not is_json(text_of(bundled, plain))
    closed = run(bundled, "greedy", n, json_schema=schema, json_close=close)
    text = text_of(bundled, closed)
    assert is_json(text), text
    assert isinstance(json.loads(text), dict) and len(closed.output_ids) <= n
    assert closed.stats["constraint_complete"] is True
    # before the window the knob changes nothing: both lanes agree token for token
    head = n - close
    assert closed.output_ids[:head] == plain.output_ids[:head]
    window = [s.evidence["constraint"].get("json_close") for s in closed.steps]
    assert all(w is None for w in window[:head])
    assert [w["remaining"] for w in window[head:]] == list(range(close, close - len(window) + head, -1))
    assert all(w["kept"] >= 1 for w in window[head:])


def test_json_close_evidence_and_chain_stage(bundled):
    tr = run(bundled, "sample", 24, json_schema=TWO_STRINGS, json_close=18)
    assert is_json(text_of(bundled, tr)), text_of(bundled, tr)
    last = tr.steps[-1].evidence
    assert last["constraint"]["json_close"]["fits"] is True
    assert any("json_close" in st["stage"] for st in last["chain"])
    first = tr.steps[0].evidence
    assert not any("json_close" in st["stage"] for st in first["chain"])


@pytest.mark.parametrize("decoder", ["sample", "top_k", "speculative", "smc"])
def test_json_close_on_other_constraint_decoders(bundled, bundled_draft, decoder):
    for seed in range(3):
        tr = run(bundled, decoder, 24, seed=seed, draft=bundled_draft, json_schema=TWO_STRINGS, json_close=18)
        text = text_of(bundled, tr)
        assert is_json(text), (seed, text)
        assert tr.stats["constraint_complete"] is True


@pytest.mark.slow
def test_json_close_on_beam_search(bundled):
    plain = run(bundled, "beam", 24, json_schema=TWO_STRINGS)
    assert not is_json(text_of(bundled, plain))
    tr = run(bundled, "beam", 24, json_schema=TWO_STRINGS, json_close=18)
    assert is_json(text_of(bundled, tr)), text_of(bundled, tr)
    assert tr.stats["constraint_complete"] is True


def test_a_window_too_short_to_close_still_says_incomplete(bundled):
    # '{"name":"","line":""}' is 17 tokens of this tokenizer: 16 cannot hold it, whatever the window
    tr = run(bundled, "greedy", 16, json_schema=TWO_STRINGS, json_close=12)
    assert tr.stats["finish_reason"] == "length" and tr.stats["constraint_complete"] is False
    window = [s.evidence["constraint"]["json_close"] for s in tr.steps[-12:]]
    assert not any(w["fits"] for w in window) and all(w["kept"] == 1 for w in window)
    # the forced walk still heads for the end: the text is the structure's closing, one token short
    assert text_of(bundled, tr) == '{"name":"","line":""'
    assert INCOMPLETE in stats_line(tr.to_dict())


def test_speculative_stays_lossless_under_json_close(bundled, bundled_draft):
    greedy = run(bundled, "greedy", 24, json_schema=TWO_STRINGS, json_close=18)
    spec = run(bundled, "speculative", 24, draft=bundled_draft, json_schema=TWO_STRINGS, json_close=18)
    assert spec.output_ids == greedy.output_ids


def test_closing_walk_is_a_real_completion(bundled):
    view = bundled.view()
    stage = Stage(view, {"json_schema": TWO_STRINGS, "json_close": 8}, budget=40)
    assert stage.closing
    for prefix in ('{"name":"ab', '{"name":"ab","line":"x', '{"', ""):
        row = stage.row()
        for t in bundled.tokenizer.encode(prefix, add_special_tokens=False):
            row.advance(t)
        walk = row.closing_walk(64)
        assert walk is not None
        assert is_json(prefix + bundled.tokenizer.decode(walk)), (prefix, walk)
        assert row.closing_walk(len(walk) - 1) is None if walk else row.closing_walk(0) == []
        for t in walk:  # the matcher takes the walk token by token and then accepts
            row.advance(t)
        assert row.accepting
    # no budget (a caller that does not pass one): the knob is inert
    assert not Stage(view, {"json_schema": TWO_STRINGS, "json_close": 8}).closing


# ---------------------------------------------------------------------- the knob
def test_every_constraint_decoder_has_json_close():
    with_schema = [c for c in all_decoders() if "json_schema" in c.params]
    assert with_schema
    for c in with_schema:
        spec = c.params["json_close"]
        assert spec.default == 0 and spec.help and spec.to_dict()["max"] == MAX_JSON_CLOSE


@pytest.mark.parametrize("params,needle", [
    ({"json_close": 4}, "json_close needs json_schema"),
    ({"json_close": 4, "regex": "[a-z]+"}, "json_close needs json_schema"),
    ({"json_close": -1, "json_schema": INT_OBJECT}, "out of range"),
    ({"json_close": MAX_JSON_CLOSE + 1, "json_schema": INT_OBJECT}, "out of range"),
    ({"json_close": "soon", "json_schema": INT_OBJECT}, "must be an integer"),
    ({"json_close": 2.5, "json_schema": INT_OBJECT}, "must be an integer"),
])
def test_json_close_knob_errors_are_one_line(llama_handle, params, needle):
    with pytest.raises(PlaygroundError) as e:
        run(llama_handle, "greedy", 8, **params)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
