"""The case store: one SQLite file, opened through sqlite-utils, schema from migrations.

Tables: ``models``, ``cases`` (one row per signature), ``model_cases`` (a case's occurrence in
a model, with that model's judgement), ``blobs`` (tensor values by sha256), ``runs`` and
``results`` (execution history). :meth:`Store.save` is the one save every importer goes through.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import sqlite_utils

from casedb.cases import call_identity, marks as marks_mod
from casedb.cases.layout import case_layout, inputs_summary
from casedb.store import schema_check
from casedb.cases.spec import Normalized
from casedb.errors import CasedbError, NotFound
from casedb.names import model_key, model_mark
from casedb.store.migrations import migrations
from casedb.serial import dumps, dumps_values, loads, now

DEFAULT_DB = Path("data") / "casedb.sqlite"
SHIPPED_MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def db_path(path: str | os.PathLike | None = None) -> Path:
    """The database a command uses: ``path``, else env ``CASEDB_DB``, else data/casedb.sqlite."""
    return Path(path or os.environ.get("CASEDB_DB") or DEFAULT_DB)


# How long a write waits for another process's write (runs, imports and shards write concurrently).
BUSY_TIMEOUT_S = 60.0


class DatabaseLocked(CasedbError, sqlite3.OperationalError):
    """Another process held the database's write lock for longer than BUSY_TIMEOUT_S."""


class _Connection(sqlite3.Connection):
    """A connection whose "database is locked" (the busy timeout ran out) is a DatabaseLocked
    naming the file and what to do, not a traceback."""

    db_file = ""

    def _locked(self, e: sqlite3.OperationalError) -> Exception:
        if "locked" not in str(e):
            return e
        return DatabaseLocked(f"{self.db_file}: the database is locked: another process (a casedb run, import or "
                              "merge, or a program holding it open) kept writing it for the "
                              f"{BUSY_TIMEOUT_S:g} s casedb waits; let it finish (or stop it) and try again")

    def execute(self, *args):
        try:
            return super().execute(*args)
        except sqlite3.OperationalError as e:
            raise self._locked(e) from None

    def executemany(self, *args):
        try:
            return super().executemany(*args)
        except sqlite3.OperationalError as e:
            raise self._locked(e) from None

    def executescript(self, *args):
        try:
            return super().executescript(*args)
        except sqlite3.OperationalError as e:
            raise self._locked(e) from None

    def commit(self):
        try:
            return super().commit()
        except sqlite3.OperationalError as e:
            raise self._locked(e) from None


def check_db_file(path: str | os.PathLike) -> None:
    """CasedbError when ``path`` exists and is not a regular file (a folder, a FIFO, /dev/null)."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise CasedbError(f"database {path}: cannot read it ({e.strerror}); give a readable file") from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        raise CasedbError(f"database {path} is {kind}, not a database file; give --db (or CASEDB_DB) a file "
                          "path (a new one is created)")


def connect(path: str | os.PathLike) -> sqlite3.Connection:
    """A connection to a casedb file that runs, imports and history write through: its schema checked to be
    casedb's (:mod:`casedb.store.schema_check`), explicit transactions, foreign
    keys, a long busy timeout (runs, imports and shards write concurrently; DatabaseLocked past
    it) and NORMAL sync in WAL mode (a commit survives SIGKILL of the process, not a power cut;
    an fsync per recorded case would dominate small cases)."""
    check_db_file(path)
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, factory=_Connection)
    except sqlite3.Error as e:
        raise CasedbError(f"database {path}: cannot open it ({e}); give --db a file in a folder you can "
                          "write") from None
    conn.db_file = str(path)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # before anything reads or writes it: the file may come from elsewhere, and its
        # triggers and views would run inside casedb
        schema_check.check(conn, str(path))
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


def shape_summary(inputs: list, attrs: dict) -> str:
    """`bf16[1, 11, 2880], bf16[2880] transposed` (casedb.cases.layout.inputs_summary): short,
    readable, used in listings."""
    return inputs_summary(inputs, attrs)


@dataclass
class Occurrence:
    """A normalized case as it occurs in one model (what `save` stores)."""

    model: str
    case: Normalized
    name: str
    source: str | None
    count: int = 1
    position: int = 0


@dataclass
class ModelInfo:
    name: str
    family: str | None = None
    variant_of: str | None = None
    source: str | None = None
    description: str | None = None
    defaults: dict = field(default_factory=dict)


class Store:
    """An open casedb database."""

    def __init__(self, path: str | os.PathLike = DEFAULT_DB, *, wal: bool = True):
        """``wal``: switch the file to WAL mode (what concurrent runs need); a reader that must
        leave the file as it is (``casedb serve``) passes False."""
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite_utils.Database(connect(self.path))
        self._conn: sqlite3.Connection | None = None
        if wal and self.db.journal_mode != "wal":
            self.db.enable_wal()
        if migrations.pending(self.db):
            migrations.apply(self.db)

    @property
    def conn(self) -> sqlite3.Connection:
        """The file's connection with rows as sqlite3.Row (by column name), for the run history's
        functions (:mod:`casedb.store.run_rows` and its neighbours) and the named reads; opened on
        first use, after the schema is migrated, and closed with the store."""
        if self._conn is None:
            self._conn = connect(self.path)
            self._conn.row_factory = sqlite3.Row
        return self._conn

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------------ writing

    def save(self, models: Iterable[ModelInfo], occurrences: Iterable[Occurrence], *,
             replace_models: Iterable[str] = ()) -> dict:
        """Store models and occurrences in one transaction; returns counts.

        An occurrence is keyed by (model, name): saving it again updates that row, so its id, and
        the history that points at it, stay. ``replace_models``: each of those models keeps only
        the occurrences saved now; the others are deleted if no run ever judged them, else
        *retired* (``retired_at`` set): kept for the results and judgements that name them,
        hidden from listings and plans. Saving a retired occurrence again brings it back.
        """
        models = list(models)
        occurrences = list(occurrences)
        stamp = now()
        with self.db.atomic():
            stored_name = self._save_models(models, stamp)
            new_cases = self.save_cases([o.case for o in occurrences], stamp)
            rows = [_occurrence_row(o, stored_name.get(model_key(o.model), o.model)) for o in occurrences]
            # (model, name) is the natural key; keep the row id stable across re-imports.
            self._insert_rows(
                """INSERT INTO model_cases (model, signature, name, description, source, position, count,
                       marks, dtype, rtol, atol, skip_if, expects_error, xfail) VALUES """,
                rows,
                """ ON CONFLICT (model, name) DO UPDATE SET signature=excluded.signature,
                       description=excluded.description, source=excluded.source,
                       position=excluded.position, count=excluded.count, marks=excluded.marks,
                       dtype=excluded.dtype, rtol=excluded.rtol, atol=excluded.atol,
                       skip_if=excluded.skip_if, expects_error=excluded.expects_error,
                       xfail=excluded.xfail, retired_at=NULL""",
            )
            retired = removed = 0
            for name in replace_models:
                model = stored_name.get(model_key(name)) or name
                keep = {r[2] for r in rows if r[0] == model}
                r, d = self._retire_others(model, keep, stamp)
                retired += r
                removed += d
        return {"new_cases": new_cases, "occurrences": len(occurrences), "retired": retired, "removed": removed}

    def _save_models(self, models: list[ModelInfo], stamp: str) -> dict[str, str]:
        """Insert or update each model's row; returns model key -> the name the models table has
        (gpt-oss in a manifest is the gpt_oss row already stored). A field the import leaves
        empty keeps its stored value."""
        stored_name: dict[str, str] = {}
        for m in models:
            existing = self.model(m.name, missing_ok=True)
            row = {"name": existing["name"] if existing else m.name, "key": model_key(m.name),
                   "family": m.family, "variant_of": m.variant_of, "source": m.source,
                   "description": m.description, "defaults": dumps(m.defaults or {}),
                   "updated_at": stamp}
            if existing:
                for k in ("family", "variant_of", "description"):
                    if row[k] is None:
                        row[k] = existing[k]
                if not m.defaults and existing["defaults"]:
                    row["defaults"] = existing["defaults"]
                self.db["models"].update(existing["name"], row)
            else:
                row["created_at"] = stamp
                self.db["models"].insert(row)
            stored_name[model_key(m.name)] = row["name"]
        return stored_name

    def _retire_others(self, model: str, keep: set, stamp: str) -> tuple[int, int]:
        """Retire `model`'s current occurrences not named in `keep`; delete those of them that no
        result or judgement refers to, unless a run is in progress (it may judge any of them
        next). Returns (retired, deleted)."""
        gone = [i for i, name in self.db.execute(
            "SELECT id, name FROM model_cases WHERE model = ? AND retired_at IS NULL", [model]) if name not in keep]
        for i in range(0, len(gone), 900):
            chunk = gone[i:i + 900]
            self.db.execute(f"UPDATE model_cases SET retired_at = ? WHERE id IN ({','.join('?' * len(chunk))})",
                            [stamp, *chunk])
        if not gone or self.db.execute("SELECT 1 FROM runs WHERE status = 'running' LIMIT 1").fetchone():
            return len(gone), 0
        # One pass over each history table (no index on results.model_case_id).
        deleted = self.db.execute(
            """DELETE FROM model_cases WHERE model = ? AND retired_at = ?
                 AND id NOT IN (SELECT model_case_id FROM judgements WHERE model_case_id IS NOT NULL)
                 AND id NOT IN (SELECT model_case_id FROM results WHERE model_case_id IS NOT NULL)""",
            [model, stamp]).rowcount
        return len(gone) - deleted, deleted

    def save_cases(self, cases: Iterable[Normalized], stamp: str | None = None) -> int:
        """Insert cases (and their blobs) not stored yet; returns how many were new."""
        stamp = stamp or now()
        seen = set()
        rows, blobs = [], {}
        for c in cases:
            if c.signature in seen:
                continue
            seen.add(c.signature)
            blobs.update(c.blobs)
            rows.append((c.signature, c.op, dumps_values(c.inputs), dumps_values(c.attrs), c.dtype, c.seed,
                         dumps(c.derived_marks), shape_summary(c.inputs, c.attrs), case_layout(c.inputs, c.attrs),
                         call_identity.of(c), stamp))
        self._insert_rows("INSERT OR IGNORE INTO blobs (sha256, data, size) VALUES ",
                          [(k, v, len(v)) for k, v in blobs.items()])
        return self._insert_rows("INSERT OR IGNORE INTO cases (signature, op, inputs, attrs, dtype, seed, marks, "
                                 "shapes, layout, identity, created_at) VALUES ", rows)

    def _insert_rows(self, head: str, rows: list[tuple], tail: str = "") -> int:
        """``head (?, ...), (?, ...) tail``: the rows inserted a few hundred to a statement;
        returns the rows changed.

        Not an executemany: model_cases' full-text index (its trigger) writes out what it has
        gathered at the end of each statement, one segment per row there (~4x the time)."""
        if not rows:
            return 0
        width = len(rows[0])
        conn = self.db.conn
        # SQLite's limit on parameters (Python < 3.11 cannot ask: its smallest default, 999)
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) if hasattr(conn, "getlimit") else 999
        per = max(1, min(500, limit // width))
        one = "(" + ", ".join("?" * width) + ")"
        changed = 0
        for i in range(0, len(rows), per):
            chunk = rows[i:i + per]
            changed += conn.execute(head + ", ".join([one] * len(chunk)) + tail,
                                    [v for row in chunk for v in row]).rowcount
        return changed

    def existing_signatures(self, signatures: Iterable[str]) -> set[str]:
        sigs = list(set(signatures))
        found = set()
        for i in range(0, len(sigs), 900):
            chunk = sigs[i:i + 900]
            q = f"SELECT signature FROM cases WHERE signature IN ({','.join('?' * len(chunk))})"
            found.update(r[0] for r in self.db.execute(q, chunk).fetchall())
        return found

    # ------------------------------------------------------------------------------ reading

    def model(self, name: str, *, missing_ok: bool = False) -> dict | None:
        rows = list(self.db.query("SELECT * FROM models WHERE key = ?", [model_key(name)]))
        if rows:
            return rows[0]
        if missing_ok:
            return None
        known = [r["name"] for r in self.db.query("SELECT name FROM models ORDER BY name")]
        raise NotFound(f"no model {name!r} in {self.path}; known models: {', '.join(known) or '(none: run casedb import)'}")

    def models_defaults(self, name: str) -> dict:
        return loads(self.model(name)["defaults"]) or {}

    def models(self) -> list[dict]:
        q = """SELECT m.name, m.family, m.variant_of, m.source, m.description, m.defaults,
                      count(mc.id) AS cases, count(DISTINCT mc.signature) AS unique_cases,
                      coalesce(sum(mc.count), 0) AS calls, count(DISTINCT c.op) AS ops
               FROM models m LEFT JOIN model_cases mc ON mc.model = m.name AND mc.retired_at IS NULL
               LEFT JOIN cases c ON c.signature = mc.signature
               GROUP BY m.name ORDER BY m.name"""
        out = []
        for r in self.db.query(q):
            r["defaults"] = loads(r["defaults"]) or {}
            out.append(r)
        return out

    def occurrences(self, models: list[str] | None = None, *, op: str | list[str] | None = None,
                    keyword: str | None = None, markexpr: str | None = None,
                    show_excluded: bool = False) -> list[dict]:
        """Case occurrences with their case, filtered like pytest's -k/-m; ordered by model, position."""
        where, params = [], []
        if models:
            names = [self.model(m)["name"] for m in models]
            where.append(f"o.model IN ({','.join('?' * len(names))})")
            params += names
        ops = [op] if isinstance(op, str) else op or []
        if ops:  # any of them, each exact or a substring
            where.append("(" + " OR ".join("(o.op = ? OR o.op LIKE ?)" for _ in ops) + ")")
            for o in ops:
                params += [o, f"%{o}%"]
        expr = marks_mod.MarkExpression(markexpr if markexpr is not None else
                                        (marks_mod.DEFAULT_EXCLUDE if show_excluded else ""))
        kw = marks_mod.KeywordExpression(keyword or "")
        out = []
        for row in self._occ_where(" AND ".join(where) or "1", params):
            if not kw.matches((row["name"], row["op"], row["model"])):
                continue
            if expr.matches(row["marks"]) == show_excluded:
                continue
            out.append(row)
        return out

    def mark_names(self) -> set[str]:
        """Every mark a current case carries (derived or declared) and every model's ``model_<name>``."""
        q = """SELECT DISTINCT j.value AS mark FROM occurrences o, json_each(o.marks) j
               WHERE o.retired_at IS NULL"""
        names = {str(r["mark"]) for r in self.db.query(q)}
        return names | {model_mark(r["name"]) for r in self.db.query("SELECT name FROM models")}

    def find(self, name_or_signature: str) -> list[dict]:
        """Occurrences whose case name or signature (prefix, ≥ 4 hex digits) matches; retired
        occurrences (``import --replace``) only when nothing current does, so a command from an
        old report still finds its case."""
        text = name_or_signature.strip()
        rows = []
        for retired in (False, True):
            if len(text) >= 4 and all(ch in "0123456789abcdef" for ch in text.lower()):
                rows = self._occ_where("o.signature LIKE ?", [text.lower() + "%"], retired=retired)
            if not rows:
                rows = self._occ_where("o.name = ?", [text], retired=retired)
            if not rows and "::" in text:
                model, _, name = text.partition("::")
                m = self.model(model, missing_ok=True)
                if m:
                    rows = self._occ_where("o.model = ? AND o.name = ?", [m["name"], name], retired=retired)
            if rows:
                break
        if not rows:
            raise NotFound(f"no case named {text!r} and no signature starting with it; try: casedb cases -k {text}")
        return rows

    def _occ_where(self, cond: str, params: list, *, retired: bool = False) -> list[dict]:
        """Occurrences (the ``occurrences`` view, as ``o``) matching `cond`: current ones, or with
        `retired` the retired ones only."""
        state = "o.retired_at IS NOT NULL" if retired else "o.retired_at IS NULL"
        q = f"""SELECT id, model, name, op, signature, shapes, dtype, seed, inputs, attrs, derived_marks, own_marks,
                       marks, description, source, count, rtol, atol, declared_dtype, skip_if, expects_error, xfail,
                       position
                FROM occurrences o WHERE ({cond}) AND {state}
                ORDER BY o.model, o.position, o.id"""
        return [decode_occurrence(r) for r in self.db.query(q, params)]

    def case(self, signature: str) -> dict:
        rows = list(self.db.query("SELECT * FROM cases WHERE signature = ?", [signature]))
        if not rows:
            raise NotFound(f"no case with signature {signature}")
        r = rows[0]
        for k in ("inputs", "attrs", "marks"):
            r[k] = loads(r[k])
        return r

    def load_blob(self, sha: str) -> bytes:
        row = self.db.execute("SELECT data FROM blobs WHERE sha256 = ?", [sha]).fetchone()
        if row is None:
            raise NotFound(f"blob {sha} is missing from {self.path}")
        return row[0]

    def stats(self) -> dict:
        one = lambda q: self.db.execute(q).fetchone()[0]  # noqa: E731
        cases = one("SELECT count(*) FROM cases")
        occurrences = one("SELECT count(*) FROM model_cases WHERE retired_at IS NULL")
        return {
            "models": one("SELECT count(*) FROM models"),
            "cases": cases,
            "occurrences": occurrences,
            "duplicates": occurrences - cases if occurrences else 0,
            "cross_model_cases": one(
                "SELECT count(*) FROM (SELECT signature FROM model_cases WHERE retired_at IS NULL"
                " GROUP BY signature HAVING count(DISTINCT model) > 1)"),
            "ops": one("SELECT count(DISTINCT op) FROM cases"),
            "calls": one("SELECT coalesce(sum(count), 0) FROM model_cases WHERE retired_at IS NULL"),
            "blobs": one("SELECT count(*) FROM blobs"),
            "runs": one("SELECT count(*) FROM runs"),
            "results": one("SELECT count(*) FROM results"),
        }


def _occurrence_row(o: Occurrence, model: str) -> tuple:
    """The model_cases row of an occurrence of the stored model named `model`, in the column
    order of :meth:`Store.save`'s INSERT."""
    c = o.case
    return (model, c.signature, o.name, c.description, o.source, o.position, o.count,
            dumps(c.marks) if c.marks else "[]", c.declared_dtype, c.rtol, c.atol, dumps(c.skip_if),
            dumps(c.expects_error), dumps(c.xfail))


def decode_occurrence(r: dict) -> dict:
    for k in ("inputs", "attrs", "derived_marks", "own_marks", "marks", "skip_if", "expects_error", "xfail"):
        r[k] = loads(r[k])
    return r


def open_store(path: str | os.PathLike | None = None, *, wal: bool = True) -> Store:
    """Open the DB at `path` (default: :func:`db_path`): the one way casedb opens a database (a
    :class:`Store`: schema checked, WAL, migrations applied once; ``store.db`` for sqlite-utils,
    ``store.conn`` for rows by name). Front ends open it through
    :func:`casedb.ingest.seed.open_seeded`, which also fills a new default DB."""
    return Store(db_path(path), wal=wal)
