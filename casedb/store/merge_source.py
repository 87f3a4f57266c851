"""A database ``casedb merge`` folds in: opened read-only, read in one snapshot from the first
check to the last row copied, and verified whole before anything is written to the target.

The file may come from anywhere, so nothing in it is taken on its word:

* its schema must be casedb's (:mod:`casedb.store.schema_check`): none of its views or triggers runs;
* every case's signature is computed again from its stored content, as an import computes it
  (:func:`casedb.cases.signature.signature`), and its dtype, marks and shape summary are derived again
  rather than copied (its op meets the op allow-list when it runs, as any database's cases do);
* every blob's sha256 is computed from its bytes (read in chunks) and must be its key;
* every reference must point at a row (``PRAGMA foreign_key_check``), every JSON column must hold
  what casedb writes there, every timestamp must be ISO 8601 with a zone, a combined run's
  ``merged_from`` must be a list of runs;
* what is read is bounded: a text value at most MAX_TEXT_BYTES, a blob at most MAX_BLOB_BYTES;
* an occurrence's ``count`` (and a run's planned counts) is at most ``bounds.MAX_COUNT``, as an
  import allows: sums of counts must not overflow SQLite's integers in the views.

Any of these refuses the whole merge (:class:`UnusableDatabase`, exit 2; the target is not
touched), naming the rows: a file holding a forged row is not a shard to take part of.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Iterator

from casedb.cases import dtypes
from casedb.cases.bounds import MAX_COUNT
from casedb.store import schema_check
from casedb.cases import marks as marks_mod
from casedb.store.schema_check import UnusableDatabase
from casedb.serial import dumps, dumps_values

MAX_TEXT_BYTES = 16 << 20
MAX_BLOB_BYTES = 1_000_000_000  # SQLite's own limit on one value
CHUNK = 1 << 20
SHOWN = 5
# The oldest schema a merge reads: judgements (m002) and run uids (m003).
MIN_MIGRATIONS = 3

_JSON_OBJECT = "(CASE WHEN json_valid({0}) THEN json_type({0}) END) = 'object'"
_JSON_ARRAY = "(CASE WHEN json_valid({0}) THEN json_type({0}) END) = 'array'"
# finite: an infinite tolerance passes every result (SQLite holds no NaN: it reads back NULL)
_TOL = "({0} IS NULL OR (typeof({0}) IN ('integer', 'real') AND {0} >= 0 AND {0} <= 1.7976931348623157e308))"
# (table, condition every row must meet, what it means)
ROW_RULES = (
    ("models", f"typeof(name) = 'text' AND name != '' AND (defaults IS NULL OR {_JSON_OBJECT.format('defaults')})",
     "a name, and defaults as a JSON object"),
    ("model_cases", "typeof(model) = 'text' AND typeof(signature) = 'text' AND typeof(name) = 'text' AND name != ''"
                    f" AND (marks IS NULL OR {_JSON_ARRAY.format('marks')})"
                    " AND (skip_if IS NULL OR json_valid(skip_if)) AND (xfail IS NULL OR json_valid(xfail))"
                    " AND (expects_error IS NULL OR json_valid(expects_error))"
                    f" AND {_TOL.format('rtol')} AND {_TOL.format('atol')}"
                    f" AND (count IS NULL OR (typeof(count) = 'integer' AND count BETWEEN 1 AND {MAX_COUNT}))"
                    " AND typeof(position) IN ('integer', 'null')",
     f"a model, signature and name, marks as a JSON list, JSON conditions, tolerances >= 0, count 1 to {MAX_COUNT:,}"),
    ("runs", f"(selection IS NULL OR {_JSON_OBJECT.format('selection')}) AND (args IS NULL OR json_valid(args))"
             " AND typeof(uid) IN ('text', 'null')",
     "its selection as a JSON object, args as JSON"),
    ("results", "typeof(signature) = 'text' AND typeof(run_id) = 'integer'"
                " AND (metrics IS NULL OR json_valid(metrics))", "a run, a signature, metrics as JSON"),
    ("judgements", "typeof(signature) = 'text' AND typeof(run_id) = 'integer' AND typeof(model) = 'text'",
     "a run, a model and a signature"),
)


class Source:
    """One source database, open read-only in a snapshot, verified (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.where = str(path)
        try:
            self.conn = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None)
        except sqlite3.Error as e:
            raise UnusableDatabase(f"{self.where}: cannot open it as an SQLite database ({e})") from None
        try:
            self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_TEXT_BYTES)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("BEGIN")  # one snapshot, held until close()
            self.applied = schema_check.check(self.conn, self.where)
            if len(self.applied) < MIN_MIGRATIONS:
                raise UnusableDatabase(f"{self.where} is {'empty' if not self.applied else 'from a casedb too old to merge'}"
                                       ": not a casedb database with runs to merge")
            self.verify()
        except sqlite3.Error as e:
            self.close()
            hint = (f"; a casedb database keeps every text value under {MAX_TEXT_BYTES >> 20} MiB"
                    if "too big" in str(e) else "")
            raise UnusableDatabase(f"{self.where}: cannot read it ({e}){hint}") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.conn.close()

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self.conn.execute(f"PRAGMA main.table_info({table})")]

    def refuse(self, problems: list[str], what: str, total: int | None = None) -> None:
        """UnusableDatabase naming the first problems (of ``total``, when more were counted than kept;
        None: the query stopped at one past SHOWN)."""
        if problems:
            more = (("; and more" if len(problems) > SHOWN else "") if total is None
                    else (f"; and {total - SHOWN} more" if total > SHOWN else ""))
            raise UnusableDatabase(f"{self.where}: {what}: {'; '.join(problems[:SHOWN])}{more}. Nothing was merged: "
                                   "the file was altered or not written by casedb; get it again from where it was made")

    # ------------------------------------------------------------------------------ verifying

    def verify(self) -> None:
        for table, rule, what in ROW_RULES:
            bad = self.conn.execute(f"SELECT rowid FROM {table} WHERE ({rule}) IS NOT 1 LIMIT ?",  # NULL: not met
                                    [SHOWN + 1]).fetchall()
            self.refuse([f"{table} row {r[0]}" for r in bad], f"rows that are not what casedb writes ({what})")
        orphans = self.conn.execute("PRAGMA foreign_key_check").fetchmany(SHOWN + 1)
        self.refuse([f"{t} row {rowid} names a {parent} row that does not exist" for t, rowid, parent, _ in orphans],
                    "rows that refer to nothing")
        self.refuse([p for run in self.conn.execute("SELECT id, uid, started_at, finished_at, selection FROM runs")
                     for p in run_problems(*run)], "runs that are not what casedb records")
        self.refuse([p for name, defaults in self.conn.execute("SELECT name, defaults FROM models")
                     for p in defaults_problems(name, defaults)], "models whose defaults casedb would not import")
        self.refuse([p for model, name, marks in self.conn.execute("SELECT model, name, marks FROM model_cases")
                     for p in marks_problems(model, name, marks)][:SHOWN + 1],
                    "occurrences with marks casedb would not import")
        problems, bad, referenced = [], 0, set()
        for row in self.conn.execute("SELECT signature, op, inputs, attrs, seed, dtype FROM cases"):
            try:
                referenced |= verified_case(*row)["blobs"]
            except ValueError as e:
                bad += 1
                problems += [f"case {row[0]!r}: {e}"][:SHOWN - len(problems)]  # kept: the first few
        self.refuse(problems, "cases whose stored content is not what their signature says", bad)
        problems, bad, held = [], 0, set()
        for rowid, sha, size in self.blob_rows():
            held.add(sha)
            problem = blob_problem(self.conn, rowid, sha, size)
            if problem:
                bad += 1
                problems += [f"blob {sha!r}: {problem}"][:SHOWN - len(problems)]
        self.refuse(problems, "blobs whose bytes are not what their key says", bad)
        self.refuse([f"blob {sha}" for sha in sorted(referenced - held)], "cases whose blobs are missing")

    def blob_rows(self) -> Iterator[tuple[int, str, int]]:
        return self.conn.execute("SELECT rowid, sha256, length(data) FROM blobs")

    def cases(self) -> Iterator[dict]:
        """The source's cases as the target stores them (verified; derived columns derived again)."""
        for row in self.conn.execute("SELECT signature, op, inputs, attrs, seed, dtype, created_at FROM cases"):
            case = verified_case(*row[:6])
            del case["blobs"]
            yield {**case, "created_at": row[6]}


def verified_case(signature, op, inputs, attrs, seed, dtype) -> dict:
    """A stored case's row as casedb would store it, or ValueError saying what does not hold."""
    from casedb import names
    from casedb.cases import call_identity, signature as sig_mod
    from casedb.cases import spec as casespec
    from casedb.cases.layout import case_layout
    from casedb.store.database import shape_summary

    try:
        if not isinstance(op, str) or names.normalize_op(op) != op:
            raise ValueError(f"op {op!r} is not an op as casedb stores it")
        inputs, attrs = json.loads(inputs), json.loads(attrs)
        if not isinstance(inputs, list) or not isinstance(attrs, dict):
            raise ValueError("inputs must be a JSON list and attrs a JSON object")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed {seed!r} is not an integer")
        if sig_mod.signature(op, inputs, attrs, seed) != signature:
            raise ValueError("its signature is not the sha256 of its op, inputs, attrs and seed")
        blobs = _check_inputs(inputs, attrs)
        computes = casespec.computed_dtype(inputs, attrs, dtypes.canonical(dtype))
        return {"signature": signature, "op": op, "inputs": dumps_values(inputs), "attrs": dumps_values(attrs),
                "seed": seed,
                "dtype": computes, "marks": dumps(marks_mod.derive(inputs, attrs)),
                "shapes": shape_summary(inputs, attrs), "layout": case_layout(inputs, attrs),
                "identity": call_identity.identity(op, inputs, attrs, seed), "blobs": blobs}
    except ValueError:
        raise
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (TypeError, KeyError, AttributeError, IndexError, dtypes.UnknownDtype) as e:
        raise ValueError(f"malformed inputs or attrs ({type(e).__name__}: {e})") from None


def _check_inputs(inputs: list, attrs: dict) -> set:
    """The blob keys the inputs name; ValueError when an input is not a stored casedb input."""
    from casedb.cases.input_specs import INPUT_KINDS

    specs = list(inputs) + [v for v in attrs.values() if isinstance(v, dict) and len(v) == 1
                            and next(iter(v)) in INPUT_KINDS]
    for spec in specs:
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in INPUT_KINDS:
            raise ValueError(f"an input is not one of {', '.join(INPUT_KINDS)}: {str(spec)[:80]}")
    blobs = set()
    for t in marks_mod.iter_tensors(inputs, attrs):
        shape = t["shape"]
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                  for n in shape):
            raise ValueError(f"a tensor shape is not a list of sizes: {str(shape)[:80]}")
        if dtypes.canonical(t["dtype"]) != t["dtype"]:
            raise ValueError(f"tensor dtype {t['dtype']!r} is not a dtype as casedb stores it")
        if "blob" in t:
            if not isinstance(t["blob"], str) or len(t["blob"]) != 64:
                raise ValueError(f"blob key {str(t['blob'])[:80]!r} is not a sha256")
            blobs.add(t["blob"])
    return blobs


def blob_problem(conn: sqlite3.Connection, rowid: int, sha, size: int | None) -> str | None:
    """What is wrong with one stored blob (its bytes read in chunks), or None."""
    if not isinstance(sha, str) or len(sha) != 64:
        return "its key is not a sha256"
    if size is None:
        return "it holds no bytes"
    if size > MAX_BLOB_BYTES:
        return f"{size:,} bytes, over the {MAX_BLOB_BYTES:,}-byte limit on one input"
    if copy_blob(conn, rowid, size, None) != sha:
        return "the sha256 of its bytes is another"
    return None


def copy_blob(conn: sqlite3.Connection, rowid: int, size: int, target) -> str:
    """The sha256 of blob ``rowid``'s bytes, read in chunks, written on to ``target`` (an open
    writable blob) when given."""
    digest = hashlib.sha256()
    with conn.blobopen("blobs", "data", rowid, readonly=True) as blob:
        for _ in range(0, size, CHUNK):
            chunk = blob.read(CHUNK)
            digest.update(chunk)
            if target is not None:
                target.write(chunk)
    return digest.hexdigest()


def run_problems(run_id, uid, started_at, finished_at, selection) -> list[str]:
    """What is wrong with a runs row's times and the parts of its selection casedb reads."""
    out = [f"run {run_id}: {what} {str(stamp)[:40]!r} is not an ISO 8601 time with a zone"
           for what, stamp in (("started_at", started_at), ("finished_at", finished_at))
           if stamp is not None and not is_timestamp(stamp)]
    try:
        sel = json.loads(selection) if selection else {}
    except RecursionError:
        return out + [f"run {run_id}: its selection is nested too deeply"]
    parts, options, planned = sel.get("merged_from"), sel.get("options") or {}, sel.get("planned") or {}
    if parts is not None and not (isinstance(parts, list) and all(
            isinstance(p, dict) and isinstance(p.get("uid"), str) for p in parts)):
        out.append(f"run {run_id}: merged_from is not a list of runs, each with its uid")
    if not isinstance(options, dict) or not isinstance(options.get("triage") or [], list):
        out.append(f"run {run_id}: its options are not a JSON object (with triage a list of files)")
    if not isinstance(planned, dict) or not all(isinstance(v, int) and 0 <= v <= MAX_COUNT for v in planned.values()):
        out.append(f"run {run_id}: planned is not a JSON object of counts (0 to {MAX_COUNT:,})")
    return out


def marks_problems(model: str, name: str, marks: str | None) -> list[str]:
    """What is wrong with an occurrence's own marks: one named like pytest's markers (skip, xfail...)
    or a model mark would hide its failures in the pytest front end."""
    from casedb.cases.expectations import marks_of

    try:
        marks_of(json.loads(marks) if marks else None)
    except (ValueError, RecursionError) as e:
        return [f"{model}::{name}: {e}"]
    return []


def defaults_problems(name: str, defaults: str | None) -> list[str]:
    from casedb.cases.spec import normalize_defaults
    from casedb.errors import InputError

    try:
        normalize_defaults(json.loads(defaults) if defaults else None, None)
    except (InputError, RecursionError) as e:
        return [f"model {name!r}: {e}"]
    return []


def is_timestamp(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return _dt.datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False
