"""The constraint stage (decoders/constraint.py) on greedy, sampling and the lossless
speculative decoders: regex, JSON schema and grammar masks checked against an independent
brute force over the vocabulary, EOS only where the constraint accepts, and one-line errors."""

from __future__ import annotations

import json

import pytest
import regex as pyregex  # an independent regex engine (partial matching) for the brute force
import torch

from decoders.base import get_decoder
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from visualizers.tokens import stats_line

WORDS = r"(the|and|[a-z]{2,4})( [a-z]{1,5}){1,3}[.!]?"


def run(handle, decoder, prompt, n, seed=0, draft=None, stop_ids=None, **params):
    r = prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                draft=draft if get_decoder(decoder).needs_draft else None, params=params)
    if stop_ids is not None:
        r.ctx.stop_ids = set(stop_ids)
    return r.finish()


def _raw_logits(handle, ids):
    """The model's next-token logits after ``ids``, by a plain uncached forward."""
    with torch.no_grad():
        out = handle.model(input_ids=torch.tensor([ids]))
    return out.logits[0, -1].float()


def _brute_allowed(handle, pattern, out, eos_ids):
    """Token ids whose text keeps ``decode(out + [t])`` a prefix of some match of ``pattern``,
    plus EOS when ``decode(out)`` is already a full match: computed over the whole vocabulary
    with Python's ``regex`` engine, nothing shared with llguidance."""
    tok = handle.tokenizer
    special = set(tok.all_special_ids)
    allowed = set()
    for t in range(handle.vocab_size):
        if t in special:
            continue
        text = tok.decode(out + [t], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" in text:
            continue  # half a UTF-8 character: the pattern is ASCII, so no match can follow
        if pyregex.fullmatch(pattern, text, partial=True):
            allowed.add(t)
    done = tok.decode(out, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if pyregex.fullmatch(pattern, done):
        allowed |= set(eos_ids)
    return allowed


@pytest.mark.parametrize("prompt", ["ROMEO: But soft", "To be, or not"])
def test_greedy_under_regex_is_argmax_over_allowed_set(llama_handle, prompt):
    tr = run(llama_handle, "greedy", prompt, 16, regex=WORDS)
    out = tr.output_ids
    assert out, "constrained greedy produced nothing"
    eos = set(llama_handle.eos_ids)
    text = llama_handle.tokenizer.decode([t for t in out if t not in eos])
    assert pyregex.fullmatch(WORDS, text, partial=True)
    for i, step in enumerate(tr.steps):
        allowed = _brute_allowed(llama_handle, WORDS, out[:i], eos)
        logits = _raw_logits(llama_handle, tr.prompt_ids + out[:i])
        best = max(allowed, key=lambda t: (float(logits[t]), -t))
        assert step.committed == [best], f"step {i}: picked {step.committed}, brute force {best}"
        ev = step.evidence["constraint"]
        assert ev["allowed"] == len(allowed)
        p = torch.softmax(logits, -1)
        removed = float(p.sum() - p[sorted(allowed)].sum())
        assert ev["removed_mass"] == pytest.approx(removed, abs=2e-5)
        assert all(t in allowed for t in ev["top_allowed"]["ids"])
        assert not any(t in allowed for t in ev["top_blocked"]["ids"])


def test_eos_only_where_the_constraint_accepts(llama_handle):
    eos = next(iter(llama_handle.eos_ids))
    pattern = r"[a-z]{3}( [a-z]{3})?"
    # a bias that makes EOS the favourite everywhere: it may only win where the text is complete
    tr = run(llama_handle, "greedy", "ROMEO:", 20, regex=pattern, logit_bias=json.dumps({str(eos): 40}))
    out = tr.output_ids
    assert out[-1] == eos and tr.stats["finish_reason"] == "eos"
    assert pyregex.fullmatch(pattern, llama_handle.tokenizer.decode(out[:-1]))
    for i in range(len(out) - 1):
        assert eos not in _brute_allowed(llama_handle, pattern, out[:i], {eos})
        assert eos in tr.steps[i].evidence["constraint"]["top_blocked"]["ids"]
    assert tr.stats["constraint_complete"] is True


def test_run_ends_when_the_constraint_is_complete(llama_handle):
    tr = run(llama_handle, "greedy", "ROMEO:", 30, stop_ids=set(), regex=r"[a-z]{2}\.")
    text = llama_handle.tokenizer.decode(tr.output_ids)
    assert pyregex.fullmatch(r"[a-z]{2}\.", text)
    assert tr.stats["finish_reason"] == "constraint"


def test_grammar_knob_lark(llama_handle):
    grammar = 'start: "ROMEO" SEP NAME "."\nSEP: ": " | " - "\nNAME: /[a-z]{2,5}/'
    tr = run(llama_handle, "greedy", "JULIET:", 20, grammar=grammar)
    text = llama_handle.tokenizer.decode(tr.output_ids, skip_special_tokens=True)
    assert pyregex.fullmatch(r"ROMEO(: | - )[a-z]{2,5}\.", text)


@pytest.mark.parametrize("decoder,extra", [("sample", {"temperature": 1.0}), ("top_k", {"k": 40}),
                                           ("min_p", {"p": 0.05})])
def test_sampled_outputs_match_regex(llama_handle, decoder, extra):
    eos = set(llama_handle.eos_ids)
    texts = set()
    for seed in range(8):
        tr = run(llama_handle, decoder, "ROMEO:", 16, seed=seed, regex=WORDS, **extra)
        text = llama_handle.tokenizer.decode([t for t in tr.output_ids if t not in eos])
        assert pyregex.fullmatch(WORDS, text, partial=True), (seed, text)
        if tr.stats["finish_reason"] in ("eos", "constraint"):
            assert pyregex.fullmatch(WORDS, text), (seed, text)
        texts.add(text)
    assert len(texts) > 1, "different seeds should sample different constrained texts"


SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "mood": {"enum": ["merry", "sad"]}},
          "required": ["name", "age", "mood"], "additionalProperties": False}


def test_a_lane_out_of_tokens_before_its_constraint_is_complete_says_so(llama_handle):
    # an unbounded integer cannot be complete in 6 tokens of a quote-opened string field
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]})
    short = run(llama_handle, "greedy", "ROMEO:", 6, json_schema=schema)
    assert short.stats["finish_reason"] == "length" and short.stats["constraint_complete"] is False
    line = stats_line(short.to_dict())
    assert "constraint incomplete: ran out of tokens" in line
    # a bounded regex the lane completes is marked complete, and its line says nothing of it
    done = run(llama_handle, "greedy", "ROMEO:", 12, regex="(yes|no)")
    assert done.stats["constraint_complete"] is True and "incomplete" not in stats_line(done.to_dict())
    free = run(llama_handle, "greedy", "ROMEO:", 4)
    assert "constraint_complete" not in free.stats


@pytest.mark.slow
def test_sampled_json_validates_on_bundled_model():
    import jsonschema  # the dev extra: a missing one fails, never skips
    from playground.core.models import load_model

    h = load_model("tiny-shakespeare")
    for seed in range(12):
        tr = run(h, "sample", "ROMEO:", 48, seed=seed, json_schema=json.dumps(SCHEMA), temperature=1.0)
        text = h.tokenizer.decode(tr.output_ids, skip_special_tokens=True)
        assert tr.stats["finish_reason"] in ("eos", "constraint"), (seed, text)
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.slow
def test_sampled_regex_on_bundled_model_over_seeds():
    from playground.core.models import load_model

    h = load_model("tiny-shakespeare")
    pattern = r"(ROMEO|JULIET): [A-Z][a-z]{1,8}( [a-z]{1,8}){0,4}[.!?]"
    for seed in range(16):
        tr = run(h, "top_p", "The scene: Verona.", 40, seed=seed, regex=pattern, p=0.95)
        text = h.tokenizer.decode(tr.output_ids, skip_special_tokens=True)
        assert pyregex.fullmatch(pattern, text), (seed, text)


SPECULATIVE = ["speculative", "spec_tree", "prompt_lookup", "ngram_adaptive", "token_recycling", "jacobi",
               "lookahead", "layer_skip", "mask_probe"]


@pytest.mark.parametrize("decoder", SPECULATIVE)
def test_constrained_speculative_equals_constrained_greedy(llama_handle, decoder):
    prompt = "ROMEO: But soft, what light"
    ref = run(llama_handle, "greedy", prompt, 14, regex=WORDS).output_ids
    extra = {} if get_decoder(decoder).greedy_only else {"temperature": 0.0}
    tr = run(llama_handle, decoder, prompt, 14, draft=llama_handle, regex=WORDS, **extra)
    assert tr.output_ids == ref
    assert all("constraint" in s.evidence for s in tr.steps)


@pytest.mark.slow
def test_constrained_speculative_equals_greedy_on_bundled_models():
    from playground.core.models import load_model

    h, d = load_model("tiny-shakespeare"), load_model("tiny-shakespeare-draft")
    schema = json.dumps(SCHEMA)
    ref = run(h, "greedy", "ROMEO:", 40, json_schema=schema)
    tr = run(h, "speculative", "ROMEO:", 40, draft=d, json_schema=schema, temperature=0.0)
    assert tr.output_ids == ref.output_ids


@pytest.mark.parametrize("knobs,needle", [
    ({"regex": "[a-"}, "knob 'regex' is invalid"),
    ({"regex": "(ab"}, "knob 'regex' is invalid"),
    ({"json_schema": "{not json"}, "knob 'json_schema' is not valid JSON"),
    ({"json_schema": "[1, 2]"}, "must be a JSON object"),
    ({"json_schema": '{"type": "bogus"}'}, "knob 'json_schema' is invalid"),
    ({"grammar": "start: foo"}, "knob 'grammar' is invalid"),
    ({"regex": "a", "grammar": 'start: "a"'}, "set only one of"),
    ({"regex": "a", "token_healing": True}, "token_healing cannot be combined"),
    ({"logit_bias": "[1]"}, "knob 'logit_bias' must be a JSON object"),
    ({"logit_bias": '{"5": 500}'}, "in [-100, 100]"),
    ({"bad_words": "[3]"}, "knob 'bad_words' must be"),
])
def test_bad_constraint_knobs_are_one_line(llama_handle, knobs, needle):
    with pytest.raises(PlaygroundError) as e:
        run(llama_handle, "greedy", "ROMEO:", 4, **knobs)
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg


@pytest.mark.parametrize("pattern", [r"[^\s\S]", r"ab[^\x00-\x{10FFFF}]"])
def test_unsatisfiable_constraint_is_one_line_not_a_hang(llama_handle, pattern):
    with pytest.raises(PlaygroundError) as e:
        run(llama_handle, "greedy", "ROMEO:", 50, regex=pattern)
    assert "cannot be satisfied" in str(e.value) and "\n" not in str(e.value)


def test_constraint_knobs_exist_where_promised():
    for name in ["greedy", "sample", "top_k", "top_p", "min_p", "typical", "epsilon", "eta", "xtc",
                 "mirostat", "beam", *SPECULATIVE]:
        params = get_decoder(name).params
        assert {"regex", "json_schema", "grammar"} <= set(params), name


def test_beam_under_regex(llama_handle):
    eos = set(llama_handle.eos_ids)
    one = run(llama_handle, "beam", "ROMEO: But soft", 14, regex=WORDS, num_beams=1)
    greedy = run(llama_handle, "greedy", "ROMEO: But soft", 14, regex=WORDS)
    # one beam under a constraint is constrained greedy (beam ends a complete text with EOS)
    assert [t for t in one.output_ids if t not in eos] == greedy.output_ids
    tr = run(llama_handle, "beam", "ROMEO: But soft", 14, regex=WORDS, num_beams=4)
    text = llama_handle.tokenizer.decode([t for t in tr.output_ids if t not in eos])
    assert pyregex.fullmatch(WORDS, text, partial=True)
    for s in tr.steps:
        for b in s.evidence["beams"]:
            gen = llama_handle.tokenizer.decode([t for t in b["ids"] if t not in eos])
            if b["score"] > -1e8:
                assert pyregex.fullmatch(WORDS, gen, partial=True), gen
    assert all("constraint" in s.evidence for s in tr.steps)


@pytest.mark.parametrize("coupling", ["gumbel", "inverse_cdf"])
def test_constrained_sampling_draws_the_renormalised_allowed_law(llama_handle, coupling):
    """The first token of ``sample`` under a regex, over 3000 seeds, follows softmax(logits / T)
    restricted to the brute-force allowed set and renormalised (chi-square, 1e-4 tail)."""
    import dataclasses
    import math

    from decoders.ar import constraint_stage
    from decoders.processors import build_chain
    from decoders.sampling import chain_picker

    pattern = r"[a-z ]{1,8}"
    params = {"regex": pattern, "temperature": 3.0, "coupling": coupling}
    base = prepare(model=llama_handle, decoder="sample", prompt="ROMEO:", max_new_tokens=1, params=params)
    logits = llama_handle.forward(base.ctx.prompt_ids).logits[0, -1].float()
    masked, _ = constraint_stage(base.ctx).row().apply(logits)
    allowed = sorted(_brute_allowed(llama_handle, pattern, [], llama_handle.eos_ids))
    law = torch.zeros_like(logits)
    law[allowed] = torch.softmax(logits[allowed] / 3.0, -1)
    knobs = base.decoder.chain_knobs(base.ctx.params)
    n, toks = 3000, []
    for seed in range(n):
        pick = chain_picker(dataclasses.replace(base.ctx, seed=seed), build_chain(knobs), [[]])
        final, tok = pick(masked, 0, [])
        toks.append(tok)
    torch.testing.assert_close(final, law, atol=1e-5, rtol=1e-4)
    counts = torch.bincount(torch.tensor(toks), minlength=law.numel()).double()
    assert counts[law == 0].sum() == 0
    expected = law.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat, dof = float((((obs - exp) ** 2)[keep] / exp[keep]).sum()), int(keep.sum()) - 1
    assert dof >= 5
    a = 2.0 / (9.0 * dof)
    assert stat < dof * (1 - a + 3.719 * math.sqrt(a)) ** 3, (stat, dof)


def test_forced_token_outside_the_constraint_is_one_line(llama_handle):
    r = prepare(model=llama_handle, decoder="greedy", prompt="ROMEO:", max_new_tokens=4, params={"regex": "[a-z]+"})
    r.ctx.force = {0: llama_handle.tokenizer.encode("#", add_special_tokens=False)[0]}
    with pytest.raises(PlaygroundError) as e:
        r.finish()
    assert "is not allowed by the regex constraint" in str(e.value) and len(str(e.value)) < 160
