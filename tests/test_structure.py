"""The house's shape, read from the code: every import keeps to the layering table
(casedb/layers.py: which part may import which), no import circles among casedb's and the
importers' modules, the top level imports the standard library alone, no module over
MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES.

One test per file for the sizes, so a failure names the file (and its functions) to split.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from casedb import layers

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("casedb", "importers")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def module_files(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages (a package's own name: its
    ``__init__.py``)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The dotted module a ``from X import ...`` names, relative imports resolved."""
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join(here + ([base] if base else []))
    return base


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments; not imports)."""
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return out


class _Modules:
    """The modules of the packages, parsed once, and where a name imported from a package is
    defined (its ``__init__`` may hand names on from its modules, eagerly or on first use)."""

    def __init__(self, root: Path, packages):
        self.files = module_files(root, packages)
        self.trees = {m: ast.parse(p.read_text(encoding="utf-8"), str(p)) for m, p in self.files.items()}

    def is_package(self, module: str) -> bool:
        return self.files[module].name == "__init__.py"

    def empty(self, module: str) -> bool:
        body = self.trees[module].body
        return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)

    def definer(self, package: str, name: str, seen=()) -> str:
        """The module that defines ``name`` as ``package`` hands it on: a submodule of that name,
        the module its ``__init__`` imports it from, the one module of the package defining it
        (a lazy ``__getattr__`` facade), else the ``__init__`` itself."""
        if f"{package}.{name}" in self.files:
            return f"{package}.{name}"
        tree = self.trees[package]
        if name in _top_level_names(tree):
            return package
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if (a.asname or a.name) == name:
                        return self.resolve(_base(node, package, True), a.name, seen)
        found = [m for m in self.files if m.rpartition(".")[0] == package and name in _top_level_names(self.trees[m])]
        return found[0] if len(found) == 1 else package

    def resolve(self, module: str, name: str | None, seen=()) -> str | None:
        """The module an import of ``name`` from ``module`` (of ``module`` itself: None) reaches;
        None outside the packages."""
        if module not in self.files:
            return None
        if name is None or not self.is_package(module) or (module, name) in seen:
            return module
        return self.definer(module, name, seen + ((module, name),))


def _edges(mods: _Modules, module: str) -> set[str]:
    """What one module imports: each imported name resolved to the module defining it; a package
    imported whole (``from casedb import triage``) by each attribute read from it."""
    is_package = mods.is_package(module)
    edges, aliases = set(), {}
    for node in ast.walk(mods.trees[module]):
        if isinstance(node, ast.Import):
            for a in node.names:
                edges.add(mods.resolve(a.name, None))
                if a.asname and a.name in mods.files:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, module, is_package)
            for a in node.names:
                target = mods.resolve(base, a.name)
                edges.add(target)
                if target in mods.files and mods.is_package(target):
                    aliases[a.asname or a.name] = target
    for node in ast.walk(mods.trees[module]):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            edges.add(mods.resolve(aliases[node.value.id], node.attr))
    # importing casedb.cases.spec runs casedb/cases/__init__.py: a tie only where it holds code
    return {e for e in edges if e and e != module and not (mods.is_package(e) and mods.empty(e))}


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of the packages it imports, anywhere in its body (a function-level
    import ties modules as much as a top-level one), through a package's ``__init__`` to the
    module defining what it hands on."""
    mods = _Modules(root, packages)
    return {module: _edges(mods, module) for module in mods.files}


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


def part_of(module: str, parts, top: str) -> str:
    """The part of the layering table (or front end) ``module`` belongs to: the longest name among
    ``parts`` it is or lies under; ``top`` for the rest of the top package."""
    found = [p for p in parts if p != top and (module == p or module.startswith(p + "."))]
    return max(found, key=len) if found else top


def layer_violations(graph: dict[str, set[str]], may_import=None, front_ends=None, top=layers.TOP) -> list[str]:
    """``a -> b (part A may not import part B)`` for every import the table does not allow."""
    may_import = layers.MAY_IMPORT if may_import is None else may_import
    front_ends = layers.FRONT_ENDS if front_ends is None else front_ends
    parts = tuple(may_import) + tuple(front_ends)
    out = []
    for a, targets in sorted(graph.items()):
        pa = part_of(a, parts, top)
        for b in sorted(targets):
            pb = part_of(b, parts, top)
            if pa == pb or pa in front_ends:
                continue
            if pb in front_ends or pb not in may_import.get(pa, ()):
                out.append(f"{a} -> {b} (part {pa} may not import part {pb})")
    return out


def import_time_imports(tree: ast.Module) -> list[str]:
    """The top-level package of every import a module runs when it is imported (not those inside
    its functions)."""
    out = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Import):
            out += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append((node.module or "").split(".")[0])
        todo.extend(ast.iter_child_nodes(node))
    return out


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


def test_the_graph_sees_imports_through_a_package():
    graph = import_graph()
    assert "casedb.triage.files" in graph["casedb.run.session"]         # from casedb.triage import run_paths
    assert "casedb.triage.files" in graph["casedb.run.worker"]          # from casedb import triage; triage.load
    assert "casedb.triage.checks" in graph["casedb.run.runner"]         # triage.require_clean
    assert "casedb.judge.selectors" in graph["casedb.triage"]           # its __getattr__ hands on `literal`


def test_the_layering_table_points_one_way():
    table = layers.MAY_IMPORT
    assert set(layers.TOP.split(".")[:1]) <= set(table)
    assert all(set(allowed) <= set(table) for allowed in table.values()), "a part names a part the table lacks"
    found = circles({part: set(allowed) for part, allowed in table.items()})
    assert not found, "parts that may import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_import_keeps_to_the_layering_table():
    found = layer_violations(import_graph())
    assert not found, ("imports casedb/layers.py does not allow (move the code to the part it belongs to, or "
                       "change the table and docs/architecture.md):\n  " + "\n  ".join(found))


def test_the_top_level_imports_the_standard_library_only():
    own = {layers.TOP, *PACKAGES}
    parts = tuple(layers.MAY_IMPORT) + layers.FRONT_ENDS
    found = []
    for module, path in module_files().items():
        if part_of(module, parts, layers.TOP) != layers.TOP:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += [f"{module}: {name}" for name in import_time_imports(tree)
                  if name not in sys.stdlib_module_names and name not in own and name != "__future__"]
    assert not found, "top-level modules importing more than the standard library when imported: " + ", ".join(found)


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


# A lazy facade as casedb/triage/__init__.py is one: names handed on from its modules on first use.
_FACADE = """import importlib
_HOME = {"helper": "impl"}
def __getattr__(name):
    return getattr(importlib.import_module(f"pkg.high.{_HOME[name]}"), name)
"""


@pytest.mark.parametrize("low", ["from pkg.high import helper\n", "from pkg import high\nhigh.helper()\n"])
def test_a_layering_violation_through_a_facade_fails_the_check(tmp_path, low):
    _tree(tmp_path, {"pkg/__init__.py": "", "pkg/words.py": "X = 1\n",
                     "pkg/low/__init__.py": "", "pkg/low/a.py": "from pkg.words import X\n" + low,
                     "pkg/high/__init__.py": _FACADE,
                     "pkg/high/impl.py": "from pkg.low import a\ndef helper():\n    return a\n"})
    table = {"pkg": (), "pkg.low": ("pkg",), "pkg.high": ("pkg", "pkg.low")}
    graph = import_graph(tmp_path, ("pkg",))
    assert "pkg.low.a -> pkg.high.impl (part pkg.low may not import part pkg.high)" in layer_violations(graph, table, (), "pkg")
    assert circles(graph) == [["pkg.high.impl", "pkg.low.a"]]
    # the same tree without the facade import keeps to the table
    (tmp_path / "pkg/low/a.py").write_text("from pkg.words import X\n", encoding="utf-8")
    graph = import_graph(tmp_path, ("pkg",))
    assert layer_violations(graph, table, (), "pkg") == [] and circles(graph) == []


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
