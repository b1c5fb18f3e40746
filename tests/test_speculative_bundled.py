"""The speculative family on the bundled tiny Shakespeare models: every lossless decoder
returns greedy's output at temperature 0 (five prompts, one repetitive, two lengths), and
the lookup decoders accept long drafts on the repetitive one."""

from __future__ import annotations

import pytest

from decoders.base import get_decoder
from playground.engine import prepare
from test_speculative import LOSSLESS  # derived from the registry there

pytestmark = pytest.mark.slow

PROMPTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
    "HAMLET:\nTo be, or not to be, that is the question:\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n",
    "[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter CERS.]\n\n[Enter",  # repetitive
]


@pytest.fixture(scope="module")
def models():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-draft", device="cpu")


def _run(target, decoder, prompt, n, draft=None, **params):
    r = prepare(model=target, decoder=decoder, prompt=prompt, max_new_tokens=n,
                draft=draft if get_decoder(decoder).needs_draft else None, params=params)
    r.ctx.stop_ids = set()
    return r.finish()


@pytest.fixture(scope="module")
def greedy_refs(models):
    target, _ = models
    return {(p, n): _run(target, "greedy", p, n).output_ids for p in PROMPTS for n in (12, 40)}


@pytest.mark.parametrize("decoder", LOSSLESS)
def test_bundled_lossless_equals_greedy(models, greedy_refs, decoder):
    target, draft = models
    params = {} if decoder in ("jacobi", "lookahead") else {"temperature": 0.0}
    for (prompt, n), ref in greedy_refs.items():
        tr = _run(target, decoder, prompt, n, draft, **params)
        assert tr.output_ids == ref, f"{decoder} on {prompt[:20]!r}, {n} tokens"
        assert [t for s in tr.steps for t in s.committed] == tr.output_ids


def test_bundled_lookup_accepts_long_drafts_on_repetition(models):
    target, _ = models
    tr = _run(target, "prompt_lookup", PROMPTS[4], 40, temperature=0.0)
    assert tr.stats["tokens_per_target_forward"] > 1.5
    assert max(int(k) for k in tr.stats["accepted_length_hist"]) >= 3
