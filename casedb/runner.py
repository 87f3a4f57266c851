"""Runs: select cases, execute them in a pytest session, keep every result as history.

``casedb run`` and ``pytest --model X`` are the same thing: a pytest session with the casedb
plugin (:mod:`casedb.pytest_plugin`), pytest-xdist workers for isolation and parallelism and
pytest-timeout for hangs. This module holds what that session uses:

* the **plan** — the selected cases, one item per signature (dedupe: every model occurrence of
  it is judged from that one execution) or per occurrence (``--no-dedupe``), with stable test ids;
* :func:`execute_item` — runs one item with the execution core (:mod:`casedb.execute`) in a
  worker and judges it once per model occurrence, with that occurrence's tolerances,
  ``expects_error``, ``xfail_if`` and ``skip_if``;
* the **history** — a ``runs`` row, a ``results`` row per executed case and a ``judgements`` row
  per occurrence, written by the controlling process as each report arrives and committed per
  case (a run killed with SIGKILL keeps everything reported so far, and ``--resume`` runs the
  rest exactly once);
* :func:`summarize`, :func:`merge` (shard databases into one) and :func:`run` (``casedb run``:
  ``pytest.main`` over a generated one-line test file, with a Rich progress display).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import importlib.util
import json
import math
import os
import re
import socket
import sqlite3
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from casedb import __version__, dtypes
from casedb import marks as marks_mod
from casedb.errors import CasedbError, NotFound

# Outcomes, worst first: a case's result is the worst verdict among its occurrences.
SEVERITY = ("crashed", "timeout", "error", "failed", "xpassed", "ref_error", "xfailed", "passed", "skipped")
# What makes a run (and `casedb run`'s exit status) fail. ref_error is a bad case, counted apart.
UNEXPECTED = frozenset({"crashed", "timeout", "error", "failed", "xpassed"})
# outcome -> key of the JSON summary
COUNT_KEYS = {"passed": "passed", "failed": "failed", "error": "errors", "ref_error": "ref_errors",
              "crashed": "crashed", "timeout": "timeouts", "skipped": "skipped", "xfailed": "xfailed",
              "xpassed": "xpassed"}
SMOKE_SIZE = 3
TEST_FILE = "test_casedb_run.py"
PAYLOAD_KEY = "casedb"
TAIL = 4000


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _dumps(obj) -> str | None:
    return None if obj is None else json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _loads(text):
    return None if text is None else json.loads(text)


# ======================================================================================== plan

@dataclass
class PlanItem:
    """One test: a case and the model occurrences judged from its execution."""

    id: str
    signature: str
    head: dict                 # op, dtype, seed, shapes (text), attrs: what ids and filters need
    inputs_json: str           # decoded on first use: collection never needs the inputs
    occurrences: list[dict]    # model_case_id, model, name, rtol, atol, skip_if, expects_error, xfail, marks, source
    marks: list[str]           # union of the occurrences' marks (derived + hand-written)
    dedupe: bool = True
    _case: dict | None = field(default=None, repr=False, compare=False)

    @property
    def case(self) -> dict:
        """The normalized case, as the execution core takes it."""
        if self._case is None:
            self._case = {**self.head, "signature": self.signature, "inputs": json.loads(self.inputs_json)}
        return self._case

    @property
    def op(self) -> str:
        return self.head["op"]

    @property
    def key(self) -> tuple:
        """What "already done in this run" is keyed by (resume, exactly-once)."""
        return (self.signature, None if self.dedupe else self.occurrences[0]["model_case_id"])

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(o["model"] for o in self.occurrences))

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(o["name"] for o in self.occurrences))

    @property
    def numel(self) -> int:
        return sum(math.prod(t["shape"]) for t in marks_mod.iter_tensors(self.case["inputs"], self.case["attrs"]))


def model_mark(name: str) -> str:
    """The ``model_<name>`` marker of a model (``granite-4.0-h-micro`` -> ``model_granite_4_0_h_micro``)."""
    return "model_" + re.sub(r"[^0-9a-zA-Z]+", "_", str(name)).strip("_").lower()


def op_label(op: str) -> str:
    for prefix, short in (("torch.ops.", ""), ("torch.nn.functional.", "F.")):
        if op.startswith(prefix):
            return short + op[len(prefix):]
    return op


_TENSOR_TEXT = re.compile(r"\b[a-z0-9_]+\[([0-9, ]*)\]")


def shape_label(shapes: str, attrs: dict, limit: int = 60) -> str:
    """`4x64,4x64` — the inputs, short, from the stored input summary (`fp16[4, 64], fp16[4, 64]`):
    tensors by shape (`scalar` for 0-d), literals as written, then keyword literals (`dim=-1`)."""
    text = _TENSOR_TEXT.sub(lambda m: "x".join(d.strip() for d in m.group(1).split(",")) if m.group(1).strip()
                            else "scalar", shapes or "").replace(" ", "")
    extra = [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(attrs.items())
             if not (isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("tensor", "file", "tensor_list"))]
    text = ",".join(x for x in [text, *extra] if x) or "noargs"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_UNSAFE_ID = re.compile(r"[^0-9A-Za-z_.,:+=()\[\]<>/*-]")


def _safe_id(text: str) -> str:
    # Ids are ASCII without spaces, so the id a report carries is the one the plan made.
    return _UNSAFE_ID.sub("_", text)


def _assign_ids(items: list[PlanItem]) -> None:
    for it in items:
        if it.dedupe:
            h = it.head
            it.id = _safe_id(f"{op_label(h['op'])}-{shape_label(h['shapes'], h['attrs'])}-"
                             f"{dtypes.short(h['dtype'])}-{it.signature[:10]}")
        else:
            o = it.occurrences[0]
            it.id = _safe_id(f"{o['model']}-{o['name']}")
    seen: dict[str, int] = {}
    for it in items:
        seen[it.id] = seen.get(it.id, 0) + 1
    for it in items:
        if seen[it.id] > 1:  # only when two ids collide: keep every id unique and stable
            it.id = f"{it.id}-{it.signature[:16]}-{it.occurrences[0]['model_case_id']}"


# One query, JSON decoded only where collection needs it (10k cases collect in well under a second).
_PLAN_SQL = """SELECT mc.id, mc.model, mc.name, mc.signature, c.op, c.shapes, c.dtype, c.seed, c.inputs, c.attrs,
                      c.marks, mc.marks, mc.rtol, mc.atol, mc.skip_if, mc.expects_error, mc.xfail, mc.source
               FROM model_cases mc JOIN cases c ON c.signature = mc.signature {where}
               ORDER BY mc.model, mc.position, mc.id"""


def build_plan(store, models: list[str] | None = None, *, dedupe: bool = True, smoke: bool = False) -> list[PlanItem]:
    """Items for the given models (all models when none), in manifest order.

    ``smoke``: only a few small cases (what a plain ``pytest`` without ``--model`` runs).
    """
    where, params = "", []
    if models:
        names = [store.model(m)["name"] for m in models]
        where = f"WHERE mc.model IN ({','.join('?' * len(names))})"
        params = names
    items: list[PlanItem] = []
    by_sig: dict[str, PlanItem] = {}
    for (mcid, model, name, sig, op, shapes, dtype, seed, inputs, attrs, derived, own, rtol, atol, skip_if,
         expects, xfail, source) in store.db.execute(_PLAN_SQL.format(where=where), params):
        marks = sorted(set(json.loads(derived) if derived else ()) | set(json.loads(own) if own else ()))
        occ = {"model_case_id": mcid, "model": model, "name": name, "rtol": rtol, "atol": atol,
               "skip_if": _loads(skip_if), "expects_error": _loads(expects), "xfail": _loads(xfail),
               "marks": marks, "source": source}
        if dedupe and sig in by_sig:
            it = by_sig[sig]
            it.occurrences.append(occ)
            it.marks = sorted(set(it.marks) | set(marks))
            continue
        head = {"op": op, "dtype": dtype, "seed": seed, "shapes": shapes, "attrs": json.loads(attrs) if attrs else {}}
        it = PlanItem(id="", signature=sig, head=head, inputs_json=inputs or "[]", occurrences=[occ], marks=marks,
                      dedupe=dedupe)
        items.append(it)
        if dedupe:
            by_sig[sig] = it
    if smoke:
        items = smoke_set(items)
    _assign_ids(items)
    return items


def smoke_set(items: list[PlanItem], size: int = SMOKE_SIZE) -> list[PlanItem]:
    """The smallest cases the default marker filter keeps, one per op (stable for a given DB)."""
    keep = marks_mod.MarkExpression(marks_mod.DEFAULT_EXCLUDE)
    pool = sorted((it for it in items if keep.matches(it.marks)),
                  key=lambda it: (it.numel, it.op, it.signature))
    out, ops = [], set()
    for it in pool:
        if it.op not in ops:
            ops.add(it.op)
            out.append(it)
        if len(out) == size:
            break
    order = {id(it): i for i, it in enumerate(items)}
    return sorted(out, key=lambda it: order[id(it)])


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"2/4"`` -> (2, 4): the second of four slices (1-based, as CI matrices count)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise CasedbError(f"--shard takes I/N with 1 <= I <= N (e.g. 1/4 ... 4/4), not {text!r}")
    return int(m.group(1)), int(m.group(2))


def in_shard(signature: str, shard: tuple[int, int] | None) -> bool:
    """Stable by signature: a case stays in its slice whatever else the DB holds."""
    if shard is None:
        return True
    i, n = shard
    return int(signature[:8], 16) % n == i - 1


def op_matches(op: str, wanted: str | None) -> bool:
    return wanted is None or op == wanted or wanted in op


# =================================================================================== execution

@dataclass
class Target:
    """Where and how the cases run (the same for every case of a run)."""

    device: str | None = None          # None: cuda when available, else cpu
    backend: str = "inductor"
    reference_dtype: str | None = None
    check_determinism: bool = False
    replace_device: bool = True
    imports: tuple = ()
    threads: int | None = None


class TargetError(CasedbError):
    """The device, backend, reference dtype or an --import cannot be used: nothing can run."""


def default_backend() -> str:
    return os.environ.get("TEST_COMPILE_BACKEND") or "inductor"


def import_module(name: str):
    """Import a module by name, or a ``.py`` file by path (for ops registered in a local file)."""
    if _is_path(name):
        path = Path(name).resolve()
        if not path.is_file():
            raise TargetError(f"--import {name}: no such file")
        mod_name = "casedb_import_" + re.sub(r"\W", "_", path.stem)
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[mod_name]
            raise
        return module
    return importlib.import_module(name)


def _is_path(name: str) -> bool:
    return name.endswith(".py") or "/" in name or os.sep in name


def check_import(name: str) -> None:
    """Fail early (without importing) when an --import names nothing."""
    if _is_path(name):
        if not Path(name).is_file():
            raise TargetError(f"--import {name}: no such file")
        return
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TargetError(f"--import {name}: no module named {name!r} (give an importable module or a .py path)")


def prepare_target(target: Target) -> Target:
    """Import the --import modules, resolve the default device and check everything once per
    process; raises TargetError (the whole run is unusable) with what to do."""
    for name in target.imports:
        try:
            import_module(name)
        except TargetError:
            raise
        except BaseException as e:  # an import can fail in any way; the run cannot go on
            raise TargetError(f"--import {name} failed: {type(e).__name__}: {e}") from None
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        # One op per graph: inductor's parallel compile has nothing to spread, while its pool of
        # compile subprocesses costs seconds to start and competes with -j workers for cores
        # (measured: cold runs 20 % and warm reruns 30 % faster; bench/README.md).
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        if "torch._inductor.config" in sys.modules:
            sys.modules["torch._inductor.config"].compile_threads = 1
    import torch

    from casedb import execute

    if target.threads:
        torch.set_num_threads(target.threads)
    device = target.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
        torch.empty(1, device=dev)
    except Exception as e:
        raise TargetError(f"device {device!r} cannot be used: {type(e).__name__}: {e} "
                          "(give --device cpu, cuda, cuda:1, or a backend's device after --import of its module)") from None
    try:
        execute.check_backend(target.backend)
    except ValueError as e:
        raise TargetError(str(e)) from None
    if target.reference_dtype is not None:
        try:
            from casedb.materialize import torch_dtype

            if not torch_dtype(target.reference_dtype).is_floating_point:
                raise ValueError("it is not a floating dtype")
        except ValueError as e:
            raise TargetError(f"--reference-dtype {target.reference_dtype!r}: {e} (use float32 or float64)") from None
    return Target(**{**asdict(target), "device": device})


def condition_env(target: Target, case: dict, model: str | None) -> dict:
    """The names a skip_if / xfail_if expression sees (casedb.safe_eval)."""
    device = target.device or "cpu"
    kind, _, index = device.partition(":")
    cfg = {"test_device": {"type": kind, "index": int(index) if index.isdigit() else None, "str": device},
           "device": device, "backend": target.backend, "compile_backend": target.backend,
           "dtype": case["dtype"], "reference_dtype": target.reference_dtype}
    return {"device": device, "backend": target.backend, "dtype_str": dtypes.short(case["dtype"]),
            "op": case["op"], "model": model, "cfg": cfg}


def _first_true(conditions, env) -> str | None:
    from casedb.safe_eval import evaluate_condition

    for cond in conditions or ():
        if evaluate_condition(cond["expr"], env):
            return cond.get("reason") or cond["expr"]
    return None


def _judgement(occ: dict, outcome: str, reason: str) -> dict:
    return {"model_case_id": occ["model_case_id"], "model": occ["model"], "name": occ["name"],
            "outcome": outcome, "reason": reason, "rtol": occ["rtol"], "atol": occ["atol"]}


_RESULT_FROM_VERDICT = ("max_abs_err", "max_rel_err", "mismatch_count", "error_type", "error_message", "traceback")


def execute_item(item: PlanItem, target: Target, load_blob: Callable[[str], bytes] | None) -> dict:
    """Run one plan item on a prepared target and judge it for each occurrence; returns the
    payload the controller records (JSON-safe): outcome, reason, result row, judgements."""
    from casedb import execute

    judgements, active = [], []
    for occ in item.occurrences:
        env = condition_env(target, item.case, occ["model"])
        why = _first_true(occ.get("skip_if"), env)
        if why:
            judgements.append(_judgement(occ, "skipped", why))
        else:
            active.append((occ, env))
    if not active:
        reasons = sorted({j["reason"] for j in judgements})
        return {"outcome": "skipped", "reason": "; ".join(reasons), "result": None,
                "judgements": judgements, "device": target.device}
    ex = execute.run_case(item.case, device=target.device, backend=target.backend, load_blob=load_blob,
                          reference_dtype=target.reference_dtype, check_determinism=target.check_determinism,
                          replace_device=target.replace_device)
    verdicts = []
    for occ, env in active:
        xfail = _first_true([occ["xfail"]] if occ.get("xfail") else None, env)
        v = execute.judge(ex, rtol=occ["rtol"], atol=occ["atol"], expects_error=occ.get("expects_error"), xfail=xfail)
        verdicts.append((occ, v))
        judgements.append(_judgement(occ, v.outcome, v.reason))
    occ, v = min(verdicts, key=lambda ov: SEVERITY.index(ov[1].outcome))
    vd = v.to_dict()
    result = {k: vd.get(k) for k in _RESULT_FROM_VERDICT}
    result.update(outcome=v.outcome, reason=v.reason, compare_mode=ex.compare_mode,
                  nan_inf_mismatch=None if v.nan_inf_mismatch is None else int(v.nan_inf_mismatch),
                  t_ref=ex.t_ref, t_compile=ex.t_compile, t_exec=ex.t_exec)
    exd = ex.to_dict()
    metrics = {k: vd[k] for k in vd if k not in _RESULT_FROM_VERDICT and k not in ("outcome", "reason")}
    metrics.update({k: exd[k] for k in ("t_setup", "t_ref_hi", "reference_dtype", "mutated", "determinism_detail")})
    metrics["judged_for"] = f"{occ['model']}::{occ['name']}"
    result["metrics"] = metrics
    return {"outcome": v.outcome, "reason": v.reason, "result": result, "judgements": judgements,
            "device": ex.device}


def failure_message(payload: dict) -> str:
    """What the pytest report says for an unexpected outcome: every occurrence's verdict."""
    lines = []
    for j in payload["judgements"]:
        lines.append(f"{j['outcome']}: {j['model']}::{j['name']} (rtol={j['rtol']:g}, atol={j['atol']:g}): {j['reason']}")
    r = payload.get("result") or {}
    if r.get("traceback") and payload["outcome"] == "error":
        lines.append(r["traceback"].rstrip())
    return "\n".join(lines)


# ===================================================================================== history

def connect(path: str | os.PathLike) -> sqlite3.Connection:
    """A connection for the recording process: WAL, NORMAL sync (a commit survives SIGKILL of
    the process, not a power cut; one fsync per case would dominate small cases)."""
    conn = sqlite3.connect(str(path), timeout=60, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 60000")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def torch_version() -> str | None:
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # not installed as a distribution: unknown
        return None


def start_run(conn: sqlite3.Connection, *, selection: dict, args: list[str], device: str | None,
              backend: str) -> int:
    """Insert a `running` runs row; returns its id."""
    cur = conn.execute(
        """INSERT INTO runs (uid, started_at, status, device, backend, torch_version, casedb_version, host, args, selection)
           VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)""",
        [uuid.uuid4().hex, now(), device, backend, torch_version(), __version__, socket.gethostname(),
         _dumps(list(args)), _dumps(selection)])
    return cur.lastrowid


def get_run(conn: sqlite3.Connection, run_id: int) -> dict:
    row = conn.execute("SELECT * FROM runs WHERE id = ?", [run_id]).fetchone()
    if row is None:
        last = conn.execute("SELECT max(id) FROM runs").fetchone()[0]
        raise NotFound(f"no run {run_id}" + (f" (the last run is {last})" if last else " (no runs recorded yet)"))
    d = dict(row)
    d["selection"] = _loads(d["selection"]) or {}
    d["summary"] = _loads(d["summary"])
    return d


def update_selection(conn: sqlite3.Connection, run_id: int, **changes) -> dict:
    sel = get_run(conn, run_id)["selection"]
    sel.update(changes)
    conn.execute("UPDATE runs SET selection = ? WHERE id = ?", [_dumps(sel), run_id])
    return sel


def done_keys(conn: sqlite3.Connection, run_id: int, *, dedupe: bool, upto: tuple[int, int] | None = None) -> set:
    """Keys of the items run `run_id` already has (a result, or judgements when skipped);
    ``upto`` = (last result id, last judgement id) freezes the set at a moment."""
    r_max, j_max = upto or (1 << 62, 1 << 62)
    keys = set()
    for sig, mcid in conn.execute("SELECT signature, model_case_id FROM results WHERE run_id = ? AND id <= ?",
                                  [run_id, r_max]):
        keys.add((sig, None if dedupe else mcid))
    for sig, mcid in conn.execute("SELECT signature, model_case_id FROM judgements WHERE run_id = ? AND id <= ?",
                                  [run_id, j_max]):
        keys.add((sig, None if dedupe else mcid))
    return keys


def high_water(conn: sqlite3.Connection, run_id: int) -> tuple[int, int]:
    r = conn.execute("SELECT ifnull(max(id), 0) FROM results WHERE run_id = ?", [run_id]).fetchone()[0]
    j = conn.execute("SELECT ifnull(max(id), 0) FROM judgements WHERE run_id = ?", [run_id]).fetchone()[0]
    return r, j


_RESULT_COLUMNS = ("outcome", "reason", "compare_mode", "max_abs_err", "max_rel_err", "mismatch_count",
                   "nan_inf_mismatch", "t_ref", "t_compile", "t_exec", "error_type", "error_message", "traceback")


class Recorder:
    """Writes one run's results as reports arrive (the controlling process only)."""

    def __init__(self, conn: sqlite3.Connection, run_id: int):
        self.conn = conn
        self.run_id = run_id
        self.device_known = get_run(conn, run_id)["device"] is not None

    def record(self, item: PlanItem, payload: dict, *, duration: float | None = None,
               worker: str | None = None, test_id: str | None = None) -> bool:
        """Store a payload (from execute_item, or made by :func:`lost_payload`) in one
        transaction; False when this run already has the item (exactly once)."""
        stamp = now()
        mcid = None if item.dedupe else item.occurrences[0]["model_case_id"]
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result_id = None
            res = payload.get("result")
            if res is not None:
                row = [res.get(k) for k in _RESULT_COLUMNS]
                cur = conn.execute(
                    f"""INSERT OR IGNORE INTO results (run_id, signature, model_case_id, {', '.join(_RESULT_COLUMNS)},
                            metrics, duration, worker, test_id, created_at)
                        VALUES (?, ?, ?, {', '.join('?' * len(_RESULT_COLUMNS))}, ?, ?, ?, ?, ?)""",
                    [self.run_id, item.signature, mcid, *row, _dumps(res.get("metrics")), duration, worker,
                     test_id, stamp])
                if cur.rowcount == 0:
                    conn.execute("ROLLBACK")
                    return False
                result_id = cur.lastrowid
            inserted = 0
            for j in payload["judgements"]:
                cur = conn.execute(
                    """INSERT OR IGNORE INTO judgements (run_id, result_id, model_case_id, model, signature, outcome,
                           reason, rtol, atol, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    [self.run_id, result_id, j["model_case_id"], j["model"], item.signature, j["outcome"],
                     j["reason"], j["rtol"], j["atol"], stamp])
                inserted += cur.rowcount
            if result_id is None and inserted == 0:
                conn.execute("ROLLBACK")
                return False
            if not self.device_known and payload.get("device"):
                conn.execute("UPDATE runs SET device = ? WHERE id = ? AND device IS NULL", [payload["device"], self.run_id])
                self.device_known = True
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return True


def lost_payload(item: PlanItem, outcome: str, reason: str, detail: str | None = None) -> dict:
    """A payload for a case whose worker reported nothing: crashed, timeout, error, or a skip
    decided by pytest itself (a `skip` mark)."""
    judgements = [_judgement(o, outcome, reason) for o in item.occurrences]
    if outcome == "skipped":
        return {"outcome": outcome, "reason": reason, "result": None, "judgements": judgements}
    result = {"outcome": outcome, "reason": reason, "error_type": outcome, "error_message": reason,
              "traceback": detail}
    return {"outcome": outcome, "reason": reason, "result": result, "judgements": judgements}


def finish_run(conn: sqlite3.Connection, run_id: int, status: str, *, error: str | None = None,
               session: dict | None = None) -> dict:
    """Close a run: status, end time and its summary (``session``: figures of the last session)."""
    conn.execute("UPDATE runs SET finished_at = ?, status = ? WHERE id = ?", [now(), status, run_id])
    summary = summarize(conn, run_id)
    if session:
        summary["session"] = session
    if error:
        summary["error"] = error
    conn.execute("UPDATE runs SET summary = ? WHERE id = ?", [_dumps(summary), run_id])
    return summary


def summarize(conn: sqlite3.Connection, run_id: int) -> dict:
    """A run's figures, from its rows (so a resumed or merged run sums every part)."""
    run = get_run(conn, run_id)
    sel = run["selection"]
    out: dict[str, Any] = {"run_id": run_id, "status": run["status"], "device": run["device"],
                           "backend": run["backend"], "started_at": run["started_at"],
                           "finished_at": run["finished_at"]}
    counts = dict.fromkeys(COUNT_KEYS.values(), 0)
    executed = 0
    for outcome, n in conn.execute("SELECT outcome, count(*) FROM results WHERE run_id = ? GROUP BY outcome", [run_id]):
        executed += n
        if outcome in COUNT_KEYS:
            counts[COUNT_KEYS[outcome]] += n
    dedupe = sel.get("options", {}).get("dedupe", True)
    skipped_q = ("SELECT count(DISTINCT signature) FROM judgements WHERE run_id = ? AND result_id IS NULL" if dedupe
                 else "SELECT count(*) FROM judgements WHERE run_id = ? AND result_id IS NULL")
    counts["skipped"] = conn.execute(skipped_q, [run_id]).fetchone()[0]
    occurrences = conn.execute("SELECT count(*) FROM judgements WHERE run_id = ?", [run_id]).fetchone()[0]
    cases = executed + counts["skipped"]
    out.update(executed=executed, **counts)
    out["occurrences"] = occurrences
    out["cases"] = cases
    out["duplicates_skipped"] = occurrences - cases if dedupe else 0
    out["unexpected"] = sum(counts[COUNT_KEYS[o]] for o in UNEXPECTED)
    out["planned"] = sel.get("planned")
    out["options"] = sel.get("options")
    t = conn.execute("""SELECT sum(t_ref), sum(t_compile), sum(t_exec), sum(duration), count(t_compile), count(t_exec)
                        FROM results WHERE run_id = ?""", [run_id]).fetchone()
    out["time"] = {"ref_s": _r(t[0]), "compile_s": _r(t[1]), "exec_s": _r(t[2]), "cases_s": _r(t[3]),
                   "compile_ms_per_case": _r(1000 * t[1] / t[4]) if t[4] else None,
                   "exec_ms_per_case": _r(1000 * t[2] / t[5]) if t[5] else None,
                   "ref_ms_per_case": _r(1000 * t[0] / executed) if executed and t[0] is not None else None}
    models: dict[str, dict] = {}
    for model, outcome, n in conn.execute(
            "SELECT model, outcome, count(*) FROM judgements WHERE run_id = ? GROUP BY model, outcome ORDER BY model",
            [run_id]):
        m = models.setdefault(model, dict(dict.fromkeys(COUNT_KEYS.values(), 0), occurrences=0))
        m["occurrences"] += n
        if outcome in COUNT_KEYS:
            m[COUNT_KEYS[outcome]] += n
    out["models"] = models
    if run["started_at"] and run["finished_at"]:
        out["duration_s"] = _r((_dt.datetime.fromisoformat(run["finished_at"])
                                - _dt.datetime.fromisoformat(run["started_at"])).total_seconds())
    return out


def _r(x, digits: int = 4):
    return None if x is None else round(float(x), digits)


def pid_alive(pid: int | None) -> bool:
    if not pid or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ======================================================================================= merge

_COPY_TABLES = ("models", "cases", "blobs")


def merge(target_path: str | os.PathLike, sources: list[str | os.PathLike], *, combine: bool = False) -> dict:
    """Fold runs (with their results and judgements) and any models, cases, blobs and model
    cases the target lacks from each source DB into the target; sources are only read.

    A run already in the target (same uid, also as part of a combined run) is not copied
    again, so merging the same shard twice changes nothing. ``combine``: all source runs become
    one run (the shards of one CI job), its summary computed from the merged rows.
    """
    from casedb.store import Store

    target_path = Path(target_path)
    for s in sources:
        if not Path(s).is_file():
            raise NotFound(f"no database file {s}")
        if Path(s).resolve() == target_path.resolve():
            raise CasedbError(f"{s} is the target database itself")
    Store(target_path).close()  # create / migrate the target
    conn = connect(target_path)
    report: dict[str, Any] = {"target": str(target_path), "sources": [], "runs": 0, "results": 0, "judgements": 0}
    combined = None
    try:
        for src in sources:
            conn.execute("ATTACH DATABASE ? AS src", [str(src)])
            try:
                conn.execute("BEGIN IMMEDIATE")
                part, combined = _merge_one(conn, str(src), combined if combine else False)
                if combined:
                    _close_combined(conn, combined)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                conn.execute("DETACH DATABASE src")
            report["sources"].append(part)
            for k in ("runs", "results", "judgements"):
                report[k] += part[k]
        if combined:
            report["run_id"] = combined
            report["summary"] = get_run(conn, combined)["summary"]
    finally:
        conn.close()
    return report


def _columns(conn, schema: str, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def _shared_columns(conn, table: str, skip=()) -> list[str]:
    theirs = set(_columns(conn, "src", table))
    return [c for c in _columns(conn, "main", table) if c in theirs and c not in skip]


def _known_uids(conn) -> set:
    uids = {r[0] for r in conn.execute("SELECT uid FROM main.runs WHERE uid IS NOT NULL")}
    for (sel,) in conn.execute("SELECT selection FROM main.runs WHERE selection LIKE '%merged_from%'"):
        uids.update(p.get("uid") for p in (_loads(sel) or {}).get("merged_from") or [])
    return uids


def _merge_one(conn, src: str, combined) -> tuple[dict, int | None]:
    """Copy one attached source; ``combined`` is False (copy runs as they are), None (combine,
    no run made yet) or the combined run's id. Returns (report, combined run id)."""
    part = {"source": src, "runs": 0, "runs_already_merged": 0, "results": 0, "judgements": 0,
            "new_cases": 0, "new_models": 0, "conflicts": 0}
    for table in _COPY_TABLES:
        cols = _shared_columns(conn, table)
        cur = conn.execute(f"INSERT OR IGNORE INTO main.{table} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM src.{table}")
        if table in ("cases", "models"):
            part[f"new_{table}"] = cur.rowcount
    cols = _shared_columns(conn, "model_cases", skip=("id",))
    conn.execute(f"INSERT OR IGNORE INTO main.model_cases ({', '.join(cols)}) SELECT {', '.join(cols)} FROM src.model_cases")
    # a source occurrence is the target's occurrence with the same (model, name) and signature
    mc_map = {}
    for sid, tid, same in conn.execute("""SELECT s.id, m.id, s.signature = m.signature FROM src.model_cases s
                                          JOIN main.model_cases m ON m.model = s.model AND m.name = s.name"""):
        if same:
            mc_map[sid] = tid
        else:
            part["conflicts"] += 1
    known = _known_uids(conn)
    run_cols = _shared_columns(conn, "runs", skip=("id",))
    res_cols = _shared_columns(conn, "results", skip=("id", "run_id", "model_case_id"))
    for run in [dict(r) for r in conn.execute("SELECT * FROM src.runs ORDER BY id")]:
        uid = run.get("uid") or f"{run.get('host')}:{run.get('started_at')}:{run['id']}"
        if uid in known:
            part["runs_already_merged"] += 1
            continue
        if combined is False:
            vals = {c: run.get(c) for c in run_cols}
            vals["uid"] = uid
            new_run = conn.execute(f"INSERT INTO main.runs ({', '.join(vals)}) VALUES ({', '.join('?' * len(vals))})",
                                   list(vals.values())).lastrowid
        else:
            if combined is None:
                opts = (_loads(run.get("selection")) or {}).get("options") or {}
                combined = conn.execute(
                    """INSERT INTO runs (uid, started_at, status, device, backend, torch_version, casedb_version, host,
                           args, selection) VALUES (?, ?, 'finished', ?, ?, ?, ?, ?, ?, ?)""",
                    [uuid.uuid4().hex, run["started_at"], run["device"], run["backend"], run["torch_version"],
                     run["casedb_version"], run["host"], run["args"],
                     _dumps({"options": {**opts, "shard": None}, "merged_from": []})]).lastrowid
            sel = get_run(conn, combined)["selection"]
            sel["merged_from"].append(
                {"source": src, "run_id": run["id"], "uid": uid, "status": run["status"], "device": run["device"],
                 "backend": run["backend"], "started_at": run["started_at"], "finished_at": run["finished_at"],
                 "shard": ((_loads(run.get("selection")) or {}).get("options") or {}).get("shard"),
                 "planned": (_loads(run.get("selection")) or {}).get("planned")})
            conn.execute("UPDATE runs SET selection = ? WHERE id = ?", [_dumps(sel), combined])
            new_run = combined
        known.add(uid)
        part["runs"] += 1
        res_map = {}
        for r in conn.execute(f"SELECT id, model_case_id, {', '.join(res_cols)} FROM src.results WHERE run_id = ?",
                              [run["id"]]).fetchall():
            cur = conn.execute(
                f"""INSERT OR IGNORE INTO main.results (run_id, model_case_id, {', '.join(res_cols)})
                    VALUES (?, ?, {', '.join('?' * len(res_cols))})""",
                [new_run, mc_map.get(r["model_case_id"]), *[r[c] for c in res_cols]])
            if cur.rowcount:
                res_map[r["id"]] = cur.lastrowid
                part["results"] += 1
        for j in conn.execute("SELECT * FROM src.judgements WHERE run_id = ?", [run["id"]]).fetchall():
            if j["result_id"] is not None and j["result_id"] not in res_map:
                continue  # its result was already in the target run
            cur = conn.execute(
                """INSERT OR IGNORE INTO main.judgements (run_id, result_id, model_case_id, model, signature, outcome,
                       reason, rtol, atol, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [new_run, res_map.get(j["result_id"]), mc_map.get(j["model_case_id"]), j["model"], j["signature"],
                 j["outcome"], j["reason"], j["rtol"], j["atol"], j["created_at"]])
            part["judgements"] += cur.rowcount
        if combined is False:
            summary = summarize(conn, new_run)
            conn.execute("UPDATE runs SET summary = ? WHERE id = ?", [_dumps(summary), new_run])
    return part, (None if combined is False else combined)


def _close_combined(conn, run_id: int) -> None:
    """The combined run's span, status, target and summary, from its parts."""
    parts = get_run(conn, run_id)["selection"]["merged_from"]
    status = "finished" if all(p["status"] == "finished" for p in parts) else "interrupted"

    def one(key):
        values = sorted({str(p[key]) for p in parts})
        return values[0] if len(values) == 1 else ",".join(values)

    started = min(p["started_at"] for p in parts if p["started_at"])
    ends = [p["finished_at"] for p in parts if p["finished_at"]]
    conn.execute("UPDATE runs SET status = ?, device = ?, backend = ?, started_at = ?, finished_at = ? WHERE id = ?",
                 [status, one("device"), one("backend"), started, max(ends) if ends else None, run_id])
    planned = [p.get("planned") for p in parts]
    if planned and all(planned):
        totals = {k: sum(p.get(k) or 0 for p in planned) for k in ("cases", "occurrences", "duplicates_skipped")}
        update_selection(conn, run_id, planned=totals)
    conn.execute("UPDATE runs SET summary = ? WHERE id = ?", [_dumps(summarize(conn, run_id)), run_id])


# ======================================================================================== run

@dataclass
class RunOptions:
    """`casedb run`'s options; `selection` fields are kept with the run and reused by --resume."""

    models: list = field(default_factory=list)
    dedupe: bool = True
    keyword: str | None = None
    markexpr: str | None = None
    op: str | None = None
    limit: int | None = None
    shard: str | None = None
    device: str | None = None
    backend: str | None = None
    imports: list = field(default_factory=list)
    reference_dtype: str | None = None
    check_determinism: bool = False
    replace_device: bool = True
    # how (not what): not restored by --resume
    jobs: int = 1
    timeout: float = 300.0
    fail_fast: bool = False


_HOW = ("jobs", "timeout", "fail_fast")


def selection_options(opts: RunOptions) -> dict:
    return {f.name: getattr(opts, f.name) for f in fields(RunOptions) if f.name not in _HOW}


def pytest_args(opts: RunOptions, *, db: Path, run_id: int, workdir: Path, max_cases: int = 1000) -> list[str]:
    """The pytest command line `casedb run` amounts to."""
    # importlib mode: each run's generated test module is its own, even within one process
    args = [str(workdir / TEST_FILE), "-c", str(workdir / "pytest.ini"), "--rootdir", str(workdir),
            "--import-mode", "importlib",
            "-p", "no:cacheprovider", "-p", "no:benchmark", "-q", "--strict-markers", "--casedb-db", str(db),
            "--casedb-run-id", str(run_id), "--compile-backend", opts.backend or default_backend()]
    # only the plugins a run needs (see run()): the session and its workers start faster
    args += ["-p", "casedb.pytest_plugin", "-p", "xdist.plugin", "-p", "pytest_timeout"]
    for m in opts.models:
        args += ["--model", m]
    if not opts.models:
        args.append("--all-models")
    if not opts.dedupe:
        args.append("--no-dedupe")
    if opts.keyword:
        args += ["-k", opts.keyword]
    if opts.markexpr is not None:
        args += ["-m", opts.markexpr]
    if opts.op:
        args += ["--casedb-op", opts.op]
    if opts.limit:
        args += ["--casedb-limit", str(opts.limit)]
    if opts.shard:
        args += ["--casedb-shard", opts.shard]
    if opts.device:
        args += ["--device", opts.device]
    for name in opts.imports:
        args += ["--casedb-import", name]
    if opts.reference_dtype:
        args += ["--casedb-reference-dtype", opts.reference_dtype]
    if opts.check_determinism:
        args.append("--casedb-check-determinism")
    if not opts.replace_device:
        args.append("--no-device-replace")
    if opts.jobs >= 1:
        # a worker that dies is replaced: one restart per case it could take down, and no more
        # (a worker that dies before any case would otherwise be restarted for ever)
        args += ["-n", str(opts.jobs), "--max-worker-restart", str(max_cases + 2 * opts.jobs),
                 "--casedb-worker-log-dir", str(workdir)]
        cores = os.cpu_count() or 1
        if opts.jobs > 1:
            args += ["--casedb-threads", str(max(1, cores // opts.jobs))]
    if opts.timeout and opts.timeout > 0:
        # thread: a hang inside C code is ended too (the worker exits and is replaced);
        # without workers only a signal keeps the run alive
        args += ["--timeout", f"{opts.timeout:g}", "--timeout-method", "thread" if opts.jobs >= 1 else "signal"]
    if opts.fail_fast:
        args.append("-x")
    return args


def _validate(opts: RunOptions) -> None:
    if opts.jobs < 0:
        raise CasedbError("--jobs must be 0 (in this process, no isolation) or more")
    if opts.limit is not None and opts.limit < 1:
        raise CasedbError("--limit must be at least 1")
    if opts.timeout is not None and opts.timeout < 0:
        raise CasedbError("--timeout must be >= 0 (0: none)")
    parse_shard(opts.shard)
    if opts.markexpr:
        try:
            marks_mod.MarkExpression(opts.markexpr)
        except ValueError as e:
            raise CasedbError(str(e)) from None
    for name in opts.imports:
        check_import(name)
    if opts.reference_dtype:
        try:
            dtypes.canonical(opts.reference_dtype)
        except dtypes.UnknownDtype as e:
            raise CasedbError(f"--reference-dtype: {e}") from None


def run(opts: RunOptions, *, db: str | os.PathLike | None = None, resume: int | None = None,
        progress: bool = True, console=None) -> dict:
    """`casedb run`: record a run of the selected cases; returns its summary (see summarize).

    ``resume``: finish run `resume` (its selection and target are reused; ``jobs``, ``timeout``
    and ``fail_fast`` come from ``opts``) — every case it has no result for runs exactly once.
    """
    import pytest

    from casedb.store import open_store

    with open_store(db) as store:  # creates / migrates / seeds the default DB before any worker starts
        db_path = store.path.resolve()
        if resume is None:
            for m in opts.models:
                store.model(m)
        max_cases = store.stats()["occurrences"]
    conn = connect(db_path)
    try:
        if resume is not None:
            run_row = get_run(conn, resume)
            sel = run_row["selection"]
            if run_row["status"] == "running" and run_row["host"] == socket.gethostname() and pid_alive(sel.get("pid")):
                raise CasedbError(f"run {resume} is still running (pid {sel.get('pid')}); "
                                  "wait for it, or kill it first and resume then")
            saved = sel.get("options")
            if saved is None:
                raise CasedbError(f"run {resume} has no recorded selection to resume from")
            how = {k: getattr(opts, k) for k in _HOW}
            opts = RunOptions(**{**saved, **how})
            run_id = resume
            resumed = sel.get("resumed", []) + [{"at": now(), "pid": os.getpid()}]
            update_selection(conn, run_id, resumed=resumed)
            conn.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE id = ?", [run_id])
        _validate(opts)
        # a file given to --import is kept by absolute path, so --resume works from anywhere
        opts.imports = [str(Path(n).resolve()) if _is_path(n) else n for n in opts.imports]
        if resume is None:
            run_id = start_run(conn, selection={"options": selection_options(opts), "source": "casedb run"},
                               args=sys.argv[1:], device=opts.device, backend=opts.backend or default_backend())
    finally:
        conn.close()

    ui = _Progress(console, enabled=progress)
    with tempfile.TemporaryDirectory(prefix="casedb-run-") as tmp:
        workdir = Path(tmp)
        (workdir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        (workdir / TEST_FILE).write_text(
            '"""Generated by casedb run."""\nfrom casedb.pytest_plugin import test_model_op  # noqa: F401\n',
            encoding="utf-8")
        args = pytest_args(opts, db=db_path, run_id=run_id, workdir=workdir, max_cases=max_cases)
        log = workdir / "pytest.log"
        with open(log, "w", encoding="utf-8") as out, contextlib.redirect_stdout(out), _no_plugin_autoload():
            try:
                code = pytest.main(args, plugins=[ui])
            finally:
                ui.stop()
        text = log.read_text(encoding="utf-8", errors="replace")
    code = int(code)
    conn = connect(db_path)
    try:
        run_row = get_run(conn, run_id)
        if run_row["status"] == "running":  # the plugin never got to close it
            finish_run(conn, run_id, "interrupted", error=f"pytest exit code {code}")
            run_row = get_run(conn, run_id)
        summary = run_row["summary"]
    finally:
        conn.close()
    summary["pytest_exit_code"] = code
    if summary.get("error") and "pytest exit code" not in summary["error"]:
        raise TargetError(f"run {run_id}: {summary['error']}")
    interrupted_by_user = code == 2 and "KeyboardInterrupt" in text
    if code not in (0, 1, 5) and not interrupted_by_user:
        # pytest could not run the session (collection, usage or internal error): say why
        tail = "\n".join(text.strip().splitlines()[-30:])
        raise CasedbError(f"run {run_id}: pytest could not run the cases (exit code {code}); "
                          f"resume with casedb run --resume {run_id} once fixed:\n{tail}")
    return summary


@contextlib.contextmanager
def _no_plugin_autoload():
    """Every installed pytest plugin costs start-up time in the controller and in each worker
    (hypothesis alone ~1 s here); a run loads casedb's, xdist's and pytest-timeout's by name."""
    old = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"]
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = old


class _Progress:
    """Rich progress for `casedb run`: bar, ETA, live counts (fed by the plugin's hooks)."""

    def __init__(self, console, enabled: bool):
        self.enabled = enabled
        self.console = console
        self.progress = None
        self.task = None
        self.counts: dict[str, int] = {}

    def _counts_text(self) -> str:
        c = self.counts
        parts = [f"[green]{c.get('passed', 0)} passed[/]", f"[red]{c.get('failed', 0)} failed[/]"]
        for k, style in (("error", "red"), ("crashed", "red"), ("timeout", "red"), ("xpassed", "red"),
                         ("ref_error", "yellow"), ("xfailed", "yellow"), ("skipped", "dim")):
            if c.get(k):
                parts.append(f"[{style}]{c[k]} {k}[/]")
        return " ".join(parts)

    def pytest_casedb_planned(self, config, total: int, figures: dict) -> None:
        if not self.enabled or self.progress is not None:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        console = self.console or Console(stderr=True)
        self.progress = Progress(TextColumn("[bold]run {task.fields[run_id]}[/]"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[counts]}"), console=console, transient=False)
        self.progress.start()
        self.task = self.progress.add_task("run", total=total, run_id=figures.get("run_id"), counts=self._counts_text())

    def pytest_casedb_recorded(self, config, outcome: str, item) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.progress is not None:
            self.progress.update(self.task, advance=1, counts=self._counts_text())

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def summary_tables(summary: dict):
    """(per-model table, totals line) for the terminal."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"run {summary['run_id']}: {summary.get('device')} / {summary.get('backend')}",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    # short headers: the table fits 80 columns (the totals line below spells every outcome out)
    cols = (("model", "model"), ("occurrences", "occ"), ("passed", "pass"), ("failed", "fail"), ("errors", "err"),
            ("crashed", "crash"), ("timeouts", "t/o"), ("xfailed", "xfail"), ("xpassed", "xpass"),
            ("ref_errors", "ref"), ("skipped", "skip"))
    for key, head in cols:
        if key == "model":
            table.add_column(head, overflow="fold", min_width=min(24, max(map(len, summary["models"] or ["model"]))))
        else:
            table.add_column(head, justify="right", no_wrap=True, min_width=len(head))
    for model, m in summary["models"].items():
        table.add_row(model, *[str(m.get(k, 0)) for k, _ in cols[1:]])
    t = summary["time"]
    line = (f"{summary['executed']} executed ({summary['occurrences']} occurrences, "
            f"{summary['duplicates_skipped']} duplicates skipped): {summary['passed']} passed, {summary['failed']} failed, "
            f"{summary['errors']} errors, {summary['ref_errors']} ref errors, {summary['crashed']} crashed, "
            f"{summary['timeouts']} timeouts, {summary['skipped']} skipped, {summary['xfailed']} xfailed, "
            f"{summary['xpassed']} xpassed")
    times = []
    for k, label in (("ref_ms_per_case", "reference"), ("compile_ms_per_case", "compile"), ("exec_ms_per_case", "execute")):
        if t.get(k) is not None:
            times.append(f"{label} {t[k]:.1f} ms")
    if times:
        line += "; per case: " + ", ".join(times)
    if summary.get("duration_s") is not None:
        line += f"; total {summary['duration_s']:.1f} s"
    return table, line


def summary_notes(summary: dict) -> list[str]:
    """Hints printed after the summary: what was left out, how to go on."""
    notes = []
    planned = summary.get("planned") or {}
    opts = summary.get("options") or {}
    if planned.get("available") and planned["cases"] < planned["available"] and opts.get("markexpr") is None:
        notes.append(f"{planned['cases']} of {planned['available']} cases selected: the default marker filter "
                     f"(-m '{marks_mod.DEFAULT_EXCLUDE}') leaves out the rest unless -m is given (-m '' runs all)")
    if summary.get("status") != "finished":
        notes.append(f"run {summary['run_id']} is {summary.get('status')}: finish it with casedb run --resume {summary['run_id']}")
    return notes


JSON_KEYS = ("run_id", "status", "device", "backend", "executed", "passed", "failed", "errors", "ref_errors",
             "crashed", "timeouts", "skipped", "xfailed", "xpassed", "occurrences", "cases", "duplicates_skipped",
             "unexpected", "planned", "duration_s", "time", "session", "models")


def summary_json(summary: dict) -> dict:
    return {k: summary.get(k) for k in JSON_KEYS}
