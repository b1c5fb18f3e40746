"""The contrastive family: contrastive search, contrastive decoding, CFG, DoLa and CAD.

Each decoder is checked token for token against a straight-line reference written from its
paper here (no KV cache: every step recomputes the whole sequence with the bare model), on
tiny random Llama- and GPT-2-shaped models, and against outputs transformers 4.46.3's
``generate`` produced on the very same weights (recorded below, so no second transformers
is needed). Plus the degenerate knobs, the evidence recomputed from logits, forward counts
and one-line errors.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import decoders
from conftest import build_tokenizer
from decoders.base import Context
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model
from playground.core.trace import validate_trace_dict

PROMPTS = ["ROMEO:", "To be, or not to be", "JULIET: O Romeo, Romeo", "and tomorrow, and"]
N = 8


# ---------------------------------------------------------------------- models
def make_llama(tok, seed: int, layers: int, tied: bool, scale: float):
    """A random Llama; ``scale`` sharpens the LM head (random init is near uniform)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def make_gpt2(tok, seed: int, layers: int, tied: bool, scale: float):
    """A random GPT-2; ``scale`` as in :func:`make_llama`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=layers, n_head=4, n_positions=256,
                     eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, tie_word_embeddings=tied)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def make_tied(make):
    """A deeper tied model that does not just echo its last input token.

    With tied weights the head is the embedding matrix, so a random model's residual stream
    (the input token's embedding) decides the argmax; shrinking the embeddings and
    sharpening the final norm instead lets the blocks speak, and DoLa's layer choice with it.
    """
    def build(tok, seed: int, layers: int, tied: bool, scale: float):
        model = make(tok, seed, layers, tied, 1.0)
        with torch.no_grad():
            final_norm = model.transformer.ln_f if hasattr(model, "transformer") else model.model.norm
            final_norm.weight.mul_(scale)
            model.get_input_embeddings().weight.mul_(0.05)
        return model
    return build


# Tied two-layer models (their embedding output is never a DoLa candidate), untied
# eight-layer ones, whose premature layers disagree enough with the last for DoLa to matter,
# and tied 6-, 8- and 60-layer ones, where transformers starts DoLa's low layers at layer 2.
SPECS = {
    "llama": (make_llama, 0, 2, True, 2.0),
    "gpt2": (make_gpt2, 0, 2, True, 2.0),
    "llama8": (make_llama, 3, 8, False, 30.0),
    "gpt2_8": (make_gpt2, 4, 8, False, 30.0),
    "amateur": (make_llama, 1, 1, False, 30.0),
    "gpt2_6t": (make_tied(make_gpt2), 5, 6, True, 30.0),
    "llama8t": (make_tied(make_llama), 6, 8, True, 30.0),
    "gpt2_60t": (make_tied(make_gpt2), 7, 60, True, 30.0),
}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def handles(tok):
    out = {}
    for name, (make, seed, layers, tied, scale) in SPECS.items():
        out[name] = handle_from_model(make(tok, seed, layers, tied, scale), tok, name=name)
    return out


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def run_ids(handle, decoder: str, prompt_ids: list[int], n: int, params: dict, draft=None, seed: int = 0):
    """Run a decoder on prompt ids; return (tokens, steps, target view, draft view)."""
    cls = decoders.get_decoder(decoder)
    ctx = Context(target=handle.view(), draft=draft.view() if draft is not None else None,
                  prompt_ids=list(prompt_ids), max_new_tokens=n, params=cls.params.validate(decoder, params),
                  seed=seed, stop_ids=set(handle.eos_ids))
    steps = list(cls().run(ctx))
    return [t for s in steps for t in s.committed], steps, ctx.target, ctx.draft


# ---------------------------------------------------------------------- straight-line references
def forward(model, seq: list[int]):
    """The bare model on the whole sequence, no cache: (logits of the last position, hidden states)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([seq]), output_hidden_states=True, use_cache=False)
    return out.logits[0, -1].float(), [h[0] for h in out.hidden_states]


def eos_of(model) -> int:
    return model.config.eos_token_id


def ref_greedy(model, prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        tok = int(torch.argmax(forward(model, seq)[0]))
        seq.append(tok), out.append(tok)
        if tok == eos_of(model):
            break
    return out


def ref_contrastive_search(model, prompt: list[int], n: int, alpha: float, k: int) -> list[int]:
    """Su et al. 2022, eq. 5: argmax over the top-k of (1-a)·p(v) - a·max_j cos(h_v, h_j)."""
    seq, out = list(prompt), []
    for _ in range(n):
        logits, hidden = forward(model, seq)
        context = hidden[-1]  # last-layer states of every position so far
        probs = torch.softmax(logits, -1)
        top_p, top_ids = torch.topk(probs, k)
        best, best_score = None, -math.inf
        for p, v in zip(top_p.tolist(), top_ids.tolist()):
            h_v = forward(model, seq + [v])[1][-1][-1]
            penalty = max(float(F.cosine_similarity(h_v, h_j, dim=0, eps=0.0)) for h_j in context)
            score = (1 - alpha) * p - alpha * penalty
            if score > best_score:
                best, best_score = v, score
        seq.append(best), out.append(best)
        if best == eos_of(model):
            break
    return out


def ref_contrastive_decoding(expert, amateur, prompt: list[int], n: int, alpha: float, beta: float,
                             tau: float = 1.0) -> list[int]:
    """Li et al. 2023: argmax over {p_e >= alpha·max p_e} of log p_e - beta·log p_a, p_a at temperature tau."""
    seq, out = list(prompt), []
    for _ in range(n):
        le = torch.log_softmax(forward(expert, seq)[0], -1)
        la = torch.log_softmax(forward(amateur, seq)[0] / tau, -1)
        best, best_score = None, -math.inf
        for v in range(le.numel()):
            if le[v].exp() >= alpha * le.exp().max():
                score = float(le[v] - beta * la[v])
                if score > best_score:
                    best, best_score = v, score
        seq.append(best), out.append(best)
        if best == eos_of(expert):
            break
    return out


def ref_cfg(model, prompt: list[int], n: int, gamma: float, negative: list[int] | None) -> list[int]:
    """Sanchez et al. 2023: argmax of u + gamma·(c - u), u on the negative prompt (default:
    the last prompt token) followed by the output."""
    seq, out = list(prompt), []
    neg = list(negative) if negative else list(prompt[-1:])
    for _ in range(n):
        c = torch.log_softmax(forward(model, seq)[0], -1)
        u = torch.log_softmax(forward(model, neg + out)[0], -1)
        tok = int(torch.argmax(u + gamma * (c - u)))
        seq.append(tok), out.append(tok)
        if tok == eos_of(model):
            break
    return out


def test_cfg_with_a_temperature_samples_the_guided_distribution(handles, tok):
    h, gamma, temp = handles["gpt2_8"], 1.5, 0.8
    prompt = ids_of(tok, PROMPTS[3])
    out, steps, view, _ = run_ids(h, "cfg", prompt, N, {"guidance_scale": gamma, "temperature": temp}, seed=3)
    assert view.forwards == 2 * len(out)
    seq, neg = list(prompt), list(prompt[-1:])
    for i, (tok_id, step) in enumerate(zip(out, steps)):
        c = torch.log_softmax(forward(h.model, seq)[0], -1)
        u = torch.log_softmax(forward(h.model, neg + out[:i])[0], -1)
        want = torch.softmax((u + gamma * (c - u)) / temp, -1)
        d = step.evidence["dist"]
        assert d["chosen"] == tok_id and want[tok_id] > 0
        for t, p in zip(d["top_ids"], d["final_probs"]):
            assert p == pytest.approx(float(want[t]), abs=1e-5)
        seq.append(tok_id)
    again = run_ids(h, "cfg", prompt, N, {"guidance_scale": gamma, "temperature": temp}, seed=3)[0]
    others = {tuple(run_ids(h, "cfg", prompt, N, {"guidance_scale": gamma, "temperature": temp}, seed=s)[0])
              for s in range(4)}
    assert again == out and len(others) > 1


def ref_dola(model, prompt: list[int], n: int, layers: list[int], penalty: float) -> list[int]:
    """Chuang et al. 2024: the premature layer of largest divergence from the final one,
    log q_N - log q_M over {q_N >= 0.1·max q_N}, the repetition penalty, argmax.

    The divergence is the one transformers 4.x maximises, 0.5·(KL(M‖P) + KL(M‖Q)) with M the
    mean of the two distributions; the LM head reads a premature layer without the final norm.
    """
    head = model.get_output_embeddings()
    seq, out = list(prompt), []
    for _ in range(n):
        logits, hidden = forward(model, seq)
        lp = torch.log_softmax(logits, -1)
        best_layer, best_div = None, -math.inf
        for j in layers:
            with torch.no_grad():
                lq = torch.log_softmax(head(hidden[j][-1]).float(), -1)
            m = 0.5 * (lp.exp() + lq.exp())
            div = 0.5 * (float((m * (m.log() - lp)).sum()) + float((m * (m.log() - lq)).sum()))
            if div > best_div:
                best_layer, best_div = lq, div
        scores = torch.full_like(lp, -math.inf)
        keep = lp >= lp.max() + math.log(0.1)
        scores[keep] = (lp - best_layer)[keep]
        for v in set(seq):
            s = scores[v]
            scores[v] = s * penalty if s < 0 else s / penalty
        tok = int(torch.argmax(scores))
        seq.append(tok), out.append(tok)
        if tok == eos_of(model):
            break
    return out


# ---------------------------------------------------------------------- transformers 4.46.3
# generate(do_sample=False, max_new_tokens=12, ...) on the models of SPECS, prompt PROMPTS[i];
# recorded once in a throwaway venv with transformers==4.46.3 (torch 2.13.0, CPU).
TRANSFORMERS_446 = [
    ("llama", "contrastive_search", 0, {"penalty_alpha": 0.6, "top_k": 4},
     [230, 100, 280, 211, 276, 178, 205, 307, 117, 254, 212, 259]),
    ("llama", "contrastive_search", 1, {"penalty_alpha": 0.6, "top_k": 4},
     [48, 199, 231, 127, 275, 250, 219, 145, 17, 272, 82, 19]),
    ("gpt2", "contrastive_search", 0, {"penalty_alpha": 0.6, "top_k": 4},
     [247, 108, 290, 192, 301, 260, 196, 209, 91, 22, 169, 177]),
    ("gpt2", "contrastive_search", 1, {"penalty_alpha": 0.6, "top_k": 4},
     [280, 65, 162, 192, 301, 39, 163, 120, 214, 211, 131, 149]),
    ("gpt2", "cfg", 0, {"guidance_scale": 3.0}, [28, 28, 208, 208, 192, 192, 192, 192, 192, 192, 192, 192]),
    ("gpt2", "cfg", 3, {"guidance_scale": 3.0, "negative_prompt": "HAMLET:"},
     [270, 270, 270, 270, 270, 270, 270, 209, 209, 252, 252, 252]),
    ("llama8", "cfg", 0, {"guidance_scale": 1.5}, [122, 193, 122, 18, 122, 18, 122, 18, 18, 18, 18, 18]),
    ("llama8", "cfg", 3, {"guidance_scale": 0.5, "negative_prompt": "HAMLET:"},
     [315, 97, 117, 139, 116, 117, 155, 116, 155, 116, 155, 116]),
    ("gpt2_8", "cfg", 3, {"guidance_scale": 1.5, "negative_prompt": "HAMLET:"},
     [158, 217, 278, 279, 103, 76, 314, 81, 37, 51, 70, 27]),
    ("llama8", "dola", 0, {"dola_layers": "high", "repetition_penalty": 1.2},
     [122, 177, 19, 256, 18, 256, 18, 256, 18, 256, 215, 190]),
    ("llama8", "dola", 1, {"dola_layers": "low", "repetition_penalty": 1.2},
     [104, 104, 215, 83, 258, 82, 206, 206, 206, 206, 206, 206]),
    ("llama8", "dola", 3, {"dola_layers": "2,4,6", "repetition_penalty": 1.2},
     [45, 112, 103, 93, 113, 113, 113, 113, 113, 113, 113, 113]),
    ("gpt2_8", "dola", 0, {"dola_layers": "low", "repetition_penalty": 1.2},
     [300, 40, 278, 7, 51, 76, 314, 81, 135, 304, 217, 31]),
    ("gpt2_8", "dola", 2, {"dola_layers": "low", "repetition_penalty": 1.0},
     [64, 205, 28, 286, 107, 123, 304, 207, 174, 131, 70, 166]),
    ("gpt2_6t", "dola", 0, {"dola_layers": "low", "repetition_penalty": 1.2},
     [143, 92, 128, 252, 255, 90, 157, 71, 279, 208, 31, 315]),
    ("llama8t", "dola", 0, {"dola_layers": "low", "repetition_penalty": 1.2},
     [127, 143, 293, 97, 143, 143, 303, 221, 143, 143, 143, 246]),
    ("llama8t", "dola", 3, {"dola_layers": "low", "repetition_penalty": 1.2},
     [260, 129, 210, 250, 260, 260, 260, 260, 260, 260, 260, 260]),
    ("gpt2_60t", "dola", 1, {"dola_layers": "low", "repetition_penalty": 1.2},
     [131, 303, 127, 297, 173, 318, 2, 105, 167, 245, 188, 75]),
    ("gpt2_60t", "dola", 2, {"dola_layers": "high", "repetition_penalty": 1.2},
     [18, 203, 131, 303, 127, 297, 173, 305, 43, 105, 167, 245]),
]


@pytest.mark.parametrize("model,decoder,prompt,params,expected", TRANSFORMERS_446,
                         ids=[f"{m}-{d}-{p}-{i}" for i, (m, d, p, _, _) in enumerate(TRANSFORMERS_446)])
def test_equals_transformers_446(handles, tok, model, decoder, prompt, params, expected):
    got, _, _, _ = run_ids(handles[model], decoder, ids_of(tok, PROMPTS[prompt]), 12, params)
    assert got == expected


def test_the_recorded_outputs_are_not_greedy(handles, tok):
    # otherwise the table above would test nothing but greedy decoding
    for model, _, prompt, _, expected in TRANSFORMERS_446:
        assert ref_greedy(handles[model].model, ids_of(tok, PROMPTS[prompt]), 12) != expected


# ---------------------------------------------------------------------- contrastive search
@pytest.mark.parametrize("model", ["llama", "gpt2"])
@pytest.mark.parametrize("alpha,k", [(0.6, 4), (0.4, 7), (0.9, 2)])
def test_contrastive_search_equals_reference(handles, tok, model, alpha, k):
    h = handles[model]
    for text in PROMPTS[:3]:
        prompt = ids_of(tok, text)
        got, _, _, _ = run_ids(h, "contrastive_search", prompt, N, {"penalty_alpha": alpha, "top_k": k})
        assert got == ref_contrastive_search(h.model, prompt, N, alpha, k), (model, text)


@pytest.mark.parametrize("model", ["llama", "gpt2", "llama8"])
def test_contrastive_search_alpha_0_is_greedy(handles, tok, model):
    for text in PROMPTS:
        prompt = ids_of(tok, text)
        greedy, _, _, _ = run_ids(handles[model], "greedy", prompt, N, {})
        got, _, _, _ = run_ids(handles[model], "contrastive_search", prompt, N, {"penalty_alpha": 0.0, "top_k": 5})
        assert got == greedy


def test_contrastive_search_candidate_table_and_forwards(handles, tok):
    h = handles["gpt2"]
    prompt = ids_of(tok, PROMPTS[1])
    alpha, k = 0.6, 5
    out, steps, view, _ = run_ids(h, "contrastive_search", prompt, N, {"penalty_alpha": alpha, "top_k": k})
    assert len(out) == N
    seq = list(prompt)
    for tok_id, step in zip(out, steps):
        probs = torch.softmax(forward(h.model, seq)[0], -1)
        table = step.evidence["candidates"]
        assert [c["token"] for c in table] == torch.topk(probs, k).indices.tolist()
        for c in table:
            assert c["p"] == pytest.approx(float(probs[c["token"]]), abs=1e-5)
            assert c["score"] == pytest.approx((1 - alpha) * c["p"] - alpha * c["penalty"], abs=1e-5)
            assert -1.0 - 1e-5 <= c["penalty"] <= 1.0 + 1e-5 and 0 <= c["closest"] < len(seq)
        picked = [c for c in table if c["picked"]]
        assert len(picked) == 1 and picked[0]["token"] == tok_id
        assert picked[0]["score"] == max(c["score"] for c in table)
        assert step.evidence["dist"]["chosen"] == tok_id
        seq.append(tok_id)
    # the prompt, then one batched forward of the k candidates per token
    assert view.forwards == 1 + N
    assert view.tokens == len(prompt) + k * N


def test_contrastive_search_top_k_larger_than_the_vocabulary(handles, tok):
    h = handles["llama"]
    got, steps, _, _ = run_ids(h, "contrastive_search", ids_of(tok, "ROMEO:"), 2, {"top_k": 100})
    assert len(got) == 2 and len(steps[0].evidence["candidates"]) == min(100, h.vocab_size)


# ---------------------------------------------------------------------- contrastive decoding
@pytest.mark.parametrize("expert", ["llama8", "gpt2_8"])
@pytest.mark.parametrize("alpha,beta", [(0.1, 1.0), (0.0, 0.5), (0.3, 2.0)])
def test_contrastive_decoding_equals_reference(handles, tok, expert, alpha, beta):
    e, a = handles[expert], handles["amateur"]
    for text in PROMPTS[:3]:
        prompt = ids_of(tok, text)
        got, _, _, _ = run_ids(e, "contrastive", prompt, N, {"alpha": alpha, "beta": beta}, draft=a)
        assert got == ref_contrastive_decoding(e.model, a.model, prompt, N, alpha, beta), (expert, text)


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_contrastive_decoding_amateur_temperature_equals_reference(handles, tok, tau):
    e, a = handles["gpt2_8"], handles["amateur"]
    differs = 0
    for text in PROMPTS[:3]:
        prompt = ids_of(tok, text)
        got, _, _, _ = run_ids(e, "contrastive", prompt, N, {"amateur_temperature": tau}, draft=a)
        assert got == ref_contrastive_decoding(e.model, a.model, prompt, N, 0.1, 1.0, tau), text
        differs += got != ref_contrastive_decoding(e.model, a.model, prompt, N, 0.1, 1.0)
    assert differs  # the knob changes the contrast on these models


def test_contrastive_decoding_changes_greedy(handles, tok):
    e, a = handles["llama8"], handles["amateur"]
    changed = 0
    for text in PROMPTS:
        prompt = ids_of(tok, text)
        changed += run_ids(e, "contrastive", prompt, N, {}, draft=a)[0] != ref_greedy(e.model, prompt, N)
    assert changed >= 2


def test_contrastive_decoding_rule_from_the_two_models_logits(handles, tok):
    e, a = handles["gpt2_8"], handles["amateur"]
    prompt = ids_of(tok, PROMPTS[0])
    alpha, beta = 0.1, 1.0
    out, steps, ev, av = run_ids(e, "contrastive", prompt, N, {"alpha": alpha, "beta": beta}, draft=a)
    seq = list(prompt)
    for tok_id, step in zip(out, steps):
        pe = torch.softmax(forward(e.model, seq)[0], -1)
        pa = torch.softmax(forward(a.model, seq)[0], -1)
        c = step.evidence["contrast"]
        assert c["labels"] == ["expert", "amateur", "contrast"] and c["chosen"] == tok_id
        plausible = pe >= alpha * pe.max()
        assert c["plausible"] == int(plausible.sum())
        for t, p_e, p_a, s in zip(c["top_ids"], c["probs"]["expert"], c["probs"]["amateur"], c["scores"]):
            assert p_e == pytest.approx(float(pe[t]), abs=1e-5) and p_a == pytest.approx(float(pa[t]), abs=1e-5)
            if plausible[t]:
                # beta = 1: exactly log p_expert - log p_amateur
                assert s == pytest.approx(math.log(pe[t]) - math.log(pa[t]), abs=1e-4)
            else:
                assert s is None
        best = max((s, t) for t, s in zip(c["top_ids"], c["scores"]) if s is not None)
        assert best[1] == tok_id
        ranked = c["ranks"]
        assert c["rank_changed"] == [t for t, x, y in zip(c["top_ids"], ranked["expert"], ranked["contrast"]) if x != y]
        seq.append(tok_id)
    # one expert and one amateur forward per token: the amateur's count as draft forwards
    assert ev.forwards == N and av.forwards == N


def test_contrastive_decoding_beta_0_is_greedy(handles, tok):
    e, a = handles["llama8"], handles["amateur"]
    for text in PROMPTS:
        prompt = ids_of(tok, text)
        assert run_ids(e, "contrastive", prompt, N, {"beta": 0.0, "alpha": 0.5}, draft=a)[0] == ref_greedy(e.model, prompt, N)


def test_contrastive_decoding_samples_from_the_contrast(handles, tok):
    e, a = handles["llama8"], handles["amateur"]
    prompt = ids_of(tok, PROMPTS[2])
    runs = [run_ids(e, "contrastive", prompt, N, {"temperature": 1.0}, draft=a, seed=s) for s in range(4)]
    assert run_ids(e, "contrastive", prompt, N, {"temperature": 1.0}, draft=a, seed=2)[0] == runs[2][0]
    assert len({tuple(r[0]) for r in runs}) > 1
    for out, steps, _, _ in runs:
        for t, step in zip(out, steps):
            c = step.evidence["contrast"]
            # never outside the plausible set: its contrast probability is positive
            assert c["scores"][c["top_ids"].index(t)] is not None
            assert step.evidence["dist"]["final_probs"][step.evidence["dist"]["top_ids"].index(t)] > 0


# ---------------------------------------------------------------------- classifier-free guidance
@pytest.mark.parametrize("model", ["llama", "gpt2", "llama8", "gpt2_8"])
@pytest.mark.parametrize("gamma,negative", [(1.5, ""), (3.0, "HAMLET:"), (0.5, "")])
def test_cfg_equals_reference(handles, tok, model, gamma, negative):
    h = handles[model]
    for text in PROMPTS[::2]:
        prompt = ids_of(tok, text)
        got, _, _, _ = run_ids(h, "cfg", prompt, N, {"guidance_scale": gamma, "negative_prompt": negative})
        assert got == ref_cfg(h.model, prompt, N, gamma, ids_of(tok, negative)), (model, text)


@pytest.mark.parametrize("model", ["llama", "gpt2_8"])
def test_cfg_scale_1_is_greedy_at_greedy_cost(handles, tok, model):
    for text in PROMPTS:
        prompt = ids_of(tok, text)
        greedy, _, gv, _ = run_ids(handles[model], "greedy", prompt, N, {})
        got, _, cv, _ = run_ids(handles[model], "cfg", prompt, N, {"guidance_scale": 1.0, "negative_prompt": "x"})
        assert got == greedy and cv.forwards == gv.forwards


def test_cfg_counts_both_passes_and_records_them(handles, tok):
    h = handles["llama8"]
    prompt = ids_of(tok, PROMPTS[0])
    gamma = 1.5
    out, steps, view, _ = run_ids(h, "cfg", prompt, N, {"guidance_scale": gamma})
    assert len(out) == N
    assert view.forwards == 2 * N
    assert view.tokens == (len(prompt) + N - 1) + (1 + N - 1)
    seq = list(prompt)
    for i, (tok_id, step) in enumerate(zip(out, steps)):
        c = step.evidence["contrast"]
        assert c["labels"] == ["conditional", "unconditional", "guided"]
        cond = torch.log_softmax(forward(h.model, seq)[0], -1)
        unc = torch.log_softmax(forward(h.model, prompt[-1:] + out[:i])[0], -1)
        for t, s in zip(c["top_ids"], c["scores"]):
            assert s == pytest.approx(float(unc[t] + gamma * (cond[t] - unc[t])), abs=1e-4)
        seq.append(tok_id)


# ---------------------------------------------------------------------- DoLa
DOLA_CASES = [("llama8", "high", 1.2), ("llama8", "low", 1.0), ("llama8", "0,3,5", 1.2),
              ("gpt2_8", "high", 1.2), ("gpt2_8", "low", 1.2), ("gpt2_8", "1,6", 1.0),
              ("llama", "low", 1.2), ("gpt2", "1", 1.2)]


@pytest.mark.parametrize("model,layers,penalty", DOLA_CASES)
def test_dola_equals_reference(handles, tok, model, layers, penalty):
    from decoders.contrastive.dola import candidate_layers

    h = handles[model]
    cand = candidate_layers(layers, h.num_layers, h.config.tie_word_embeddings)
    for text in PROMPTS[:3]:
        prompt = ids_of(tok, text)
        got, _, _, _ = run_ids(h, "dola", prompt, N, {"dola_layers": layers, "repetition_penalty": penalty})
        assert got == ref_dola(h.model, prompt, N, cand, penalty), (model, layers, text)


def test_dola_candidate_layers_as_transformers():
    from decoders.contrastive.dola import candidate_layers

    assert candidate_layers("low", 8, False) == [0, 2] and candidate_layers("high", 8, False) == [4, 6]
    # tied: the embedding output is skipped, low starts at 2 (1 for two layers, 0 for one)
    assert candidate_layers("low", 8, True) == [2] and candidate_layers("low", 2, True) == [1]
    assert candidate_layers("low", 6, True) == [2] and candidate_layers("low", 1, True) == [0]
    assert candidate_layers("low", 12, True) == [2, 4]
    assert candidate_layers("high", 32, True) == list(range(16, 32, 2))
    assert candidate_layers("low", 60, True) == list(range(2, 20, 2))
    assert candidate_layers("high", 60, True) == list(range(40, 60, 2))
    assert candidate_layers(" 3, 0 ", 8, False) == [3, 0]


@pytest.mark.parametrize("model,layers", [("gpt2_6t", [2]), ("llama8t", [2]), ("gpt2_60t", list(range(2, 20, 2)))])
def test_dola_low_layers_of_tied_models_in_the_evidence(handles, tok, model, layers):
    _, steps, _, _ = run_ids(handles[model], "dola", ids_of(tok, PROMPTS[0]), 2, {"dola_layers": "low"})
    assert all(step.evidence["dola"]["layers"] == layers for step in steps)


def test_dola_evidence_and_forwards(handles, tok):
    h = handles["gpt2_8"]
    prompt = ids_of(tok, PROMPTS[1])
    out, steps, view, _ = run_ids(h, "dola", prompt, N, {"dola_layers": "high"})
    assert view.forwards == N
    seen = set()
    for step in steps:
        d = step.evidence["dola"]
        assert d["layers"] == [4, 6] and d["num_layers"] == 8
        div = d["divergence"]
        assert all(x >= 0 for x in div)
        assert d["premature"] == d["layers"][div.index(max(div))]
        assert step.evidence["contrast"]["labels"] == ["final", "premature", "contrast"]
        seen.add(d["premature"])
    assert seen  # the record names a chosen layer at every step


# ---------------------------------------------------------------------- context-aware decoding
CAD_PROMPTS = ["ROMEO: the moon is green.\n\nWhat colour is the moon?", "To be, or not\n\nto be"]


def ref_cad(model, tok, text: str, n: int, alpha: float, separator: str = "\n\n") -> list[int]:
    """Shi et al. 2023: argmax of (1+a)·logits(y | c, x) - a·logits(y | x)."""
    seq, out = ids_of(tok, text), []
    question = ids_of(tok, text.split(separator, 1)[1])
    for _ in range(n):
        with_c = forward(model, seq)[0]
        without = forward(model, question + out)[0]
        tok_id = int(torch.argmax((1 + alpha) * with_c - alpha * without))
        seq.append(tok_id), out.append(tok_id)
        if tok_id == eos_of(model):
            break
    return out


@pytest.mark.parametrize("model", ["llama8", "gpt2_8", "gpt2"])
@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_cad_equals_reference(handles, tok, model, alpha):
    h = handles[model]
    for text in CAD_PROMPTS:
        got, _, view, _ = run_ids(h, "cad", ids_of(tok, text), N, {"alpha": alpha})
        assert got == ref_cad(h.model, tok, text, N, alpha), (model, text)
        assert view.forwards == 2 * len(got)


def test_cad_changes_greedy_and_alpha_0_is_greedy(handles, tok):
    h = handles["llama8"]
    changed = 0
    for text in CAD_PROMPTS:
        prompt = ids_of(tok, text)
        greedy, _, gv, _ = run_ids(h, "greedy", prompt, N, {})
        got, _, cv, _ = run_ids(h, "cad", prompt, N, {"alpha": 0.0})
        assert got == greedy and cv.forwards == gv.forwards
        changed += run_ids(h, "cad", prompt, N, {"alpha": 1.0})[0] != greedy
    assert changed >= 1


def test_cad_samples_with_common_random_numbers(handles, tok):
    h = handles["gpt2_8"]
    prompt = ids_of(tok, CAD_PROMPTS[0])
    runs = [run_ids(h, "cad", prompt, N, {"temperature": 1.0}, seed=s)[0] for s in range(4)]
    assert runs[1] == run_ids(h, "cad", prompt, N, {"temperature": 1.0}, seed=1)[0]
    assert len({tuple(r) for r in runs}) > 1


# ---------------------------------------------------------------------- bad inputs, traces
def one_line_error(**request) -> str:
    with pytest.raises(PlaygroundError) as e:
        prepare(**request).finish()
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def test_bad_inputs_are_one_line(handles, tok):
    h = handles["llama8"]
    assert "draft" in one_line_error(model=h, decoder="contrastive", prompt="ROMEO:", max_new_tokens=4)
    other_tok = build_tokenizer(vocab_size=300)
    other = handle_from_model(make_llama(other_tok, 5, 1, False, 1.0), other_tok, name="other-tok")
    assert "tokenizer" in one_line_error(model=h, decoder="contrastive", prompt="ROMEO:", max_new_tokens=4,
                                         draft=other)
    msg = one_line_error(model=h, decoder="dola", prompt="ROMEO:", max_new_tokens=4, params={"dola_layers": "2,8"})
    assert "out of range" in msg and "0..7" in msg
    for bad in ("middle", "1,x", "-1", "2,2", ","):
        one_line_error(model=h, decoder="dola", prompt="ROMEO:", max_new_tokens=4, params={"dola_layers": bad})
    one_line_error(model=h, decoder="contrastive_search", prompt="ROMEO:", max_new_tokens=4, params={"top_k": 0})
    one_line_error(model=h, decoder="contrastive_search", prompt="ROMEO:", max_new_tokens=4,
                   params={"penalty_alpha": 1.5})
    one_line_error(model=h, decoder="cfg", prompt="ROMEO:", max_new_tokens=4, params={"guidance_scale": -1})
    assert "separator" in one_line_error(model=h, decoder="cad", prompt="ROMEO: no question here", max_new_tokens=4)
    assert "question" in one_line_error(model=h, decoder="cad", prompt="ROMEO:\n\n", max_new_tokens=4)
    long_negative = "ROMEO: " * 200
    assert "negative prompt" in one_line_error(model=h, decoder="cfg", prompt="ROMEO:", max_new_tokens=4,
                                               params={"negative_prompt": long_negative})


def test_amateur_with_a_smaller_vocabulary_is_refused(handles, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok) - 10, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    small = handle_from_model(LlamaForCausalLM(cfg).eval(), tok, name="small-vocab")
    msg = one_line_error(model=handles["llama8"], decoder="contrastive", prompt="ROMEO:", max_new_tokens=4,
                         draft=small)
    assert "vocabulary" in msg


@pytest.mark.parametrize("decoder,params", [("contrastive_search", {}), ("contrastive", {}),
                                            ("contrastive", {"temperature": 0.7}), ("cfg", {}),
                                            ("cfg", {"negative_prompt": "HAMLET:"}), ("dola", {}),
                                            ("cad", {"separator": "\n"})])
def test_traces_on_the_bundled_model_are_valid(decoder, params):
    trace = prepare(model="tiny-shakespeare", decoder=decoder, prompt="ROMEO:\nWhat say you?", max_new_tokens=6,
                    draft="tiny-shakespeare-draft" if decoder == "contrastive" else None, params=params).finish()
    d = trace.to_dict()
    validate_trace_dict(d)
    json.dumps(d, allow_nan=False)
    assert d["output_ids"] == [t for s in d["steps"] for t in s["committed"]] and len(d["output_ids"]) == 6
    if decoder == "contrastive":
        assert d["stats"]["draft_forwards"] == 6 and d["stats"]["target_forwards"] == 6
    if decoder in ("cfg", "cad"):
        assert d["stats"]["target_forwards"] == 12
