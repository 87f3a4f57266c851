"""The target of a run and the execution of one plan item on it (in the process that runs cases).

:class:`Target` is where and how every case of a run executes (device, backend, reference dtype,
``--import`` modules), derived from the :class:`~casedb.run.runspec.RunSpec`. :func:`prepare_target`
imports the modules and checks the device and backend once per process; :func:`execute_item`
runs one item with the execution core (:mod:`casedb.run.execute`) and judges it once per model
occurrence, with that occurrence's tolerances, ``expects_error``, ``xfail_if`` and ``skip_if``.
The payload it returns is what the recording process stores (:mod:`casedb.store.recorder`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from casedb import outcomes
from casedb.cases import dtypes, valid_inputs
from casedb.errors import CasedbError
from casedb.judge import judges, numerics
from casedb.judge.numerics import DEFAULT_JUDGE
from casedb.run.decide import expected, final_verdict, first_true, triage_target
from casedb.run.plan import Occurrence
from casedb.run.runspec import RunSpec, default_backend
from casedb.store import result_columns
from casedb.store.records import Judgement, Payload
from casedb import triage as triage_mod


@dataclass
class Target:
    """Where and how the cases run (the same for every case of a run): the RunSpec fields flagged
    ``target``, with their defaults (tests/run/test_run_layout.py keeps the two in step)."""

    device: str | None = None
    backend: str = field(default_factory=default_backend)
    imports: list = field(default_factory=list)
    reference_dtype: str | None = None
    run_skipped: bool = False
    check_determinism: bool = False
    judge: str = DEFAULT_JUDGE
    values: str = "random"
    replace_device: bool = True
    arch: str | None = None
    measure: bool = False
    measure_baseline: str = "eager"
    measure_budget: float = 2.0
    threads: int | None = None

    @classmethod
    def from_spec(cls, spec: RunSpec) -> "Target":
        return cls(**{f.name: getattr(spec, f.name) for f in fields(cls)})


class TargetError(CasedbError):
    """The device, backend, reference dtype or an --import cannot be used: nothing can run."""


def is_path(name: str) -> bool:
    return name.endswith(".py") or "/" in name or os.sep in name


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _local_file(name: str) -> Path | None:
    """``NAME.py`` in the working directory for an --import NAME that is not on sys.path: the
    console script's sys.path lacks the working directory that ``python -m`` would give it."""
    try:
        local = Path(*name.split(".")).with_suffix(".py")
    except ValueError:
        return None
    return local if local.is_file() and not _findable(name) else None


def import_module(name: str):
    """Import a module by name, or a ``.py`` file by path (for ops registered in a local file);
    the op namespaces it registers become callable by cases (:func:`casedb.cases.dispatcher.credit`)."""
    from casedb.cases import dispatcher  # (imports torch: only the processes that run cases pay for it)

    before = dispatcher.namespaces()
    module = _import(name)
    dispatcher.credit(module, dispatcher.namespaces() - before)
    return module


def _import(name: str):
    if not is_path(name) and (local := _local_file(name)) is not None:
        name = str(local)
    if is_path(name):
        _check_source_file(name)
        path = Path(name).resolve()
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


def _check_source_file(name: str) -> None:
    """An --import given as a path names an existing Python source file (``.py``)."""
    path = Path(name)
    if not path.is_file():
        raise TargetError(f"--import {name}: no such file" + (" (a folder: give its .py file, or the package by "
                                                             "its module name)" if path.is_dir() else ""))
    if path.suffix != ".py":
        raise TargetError(f"--import {name}: not a Python source file; give a .py file or an importable module name")


def check_import(name: str) -> str:
    """Fail early (without importing) when an --import names nothing; returns how to import it
    from anywhere (a file by its absolute path)."""
    if is_path(name):
        _check_source_file(name)
        return str(Path(name).resolve())
    if _findable(name):
        return name
    if (local := _local_file(name)) is not None:
        return str(local.resolve())
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
    import torch  # (here and below: the controller process never imports torch)

    from casedb.run import backend, execute

    execute.watch_interrupts()
    if target.threads:
        torch.set_num_threads(target.threads)
    device = resolve_device(target.device)
    try:
        dev = torch.device(device)
        torch.empty(1, device=dev)
    except Exception as e:
        raise TargetError(f"device {device!r} cannot be used: {type(e).__name__}: {e} "
                          "(give --device cpu, cuda, cuda:1, or a backend's device after --import of its module)") from None
    try:
        backend.check_backend(target.backend)
    except ValueError as e:
        raise TargetError(str(e)) from None
    if (why := backend.compile_support(device, target.backend)) is not None:
        raise TargetError(why)
    if target.reference_dtype is not None:
        try:
            dtypes.reference_dtype(target.reference_dtype)
        except dtypes.UnknownDtype as e:
            raise TargetError(f"--reference-dtype: {e}") from None
    return replace(target, device=device, arch=resolve_arch(device, target.arch))


def resolve_arch(device: str | None, arch: str | None = None) -> str | None:
    """The arch triage entries scoped to one match: ``arch`` when given, else ``sm_XY`` of a
    CUDA device (the default device: cuda when there is one), else None."""
    if arch is not None:
        return arch
    import torch

    try:
        dev = torch.device(resolve_device(device))
        if dev.type == "cuda":
            major, minor = torch.cuda.get_device_capability(dev)
            return f"sm_{major}{minor}"
    except (RuntimeError, AssertionError, ValueError):  # a device type an --import registers; no CUDA
        pass
    return None


def resolve_device(device: str | None) -> str:
    """The device a run uses: ``device``, or cuda when there is one, else cpu."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def condition_env(target: Target, case: dict, model: str | None) -> dict:
    """The names a skip_if / xfail_if expression sees (casedb.cases.safe_eval)."""
    device = target.device or "cpu"
    kind, _, index = device.partition(":")
    cfg = {"test_device": {"type": kind, "index": int(index) if index.isdigit() else None, "str": device},
           "device": device, "backend": target.backend, "compile_backend": target.backend,
           "dtype": case["dtype"], "reference_dtype": target.reference_dtype}
    return {"device": device, "backend": target.backend, "dtype_str": dtypes.short(case["dtype"]),
            "op": case["op"], "model": model, "cfg": cfg}


def _judgement(occ: Occurrence, outcome: str, reason: str, *, rtol=None, atol=None, stage=None,
               triage: str | None = None, where: str | None = None) -> Judgement:
    return {"model_case_id": occ.model_case_id, "model": occ.model, "name": occ.name,
            "outcome": outcome, "reason": reason, "rtol": rtol if rtol is not None else occ.rtol,
            "atol": atol if atol is not None else occ.atol, "stage": stage, "triage": triage, "triage_where": where}


def _judged(occ: Occurrence, v) -> Judgement:
    """The judgement row of an occurrence's final verdict (casedb.run.decide)."""
    return _judgement(occ, v.outcome, v.reason, rtol=v.rtol, atol=v.atol, stage=v.stage, triage=v.triage,
                      where=v.triage_where)


def triage_case(item, occ: Occurrence) -> dict:
    """What a triage entry selects a case by: its model, name, op, signature, dtype and marks."""
    return {"model": occ.model, "name": occ.name, "op": item.op, "signature": item.signature,
            "dtype": item.dtype, "marks": occ.marks or []}


_RESULT_FROM_VERDICT = result_columns.FROM_VERDICT  # the rest of a result row: _executed_payload, execute_item
_NOT_METRICS = ("outcome", "reason", "triage", "triage_where")  # Verdict fields the row or the judgements hold


def execute_item(item, target, load_blob: Callable[[str], bytes] | None, rules=(), triage=None) -> Payload:
    """Run one plan item on a prepared target and decide each occurrence's final verdict once
    (casedb.run.decide.final_verdict), with the tolerances casedb.judge.numerics gives it (``rules``:
    tolerance rules) and read under the run's triage files (``triage``: a casedb.triage.entries.Triage);
    returns the payload the recording process stores (JSON-safe): outcome, reason, result row, judgements."""
    # (both import torch: only the processes that run cases pay for it)
    from casedb.cases import value_ranges
    from casedb.run import execute

    judgements, active = _active_occurrences(item, target, triage)
    if not active:
        reasons = sorted({j["reason"] for j in judgements})
        return {"outcome": "skipped", "reason": "; ".join(reasons), "result": None,
                "judgements": judgements, "device": target.device}
    invalid = valid_inputs.problems(item.case)
    if invalid:
        return _invalid_payload(invalid, active, judgements, target)
    case = value_ranges.variant(item.case, target.values)
    if case is None:  # no extremal variant: it would repeat the random run
        reason = f"no extremal values for {item.op} (casedb.cases.value_ranges has no rule for it)"
        return {"outcome": "skipped", "reason": reason, "result": None, "device": target.device,
                "judgements": judgements + [_judgement(occ, "skipped", reason) for occ, _, _ in active]}
    ex = execute.run_case(case, device=target.device, backend=target.backend, load_blob=load_blob,
                          reference_dtype=target.reference_dtype, check_determinism=target.check_determinism,
                          replace_device=target.replace_device, high_precision="needed" if judges.JUDGES[target.judge].by_ulp else False)
    policy = numerics.Policy(list(rules), device=str(target.device), backend=str(target.backend))
    found = ex.dtypes() or [item.dtype]
    verdicts = []
    for occ, env, entry in active:
        v = final_verdict(ex, occ, env, entry, tolerances=policy.tolerances(vars(occ), item.case, found),
                          target=target, triage=triage)
        verdicts.append((occ, v))
        judgements.append(_judged(occ, v))
    payload = _executed_payload(ex, verdicts, judgements)
    payload["result"]["input_values"] = target.values  # the variants of one case stay apart
    if target.measure and payload["outcome"] == "passed" and target.values == "random":
        from casedb.run.measure import measure_case

        payload["result"]["metrics"]["latency"] = measure_case(
            case, device=str(target.device), backend=target.backend, baseline=target.measure_baseline,
            load_blob=load_blob, budget=target.measure_budget, replace_device=target.replace_device)
    return payload


def _active_occurrences(item, target, triage) -> tuple[list, list]:
    """(judgements of the occurrences that do not run: skipped by their triage entry or skip_if,
    (occurrence, condition env, triage entry) of those that do)."""
    judgements, active = [], []
    for occ, entry in zip(item.occurrences, triage_entries(item, triage, triage_target(target))):
        if entry is not None and not entry.runs:  # exclude: not judged; not_supported: skipped, never run
            t = triage_mod.verdict(entry, None)
            if t["outcome"] == "skipped":
                judgements.append(_judgement(occ, "skipped", t["reason"], triage=t["triage"], where=t["where"]))
            continue
        env = condition_env(target, item.case, occ.model)
        why = None if target.run_skipped else first_true(occ.skip_if, env)
        if why:
            judgements.append(_judgement(occ, "skipped", why))
        else:
            active.append((occ, env, entry))
    return judgements, active


def _invalid_payload(invalid: list[str], active: list, judgements: list, target) -> Payload:
    """The case's own fault (`casedb check` lists it): never run it — on a device an index out of
    bounds can take the worker down — and report it with the bad cases, apart from the backend's."""
    reason = f"invalid case (casedb check): {'; '.join(invalid)}"
    judgements += [_judgement(occ, "ref_error", reason, stage="input build") for occ, _, _ in active]
    return {"outcome": "ref_error", "reason": reason, "judgements": judgements, "device": target.device,
            "result": {"outcome": "ref_error", "reason": reason, "stage": "input build",
                       "error_type": "InvalidCase", "error_message": reason}}


def _executed_payload(ex, verdicts: list, judgements: list) -> Payload:
    """The payload of an executed item: its result row is the worst occurrence's final verdict."""
    occ, v = min(verdicts, key=lambda ov: outcomes.severity(ov[1].outcome))
    vd = v.to_dict()
    result = {k: vd.get(k) for k in _RESULT_FROM_VERDICT}
    result.update(outcome=v.outcome, reason=v.reason, compare_mode=ex.compare_mode,
                  nan_inf_mismatch=None if v.nan_inf_mismatch is None else int(v.nan_inf_mismatch),
                  t_ref=ex.t_ref, t_compile=ex.t_compile, t_exec=ex.t_exec,
                  exercised=int(ex.exercised) if ex.target is not None else None,
                  lowering=(ex.lowering or {}).get("kind"))
    exd = ex.to_dict()
    metrics = {k: vd[k] for k in vd if k not in _RESULT_FROM_VERDICT and k not in _NOT_METRICS}
    metrics.update({k: exd[k] for k in ("t_setup", "t_ref_hi", "reference_dtype", "mutated", "determinism_detail",
                                        "backend_calls", "graph_ops", "lowering", "not_exercised", "notes")})
    metrics["judged_for"] = f"{occ.model}::{occ.name}"
    if v.stage == "incorrect result" and ex.target is not None:
        from casedb.judge import pattern  # (torch: only the processes that run cases import it)

        metrics["pattern"] = pattern.describe_output(ex.reference, ex.target, rtol=v.rtol, atol=v.atol)
    result["metrics"] = metrics
    return {"outcome": v.outcome, "reason": v.reason, "result": result, "judgements": judgements,
            "device": ex.device}


def lost_payload(item, outcome: str, reason: str, detail: str | None = None, *, triage=None,
                 where: dict | None = None) -> Payload:
    """A payload for a case whose worker reported nothing: crashed, timeout, error, or a skip
    decided by pytest itself (a `skip` mark). A failing outcome is read under the run's triage
    files (``triage``, for the target ``where``: see triage_target), as an executed case's is."""
    stage = outcomes.failure_stage(outcome)
    if outcome == "skipped":
        judgements = [_judgement(o, outcome, reason, stage=stage) for o in item.occurrences]
        return {"outcome": outcome, "reason": reason, "result": None, "judgements": judgements}
    judgements = []
    for o, entry in zip(item.occurrences, triage_entries(item, triage, where)):
        if outcome == "xfailed":  # (pytest's own xfail mark: nothing to read)
            judgements.append(_judgement(o, outcome, reason, stage=stage))
            continue
        read = expected(triage, entry, outcome, reason, stage)
        judgements.append(_judgement(o, read.outcome, read.reason, stage=stage, triage=read.triage, where=read.where))
    first = min(judgements, key=lambda j: outcomes.severity(j["outcome"]))
    result = {"outcome": first["outcome"], "reason": first["reason"], "error_type": outcome, "error_message": reason,
              "traceback": detail, "stage": stage}
    return {"outcome": first["outcome"], "reason": first["reason"], "result": result, "judgements": judgements}


def triage_entries(item, triage, where: dict | None) -> list:
    """The triage entry (None: none) of each of the item's occurrences on the target ``where``."""
    if triage is None:
        return [None] * len(item.occurrences)
    return [triage.entry_for(triage_case(item, o), where) for o in item.occurrences]


def entries_timeout(entries) -> float | None:
    """The largest ``timeout`` the entries set (None: none sets one)."""
    found = [e.timeout for e in entries if e is not None and e.timeout]
    return max(found) if found else None


def failure_message(payload: Payload) -> str:
    """What the pytest report says for an unexpected outcome: every occurrence's verdict."""
    lines = []
    for j in payload["judgements"]:
        tol = f" (rtol={j['rtol']:g}, atol={j['atol']:g})" if j.get("rtol") is not None else ""
        lines.append(f"{j['outcome']}: {j['model']}::{j['name']}{tol}: {j['reason']}")
    r = payload.get("result") or {}
    if r.get("traceback") and payload["outcome"] == "error":
        lines.append(r["traceback"].rstrip())
    return "\n".join(lines)
