"""DeAL: without reward or lookahead it is beam search exactly (search=beam) or best-first beam
search exactly (search=astar); each step keeps (beam) or pops (astar) what the recorded scores
say; the recorded scores, rewards and lookaheads recompute; a keyword reward steers the output to
the keyword in both searches; the views follow the evidence; bad knobs are one line."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import playground
from _arch_models import build_causal
from decoders.guided.smc import Potential
from playground.core.errors import PlaygroundError
from playground.core.models import handle_from_model, load_model
from playground.engine import prepare
from visualizers.deal import chosen_path, deal_figure, deal_frontier_figure, deal_run_figure

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


# ---------------------------------------------------------------------- search=astar
def popped_of(trace: dict) -> list[list[tuple]]:
    return [[(tuple(b["ids"]), b["score"], b["finished"]) for b in s["beams"]] for s in trace["steps"]]


@pytest.mark.parametrize("k,top_k,prompt,stop", [(1, 1, "ROMEO:", None), (3, 3, "ROMEO:", None),
                                                 (2, 4, "JULIET:\nO", None), (4, 4, "First Citizen:\nWe", ["\n"]),
                                                 (3, 3, "JULIET:\nO", [","])])
def test_astar_no_reward_no_lookahead_is_best_first_beam(k, top_k, prompt, stop):
    """lam = 0, lookahead = 0: f = g, so the A* search is best_first_beam's exactly — the same
    nodes popped in the same waves, the same answer, expansions and forwards (best_first_beam's
    answer is beam search's with length_penalty 0)."""
    a = gen("best_first_beam", prompt, stop=stop, num_beams=k)
    b = gen("deal", prompt, stop=stop, search="astar", num_beams=k, lam=0.0, lookahead=0, top_k=top_k, keywords="love")
    assert b["output_ids"] == a["output_ids"]
    assert b["stats"]["finish_reason"] == a["stats"]["finish_reason"]
    assert b["stats"]["best_score"] == a["stats"]["best_score"]
    assert popped_of(b) == popped_of(a)
    for key in ("expansions", "waves", "target_forwards"):
        assert b["stats"][key] == a["stats"][key], key
    if stop:
        beam = gen("beam", prompt, stop=stop, num_beams=k, length_penalty=0.0)
        assert b["output_ids"] == beam["output_ids"]


def test_astar_no_reward_is_best_first_beam_on_a_windowed_model(tokenizer):
    """The same on a model whose window the prompt overruns (the waves re-read from the prompt's cache)."""
    handle = handle_from_model(build_causal("mistral-window", tokenizer), tokenizer, name="deal-mistral-window")
    prompt = "ROMEO: But soft, what light through yonder window breaks?\n\nJULIET: O Romeo, Romeo, wherefore"
    runs = [prepare(model=handle, decoder=d, prompt=prompt, max_new_tokens=10, params=kn).finish()
            for d, kn in (("best_first_beam", {"num_beams": 3}),
                          ("deal", {"search": "astar", "num_beams": 3, "lam": 0.0, "lookahead": 0, "top_k": 3,
                                    "keywords": "a"}))]
    assert runs[1].output_ids == runs[0].output_ids
    assert runs[1].stats["target_forwards"] == runs[0].stats["target_forwards"]


@pytest.mark.parametrize("reward,knob,lam,stop,rising", [("keywords", {"keywords": "love, my"}, 5.0, None, True),
                                                         ("length", {"target_chars": 20}, 20.0, ["\n"], False)])
def test_astar_pops_the_best_open_entry_of_the_recorded_frontier(model, reward, knob, lam, stop, rising):
    """Each step pops exactly one node (lam > 0), the one a brute force picks from the recorded
    frontier: the highest f = g + h (ties to the older entry) among the lengths that still have
    fewer than num_beams pops; f, g and h recompute (g from an independent forward); the search
    is not greedy (a pop that is not a child of the previous pop) and, with a keyword reward, not
    monotone (a child that outscores its parent: h is no admissible bound); the last pop is the
    finished output."""
    k, n, depth = 2, 10, 2
    tr = gen("deal", "ROMEO:", n=n, stop=stop, search="astar", reward=reward, lam=lam, lookahead=depth, top_k=4,
             num_beams=k, **knob)
    pops: Counter = Counter()
    by_id, prev, backtracks, rises = {}, None, 0, 0
    for s in tr["steps"]:
        ev = s["astar"]
        for e in ev["frontier"]:
            assert e["h"] == pytest.approx(lam * e["reward"], abs=1e-9)
            assert e["f"] == pytest.approx(e["g"] + e["h"], abs=1e-9)
            by_id[e["id"]] = e
        open_ = [e for e in ev["frontier"] if pops[e["depth"]] < k]
        best = min(open_, key=lambda e: (-e["f"], e["id"]))
        assert ev["popped"] == [best["id"]]
        assert [b["ids"] for b in s["beams"]] == [best["ids"]]
        pops[best["depth"]] += 1
        assert ev["pops"] == {str(d): c for d, c in sorted(pops.items())}
        if prev is not None and best["parent"] != prev["id"]:
            backtracks += 1
        rises += sum(1 for c in s["deal"]["candidates"] if c["logprob"] + lam * c["reward"] > best["f"] + 1e-6)
        for c in s["deal"]["candidates"]:  # each child's g is its parent's plus its token's log-probability
            assert c["logprob"] == pytest.approx(best["g"] + c["token_logprob"], abs=1e-4)
        prev = best
    assert prev["finished"] and prev["ids"] == tr["output_ids"]
    assert tr["stats"]["expansions"] == len(tr["steps"]) - 1
    assert backtracks > 0
    if rising:
        assert rises > 0
    with torch.no_grad():  # the output's g from scratch
        ids = tr["prompt_ids"] + tr["output_ids"]
        lp = torch.log_softmax(model.model(torch.tensor([ids])).logits[0].float(), -1)
        g = sum(float(lp[len(tr["prompt_ids"]) + j - 1, t]) for j, t in enumerate(tr["output_ids"]))
    assert prev["g"] == pytest.approx(g, abs=1e-3)
    assert tr["stats"]["output_logprob"] == pytest.approx(prev["g"], abs=1e-5)


@pytest.mark.parametrize("prompt,word", [("ROMEO:", "love"), ("JULIET:\nO", "night"), ("First Citizen:\nWe", "king")])
def test_astar_keyword_reward_writes_the_keyword(prompt, word):
    g = gen("greedy", prompt, n=24)
    assert word not in g["text"].lower()
    d = gen("deal", prompt, n=24, search="astar", keywords=word, lam=50.0, lookahead=4, top_k=8, num_beams=4)
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


def test_frontier_view_follows_the_evidence():
    tr = gen("deal", "ROMEO:", n=8, search="astar", keywords="love", lam=5.0, lookahead=2, top_k=4, num_beams=2)
    j = 3
    ev = tr["steps"][j]["astar"]
    fig = deal_frontier_figure(tr, j)
    marks = {d.name.split(" (")[0]: d for d in fig.data if d.mode == "markers"}
    assert len(marks["popped"].x) == 1 and list(marks["popped"].x) == [e["g"] for e in ev["frontier"]
                                                                       if e["id"] in ev["popped"]]
    assert sum(len(d.x) for d in marks.values()) == len(ev["frontier"])
    for d in fig.data:
        if d.mode == "lines":  # lines of equal f: g + h constant along each
            assert d.x[0] + d.y[0] == pytest.approx(d.x[1] + d.y[1])
    path = chosen_path(tr)
    assert [len(b["ids"]) for _, b in path] == list(range(1, len(tr["output_ids"]) + 1))
    assert path[-1][1]["ids"] == tr["output_ids"]
    assert "queued" in {d.name.split(" (")[0] for d in deal_figure(tr, j).data}
    for odd in ({"steps": [{"kind": "beam", "astar": {"frontier": 5}, "beams": []}]},
                {"steps": [{"kind": "beam", "astar": {"frontier": [{"g": "x"}], "popped": "y"}}]}):
        assert "no A* frontier" in deal_frontier_figure(odd, 0).layout.annotations[0].text


# ---------------------------------------------------------------------- knob errors
@pytest.mark.parametrize("knobs,needle", [({}, "keywords"), ({"keywords": " , "}, "keyword"),
                                          ({"reward": "length"}, "target_chars"),
                                          ({"reward": "regex"}, "match_regex"),
                                          ({"reward": "regex", "match_regex": "(["}, "match_regex"),
                                          ({"reward": "harmless", "keywords": "a"}, "reward"),
                                          ({"keywords": "a", "lam": -1}, "lam"),
                                          ({"keywords": "a", "top_k": 0}, "top_k"),
                                          ({"keywords": "a", "lookahead": 65}, "lookahead"),
                                          ({"keywords": "a", "beam_width": 2}, "beam_width"),
                                          ({"keywords": "a", "search": "dfs"}, "search"),
                                          ({"keywords": "a", "search": "astar", "length_penalty": 0.0},
                                           "length_penalty")])
def test_bad_knobs_are_one_line(knobs, needle):
    with pytest.raises(PlaygroundError) as e:
        gen("deal", n=4, **knobs)
    msg = str(e.value)
    assert "\n" not in msg and needle in msg
