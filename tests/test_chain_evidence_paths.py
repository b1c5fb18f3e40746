"""The chain's stage evidence on every path it takes: a large distribution (more live tokens
than ``STAGE_SMALL``) read through its top candidates, a cut that keeps a top set (its
survivors found among those candidates), a cut that does not (XTC, typical, penalties), and the
small distributions a chain then works on alone. Each stage's ``removed``, ``top_removed``,
``top_kept`` and Gumbel picks are checked against a computation by definition on the logits
entering it (float64 numpy, the rules applied one at a time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decoders import processors as P
from decoders.processors import STAGE_SMALL, STAGE_TOP


def softmax(x: np.ndarray) -> np.ndarray:
    live = np.isfinite(x)
    e = np.where(live, np.exp(x - x[live].max()), 0.0)
    return e / e.sum()


def expected_side(q: np.ndarray, x: np.ndarray, sel: np.ndarray) -> list[tuple[int, float]]:
    ids = [int(t) for t in np.argsort(-np.where(sel, x, -np.inf), kind="stable")[: min(STAGE_TOP, int(sel.sum()))]]
    return [(t, float(q[t])) for t in ids]


def gumbel_by_definition(x: torch.Tensor, noise: torch.Tensor) -> int:
    """argmax of logits + noise over the tokens whose float32 probability is non-zero, lowest id on ties."""
    live = torch.softmax(x.float(), -1) > 0
    s = torch.where(live, x.double(), torch.full_like(noise, -np.inf)) + noise
    return int(torch.nonzero(s == s.max())[0])


def check_side(got: list, x: np.ndarray, q: np.ndarray, sel: np.ndarray) -> None:
    want = expected_side(q, x, sel)
    assert len(got) == len(want)
    # the same logits (tied tokens may be chosen in another order), each with its probability
    assert sorted(float(x[t]) for t, _ in got) == pytest.approx(sorted(float(x[t]) for t, _ in want))
    for t, p in got:
        assert sel[t]
        assert p == pytest.approx(q[t], rel=1e-3, abs=1e-12)
    assert [p for _, p in got] == sorted((p for _, p in got), reverse=True)


CHAINS = [
    # a top set cut first: the candidates hold the survivors, the rest runs on them
    {"top_k": 40, "top_p": 0.9, "min_p": 0.05, "temperature": 0.7, "order": "top_k,top_p,min_p,temperature"},
    # a large survivor set: the full-vocabulary path for more than one stage
    {"top_p": 0.999, "temperature": 1.3, "min_p": 0.001, "order": "temperature,top_p,min_p"},
    # cuts that keep no top set (XTC removes the top choices), then reorder (penalties)
    {"xtc_probability": 1.0, "xtc_threshold": 0.01, "typical_p": 0.6, "repetition_penalty": 1.5,
     "top_k": 300, "order": "top_k,xtc,penalties,typical"},
    {"repetition_penalty": 1.8, "presence_penalty": 1.0, "no_repeat_ngram_size": 2, "epsilon": 2e-4,
     "eta": 5e-4, "top_n_sigma": 2.0, "order": "penalties,no_repeat_ngram,epsilon,top_n_sigma,eta"},
    # a cut that keeps few tokens but no top set: its survivors are looked up afresh
    {"typical_p": 0.3, "min_p": 0.01, "order": "typical,min_p"},
    {"mirostat_tau": 4.0, "top_k": 2 * STAGE_SMALL, "order": "top_k,mirostat"},
]


@pytest.mark.parametrize("vocab", [300, 3 * STAGE_SMALL])
@pytest.mark.parametrize("chain_knobs", CHAINS)
@pytest.mark.parametrize("ties", [False, True])
def test_each_stage_matches_the_definition_on_every_path(vocab, chain_knobs, ties):
    g = torch.Generator().manual_seed(vocab + len(chain_knobs))
    logits = torch.randn(vocab, generator=g) * 3
    noise = -torch.log(-torch.log(torch.rand(vocab, generator=g, dtype=torch.float64).clamp_min(1e-300)))
    if ties:
        logits = logits.bfloat16().float()  # a bf16 model's logits tie often
        logits[[3, vocab - 2]] = logits.max()  # and without noise the draw is argmax's: the lowest tied id
        noise = torch.zeros(vocab, dtype=torch.float64)
    ids = [int(t) for t in torch.randint(vocab, (30,), generator=g)] + [int(torch.argmax(logits))] * 3
    h = P.History(ids=ids, prompt_len=10, pos=2, uniform=lambda i, s="sample": 0.2)
    chain = P.build_chain(chain_knobs)
    stages: list[dict] = []
    out = chain(logits, h, stages, noise)
    assert len(stages) == len(chain.processors)
    x = P._sane(logits.float())
    for stage, proc in zip(stages, chain.processors):
        after = P._sane(proc(x, h))
        xn, an = x.double().numpy(), after.double().numpy()
        q = softmax(xn)
        live, kept = np.isfinite(xn), np.isfinite(an)
        assert stage["removed"] == int((live & ~kept).sum())
        assert stage["kept"] == int(kept.sum())
        check_side(stage["top_removed"], xn, q, live & ~kept)
        check_side(stage["top_kept"], xn, q, kept)
        for key, dist in (("gumbel_in", x), ("gumbel_out", after)):
            t, p = stage[key]
            assert t == gumbel_by_definition(dist, noise)
            assert p == pytest.approx(q[t], rel=1e-3, abs=1e-12)
        x = after
    assert torch.equal(out, x)


def test_a_large_vocabulary_and_a_small_one_record_alike():
    """The same logits padded with removed tokens to a vocabulary past STAGE_SMALL take the other
    path through the evidence; what it records is the same."""
    g = torch.Generator().manual_seed(7)
    small = torch.randn(200, generator=g) * 2
    big = torch.full((4 * STAGE_SMALL,), float("-inf"))
    big[:200] = small
    big[200:STAGE_SMALL + 300] = -60.0 - torch.rand(STAGE_SMALL + 100, generator=g)  # live, but negligible
    knobs = {"top_k": 30, "min_p": 0.02, "temperature": 0.8, "order": "top_k,min_p,temperature"}
    h = P.History(ids=[1], prompt_len=1, pos=0)
    noise = torch.zeros(4 * STAGE_SMALL, dtype=torch.float64)
    a: list[dict] = []
    b: list[dict] = []
    P.build_chain(knobs)(small, h, a, noise[:200])
    P.build_chain(knobs)(big, h, b, noise)
    assert b[0]["removed"] == a[0]["removed"] + STAGE_SMALL + 100
    assert [s["kept"] for s in a] == [s["kept"] for s in b]
    assert [s["removed"] for s in a[1:]] == [s["removed"] for s in b[1:]]
    for sa, sb in zip(a, b):
        keys = ("top_kept", "gumbel_in", "gumbel_out") + (("top_removed",) if sa is not a[0] else ())
        for key in keys:
            assert np.allclose(np.asarray(sb[key], float), np.asarray(sa[key], float), rtol=2e-3), key


def test_the_rules_that_say_they_only_remove_tokens_do():
    """``masks`` lets the evidence carry the draw's winner through a stage without a pass over the
    vocabulary; a rule claiming it must keep each logit as it is or set it to -inf."""
    g = torch.Generator().manual_seed(11)
    knobs = {"top_k": 50, "top_p": 0.8, "min_p": 0.05, "typical_p": 0.7, "epsilon": 1e-3, "eta": 1e-3,
             "top_n_sigma": 1.0, "xtc_probability": 1.0, "xtc_threshold": 0.01, "mirostat_tau": 3.0,
             "no_repeat_ngram_size": 2}
    procs = [p for p in P.build_chain(knobs).processors if p.masks]
    assert {type(p) for p in procs} == {P.TopK, P.TopP, P.MinP, P.Typical, P.Epsilon, P.Eta, P.TopNSigma,
                                        P.XTC, P.Mirostat, P.NoRepeatNGram}
    assert not any(p.masks for p in P.build_chain({"temperature": 0.5, "repetition_penalty": 1.3,
                                                   "presence_penalty": 0.5, "frequency_penalty": 0.5,
                                                   "dry_multiplier": 1.0}).processors)
    for _ in range(5):
        x = torch.randn(500, generator=g) * 4
        x[torch.rand(500, generator=g) < 0.2] = float("-inf")
        h = P.History(ids=[int(t) for t in torch.randint(500, (40,), generator=g)], prompt_len=5, pos=1,
                      uniform=lambda i, s="sample": 0.1)
        for proc in procs:
            y = proc(x, h)
            assert bool(((y == x) | (y == float("-inf"))).all()), proc.label
