"""Ouroboros (phrase-pool extended drafts): greedy's output at temperature 0 on the bundled
models, the target's law at temperature 1 (chi-square against the enumerated law), the pool
and every lookup replayed by hand from independent target forwards, phrases=0 is plain
``speculative``, the pool's phrases really lengthen accepted drafts on repetitive text, the
pool cap holds, knob errors are one line, and the views draw."""

from __future__ import annotations

import json
from collections import Counter

import plotly.graph_objects as go
import pytest
import torch

import visualizers as V
from decoders.speculative.ouroboros import PhrasePool, text_phrases, verify_phrases
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.engine import prepare
from test_speculative_dist import chi_square_p, exact_law
from test_visualizers import render_everything

PROMPTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n",
    "[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter",  # repetitive
]
REPEATING = PROMPTS[3]


@pytest.fixture(scope="module")
def models():
    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-draft", device="cpu")


def _run(models, decoder, prompt, n, seed=0, **params):
    target, draft = models
    if decoder != "greedy":
        params.setdefault("temperature", 0.0)
    r = prepare(model=target, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                draft=draft if decoder != "greedy" else None, params=params)
    r.ctx.stop_ids = set()
    return r.finish()


# ---------------------------------------------------------------------- the pieces
def test_pool_keeps_one_phrase_per_key_and_evicts_the_least_recently_used():
    pool = PhrasePool(2)
    assert pool.add([1], [5, 6], "text") and not pool.add([1], [5], "verify")  # a prefix keeps the longer
    assert pool.get([1]) == ((5, 6), "text")
    assert pool.add([1], [7], "verify") and pool.get([1]) == ((7,), "verify")  # a different phrase replaces
    pool.add([2], [8], "text")
    assert pool.get([1]) is not None  # key 1 is now the most recently used ...
    pool.add([3], [9], "text")  # ... so key 2 goes
    assert len(pool) == 2 and pool.get([2]) is None and pool.evicted == 1


def test_phrase_harvest_rules():
    assert text_phrases([1, 2, 3, 4, 5], 0, 2, 2) == [([1, 2], [3, 4]), ([2, 3], [4, 5])]
    assert text_phrases([1, 2, 3, 4, 5], 3, 2, 2) == [([2, 3], [4, 5])]
    assert text_phrases([1, 2, 3, 4, 5], 4, 2, 2) == []
    # drafted 7 8 9 after context 1 2; the target's argmax after each drafted token: 8, 4, 6.
    # From drafted token 0 (first not accepted): after 7 the target says 8, the draft went on
    # with 8, so the target's 4 after it follows; the draft's 9 is not 4, so the phrase stops.
    got = verify_phrases([1, 2], [7, 8, 9], [8, 4, 6], 0, 2, 3)
    assert got == [([2, 7], [8, 4]), ([7, 8], [4]), ([8, 9], [6])]
    assert verify_phrases([1, 2], [7, 8, 9], [8, 4, 6], 2, 2, 3) == [([8, 9], [6])]


# ---------------------------------------------------------------------- exactness
GREEDY_KNOBS = [{}, {"phrases": 4, "phrase_len": 8, "key_len": 1}, {"pool_size": 1, "gamma": 2},
                {"pool_from": "verify", "gamma": 1}, {"pool_from": "text", "key_len": 3}]


@pytest.fixture(scope="module")
def greedy_refs(models):
    return {(p, n): _run(models, "greedy", p, n).output_ids for p in PROMPTS for n in (13, 40)}


@pytest.mark.parametrize("knobs", GREEDY_KNOBS)
def test_greedy_output_equals_plain_greedy(models, greedy_refs, knobs):
    for prompt in PROMPTS:
        for n in (13, 40):
            ref = greedy_refs[(prompt, n)]
            tr = _run(models, "ouroboros", prompt, n, **knobs)
            assert tr.output_ids == ref, f"{knobs} on {prompt[:20]!r}, {n} tokens"
            assert [t for s in tr.steps for t in s.committed] == ref
            assert tr.stats["lossless_mismatch"] == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_no_phrases_is_plain_speculative(models, temperature):
    """phrases=0: step for step the draft model's chain of ``speculative`` (confidence rules
    off), the same tokens drafted, verified and committed, at temperature 1 with the same seed too."""
    knobs = {"gamma": 3, "temperature": temperature, "top_k": 20}
    for prompt in (PROMPTS[0], REPEATING):
        a = _run(models, "ouroboros", prompt, 30, seed=4, phrases=0, **knobs)
        b = _run(models, "speculative", prompt, 30, seed=4, confidence=0.0, **knobs)
        assert a.output_ids == b.output_ids
        assert [s.evidence["tree"] for s in a.steps] == [s.evidence["tree"] for s in b.steps]
        assert a.stats["target_forwards"] == b.stats["target_forwards"]


def _target_argmax(target, ids: list[int]) -> int:
    """The target's argmax after ``ids``, from a fresh forward without any cache."""
    with torch.no_grad():
        return int(torch.argmax(target.forward(list(ids)).logits[0, -1]))


def test_pool_and_lookups_replay_from_independent_forwards(models):
    """The pool rebuilt by hand: the prompt's and the committed text's phrases, and the
    target's continuations after every drafted token past the accepted prefix, each from a
    fresh forward; every lookup's key, hit, phrase and appended tokens, the pool's size and
    the count of phrases added agree with the trace."""
    target, _ = models
    K, L = 2, 4
    tr = _run(models, "ouroboros", REPEATING, 30, key_len=K, phrase_len=L, phrases=2, gamma=3)
    pool: dict[tuple, tuple] = {}

    def add(key, phrase) -> int:
        key, phrase = tuple(key), tuple(phrase)
        old = pool.get(key)
        if old is not None and old[:len(phrase)] == phrase:
            return 0
        pool[key] = phrase
        return 1

    prompt, out = list(tr.prompt_ids), []
    changes = sum(add(prompt[i - K:i], prompt[i:i + L]) for i in range(K, len(prompt) - L + 1))
    done = len(prompt) - L + 1
    hits = 0
    for step in tr.steps:
        ev, nodes = step.evidence["ouroboros"], step.evidence["tree"]["nodes"]
        before = prompt + out
        assert ev["pool_size"] == len(pool)
        drafted = [n["token"] for n in nodes]
        model = [n["token"] for n in nodes if n["source"] == "draft-model"]
        assert [n["source"] for n in nodes] == ["draft-model"] * len(model) + ["pool"] * (len(nodes) - len(model))
        assert len(model) == min(3, 29 - len(out))
        tail, appended = before + model, []
        for look in ev["lookups"]:
            assert look["key"] == tail[-K:]
            assert look["hit"] == (tuple(look["key"]) in pool)
            if look["hit"]:
                hits += 1
                assert tuple(look["phrase"]) == pool[tuple(look["key"])]
                used = look["phrase"][:look["used"]]
                appended += used
                tail += used
        assert drafted == model + appended
        a = len(step.evidence["tree"]["accepted_path"])
        assert ev["accepted"]["pool"] == sum(1 for n in nodes[:a] if n["source"] == "pool")
        for j in range(a, len(drafted)):
            ctx = before + drafted[:j + 1]
            phrase = [_target_argmax(target, ctx)]
            while len(phrase) < L and j + len(phrase) < len(drafted) and drafted[j + len(phrase)] == phrase[-1]:
                phrase.append(_target_argmax(target, ctx + phrase))
            changes += add(ctx[-K:], phrase)
        out += step.committed
        seq = prompt + out
        changes += sum(add(seq[i - K:i], seq[i:i + L]) for i in range(max(done, K), len(seq) - L + 1))
        done = max(done, len(seq) - L + 1)
        assert ev["added_count"] == changes, f"step {step.evidence}"
        changes = 0
        assert ev["pool_size_after"] == len(pool)
    assert hits > 0 and tr.stats["pool_hits"] == hits


# ---------------------------------------------------------------------- the pool helps
def test_pool_phrases_are_used_on_repetitive_text(models):
    """On repetitive text the pool hits, its tokens are accepted, and a step commits more per
    target forward than speculative (its defaults, and the same γ with no confidence stop)."""
    tr = _run(models, "ouroboros", REPEATING, 60)
    st = tr.stats
    assert st["pool_hits"] > 0 and st["pool_tokens_accepted"] > 0
    assert st["source_share"]["pool"] > 0.1
    assert st["tokens_per_target_forward"] == round(60 / st["target_forwards"], 4)
    for knobs in ({}, {"gamma": 4, "confidence": 0.0}):
        plain = _run(models, "speculative", REPEATING, 60, **knobs)
        assert st["tokens_per_target_forward"] >= plain.stats["tokens_per_target_forward"], knobs
        assert st["target_forwards"] <= plain.stats["target_forwards"]
    # the pool costs no draft forwards: a pool token in a step adds none
    assert st["draft_forwards"] <= _run(models, "speculative", REPEATING, 60, gamma=4,
                                        confidence=0.0).stats["draft_forwards"]


def test_pool_cap_holds_and_evicts(models):
    ref = _run(models, "greedy", PROMPTS[2], 40).output_ids
    tr = _run(models, "ouroboros", PROMPTS[2], 40, pool_size=3)
    assert tr.output_ids == ref
    evs = [s.evidence["ouroboros"] for s in tr.steps]
    assert all(e["pool_size_after"] <= 3 for e in evs) and sum(e["evicted"] for e in evs) > 0


@pytest.mark.parametrize("origin", ["text", "verify"])
def test_pool_from_fills_the_pool_from_that_source_only(models, origin):
    tr = _run(models, "ouroboros", REPEATING, 40, pool_from=origin)
    evs = [s.evidence["ouroboros"] for s in tr.steps]
    added = [a["from"] for e in evs for a in e["added"]]
    used = [x["from"] for e in evs for x in e["lookups"] if x["hit"]]
    assert added and set(added) == {origin} and set(used) <= {origin}


# ---------------------------------------------------------------------- sampling is lossless
# The target's own greedy loop on this text: under top-2 sampling it mostly goes on with it,
# so the prompt's phrases are proposed by the pool and both accepted and rejected.
LOOP = "CLOWN.\nI am glad to see you.\n\nCLOWN.\nI am glad to see you.\n\nCLOWN.\nI am"


@pytest.mark.slow
def test_sampling_follows_the_target_law(models):
    """Temperature 1, top-k 2: over 500 fixed seeds the first four tokens follow the target's
    enumerated law (chi-square), while pool tokens were both accepted and rejected."""
    target, _ = models
    chain = {"temperature": 1.0, "top_k": 2}
    counts: Counter = Counter()
    tried = accepted = 0
    runs = 500
    for seed in range(runs):
        tr = _run(models, "ouroboros", LOOP, 4, seed=seed, gamma=1, phrases=2, key_len=2, **chain)
        counts[tuple(tr.output_ids)] += 1
        for s in tr.steps:
            for n in s.evidence["tree"]["nodes"]:
                if n["source"] == "pool" and n["accept_prob"] is not None:
                    tried += 1
                    accepted += bool(n["accepted"])
    assert accepted >= 50 and tried - accepted >= 50, f"pool tokens: {accepted} of {tried} accepted"
    law = exact_law(target, list(tr.prompt_ids), chain, 4)
    p = chi_square_p(counts, law, runs)
    assert p > 1e-3, f"chi-square p = {p:.2e}"


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("knob,value", [("phrase_len", 0), ("phrase_len", 17), ("key_len", 5), ("pool_size", 0),
                                        ("phrases", -1), ("gamma", 0), ("pool_from", "web"), ("phrase_length", 3)])
def test_bad_knobs_are_one_line(models, knob, value):
    with pytest.raises(PlaygroundError) as e:
        _run(models, "ouroboros", PROMPTS[0], 5, **{knob: value})
    assert "\n" not in str(e.value) and knob in str(e.value)


def test_missing_draft_is_one_line(models):
    with pytest.raises(PlaygroundError) as e:
        prepare(model=models[0], decoder="ouroboros", prompt="ROMEO:")
    assert "\n" not in str(e.value) and "draft" in str(e.value)


# ---------------------------------------------------------------------- views
def test_views_draw_sources_verdicts_and_the_pool(models):
    tr = json.loads(_run(models, "ouroboros", REPEATING, 40).to_json())
    steps = tr["steps"]
    i = next(j for j, s in enumerate(steps) if s["ouroboros"]["pool_tokens"] and s["ouroboros"]["accepted"]["pool"])
    titles = [t for t, _ in V.step_figures(tr, i)]
    assert titles[:2] == ["Draft tree", "Phrase-extended draft"]
    fig = V.ouroboros.draft_sources_figure(tr, i)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    nodes = steps[i]["tree"]["nodes"]
    assert sum(y is not None for y in bars["pool phrase"].y) == steps[i]["ouroboros"]["pool_tokens"]
    assert sum(y is not None for y in bars["draft model"].y) == steps[i]["ouroboros"]["model_tokens"]
    (verdict,) = [t for t in fig.data if t.name == "verdict"]
    assert list(verdict.marker.symbol).count("circle") == len(steps[i]["tree"]["accepted_path"]) <= len(nodes)
    run = dict(V.run_figures(tr))["Phrase pool over the run"]
    acc = {t.name: list(t.y) for t in run.data if t.type == "bar"}
    assert sum(acc["accepted: pool phrase"]) == tr["stats"]["pool_tokens_accepted"]
    (rate,) = [t for t in run.data if t.name == "pool hit rate so far"]
    assert rate.y[-1] == pytest.approx(tr["stats"]["pool_hit_rate"], abs=1e-4)
    render_everything(tr)  # every plot of every step, as the page draws them
    for partial in ({}, {"steps": [{"kind": "draft", "ouroboros": {"lookups": None}, "tree": {}}]},
                    {"steps": [{"kind": "draft", "ouroboros": {"accepted": 3}, "tree": {"nodes": [{"id": 0}]}}]}):
        for f in (V.ouroboros.draft_sources_figure(partial, 0), V.ouroboros.pool_run_figure(partial)):
            assert isinstance(f, go.Figure) and "could not draw" not in f.to_json()
