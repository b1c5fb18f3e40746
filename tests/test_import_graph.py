"""The import graph reads one way: page -> app services -> decoders/visualizers -> core, without cycles.

The core is ``playground.core``: the model handle (``playground.core.models``), the trace, the
errors and the limits (``playground.core.settings``). Decoders may import the core and each
other; visualizers read traces, so they may import the core and each other; neither imports
anything else from ``playground``; the core imports none of the layers above it; the engine,
the runner and the Python API never import the page. And no module of ``playground``,
``decoders`` or ``visualizers`` takes part in an import cycle.

Every import statement counts, those inside functions too, since a lazy import still ties a
decoder to the page and a lazy import that dodges a cycle is still a cycle. Checked on the
source (ast), so nothing is imported here.

How a package counts. An edge goes to the module whose names an import takes:
``import a.b`` and ``from a import b`` (``b`` a submodule) point at ``a.b``;
``from a import name`` (``name`` not a submodule) and ``import a`` point at ``a``, the
package's ``__init__``. Python runs ``a/__init__.py`` before any submodule of ``a`` whatever the
import's spelling, so running a parent's ``__init__`` is not by itself an edge. Hence a package
whose ``__init__`` imports a submodule that imports the package back is a cycle only when the
submodule takes names from the ``__init__`` itself (``from a import name``, ``import a``), not
when it imports a sibling through the package (``from a import sibling``).
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


def test_the_app_package_imports_only_the_core_when_imported() -> None:
    # Importing the core runs playground/__init__.py first, so whatever it imports at module level
    # every decoder and visualizer imports too; its forwarders to the API import inside the call.
    tree = ast.parse((ROOT / "playground" / "__init__.py").read_text(encoding="utf-8"))
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom) and n.module != "__future__"]
    assert names and all(_under(m, CORE) for m in names), names


def test_the_checker_sees_lazy_relative_and_from_imports() -> None:
    # The rules are only as good as the parser: a lazy, a relative and a from-import of the
    # page must all be reported, as they would be in a real decoder module.
    code = ("import torch\n"
            "from . import base\n"
            "from .draft_tree import Tree\n"
            "from playground.core.trace import Step\n"
            "def f():\n"
            "    from playground.ui import layout\n"
            "    import playground.runner\n"
            "    from playground import store\n"
            "    import gradio as gr\n")
    found = [m for _, m in project_imports(ROOT / "decoders" / "probe.py", code)]
    assert found == ["decoders.base", "decoders.draft_tree.Tree", "playground.core.trace.Step",
                     "playground.ui.layout", "playground.runner", "playground.store", "gradio"]
    assert [m for m in found if not _under(m, ALLOWED["decoders"])] == found[3:]


# ---- cycles ---------------------------------------------------------------------------------------

GRAPH_ROOTS = ("playground", "decoders", "visualizers")  # the packages whose module graph must be acyclic


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file for every module under the graph's packages.

    A package is named by its folder and stands for its ``__init__.py``.
    """
    out: dict[str, Path] = {}
    for top in GRAPH_ROOTS:
        for f in sorted((root / top).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def import_target(name: str, modules: dict[str, Path] | set[str]) -> str | None:
    """The module that an import of dotted ``name`` takes names from: its longest prefix that is a module.

    ``project_imports`` spells ``from a import b`` as ``a.b``, so a submodule ``b`` is its own target
    and a plain name ``b`` falls back to ``a`` (the module or package ``__init__`` defining it).
    """
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path], sources: dict[str, str] | None = None) -> dict[str, dict[str, int]]:
    """``module -> {imported module: first line}`` over ``modules``, function-level imports included.

    ``sources`` gives a module's text instead of reading its file (for checking the checker).
    """
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for m, f in modules.items():
        text = (sources or {}).get(m)
        for line, name in project_imports(f, text):
            target = import_target(name, modules)
            if target is not None and target != m:
                graph[m].setdefault(target, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted, sorted by first member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def shortest_loop(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One shortest import loop through the component's first module, staying inside the component."""
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    loop = [v]
                    while loop[-1] != start:
                        loop.append(came_from[loop[-1]])
                    return [start] + loop[::-1][1:] + [start] if len(loop) > 1 else [start, v, start]
                if w in inside and w not in came_from and w != start:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


def describe_cycles(graph: dict[str, dict[str, int]], modules: dict[str, Path], cycles: list[list[str]]) -> str:
    """A failure message naming each cycle: its modules, one shortest loop, and every import inside it."""
    lines = [f"{len(cycles)} import cycle(s) (strongly connected modules; imports inside functions count):"]
    for component in cycles:
        inside = set(component)
        lines.append(f"- {len(component)} modules: {', '.join(component)}")
        lines.append(f"  loop: {' -> '.join(shortest_loop(graph, component))}")
        lines += [f"    {modules[m].relative_to(ROOT)}:{line} imports {w}"
                  for m in component for w, line in sorted(graph[m].items(), key=lambda kv: kv[1]) if w in inside]
    return "\n".join(lines)


def test_no_import_cycles() -> None:
    modules = module_files()
    assert len(modules) > 50, f"too few modules found: {sorted(modules)}"
    graph = import_graph(modules)
    cycles = import_cycles(graph)
    assert not cycles, describe_cycles(graph, modules, cycles)


def test_the_cycle_check_counts_lazy_imports_and_packages_by_the_names_taken() -> None:
    # A probe tree, given as text (nothing is written): pkg/__init__ imports pkg.a, pkg.a imports
    # its sibling pkg.b through the package, pkg.b takes a name from the __init__ inside a function
    # (a cycle: pkg -> pkg.a -> pkg.b -> pkg); other.x and other.y import each other, one lazily
    # and relatively.
    probe = ROOT / "playground"
    modules = {"playground.pkg": probe / "pkg" / "__init__.py", "playground.pkg.a": probe / "pkg" / "a.py",
               "playground.pkg.b": probe / "pkg" / "b.py", "playground.pkg.c": probe / "pkg" / "c.py",
               "playground.other.x": probe / "other" / "x.py", "playground.other.y": probe / "other" / "y.py"}
    sources = {"playground.pkg": "from playground.pkg import a\n",
               "playground.pkg.a": "from playground.pkg import b\n",
               "playground.pkg.b": "def f():\n    from playground.pkg import helper\n",
               "playground.pkg.c": "",
               "playground.other.x": "import playground.other.y\n",
               "playground.other.y": "def g():\n    from . import x\n"}
    graph = import_graph(modules, sources)
    assert graph["playground.pkg"] == {"playground.pkg.a": 1}
    assert graph["playground.pkg.a"] == {"playground.pkg.b": 1}  # a sibling through the package
    assert graph["playground.pkg.b"] == {"playground.pkg": 2}  # a name from the __init__, lazily
    assert graph["playground.other.y"] == {"playground.other.x": 2}  # relative, inside a function
    cycles = import_cycles(graph)
    assert cycles == [["playground.other.x", "playground.other.y"],
                      ["playground.pkg", "playground.pkg.a", "playground.pkg.b"]]
    message = describe_cycles(graph, modules, cycles)
    assert "loop: playground.pkg -> playground.pkg.a -> playground.pkg.b -> playground.pkg" in message
    assert "playground/pkg/b.py:2 imports playground.pkg" in message
    # a submodule importing a sibling through the package is no cycle: only names from the __init__ are
    sources["playground.pkg.b"] = "from playground.pkg import c\n"
    assert import_cycles(import_graph(modules, sources)) == [["playground.other.x", "playground.other.y"]]
