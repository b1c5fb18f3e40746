"""``span_extract`` (decoders/guided/span.py): the output is always a span of the passage, the
exact mode's table and answer equal a brute force that scores every span with its own forward,
the greedy mode equals a step-by-step constrained argmax recomputed without a cache, the free
greedy record is plain greedy, bad knobs are one line, and the views draw the evidence."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SAMPLE_TEXT
from decoders.guided.span import MAX_PASSAGE_TOKENS, is_span, passage_ids
from playground.core.errors import PlaygroundError
from playground.engine import prepare

PASSAGE = "It is the east, and Juliet is the sun."
PROMPTS = ["ROMEO: But soft", "JULIET: O Romeo", "Who is the sun? Answer:", "HAMLET: To be"]
WORDS = SAMPLE_TEXT.split()


def run(handle, prompt, n=12, **knobs):
    return prepare(model=handle, decoder="span_extract", prompt=prompt, max_new_tokens=n, params=knobs).finish()


def full_logits(handle, ids):
    """Every position's next-token logits for ``ids``, by one plain uncached forward."""
    with torch.no_grad():
        return handle.model(input_ids=torch.tensor([list(ids)])).logits[0].float()


def span_part(handle, out):
    """The output without its end token."""
    return out[:-1] if out and out[-1] in handle.eos_ids else list(out)


# ---------------------------------------------------------------------- always a span
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(start=st.integers(0, len(WORDS) - 30), words=st.integers(1, 25), prompt=st.sampled_from(PROMPTS),
       mode=st.sampled_from(["greedy", "exact"]), max_span=st.integers(1, 8), n=st.integers(1, 10),
       penalty=st.sampled_from([0.0, 0.5, 1.0]), score_end=st.booleans())
def test_output_is_always_a_span_of_the_passage(llama_handle, start, words, prompt, mode, max_span, n, penalty,
                                                score_end):
    passage = " ".join(WORDS[start:start + words])
    tr = run(llama_handle, prompt, n, passage=passage, mode=mode, max_span=max_span, length_penalty=penalty,
             score_end=score_end, compare_free=False).to_dict()
    ids = passage_ids(llama_handle, passage)
    span = span_part(llama_handle, tr["output_ids"])
    assert 1 <= len(span) <= min(max_span, n)
    assert is_span(span, ids)
    assert len(tr["output_ids"]) <= n
    st_span = tr["stats"]["span"]
    assert ids[st_span["start"]:st_span["start"] + st_span["length"]] == span
    json.dumps(tr, allow_nan=False)  # strict JSON: a stored session can read it


def test_is_span_is_a_contiguous_sub_sequence():
    assert is_span([2, 3], [1, 2, 3, 4]) and is_span([], [1]) and is_span([1, 2, 3, 4], [1, 2, 3, 4])
    assert not is_span([2, 4], [1, 2, 3, 4]) and not is_span([4, 1], [1, 2, 3, 4])


# ---------------------------------------------------------------------- exact = brute force
def brute_table(handle, prompt_ids, passage, max_span, score_end):
    """log P(span) of every (start, length), each span recomputed by its own forward."""
    ends = sorted(handle.eos_ids)
    plen = len(prompt_ids)
    table = []
    for i in range(len(passage)):
        row = []
        for m in range(1, min(max_span, len(passage) - i) + 1):
            span = passage[i:i + m]
            lp = torch.log_softmax(full_logits(handle, prompt_ids + span), -1)
            v = sum(float(lp[plen - 1 + d, span[d]]) for d in range(m))
            if score_end:
                v += float(torch.logsumexp(lp[plen - 1 + m, ends], -1))
            row.append(v)
        table.append(row)
    return table


@pytest.mark.parametrize("prompt,penalty,score_end", [
    ("ROMEO: But soft", 0.0, True), ("JULIET: O Romeo", 1.0, True), ("Who is the sun? Answer:", 0.5, False),
    ("HAMLET: To be", 1.0, False),
])
def test_exact_mode_equals_brute_force_over_all_spans(llama_handle, prompt, penalty, score_end):
    max_span = 5
    tr = run(llama_handle, prompt, 12, passage=PASSAGE, mode="exact", max_span=max_span, length_penalty=penalty,
             score_end=score_end, compare_free=False).to_dict()
    passage = passage_ids(llama_handle, PASSAGE)
    prompt_ids = tr["prompt_ids"]
    want = brute_table(llama_handle, prompt_ids, passage, max_span, score_end)
    got = tr["steps"][0]["span_scores"]["logp"]
    assert [len(r) for r in got] == [len(r) for r in want]
    for gr, wr in zip(got, want):
        for g, w in zip(gr, wr):
            assert g == pytest.approx(w, abs=2e-3)
    scored = [((w / m ** penalty) if penalty else w, i, m) for i, wr in enumerate(want) for m, w in enumerate(wr, 1)]
    best = max(s for s, _, _ in scored)
    i, m = tr["steps"][0]["span_scores"]["best"]
    # the run's best is the brute force's (up to float noise between a batched and a plain forward)
    assert (want[i][m - 1] / m ** penalty if penalty else want[i][m - 1]) == pytest.approx(best, abs=2e-3)
    top = sorted(scored, reverse=True)
    if top[0][0] - top[1][0] > 1e-2:
        assert (i, m) == top[0][1:]
    assert span_part(llama_handle, tr["output_ids"]) == passage[i:i + m]
    if score_end:
        assert tr["output_ids"][-1] in llama_handle.eos_ids and tr["stats"]["finish_reason"] == "eos"


def test_exact_mode_costs_one_batched_forward_per_sixteen_starts(llama_handle):
    passage = " ".join(WORDS[:30])
    n_tok = len(passage_ids(llama_handle, passage))
    tr = run(llama_handle, "ROMEO:", 10, passage=passage, mode="exact", compare_free=False)
    assert tr.stats["target_forwards"] == 1 + math.ceil(n_tok / 16)


# ---------------------------------------------------------------------- greedy = brute force
def brute_greedy(handle, prompt_ids, passage, max_span, n):
    """The constrained argmax step by step: allowed = tokens t with out + [t] a span of the
    passage (while under max_span), plus the end token once a token is out."""
    ends = sorted(handle.eos_ids)
    out: list[int] = []
    while len(out) < n:
        logits = full_logits(handle, prompt_ids + out)[-1]
        allowed = {t for t in set(passage) if len(out) < max_span and is_span(out + [t], passage)}
        if out:
            allowed |= set(ends)
        if not allowed:
            break
        tok = min(allowed, key=lambda t: (-float(logits[t]), t))
        out.append(tok)
        if tok in ends:
            break
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("max_span", [3, 12])
def test_greedy_mode_equals_step_by_step_constrained_argmax(llama_handle, prompt, max_span):
    tr = run(llama_handle, prompt, 10, passage=PASSAGE, mode="greedy", max_span=max_span, compare_free=False)
    passage = passage_ids(llama_handle, PASSAGE)
    assert tr.output_ids == brute_greedy(llama_handle, tr.prompt_ids, passage, min(max_span, 10), 10)
    # the recorded allowed set: continuations of the live occurrences, plus the end after the first token
    for j, s in enumerate(tr.to_dict()["steps"]):
        ev = s["span"]
        out = tr.output_ids[:j]
        cont = {t for t in set(passage) if is_span(out + [t], passage)} if j < min(max_span, 10) else set()
        assert ev["continuations"] == len(cont)
        assert ev["allowed"] == len(cont) + (len(llama_handle.eos_ids) if j else 0)
        assert ev["live"] == sum(passage[k:k + j] == out for k in range(len(passage)))
        assert s["constraint"]["allowed"] == ev["allowed"]


def test_greedy_and_exact_score_a_span_alike_and_exact_is_never_worse(llama_handle):
    for prompt in PROMPTS:
        g = run(llama_handle, prompt, 12, passage=PASSAGE, mode="greedy", compare_free=False).stats
        e = run(llama_handle, prompt, 12, passage=PASSAGE, mode="exact", compare_free=False).stats
        if g["finish_reason"] == "eos":  # a whole answer: the exact mode's score of it
            assert g["span"]["logprob"] <= e["span"]["logprob"] + 2e-3
        if (g["span"]["start"], g["span"]["length"]) == (e["span"]["start"], e["span"]["length"]):
            assert g["span"]["logprob"] == pytest.approx(e["span"]["logprob"], abs=2e-3)


# ---------------------------------------------------------------------- free greedy vs best span
def test_free_greedy_record_is_plain_greedy(llama_handle):
    prompt = "ROMEO: But soft"
    tr = run(llama_handle, prompt, 8, passage=PASSAGE, mode="exact", max_span=6)
    free = tr.stats["free_greedy"]
    plain = prepare(model=llama_handle, decoder="greedy", prompt=prompt, max_new_tokens=7, params={}).finish()
    assert free["ids"] == span_part(llama_handle, plain.output_ids)[:6]
    # its log-probability, recomputed by one forward
    lp = torch.log_softmax(full_logits(llama_handle, tr.prompt_ids + free["ids"]), -1)
    plen = len(tr.prompt_ids)
    want = sum(float(lp[plen - 1 + d, t]) for d, t in enumerate(free["ids"]))
    if free["ended"]:
        want += float(lp[-1, sorted(llama_handle.eos_ids)[0]])
    assert free["logprob"] == pytest.approx(want, abs=2e-3)
    assert free["is_span"] == is_span(free["ids"], passage_ids(llama_handle, PASSAGE))
    assert tr.stats["span_minus_free_logprob"] == pytest.approx(tr.stats["span"]["logprob"] - free["logprob"], abs=1e-3)
    assert tr.steps[0].evidence["span_scores"]["free_greedy"] == free


# ---------------------------------------------------------------------- knob errors
@pytest.mark.parametrize("knobs,needle", [
    ({"passage": ""}, "passage"),
    ({"passage": " \n\t "}, "empty"),
    ({"passage": " ".join(WORDS[:400])}, f"limit is {MAX_PASSAGE_TOKENS}"),
    ({"passage": "the sun<|endoftext|>"}, "end-of-text"),
    ({"passage": PASSAGE, "max_span": 0}, "max_span"),
    ({"passage": PASSAGE, "max_span": 49}, "max_span"),
    ({"passage": PASSAGE, "mode": "beam"}, "mode"),
    ({"passage": PASSAGE, "length_penalty": 3}, "length_penalty"),
])
def test_bad_knobs_are_one_line(llama_handle, knobs, needle):
    with pytest.raises(PlaygroundError) as e:
        run(llama_handle, "ROMEO:", 4, **knobs)
    assert "\n" not in str(e.value) and needle in str(e.value)


# ---------------------------------------------------------------------- views
def test_views_draw_the_heat_map_the_occurrences_and_the_passage():
    import playground
    import visualizers as V
    from visualizers.span import span_passage_html, span_run_figure, span_scores_figure

    tr = playground.generate(model="tiny-shakespeare", decoder="span_extract", prompt="Who is the sun? Answer:",
                             max_new_tokens=12, passage=PASSAGE + " <b>&", mode="exact", max_span=6)
    ev = tr["steps"][0]["span_scores"]
    n = len(tr["steps"][0]["span"]["passage"]["ids"])
    fig = span_scores_figure(tr)
    heat = fig.data[0]
    assert len(heat.z) == n and len(heat.z[0]) == n
    i, m = ev["best"]
    assert heat.z[i][i + m - 1] == pytest.approx(ev["logp"][i][m - 1])
    assert math.isnan(heat.z[min(i + 1, n - 1)][0]) or i + 1 >= n  # no span ends before it starts
    assert "free greedy" in fig.layout.title.subtitle.text
    run_fig = span_run_figure(tr)
    assert list(run_fig.data[0].y) == [s["span"]["allowed"] for s in tr["steps"]]
    page = span_passage_html(tr, 0)
    assert "<b>" not in page and "&lt;" in page and "&amp;" in page  # the passage is escaped
    assert page.count('class="tok"') == n
    titles = [t for t, _ in V.run_figures(tr)]
    assert "Span scores" in titles and "Span occurrences" in titles
    assert "Passage" in [t for t, _ in V.step_figures(tr, 1)]
    g = playground.generate(model="tiny-shakespeare", decoder="span_extract", prompt="Who is the sun? Answer:",
                            max_new_tokens=12, passage=PASSAGE, mode="greedy")
    assert "Span scores" not in [t for t, _ in V.run_figures(g)]
    assert "span ended" in [d.name for d in span_run_figure(g).data] or g["stats"]["finish_reason"] != "eos"
    for fn in (span_scores_figure, span_run_figure):
        assert fn({"steps": []}).layout.annotations  # a note, not an error
    assert "note" in span_passage_html({"steps": []}, 0)
