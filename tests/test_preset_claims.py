"""Every preset's description says what its lanes show: the test runs the preset (as the CLI
and the API do: plan_compare, prepare_lanes) and asserts each figure the description states;
every number in a description is either one of those figures or a setting (a knob value, a
definition, a model fact checked here), so a description cannot state a number that does not
come from the run."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import pytest

from playground.presets import list_presets, load_preset

Lanes = list[dict[str, Any]]


def _run(name: str) -> Lanes:
    from playground.api import plan_compare, prepare_lanes

    return [json.loads(r.finish().to_json()) for r in prepare_lanes(plan_compare(name))]


def st(lane: dict, key: str) -> Any:
    return lane["stats"][key]


def commits(lane: dict) -> list[int]:
    """Positions a diffusion lane committed per denoising pass."""
    return [len(s.get("unmasked") or []) for s in lane["steps"] if s["kind"] == "denoise"]


def corrections(lane: dict) -> dict[str, int]:
    kinds = [s["tree"].get("correction_kind") for s in lane["steps"] if s["kind"] == "draft"]
    return {k: kinds.count(k) for k in set(kinds)}


def speakers(text: str) -> set[str]:
    """The speaker headings of a Shakespeare-style text (a line of capitals ending with '.')."""
    return {ln.strip() for ln in text.splitlines() if re.fullmatch(r"[A-Z][A-Z ]+\.\s*", ln.strip() + "")}


def param_ratio(big: str, small: str) -> float:
    from playground.core.models import load_model

    n = [sum(p.numel() for p in load_model(m, device="cpu").model.parameters()) for m in (big, small)]
    return n[0] / n[1]


def free_z(lanes: Lanes, j: int, wm: int) -> float:
    """The watermark detector's z for lane ``j``'s ids under lane ``wm``'s watermark settings."""
    from decoders.guided.watermark import detect_ids

    k, t = lanes[wm]["params"], lanes[j]
    return detect_ids(t["model"], t["output_ids"], t["prompt_ids"], gamma=k["watermark_gamma"],
                      key=k["watermark_key"], seeding=k["watermark_seeding"],
                      context_width=k["watermark_context_width"])["z"]


# Per preset: "settings" are numbers that are knobs, definitions or limits (not run figures);
# "figures" maps each run figure the description states (as it is written there) to a check.
CLAIMS: dict[str, dict[str, Any]] = {
    "contrastive-family": {
        "settings": {"1", "2", "5.6"},  # top-1 style words; "two"; the model size ratio, checked below
        "figures": {
            "5.6": lambda L: round(param_ratio("tiny-shakespeare", "tiny-shakespeare-draft"), 1) == 5.6,
        },
        "checks": [
            lambda L: "I have been a good people, and I have been a good people,\nand a good people" in L[0]["text"],
            lambda L: "people's voices" in L[0]["text"] and len(speakers(L[0]["text"])) == 1,
            lambda L: all(len(speakers(L[j]["text"])) >= 2 for j in (1, 2, 3, 5)),
            lambda L: "They are not to be sociable." in L[4]["text"],
            lambda L: st(L[2], "draft_forwards") == st(L[2], "new_tokens"),  # the amateur's forwards
            lambda L: st(L[4], "target_forwards") == 2 * st(L[4], "new_tokens"),  # cfg: two per token
            lambda L: st(L[5], "target_forwards") == st(L[5], "new_tokens"),  # fsd: one per token
        ],
    },
    "diffusion-parallel": {
        "settings": {"32", "0.3", "1", "2", "0.15", "0.05", "1.1", "1.0", "0.5", "0.9"},
        "figures": {
            "25": lambda L: st(L[1], "target_forwards") == 25,
            "4": lambda L: max(commits(L[1])) == 4,
            "15": lambda L: st(L[2], "target_forwards") == st(L[3], "target_forwards") == 15,
            "18": lambda L: commits(L[2])[-1] == commits(L[3])[-1] == 18,
            "0.1": lambda L: abs(_mean_margin(L[2]["steps"][0]) - 0.1) < 0.02,
        },
        "checks": [
            lambda L: commits(L[0]) == [1] * 32 and st(L[0], "target_forwards") == 32,
            lambda L: L[1]["text"] == L[0]["text"],
            lambda L: all(st(L[j], "tokens_per_target_forward") > 1 for j in (1, 2, 3)),
            lambda L: all(commits(L[j])[:-1] == [1] * 14 for j in (2, 3)),
            lambda L: _committed_last(L[2]).count(",") > len(_committed_last(L[2])) / 2,  # mostly commas
        ],
    },
    "diffusion-helper-and-regex": {
        "settings": {"32", "16", "0.5", "1", "8"},  # tokens, steps, look-ahead, mixture weights, window
        "figures": {
            "21": lambda L: st(L[1], "target_forwards") == st(L[1], "helper_forwards") == 21,
            "4": lambda L: max(commits(L[1])) == 4 and commits(L[2]) == [8] * 4,
        },
        "checks": [
            lambda L: commits(L[0]) == [1] * 32,
            lambda L: sum(L[2]["text"].count(c) for c in ",\n") > len(L[2]["text"].replace(" ", "")) / 2,
            lambda L: L[1]["text"].count(",") < len(L[1]["text"]) / 8,  # verse, not commas
            lambda L: re.fullmatch(r"Romeo(, [a-z]+)+[.!?]", L[3]["text"]) is not None,
            lambda L: L[3]["text"].startswith("Romeo, fie, fie,") and L[3]["text"].endswith("ho, ho!"),
        ],
    },
    "diffusion-remasking": {
        "settings": {"0.3", "1", "2"},  # Fast-dLLM's threshold; top-1/top-2
        "figures": {
            "2": lambda L: all(commits(L[j]) == [2] * 16 for j in range(4)),
            "16": lambda L: all(st(L[j], "target_forwards") == 16 for j in range(4)),
            "4": lambda L: (min(commits(L[4])), max(commits(L[4]))) == (1, 4),
            "25": lambda L: st(L[4], "target_forwards") == 25,
        },
        "checks": [lambda L: len({t["text"] for t in L}) == 5],
    },
    "diffusion-vs-ar": {
        "settings": {"0.3", "8", "32"},
        "figures": {
            "16": lambda L: st(L[1], "target_forwards") == 16,
            "2": lambda L: commits(L[1]) == [2] * 16 and commits(L[2]) == [4] * 8,
            "4": lambda L: commits(L[2]) == [4] * 8 and max(commits(L[3])) == 4,
            "25": lambda L: st(L[3], "target_forwards") == 25,
            "768": lambda L: st(L[1], "target_tokens_processed") == 768,
            "47": lambda L: st(L[0], "target_tokens_processed") == 47,
        },
        "checks": [lambda L: all(st(t, "new_tokens") == 32 for t in L)],
    },
    "lossless-check": {
        "settings": {"0"},  # temperature 0
        "figures": {
            "64": lambda L: all(st(t, "new_tokens") == 64 for t in L) and st(L[0], "target_forwards") == 64,
            "18": lambda L: st(L[1], "target_forwards") == 18,
            "15": lambda L: st(L[2], "target_forwards") == 15,
            "62": lambda L: st(L[3], "target_forwards") == 62,
        },
        "checks": [
            lambda L: len({tuple(t["output_ids"]) for t in L}) == 1,  # diverge nowhere
            # at equal cost they fall behind: their target alone processes more positions than greedy's
            lambda L: all(st(t, "target_tokens_processed") > st(L[0], "target_tokens_processed") for t in L[1:]),
        ],
    },
    "search-collaboration": {
        "settings": set(),
        "figures": {},
        "checks": [
            lambda L: L[0]["output_ids"] == _reference(L, "beam", 48, num_beams=4),  # best-first = beam's answer
            lambda L: st(L[3], "large_tokens") > 0,  # EAD handed spans to the large model
            lambda L: st(L[4], "changed_tokens") > 0 and f"{st(L[4], 'changed_tokens')} changed tokens" in _line(L[4]),
            lambda L: L[4].get("lossy") is True,
            lambda L: L[5]["output_ids"] == _reference(L, "greedy", 48)
            and st(L[5], "target_forwards") < st(L[5], "new_tokens"),
        ],
    },
    "speculative-showdown": {
        "settings": {"0"},
        "figures": {
            "64": lambda L: all(st(t, "new_tokens") == 64 for t in L) and st(L[0], "target_forwards") == 64,
            "28": lambda L: st(L[1], "target_forwards") == 28,
            "21": lambda L: st(L[2], "target_forwards") == 21,
            "29": lambda L: st(L[3], "target_forwards") == 29,
            "37": lambda L: st(L[4], "target_forwards") == 37,
            "138": lambda L: st(L[0], "target_tokens_processed") == 138,
            "348": lambda L: st(L[3], "target_tokens_processed") == 348,
            "764": lambda L: st(L[4], "target_tokens_processed") == 764,
            "212": lambda L: st(L[1], "target_tokens_processed") == 212,
            "461": lambda L: st(L[2], "target_tokens_processed") == 461,
            "189": lambda L: st(L[1], "draft_tokens_processed") == 189,
            "298": lambda L: st(L[2], "draft_tokens_processed") == 298,
        },
        "checks": [
            lambda L: len({tuple(t["output_ids"]) for t in L}) == 1,
            lambda L: all(st(L[j], "target_tokens_processed") > st(L[0], "target_tokens_processed") for j in (1, 2)),
        ],
    },
    "speculative-sampling": {
        "settings": {"1", "0", "4"},  # T = 1, min(1, p/q), max(0, p - q), the draft length and tree depth
        "figures": {
            "9": lambda L: corrections(L[1]).get("resample") == 9,
            "10": lambda L: corrections(L[2]).get("resample") == 10,
            "15": lambda L: st(L[1], "verifications") == st(L[1], "target_forwards") == 15,
            "17": lambda L: st(L[2], "verifications") == st(L[2], "target_forwards") == 17,
            "57": lambda L: round(100 * st(L[1], "acceptance_rate")) == 57,
            "2.2": lambda L: round(st(L[1], "mean_accepted_length"), 1) == 2.2,
            "1.8": lambda L: round(st(L[2], "mean_accepted_length"), 1) == 1.8,
            "48": lambda L: all(st(t, "new_tokens") == 48 for t in L),
            "64": lambda L: st(L[0], "target_tokens_processed") == 64,
            "89": lambda L: st(L[1], "target_tokens_processed") == 89,
            "327": lambda L: st(L[2], "target_tokens_processed") == 327,
            "79": lambda L: st(L[1], "draft_tokens_processed") == 79,
            "192": lambda L: st(L[2], "draft_tokens_processed") == 192,
        },
        "checks": [
            lambda L: all(set(corrections(t)) <= {"resample", "bonus"} for t in L[1:]),
            lambda L: st(L[2], "drafted_tokens") > st(L[1], "drafted_tokens")
            and st(L[2], "acceptance_rate") < st(L[1], "acceptance_rate"),
            lambda L: len({t["text"] for t in L}) == 3,
        ],
    },
    "truncation-samplers": {
        "settings": {"20", "0.8", "0.1"},
        "figures": {},
        "checks": [
            lambda L: L[0]["text"].lstrip().startswith("By any virginian"),
            lambda L: L[4]["text"].lstrip().startswith("By any") and not L[4]["text"].lstrip().startswith("By any virginian"),
            lambda L: L[5]["text"].lstrip().startswith("With the red weapons"),  # top_p then top_k
            lambda L: not any(L[j]["text"].lstrip().startswith("By") for j in (1, 2, 3)),
        ],
    },
    "greedy-beam-sampling": {"settings": {"90"}, "figures": {}, "checks": [
        lambda L: len(L[1]["steps"]) and L[1]["steps"][0]["kind"] == "beam",
        lambda L: len({t["text"] for t in L}) == 3,
    ]},
    "guided": {
        "settings": {"2", "0.25", "4", "8"},  # delta, gamma, the detector's threshold, particles
        "figures": {"0": lambda L: abs(free_z(L, 0, 3)) < 2},  # free sampling's z under the same key
        "checks": [
            lambda L: len(L) == 5,
            lambda L: st(L[1], "finish_reason") == "constraint" and re.fullmatch(
                r"[A-Z][a-z]+(,? [a-z]+){3,12}[.!?]", L[1]["text"].strip()) is not None,
            lambda L: set(json.loads(L[2]["text"])) == {"speaker", "line"},
            lambda L: st(L[3], "watermark")["z"] > 4,
            lambda L: st(L[4], "finish_reason") == "constraint",
        ],
    },
}


def _reference(lanes: Lanes, decoder: str, n: int, **knobs: Any) -> list[int]:
    """The output of another decoder on the preset's prompt, model and seed, ``n`` tokens."""
    from playground.engine import run_to_end

    t = lanes[0]
    return run_to_end(model=t["model"], decoder=decoder, prompt=t["prompt"], max_new_tokens=n, seed=t["seed"],
                      params=knobs).output_ids


def _line(lane: dict) -> str:
    from visualizers.tokens import stats_line

    return stats_line(lane)


def _mean_margin(step: dict) -> float:
    m = [x for x in step.get("margin") or [] if x is not None]
    return sum(m) / len(m)


def _committed_last(lane: dict) -> list[str]:
    s = [x for x in lane["steps"] if x["kind"] == "denoise"][-1]
    return [lane["tokens"][str(s["canvas"][p])] for p in s["unmasked"]]


NUMBER = re.compile(r"\d+(?:\.\d+)?")


def test_every_preset_has_its_claims():
    assert {p["name"] for p in list_presets()} == set(CLAIMS)


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_every_number_in_a_description_is_a_run_figure_or_a_setting(name):
    c = CLAIMS[name]
    stated = set(NUMBER.findall(load_preset(name)["description"]))
    unknown = stated - set(c["settings"]) - set(c["figures"])
    assert not unknown, f"{name}: numbers neither checked against the run nor settings: {sorted(unknown)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_the_run_shows_what_the_description_says(name):
    lanes = _run(name)
    c = CLAIMS[name]
    for number, check in c["figures"].items():
        assert check(lanes), f"{name}: the figure {number} of its description"
    for j, check in enumerate(c["checks"]):
        assert check(lanes), f"{name}: claim {j}"
