"""Superposed Decoding (``superposed``): k drafts from one forward pass of a superposed input.

Checked: with k = 1 and no n-gram weight it is greedy decoding token for token on the bundled
model; a superposed forward with one-hot weights gives the plain forward's logits exactly and
adds one cache position; every step's kept set is the brute-force top k of the recorded
k x k grid, whose scores recompute from the recorded LM and n-gram probabilities and the
previous step's draft scores, and whose weights are the kept drafts' normalised probabilities;
the n-gram table equals direct counting; one target forward and one processed position per
generated token whatever k (beam search processes k rows a step); stops finish drafts; the
plots draw the recorded grid; every bad knob is one line.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from decoders.beam_batch import BatchState
from decoders.search.superposed import NgramTable, softmax_weights, superposed_forward
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from visualizers.superposed import candidate_grid_figure, weights_figure

PROMPTS = ["ROMEO: But soft, what light", "First Citizen:\nBefore we proceed any further, hear me speak.",
           "HAMLET. To be, or not to be"]


@pytest.fixture(scope="module")
def shakespeare():
    return load_model("tiny-shakespeare", device="cpu")


def run(model, prompt, n=16, stop_free=True, **params):
    r = prepare(model=model, decoder="superposed", prompt=prompt, max_new_tokens=n, params=params)
    if stop_free:
        r.ctx.stop_ids = set()
    return r.finish()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_one_draft_without_ngrams_is_greedy(shakespeare, prompt):
    greedy = prepare(model=shakespeare, decoder="greedy", prompt=prompt, max_new_tokens=24).finish()
    sup = prepare(model=shakespeare, decoder="superposed", prompt=prompt, max_new_tokens=24,
                  params={"num_drafts": 1, "ngram_weight": 0.0}).finish()
    assert sup.output_ids == greedy.output_ids and len(sup.output_ids) > 0
    assert sup.stats["finish_reason"] == greedy.stats["finish_reason"]


@pytest.mark.parametrize("weights_at", [0, 1, 2])
def test_one_hot_superposed_forward_is_the_plain_forward(shakespeare, weights_at):
    view = shakespeare.view()
    prompt = shakespeare.encode("JULIET: O Romeo, Romeo")
    tokens = [11, 300, 1234]
    a, b = BatchState(view, prompt, 1), BatchState(view, prompt, 1)
    w = [0.0, 0.0, 0.0]
    w[weights_at] = 1.0
    sup = superposed_forward(view, a.cache, tokens, w)
    plain = view.forward([tokens[weights_at]], cache=b.cache)
    assert torch.equal(sup.logits, plain.logits)
    assert a.cache.get_seq_length() == b.cache.get_seq_length() == len(prompt) + 1
    # and the next position reads the superposed entry as it reads the token's
    nxt_a = view.forward([5], cache=a.cache).logits
    nxt_b = view.forward([5], cache=b.cache).logits
    assert torch.equal(nxt_a, nxt_b)


def test_a_mixed_input_is_the_weighted_sum_of_embeddings(shakespeare):
    view = shakespeare.view()
    prompt = shakespeare.encode("KING:")
    emb = shakespeare.model.get_input_embeddings().weight
    a, b = BatchState(view, prompt, 1), BatchState(view, prompt, 1)
    sup = superposed_forward(view, a.cache, [40, 41], [0.25, 0.75]).logits
    with torch.no_grad():
        by_hand = shakespeare.model(inputs_embeds=(0.25 * emb[40] + 0.75 * emb[41])[None, None],
                                    cache=b.cache, use_cache=True).logits
    assert torch.allclose(sup, by_hand.float(), atol=1e-5)
    assert not torch.allclose(sup, view.forward([40], cache=BatchState(view, prompt, 1).cache).logits, atol=1e-3)


def _brute_kept(score, stopped_or_none, k):
    cells = sorted(((score[r][j], r, j) for r in range(len(score)) for j in range(len(score[r]))),
                   key=lambda c: (-c[0], c[1], c[2]))
    return {(r, j) for _, r, j in cells[:k]}


@pytest.mark.parametrize("k,alpha,mix,source", [(4, 0.5, "geometric", "corpus"), (3, 0.3, "linear", "prompt"),
                                                (5, 1.0, "geometric", "prompt")])
def test_kept_sets_equal_brute_force_over_the_recorded_grid(shakespeare, k, alpha, mix, source):
    tr = run(shakespeare, PROMPTS[1], n=14, num_drafts=k, ngram_weight=alpha, mix=mix, ngram_source=source)
    steps = [s.to_dict() for s in tr.steps]
    assert len(steps) == 14 and len(tr.output_ids) == 14
    prev_beams = None
    for t, s in enumerate(steps):
        ev = s["superposed"]
        lm, ng, score = np.array(ev["lm"]), np.array(ev["ngram"]), np.array(ev["score"])
        assert len(ev["top_ids"]) == k and score.shape == (1 if t == 0 else k, k)
        # the LM's top-k tokens of the one distribution, in order
        assert list(lm) == sorted(lm, reverse=True)
        if mix == "geometric":
            step = (1 - alpha) * np.log(lm)[None] + alpha * np.log(ng)
        else:
            step = np.log((1 - alpha) * lm[None] + alpha * ng)
        prev = np.array(ev["prev_scores"])
        np.testing.assert_allclose(score, prev[:, None] + step, rtol=1e-12, atol=1e-9)
        if prev_beams is not None:
            assert list(prev) == [b["score"] for b in prev_beams]
        kept = {(r, j) for r, row in enumerate(ev["kept"]) for j, v in enumerate(row) if v}
        assert kept == _brute_kept(score.tolist(), None, k)
        beams = s["beams"]
        assert len(beams) == k and not any(b["finished"] for b in beams)
        # each kept cell is a draft: its parent's ids plus the column's token, with the cell's score
        for b in beams:
            r = b["parent"] if t else 0
            j = ev["top_ids"].index(b["ids"][-1])
            assert (r, j) in kept and b["score"] == score[r, j]
            if prev_beams is not None:
                assert b["ids"][:-1] == prev_beams[r]["ids"]
        w = [b["weight"] for b in beams]
        assert w == ev["weights"] and math.isclose(sum(w), 1.0, rel_tol=1e-12)
        e = np.exp(np.array([b["score"] for b in beams]) - max(b["score"] for b in beams))
        np.testing.assert_allclose(w, e / e.sum(), rtol=1e-12)
        prev_beams = beams
    # the lane's output is the best draft; the others are in the stats
    drafts = tr.stats["drafts"]
    assert tr.output_ids == drafts[0]["ids"] and len(drafts) == k
    assert [d["score"] for d in drafts] == sorted((d["score"] for d in drafts), reverse=True)


def _count(streams, gram):
    n = len(gram)
    return sum(1 for s in streams for i in range(len(s) - n + 1) if list(s[i:i + n]) == list(gram))


def test_ngram_table_equals_counting():
    rng = random.Random(3)
    streams = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(5)] + [[9, 9, 9]]
    vocab = 12
    total = sum(len(s) for s in streams)
    for order in (1, 2, 3, 4):
        table = NgramTable(streams, order, vocab)
        for _ in range(30):
            hist = [rng.randrange(7) for _ in range(rng.randrange(0, 5))]
            toks = [rng.randrange(vocab) for _ in range(4)]
            want = []
            for x in toks:
                est = [(_count(streams, [x]) + 1) / (total + vocab)]
                for m in range(1, order):
                    if len(hist) < m:
                        break
                    ch = _count(streams, hist[-m:])
                    if ch:
                        est.append(_count(streams, hist[-m:] + [x]) / ch)
                want.append(sum(est) / len(est))
            np.testing.assert_allclose(table.probs(hist, toks), want, rtol=1e-12)
    # an n-gram across two streams is no n-gram of either
    assert NgramTable([[1, 2], [3, 4]], 2, 8).count(NgramTable([[1, 2], [3, 4]], 2, 8).ranks([2, 3])[None])[0] == 0


@pytest.mark.parametrize("k", [1, 3, 8])
def test_one_target_forward_and_one_position_per_token(shakespeare, k):
    prompt = PROMPTS[0]
    tr = run(shakespeare, prompt, n=20, num_drafts=k, ngram_source="prompt")
    n_prompt = len(tr.prompt_ids)
    assert len(tr.output_ids) == 20
    assert tr.stats["target_forwards"] == 20  # the prompt's pass, then one per further token
    assert [s.target_forwards for s in tr.steps] == list(range(1, 21))  # cumulative: one more a step
    assert tr.stats["target_tokens_processed"] == n_prompt + 19  # one position a step, whatever k
    beam = prepare(model=shakespeare, decoder="beam", prompt=prompt, max_new_tokens=20,
                   params={"num_beams": k})
    beam.ctx.stop_ids = set()
    bt = beam.finish()
    # beam search also takes one (batched) forward a step, but runs k rows through it
    assert bt.stats["target_tokens_processed"] == n_prompt + k * 19


def test_output_rank_picks_that_draft(shakespeare):
    tr = run(shakespeare, PROMPTS[2], n=10, num_drafts=3, output_rank=2, ngram_source="prompt")
    assert tr.output_ids == tr.stats["drafts"][2]["ids"] != tr.stats["drafts"][0]["ids"]


def test_a_stop_finishes_drafts_and_ends_the_run_once_none_can_beat_it(shakespeare):
    r = prepare(model=shakespeare, decoder="superposed", prompt="ROMEO.\nI", max_new_tokens=40,
                stop=["\n"], params={"num_drafts": 3, "ngram_source": "prompt"})
    tr = r.finish()
    steps = [s.to_dict() for s in tr.steps]
    finished = [b for s in steps for b in s["beams"] if b["finished"]]
    assert finished and all("\n" in shakespeare.decode(b["ids"][-2:]) for b in finished)
    last = steps[-1]
    running = [b["score"] for b in last["beams"] if not b["finished"]]
    best_done = max(d["score"] for d in tr.stats["drafts"] if d["finished"])
    assert len(steps) == 40 or not running or best_done >= max(running) - 1e-5
    assert tr.stats["finish_reason"] == "stop" and "\n" in tr.text
    # a stopped cell is never a kept one
    for s in steps:
        ev = s["superposed"]
        assert not any(a and b for ra, rb in zip(ev["kept"], ev["stopped"]) for a, b in zip(ra, rb))


def test_plots_draw_the_recorded_grid_and_weights(shakespeare):
    r = prepare(model=shakespeare, decoder="superposed", prompt=PROMPTS[0], max_new_tokens=6,
                params={"num_drafts": 3, "ngram_source": "prompt"})
    r.ctx.stop_ids = set()
    r.finish()
    d = r.snapshot()
    fig = candidate_grid_figure(d, 2)
    heat = fig.data[0]
    assert [list(row) for row in heat.z] == d["steps"][2]["superposed"]["score"]
    marks = [m for row in heat.text for m in row]
    assert marks.count("✓") == 3
    w = weights_figure(d)
    sums = np.sum([list(tr.y) for tr in w.data], axis=0)
    np.testing.assert_allclose(sums, 1.0, rtol=1e-9)
    for odd in ({}, {"steps": [{"kind": "beam", "superposed": {"score": "x"}}]}, {"steps": "no"}):
        assert candidate_grid_figure(odd, 0) is not None and weights_figure(odd) is not None


@pytest.mark.parametrize("knobs,needle", [
    ({"num_drafts": 0}, "num_drafts"), ({"num_drafts": 17}, "num_drafts"), ({"ngram_order": 5}, "ngram_order"),
    ({"ngram_weight": 1.5}, "ngram_weight"), ({"mix": "max"}, "mix"), ({"ngram_source": "web"}, "ngram_source"),
    ({"num_drafts": 2, "output_rank": 2}, "output_rank"), ({"beams": 2}, "beams"),
])
def test_bad_knobs_are_one_line(shakespeare, knobs, needle):
    with pytest.raises(PlaygroundError) as e:
        prepare(model=shakespeare, decoder="superposed", prompt="a", max_new_tokens=4, params=knobs)
    assert "\n" not in str(e.value) and needle in str(e.value)


def test_weights_are_normalised_probabilities():
    assert softmax_weights([0.0]) == [1.0]
    np.testing.assert_allclose(softmax_weights([math.log(0.2), math.log(0.6)]), [0.25, 0.75], rtol=1e-12)
    assert softmax_weights([-1e9, 0.0]) == [0.0, 1.0]
