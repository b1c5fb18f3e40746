"""Words and biases: logit_bias, bad_words, token healing, and lexically constrained beam search
with dynamic beam allocation (constrained_beam); and the constraint views."""

from __future__ import annotations

import json

import pytest

from decoders.guided.constrained_beam import Progress, bank_sizes
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from visualizers import run_figures, step_figures
from visualizers.guided import constraint_figure, constraint_run_figure

PROMPT = "ROMEO: But soft, what light"


def run(handle, decoder, prompt, n, seed=0, stop_ids=None, **params):
    r = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed, params=params)
    if stop_ids is not None:
        r.ctx.stop_ids = set(stop_ids)
    return r.finish()


def contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


# ---------------------------------------------------------------------- logit_bias
def test_logit_bias_by_id_bans_and_forces(llama_handle):
    free = run(llama_handle, "greedy", PROMPT, 10, stop_ids=set()).output_ids
    banned = run(llama_handle, "greedy", PROMPT, 10, stop_ids=set(), logit_bias=json.dumps({str(free[0]): -100}))
    assert free[0] not in banned.output_ids[:1]
    assert banned.steps[0].evidence["constraint"]["biased"] is True
    forced = run(llama_handle, "greedy", PROMPT, 6, stop_ids=set(), logit_bias=json.dumps({"42": 100}))
    assert forced.output_ids == [42] * 6


def test_logit_bias_by_text_is_one_token(llama_handle):
    tok = llama_handle.tokenizer
    word = next(w for w in (" the", "the", " and", "e") if len(tok.encode(w, add_special_tokens=False)) == 1)
    tid = tok.encode(word, add_special_tokens=False)[0]
    tr = run(llama_handle, "greedy", PROMPT, 4, stop_ids=set(), logit_bias=json.dumps({word: 100}))
    assert tr.output_ids == [tid] * 4
    with pytest.raises(PlaygroundError, match="not one"):
        run(llama_handle, "greedy", PROMPT, 4, logit_bias=json.dumps({"wherefore art thou": 5}))


def test_logit_bias_shifts_the_sampled_distribution(llama_handle):
    # +bias b multiplies a token's odds by e^b: the recorded raw distribution is the model's,
    # and the mask removes nothing, so removed mass is 0 while the pick follows the bias
    tr = run(llama_handle, "sample", PROMPT, 3, stop_ids=set(), temperature=1.0, logit_bias=json.dumps({"7": 30}))
    assert tr.output_ids == [7, 7, 7]
    assert all(s.evidence["constraint"]["removed_mass"] == 0 for s in tr.steps)


# ---------------------------------------------------------------------- bad_words
def test_bad_words_sequence_never_produced(llama_handle):
    tok = llama_handle.tokenizer
    free = run(llama_handle, "greedy", PROMPT, 24, stop_ids=set()).output_ids
    text = tok.decode(free)
    words = [w for w in text.split() if w.isalpha() and len(tok.encode(" " + w, add_special_tokens=False)) >= 2]
    assert words, f"the fixed tiny model should produce a multi-token word: {text!r}"
    w = words[0]
    seqs = [tok.encode(v, add_special_tokens=False) for v in (w, " " + w)]
    tr = run(llama_handle, "greedy", PROMPT, 24, stop_ids=set(), bad_words=json.dumps([w]))
    assert not any(contains(tr.output_ids, s) for s in seqs)
    # identical up to where the banned sequence was completed
    first = min(i for i in range(len(free)) for s in seqs if free[i:i + len(s)] == s)
    assert tr.output_ids[:first] == free[:first]


def test_bad_words_under_sampling_over_seeds(llama_handle):
    tok = llama_handle.tokenizer
    banned = ["the", "and", "is"]
    seqs = [tok.encode(v, add_special_tokens=False) for w in banned for v in (w, " " + w)]
    for seed in range(6):
        tr = run(llama_handle, "top_k", PROMPT, 20, seed=seed, stop_ids=set(), k=50, bad_words=",".join(banned))
        assert not any(contains(tr.output_ids, s) for s in seqs), seed


# ---------------------------------------------------------------------- token healing
def test_token_healing_extends_the_last_prompt_token(llama_handle):
    tok = llama_handle.tokenizer
    prompt = "ROMEO: But so"
    ids = tok.encode(prompt, add_special_tokens=False)
    last = tok.decode([ids[-1]])
    tr = run(llama_handle, "greedy", prompt, 8, stop_ids=set(), token_healing=True)
    first = tok.decode([tr.output_ids[0]])
    assert first.startswith(last)
    special = set(tok.all_special_ids)
    expected = sum(1 for t in range(llama_handle.vocab_size)
                   if t not in special and tok.decode([t]).startswith(last))
    assert tr.steps[0].evidence["constraint"]["allowed"] == expected
    assert "constraint" not in tr.steps[1].evidence or tr.steps[1].evidence["constraint"]["allowed"] == llama_handle.vocab_size
    assert tr.stats["token_healing"] == {"prompt_token": ids[-1], "text": last}
    # the prompt minus its last token, then the output, re-spells the whole prompt
    assert tok.decode(ids[:-1] + tr.output_ids).startswith(prompt)


# ---------------------------------------------------------------------- constrained beam
def test_bank_sizes_dynamic_allocation():
    assert bank_sizes(6, [10, 10, 10]) == [2, 2, 2]
    assert bank_sizes(7, [10, 10, 10]) == [2, 2, 3]   # the remainder to the most forced tokens
    assert bank_sizes(6, [10, 0, 1]) == [5, 0, 1]     # empty banks hand their slots on
    assert bank_sizes(4, [1, 1, 1]) == [1, 1, 1]      # fewer candidates than slots
    assert sum(bank_sizes(5, [3, 9, 2, 7])) == 5


def test_progress_tracks_phrases():
    phrases = [[5, 6, 7], [9]]
    p = Progress()
    assert p.wanted(phrases) == [5, 9]
    p = p.after(5, phrases).after(6, phrases)
    assert p.count(phrases) == 2 and p.wanted(phrases) == [7]
    broken = p.after(1, phrases)  # interrupted: starts over
    assert broken.count(phrases) == 0 and broken.phrase == -1
    done = p.after(7, phrases).after(9, phrases)
    assert done.met == {0, 1} and done.count(phrases) == 4 and done.wanted(phrases) == []


@pytest.mark.parametrize("words", [["crown"], ["crown", "Juliet"], ["the king of France"]])
def test_constrained_beam_output_contains_forced_words(words):
    from decoders.guided.constrained_beam import phrases_of
    from playground.core.models import load_model

    h = load_model("tiny-shakespeare")
    tr = run(h, "constrained_beam", "ROMEO: But soft", 30, force_words=json.dumps(words), num_beams=6)
    for ph in phrases_of(h, json.dumps(words)):
        assert contains(tr.output_ids, ph), (ph, tr.text)
    assert tr.stats["forced_met"] == tr.stats["forced_total"] == len(words)
    for s in tr.steps:
        for b in s.evidence["beams"]:
            if b["finished"]:  # nothing ends before every phrase is in
                assert all(contains(b["ids"], ph) for ph in phrases_of(h, json.dumps(words)))


def test_constrained_beam_errors_are_one_line(llama_handle):
    with pytest.raises(PlaygroundError, match="needs force_words"):
        run(llama_handle, "constrained_beam", PROMPT, 5)
    with pytest.raises(PlaygroundError, match="force_words|bad_words"):
        run(llama_handle, "constrained_beam", PROMPT, 5, force_words="[1]")


def test_constrained_beam_too_short_reports_what_it_met(llama_handle):
    tr = run(llama_handle, "constrained_beam", PROMPT, 2, force_words=json.dumps(["wherefore art thou Romeo"]))
    assert tr.stats["forced_met"] == 0 and tr.stats["forced_total"] == 1
    assert tr.stats["finish_reason"] == "length"


# ---------------------------------------------------------------------- views
def test_constraint_views_draw_real_and_partial_traces(llama_handle):
    tr = run(llama_handle, "greedy", PROMPT, 6, regex=r"[a-z]{2,4}( [a-z]{2,4}){1,3}\.").to_dict()
    titles = [t for t, _ in step_figures(tr, 1)]
    assert "Constraint" in titles
    assert "Constraint over the run" in [t for t, _ in run_figures(tr)]
    fig = constraint_figure(tr, 1)
    ev = tr["steps"][1]["constraint"]
    assert {d.name for d in fig.data} >= {"allowed"}
    assert f"{ev['allowed']} of {ev['vocab']} tokens allowed" in fig.layout.title.subtitle.text
    run_fig = constraint_run_figure(tr)
    assert list(run_fig.data[0].y) == pytest.approx([s["constraint"]["removed_mass"] for s in tr["steps"]])
    # partial and odd evidence never raises
    for odd in ({}, {"steps": [{"kind": "token"}]}, {"steps": [{"kind": "token", "constraint": {"allowed": "x"}}]},
                {"steps": [{"kind": "token", "constraint": {"top_allowed": {"ids": [1, 2], "probs": [0.5]}}}]}):
        constraint_figure(odd, 0)
        constraint_run_figure(odd)
