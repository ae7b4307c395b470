"""The import graph of `src/gradflow` has no cycle and no upward arrow.

Every `import` counts, at module level and inside functions (a function-level import hides a cycle from
Python, not from the design). The layer order is read from the `layers` block of `docs/architecture.md`,
so the document and the code cannot drift apart: a module may import its own layer's modules and the
layers below, never one above.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted((SOURCE / "gradflow").rglob("*.py")):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _targets(module: str, package: bool, node: ast.Import | ast.ImportFrom, known) -> list[str]:
    """The gradflow modules one import statement names (a name imported from a package that is one of
    its submodules counts as that submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        names = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin
                 for alias in node.names]
    targets = []
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known and name != module and name.startswith("gradflow"):
            targets.append(name)
    return targets


def import_graph() -> nx.DiGraph:
    """Modules as nodes, one edge per importing pair, labelled with the first line that imports."""
    known = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for module, (path, package) in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, package, node, known):
                    if not graph.has_edge(module, target):
                        graph.add_edge(module, target, line=node.lineno)
    return graph


def documented_layers() -> list[list[str]]:
    """The layers of `docs/architecture.md`'s ```layers block, top first; one line a layer."""
    match = re.search(r"```layers\n(.*?)```", ARCHITECTURE.read_text(), re.S)
    assert match, "docs/architecture.md has no ```layers block"
    return [line.split("#")[0].split() for line in match.group(1).splitlines() if line.split("#")[0].strip()]


def _layer_of(module: str, layers: list[list[str]]) -> int:
    """Index of the layer (0 = bottom) whose longest prefix names the module."""
    best, depth = None, -1
    for index, names in enumerate(reversed(layers)):
        for name in names:
            full = "gradflow" if name == "gradflow" else f"gradflow.{name}"
            if (module == full or module.startswith(full + ".")) and len(full) > depth:
                best, depth = index, len(full)
    assert best is not None, f"module {module} is in no layer of docs/architecture.md"
    return best


def test_no_import_cycle():
    graph = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    described = []
    for circle in circles:
        members = set(circle)
        arrows = [f"{a} -> {b} (line {graph.edges[a, b]['line']})"
                  for a in circle for b in sorted(graph.successors(a)) if b in members]
        described.append(f"{len(circle)} modules:\n    " + "\n    ".join(arrows))
    assert not circles, "import cycles in src/gradflow:\n  " + "\n  ".join(described)


def test_no_upward_import():
    graph, layers = import_graph(), documented_layers()
    upward = [f"{a} -> {b} (line {line})" for a, b, line in sorted(graph.edges(data="line"))
              if _layer_of(b, layers) > _layer_of(a, layers)]
    assert not upward, "imports from a lower layer to a higher one:\n  " + "\n  ".join(upward)


def test_every_layer_names_a_package_or_module():
    known = _modules()
    for names in documented_layers():
        for name in names:
            full = "gradflow" if name == "gradflow" else f"gradflow.{name}"
            assert full in known, f"docs/architecture.md names layer '{name}', which is no module of gradflow"


@pytest.mark.parametrize("source, expected", [
    ("from gradflow.core import graph", ["gradflow.core.graph"]),
    ("from gradflow.core.graph import Graph", ["gradflow.core.graph"]),
    ("from . import graph", ["gradflow.core.graph"]),
    ("from .errors import GradflowError", ["gradflow.core.errors"]),
    ("from .. import api", ["gradflow.api"]),
    ("import gradflow.runtime.compile", ["gradflow.runtime.compile"]),
    ("import numpy", []),
])
def test_imports_are_resolved(source, expected):
    """The resolver itself, on the module `gradflow.core.passes` (a check that cannot see an arrow
    would pass on any code)."""
    node = ast.parse(source).body[0]
    assert _targets("gradflow.core.passes", False, node, _modules()) == expected
