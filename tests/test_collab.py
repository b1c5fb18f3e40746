"""Small-large collaboration: entropy-adaptive decoding (EAD) and its two limits, source of
every token, and the one-line refusals (no small model, a diffusion model as the target)."""

from __future__ import annotations

import pytest
import torch

from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model

PROMPTS = ["ROMEO: But soft", "JULIET: O Romeo", "To be, or not to be"]


def untied_llama(tokenizer, seed: int, layers: int, hidden: int, name: str):
    """A tiny random Llama with an untied, scaled LM head: peaked, varied next-token choices
    (the tied tiny models of conftest mostly repeat their input, so two of them agree)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(16.0)
    return handle_from_model(model, tokenizer, name=name)


@pytest.fixture(scope="module")
def large(tokenizer):
    return untied_llama(tokenizer, 1, 2, 64, "collab-large")


@pytest.fixture(scope="module")
def small(tokenizer):
    return untied_llama(tokenizer, 2, 1, 32, "collab-small")


def run(handle, decoder, prompt, n, params=None, draft=None, seed=0):
    return prepare(model=handle, decoder=decoder, prompt=prompt, max_new_tokens=n, params=params or {},
                   draft=draft, seed=seed).finish()


def greedy_ids(handle, prompt, n):
    return run(handle, "greedy", prompt, n).output_ids


def next_argmax(handle, ids) -> int:
    return int(torch.argmax(handle.forward(list(ids)).logits[0, -1]))


# ---------------------------------------------------------------------- EAD
@pytest.mark.parametrize("prompt", PROMPTS)
def test_ead_limits(large, small, prompt):
    """A threshold above any entropy: the small model's greedy text and no large forward;
    a threshold of 0: the large model's greedy text, every token from it."""
    never = run(large, "ead", prompt, 12, {"entropy_threshold": 100.0}, draft=small)
    assert never.output_ids == greedy_ids(small, prompt, 12)
    assert never.stats["target_forwards"] == 0 and never.stats["small_share"] == 1.0
    always = run(large, "ead", prompt, 12, {"entropy_threshold": 0.0, "span": 3}, draft=small)
    assert always.output_ids == greedy_ids(large, prompt, 12)
    assert always.output_ids != never.output_ids  # the two models really disagree
    assert always.stats["small_share"] == 0.0
    assert all(s.evidence["source"] == "large" for s in always.steps)


def test_ead_hands_over_for_a_span_and_every_token_is_its_writers_greedy(large, small):
    entropies = [s.evidence["handover"]["small_entropy"] for s in run(large, "ead", PROMPTS[0], 16,
                                                          {"entropy_threshold": 100.0}, draft=small).steps]
    thr = sorted(entropies)[len(entropies) // 2]  # about half the positions trigger
    span = 3
    trace = run(large, "ead", PROMPTS[0], 16, {"entropy_threshold": thr, "span": span}, draft=small)
    ids = list(trace.prompt_ids)
    left = 0
    sources = set()
    for s in trace.steps:
        ev = s.evidence["handover"]
        tok = s.committed[0]
        if left == 0:
            assert ev.get("trigger", False) == (ev["rolling_entropy"] > thr)
            if ev.get("trigger"):
                left = span
        expect = "large" if left else "small"
        assert ev["source"] == expect
        sources.add(expect)
        assert tok == next_argmax(large if left else small, ids)
        assert s.evidence["dist"]["chosen"] == tok and s.evidence["source"] == ev["source"]
        left = max(0, left - 1)
        ids.append(tok)
    assert sources == {"small", "large"}
    n_small = sum(1 for s in trace.steps if s.evidence["source"] == "small")
    assert trace.stats["small_share"] == pytest.approx(n_small / len(trace.steps), abs=1e-4)
    assert trace.stats["target_forwards"] <= trace.stats["large_tokens"]  # the large model runs only in spans
    assert trace.extra.get("lossy") is True  # flagged: the output is neither model's own greedy text


def test_ead_rolling_window_averages_the_small_models_entropy(large, small):
    trace = run(large, "ead", PROMPTS[1], 10, {"entropy_threshold": 100.0, "window": 3}, draft=small)
    hs = [s.evidence["handover"]["small_entropy"] for s in trace.steps]
    for i, s in enumerate(trace.steps):
        recent = hs[max(0, i - 2): i + 1]
        assert s.evidence["handover"]["rolling_entropy"] == pytest.approx(sum(recent) / len(recent), abs=1e-4)


def test_ead_large_model_hands_back_when_its_rolling_entropy_drops(large, small):
    """Constructed case: the small model always triggers (threshold 0) and the span is long, so
    every hand-back comes from the large model's rolling entropy falling below handback_threshold."""
    base = run(large, "ead", PROMPTS[2], 14, {"entropy_threshold": 0.0, "span": 1024, "window": 2}, draft=small)
    hs = [s.evidence["handover"]["large_entropy"] for s in base.steps]
    assert not any(s.evidence["handover"].get("handback") for s in base.steps)  # off: the span rules
    mid = sorted(hs)[len(hs) // 2 - 1: len(hs) // 2 + 1]
    back = sum(mid) / 2  # between two recorded values, so rounding in the evidence cannot flip a comparison
    trace = run(large, "ead", PROMPTS[2], 14, {"entropy_threshold": 0.0, "span": 1024, "window": 2,
                                               "handback_threshold": back}, draft=small)
    assert trace.output_ids == base.output_ids  # every token is still the large model's greedy
    recent: list[float] = []
    handbacks = 0
    for s in trace.steps:
        ev = s.evidence["handover"]
        assert ev["source"] == "large"
        if ev.get("trigger"):
            recent = []
        recent = (recent + [ev["large_entropy"]])[-2:]
        rolling = sum(recent) / len(recent)
        assert ev["large_rolling_entropy"] == pytest.approx(rolling, abs=1e-4)
        assert ev.get("handback", False) == (rolling < back)
        handbacks += bool(ev.get("handback"))
    assert handbacks > 0
    # after each hand-back the small model is asked again (and, at threshold 0, triggers at once)
    for a, b in zip(trace.steps, trace.steps[1:]):
        if a.evidence["handover"].get("handback"):
            assert b.evidence["handover"].get("trigger") is True


# ---------------------------------------------------------------------- speculative cascades
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("gamma", [1, 4])
def test_always_deferring_cascade_is_target_greedy(large, small, prompt, gamma):
    trace = run(large, "spec_cascade", prompt, 12, {"rule": "always", "gamma": gamma}, draft=small)
    assert trace.output_ids == greedy_ids(large, prompt, 12)
    assert trace.stats["changed_tokens"] == 0
    assert not trace.extra.get("lossy")


@pytest.mark.parametrize("rule,alpha", [("chow", 0.0), ("chow", 0.3), ("diff", 0.05), ("opt", 0.3)])
def test_cascade_counts_the_tokens_it_changed(large, small, rule, alpha):
    """Every committed token is the target's greedy choice unless it is a drafted token the
    rule kept; those are counted in changed_tokens, and the trace is flagged lossy."""
    trace = run(large, "spec_cascade", PROMPTS[0], 16, {"rule": rule, "alpha": alpha, "gamma": 3},
                draft=small)
    ids = list(trace.prompt_ids)
    changed = kept = 0
    for s in trace.steps:
        tree = s.evidence["tree"]
        nodes = tree["nodes"]
        for j, tok in enumerate(s.committed):
            best = next_argmax(large, ids)
            if j < len(tree["accepted_path"]):
                node = nodes[tree["accepted_path"][j]]
                assert node["token"] == tok and node["accepted"]
                assert node["changed"] == (tok != best)
                assert tok == best or not node["deferred"]  # a deferred position keeps only agreeing tokens
                changed += int(tok != best)
                kept += 1
            else:
                assert tok == best  # the correction or bonus token is the target's
            ids.append(tok)
    assert trace.stats["changed_tokens"] == changed
    assert trace.stats["small_share"] == pytest.approx(kept / len(trace.output_ids), abs=1e-4)
    assert trace.extra.get("lossy") is True
    if rule == "chow" and alpha == 0.0:  # never defers: every drafted token stands
        assert all(n["accepted"] for s in trace.steps for n in s.evidence["tree"]["nodes"])
        assert changed > 0


# ---------------------------------------------------------------------- diffuspec
@pytest.fixture(scope="module")
def bundled():
    from playground.core.models import load_model

    return load_model("tiny-shakespeare", device="cpu"), load_model("tiny-shakespeare-diffusion", device="cpu")


@pytest.mark.parametrize("prompt,knobs", [("ROMEO: But soft", {"gamma": 4, "draft_steps": 1}),
                                          ("JULIET:\nO Romeo", {"gamma": 6, "draft_steps": 3}),
                                          ("To be, or not to be", {"gamma": 3, "draft_steps": 3})])
def test_diffuspec_at_temperature_zero_is_target_greedy(bundled, prompt, knobs):
    target, diffusion = bundled
    trace = run(target, "diffuspec", prompt, 20, {"temperature": 0.0, **knobs}, draft=diffusion)
    assert trace.output_ids == greedy_ids(target, prompt, 20)
    assert trace.stats["accepted_tokens"] > 0  # the diffusion drafts really helped somewhere
    assert trace.stats["target_forwards"] < len(trace.output_ids)


def test_diffuspec_draft_view_shows_the_canvas(bundled):
    target, diffusion = bundled
    g, steps = 5, 2
    trace = run(target, "diffuspec", "ROMEO: But soft", 12, {"gamma": g, "draft_steps": steps}, draft=diffusion,
                seed=3)
    for s in trace.steps:
        dc = s.evidence["draft_canvas"]
        assert dc["mask_id"] == diffusion.mask_token_id
        drafted = [n["token"] for n in s.evidence["tree"]["nodes"]]
        if not drafted:
            continue
        assert all(n["source"] == "diffusion" for n in s.evidence["tree"]["nodes"])
        seen: list[int] = []
        for k, c in enumerate(dc["steps"]):
            seen += c["unmasked"]
            assert c["unmasked"] == sorted(c["unmasked"]) and (not k or c["unmasked"][0] > dc["steps"][k - 1]["unmasked"][-1])
            assert [t is not None for t in c["canvas"]] == [i in seen for i in range(len(c["canvas"]))]
        assert dc["steps"][-1]["canvas"] == drafted  # the last canvas is the drafted block
        assert len(dc["steps"]) == min(steps, len(drafted))
    assert trace.stats["draft_forwards"] == sum(len(s.evidence["draft_canvas"]["steps"]) for s in trace.steps)


def test_diffuspec_needs_a_diffusion_draft(bundled, large):
    target, _ = bundled
    with pytest.raises(PlaygroundError, match="a draft must be diffusion") as e:
        prepare(model=target, decoder="diffuspec", prompt="ROMEO:", max_new_tokens=4, draft="tiny-shakespeare-draft")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("decoder", ["ead", "spec_cascade", "diffuspec"])
def test_collab_needs_a_small_model(large, decoder):
    with pytest.raises(PlaygroundError, match="needs a draft model") as e:
        prepare(model=large, decoder=decoder, prompt="ROMEO:", max_new_tokens=4)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("decoder", ["ead", "spec_cascade", "diffuspec"])
def test_collab_refuses_a_diffusion_target(small, decoder):
    with pytest.raises(PlaygroundError, match=r"is a diffusion model.*causal") as e:
        prepare(model="tiny-shakespeare-diffusion", decoder=decoder, prompt="ROMEO:", max_new_tokens=4, draft=small)
    assert "\n" not in str(e.value)
