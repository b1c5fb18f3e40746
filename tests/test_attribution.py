"""Attribution of a token to its context on a tiny random model: gradient × input equals a
finite-difference estimate along each token's embedding; integrated gradients satisfy
completeness (the attributions add up to f(x) - f(baseline) within 5 % at 32 steps), also
contrastively; a trace's step attributes over the prompt and the tokens before it; the CLI."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
import torch

from conftest import build_gpt2, build_llama
from playground.attribution import attribute, attribute_ids, step_context
from playground.cli import main as cli_main
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model


@pytest.fixture(scope="module")
def handle(tokenizer):
    """A tiny random GPT-2 in float64, so finite differences are exact enough to compare (Llama's
    RMSNorm computes in float32 whatever the model's dtype, which swamps a finite difference)."""
    return handle_from_model(build_gpt2(tokenizer, seed=3).double(), tokenizer, name="tiny-gpt2-f64")


@pytest.fixture(scope="module")
def llama(tokenizer):
    return handle_from_model(build_llama(tokenizer, seed=3), tokenizer, name="tiny-llama")


def f_at(handle, embeds: torch.Tensor, target: int, contrast: int | None = None) -> float:
    with torch.no_grad():
        logp = torch.log_softmax(handle.model(inputs_embeds=embeds, use_cache=False).logits[0, -1], -1)
    return float(logp[target] - (logp[contrast] if contrast is not None else 0.0))


def context(handle, text: str = "ROMEO: But soft, what light") -> list[int]:
    return handle.encode(text)


def test_gradient_x_input_equals_a_finite_difference_along_each_token(handle):
    ids, target = context(handle), 42
    res = attribute_ids(handle, ids, target, method="gradient_x_input")
    x = handle.model.get_input_embeddings()(torch.tensor([ids])).detach()
    eps = 1e-4
    for t in range(len(ids)):
        d = torch.zeros_like(x)
        d[0, t] = x[0, t]  # the direction: token t's own embedding
        fd = (f_at(handle, x + eps * d, target) - f_at(handle, x - eps * d, target)) / (2 * eps)
        assert res["scores"][t] == pytest.approx(fd, rel=1e-5, abs=1e-10)
    assert res["f"] == pytest.approx(f_at(handle, x, target), abs=1e-9)


@pytest.mark.parametrize("contrast", [None, 7])
@pytest.mark.parametrize("which,baseline", [("handle", "zero"), ("handle", "eos"), ("llama", "eos")])
def test_integrated_gradients_are_complete_at_32_steps(which, baseline, contrast, request, tokenizer):
    handle = request.getfixturevalue(which)
    ids = context(handle)
    res = attribute_ids(handle, ids, 42, contrast=contrast, method="integrated_gradients", steps=32,
                        baseline=baseline)
    emb = handle.model.get_input_embeddings()
    x = emb(torch.tensor([ids])).detach()
    x0 = torch.zeros_like(x) if baseline == "zero" else emb(torch.full((1, len(ids)), tokenizer.eos_token_id)).detach()
    assert res["baseline"] == baseline
    assert res["f"] == pytest.approx(f_at(handle, x, 42, contrast), abs=1e-4)
    assert res["f_baseline"] == pytest.approx(f_at(handle, x0, 42, contrast), abs=1e-4)
    gap = res["f"] - res["f_baseline"]
    assert abs(gap) > 1e-3  # not vacuous
    assert sum(res["scores"]) == pytest.approx(res["sum"])
    assert abs(res["sum"] - gap) <= 0.05 * abs(gap)
    assert len(res["scores"]) == len(ids)


def test_a_traces_step_is_explained_over_the_prompt_and_the_tokens_before_it(handle):
    tr = prepare(model=handle, decoder="greedy", prompt="ROMEO: But", max_new_tokens=4).finish().to_dict()
    ids, tok = step_context(tr, 2)
    assert ids == tr["prompt_ids"] + tr["output_ids"][:2] and tok == tr["output_ids"][2]
    res = attribute(tr, 2, method="gradient_x_input", model=handle)
    assert res["target"] == tok and res["ids"] == ids and len(res["texts"]) == len(ids) and res["step"] == 2
    for bad, msg in (({"steps": []}, "no steps"), ({**tr, "steps": [{"kind": "denoise", "committed": [1]}]},
                                                      "diffusion")):
        with pytest.raises(PlaygroundError, match=msg):
            attribute(bad, 0, model=handle)
    with pytest.raises(PlaygroundError, match="step must be"):
        attribute(tr, 9, model=handle)
    with pytest.raises(PlaygroundError, match="unknown attribution method"):
        attribute(tr, 0, method="saliency", model=handle)
    with pytest.raises(PlaygroundError, match="outside the vocabulary"):
        attribute(tr, 0, contrast=10**7, model=handle)


def test_the_cli_explains_a_stored_trace(tmp_path):
    tr = prepare(model="tiny-shakespeare", decoder="greedy", prompt="ROMEO: But soft", max_new_tokens=3).finish()
    path = tmp_path / "t.json"
    path.write_text(tr.to_json(), encoding="utf-8")
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["attribute", "--trace", str(path), "--step", "1", "--steps", "8", "--json"]) == 0
    res = json.loads(out.getvalue())
    assert res["target"] == tr.output_ids[1] and len(res["scores"]) == len(tr.prompt_ids) + 1
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["attribute", "--trace", str(path), "--step", "0", "--method", "gradient_x_input"]) == 0
    assert out.getvalue().count("\n") == len(tr.prompt_ids) and "*" in out.getvalue()
