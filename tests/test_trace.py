"""The trace schema: JSON round trip, validation, measured stats."""

from __future__ import annotations

import json

import pytest

from playground.engine import prepare
from playground.core.trace import Trace, validate_trace_dict


def test_round_trip(llama_handle):
    trace = prepare(model=llama_handle, decoder="greedy", prompt="ROMEO: café", max_new_tokens=8).finish()
    d = trace.to_dict()
    text = json.dumps(d)
    back = Trace.from_json(text)
    assert back.to_dict() == d
    assert d["schema"] == 1
    for key in ("new_tokens", "target_forwards", "draft_forwards", "tokens_per_target_forward", "wall_s",
                "first_token_s", "finish_reason"):
        assert key in d["stats"]
    assert all(str(i) in d["tokens"] for i in d["output_ids"] + d["prompt_ids"])
    assert "".join(d["pieces"]) == d["text"] or d["text"].endswith("\ufffd")


@pytest.mark.parametrize("bad,msg", [
    ([], "JSON object"),
    ({"schema": 1}, "missing field"),
    ({**{k: "" for k in ("model", "decoder", "prompt", "text")}, "schema": 99, "params": {}, "seed": 0,
      "prompt_ids": [], "output_ids": [], "stats": {}, "steps": []}, "unsupported trace schema"),
])
def test_validation_rejects(bad, msg):
    with pytest.raises(ValueError, match=msg):
        validate_trace_dict(bad)


def test_step_kinds_validated():
    d = {"schema": 1, "model": "m", "decoder": "d", "params": {}, "seed": 0, "prompt": "p", "prompt_ids": [1],
         "output_ids": [], "text": "", "stats": {}, "steps": [{"kind": "weird"}]}
    with pytest.raises(ValueError, match="no valid kind"):
        validate_trace_dict(d)
