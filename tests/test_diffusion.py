"""Masked-diffusion decoders: LLaDA exactness against a straight-line reference, commit
order, the self-speculative method's losslessness, Dream's shift, mask ids, layout rules."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import diffusion_meta, handle_from_model
from playground.core.trace import Trace

PROMPT = "ROMEO: But soft"


def build_bert(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                     num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=128,
                     pad_token_id=tokenizer.pad_token_id)
    model = BertForMaskedLM(cfg).eval()
    with torch.no_grad():  # random init is near uniform; sharpen so confidences differ
        model.cls.predictions.decoder.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def mlm(tokenizer):
    return handle_from_model(build_bert(tokenizer), tokenizer, name="tiny-bert")


@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare-diffusion", device="cpu")


def run(handle, decoder, n=16, seed=0, prompt=PROMPT, **params):
    return prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, seed=seed,
                   params=params).finish()


# ---------------------------------------------------------------------- the LLaDA reference
@torch.no_grad()
def llada_reference(model, prompt, steps, gen_length, block_length, mask_id, cfg_scale=0.0):
    """LLaDA's published ``generate`` (low-confidence remasking, temperature 0), written out
    straight from the paper's code, calling the model directly."""
    p = len(prompt)
    x = torch.full((1, p + gen_length), mask_id, dtype=torch.long)
    x[0, :p] = torch.tensor(prompt)
    prompt_index = x != mask_id
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    for nb in range(num_blocks):
        end = p + (nb + 1) * block_length
        block_mask_index = x[:, p + nb * block_length:end] == mask_id
        mask_num = block_mask_index.sum(dim=1, keepdim=True)
        num_transfer = torch.zeros(1, steps, dtype=torch.int64) + mask_num // steps
        num_transfer[0, :int(mask_num % steps)] += 1
        for i in range(steps):
            mask_index = x == mask_id
            if cfg_scale > 0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                logits = model(input_ids=torch.cat([x, un_x])).logits.float()
                cond, un = torch.chunk(logits, 2, dim=0)
                logits = un + (cfg_scale + 1) * (cond - un)
            else:
                logits = model(input_ids=x).logits.float()
            x0 = torch.argmax(logits, dim=-1)
            prob = F.softmax(logits, dim=-1)
            x0_p = torch.gather(prob, -1, x0.unsqueeze(-1)).squeeze(-1)
            x0_p[:, end:] = float("-inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(float("-inf")))
            _, select = torch.topk(confidence[0], k=int(num_transfer[0, i]))
            x[0, select] = x0[0, select]
    return x[0, p:].tolist()


SETTINGS = [(16, 16, 16), (16, 8, 16), (16, 8, 4), (12, 6, 4), (16, 16, 8)]


def _check_reference(handle, g, s, b, cfg=0.0):
    trace = run(handle, "llada", n=g, steps=s, block_length=b, cfg_scale=cfg)
    ref = llada_reference(handle.model, trace.prompt_ids, s, g, b, handle.mask_token_id, cfg)
    assert trace.steps[-1].evidence["canvas"] == ref
    assert trace.stats["target_forwards"] == s == trace.stats["steps"]
    assert sum(trace.stats["commits_per_step"]) == g


@pytest.mark.parametrize("g,s,b", SETTINGS)
def test_llada_matches_reference_tiny(mlm, g, s, b):
    _check_reference(mlm, g, s, b)


def test_llada_matches_reference_with_cfg(mlm):
    _check_reference(mlm, 8, 4, 8, cfg=1.5)


@pytest.mark.parametrize("g,s,b", [(16, 16, 16), (16, 8, 4), (24, 12, 8)])
def test_llada_matches_reference_bundled(bundled, g, s, b):
    _check_reference(bundled, g, s, b)


# ---------------------------------------------------------------------- commit order
def _masked_before(trace):
    """Per step, the positions still masked when the step began."""
    out, prev = [], None
    for st in trace.steps:
        ev = st.evidence
        g = len(ev["canvas"])
        prev = list(range(g)) if prev is None else prev
        out.append(prev)
        prev = [p for p in range(g) if ev["canvas"][p] == ev["mask_id"]]
    return out


def test_one_commit_per_step_is_the_most_confident(mlm):
    trace = run(mlm, "llada", n=12)
    for st, masked in zip(trace.steps, _masked_before(trace)):
        ev = st.evidence
        assert len(ev["unmasked"]) == 1
        best = max(ev["score"][p] for p in masked)
        assert ev["score"][ev["unmasked"][0]] == best == ev["confidence"][ev["unmasked"][0]]
    fast = run(mlm, "fast_dllm", n=12, threshold=1.0)
    assert [s.evidence["unmasked"] for s in fast.steps] == [s.evidence["unmasked"] for s in trace.steps]
    assert fast.output_ids == trace.output_ids and fast.stats["steps"] == 12


ORDERED = [
    ("llada", {"steps": 8, "block_length": 4}),
    ("llada", {"steps": 6, "block_length": 16, "cfg_scale": 1.0}),
    ("dream", {"alg": "maskgit_plus", "temperature": 0.0, "steps": 5}),
    ("dream", {"alg": "topk_margin", "temperature": 0.5, "steps": 4, "block_length": 8}),
    ("dream", {"alg": "entropy", "steps": 6}),
    ("fast_dllm", {"threshold": 0.3, "block_length": 8}),
    ("pc_sampler", {"steps": 8}),
    ("credit", {"threshold": 0.5}),
    ("masked_diffusion", {"score": "margin", "plan": "even", "steps": 4, "position_decay": 0.1}),
]


@pytest.mark.parametrize("decoder,params", ORDERED)
def test_committed_scores_dominate_the_block(mlm, decoder, params):
    trace = run(mlm, decoder, n=16, seed=1, **params)
    assert trace.steps
    for st, masked in zip(trace.steps, _masked_before(trace)):
        ev = st.evidence
        lo, hi = ev["block"]
        now = set(ev["unmasked"])
        left = [ev["score"][p] for p in masked if lo <= p < hi and p not in now]
        got = [ev["score"][p] for p in now]
        assert all(lo <= p < hi for p in now)
        if got and left:
            assert min(got) >= max(left)
    assert trace.steps[-1].evidence["canvas"].count(trace.steps[-1].evidence["mask_id"]) == 0


def test_blocks_fill_left_to_right(mlm):
    trace = run(mlm, "llada", n=16, steps=8, block_length=4)
    blocks = [tuple(s.evidence["block"]) for s in trace.steps]
    assert blocks == [(0, 4)] * 2 + [(4, 8)] * 2 + [(8, 12)] * 2 + [(12, 16)] * 2
    commit = trace.stats["commit_step"]
    assert all(commit[p] // 2 == p // 4 for p in range(16))


# ---------------------------------------------------------------------- schedules
def test_even_and_dream_schedules():
    from decoders.diffusion._sampler import dream_count, dream_timesteps, even_schedule

    assert even_schedule(10, 4) == [3, 3, 2, 2]
    assert even_schedule(8, 8) == [1] * 8
    ts = dream_timesteps(4, 1e-3)
    counts, left = [], 16
    for i in range(4):
        k = dream_count(left, ts, i)
        counts.append(k)
        left -= k
    # int() truncates, as in Dream: 16 * (1 - 0.75025) = 3.996 commits 3
    assert counts == [3, 4, 4, 5] and left == 0


def test_dream_commit_counts_follow_its_schedule(mlm):
    from decoders.diffusion._sampler import dream_count, dream_timesteps

    trace = run(mlm, "dream", n=16, steps=4, alg="maskgit_plus", temperature=0.0)
    ts, left, want = dream_timesteps(4, 1e-3), 16, []
    for i in range(4):
        want.append(dream_count(left, ts, i))
        left -= want[-1]
    assert trace.stats["commits_per_step"] == want


def test_sampling_is_deterministic_per_seed(mlm):
    a = run(mlm, "dream", n=12, seed=5, alg="origin", temperature=1.0, steps=6)
    b = run(mlm, "dream", n=12, seed=5, alg="origin", temperature=1.0, steps=6)
    c = run(mlm, "dream", n=12, seed=6, alg="origin", temperature=1.0, steps=6)
    assert a.output_ids == b.output_ids and a.stats["commits_per_step"] == b.stats["commits_per_step"]
    assert (c.output_ids, c.stats["commits_per_step"]) != (a.output_ids, a.stats["commits_per_step"])
    g1 = run(mlm, "llada", n=8, seed=2, temperature=0.8)
    assert g1.output_ids == run(mlm, "llada", n=8, seed=2, temperature=0.8).output_ids


def test_dream_alg_temp_and_top_k_keep_the_schedule(mlm):
    from decoders.diffusion._sampler import dream_count, dream_timesteps

    kw = dict(n=16, steps=4, alg="topk_margin", temperature=0.7, top_k=5, alg_temp=0.5)
    a, b = run(mlm, "dream", seed=4, **kw), run(mlm, "dream", seed=4, **kw)
    assert a.output_ids == b.output_ids
    ts, left, want = dream_timesteps(4, 1e-3), 16, []
    for i in range(4):
        want.append(dream_count(left, ts, i))
        left -= want[-1]
    assert a.stats["commits_per_step"] == want


def test_recipes_reduce_to_their_base(mlm):
    """With their extra knob off, the named variants are the sampler they build on."""
    base = run(mlm, "llada", n=16, steps=8)
    pc = run(mlm, "pc_sampler", n=16, steps=8, position_decay=0.0, calibrate=False)
    assert pc.output_ids == base.output_ids and pc.stats["commit_step"] == base.stats["commit_step"]
    fast = run(mlm, "fast_dllm", n=16, threshold=0.4)
    credit = run(mlm, "credit", n=16, threshold=0.4, credit_weight=0.0)
    assert credit.output_ids == fast.output_ids and credit.stats["commit_step"] == fast.stats["commit_step"]


# ---------------------------------------------------------------------- early exit
def test_early_exit_commits_everything_at_once(mlm):
    ex = run(mlm, "prophet", n=16, early=0.0)
    assert ex.stats["steps"] == 1 and ex.stats["early_exit_step"] == 0
    assert ex.steps[0].evidence["early_exit"]["exit"] is True
    sc = run(mlm, "sched", n=16, steps=8, tau_high=0.0, tau_low=0.0)
    assert sc.stats["steps"] == 1
    never = run(mlm, "prophet", n=16, steps=8, early=100.0, mid=100.0, late=100.0)
    plain = run(mlm, "llada", n=16, steps=8)
    assert never.output_ids == plain.output_ids and never.stats["early_exit_step"] is None


# ---------------------------------------------------------------------- self-speculative
# Lossless diffusion decoders: equal, seed by seed, to the decoder they reproduce (so at any
# temperature they draw exactly its distribution). test_speculative_dist.py checks this list
# covers every lossless diffusion decoder.
SEED_EXACT_DIFFUSION = {"freedave": ("llada", {})}


@pytest.mark.parametrize("temperature,block", [(0.0, 0), (0.0, 4), (0.8, 8)])
def test_freedave_equals_one_token_per_step(mlm, temperature, block):
    static = run(mlm, "llada", n=16, seed=3, temperature=temperature, block_length=block)
    fd = run(mlm, "freedave", n=16, seed=3, temperature=temperature, block_length=block, draft_size=4)
    assert fd.output_ids == static.output_ids
    assert fd.steps[-1].evidence["canvas"] == static.steps[-1].evidence["canvas"]
    assert fd.stats["target_forwards"] <= static.stats["target_forwards"]
    if temperature == 0.0:
        assert fd.stats["target_forwards"] < static.stats["target_forwards"]


@pytest.mark.parametrize("which", ["mlm", "bundled"])
def test_freedave_samples_like_one_token_per_step_at_temperature_one(request, which):
    """At temperature 1 the output is static decoding's for every seed, so both draw the
    same distribution; drafts are accepted often enough for that to mean something."""
    handle = request.getfixturevalue(which)
    reference, knobs = SEED_EXACT_DIFFUSION["freedave"]
    accepted = 0
    for seed in range(8):
        for block in (0, 4):
            static = run(handle, reference, n=8, seed=seed, temperature=1.0, block_length=block, **knobs)
            fd = run(handle, "freedave", n=8, seed=seed, temperature=1.0, block_length=block, draft_size=4)
            assert fd.output_ids == static.output_ids, f"seed {seed}, block_length {block}"
            accepted += sum(s.evidence["draft"]["accepted"] - 1 for s in fd.steps)
    assert accepted > 0, "no draft beyond the first commit was accepted: the check would be vacuous"


def test_freedave_on_bundled(bundled):
    static = run(bundled, "llada", n=24, block_length=8)
    fd = run(bundled, "freedave", n=24, block_length=8, draft_size=6)
    assert fd.output_ids == static.output_ids
    assert fd.stats["target_forwards"] < static.stats["target_forwards"]


# ---------------------------------------------------------------------- models
class ShiftedLM(torch.nn.Module):
    """A masked LM whose index ``i`` predicts position ``i + 1``, as Dream's does."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, input_ids, **kw):
        lg = self.inner(input_ids=input_ids, **kw).logits
        return SimpleNamespace(logits=torch.cat([lg[:, 1:], lg[:, -1:]], 1))


def test_dream_shift_is_undone_by_the_handle(tokenizer, mlm):
    shifted = handle_from_model(ShiftedLM(mlm.model), tokenizer, name="dream-like", kind="diffusion",
                                logits_shifted=True)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    raw = ShiftedLM(mlm.model)(ids).logits
    got = shifted.forward(ids).logits
    assert torch.equal(got, torch.cat([raw[:, :1], raw[:, :-1]], 1))
    assert torch.allclose(got[:, 1:], mlm.forward(ids).logits[:, 1:])
    # the prompt is never empty, so position 0 (the one the shift cannot recover) is never masked
    for dec, params in (("llada", {"steps": 8}), ("dream", {"alg": "entropy", "temperature": 0.0})):
        a, b = run(shifted, dec, n=12, **params), run(mlm, dec, n=12, **params)
        assert a.output_ids == b.output_ids


def test_mask_id_from_handle_and_config(tokenizer, mlm):
    special = handle_from_model(mlm.model, tokenizer, name="llada-like", mask_token_id=tokenizer.pad_token_id)
    trace = run(special, "llada", n=8, steps=4)
    first = trace.steps[0].evidence
    assert first["mask_id"] == tokenizer.pad_token_id
    assert first["canvas"].count(tokenizer.pad_token_id) >= 8 - len(first["unmasked"])
    from transformers import PretrainedConfig

    tok = SimpleNamespace(mask_token_id=7)
    assert diffusion_meta(PretrainedConfig(), tok) == (7, False)
    llada_cfg = PretrainedConfig()
    llada_cfg.model_type = "llada"
    assert diffusion_meta(llada_cfg, tok) == (126336, False)
    dream_cfg = PretrainedConfig(mask_token_id=151666)
    dream_cfg.model_type = "Dream"
    assert diffusion_meta(dream_cfg, tok) == (151666, True)
    nomask = handle_from_model(mlm.model, tokenizer, name="nomask")
    nomask.mask_token_id = None  # a masked LM whose tokenizer has no mask token
    with pytest.raises(PlaygroundError, match="no mask token"):
        run(nomask, "llada", n=8)


@pytest.mark.parametrize("arch", ["bert", "roberta", "modernbert"])
def test_plain_masked_lms_run(tokenizer, arch):
    from transformers import (BertConfig, BertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM,
                              RobertaConfig, RobertaForMaskedLM)

    from playground.core.models import detect_kind

    v, pad = len(tokenizer), tokenizer.pad_token_id
    small = dict(vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, pad_token_id=pad)
    torch.manual_seed(0)
    model = {
        "bert": lambda: BertForMaskedLM(BertConfig(max_position_embeddings=64, **small)),
        "roberta": lambda: RobertaForMaskedLM(RobertaConfig(max_position_embeddings=34, **small)),
        "modernbert": lambda: ModernBertForMaskedLM(ModernBertConfig(
            max_position_embeddings=64, bos_token_id=pad, eos_token_id=pad, cls_token_id=pad,
            sep_token_id=pad, **small)),
    }[arch]().eval()
    assert detect_kind(model.config) == "diffusion"
    handle = handle_from_model(model, tokenizer, name=f"tiny-{arch}")
    trace = run(handle, "llada", n=8, steps=4)
    assert len(trace.steps) == 4 and trace.steps[-1].evidence["canvas"].count(handle.mask_token_id) == 0
    if arch == "roberta":  # 34 positions, 2 taken by RoBERTa's offset: 32 usable
        with pytest.raises(PlaygroundError, match="exceeds the context"):
            run(handle, "llada", n=32 - len(trace.prompt_ids) + 1)


# ---------------------------------------------------------------------- input errors
@pytest.mark.parametrize("n,params,rule", [
    (10, {"block_length": 4}, "multiple of block_length"),
    (16, {"block_length": 4, "steps": 6}, "multiple of the number of blocks"),
    (8, {"steps": 16}, "exceed block_length"),
    (8, {"block_length": 16}, "longer than gen_length"),
    (8, {"gen_length": 12, "block_length": 5}, "gen_length \\(12\\) must be a multiple"),
])
def test_layout_rules_are_clear_errors(mlm, n, params, rule):
    with pytest.raises(PlaygroundError, match=rule):
        run(mlm, "llada", n=n, **params)


def test_wrong_model_kind_is_a_clear_error(llama_handle, mlm):
    with pytest.raises(PlaygroundError, match="needs a diffusion model"):
        prepare(model=llama_handle, decoder="llada", prompt=PROMPT, max_new_tokens=8)
    with pytest.raises(PlaygroundError, match="needs a causal model"):
        prepare(model=mlm, decoder="greedy", prompt=PROMPT, max_new_tokens=8)
    with pytest.raises(PlaygroundError, match="early exit needs a fixed step schedule"):
        run(mlm, "masked_diffusion", n=8, plan="threshold", exit="sched")


# ---------------------------------------------------------------------- output and trace
def test_left_to_right_share():
    from decoders.diffusion._canvas import left_to_right

    assert left_to_right([0, 1, 2, 3]) == 1.0
    assert left_to_right([0, 0, 1, 1]) == 1.0
    assert left_to_right([3, 2, 1, 0]) == 0.25
    assert left_to_right([1, 0, 2, 2]) == 0.75


def test_trim_output():
    from decoders.diffusion._canvas import trim_output

    assert trim_output([5, 6, 0, 0, 0], {0}, {2}) == ([5, 6, 0], "eos")
    assert trim_output([5, 0, 6, 2, 2], {0}, {2}) == ([5, 0, 6], "length")
    assert trim_output([5, 6, 7], {0}, {2}) == ([5, 6, 7], "length")
    assert trim_output([0, 0], {0}, set()) == ([0], "eos")


def test_trace_fields_and_round_trip(mlm):
    trace = run(mlm, "llada", n=12, steps=6)
    st = trace.steps[2].to_dict()
    assert st["kind"] == "denoise" and len(st["canvas"]) == 12 and st["mask_id"] == mlm.mask_token_id
    assert st["remasked"] == [] and st["block"] == [0, 12]
    done_before = {p for p, s in enumerate(trace.stats["commit_step"]) if s < 2}
    assert len(done_before) == 4
    for key in ("confidence", "entropy", "margin", "score", "predicted"):
        assert len(st[key]) == 12
        assert all((st[key][p] is None) == (p in done_before) for p in range(12))
    assert st["committed"] == [st["canvas"][p] for p in st["unmasked"]]
    assert trace.stats["tokens_per_step"] == 2.0 and trace.stats["commits_per_step"] == [2] * 6
    assert 0.0 < trace.stats["left_to_right"] <= 1.0
    assert trace.output_ids == trace.steps[-1].evidence["canvas"][:len(trace.output_ids)]
    texts = trace.extra["tokens"]  # a replay needs no tokenizer: predicted ids have texts too
    assert all(str(t) in texts for s in trace.steps for t in s.evidence["predicted"] if t is not None)
    again = Trace.from_json(trace.to_json())
    assert again.steps[2].to_dict() == st


def test_eos_penalty_keeps_eos_out_early(tokenizer):
    model = build_bert(tokenizer, seed=1)
    eos = tokenizer.eos_token_id
    with torch.no_grad():  # make EOS the favourite everywhere
        model.cls.predictions.bias[eos] += 5.0
    handle = handle_from_model(model, tokenizer, name="eos-lover")
    plain = run(handle, "llada", n=8)
    assert plain.output_ids[-1] == eos and plain.stats["finish_reason"] == "eos"
    assert plain.steps[0].committed == [eos]
    held = run(handle, "llada", n=8, eos_penalty=20.0)
    assert held.steps[0].committed != [eos]
