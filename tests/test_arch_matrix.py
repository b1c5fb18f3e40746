"""Every decoder on the architectures people load (issue 15): tiny random models of 16 causal
architectures and 4 masked LMs, built from config (tests/_arch_models.py, no downloads).

Greedy and beam equal transformers ``generate``; every lossless speculative decoder equals
greedy token for token at temperature 0, with a prompt longer than the sliding window of the
windowed models (so rollbacks and tree verification cross the window edge); decoders that
cannot cut a recurrent state back refuse in one line naming decoder and model; draft and
target with padded vocabularies of different sizes over one tokenizer compare on the shared
ids; the runtime lossless check counts a committed token that is not the verified argmax;
docs/models.md shows the table these tests check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import decoders  # noqa: F401 - registers every decoder
from _arch_models import (BEGIN, CAUSAL, KIND_OF, MASKED, RECURRENT, WINDOW, WINDOWED, build_causal, build_masked,
                          doc_section, expected, support_table)
from decoders.kv_cache import MaskMap, cache_info, fit_tree_mask
from decoders.base import all_decoders, get_decoder
from decoders.draft_tree import SpecDecoder, tree_inputs
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model

# longer than the window (8) of the windowed models, and with the '\n\n' CAD splits on
PROMPT = "ROMEO: But soft, what light through yonder window breaks?\n\nJULIET: O Romeo, Romeo, wherefore"
MORE_PROMPTS = ["ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab",  # repetitive: long lookup drafts
                "MACBETH: Tomorrow, and tomorrow, and tomorrow, creeps in this petty pace"]
N = 12
LOSSLESS = sorted(c.name for c in all_decoders() if issubclass(c, SpecDecoder) and c.lossless)
GREEDY_ONLY = {c.name for c in all_decoders() if getattr(c, "greedy_only", False)}
REPRESENTATIVE = ("llama", "gemma2", "mamba")  # one architecture per cache kind, for the fast test

_MODELS: dict[str, object] = {}


@pytest.fixture(scope="module")
def models(tokenizer):
    """Built once per module: (target, draft) handles by architecture name."""

    def get(arch: str):
        if arch not in _MODELS:
            _MODELS[arch] = (handle_from_model(build_causal(arch, tokenizer), tokenizer, name=f"tiny-{arch}"),
                             handle_from_model(build_causal(arch, tokenizer, draft=True), tokenizer,
                                               name=f"tiny-{arch}-draft"))
        return _MODELS[arch]

    return get


def _masked_draft(tokenizer):
    """The draft of decoders that draft with a masked-diffusion LM (one for every target)."""
    if "masked-draft" not in _MODELS:
        _MODELS["masked-draft"] = handle_from_model(build_masked("bert", tokenizer), tokenizer, name="tiny-bert-draft")
    return _MODELS["masked-draft"]


def run(target, decoder, prompt=PROMPT, n=N, draft=None, **params):
    cls = get_decoder(decoder)
    if issubclass(cls, SpecDecoder) and decoder not in GREEDY_ONLY and "temperature" in cls.params:
        params.setdefault("temperature", 0.0)
    if getattr(cls, "draft_kind", "causal") == "diffusion":
        draft = _masked_draft(target.tokenizer)
    r = prepare(model=target, decoder=decoder, prompt=prompt, max_new_tokens=n,
                draft=draft if cls.needs_draft else None, params=params)
    r.ctx.stop_ids = set()  # random models: compare full lengths
    return r.finish()


_GREEDY: dict[tuple, list[int]] = {}


def greedy_ids(target, prompt=PROMPT, n=N) -> list[int]:
    """Greedy's output, computed once per model, prompt and length."""
    key = (target.name, prompt, n)
    if key not in _GREEDY:
        _GREEDY[key] = run(target, "greedy", prompt, n).output_ids
    return _GREEDY[key]


def hf_generate(handle, prompt_ids, n, **kw):
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = handle.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                    min_new_tokens=0, eos_token_id=None, pad_token_id=handle.tokenizer.pad_token_id,
                                    **kw)
    return out[0, len(prompt_ids):].tolist()


# ---------------------------------------------------------------------- the models themselves
def test_prompt_is_longer_than_the_window(tokenizer):
    assert len(tokenizer.encode(PROMPT)) > 2 * WINDOW


@pytest.mark.parametrize("arch", CAUSAL)
def test_cache_kind_is_read_from_the_config(models, arch):
    target, draft = models(arch)
    assert cache_info(target).kind == KIND_OF[arch]
    assert cache_info(draft).kind == KIND_OF[arch]


def test_hybrid_models_mix_window_and_global_layers(models):
    info = cache_info(models("gemma2")[0])
    assert set(info.layer_types) == {"sliding_attention", "full_attention"}
    assert info.window_of("sliding_attention") == WINDOW and info.window_of("full_attention") is None


# ---------------------------------------------------------------------- greedy and beam vs generate
@pytest.mark.parametrize("arch", CAUSAL)
def test_greedy_equals_generate(models, arch):
    target, _ = models(arch)
    trace = run(target, "greedy")
    assert trace.output_ids == hf_generate(target, trace.prompt_ids, N)


@pytest.mark.parametrize("arch", [a for a in CAUSAL if a not in RECURRENT])
def test_beam_equals_generate(models, arch):
    target, _ = models(arch)
    trace = run(target, "beam", num_beams=3)
    assert trace.output_ids == hf_generate(target, trace.prompt_ids, N, num_beams=3)


# ---------------------------------------------------------------------- lossless decoders vs greedy
@pytest.mark.parametrize("decoder", LOSSLESS)
@pytest.mark.parametrize("arch", [a for a in CAUSAL if a not in RECURRENT])
def test_lossless_decoders_equal_greedy(models, arch, decoder):
    target, draft = models(arch)
    trace = run(target, decoder, draft=draft)
    assert trace.output_ids == greedy_ids(target), f"{decoder} on {arch} differs from greedy"
    assert trace.stats["lossless_mismatch"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("prompt", MORE_PROMPTS)
@pytest.mark.parametrize("decoder", LOSSLESS)
@pytest.mark.parametrize("arch", [a for a in CAUSAL if a not in RECURRENT])
def test_lossless_decoders_equal_greedy_more_prompts(models, arch, decoder, prompt):
    target, draft = models(arch)
    assert run(target, decoder, prompt, 16, draft).output_ids == greedy_ids(target, prompt, 16)


@pytest.mark.parametrize("arch", WINDOWED)
@pytest.mark.parametrize("decoder", ["spec_tree", "token_recycling", "lookahead"])
def test_windowed_models_verify_trees_past_the_window(models, arch, decoder):
    """The issue's crash: tree verification once prompt + output exceeds the window."""
    target, draft = models(arch)
    trace = run(target, decoder, n=3 * WINDOW, draft=draft)
    assert len(trace.output_ids) == 3 * WINDOW
    assert trace.output_ids == greedy_ids(target, n=3 * WINDOW)
    if decoder != "lookahead":  # lookahead's window is a tree of its own at every step
        assert any(_branches(s.evidence["tree"]["nodes"]) for s in trace.steps), \
            "no step verified a branching tree: the test would not exercise the tree mask"


def _branches(nodes) -> bool:
    parents = [n["parent"] for n in nodes]
    return len(parents) != len(set(parents))


@pytest.mark.parametrize("decoder", LOSSLESS)
def test_recurrent_state_is_refused_in_one_line(models, decoder):
    target, draft = models("mamba")
    with pytest.raises(PlaygroundError) as e:
        run(target, decoder, draft=draft)
    msg = str(e.value)
    assert "\n" not in msg and decoder in msg and "tiny-mamba" in msg and "cut back" in msg


def test_recurrent_draft_is_refused_in_one_line(models, tokenizer):
    target, _ = models("llama")
    _, mamba_draft = models("mamba")
    with pytest.raises(PlaygroundError, match=r"speculative cannot run on draft model 'tiny-mamba-draft'"):
        run(target, "speculative", draft=mamba_draft)


# ---------------------------------------------------------------------- tree masks by layer type
def test_tree_mask_is_windowed_per_layer_type(models):
    parents = [-1, 0, 0, 1]  # a branching tree after 20 cached positions
    mask, pos = tree_inputs(parents, 20, torch.float32)
    assert fit_tree_mask(mask, pos, 20, cache_info(models("llama")[0])) is mask
    single = fit_tree_mask(mask, pos, 20, cache_info(models("mistral-window")[0]))
    hybrid = fit_tree_mask(mask, pos, 20, cache_info(models("gemma2")[0]))
    assert torch.is_tensor(single) and isinstance(hybrid, MaskMap)
    assert torch.equal(hybrid["full_attention"], mask)
    assert torch.equal(hybrid["sliding_attention"], single)
    # node 3 sits at position 22: it sees cached positions 15..19 and its ancestors, not 0..14
    row = single[0, 0, 3]
    assert torch.isinf(row[:15]).all() and (row[15:20] == 0).all()
    assert row[20] == 0 and row[21] == 0 and torch.isinf(row[22]) and row[23] == 0
    assert hybrid.to("cpu")["sliding_attention"].device.type == "cpu"


# ---------------------------------------------------------------------- every other decoder
# knobs a decoder cannot run without (a new decoder with such a knob gets its line here)
REQUIRED_KNOBS = {"deal": {"keywords": "love"}, "constrained_beam": {"force_words": "Romeo"}, "span_extract": {"passage": "But soft, what light through yonder window breaks"}}


def _runs_or_refuses(target, draft, cls, arch):
    status, _why = expected(cls, KIND_OF[arch])
    params = dict(REQUIRED_KNOBS.get(cls.name, {}))
    if status == "refused":
        with pytest.raises(PlaygroundError) as e:
            run(target, cls.name, n=6, draft=draft, **params)
        msg = str(e.value)
        assert "\n" not in msg and (target.name in msg or draft.name in msg)
        if issubclass(cls, SpecDecoder):
            assert cls.name in msg
        return
    trace = run(target, cls.name, n=6, draft=draft, **params)
    assert 1 <= len(trace.output_ids) <= 6 or cls.name in ("mbr", "best_of_n")


def _causal_decoders():
    return [c for c in all_decoders() if c.kind == "causal"]


@pytest.mark.parametrize("arch", REPRESENTATIVE)
def test_every_causal_decoder_runs_or_refuses(models, arch):
    target, draft = models(arch)
    for cls in _causal_decoders():
        try:
            _runs_or_refuses(target, draft, cls, arch)
        except AssertionError as e:
            raise AssertionError(f"{cls.name} on {arch}: {e}") from None


@pytest.mark.slow
@pytest.mark.parametrize("decoder", [c.name for c in _causal_decoders()])
@pytest.mark.parametrize("arch", CAUSAL)
def test_every_causal_decoder_on_every_architecture(models, arch, decoder):
    target, draft = models(arch)
    _runs_or_refuses(target, draft, get_decoder(decoder), arch)


# ---------------------------------------------------------------------- masked LMs
@pytest.mark.parametrize("arch", MASKED)
def test_diffusion_decoders_fill_the_canvas_on_masked_lms(models, tokenizer, arch):
    target = handle_from_model(build_masked(arch, tokenizer), tokenizer, name=f"tiny-{arch}")
    helper = models("llama")[1]  # a small causal helper for the diffusion decoders that take one (apd)
    for cls in [c for c in all_decoders() if c.kind == "diffusion"]:
        trace = prepare(model=target, decoder=cls.name, prompt="ROMEO: But soft", max_new_tokens=8,
                        draft=helper if cls.needs_draft else None).finish()
        assert len(trace.output_ids) == 8, cls.name
        assert tokenizer.mask_token_id not in trace.output_ids, f"{cls.name} on {arch} left masks"


# ---------------------------------------------------------------------- padded vocabularies
@pytest.mark.parametrize("bigger", ["target", "draft"])
@pytest.mark.parametrize("decoder", ["speculative", "spec_tree"])
def test_padded_vocabularies_compare_on_the_shared_ids(tokenizer, bigger, decoder):
    """Qwen2.5 0.5B and 7B: one tokenizer, embedding tables padded to different sizes."""
    pad = len(tokenizer) + 64
    base = build_causal("qwen2", tokenizer, vocab=pad if bigger == "target" else None)
    target = handle_from_model(base, tokenizer, name="qwen-like")
    # the draft is the target with its tables resized, so it agrees on the shared ids
    draft = handle_from_model(_resized(base, len(tokenizer) if bigger == "target" else pad, len(tokenizer)),
                              tokenizer, name="qwen-like-draft")
    assert target.vocab_size != draft.vocab_size
    greedy = run(target, "greedy").output_ids
    trace = run(target, decoder, draft=draft)
    assert trace.output_ids == greedy
    assert trace.stats["accepted_tokens"] > 0  # the draft's proposals were really compared
    if bigger == "draft":  # q is cut to the target's ids and renormalised: sampling works too
        sampled = run(target, decoder, draft=draft, temperature=1.0)
        assert len(sampled.output_ids) == N and max(sampled.output_ids) < target.vocab_size


def _resized(model, size: int, tokens: int):
    import copy

    out = copy.deepcopy(model)
    out.resize_token_embeddings(size, mean_resizing=False)
    with torch.no_grad():
        out.get_output_embeddings().weight[tokens:] = 0.0  # padded rows, as in real checkpoints
    return out.eval()


def test_a_draft_that_cannot_embed_the_tokenizer_is_refused(tokenizer):
    target = handle_from_model(build_causal("llama", tokenizer), tokenizer, name="full")
    short = handle_from_model(build_causal("llama", tokenizer, draft=True, vocab=len(tokenizer) - 20), tokenizer,
                              name="short")
    with pytest.raises(PlaygroundError, match=r"draft model 'short' embeds \d+ token ids"):
        run(target, "speculative", draft=short)


# ---------------------------------------------------------------------- the runtime lossless check
def test_runtime_check_counts_a_committed_token_that_is_not_the_argmax(models, monkeypatch):
    import decoders.draft_tree as verify

    target, _ = models("llama")
    real = verify.verify_group

    def accept_all(p, cands, *a, **k):  # a broken acceptance rule: takes every candidate
        idx, trials, residual, forced = real(p, cands, *a, **k)
        return 0, trials[:1], residual, forced

    monkeypatch.setattr(verify, "verify_group", accept_all)
    trace = run(target, "prompt_lookup", prompt=MORE_PROMPTS[0], n=16)
    assert trace.stats["lossless_mismatch"] > 0
    flagged = [s for s in trace.steps if s.evidence.get("lossless_mismatch")]
    assert flagged and sum(s.evidence["lossless_mismatch"] for s in flagged) == trace.stats["lossless_mismatch"]


def test_runtime_check_is_off_where_the_rule_is_lossy(models):
    target, draft = models("llama")
    trace = run(target, "speculative", draft=draft, accept="top_m")
    assert "lossless_mismatch" not in trace.stats


# ---------------------------------------------------------------------- the doc
def test_models_doc_shows_the_current_matrix():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text()
    assert BEGIN in doc, "docs/models.md lacks the architecture table"
    assert doc_section(doc) == support_table().strip(), \
        "docs/models.md is stale: run python3 tests/_arch_models.py --write"


@pytest.mark.parametrize("arch", ["mamba", "gemma2"])
def test_repeat_batch_copies_every_kind_of_cache(models, arch):
    """Beams and candidates copy the prompt's cache per hypothesis: recurrent layers too."""
    from decoders.kv_cache import repeat_batch

    target, _ = models(arch)
    ids = target.encode(PROMPT)
    cache = target.forward(ids, cache=target.new_cache()).cache
    repeat_batch(cache, 3)
    nxt = [5, 6, 7]
    got = target.forward(torch.tensor([[t] for t in nxt]), cache=cache).logits[:, 0]
    want = torch.stack([target.forward(ids + [t]).logits[0, -1] for t in nxt])
    assert torch.allclose(got, want, atol=1e-4)
