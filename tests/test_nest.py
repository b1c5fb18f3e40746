"""``nest`` (decoders/speculative/nest.py) on the bundled tiny-shakespeare model: lambda 0 with
no span is greedy; a recorded step's kNN distribution, lambda and neighbours equal a brute-force
recomputation from passages encoded here; relax 1 equals a step-by-step greedy kNN-LM replayed
without a cache; on a prompt that starts a passage the accepted spans are copied from it and
attributed to the right offsets, in fewer forwards than tokens; the prompt as the datastore;
bad knobs are one line; the views draw the evidence."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from decoders.speculative.nest import DEFAULT_PASSAGES, MAX_PASSAGES
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from visualizers.nest import nest_run_figure, nest_step_figure

PASSAGE_PROMPT = "ANTONY.\nFriends, Romans,"
OTHER_PROMPT = "ROMEO:\nWhat light"


@pytest.fixture(scope="module")
def handle():
    return load_model("tiny-shakespeare", device="cpu")


def run(handle, decoder, prompt, n=30, **knobs):
    tr = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=0, params=knobs).finish()
    return json.loads(tr.to_json())  # the stored form, as the views read it


def hidden_and_logits(handle, ids):
    """The last hidden state and the next-token logits after ``ids``, by one uncached forward."""
    with torch.no_grad():
        out = handle.model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1].float(), out.logits[0, -1].float()


def brute_store(handle, text):
    """(keys, values, sources, passages) of the passages, each encoded here on its own."""
    parts = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]
    keys, values, sources, passages = [], [], [], {}
    for i, p in enumerate(parts):
        ids = handle.tokenizer.encode(p, add_special_tokens=False)
        passages[f"p{i + 1}"] = ids
        with torch.no_grad():
            h = handle.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
        for j in range(len(ids) - 1):
            keys.append(h[j].float())
            values.append(ids[j + 1])
            sources.append((f"p{i + 1}", j + 1))
    return torch.stack(keys), values, sources, passages


def brute_knn(handle, store, h, k=8, alpha=0.1, tau=0.1):
    """p_kNN (as a dict), lambda and the neighbours' sources at query ``h``: every distance
    computed, sorted, the k nearest kept."""
    keys, values, sources, _ = store
    d = [float(((keys[i] - h) ** 2).sum()) for i in range(len(values))]
    order = sorted(range(len(d)), key=lambda i: d[i])[:k]
    temp = math.sqrt(handle.config.hidden_size)
    w = [math.exp(-(d[i] - d[order[0]]) / temp) for i in order]
    z = sum(w)
    p: dict[int, float] = {}
    for i, wi in zip(order, w):
        p[values[i]] = p.get(values[i], 0.0) + wi / z
    r = d[order[0]] / d[order[-1]]
    lam = 1.0 - 1.0 / (1.0 + math.exp(-(r - alpha) / tau))
    return p, lam, [sources[i] for i in order], [d[i] for i in order]


def contexts(tr):
    """For each step, the ids before the position where its last committed token was drawn."""
    ids, out = list(tr["prompt_ids"]), []
    for s in tr["steps"]:
        out.append(ids + s["committed"][:-1])
        ids = ids + s["committed"]
    return out


def test_lambda_zero_and_no_span_is_greedy(handle):
    for prompt in (PASSAGE_PROMPT, OTHER_PROMPT):
        g = run(handle, "greedy", prompt)
        n = run(handle, "nest", prompt, lambda_mode="fixed", lam=0.0, span_length=0)
        assert n["output_ids"] == g["output_ids"]
        assert n["stats"]["target_forwards"] == g["stats"]["target_forwards"] == len(g["output_ids"])
        assert n["stats"]["attribution_share"] == 0.0


def test_recorded_knn_distribution_equals_brute_force(handle):
    tr = run(handle, "nest", PASSAGE_PROMPT, 24)
    store = brute_store(handle, DEFAULT_PASSAGES)
    ctxs = contexts(tr)
    checked = 0
    for s, ids in list(zip(tr["steps"], ctxs))[:4]:
        ev = s["nest"]
        h, logits = hidden_and_logits(handle, ids)
        p, lam, srcs, ds = brute_knn(handle, store, h)
        got = dict(zip(ev["knn"]["ids"], ev["knn"]["probs"]))
        assert set(got) == set(p)
        for t in p:
            assert got[t] == pytest.approx(p[t], abs=2e-3)
        assert ev["lam"] == pytest.approx(lam, abs=2e-3)
        assert [(n["passage"], n["offset"]) for n in ev["neighbours"]] == srcs
        assert [n["d"] for n in ev["neighbours"]] == pytest.approx(ds, rel=1e-3, abs=1e-2)
        # the mixture of the drawn token, from the recomputed parts
        y = ev["choice"]["token"]
        p_lm = float(torch.softmax(logits, -1)[y])
        assert ev["choice"]["p_mix"] == pytest.approx(lam * p.get(y, 0.0) + (1 - lam) * p_lm, abs=2e-3)
        checked += 1
    assert checked == 4


def test_relax_one_equals_the_greedy_knn_lm_replayed(handle):
    n = 20
    tr = run(handle, "nest", PASSAGE_PROMPT, n, relax=1.0)
    store = brute_store(handle, DEFAULT_PASSAGES)
    ids, out = list(tr["prompt_ids"]), []
    for _ in range(n):
        h, logits = hidden_and_logits(handle, ids + out)
        p, lam, _, _ = brute_knn(handle, store, h)
        mix = (1 - lam) * torch.softmax(logits.double(), -1)
        for t, pt in p.items():
            mix[t] += lam * pt
        out.append(int(torch.argmax(mix)))
    assert tr["output_ids"] == out
    assert tr["stats"]["target_forwards"] < n  # the spans were accepted, not replayed token by token


def test_accepted_spans_are_copied_and_attributed(handle):
    tr = run(handle, "nest", PASSAGE_PROMPT, 30)
    store = brute_store(handle, DEFAULT_PASSAGES)
    passages = store[3]
    attributed = 0
    for s in tr["steps"]:
        ev = s["nest"]
        span = ev["span"]
        if span and span["accepted"]:
            a = span["accepted"]
            got = passages[span["passage"]][span["offset"]:span["offset"] + a]
            assert span["ids"][:a] == got == s["committed"][:a]
        assert len(ev["attribution"]) == len(s["committed"]) == len(ev["lams"])
        for tok, src in zip(s["committed"], ev["attribution"]):
            if src:
                name, off = src
                assert passages[name][off] == tok
                attributed += 1
    new = len(tr["output_ids"])
    assert tr["stats"]["attribution_share"] == pytest.approx(attributed / new, abs=1e-4)
    assert attributed / new >= 0.8
    # Antony's speech is the second passage
    assert all(src[0] == "p2" for s in tr["steps"] for src in s["nest"]["attribution"] if src)
    assert sum(s["nest"]["span"]["accepted"] for s in tr["steps"] if s["nest"]["span"]) >= 10


def test_more_than_one_token_per_target_forward_on_a_passage_prompt(handle):
    tr = run(handle, "nest", PASSAGE_PROMPT, 40)
    st = tr["stats"]
    assert st["tokens_per_target_forward"] == pytest.approx(st["new_tokens"] / st["target_forwards"], abs=1e-3)
    assert st["tokens_per_target_forward"] > 2.0
    assert st["accepted_tokens"] == sum(len(s["tree"]["accepted_path"]) for s in tr["steps"])
    # on a prompt no passage continues, retrieval is unconfident: nearly greedy, one token a forward
    other = run(handle, "nest", OTHER_PROMPT, 40)
    assert other["stats"]["mean_lambda"] < 0.1
    assert other["stats"]["tokens_per_target_forward"] < 1.5


def test_the_prompt_as_the_datastore(handle):
    line = "Friends, Romans, countrymen, lend me your ears;\nI come to bury Caesar, not to praise him."
    prompt = f"{line}\n\n{line}\n\nFriends, Romans,"
    tr = run(handle, "nest", prompt, 20, source="prompt")
    ids = tr["prompt_ids"]
    srcs = [(tok, src) for s in tr["steps"] for tok, src in zip(s["committed"], s["nest"]["attribution"]) if src]
    assert len(srcs) >= 10
    for tok, (name, off) in srcs:
        assert name == "prompt" and ids[off] == tok
    assert tr["stats"]["tokens_per_target_forward"] > 1.5


@pytest.mark.parametrize("knobs,needle", [
    ({"passages": "\n\n   \n"}, "holds no passage"),
    ({"passages": "\n\n".join(f"line {i}" for i in range(MAX_PASSAGES + 1))}, "passages; the limit"),
    ({"passages": "word " * 400}, "tokens long; the limit"),
    ({"passages": "\n\n".join(["word " * 200] * 12)}, "in all; the limit"),
    ({"passages": "a"}, "needs a token and the one after it"),
    ({"passages": "x" * 30000}, "characters long"),
    ({"k": 0}, "out of range"),
    ({"relax": 1.5}, "out of range"),
    ({"source": "web"}, "is not one of"),
    ({"lambda_mode": "learned"}, "is not one of"),
    ({"span_len": 3}, "has no knob"),
])
def test_bad_knobs_are_one_line(handle, knobs, needle):
    with pytest.raises(PlaygroundError) as e:
        run(handle, "nest", PASSAGE_PROMPT, 4, **knobs)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_prompt_source_needs_two_tokens(handle):
    with pytest.raises(PlaygroundError) as e:
        run(handle, "nest", "A", 4, source="prompt")
    assert "at least 2 tokens" in str(e.value) and "\n" not in str(e.value)


def test_views_draw_the_evidence(handle):
    tr = run(handle, "nest", PASSAGE_PROMPT, 24)
    i = next(j for j, s in enumerate(tr["steps"]) if s["nest"]["span"])
    fig = nest_step_figure(tr, i)
    ev = tr["steps"][i]["nest"]
    bars = [d for d in fig.data if d.type == "bar"]
    assert list(bars[0].y) == [n["d"] for n in ev["neighbours"]]
    assert list(bars[1].y) == ev["span"]["p"]
    acc = ev["span"]["accepted"]
    assert f"accepted {acc} of {len(ev['span']['ids'])}" in fig.layout.title.subtitle.text
    run_fig = nest_run_figure(tr)
    lams = [x for s in tr["steps"] for x in s["nest"]["lams"]]
    assert list(run_fig.data[0].y) == lams
    assert list(run_fig.data[1].y) == [s["nest"]["span"]["accepted"] if s["nest"]["span"] else 0 for s in tr["steps"]]
