"""docs/teaching.md stays runnable: its commands parse, name real presets, decoders and knobs,
and it links no missing picture."""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "teaching.md"


def _commands() -> list[list[str]]:
    """Every `python -m playground ...` line of the doc's code blocks (continuations joined)."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0] if not line.lstrip().startswith("python -c") else line
            words = shlex.split(line.split(" > ", 1)[0])  # a shell redirection is no argument
            if words[:3] == ["python", "-m", "playground"]:
                out.append(words[3:])
    return out


def test_the_doc_has_the_commands_it_promises():
    subs = {c[0] for c in _commands()}
    assert {"compare", "generate", "sessions", "list-presets"} <= subs


@pytest.mark.parametrize("args", _commands(), ids=lambda a: " ".join(a)[:60])
def test_every_command_parses_and_names_real_presets_decoders_and_knobs(args):
    from decoders import REGISTRY
    from playground.cli import build_parser
    from playground.presets import load_preset

    ns = build_parser(args).parse_args(args)
    if getattr(ns, "preset", None):
        load_preset(ns.preset)  # raises on an unknown preset
    decoder = getattr(ns, "decoder", None)
    if decoder:
        assert decoder in REGISTRY, decoder
        for kv in getattr(ns, "param", None) or []:
            assert kv.split("=", 1)[0] in REGISTRY[decoder].params, (decoder, kv)


def test_the_doc_links_only_pictures_that_exist():
    text = DOC.read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images, "the plot guide shows the screenshots that exist"
    for rel in images:
        assert (DOC.parent / rel).is_file(), rel


def test_presets_and_decoders_named_in_the_plans_exist():
    from decoders import REGISTRY
    from playground.presets import load_preset

    text = DOC.read_text(encoding="utf-8")
    for name in set(re.findall(r"preset `([a-z0-9-]+)`", text)):
        load_preset(name)
    plans = text.split("## 1.")[1].split("## 2.")[0]
    named = set(re.findall(r"`([a-z_]+)`", plans))
    from playground.policies import NAMES as POLICIES

    knobs = {k for c in REGISTRY.values() for k in c.params}
    unknown = {n for n in named if n not in REGISTRY and n not in knobs and n not in POLICIES and n != "policy"}
    assert not unknown, unknown


def test_the_pictures_come_from_the_screenshot_command_and_real_preset_lanes():
    # `playground screenshots` drives the page by preset title and lane number: a renamed preset
    # or a reordered lane would silently picture the wrong decoder under the doc's annotation
    from decoders import REGISTRY
    from playground.presets import list_presets
    from playground.screenshots import COLUMNS, DIVERGENCE, NAMES, SHOWDOWN, THREE_LANES

    text = DOC.read_text(encoding="utf-8")
    shown = {Path(rel).stem for rel in re.findall(r"!\[[^\]]*\]\(screenshots/([^)]+)\)", text)}
    assert shown <= set(NAMES), shown - set(NAMES)
    # one picture per step kind of the built-in decoders
    assert {"inspector", "speculative-showdown", "diffusion-canvas", "jacobi"} <= shown

    def preset(part: str) -> dict:
        found = [p for p in list_presets() if part in p["title"]]
        assert len(found) == 1, (part, [p["title"] for p in found])
        return found[0]

    for part in (THREE_LANES, SHOWDOWN, DIVERGENCE):
        preset(part)
    lanes = {}
    for name, (part, lane, _nth) in COLUMNS.items():
        p = preset(part)
        assert 1 <= lane <= len(p["lanes"]), (name, lane)
        lanes[name] = p["lanes"][lane - 1]
    assert REGISTRY[lanes["diffusion-canvas"]["decoder"]].step_kind == "denoise"
    assert REGISTRY[lanes["jacobi"]["decoder"]].step_kind == "jacobi"
    assert lanes["constraint"]["params"].get("regex") or lanes["constraint"]["params"].get("json_schema")
    assert lanes["watermark"]["decoder"] == "watermark" and lanes["particles"]["decoder"] == "smc"
