"""The package's import structure: imports at the top of modules, no cycles, data flowing one way (graph, planner,
plan, executor, timeline, reports, CLI), and no module probing for another one of the package."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "planner"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> list[tuple[str, ast.AST]]:
    """(imported package module, node) for every import of a ``planner`` module in ``path``; ``from a import b``
    counts as an import of ``a.b`` when that is a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("planner"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in MODULES else node.module, node))
        elif isinstance(node, ast.Import):
            out.extend((a.name, node) for a in node.names if a.name.startswith("planner"))
    return out


def import_graph() -> nx.DiGraph:
    """Edges importer -> imported, between the package's modules."""
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for name, path in MODULES.items():
        for target, _node in _imports(path):
            if target in MODULES and target != name:
                g.add_edge(name, target)
    return g


# Optional extras, imported where they are used so that the package loads without them.
OPTIONAL = ("onnxruntime", "ray")


def test_every_import_is_at_the_top_of_its_module():
    inner = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner.extend(f"{name}:{sub.lineno} in {node.name}" for sub in ast.walk(node)
                             if isinstance(sub, (ast.Import, ast.ImportFrom))
                             and not ast.unparse(sub).split()[1].startswith(OPTIONAL))
    assert inner == []


def test_imports_between_modules_have_no_cycle():
    g = import_graph()
    cycles = list(nx.simple_cycles(g))
    assert cycles == [], f"import cycles: {cycles[:5]}"


# Who may not import whom: data flows graph -> planner -> plan -> executor -> timeline -> reports -> CLI.
FORBIDDEN = [
    ("planner.executor", "planner.planners"),
    ("planner.executor", "planner.report"),
    ("planner.timeline", "planner.executor"),
    ("planner.graph", "planner.formats"),
    ("planner.graph", "planner.planners"),
    ("planner.plan", "planner.executor"),
    ("planner.planners", "planner.report"),
    ("planner.planners", "planner.cli"),
    ("planner.planners", "planner.api"),
    ("planner.bounds", "planner.planners"),
    ("planner.formats", "planner.planners"),
    ("planner.workloads", "planner.planners"),
    ("planner.report", "planner.cli"),
    ("planner.api", "planner.cli"),
]


@pytest.mark.parametrize(("lower", "upper"), FORBIDDEN, ids=[f"{a}-/->{b}" for a, b in FORBIDDEN])
def test_lower_layers_do_not_reach_up(lower, upper):
    g = import_graph()

    def inside(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    found = []
    for src in (n for n in g if inside(n, lower)):
        for dst in nx.descendants(g, src):
            if inside(dst, upper):
                path = nx.shortest_path(g, src, dst)
                found.append(" -> ".join(path))
                break
    assert found == [], f"{lower} reaches {upper}: {found[:3]}"


def test_no_module_probes_for_another():
    """A module of the package is imported, never looked up at run time (``importlib``, ``find_spec``,
    ``hasattr(module, ...)``): what the package contains is known when it is written."""
    probes = []
    for name, path in MODULES.items():
        text = path.read_text()
        for needle in ("import_module(\"planner", "find_spec", "__import__("):
            if needle in text:
                probes.append(f"{name}: {needle}")
    assert probes == []


def test_the_import_graph_sees_the_package():
    """The checks above can fail: the graph has the edges it should (a check on an empty graph passes)."""
    g = import_graph()
    assert g.has_edge("planner.planners.cpsat.solve", "planner.planners.cpsat.lns")
    assert g.has_edge("planner.api", "planner.executor")
    assert len(g.edges) > 100
