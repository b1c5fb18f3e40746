"""cfg's negatives made from the prompt (Instructive Decoding, CID): the negative each generator
builds, the unconditional pass run on exactly it, and the errors."""

from __future__ import annotations

import pytest
import torch

import playground
from decoders.contrastive.perturb import OPPOSITE, perturbed_negative
from playground.core.errors import PlaygroundError
from playground.core.models import load_model

PROMPT = "ROMEO.\nBut soft, what light"


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-shakespeare")


def test_each_perturbation_is_what_it_says_and_fixed_by_the_seed(model):
    ids = model.tokenizer.encode(PROMPT)
    view = model
    assert perturbed_negative("opposite", ids, view, 0) == model.tokenizer.encode(OPPOSITE) + ids
    shuffled = perturbed_negative("shuffled", ids, view, 3)
    assert sorted(shuffled) == sorted(ids) and shuffled != ids
    assert shuffled == perturbed_negative("shuffled", ids, view, 3) != perturbed_negative("shuffled", ids, view, 4)
    rnd = perturbed_negative("random", ids, view, 3)
    assert len(rnd) == len(ids) and all(0 <= t < model.vocab_size for t in rnd) and rnd != ids


@pytest.mark.parametrize("how", ["opposite", "shuffled", "random"])
def test_the_unconditional_pass_reads_the_recorded_negative(model, how):
    trace = playground.generate(model="tiny-shakespeare", decoder="cfg", prompt=PROMPT, max_new_tokens=4, seed=2,
                                negative=how, guidance_scale=2.0)
    negative = trace["stats"]["negative_ids"]
    assert negative == perturbed_negative(how, trace["prompt_ids"], model, 2)
    with torch.no_grad():
        logits = model.model(torch.tensor([negative])).logits[0, -1].float()
    want = torch.softmax(logits, -1)
    ev = trace["steps"][0]["contrast"]
    got = torch.tensor(ev["probs"]["unconditional"])
    assert torch.allclose(got, want[torch.tensor(ev["top_ids"])], atol=1e-5)


def test_a_perturbed_negative_with_a_typed_one_is_one_line():
    with pytest.raises(PlaygroundError, match="negative_prompt' is for negative='text'"):
        playground.generate(model="tiny-shakespeare", decoder="cfg", prompt=PROMPT, max_new_tokens=2,
                            negative="shuffled", negative_prompt="x")
    with pytest.raises(PlaygroundError, match="negative"):
        playground.generate(model="tiny-shakespeare", decoder="cfg", prompt=PROMPT, max_new_tokens=2, negative="nope")
