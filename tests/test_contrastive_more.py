"""More of the contrastive family: fsd (an n-gram anti-LM), lookback (KL to earlier steps),
and the logit lens on the family's token_loop decoders.

Each rule is recomputed by a straight-line reference written here from its paper: no KV
cache, every step runs the bare model on the whole sequence, the anti-LM is recounted from
the sequence by brute force. Tiny random Llama and GPT-2 models, and the bundled
tiny-shakespeare for the repetition behaviour.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import decoders
from decoders.base import Context
from decoders.contrastive.fsd import AntiLM
from playground.engine import prepare
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model
from playground.core.trace import validate_trace_dict
from test_contrastive import PROMPTS, forward, ids_of, make_gpt2, make_llama, ref_greedy, run_ids

from conftest import build_tokenizer

N = 8
REPETITIVE = "and tomorrow, and tomorrow, and tomorrow, and tomorrow, and"
LOOPING = "KING HENRY.\nOnce more unto the breach, dear friends,"  # greedy repeats its own lines on it


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def handles(tok):
    return {
        "llama": handle_from_model(make_llama(tok, 0, 2, True, 2.0), tok, name="llama"),
        "gpt2": handle_from_model(make_gpt2(tok, 0, 2, True, 2.0), tok, name="gpt2"),
        "llama8": handle_from_model(make_llama(tok, 3, 8, False, 30.0), tok, name="llama8"),
        "gpt2_8": handle_from_model(make_gpt2(tok, 4, 8, False, 30.0), tok, name="gpt2_8"),
        "amateur": handle_from_model(make_llama(tok, 1, 1, False, 30.0), tok, name="amateur"),
    }


def all_logits(model, seq: list[int]) -> torch.Tensor:
    """The bare model's logits at every position of ``seq`` (no cache)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].double()


# ---------------------------------------------------------------------- fsd
def ref_anti(seq: list[int], v: int, n: int, beta: float) -> float:
    """The n-gram anti-LM's probability of ``v`` after ``seq``, recounted from scratch:
    from the longest context down, each order whose context was followed by v in ``seq``
    takes beta of the remaining weight with count / (followers + 1); the unigram takes the
    rest with its plain frequency."""
    if len(seq) < n - 1:
        return 0.0
    remaining, score = 1.0, 0.0
    for i in range(n - 1, -1, -1):
        ctx = seq[len(seq) - i:] if i else []
        followers = [seq[j + i] for j in range(len(seq) - i) if seq[j:j + i] == ctx]
        c = followers.count(v)
        if c == 0:
            continue
        score += remaining * (c / len(followers) if i == 0 else beta * c / (len(followers) + 1))
        remaining *= 1 - beta
    return score


def ref_fsd(model, prompt: list[int], n_new: int, alpha: float, n: int, k: int, beta: float) -> list[int]:
    """Yang et al. 2023: argmax over the top-k of (1 - alpha)·p(v) - alpha·p_anti(v)."""
    seq, out = list(prompt), []
    for _ in range(n_new):
        p = torch.softmax(forward(model, seq)[0].double(), -1)
        best, best_score = None, -math.inf
        for v in sorted(torch.topk(p, k).indices.tolist()):  # ascending ids: ties go to the lowest
            s = (1 - alpha) * float(p[v]) - alpha * ref_anti(seq, v, n, beta)
            if s > best_score:
                best, best_score = v, s
        seq.append(best), out.append(best)
        if best == model.config.eos_token_id:
            break
    return out


def test_anti_lm_by_hand():
    lm = AntiLM(3, 0.9, [1, 2, 3, 1, 2])
    p = lm.probs(6)
    # (1,2) was followed by 3 once: 0.9·1/2; then (2,) by 3 once: 0.1·0.9·1/2; then 3 is 1 of 5 tokens: 0.01·1/5
    assert float(p[3]) == pytest.approx(0.45 + 0.045 + 0.002)
    # 1 never followed (1,2) or (2,): the whole weight falls to the unigram, 2 of 5
    assert float(p[1]) == pytest.approx(0.4) and float(p[2]) == pytest.approx(0.4)
    assert float(p[0]) == float(p[4]) == float(p[5]) == 0.0
    assert AntiLM(3, 0.9, [7]).probs(8).sum() == 0  # fewer than n - 1 tokens: predicts nothing
    assert AntiLM(1, 0.5, [1, 1, 2]).probs(3).tolist() == pytest.approx([0, 2 / 3, 1 / 3])  # n = 1: unigram


def test_anti_lm_grows_as_it_is_rebuilt(tok):
    seq = ids_of(tok, REPETITIVE)
    grown = AntiLM(4, 0.7, seq[:3])
    grown.extend(seq[3:])
    for v in set(seq) | {0}:
        assert float(grown.probs(len(tok))[v]) == pytest.approx(ref_anti(seq, v, 4, 0.7), abs=1e-12)


@pytest.mark.parametrize("model", ["llama", "gpt2"])
@pytest.mark.parametrize("alpha,n,k,beta", [(0.65, 3, 3, 0.9), (0.45, 2, 5, 0.9), (0.9, 4, 8, 0.5), (1.0, 1, 4, 0.9)])
def test_fsd_equals_reference(handles, tok, model, alpha, n, k, beta):
    h = handles[model]
    for text in PROMPTS[:3] + [REPETITIVE]:
        prompt = ids_of(tok, text)
        got, _, _, _ = run_ids(h, "fsd", prompt, N, {"alpha": alpha, "n": n, "k": k, "beta": beta})
        assert got == ref_fsd(h.model, prompt, N, alpha, n, k, beta), (model, text)


def test_fsd_changes_greedy_somewhere(handles, tok):
    changed = 0
    for model in ("llama", "gpt2"):
        for text in PROMPTS + [REPETITIVE]:
            prompt = ids_of(tok, text)
            changed += run_ids(handles[model], "fsd", prompt, N, {})[0] != ref_greedy(handles[model].model, prompt, N)
    assert changed >= 3  # or the reference test above would compare greedy with greedy


@pytest.mark.parametrize("model", ["llama", "gpt2", "llama8"])
def test_fsd_alpha_0_is_greedy_at_greedy_cost(handles, tok, model):
    for text in PROMPTS:
        prompt = ids_of(tok, text)
        greedy, _, gv, _ = run_ids(handles[model], "greedy", prompt, N, {})
        got, _, fv, _ = run_ids(handles[model], "fsd", prompt, N, {"alpha": 0.0, "k": 7})
        assert got == greedy and fv.forwards == gv.forwards == N and fv.tokens == gv.tokens


def test_fsd_evidence_recomputed_from_logits(handles, tok):
    h = handles["gpt2"]
    prompt = ids_of(tok, REPETITIVE)
    alpha, n, k, beta = 0.65, 3, 3, 0.9
    out, steps, view, _ = run_ids(h, "fsd", prompt, N, {"alpha": alpha, "n": n, "k": k, "beta": beta})
    seq = list(prompt)
    for t, step in zip(out, steps):
        p = torch.softmax(forward(h.model, seq)[0].double(), -1)
        cand = set(torch.topk(p, k).indices.tolist())
        c = step.evidence["contrast"]
        assert c["labels"] == ["LM", "anti-LM", "FSD"] and c["chosen"] == t
        for v, p_lm, p_anti, s in zip(c["top_ids"], c["probs"]["LM"], c["probs"]["anti-LM"], c["scores"]):
            assert p_lm == pytest.approx(float(p[v]), abs=1e-5)
            assert p_anti == pytest.approx(ref_anti(seq, v, n, beta), abs=1e-5)
            if v in cand:
                assert s == pytest.approx((1 - alpha) * float(p[v]) - alpha * ref_anti(seq, v, n, beta), abs=1e-5)
            else:
                assert s is None  # not a candidate: excluded
        assert cand <= set(c["top_ids"])
        assert max((s, v) for v, s in zip(c["top_ids"], c["scores"]) if s is not None)[1] == t
        d = step.evidence["dist"]
        assert d["chosen"] == t and d["final_probs"][d["top_ids"].index(t)] == 1.0
        seq.append(t)
    assert view.forwards == N  # the anti-LM costs no forward


def test_fsd_leaves_greedys_loop_on_the_bundled_model():
    def run(decoder: str, **params) -> list[int]:
        return prepare(model="tiny-shakespeare", decoder=decoder, prompt=LOOPING, max_new_tokens=40,
                       params=params).finish().output_ids

    def repeated_trigrams(ids: list[int]) -> int:
        grams = [tuple(ids[i:i + 3]) for i in range(len(ids) - 2)]
        return len(grams) - len(set(grams))

    greedy, fsd = run("greedy"), run("fsd")
    assert fsd != greedy and run("fsd", alpha=0.0) == greedy
    assert repeated_trigrams(fsd) < repeated_trigrams(greedy)


# ---------------------------------------------------------------------- lookback
def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> float:
    """KL(p ‖ q) from log-probabilities, summed token by token over p's support."""
    p = p_log.exp()
    keep = p > 0
    return float((p[keep] * (p_log[keep] - q_log[keep])).sum())


def ref_lookback(model, prompt: list[int], n_new: int, alpha: float, k: int, window: int, seed: int):
    """Xu et al. 2023, Algorithm 1, without a cache. Returns (tokens, triggered per step).

    The draw uses the playground's common random numbers (Gumbel noise of the step's
    position), so the reference and the decoder share their luck, not their rule."""
    noise = Context(target=None, prompt_ids=[], max_new_tokens=0, params={}, seed=seed)
    seq, out, fired = list(prompt), [], []
    m = len(prompt)
    for pos in range(n_new):
        logp = torch.log_softmax(all_logits(model, seq), -1)  # row r: the distribution predicting seq[r + 1]
        prefix = logp[:m]
        current, earlier = logp[-1], logp[:-1][-window:]
        kls = [kl(current, row) for row in earlier]
        hit = bool(kls) and min(kls) <= alpha
        fired.append(hit)
        if hit:
            top = torch.topk(current.exp(), k).indices.tolist()
            g = noise.gumbel(pos, current.numel())
            best, best_key = None, -math.inf
            for v in top:
                nxt = torch.log_softmax(all_logits(model, seq + [v])[-1], -1)
                d = min(kl(nxt, row) for row in prefix)
                if -d + float(g[v]) > best_key:
                    best, best_key = v, -d + float(g[v])
            t = best
        else:
            t = int(torch.argmax(current))
        seq.append(t), out.append(t)
        if t == model.config.eos_token_id:
            break
    return out, fired


# The sharp eight-layer models give KLs of about 0.05 to 10, so these thresholds mix greedy and
# sampled steps; the near-uniform two-layer Llama fires at almost every step.
@pytest.mark.parametrize("model", ["llama8", "gpt2_8", "llama"])
@pytest.mark.parametrize("alpha,k,window", [(0.5, 4, 128), (1.5, 3, 4), (6.0, 8, 128), (100.0, 5, 2)])
def test_lookback_equals_reference(handles, tok, model, alpha, k, window):
    h = handles[model]
    fired_any = False
    for i, text in enumerate([PROMPTS[0], PROMPTS[2], REPETITIVE]):
        prompt = ids_of(tok, text)
        got, steps, _, _ = run_ids(h, "lookback", prompt, N, {"alpha": alpha, "k": k, "window": window}, seed=i)
        want, fired = ref_lookback(h.model, prompt, N, alpha, k, window, seed=i)
        assert got == want, (model, text)
        assert [s.evidence["lookback"]["triggered"] for s in steps] == fired[:len(steps)]
        fired_any |= any(fired)
    if alpha >= 6.0 or (alpha >= 1.5 and model != "gpt2_8"):  # gpt2_8's KLs stay above 2
        assert fired_any  # these settings must exercise the sampling branch


@pytest.mark.parametrize("model", ["llama", "gpt2", "llama8"])
def test_lookback_alpha_0_is_greedy(handles, tok, model):
    for text in PROMPTS:
        prompt = ids_of(tok, text)
        got, steps, view, _ = run_ids(handles[model], "lookback", prompt, N, {"alpha": 0.0})
        assert got == ref_greedy(handles[model].model, prompt, N)
        assert not any(s.evidence["lookback"]["triggered"] for s in steps)
        assert view.forwards == N  # the prompt, then one token per step but the last


def test_lookback_fires_on_a_repetitive_prompt_and_not_on_a_fresh_one():
    def first_step(prompt: str) -> dict:
        tr = prepare(model="tiny-shakespeare", decoder="lookback", prompt=prompt, max_new_tokens=1,
                     params={"alpha": 0.5}).finish().to_dict()
        return tr["steps"][0]["lookback"]

    rep, fresh = first_step(REPETITIVE), first_step("ROMEO:")
    assert rep["triggered"] and rep["kl_min"] < 0.05
    # the closest earlier distribution is the one that predicted an earlier " tomorrow"'s successor
    assert not fresh["triggered"] and fresh["kl_min"] > 1.0
    assert len(rep["candidates"]) == 8 and "candidates" not in fresh


def test_lookback_kl_falls_as_greedy_loops_and_the_alarm_breaks_the_loop():
    def run(**params) -> dict:
        return prepare(model="tiny-shakespeare", decoder="lookback", prompt=LOOPING, max_new_tokens=56,
                       params=params).finish().to_dict()

    greedy = prepare(model="tiny-shakespeare", decoder="greedy", prompt=LOOPING, max_new_tokens=56).finish()
    watch = run(alpha=0.0)  # never fires: greedy, with the alarm's KL on record
    assert watch["output_ids"] == greedy.output_ids
    kls = [s["lookback"]["kl_min"] for s in watch["steps"]]
    # fresh text at first; once greedy repeats its own lines, each step replays an earlier one
    assert sum(kls[:10]) / 10 > 1.0 and max(kls[-10:]) < 0.2
    alpha = 0.1
    on = run(alpha=alpha)
    fired = [s["lookback"]["triggered"] for s in on["steps"]]
    first = next(i for i, k in enumerate(kls) if k < alpha)
    # identical to greedy until the KL first drops under alpha; the alarm fires exactly there
    assert fired.index(True) == first
    assert on["output_ids"][:first] == greedy.output_ids[:first]
    assert on["output_ids"] != greedy.output_ids


def test_lookback_evidence_and_forwards(handles, tok):
    h = handles["llama8"]
    prompt = ids_of(tok, REPETITIVE)
    alpha, k, window = 1.5, 4, 6
    out, steps, view, _ = run_ids(h, "lookback", prompt, N, {"alpha": alpha, "k": k, "window": window}, seed=5)
    seq = list(prompt)
    fired = []
    for t, step in zip(out, steps):
        logp = torch.log_softmax(all_logits(h.model, seq), -1)
        ev = step.evidence["lookback"]
        kls = [kl(logp[-1], row) for row in logp[:-1][-window:]]
        assert ev["compared"] == len(kls) and ev["threshold"] == alpha
        assert ev["kl_min"] == pytest.approx(min(kls), abs=1e-4)
        assert ev["closest"] == len(seq) - len(kls) + kls.index(min(kls))
        assert ev["closest_token"] == seq[ev["closest"]]
        assert ev["triggered"] == (min(kls) <= alpha)
        fired.append(ev["triggered"])
        d = step.evidence["dist"]
        if ev["triggered"]:
            cands = ev["candidates"]
            assert [c["token"] for c in cands] == torch.topk(logp[-1].exp(), k).indices.tolist()
            for c in cands:
                nxt = torch.log_softmax(all_logits(h.model, seq + [c["token"]])[-1], -1)
                dists = [kl(nxt, row) for row in logp[:len(prompt)]]
                assert c["kl_prefix"] == pytest.approx(min(dists), abs=1e-4)
                assert c["closest_prefix"] == dists.index(min(dists)) + 1
            q = torch.softmax(torch.tensor([-c["kl_prefix"] for c in cands], dtype=torch.float64), 0)
            assert [c["q"] for c in cands] == pytest.approx(q.tolist(), abs=1e-5)
            assert [c["token"] for c in cands if c["picked"]] == [t]
            assert d["final_probs"][d["top_ids"].index(t)] > 0
        else:
            assert t == int(torch.argmax(logp[-1])) and d["final_probs"][d["top_ids"].index(t)] == 1.0
        seq.append(t)
    assert any(fired) and not all(fired)
    # one forward per step: a fired step's batched look-ahead is the next step's forward
    assert view.forwards == 1 + sum(fired) + sum(not f for f in fired[:-1])
    assert view.tokens == len(prompt) + k * sum(fired) + sum(not f for f in fired[:-1])


def test_lookback_samples_with_the_seed(handles, tok):
    h = handles["llama"]
    prompt = ids_of(tok, PROMPTS[1])
    runs = [run_ids(h, "lookback", prompt, N, {"alpha": 100.0, "k": 6}, seed=s)[0] for s in range(4)]
    assert runs[2] == run_ids(h, "lookback", prompt, N, {"alpha": 100.0, "k": 6}, seed=2)[0]
    assert len({tuple(r) for r in runs}) > 1


# ---------------------------------------------------------------------- the logit lens on the family
LENS_CASES = [("dola", {"dola_layers": "low"}, None), ("cfg", {"guidance_scale": 2.0}, None),
              ("cad", {"alpha": 1.0, "separator": ","}, None), ("contrastive", {}, "amateur"),
              ("fsd", {}, None)]


@pytest.mark.parametrize("decoder,params,draft", LENS_CASES)
def test_lens_reads_the_main_forward(handles, tok, decoder, params, draft):
    h = handles["llama8"]
    prompt = ids_of(tok, "To be, or not to be, that is")
    spec = decoders.get_decoder(decoder).params["logit_lens"]
    assert spec.type == "bool" and spec.default is False
    dr = handles[draft] if draft else None
    off, off_steps, off_view, _ = run_ids(h, decoder, prompt, N, params, draft=dr)
    on, on_steps, on_view, _ = run_ids(h, decoder, prompt, N, {**params, "logit_lens": True}, draft=dr)
    assert on == off and on_view.forwards == off_view.forwards  # no extra forward, same tokens
    assert not any("lens" in s.evidence for s in off_steps)
    seq = list(prompt)
    for t, a, b in zip(on, on_steps, off_steps):
        lens, d = a.evidence["lens"], a.evidence["dist"]
        assert d == b.evidence["dist"] and lens["chosen"] == t
        assert lens["layers"] == list(range(h.num_layers + 1))
        # the last layer is the main (expert, conditional, with-context) forward's own output
        raw = torch.softmax(forward(h.model, seq)[0], -1)
        assert lens["top_ids"][-1][0] == d["top_ids"][0] == int(torch.argmax(raw))
        assert lens["top_probs"][-1][0] == pytest.approx(float(raw.max()), abs=2e-6)
        seq.append(t)


# ---------------------------------------------------------------------- bad inputs, traces
BAD = [("fsd", {"alpha": 1.5}), ("fsd", {"n": 0}), ("fsd", {"k": 0}), ("fsd", {"beta": -0.1}), ("fsd", {"n": "x"}),
       ("lookback", {"alpha": -1}), ("lookback", {"k": 0}), ("lookback", {"window": 0}),
       ("lookback", {"alpha": "nan"}), ("lookback", {"logit_lens": True}),
       ("dola", {"logit_lens": "maybe"}), ("cfg", {"logit_lens": "maybe"}), ("cad", {"logit_lens": 2}),
       ("contrastive", {"logit_lens": "maybe"}), ("fsd", {"logit_lens": "maybe"})]


@pytest.mark.parametrize("decoder,params", BAD)
def test_bad_inputs_are_one_line(handles, decoder, params):
    with pytest.raises(PlaygroundError) as e:
        prepare(model=handles["llama"], decoder=decoder, prompt="ROMEO:", max_new_tokens=4, params=params,
                draft=handles["amateur"] if decoder == "contrastive" else None).finish()
    msg = str(e.value)
    assert msg and "\n" not in msg and next(iter(params)) in msg


@pytest.mark.parametrize("decoder,params", [("fsd", {}), ("fsd", {"n": 1, "k": 100, "logit_lens": True}),
                                            ("lookback", {}), ("lookback", {"alpha": 100.0, "k": 100}),
                                            ("dola", {"logit_lens": True}), ("cfg", {"logit_lens": True})])
def test_traces_on_the_bundled_model_are_valid(decoder, params):
    d = prepare(model="tiny-shakespeare", decoder=decoder, prompt="ROMEO:\nWhat say you?", max_new_tokens=6,
                params=params).finish().to_dict()
    validate_trace_dict(d)
    json.dumps(d, allow_nan=False)
    assert d["output_ids"] == [t for s in d["steps"] for t in s["committed"]] and len(d["output_ids"]) == 6
    if decoder == "lookback" and params:
        assert all(s["lookback"]["triggered"] for s in d["steps"])
    if decoder == "fsd":
        # the existing paired-distribution view draws FSD's three rows
        import visualizers as V
        from visualizers.contrast import contrast_figure

        assert "Paired distributions" in [t for t, _ in V.step_figures(d, 2)]
        fig = contrast_figure(d, 2)
        assert [b.name for b in fig.data if b.type == "bar"] == ["LM", "anti-LM", "FSD"]
