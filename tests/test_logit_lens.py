"""The logit lens: a ``logit_lens`` knob on the token-step decoders records, at every step,
what each layer's hidden state predicts through the final norm and LM head; the inspector
draws it. Tiny random Llama and GPT-2 models, and the bundled tiny-shakespeare."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
import torch

import visualizers as V
from decoders.ar import lens_evidence
from decoders.base import get_decoder
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.core.trace import validate_trace_dict
from visualizers.lens import lens_figure, lens_run_figure

PROMPT = "ROMEO: But soft, what light"
TOKEN_DECODERS = ["greedy", "sample", "top_k", "top_p", "min_p", "typical", "epsilon", "eta", "xtc", "mirostat"]


def run(handle, decoder: str, n: int = 5, **params) -> dict:
    return prepare(model=handle, decoder=decoder, prompt=PROMPT, max_new_tokens=n, seed=3,
                   params=params).finish().to_dict()


def strip_time(steps: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "t"} for s in steps]


@pytest.mark.parametrize("name", TOKEN_DECODERS)
def test_every_token_step_decoder_has_the_knob_off_by_default(name):
    spec = get_decoder(name).params["logit_lens"]
    assert spec.type == "bool" and spec.default is False
    with pytest.raises(PlaygroundError) as e:
        get_decoder(name).params.validate(name, {"logit_lens": "maybe"})
    assert "\n" not in str(e.value) and "logit_lens" in str(e.value)


@pytest.mark.parametrize("model", ["llama_handle", "gpt2_handle"])
def test_off_leaves_the_trace_unchanged(request, model):
    h = request.getfixturevalue(model)
    default = run(h, "top_p", p=0.8)
    off = run(h, "top_p", p=0.8, logit_lens=False)
    assert strip_time(default["steps"]) == strip_time(off["steps"])
    assert not any("lens" in s for s in default["steps"])


@pytest.mark.parametrize("model", ["llama_handle", "gpt2_handle"])
@pytest.mark.parametrize("decoder,params", [("greedy", {}), ("top_p", {"p": 0.8}), ("sample", {"temperature": 0.7})])
def test_on_the_last_layer_is_the_models_output_and_nothing_else_changes(request, model, decoder, params):
    h = request.getfixturevalue(model)
    off = run(h, decoder, **params)
    on = run(h, decoder, **params, logit_lens=True)
    validate_trace_dict(on)
    json.loads(json.dumps(on))  # strict JSON
    assert on["output_ids"] == off["output_ids"]
    assert on["stats"]["target_forwards"] == off["stats"]["target_forwards"]  # no extra forward
    assert on["stats"]["target_tokens_processed"] == off["stats"]["target_tokens_processed"]
    for a, b in zip(on["steps"], off["steps"]):
        assert a["dist"] == b["dist"]
        lens = a["lens"]
        # one entry per hidden state: the embeddings and every layer
        assert lens["layers"] == list(range(h.num_layers + 1))
        assert len(lens["top_ids"]) == len(lens["top_probs"]) == len(lens["chosen_probs"]) == h.num_layers + 1
        assert all(len(r) == 5 for r in lens["top_ids"])
        assert all(r == sorted(r, reverse=True) for r in lens["top_probs"])
        # the final layer through the final norm and head is the model's output
        d = a["dist"]
        assert lens["top_ids"][-1][0] == d["top_ids"][0]
        assert lens["top_probs"][-1] == pytest.approx(d["raw_probs"][:5], abs=2e-6)
        assert lens["chosen"] == a["committed"][0]
        assert lens["chosen_probs"][-1] == pytest.approx(d["raw_probs"][d["top_ids"].index(d["chosen"])], abs=2e-6)
        assert lens["chosen_ranks"][-1] == d["chosen_rank"]
        # the token map carries every lens token, so a replay needs no tokenizer
        assert all(str(t) in on["tokens"] for row in lens["top_ids"] for t in row)


@pytest.mark.parametrize("model,norm", [("llama_handle", lambda m: m.model.norm),
                                        ("gpt2_handle", lambda m: m.transformer.ln_f)])
def test_inner_layers_go_through_the_final_norm_and_head(request, model, norm):
    """Straight-line reference: the prompt's hidden states, the model's own final norm, its LM head."""
    h = request.getfixturevalue(model)
    tr = run(h, "greedy", n=2, logit_lens=True)
    m = h.model
    with torch.no_grad():
        out = m(input_ids=torch.tensor([tr["prompt_ids"]]), output_hidden_states=True)
        for layer in range(h.num_layers):
            p = torch.softmax(m.get_output_embeddings()(norm(m)(out.hidden_states[layer][0, -1])).float(), -1)
            top = torch.topk(p, 5)
            assert tr["steps"][0]["lens"]["top_ids"][layer] == top.indices.tolist()
            assert tr["steps"][0]["lens"]["top_probs"][layer] == pytest.approx(top.values.tolist(), abs=2e-6)


def test_a_model_without_hidden_states_is_one_line(llama_handle):
    with pytest.raises(PlaygroundError) as e:
        lens_evidence(llama_handle.view(), None, torch.zeros(llama_handle.vocab_size), 0)
    assert "\n" not in str(e.value) and "hidden states" in str(e.value)


def test_bundled_model_and_the_view():
    tr = prepare(model="tiny-shakespeare", decoder="greedy", prompt="ROMEO:\n<b>What</b> & say", max_new_tokens=4,
                 params={"logit_lens": True}).finish().to_dict()
    validate_trace_dict(tr)
    n = load_model("tiny-shakespeare").num_layers  # the layers the lens reads: every decoder layer
    assert n >= 2
    for i, s in enumerate(tr["steps"]):
        lens = s["lens"]
        assert len(lens["layers"]) == n + 1
        assert lens["top_ids"][-1][0] == s["dist"]["top_ids"][0] == s["committed"][0]  # greedy: the output's top-1
        titles = [t for t, _ in V.step_figures(tr, i)]
        assert titles == ["Distribution", "Logit lens"]
        f = lens_figure(tr, i)
        assert "could not draw" not in f.to_json()
        heat = f.data[0]
        assert [list(r) for r in heat.z] == lens["top_probs"]
        assert list(heat.y) == ["emb", *[str(k) for k in range(1, n)], f"{n} (out)"]
        for r, row in enumerate(lens["top_ids"]):
            for j, t in enumerate(row):
                txt = tr["tokens"][str(t)]
                assert "<" not in heat.text[r][j] or "&lt;" in heat.text[r][j]
                if "<" in txt or "&" in txt:
                    assert heat.text[r][j] != txt
        # the chosen token is outlined wherever a layer ranks it in its top 5
        chosen = next(t for t in f.data if t.name == "chosen token")
        want = [(f"top {j + 1}", heat.y[r]) for r, row in enumerate(lens["top_ids"]) for j, t in enumerate(row)
                if t == lens["chosen"]]
        assert list(zip(chosen.x, chosen.y)) == want
    run_titles = [t for t, _ in V.run_figures(tr)]
    assert run_titles == ["Entropy and probability", "Logit lens over the run"]
    rf = lens_run_figure(tr)
    assert "could not draw" not in rf.to_json()
    heat = rf.data[0]
    assert [[heat.z[lay][x] for lay in range(n + 1)] for x in range(len(tr["steps"]))] == \
        [s["lens"]["chosen_probs"] for s in tr["steps"]]


def test_the_view_escapes_token_text_and_survives_partial_evidence():
    lens = {"layers": [0, 1, 2], "top_ids": [[5, 6], [6, 5], [6, 5]], "top_probs": [[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]],
            "chosen": 6, "chosen_probs": [0.4, 0.7, 0.9], "chosen_ranks": [1, 0, 0]}
    tr = {"tokens": {"5": "<script>", "6": "a&b"}, "prompt_ids": [], "output_ids": [6],
          "steps": [{"i": 0, "kind": "token", "committed": [6], "lens": lens}]}
    f = lens_figure(tr, 0)
    blob = f.to_json()
    assert "<script>" not in blob and "&lt;script&gt;" in blob and "a&amp;b" in blob
    assert "leads from layer 1 on" in f.layout.title.subtitle.text
    for odd in ({"layers": "x"}, {"layers": [0, 1], "top_ids": [[1], "no"], "top_probs": [[None]]}, None):
        t2 = {**tr, "steps": [{"i": 0, "kind": "token", "committed": [6], "lens": odd}]}
        for p in (lens_figure(t2, 0), lens_run_figure(t2)):
            assert isinstance(p, go.Figure) and "could not draw" not in p.to_json()
    assert "no steps yet" in lens_figure({"steps": []}, 0).to_json()


def test_a_deep_model_gets_a_taller_view_with_one_row_per_layer():
    n = 33
    lens = {"layers": list(range(n)), "top_ids": [[5, 6]] * n, "top_probs": [[0.6, 0.4]] * n, "chosen": 6,
            "chosen_probs": [0.4] * n, "chosen_ranks": [1] * n}
    tr = {"tokens": {"5": "x", "6": "y"}, "steps": [{"i": 0, "kind": "token", "committed": [6], "lens": lens}]}
    for f in (lens_figure(tr, 0), lens_run_figure(tr)):
        assert len(f.data[0].y) == n and f.data[0].y[-1] == "32 (out)"
        assert f.layout.height >= 18 * n
