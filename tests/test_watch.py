"""Watched tokens: every step records each watched token's raw and final probability and raw
rank, equal to the model's softmax recomputed at that position, however far outside the top-K;
words, ``#id`` and ids resolve (a word of several tokens watches its first and says so); the
API, compare and the CLI take ``watch``; the run plot draws it, also from a replayed trace."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
import torch

import playground
import visualizers
from playground.cli import main as cli_main
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from playground.core.trace import Trace
from visualizers.watch import watch_figure, watch_rows

MODEL, DRAFT = "tiny-shakespeare", "tiny-shakespeare-draft"
PROMPT = "ROMEO: But soft"
WATCH = ["Juliet", " the", "#14", "wherefore"]


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL)


def softmax_at(model, ids: list[int]) -> torch.Tensor:
    return torch.softmax(model.forward(ids).logits[0, -1].float(), -1)


@pytest.fixture(scope="module")
def top_k_run():
    return playground.generate(model=MODEL, decoder="top_k", prompt=PROMPT, max_new_tokens=5, seed=2, k=5,
                               watch=WATCH)


def test_the_watch_list_resolves_words_ids_and_first_tokens(top_k_run, model):
    entries = top_k_run["watch"]
    tok = model.tokenizer
    assert [e["token"] for e in entries] == [tok.encode("Juliet", add_special_tokens=False)[0],
                                             tok.encode(" the", add_special_tokens=False)[0], 14,
                                             tok.encode("wherefore", add_special_tokens=False)[0]]
    assert len(tok.encode("wherefore", add_special_tokens=False)) > 1
    assert "2 tokens" in entries[3]["note"] and "note" not in entries[0]
    assert entries[2]["word"] == tok.decode([14])


def test_watched_probabilities_equal_the_models_softmax_at_every_step(top_k_run, model):
    ids = list(top_k_run["prompt_ids"])
    far = 0
    for s in top_k_run["steps"]:
        p = softmax_at(model, ids)
        for key, e in s["watch"].items():
            t = int(key)
            assert e["raw_p"] == pytest.approx(float(p[t]), rel=1e-3, abs=1e-12)
            assert e["raw_rank"] == int((p > p[t]).sum())
            # top-k 5: the final probability is the renormalised one inside the top 5, else 0
            top5 = torch.topk(p, 5).indices.tolist()
            want = float(p[t] / p[top5].sum()) if t in top5 else 0.0
            assert e["final_p"] == pytest.approx(want, rel=1e-3, abs=1e-12)
            far += e["raw_rank"] >= 20  # outside the recorded top-K: only the watch sees it
        ids += s["committed"]
    assert far > 0


def test_speculative_steps_record_the_watch_per_committed_token(model):
    tr = playground.generate(model=MODEL, draft=DRAFT, decoder="speculative", prompt=PROMPT, max_new_tokens=8,
                             watch=[" the", "#14"])
    ids = list(tr["prompt_ids"])
    for s in tr["steps"]:
        assert s["kind"] == "draft" and len(s["watch"]) == len(s["committed"])
        for tok, ev in zip(s["committed"], s["watch"]):
            p = softmax_at(model, ids)
            for key, e in ev.items():
                assert e["raw_p"] == pytest.approx(float(p[int(key)]), rel=1e-3, abs=1e-12)
            ids.append(tok)
    assert len(watch_rows(tr)) == len(tr["output_ids"])


def test_bad_watch_lists_are_one_line_errors():
    for bad, msg in ((["#999999"], "outside the vocabulary"), ([True], "word or a token id"),
                     ({"a": 1}, "must be a list"), ([f"#{i}" for i in range(17)], "at most 16"), ([""], "empty")):
        with pytest.raises(PlaygroundError, match=msg):
            playground.generate(model=MODEL, decoder="greedy", prompt=PROMPT, max_new_tokens=1, watch=bad)


def test_without_a_watch_list_nothing_is_recorded():
    tr = playground.generate(model=MODEL, decoder="greedy", prompt=PROMPT, max_new_tokens=2)
    assert "watch" not in tr and all("watch" not in s for s in tr["steps"])


def test_compare_and_the_cli_take_watch():
    lanes = playground.compare(lanes=["greedy", {"decoder": "top_p", "knobs": {"p": 0.5}}], model=MODEL,
                               prompt=PROMPT, max_new_tokens=3, watch="Juliet, #14")
    assert all([e["token"] for e in t["watch"]][1] == 14 and all("14" in s["watch"] for s in t["steps"])
               for t in lanes)
    assert lanes[0]["watch"][0]["word"] == "Juliet"
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["generate", "--model", MODEL, "--prompt", PROMPT, "--max-new-tokens", "2",
                         "--watch", " the,#14", "--watch", "Juliet", "--json"]) == 0
    tr = json.loads(out.getvalue())
    the = load_model(MODEL).tokenizer.encode(" the", add_special_tokens=False)
    assert [e["token"] for e in tr["watch"]][:2] == [the[0], 14] and tr["watch"][0]["word"] == " the"
    assert all(len(s["watch"]) == 3 for s in tr["steps"])


def test_the_run_plot_draws_each_watched_token_also_on_replay(top_k_run):
    replay = Trace.from_dict(json.loads(json.dumps(top_k_run))).to_dict()
    assert replay["watch"] == top_k_run["watch"]
    for wid in (e["token"] for e in top_k_run["watch"]):
        assert str(wid) in top_k_run["tokens"]  # a replay labels it without a tokenizer
    titles = [t for t, _ in visualizers.run_figures(replay)]
    assert "Watched tokens" in titles
    fig = watch_figure(replay)
    assert len(fig.data) == 2 * len(top_k_run["watch"])
    assert all(len(d.x) == len(top_k_run["steps"]) for d in fig.data)
    assert "2 tokens" in fig.layout.title.subtitle.text
    assert watch_figure({}).layout.annotations
