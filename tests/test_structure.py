"""The house's shape, read from the code: no import circles among casedb's and the importers'
modules, no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES.

One test per file for the sizes, so a failure names the file (and its functions) to split.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("casedb", "importers")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names (a `from X import y` names X.y and X)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join(here + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the packages it imports, anywhere in its body (a function-level
    import ties modules as much as a top-level one). A package's own __init__ is left out:
    importing ``casedb.cases.spec`` runs it, but it defines nothing."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(node, module, is_package):
                    if name in files and name != module and files[name].name != "__init__.py":
                        edges.add(name)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

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
    return found


def long_functions(path: Path) -> list[str]:
    """``name (N lines)`` of every function or method in `path` over MAX_FUNCTION_LINES lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{node.name} ({lines} lines)")
    return out


FILES = sorted(str(p.relative_to(ROOT)) for p in module_files().values())


def test_the_graph_sees_the_imports_there_are():
    graph = import_graph()
    assert "casedb.cases.spec" in graph["casedb.ingest.save"]          # from casedb.cases import spec
    assert "casedb.names" in graph["casedb.cases.ops"]                  # from casedb import names
    assert "importers.trace_values" in graph["importers.oplog"]         # from .trace_values import ...
    assert "casedb.ingest.save" in graph["casedb.ingest.seed"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "modules that import each other in a circle: " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("file", FILES)
def test_module_and_function_sizes(file):
    path = ROOT / file
    lines = len(path.read_text(encoding="utf-8").splitlines())
    problems = []
    if lines > MAX_MODULE_LINES:
        problems.append(f"{lines} lines (at most {MAX_MODULE_LINES}: split it along its seams)")
    problems += [f"function {f}: at most {MAX_FUNCTION_LINES}" for f in long_functions(path)]
    assert not problems, f"{file}: " + "; ".join(problems)
