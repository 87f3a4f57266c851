"""casedb/store/ owns every query and every connection: no module of casedb/ or importers/
outside it runs SQL (``execute``, ``executemany``, ``executescript``, sqlite-utils' ``query``), holds
SQL text (a SELECT ... FROM, INSERT INTO, UPDATE ... SET, DELETE FROM, CREATE, PRAGMA string,
docstrings aside) or opens SQLite itself (``sqlite3.connect``, ``sqlite_utils.Database``): they call
the named reads and the one opener (casedb.store.database.Store) instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("casedb", "importers")
STORE = ROOT / "casedb" / "store"
SQL_CALLS = {"execute", "executemany", "executescript", "query"}
OPENERS = {("sqlite3", "connect"), ("sqlite_utils", "Database")}
SQL_TEXT = re.compile(r"\b(SELECT\b.*\bFROM\b|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b"
                      r"|CREATE\s+(TEMP\s+)?(TABLE|VIEW|INDEX|TRIGGER)\b|PRAGMA\s+\w+)", re.S)
# Modules outside casedb/store/ allowed SQL, each with why. Empty: keep it so.
ALLOWED: dict[str, str] = {}


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _text(node: ast.AST) -> str | None:
    """The literal text of a string constant or an f-string (its placeholders as ``?``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "?" for v in node.values)
    return None


def sql_found(source: str) -> list[str]:
    """What in ``source`` is SQL or opens SQLite, as 'line N: what' (empty when nothing is)."""
    tree = ast.parse(source)
    skipped = _docstrings(tree)  # (and the parts of f-strings: read whole, as their f-string)
    skipped |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr in SQL_CALLS:
                found.append(f"line {node.lineno}: .{f.attr}() call")
            elif isinstance(f.value, ast.Name) and (f.value.id, f.attr) in OPENERS:
                found.append(f"line {node.lineno}: {f.value.id}.{f.attr}() opens SQLite")
        elif isinstance(node, ast.ImportFrom) and node.module in ("sqlite3", "sqlite_utils"):
            names = {a.name for a in node.names}
            if names & {"connect", "Database"}:
                found.append(f"line {node.lineno}: imports {node.module}'s opener")
        elif id(node) not in skipped and isinstance(node, (ast.Constant, ast.JoinedStr)):
            text = _text(node)
            if text and SQL_TEXT.search(text):
                found.append(f"line {node.lineno}: SQL text {text.strip()[:60]!r}")
    return found


def modules_outside_store() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) if STORE not in p.parents]


def test_no_module_outside_store_holds_sql_or_opens_sqlite():
    bad = {}
    for path in modules_outside_store():
        rel = path.relative_to(ROOT).as_posix()
        found = sql_found(path.read_text(encoding="utf-8"))
        if found and rel not in ALLOWED:
            bad[rel] = found
    assert not bad, ("SQL outside casedb/store/: move each query into a named read of casedb/store/ "
                     f"(e.g. casedb/store/reads_report.py) and call it; open the DB through Store: {bad}")


def test_the_check_sees_each_kind_of_sql():
    """The check itself: each way SQL can sit in a module is found; docstrings and plain words are not."""
    assert sql_found('db.execute("x")') == ["line 1: .execute() call"]
    assert sql_found("store.db.query(q)") == ["line 1: .query() call"]
    assert sql_found("conn.executescript(s)") == ["line 1: .executescript() call"]
    assert sql_found("import sqlite3\ncon = sqlite3.connect(p)") == ["line 2: sqlite3.connect() opens SQLite"]
    assert sql_found("from sqlite3 import connect") == ["line 1: imports sqlite3's opener"]
    assert sql_found("db = sqlite_utils.Database(p)") == ["line 1: sqlite_utils.Database() opens SQLite"]
    assert sql_found('Q = """SELECT id\n FROM runs"""') == ["line 1: SQL text 'SELECT id\\n FROM runs'"]
    assert sql_found('q = f"DELETE FROM {table} WHERE id = ?"') == ["line 1: SQL text 'DELETE FROM ? WHERE id = ?'"]
    assert sql_found('q = "UPDATE runs SET label = ?"') == ["line 1: SQL text 'UPDATE runs SET label = ?'"]
    assert sql_found('q = "INSERT OR IGNORE INTO results (a) VALUES (?)"')
    assert sql_found('"""A docstring may say SELECT x FROM runs."""\nmsg = "select fewer rows"') == []


def _other_openers(source: str) -> list[str]:
    """Imports of a way to open the DB other than Store: the store's raw ``connect`` and the old
    history module (kept for tests only)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names = {a.name for a in node.names}
            if (node.module == "casedb.store.database" and "connect" in names
                    or node.module == "casedb.store" and "history" in names or node.module == "casedb.store.history"):
                found.append(f"line {node.lineno}: from {node.module} import {', '.join(sorted(names))}")
        elif isinstance(node, ast.Import) and any(a.name == "casedb.store.history" for a in node.names):
            found.append(f"line {node.lineno}: import casedb.store.history")
    return found


def test_one_way_to_open_a_db():
    """Outside casedb/store/, a DB is opened as a Store (open_store, or ingest.seed.open_seeded
    over it); nothing takes the raw connection or the history module's."""
    bad = {p.relative_to(ROOT).as_posix(): f for p in modules_outside_store()
           if (f := _other_openers(p.read_text(encoding="utf-8")))}
    assert not bad, f"open the DB through casedb.store.database.Store / open_store (store.conn): {bad}"
    assert _other_openers("from casedb.store import history") == ["line 1: from casedb.store import history"]
