"""Dynamic Focus Decoding and Confident Decoding: their rules recomputed from what each step
recorded, and the settings where each is a plain decoder token for token."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from decoders.contrastive.layer_focus import confident_layer, focus_temperature
from playground.core.errors import PlaygroundError
from playground.core.models import load_model

PROMPT = "ROMEO.\nBut soft, what light"


def run(decoder, **kw):
    return playground.generate(model="tiny-shakespeare", decoder=decoder, prompt=PROMPT, max_new_tokens=10,
                               seed=4, **kw)


def test_dfd_without_focus_is_plain_sampling():
    assert run("dfd", focus=0.0)["output_ids"] == run("sample", temperature=1.0)["output_ids"]
    assert run("dfd", focus=0.0, temperature=0.7)["output_ids"] == run("sample", temperature=0.7)["output_ids"]


def test_dfd_temperatures_follow_the_recorded_divergences():
    t = run("dfd", focus=2.0, temperature=0.9, min_temperature=0.2, max_temperature=1.5)
    seen = []
    temps = []
    for s in t["steps"]:
        ev = s["focus"]
        assert ev["d"] == pytest.approx(max(ev["divergence"]), rel=1e-4)  # recorded to 5 significant digits
        ref = sum(seen) / len(seen) if seen else ev["d"]
        assert ev["reference"] == pytest.approx(ref, rel=1e-9)
        want = min(max(0.9 * math.exp(-2.0 * (ev["d"] / ref - 1.0)), 0.2), 1.5)
        assert ev["temperature"] == pytest.approx(want, rel=1e-9)
        seen.append(ev["d"])
        temps.append(ev["temperature"])
    assert temps[0] == pytest.approx(0.9) and len(set(round(x, 6) for x in temps)) > 1  # it moves


def test_focus_temperature_by_hand():
    assert focus_temperature(1.0, 1.0, 2.0, 1.0, 0.0, 10.0) == pytest.approx(math.exp(-1.0))
    assert focus_temperature(1.0, 1.0, 0.5, 1.0, 0.0, 10.0) == pytest.approx(math.exp(0.5))
    assert focus_temperature(1.0, 0.0, 5.0, 1.0, 0.0, 10.0) == 1.0
    assert focus_temperature(1.0, 3.0, 5.0, 1.0, 0.3, 10.0) == 0.3


def test_confident_search_by_hand():
    assert confident_layer([1.0, 2.0, 3.0], 0.1) == 0  # each earlier layer is surer: walk to the first
    assert confident_layer([1.0, 2.95, 3.0], 0.1) == 2  # not surer by the margin: stay on the final layer
    assert confident_layer([0.5, 4.0, 2.0], 0.1) == 2  # stops at the first layer that is not surer
    assert confident_layer([3.0], 0.1) == 0


def test_confident_decoding_takes_the_chosen_layers_token():
    model = load_model("tiny-shakespeare")
    t = run("confident", window=3, margin=0.05)
    ids = list(t["prompt_ids"])
    for s, tok in zip(t["steps"], t["output_ids"]):
        ev = s["confident"]
        j = confident_layer(ev["entropy"], 0.05)
        assert ev["chosen"] == ev["layers"][j]
        with torch.no_grad():
            out = model.model(torch.tensor([ids]), output_hidden_states=True)
        hidden = out.hidden_states[ev["chosen"]][0, -1]
        logits = out.logits[0, -1] if ev["chosen"] == ev["layers"][-1] else model.lm_head(hidden[None])[0]
        lp = torch.log_softmax(logits.float(), -1)
        assert float(-(lp.exp() * lp).nansum()) == pytest.approx(ev["entropy"][j], abs=1e-3)
        assert int(torch.argmax(logits)) == tok
        ids.append(tok)


def test_confident_without_a_window_is_greedy():
    assert run("confident", window=0)["output_ids"] == run("greedy")["output_ids"]
    assert run("confident", window=3, margin=10.0)["output_ids"] == run("greedy")["output_ids"]


def test_bad_knobs_are_one_line():
    with pytest.raises(PlaygroundError, match="min_temperature"):
        run("dfd", min_temperature=1.5, max_temperature=1.0)
    with pytest.raises(PlaygroundError, match="window"):
        run("confident", window=99)
    with pytest.raises(PlaygroundError, match="dola_layers"):
        run("dfd", dola_layers="x,y")
