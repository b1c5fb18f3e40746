"""The import graph reads one way: app -> engine/runner -> decoders -> core.

The core is the model handle (``playground.core.models``), the trace, the errors and the limits
(``playground.core.settings``). Decoders may import the core and each other; visualizers read
traces, so they may import the core and each other; the core imports none of the layers
above it; the engine, the runner and the Python API never import the page. Every import
statement counts, those inside functions too, since a lazy import still ties a decoder to
the page. Checked on the source (ast), so nothing is imported here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ("playground.core",)  # errors, trace, settings, models: what decoders and visualizers may import
CHECKED = ("playground", "decoders", "visualizers", "app", "gradio")  # top-level names the rules look at
PAGE = ("playground.ui", "app", "gradio")
# what each lower layer may import from the checked names (everything else is free)
ALLOWED = {
    "decoders": CORE + ("decoders",),
    "visualizers": CORE + ("visualizers",),
    "core": CORE,
}
MIDDLE = ("playground/engine.py", "playground/runner.py", "playground/api.py")


def project_imports(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """``(line, module)`` for every checked module that ``path`` imports, relative ones resolved.

    ``text`` is the source (read from ``path`` when None; ``path`` anchors relative imports).
    ``from package import name`` counts as importing ``package.name``, since ``name`` may be a
    submodule; the rules match on prefixes, so a plain attribute costs nothing.
    """
    source = path.read_text(encoding="utf-8") if text is None else text
    tree = ast.parse(source, filename=str(path))
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]  # an __init__'s package is its folder, as a module's is
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out += [(node.lineno, f"{base}.{a.name}" if a.name != "*" else base) for a in node.names]
    return sorted((line, m) for line, m in out if m.split(".")[0] in CHECKED)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _layer_files(layer: str) -> list[Path]:
    if layer == "core":
        return sorted((ROOT / "playground" / "core").rglob("*.py"))
    return sorted((ROOT / layer).rglob("*.py"))


def _report(bad: list[str]) -> str:
    return "imports against the one-way graph (app -> engine/runner -> decoders -> core):\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_import_only_what_lies_below_them(layer: str) -> None:
    files = _layer_files(layer)
    assert len(files) > 3, f"too few files found for layer {layer}: {files}"
    bad = [f"{f.relative_to(ROOT)}:{line} imports {m}"
           for f in files for line, m in project_imports(f) if not _under(m, ALLOWED[layer])]
    assert not bad, _report(bad)


def test_engine_runner_and_api_never_import_the_page() -> None:
    bad = [f"{name}:{line} imports {m}" for name in MIDDLE
           for line, m in project_imports(ROOT / name) if _under(m, PAGE)]
    assert not bad, _report(bad)


def test_the_checker_sees_lazy_relative_and_from_imports() -> None:
    # The rules are only as good as the parser: a lazy, a relative and a from-import of the
    # page must all be reported, as they would be in a real decoder module.
    code = ("import torch\n"
            "from . import base\n"
            "from .speculative._verify import Tree\n"
            "from playground.core.trace import Step\n"
            "def f():\n"
            "    from playground.ui import layout\n"
            "    import playground.runner\n"
            "    from playground import store\n"
            "    import gradio as gr\n")
    found = [m for _, m in project_imports(ROOT / "decoders" / "probe.py", code)]
    assert found == ["decoders.base", "decoders.speculative._verify.Tree", "playground.core.trace.Step",
                     "playground.ui.layout", "playground.runner", "playground.store", "gradio"]
    assert [m for m in found if not _under(m, ALLOWED["decoders"])] == found[3:]
