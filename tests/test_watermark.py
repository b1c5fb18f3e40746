"""The green-list watermark: same green lists as transformers, detected both ways, one-line
errors, and the views of its evidence."""

from __future__ import annotations

import json

import pytest
import torch

import playground
from decoders.guided.watermark import WatermarkScheme, detect
from playground.core.errors import PlaygroundError

MODEL = "tiny-shakespeare"
PROMPT = "ROMEO:\nBut soft, what light"


@pytest.fixture(scope="module")
def handle():
    from playground.core.models import load_model

    return load_model(MODEL, device="cpu")


def their_detector(handle, **cfg):
    from transformers import WatermarkDetector, WatermarkingConfig

    return WatermarkDetector(model_config=handle.model.config, device="cpu",
                             watermarking_config=WatermarkingConfig(**cfg))


def their_z(handle, ids, **cfg) -> float:
    out = their_detector(handle, **cfg)(torch.tensor([ids]), return_dict=True)
    return float(out.z_score[0])


# ---------------------------------------------------------------------- green lists
@pytest.mark.parametrize("seeding,width", [("lefthash", 1), ("lefthash", 3), ("selfhash", 1), ("selfhash", 4)])
@pytest.mark.parametrize("vocab,gamma,key", [(4096, 0.25, 15485863), (1000, 0.3, 7), (50257, 0.5, 2**40 + 3)])
def test_green_lists_and_bias_equal_transformers(seeding, width, vocab, gamma, key):
    from transformers.generation.logits_process import WatermarkLogitsProcessor

    theirs = WatermarkLogitsProcessor(vocab, "cpu", greenlist_ratio=gamma, bias=2.0, hashing_key=key,
                                      seeding_scheme=seeding, context_width=width)
    ours = WatermarkScheme(vocab, gamma, 2.0, key, seeding, width)
    g = torch.Generator().manual_seed(vocab + width)
    for _ in range(6):
        seq = torch.randint(0, vocab, (width + 2,), generator=g)
        assert torch.equal(theirs._get_greenlist_ids(seq), ours.greenlist(seq.tolist()))
        scores = torch.randn(1, vocab, generator=g)
        expected = theirs(seq[None], scores)[0]
        got = scores[0].clone()
        green = ours.green_ids(seq.tolist(), scores[0])
        got[green] += 2.0
        assert torch.equal(expected, got)


def test_bad_scheme_settings_are_one_line():
    for kw in ({"gamma": 0.0}, {"gamma": 1.0}, {"seeding": "hash"}, {"key": -1}, {"context_width": 0},
               {"gamma": 0.01, "vocab_size": 50}):
        args = {"vocab_size": 4096, **kw}
        with pytest.raises(PlaygroundError) as e:
            WatermarkScheme(**args)
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------------- our text, their detector
SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
def test_transformers_detects_what_we_watermark(handle, seed):
    tr = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=64, seed=seed,
                             watermark_gamma=0.25, watermark_delta=2.0)
    ids = tr["output_ids"]
    assert len(ids) == 64
    z = their_z(handle, ids, greenlist_ratio=0.25, bias=2.0)
    assert z > 4
    # our detector on the same ids gives their number
    ours = detect(ids, WatermarkScheme(4096, 0.25))
    assert ours["z"] == pytest.approx(z, abs=1e-9)
    # and the trace's running z (the prompt as context) is the detector's with that context
    full = detect(ids, WatermarkScheme(4096, 0.25), context=tr["prompt_ids"])
    assert tr["stats"]["watermark"]["z"] == pytest.approx(full["z"], abs=1e-4)
    assert [s["watermark"]["green"] for s in tr["steps"]] == [t["green"] for t in full["tokens"]]


@pytest.mark.parametrize("seed", SEEDS)
def test_unwatermarked_text_is_not_detected(handle, seed):
    tr = playground.generate(model=MODEL, decoder="sample", prompt=PROMPT, max_new_tokens=64, seed=seed)
    z = their_z(handle, tr["output_ids"], greenlist_ratio=0.25, bias=2.0)
    assert z < 4  # below the detection threshold: no false positive
    assert detect(tr["output_ids"], WatermarkScheme(4096, 0.25))["z"] == pytest.approx(z, abs=1e-9)


@pytest.mark.slow
def test_watermarked_and_plain_z_scores_over_seeds(handle):
    """Over 12 seeds, 64 tokens, delta 2, gamma 0.25: transformers' detector gives every
    watermarked text z > 4 and plain text the null's spread (z < 2 but for about one in
    twenty, mean near 0, none past 4)."""
    marked, plain = [], []
    for seed in range(12):
        for decoder, out in (("watermark", marked), ("sample", plain)):
            tr = playground.generate(model=MODEL, decoder=decoder, prompt=PROMPT, max_new_tokens=64, seed=seed)
            out.append(their_z(handle, tr["output_ids"], greenlist_ratio=0.25, bias=2.0))
    assert min(marked) > 4
    assert max(plain) < 4 and sum(z < 2 for z in plain) >= 11 and abs(sum(plain) / len(plain)) < 1


def test_delta_zero_is_the_sample_decoder():
    a = playground.generate(model=MODEL, decoder="sample", prompt=PROMPT, max_new_tokens=24, seed=5, top_k=40)
    b = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=24, seed=5, top_k=40,
                            watermark_delta=0.0)
    assert a["output_ids"] == b["output_ids"]
    assert b["stats"]["chain"][-1].startswith("watermark(")


def test_watermark_under_a_constraint():
    import regex

    pattern = r"[A-Z][a-z]+( [a-z]+)*\."
    tr = playground.generate(model=MODEL, decoder="watermark", prompt="ROMEO:\n", max_new_tokens=32, seed=2,
                             regex=pattern)
    assert tr["stats"]["finish_reason"] == "constraint" and regex.fullmatch(pattern, tr["text"])
    assert all("constraint" in s and "watermark" in s for s in tr["steps"])


def test_selfhash_text_is_detected_by_transformers(handle):
    kw = dict(watermark_seeding="selfhash", watermark_context_width=2, watermark_key=99, watermark_gamma=0.25)
    tr = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=64, seed=3, **kw)
    z = their_z(handle, tr["output_ids"], greenlist_ratio=0.25, bias=2.0, seeding_scheme="selfhash",
                context_width=2, hashing_key=99)
    assert z > 4


# ---------------------------------------------------------------------- their text, our detector
def their_generate(handle, seed: int, **cfg) -> list[int]:
    from transformers import WatermarkingConfig

    ids = torch.tensor([handle.encode(PROMPT)])
    torch.manual_seed(seed)
    out = handle.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=64,
                                min_new_tokens=64, pad_token_id=2,
                                watermarking_config=WatermarkingConfig(**cfg) if cfg else None)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("cfg", [
    {"greenlist_ratio": 0.25, "bias": 2.0},
    {"greenlist_ratio": 0.5, "bias": 3.0, "seeding_scheme": "selfhash", "context_width": 3, "hashing_key": 12345},
])
def test_we_detect_what_transformers_watermarked(handle, cfg):
    ids = their_generate(handle, seed=11, **cfg)
    theirs = their_detector(handle, **cfg)(torch.tensor([ids]), return_dict=True)
    scheme = WatermarkScheme(4096, cfg["greenlist_ratio"], key=cfg.get("hashing_key", 15485863),
                             seeding=cfg.get("seeding_scheme", "lefthash"), context_width=cfg.get("context_width", 1))
    ours = detect(ids, scheme)
    assert ours["z"] == pytest.approx(float(theirs.z_score[0]), abs=1e-9)
    assert ours["green"] == int(theirs.num_green_tokens[0]) and ours["scored"] == int(theirs.num_tokens_scored[0])
    assert ours["p_value"] == pytest.approx(float(theirs.p_value[0]), rel=1e-6, abs=1e-12)
    assert ours["z"] > 4 and ours["prediction"]
    # without the key the same text reads as unwatermarked
    assert detect(ids, WatermarkScheme(4096, cfg["greenlist_ratio"], key=424242,
                                       seeding=scheme.seeding, context_width=scheme.context_width))["z"] < 2


def test_repeated_ngrams_counted_once_like_transformers(handle):
    ids = their_generate(handle, seed=4, greenlist_ratio=0.25, bias=2.0)
    ids = ids[:20] * 3  # plenty of repeats
    from transformers import WatermarkDetector, WatermarkingConfig

    det = WatermarkDetector(model_config=handle.model.config, device="cpu",
                            watermarking_config=WatermarkingConfig(greenlist_ratio=0.25), ignore_repeated_ngrams=True)
    theirs = det(torch.tensor([ids]), return_dict=True)
    ours = detect(ids, WatermarkScheme(4096, 0.25), ignore_repeated_ngrams=True)
    assert (ours["scored"], ours["green"]) == (int(theirs.num_tokens_scored[0]), int(theirs.num_green_tokens[0]))
    assert sum(1 for t in ours["tokens"] if t.get("repeat")) == len(ids) - 1 - ours["scored"]


# ---------------------------------------------------------------------- knobs and CLI
@pytest.mark.parametrize("knobs", [
    {"watermark_gamma": 0.0}, {"watermark_gamma": 1.0}, {"watermark_delta": -1},
    {"watermark_seeding": "minhash"}, {"watermark_key": -5}, {"watermark_context_width": 0},
    {"watermark_gamma": "lots"},
])
def test_bad_knobs_are_one_line(knobs):
    with pytest.raises(PlaygroundError) as e:
        playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=4, **knobs)
    assert "\n" not in str(e.value) and "watermark" in str(e.value)


def test_cli_detects_watermarked_text(capsys, handle):
    from playground.cli import main

    tr = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=64, seed=1)
    assert main(["watermark-detect", "--model", MODEL, "--text", tr["text"], "--prompt", PROMPT, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["z"] > 4 and res["prediction"] is True and 0 < res["p_value"] < 1e-4
    assert res["green"] == sum(1 for t in res["tokens"] if t["green"])
    assert "".join(t["text"] for t in res["tokens"]) == tr["text"]
    assert res["tokens"][-1]["z"] == pytest.approx(res["z"], abs=1e-4)
    plain = playground.generate(model=MODEL, decoder="sample", prompt=PROMPT, max_new_tokens=64, seed=1)
    assert main(["watermark-detect", "--model", MODEL, "--text", plain["text"]]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("z = ") and "no watermark detected" in line


@pytest.mark.parametrize("argv,needle", [
    (["--text", ""], "text"),
    (["--text", "a"], "too short"),
    (["--text", "hello there", "--gamma", "0"], "gamma"),
    (["--text", "hello there", "--seeding", "minhash"], "seeding"),
    (["--text", "hello there", "--model", "/no/such/model"], "no/such/model"),
    (["--text-file", "/no/such/file.txt"], "cannot read"),
])
def test_cli_errors_are_one_line(capsys, argv, needle):
    from playground.cli import main

    assert main(["watermark-detect", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err


# ---------------------------------------------------------------------- views
def test_views_colour_tokens_and_draw_the_running_z():
    import visualizers as V
    from visualizers.watermark import watermark_tokens_html, watermark_z_figure

    tr = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=16, seed=2)
    html = watermark_tokens_html(tr, 9)
    greens = [s["watermark"]["green"] for s in tr["steps"][:10]]
    assert html.count('class="tok wm"') == 10
    assert html.count('data-green="true"') == sum(1 for g in greens if g is True)
    assert html.count('data-green="false"') == sum(1 for g in greens if g is False)
    fig = watermark_z_figure(tr)
    zs = list(fig.data[0].y)
    assert len(zs) == 16 and zs[-1] == pytest.approx(tr["stats"]["watermark"]["z"], abs=1e-3)
    assert "Watermark" in [t for t, _ in V.step_figures(tr, 3)]
    assert "Watermark z-score" in [t for t, _ in V.run_figures(tr)]
    # a trace without the evidence gets a note, not an error
    assert "no watermark evidence" in watermark_tokens_html({"steps": []}, 0)


def test_lane_output_coloured_green_and_red():
    import visualizers as V
    from playground.ui import rules as st
    from visualizers.watermark import GREEN_BG, RED_BG

    tr = playground.generate(model=MODEL, decoder="watermark", prompt=PROMPT, max_new_tokens=12, seed=6)
    assert st.auto_metric(tr, "auto") == "watermark"
    assert st.auto_metric(playground.generate(model=MODEL, decoder="sample", prompt=PROMPT, max_new_tokens=2),
                          "auto") == "probability"
    html = V.tokens_html(tr, "watermark")
    greens = [s["watermark"]["green"] for s in tr["steps"]]
    assert html.count(GREEN_BG) == greens.count(True) and html.count(RED_BG) == greens.count(False)
    assert "watermark" in V.legend_html("watermark") or "green list" in V.legend_html("watermark")
