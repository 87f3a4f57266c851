"""Is an SQLite file casedb's, and nothing else? Checked on every connection, before casedb reads
or writes it (:func:`casedb.store.database.connect`; ``casedb merge`` checks each source the same way).

A database can come from elsewhere (a CI artifact, a shard, a colleague's file), and its schema
objects are code that SQLite runs: a trigger fires on casedb's own writes (a recorded ref_error
becomes "passed"), a view decides what casedb reads (a recursive view as ``blobs`` never ends), a
unique index makes a write vanish. So the file's ``sqlite_master`` must be what casedb's
migrations create at the level the file records (``_sqlite_migrations``): every object casedb
makes, with the same SQL text (identifier quoting and whitespace aside, string literals exact),
and nothing else but plain tables of the user's own (never read by casedb), their indexes and
SQLite's own statistics. Anything else is refused, naming each object: casedb never drops what it
did not create. An empty file is a new database.
"""

from __future__ import annotations

import re
import sqlite3
from functools import lru_cache

from casedb.errors import CasedbError

# More schema objects than casedb makes many times over: not a casedb file (read no further).
MAX_OBJECTS = 2000
# SQLite's own tables that any file may have (ANALYZE, AUTOINCREMENT).
SQLITE_OWN = ("sqlite_stat1", "sqlite_stat4", "sqlite_sequence")
MIGRATIONS_TABLE = "_sqlite_migrations"

_TOKEN = re.compile(r"""'(?:[^']|'')*'|"((?:[^"]|"")*)"|\[([^\]]*)\]|`((?:[^`]|``)*)`|\s+|[^'"\[`\s]+|.""", re.S)
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnusableDatabase(CasedbError):
    """A file casedb will not read or write: not SQLite, not casedb's, or holding foreign code."""


def normalized(sql: str | None) -> str | None:
    """SQL text compared token by token: string literals exact, a quoted plain identifier
    (``"name"``, ``[name]``) as the bare name, any run of whitespace as one space."""
    if sql is None:
        return None
    return _normalized(sql) if len(sql) <= 1 << 16 else _normalize(sql)


@lru_cache(maxsize=4096)  # every connection reads the same texts (casedb's are a few KB each)
def _normalized(sql: str) -> str:
    return _normalize(sql)


def _normalize(sql: str) -> str:
    out = []
    for m in _TOKEN.finditer(sql):
        tok = m.group()
        ident = next((g for g in m.groups() if g is not None), None)
        if ident is not None:
            out.append(ident if _PLAIN.fullmatch(ident) else tok)
        elif tok.isspace():
            out.append(" ")
        else:
            out.append(tok)
    return "".join(out).strip()


@lru_cache(maxsize=None)
def reference(applied: tuple[str, ...]) -> dict[str, tuple[str, str, str | None]]:
    """name -> (type, table, normalized SQL) of what casedb's migrations ``applied`` create in an
    empty database (an in-memory one, built once per process and level)."""
    import sqlite_utils

    from casedb.store.migrations import migrations

    db = sqlite_utils.Database(memory=True)
    names = known_migrations()
    if applied:
        stop = names[len(applied)] if len(applied) < len(names) else None
        migrations.apply(db, stop_before=stop)
    else:  # the bookkeeping table alone (made before the first migration runs)
        migrations.ensure_migrations_table(db)
    out = {name: (kind, table, normalized(sql)) for kind, name, table, sql in
           db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")}
    db.close()
    return out


@lru_cache(maxsize=None)
def known_migrations() -> tuple[str, ...]:
    """casedb's migrations, in the order they are applied."""
    import sqlite_utils

    from casedb.store.migrations import migrations

    return tuple(m.name for m in migrations.pending(sqlite_utils.Database(memory=True)))


def check(conn: sqlite3.Connection, where: str) -> tuple[str, ...]:
    """Refuse (UnusableDatabase, naming each object) a database whose schema is not casedb's;
    returns the migrations it has applied (empty for a new, empty file)."""
    try:
        objects = conn.execute("SELECT type, name, tbl_name, sql FROM main.sqlite_master LIMIT ?",
                               [MAX_OBJECTS + 1]).fetchall()
    except sqlite3.DatabaseError as e:
        raise UnusableDatabase(f"{where} is not an SQLite database casedb can read ({e})") from None
    if len(objects) > MAX_OBJECTS:
        raise UnusableDatabase(f"{where} has more than {MAX_OBJECTS} schema objects: not a casedb database")
    if not objects:
        return ()
    actual = {name: (kind, table, normalized(sql)) for kind, name, table, sql in objects}
    if MIGRATIONS_TABLE not in actual:
        tables = sorted(n for n, (k, _, _) in actual.items() if k == "table")[:5]
        raise UnusableDatabase(f"{where} is an SQLite database but not casedb's (it has {', '.join(tables) or 'no tables'}"
                               " and no casedb schema); give casedb a new file or one casedb made")
    applied = _applied(conn, where, actual[MIGRATIONS_TABLE])
    problems = _compare(actual, reference(applied), {n.lower() for n in reference(known_migrations())},
                        views_recreated=_views_recreated(applied))
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise UnusableDatabase(
            f"{where}: its schema is not casedb's: {shown}. casedb never uses a database with triggers, views or "
            "indexes it did not create, or with its own objects defined otherwise (the file may come from "
            "elsewhere: they would run inside casedb); ask for the file again from a casedb that made it, or "
            "remove those objects yourself if you trust it")
    return applied


def _applied(conn, where: str, table_def) -> tuple[str, ...]:
    """The casedb migrations the file records, checked to be a prefix of casedb's own."""
    want = reference(())[MIGRATIONS_TABLE]
    if table_def != want:
        raise UnusableDatabase(f"{where}: its {MIGRATIONS_TABLE} is not the table casedb makes ({table_def[0]} "
                               f"{table_def[2]!r}); not a casedb database")
    known = known_migrations()
    rows = conn.execute(f"SELECT name FROM main.{MIGRATIONS_TABLE} WHERE migration_set = 'casedb' "
                        "ORDER BY rowid LIMIT ?", [len(known) + 1]).fetchall()
    applied = tuple(str(r[0]) for r in rows)
    if applied != known[:len(applied)]:
        unknown = [n for n in applied if n not in known]
        why = (f"migrations this casedb does not know ({', '.join(unknown[:3])}): a newer casedb made it"
               if unknown else "its migrations out of casedb's order")
        raise UnusableDatabase(f"{where} records {why}; open it with the casedb that made it")
    return applied


def _views_recreated(applied: tuple[str, ...]) -> bool:
    """A pending migration drops and recreates every casedb view before any is read: the file's
    views may be an older casedb's text."""
    from casedb.store.migrations import VIEW_MIGRATIONS

    return any(n in VIEW_MIGRATIONS for n in known_migrations()[len(applied):])


def _compare(actual: dict, expected: dict, casedb_names: set, *, views_recreated: bool) -> list[str]:
    """What differs between the file's objects and casedb's at its level (``casedb_names``: every
    name casedb makes at any level, lower case: SQLite's names are case-insensitive)."""
    problems = []
    for name, (kind, table, sql) in actual.items():
        want = expected.get(name)
        if want is None:
            if not _own_table(name, kind, table, sql, actual, casedb_names):
                problems.append(f"{kind} {name!r} on {table!r} is not casedb's" if kind in ("trigger", "index")
                                else f"{kind} {name!r} is not casedb's")
        elif want[0] != kind or want[1] != table:
            problems.append(f"{name!r} is a {kind} on {table!r}, casedb's is a {want[0]} on {want[1]!r}")
        elif want[2] != sql and not (kind == "view" and views_recreated):
            problems.append(f"{kind} {name!r} is not defined as casedb defines it")
    for name, (kind, _, _) in expected.items():
        # an older casedb had fewer views: a pending migration makes them
        if name not in actual and not (kind == "view" and views_recreated):
            problems.append(f"casedb's {kind} {name!r} is missing")
    return problems


def _own_table(name: str, kind: str, table: str, sql: str | None, actual: dict, casedb_names: set) -> bool:
    """A plain table of the user's own (casedb never reads it), its indexes, or SQLite's own."""
    if name in SQLITE_OWN:
        return kind == "table"
    if name.lower() in casedb_names or name.lower().startswith("sqlite_") and kind != "index":
        return False
    if kind == "table":
        return (sql or "").upper().startswith("CREATE TABLE")
    if kind == "index":
        owner = actual.get(table)
        return table.lower() not in casedb_names and owner is not None and owner[0] == "table" \
            and _own_table(table, "table", table, owner[2], actual, casedb_names)
    return False
