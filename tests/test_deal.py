"""DeAL: without reward or lookahead it is beam search exactly; each step keeps what the recorded
scores say; the recorded scores, rewards and lookaheads recompute; a keyword reward steers the
output to the keyword; the views follow the evidence; bad knobs are one line."""

from __future__ import annotations

import pytest
import torch

import playground
from decoders.guided.smc import Potential
from playground.core.errors import PlaygroundError
from playground.core.models import load_model
from visualizers.deal import chosen_path, deal_figure, deal_run_figure

MODEL = "tiny-shakespeare"
PROMPTS = ("ROMEO:", "JULIET:\nO", "First Citizen:\nWe")


def gen(decoder: str, prompt: str = "ROMEO:", n: int = 16, stop=None, **knobs):
    return playground.generate(model=MODEL, decoder=decoder, prompt=prompt, max_new_tokens=n, stop=stop, **knobs)


def beams_of(trace: dict) -> list[list[tuple]]:
    return [[(tuple(b["ids"]), b["score"], b["parent"], b["finished"]) for b in s["beams"]] for s in trace["steps"]]


@pytest.fixture(scope="module")
def model():
    return load_model(MODEL, device="cpu")


# ---------------------------------------------------------------------- identities
@pytest.mark.parametrize("k,prompt,stop", [(1, "ROMEO:", None), (2, "JULIET:\nO", None), (4, "ROMEO:", None),
                                           (3, "First Citizen:\nWe", ["\n"])])
def test_no_reward_no_lookahead_is_beam_search(k, prompt, stop):
    """lam = 0, lookahead = 0, top_k = beam search's own expansion (2k: one stop token): the same
    beams at every step, the same output and finish, also when hypotheses finish on a stop string."""
    a = gen("beam", prompt, stop=stop, num_beams=k)
    b = gen("deal", prompt, stop=stop, num_beams=k, lam=0.0, lookahead=0, top_k=2 * k, keywords="love")
    assert b["output_ids"] == a["output_ids"]
    assert b["stats"]["finish_reason"] == a["stats"]["finish_reason"]
    assert beams_of(b) == beams_of(a)
    if stop:
        assert any(x[3] for s in beams_of(b) for x in s)  # the pool was exercised


@pytest.mark.parametrize("prompt", PROMPTS)
def test_one_beam_no_reward_is_greedy(prompt):
    g = gen("greedy", prompt, n=20)
    d = gen("deal", prompt, n=20, num_beams=1, lam=0.0, lookahead=0, top_k=2, keywords="love")
    assert g["stats"]["finish_reason"] == "length"  # no stop token: beam width 1 is greedy exactly here
    assert d["output_ids"] == g["output_ids"]


# ---------------------------------------------------------------------- each step's rule, recomputed
def _brute_force(cands: list[dict], lam: float, k: int, keep: int) -> tuple[set[int], set[int], float]:
    """Beam search's rule on scores recomputed as logprob + lam * reward: the best k unfinished
    among the best ``keep`` candidates are kept, the finished among the best k pooled. Also the
    score gap at the kept set's edge (how far from a tie the choice is)."""
    score = [c["logprob"] + lam * c["reward"] for c in cands]
    order = sorted(range(len(cands)), key=lambda j: -score[j])
    top = order[:keep]
    kept = [j for j in top if not cands[j]["finished"]][:k]
    pooled = {j for j in top[:k] if cands[j]["finished"]}
    rest = [score[j] for j in top if not cands[j]["finished"] and j not in kept]
    gap = min(score[j] for j in kept) - max(rest) if kept and rest else float("inf")
    return set(kept), pooled, gap


@pytest.mark.parametrize("reward,knob,lam,stop", [("keywords", {"keywords": "love, night"}, 5.0, None),
                                                  ("length", {"target_chars": 40}, 20.0, ["\n"]),
                                                  ("keywords", {"keywords": "king"}, 2.0, ["\n"])])
def test_each_step_keeps_what_the_recorded_scores_say(reward, knob, lam, stop):
    k, top_k = 3, 5
    tr = gen("deal", "ROMEO:", n=14, stop=stop, reward=reward, lam=lam, lookahead=3, top_k=top_k, num_beams=k, **knob)
    statuses = set()
    for s in tr["steps"]:
        cands = s["deal"]["candidates"]
        for c in cands:  # the recorded score is the recorded log p plus lam times the reward
            assert c["score"] == pytest.approx(c["logprob"] + lam * c["reward"], abs=2e-4)
            statuses.add(c["status"])
        kept, pooled, gap = _brute_force(cands, lam, k, 2 * k)
        assert gap > 1e-3, "a near-tie at the kept set's edge: pick other knobs"
        assert {j for j, c in enumerate(cands) if c["status"] == "kept"} == kept
        assert {j for j, c in enumerate(cands) if c["status"] == "finished"} == pooled
        # the kept become the next step's nodes (beam search records none once it is done)
        running = sum(1 for b in s["beams"] if not b["finished"])
        assert running == (0 if s is tr["steps"][-1] else len(kept))
    assert {"kept", "pruned"} <= statuses


def test_rewards_and_lookaheads_recompute(model):
    """Every candidate's lookahead is the greedy continuation after it (an independent forward
    from scratch), and its reward the keyword potential of the text it reaches."""
    lam, depth, words = 5.0, 3, ["love", "night"]
    tr = gen("deal", "ROMEO:", n=6, lam=lam, lookahead=depth, top_k=4, num_beams=2, keywords=", ".join(words))
    pot = Potential(keywords=words)
    prompt = tr["prompt_ids"]
    prev = [[]]
    checked = 0
    for t, s in enumerate(tr["steps"]):
        for c in s["deal"]["candidates"]:
            base = prev[c["beam"]] + [c["token"]]
            want = min(depth, 6 - len(base))
            ids = list(base)
            with torch.no_grad():
                for _ in range(want):
                    logits = model.model(torch.tensor([prompt + ids])).logits[0, -1]
                    ids.append(int(torch.argmax(logits)))
            assert c["lookahead"] == ids[len(base):]
            done = len(ids) >= 6
            assert c["reward"] == pytest.approx(pot(model.decode(ids), done), abs=1e-9)
            checked += 1
        prev = [b["ids"] for b in s["beams"] if not b["finished"]]
    assert checked >= 4 * 5


# ---------------------------------------------------------------------- steering
@pytest.mark.parametrize("prompt,word", [("ROMEO:", "love"), ("JULIET:\nO", "night"), ("First Citizen:\nWe", "king")])
def test_a_keyword_reward_writes_the_keyword(prompt, word):
    g = gen("greedy", prompt, n=24)
    assert word not in g["text"].lower()
    d = gen("deal", prompt, n=24, keywords=word, lam=50.0, lookahead=4, top_k=8, num_beams=4)
    assert word in d["text"].lower()
    assert d["stats"]["final_reward"] == 0.0
    assert d["stats"]["output_logprob"] < 0


# ---------------------------------------------------------------------- views
def test_views_follow_the_evidence():
    tr = gen("deal", "ROMEO:", n=10, keywords="love", lam=5.0, lookahead=2, top_k=4, num_beams=2)
    s = tr["steps"][3]
    fig = deal_figure(tr, 3)
    counts = {d.name.split(" (")[0]: len(d.x) for d in fig.data if d.mode == "markers"}
    for status, name in (("kept", "kept"), ("pruned", "pruned")):
        assert counts[name] == sum(1 for c in s["deal"]["candidates"] if c["status"] == status)
    path = chosen_path(tr)
    assert [len(b["ids"]) for _, b in path] == list(range(1, len(tr["output_ids"]) + 1))
    assert path[-1][1]["ids"] == tr["output_ids"]
    run = deal_run_figure(tr)
    assert list(run.data[0].x) == [b["logprob"] for _, b in path]
    assert list(run.data[0].y) == [b["reward"] for _, b in path]
    assert "no DeAL" in deal_figure({"steps": [{"kind": "beam", "beams": []}]}, 0).layout.annotations[0].text
    odd = {"steps": [{"kind": "beam", "deal": {"candidates": 5, "lam": "x"}, "beams": 7}], "output_ids": [1]}
    assert "no DeAL" in deal_figure(odd, 0).layout.annotations[0].text
    assert "no DeAL" in deal_run_figure(odd).layout.annotations[0].text


# ---------------------------------------------------------------------- knob errors
@pytest.mark.parametrize("knobs,needle", [({}, "keywords"), ({"keywords": " , "}, "keyword"),
                                          ({"reward": "length"}, "target_chars"),
                                          ({"reward": "regex"}, "match_regex"),
                                          ({"reward": "regex", "match_regex": "(["}, "match_regex"),
                                          ({"reward": "harmless", "keywords": "a"}, "reward"),
                                          ({"keywords": "a", "lam": -1}, "lam"),
                                          ({"keywords": "a", "top_k": 0}, "top_k"),
                                          ({"keywords": "a", "lookahead": 65}, "lookahead"),
                                          ({"keywords": "a", "beam_width": 2}, "beam_width")])
def test_bad_knobs_are_one_line(knobs, needle):
    with pytest.raises(PlaygroundError) as e:
        gen("deal", n=4, **knobs)
    msg = str(e.value)
    assert "\n" not in msg and needle in msg
