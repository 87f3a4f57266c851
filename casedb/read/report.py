"""`casedb report`: the RFC's metrics for one run, from the SQL views (casedb/store/migrations.py).

Pass rate per model and per op, coverage (ops and input signatures per model, the share of a
model's ops that pass), dedupe efficiency (occurrences judged vs cases executed), runtime split
into reference / compile / device, the trend over the last runs of the same device and backend,
and a comparison with a baseline run: regressions, fixes, error growth, and xfail marks to remove.
Every figure comes from a view that Datasette (`casedb serve`) shows too.
"""

from __future__ import annotations

from typing import Any, Callable

from casedb import outcomes
from casedb.errors import CasedbError
from casedb.escape import markdown, markdown_code
from casedb.read import coverage as predicted, expected_errors, latency
from casedb.store import explanations, reads_report as reads
from casedb.store.run_figures import failure_groups, run_counts
from casedb.store.run_rows import get_run

DEFAULT_ERROR_FACTOR = 10.0
DEFAULT_TREND = 5
DEFAULT_LIMIT = 20

# the outcome counts, in the order and under the names `casedb run` prints them
_COUNTED = tuple(outcomes.COUNT_KEYS[o] for o in outcomes.SHOWN)


def latest_run_id(db) -> int:
    """Id of the newest full run: not a `casedb mutants` run, nor a partial rerun of an earlier
    run (pytest --lf; casedb.store.run_scope); the newest run where there are only those; a
    CasedbError that says how to record one when there is none."""
    run_id = reads.latest_run_id(db)
    if run_id is None:
        raise CasedbError("no runs recorded in this database yet; record one with "
                          "`casedb run --model <model>` (see `casedb models`), then run `casedb report`")
    return run_id


def _check_run(db, run_id: int, what: str) -> None:
    get_run(db, run_id, what)


def build(db, run: int | None = None, compare: int | None = None, *,
          error_factor: float = DEFAULT_ERROR_FACTOR, trend: int = DEFAULT_TREND, top: int = 10,
          latency_threshold: float = latency.DEFAULT_THRESHOLD) -> dict:
    """The report of run `run` (default: the latest) as plain data (what `--json` prints).

    `compare` is the baseline run; by default the previous run on the same device and backend
    (none for a first run). `error_factor`: list cases whose max abs error grew more than this.
    `trend`: how many runs of the same device/backend the trend shows. `top`: slowest cases.
    `latency_threshold`: the relative latency change (0.10: 10 %) a case must exceed to be listed.
    """
    if error_factor <= 1:
        raise CasedbError(f"--error-factor must be greater than 1, not {error_factor}")
    if not 0 < latency_threshold < 10:
        raise CasedbError(f"--latency-threshold takes a percentage above 0 and below 1000, not {latency_threshold * 100:g}")
    run_id = latest_run_id(db) if run is None else run
    _check_run(db, run_id, "--run")
    summary = reads.run_summary(db, run_id)
    compare, baseline_source = _baseline_run(db, run_id, compare)
    report = _summary(summary)
    report["totals"] = _totals(run_counts(db, run_id))
    report["runtime"] = _runtime(db, summary, run_id, top)
    report.update(_verdicts(db, run_id))
    report.update(_comparison(db, run_id, compare, baseline_source, error_factor))
    report["error_factor"] = error_factor
    report["trend"] = reads.trend(db, summary["device"], summary["backend"], run_id, trend)
    report["coverage"] = predicted.section(db.conn, report["run"], report["models"])  # None: never measured
    report["latency"] = latency.section(db, run_id, compare, latency_threshold)
    report["explanations"] = explanations.load(db, run_id)  # None: casedb explain never ran on it
    return report


def _baseline_run(db, run_id: int, compare: int | None) -> tuple[int | None, str]:
    """(the run to compare with, where it came from): --compare, else the previous run on the
    same device and backend (None for a first run)."""
    if compare is None:
        return reads.previous_run(db, run_id), "previous run on the same device and backend"
    if compare == run_id:
        raise CasedbError(f"--compare {compare} is the run being reported; give an earlier (or another) run")
    _check_run(db, compare, "--compare")
    return compare, "--compare"


def _totals(counts: dict) -> dict:
    """The run's totals as `casedb run` counts them (casedb.store.run_figures.run_counts): cases
    executed, each outcome under its summary name, the occurrences judged, the pass rate."""
    return {k: counts[k] for k in ("executed", *_COUNTED, "occurrences", "pass_rate")}


def _summary(summary: dict) -> dict[str, Any]:
    occurrences, executions = summary["occurrences"] or 0, summary["executions"]
    report: dict[str, Any] = {
        "run": {k: summary[k] for k in ("run_id", "started_at", "finished_at", "status", "device", "backend",
                                        "torch_version")},
        "dedupe": {
            "occurrences": occurrences,
            "executions": executions,
            "saved": summary["dedupe_saved"] or 0,
            # occurrences judged per case executed: 1.0 means nothing was shared
            "ratio": round(occurrences / executions, 3) if executions else None,
        },
    }
    return report


def _runtime(db, summary: dict, run_id: int, top: int) -> dict:
    t = {k: summary[k] or 0.0 for k in ("t_ref", "t_compile", "t_exec")}
    total = sum(t.values())
    return {**t, "total": round(total, 6),
            "mean_per_case": round(total / summary["executions"], 6) if summary["executions"] else None,
            "slowest": reads.slowest_cases(db, run_id, top)}


def _verdicts(db, run_id: int) -> dict:
    """The run's own lists: per model and op, failures, xpasses, what proves nothing, lowering,
    failure stages and what blocks what."""
    out: dict[str, Any] = {}
    coverage = reads.model_coverage(db)
    models = reads.model_pass_rates(db, run_id)
    for m in models:
        m["signatures"] = coverage.get(m["model"], {}).get("signatures")
    out["models"] = models
    out["ops"] = reads.op_pass_rates(db, run_id)
    out["causes"] = failure_groups(db.conn, run_id)
    out["failures"] = _judged_outputs(db, run_id, reads.failing_verdicts(db, run_id))
    # tt-xla's triage rule: a case marked xfail that passes should lose its mark.
    out["remove_xfail"] = reads.xpassed_verdicts(db, run_id)
    # What proves nothing: cases the target never computed, and cases whose reference a
    # trivial target (all zeros, one value) would match.
    out["unproven"] = reads.unproven_cases(db, run_id)
    out["vacuous"] = sum(1 for r in out["unproven"] if r["why"].startswith("vacuous"))
    # where the CPU reference's NaN/inf are wrong and the target agrees with the upcast reference
    out["reference_faults"] = reads.reference_faults(db, run_id)
    out["lowering"] = reads.op_lowering(db, run_id)
    out["stages"] = reads.stage_counts(db, run_id)
    # What blocks what: ops by the models they block; the model x op counts of those ops.
    out["blocking"] = reads.op_blocking(db, run_id)
    out["blocking_matrix"] = reads.blocking_matrix(db, run_id)
    expected_errors.adjust(out, reads.expected_error_counts(db.conn, run_id))
    return out


def _judged_outputs(db, run_id: int, rows: list[dict]) -> list[dict]:
    """Failure rows with the dtype of the output the judge read (the first whose tolerance the
    result records: a float32 output of a bf16 case is judged as float32) and the pattern of a
    wrong result (casedb.judge.pattern: "all zeros" says more than "max rel err 1")."""
    import json

    facts = {}
    for sig, tolerances, pattern in reads.judged_outputs(db, run_id):
        dtypes = list(json.loads(tolerances)) if tolerances else []
        facts[sig] = (dtypes[0] if dtypes else None, pattern)
    for r in rows:
        dtype, pattern = facts.get(r.pop("signature"), (None, None))
        r["dtype"], r["pattern"] = dtype or r["dtype"], pattern
    return rows


def _comparison(db, run_id: int, compare: int | None, source: str, error_factor: float) -> dict:
    """The baseline and what changed against it: regressions, fixes, errors that grew."""
    out: dict[str, Any] = {"baseline": None, "regressions": [], "fixes": [], "error_growth": []}
    if compare is None:
        return out
    out["baseline"] = {**reads.baseline_row(db, compare), "source": source}
    out["regressions"] = reads.regressions(db, run_id, compare)
    out["fixes"] = reads.fixes(db, run_id, compare)
    out["error_growth"] = reads.error_growth(db, run_id, compare, error_factor)
    return out


# ----------------------------------------------------------------------------------- rendering

def _num(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e5 else f"{v:.4g}"
    return str(v)


def _pct(v) -> str:
    return "" if v is None else f"{v:.1f}%"


def _case(r: dict) -> str:
    return f"{r['model']}::{r['case_name']}"


def _gist(msg: str | None) -> str:
    """The line of an error that says what went wrong: a table row per case (--json keeps the whole)."""
    from casedb.causes import first_error_line

    return first_error_line(None, msg, None) if msg else ""


def _seconds(v) -> str:
    return "" if v is None else f"{v:.3f} s"


def sections(report: dict, limit: int = DEFAULT_LIMIT) -> list[dict]:
    """The report as titled tables (title, headers, rows, note): what the text and Markdown
    renderers both print, so they cannot disagree. At most `limit` rows per list."""
    out = []

    def table(title, headers, rows, fmt, note=None, empty=None, inline=False):
        rows = list(rows)
        if not rows and empty is None:
            return
        shown = [fmt(r) for r in rows[:limit]]
        more = f"... and {len(rows) - limit} more (see --json)" if len(rows) > limit else None
        out.append({"title": title, "headers": headers, "rows": shown, "inline": inline,
                    "note": " ".join(x for x in (note, more, empty if not rows else None) if x)})

    for part in (_pass_rate_tables, predicted.tables, _comparison_tables, _failure_tables, _blocking_tables,
                 _proof_and_time_tables):
        part(table, report)
    latency.tables(table, report.get("latency"))
    return out


def _pass_rate_tables(table: Callable, report: dict) -> None:
    """Totals, per model, per op."""
    tot = report["totals"]
    table("Totals", ["pass rate", "executed", *(k.replace("_", " ") for k in _COUNTED), "vacuous", "occurrences"],
          [tot], lambda r: [_pct(r["pass_rate"]), *(_num(r[k]) for k in ("executed", *_COUNTED)),
                            _num(report["vacuous"]), _num(r["occurrences"])],
          note="cases, as `casedb run` counts them; pass rate = (passed + xpassed) / (passed, xpassed, failed, "
               "errors, crashed, timeouts, xfailed)", inline=True)
    table("Pass rate and coverage per model",
          ["model", "pass rate", "passed/executed", "failed", "errors", "xfailed", "skipped", "ops passing",
           "signatures"],
          report["models"],
          lambda r: [r["model"], _pct(r["pass_rate"]), f"{r['passed']}/{r['executed']}", _num(r["failed"]),
                     _num(r["errors"]), _num(r["xfailed"]), _num(r["skipped"]),
                     f"{r['ops_passing']}/{r['ops']} ({_pct(r['ops_pass_rate'])})", _num(r["signatures"])],
          note="ops passing: ops whose every executed occurrence passed; signatures: distinct cases the model has")
    table("Pass rate per op (worst first)",
          ["op", "pass rate", "passed/executed", "failed", "errors", "xfailed", "models"], report["ops"],
          lambda r: [r["op"], _pct(r["pass_rate"]), f"{r['passed']}/{r['executed']}", _num(r["failed"]),
                     _num(r["errors"]), _num(r["xfailed"]), _num(r["models"])])


def _comparison_tables(table: Callable, report: dict) -> None:
    """Against the baseline run: regressions, fixes, errors that grew."""
    base = report["baseline"]
    if base is None:
        table("Comparison", [], [], None, empty="no baseline: this is the first run on its device and backend "
                                                 "(use --compare RUN)")
    else:
        vs = f"vs run {base['run_id']} ({base['device']}/{base['backend']}, {base['source']})"
        change_headers = ["case", "op", "inputs", "before", "now", "max abs err before", "now", "error"]

        def change(r):
            return [_case(r), r["op"], r["inputs"], r["base_outcome"], r["outcome"], _num(r["base_max_abs_err"]),
                    _num(r["max_abs_err"]), _gist(r["error_message"])]

        table(f"Regressions {vs}", change_headers, report["regressions"], change, empty="none")
        table(f"Fixes {vs}", change_headers, report["fixes"], change, empty="none")
        table(f"Error grew more than {report['error_factor']:g}x {vs}",
              ["case", "op", "inputs", "before", "now", "max abs err before", "now", "growth"],
              report["error_growth"],
              lambda r: [_case(r), r["op"], r["inputs"], r["base_outcome"], r["outcome"], _num(r["base_max_abs_err"]),
                         _num(r["max_abs_err"]), f"{r['err_growth']:.3g}x"], empty="none")


def _failure_tables(table: Callable, report: dict) -> None:
    """Xpasses to unmark, failures and their stages."""
    table("Remove xfail (marked xfail, now passing)", ["case", "op", "inputs", "repro"], report["remove_xfail"],
          lambda r: [_case(r), r["op"], r["inputs"], r["repro"]])
    table("Failures by cause", ["cases", "op", "cause", "e.g."], report.get("causes") or [],
          lambda r: [_num(r["count"]), r["op"], r["cause"], ", ".join(r["examples"])], empty="none")
    table("Failures", ["case", "op", "inputs", "output dtype", "outcome", "stage", "error", "repro"], report["failures"],
          lambda r: [_case(r), r["op"], r["inputs"], r["dtype"] or "", r["outcome"], r["stage"] or "",
                     _gist(r["error_message"] or r["reason"]) + (f" ({r['pattern']})" if r.get("pattern") else ""),
                     r["repro"]])
    table("Failure stages", ["stage", "cases"], report["stages"], lambda r: [r["stage"], _num(r["cases"])],
          note="where the cases that did not pass went wrong")
    if report.get("explanations") is not None:
        table("Explained (casedb explain)", ["cause", "cases", "condition", "layer", "smallest failing case"],
              report["explanations"],
              lambda r: [r["cause"], _num(r["cases"]), (r.get("condition") or {}).get("text") or "none found",
                         r.get("layer") or "", (r.get("minimal") or {}).get("repro") or ""],
              empty="nothing to explain", note="which condition breaks the backend, per failure cause")


def _blocking_tables(table: Callable, report: dict) -> None:
    """Which ops block which models."""
    blocking = report.get("blocking") or []
    table("What blocks what: ops by the models they block", ["op", "models blocked", "of models calling it",
                                                               "unblocks", "failing cases", "blocked models"],
          blocking, lambda r: [r["op"], _num(r["models_blocked"]), _num(r["models"]), _num(r["unblocks"]),
                               f"{r['failing']}/{r['occurrences']}", r["blocked_models"] or ""],
          note="a model is blocked by an op when any of its cases of that op fails (xfailed included); "
               "unblocks: models this op alone blocks")
    if blocking:
        cells = {(r["op"], r["model"]): r for r in report.get("blocking_matrix") or []}
        models = sorted({m for _, m in cells})
        table("Model x op: failing/occurrences (blocking ops)", ["op", *models], blocking,
              lambda r: [r["op"], *(f"{cells[r['op'], m]['failing']}/{cells[r['op'], m]['occurrences']}"
                                    if (r["op"], m) in cells else "" for m in models)],
              note="empty: the model does not call the op")


def _proof_and_time_tables(table: Callable, report: dict) -> None:
    """What proves nothing, lowering, dedupe and runtime, the trend."""
    table("Proves nothing (not exercised, or a vacuous reference)", ["op", "inputs", "why", "models"],
          report["unproven"], lambda r: [r["op"], r["inputs"], r["why"], r["models"] or ""],
          note="vacuous: the reference is all zeros or one value, so a target returning that passes; "
               "not exercised: the target never computed the op")
    table("Where the CPU reference is wrong (NaN/inf)", ["op", "inputs", "elements", "outcome", "models"],
          report["reference_faults"], lambda r: [r["op"], r["inputs"], _num(r["elements"]), r["outcome"],
                                                 r["models"] or ""],
          note="elements where the CPU reference's NaN/inf disagree with the upcast (float64) reference's and "
               "the target's agree: judged against the upcast reference, not counted against the target")
    table("Lowering per op (inductor)", ["op", "cases", "generated", "extern", "fallback", "mixed", "no kernel",
                                         "% generated"], report["lowering"],
          lambda r: [r["op"], _num(r["cases"]), _num(r["generated"]), _num(r["extern"]), _num(r["fallback"]),
                     _num(r["mixed"]), _num(r["no_kernel"]), _pct(r["generated_pct"])],
          note="generated: inductor wrote the kernel; extern: a library kernel (mm, conv); fallback: the ATen op")
    d, rt = report["dedupe"], report["runtime"]
    table("Dedupe and runtime", ["occurrences", "executed cases", "saved by dedupe", "reference", "compile",
                                 "device", "total", "mean per case"], [None],
          lambda _: [_num(d["occurrences"]), _num(d["executions"]), _num(d["saved"]), _seconds(rt["t_ref"]),
                     _seconds(rt["t_compile"]), _seconds(rt["t_exec"]), _seconds(rt["total"]),
                     _seconds(rt["mean_per_case"])], inline=True)
    table("Slowest cases", ["op", "inputs", "models", "outcome", "reference", "compile", "device", "total"],
          rt["slowest"],
          lambda r: [r["op"], r["inputs"], r["models"] or "", r["outcome"], _seconds(r["t_ref"]),
                     _seconds(r["t_compile"]), _seconds(r["t_exec"]), _seconds(r["t_total"])])
    table(f"Trend: last runs on {report['run']['device']}/{report['run']['backend']}",
          ["run", "started", "status", "pass rate", "passed/executed", "failed", "errors", "new regressions"],
          report["trend"],
          lambda r: [str(r["run_id"]), r["started_at"] or "", r["status"] or "", _pct(r["pass_rate"]),
                     f"{r['passed'] or 0}/{r['executed'] or 0}", _num(r["failed"]), _num(r["errors"]),
                     _num(r["new_regressions"])])


def _title(report: dict) -> str:
    r = report["run"]
    return (f"casedb run {r['run_id']}: {r['device']}/{r['backend']}, {r['status']}, started {r['started_at']}, "
            f"torch {r['torch_version']}")


def to_markdown(report: dict, limit: int = DEFAULT_LIMIT) -> str:
    """A summary for a CI job page (GitHub step summary and the like). Every title, header, cell
    and note is data, escaped (casedb.escape): nothing in a name makes a heading, ends a table
    or hides what follows."""

    def cell(v) -> str:
        text = str(v)
        return markdown_code(text) if text.startswith("casedb repro ") else markdown(text)

    lines = [f"## {markdown(_title(report))}", ""]
    for s in sections(report, limit):
        lines.append(f"### {markdown(s['title'])}")
        lines.append("")
        if s["rows"]:
            lines.append("| " + " | ".join(markdown(h) for h in s["headers"]) + " |")
            lines.append("|" + "---|" * len(s["headers"]))
            lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in s["rows"]]
            lines.append("")
        if s["note"]:
            lines += [f"_{markdown(s['note'])}_", ""]
    return "\n".join(lines)


def print_report(report: dict, console, limit: int = DEFAULT_LIMIT) -> None:
    """The report as rich tables on `console` on a terminal; in a pipe, each table as plain
    tab-separated rows under its title (casedb.read.tables), so a row is one line."""
    from rich.table import Table
    from rich.text import Text

    from casedb.read import tables
    from casedb.console import text

    plain = tables.resolve(None, console) is not tables.Format.table
    # Text, never markup: names and messages print as written (control characters escaped);
    # soft_wrap: a line is never folded at the console's width
    console.print(Text(_title(report), style="bold"), highlight=False, soft_wrap=True)
    for s in sections(report, limit):
        if not s["rows"]:
            console.print(Text.assemble((s["title"], "bold"), f": {s['note']}"), highlight=False, soft_wrap=True)
            continue
        if s["inline"]:  # one row: a line of "name value" pairs reads better than a table
            pairs = " · ".join(f"{h} {v}" for h, v in zip(s["headers"], s["rows"][0]))
            console.print(Text.assemble((s["title"], "bold"), f": {pairs}"), highlight=False, soft_wrap=True)
            if s["note"]:
                console.print(Text(f"  {s['note']}", style="dim"), highlight=False, soft_wrap=True)
            continue
        if plain:
            console.print(Text(s["title"], style="bold"), highlight=False, soft_wrap=True)
            columns = [str(i) for i in range(len(s["headers"]))]
            tables.emit([dict(zip(columns, row)) for row in s["rows"]], columns, console=console,
                        fmt=tables.Format.plain, headers=dict(zip(columns, s["headers"])))
            if s["note"]:
                console.print(Text(f"  {s['note']}", style="dim"), highlight=False, soft_wrap=True)
            continue
        table = Table(title=Text(s["title"]), title_justify="left", caption=Text(s["note"]) if s["note"] else None,
                      caption_justify="left")
        for i, h in enumerate(s["headers"]):
            # the first column names the row (case, model, op), as does any op column: whole; the others fold
            whole = tables.whole_width(h, [str(row[i]) for row in s["rows"]]) if i else None
            table.add_column(h, overflow="fold", no_wrap=i == 0 or whole is not None, min_width=whole)
        for row in s["rows"]:
            table.add_row(*(text(v) for v in row))
        console.print(table)
