"""The coverage part of `casedb report`: the newest `casedb coverage` stored for the run's device
and backend (casedb.store.coverage), per model beside the run's pass rate, its missing kernels
ranked, and how the run agrees with the prediction (casedb.coverage.agreement: a case predicted
blocked must fail with torch's "Could not run 'aten::X'", and only those)."""

from __future__ import annotations

from typing import Callable

from casedb.coverage import agreement
from casedb.store import coverage as stored


def section(conn, run: dict, models: list[dict]) -> dict | None:
    """The ``coverage`` object of a report of ``run`` (its id, device, backend) whose per-model
    pass rates are ``models``; None when no coverage of that target is stored."""
    cid = stored.newest(conn, run["device"], run["backend"])
    if cid is None:
        return None
    cov = stored.load(conn, cid)
    rates = {m["model"]: m for m in models}
    rows = [{**m, **{k: rates[m["model"]].get(k) for k in ("pass_rate", "executed", "passed")}}
            for m in cov["models"] if m["model"] in rates]
    against = agreement.compare(run["run_id"], agreement.errors_by_case(conn, run["run_id"]), cov["cases"])
    return {k: cov[k] for k in ("id", "created_at", "device", "dispatch_key", "backend", "fallback", "target_problem",
                                "selection")} | {"totals": cov["totals"], "models": rows, "missing": cov["missing"],
                                                 "against_run": against}


def _pct(v) -> str:
    return "" if v is None else f"{v:.1f}%"


def _of(r: dict, part: str, whole: str, pct: str) -> str:
    return f"{r[part]}/{r[whole]} ({_pct(r[pct])})"


def tables(table: Callable, report: dict) -> None:
    """The coverage tables of casedb.read.report.sections (nothing when none is stored)."""
    cov = report.get("coverage")
    if cov is None:
        return
    a = cov["against_run"]
    agrees = (f"this run agrees on {a['agree']}/{a['compared']} cases ({_pct(a['agree_pct'])})" if a["compared"]
              else "none of its cases ran in this run")
    table(f"Coverage predicted for {cov['device']}/{cov['backend']} (casedb coverage {cov['id']}, "
          f"{cov['created_at']})",
          ["model", "pass rate", "cases enabled", "ops enabled (torch)", "aten ops enabled", "untraced"],
          cov["models"],
          lambda r: [r["model"], _pct(r["pass_rate"]), _of(r, "enabled_cases", "traced", "enabled_cases_pct"),
                     _of(r, "enabled_ops", "ops", "enabled_ops_pct"),
                     _of(r, "enabled_aten_ops", "aten_ops", "enabled_aten_ops_pct"), str(r["untraced"])],
          note=f"enabled: the target has a kernel for every aten operator a case sends (dispatch key "
               f"{cov['dispatch_key']}), measured before running; ops enabled (torch) is the RFC's % of enabled "
               f"OpFuncs; {agrees}", empty="none of this run's models")
    table(f"Missing kernels (casedb coverage {cov['id']})", ["kernel", "cases blocked", "unblocks alone", "models",
                                                              "ops"], cov["missing"],
          lambda r: [r["kernel"], str(r["cases"]), str(r["unblocks"]), ", ".join(r["models"]),
                     ", ".join(r["ops"][:4])], empty="none")
    table("Coverage against this run: cases that disagree", ["op", "case", "predicted missing", "outcome",
                                                             "run's missing kernel"], a["disagree"],
          lambda r: [r["op"], r["signature"][:16], ", ".join(r["predicted_missing"]) or "none", r["outcome"],
                     r["run_missing"] or "none"])
