"""What ``casedb run`` shows on the terminal: the progress bar, the summary tables and notes, the
``--json`` summary. Data in them goes through :mod:`casedb.console` (:func:`~casedb.console.text`)."""

from __future__ import annotations

from casedb import outcomes
from casedb.cases import marks as marks_mod
from casedb.console import text

JSON_KEYS = ("run_id", "status", "device", "backend", "judge", "values", "bias", "executed", "passed", "failed",
             "errors", "ref_errors",
             "not_exercised", "crashed", "timeouts", "skipped", "xfailed", "xpassed", "occurrences", "cases",
             "duplicates_skipped", "unexpected", "failures", "triage", "triage_files", "triage_implicit", "vacuous",
             "reference_faults", "latency",
             "lowering", "stages", "planned", "duration_s",
             "time", "session", "models", "error", "explanations")


def counts_text(counts: dict) -> str:
    """``3 passed 1 failed 2 xfailed`` as Rich markup, each in its outcome's colour (passed and
    failed always); outcome names and numbers only, no data."""
    parts = []
    for o in (outcomes.BY_NAME[name] for name in outcomes.SHOWN):
        n = counts.get(o.name, 0)
        if n or o.name in ("passed", "failed"):
            parts.append(f"[{o.style}]{n} {o.name}[/]")
    return " ".join(parts)


class Progress:
    """Rich progress for `casedb run`: bar, ETA, live counts (fed by the plugin's hooks)."""

    def __init__(self, console, enabled: bool):
        self.enabled = enabled
        self.console = console
        self.progress = None
        self.task = None
        self.counts: dict[str, int] = {}

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
        self.task = self.progress.add_task("run", total=total, run_id=figures.get("run_id"),
                                           counts=counts_text(self.counts))

    def pytest_casedb_recorded(self, config, outcome: str, item) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if self.progress is not None:
            self.progress.update(self.task, advance=1, counts=counts_text(self.counts))

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# short headers: the table fits 80 columns (the totals line spells every outcome out)
_HEADS = {"crashed": "crash", "timeout": "t/o", "error": "err", "failed": "fail", "xpassed": "xpass",
          "ref_error": "ref", "xfailed": "xfail", "passed": "pass", "skipped": "skip", "not_exercised": "n/e"}


def summary_tables(summary: dict):
    """(per-model table, totals line) for the terminal."""
    from rich import box
    from rich.table import Table

    table = Table(title=text(f"run {summary['run_id']}: {summary.get('device')} / {summary.get('backend')}"),
                  box=box.SIMPLE_HEAD, pad_edge=False)
    # passed and failed always; the other outcomes where some model has one (the totals line has all)
    shown = [o for o in outcomes.SHOWN if o in ("passed", "failed")
             or any(m.get(outcomes.COUNT_KEYS[o]) for m in summary["models"].values())]
    cols = [("occurrences", "occ")] + [(outcomes.COUNT_KEYS[o], _HEADS[o]) for o in shown]
    table.add_column("model", overflow="fold", min_width=min(24, max(5, *map(len, summary["models"] or ["model"]))))
    for _, head in cols:
        table.add_column(head, justify="right", no_wrap=True, min_width=len(head))
    for model, m in summary["models"].items():
        table.add_row(text(model), *[str(m.get(k, 0)) for k, _ in cols])
    t = summary["time"]
    counts = ", ".join(counted(summary.get(outcomes.COUNT_KEYS[o], 0), o) for o in outcomes.SHOWN)
    line = (f"{summary['executed']} executed ({summary['occurrences']} occurrences, "
            f"{summary['duplicates_skipped']} duplicates skipped): {counts}")
    times = []
    for k, label in (("ref_ms_per_case", "reference"), ("compile_ms_per_case", "compile"), ("exec_ms_per_case", "execute")):
        if t.get(k) is not None:
            times.append(f"{label} {t[k]:.1f} ms")
    if times:
        line += "; per case: " + ", ".join(times)
    if t.get("references_from_cache"):
        line += f"; {t['references_from_cache']} references from the cache"
    if t.get("inputs_from_cache"):
        line += f"; {t['inputs_from_cache']} inputs from the cache"
    if summary.get("duration_s") is not None:
        line += f"; total {summary['duration_s']:.1f} s"
    return table, text(line)


def counted(n: int, outcome: str) -> str:
    """``1 error``, ``2 errors``, ``3 failed``: a count of an outcome in words."""
    key = outcomes.COUNT_KEYS[outcome]
    return f"{n} {(outcome if n == 1 else key).replace('_', ' ')}"


def summary_notes(summary: dict) -> list[str]:
    """Hints printed after the summary: what was left out, how to go on."""
    notes = []
    planned = summary.get("planned") or {}
    opts = summary.get("options") or {}
    if planned.get("available") and planned["cases"] < planned["available"] and opts.get("markexpr") is None:
        notes.append(f"{planned['cases']} of {planned['available']} cases selected: the default marker filter "
                     f"(-m '{marks_mod.DEFAULT_EXCLUDE}') leaves out the rest unless -m is given (-m '' runs all)")
    notes.extend(failure_notes(summary))
    if summary.get("reference_faults"):
        notes.append(f"{summary['reference_faults']} case(s) where the CPU reference's NaN/inf are wrong and the "
                     f"target's agree with the upcast reference: judged against that one (their reason says where; "
                     f"casedb report --run {summary['run_id']})")
    if (lat := summary.get("latency")) and lat.get("measured"):
        notes.append(f"measured {lat['measured']} passed case(s) against {lat['baseline']}: geometric mean speedup "
                     f"{lat['speedup']}x, measuring took {lat['cost_s']} s (casedb report --run {summary['run_id']})")
    notes.append(triage_files_note(summary))
    t = summary.get("triage") or {}
    if any(t.get(k) for k in ("new", "regression", "known")):
        parts = [f"{t.get('new', 0)} new failures", f"{t.get('regression', 0)} regressions",
                 f"{t.get('known', 0)} known"]
        if t.get("remove"):  # (entries scoped to another target never apply: these name this one or none)
            parts.append(f"{t['remove']} known failures pass now on {summary.get('device')}/{summary.get('backend')} "
                         f"(remove their entries: casedb triage update --from-run {summary['run_id']})")
        elif t.get("new"):
            parts.append(f"record the new ones as known: casedb triage update --from-run {summary['run_id']}")
        notes.append("triage: " + ", ".join(parts))
    if summary.get("error"):
        notes.append(f"run {summary['run_id']}: {summary['error']}")
    if summary.get("status") != "finished":
        notes.append(f"run {summary['run_id']} is {summary.get('status')}: finish it with casedb run --resume {summary['run_id']}")
    return notes


def failure_notes(summary: dict, top: int = 5) -> list[str]:
    """What failed, grouped by cause (the biggest groups), and where to read the rest."""
    groups = summary.get("failures") or []
    if not groups:
        return []
    cases = sum(g["count"] for g in groups)
    lines = [f"{cases} failing case(s), {len(groups)} cause(s):"]
    for g in groups[:top]:
        example = f" (e.g. {g['examples'][0]}: {g['example_inputs'][0]})" if g.get("example_inputs") else \
            f" (e.g. {g['examples'][0]})" if g["examples"] else ""
        lines.append(f"  {g['count']:>4} × {g['op']}: {g['cause']}{example}")
    more = f"{len(groups) - top} more cause(s); " if len(groups) > top else ""
    lines.append(f"  {more}details: casedb report --run {summary['run_id']}")
    explained = summary.get("explanations")
    if explained is None:
        lines.append(f"  which condition breaks the backend: casedb explain --run {summary['run_id']}")
    for e in explained or []:
        lines.append(f"  explained: {e['cause']}: {(e.get('condition') or {}).get('text') or 'no condition found'}")
    return ["\n".join(lines)]


def triage_files_note(summary: dict) -> str:
    """Which triage files the run loaded, each with how: named by --triage, picked up from
    ./triage because none was named, or shipped with casedb's manifests."""
    from casedb.triage.files import shipped_paths

    files = summary.get("triage_files") or []
    if not files:
        return "triage files loaded: none (give --triage FILE, or put it in triage/*.yaml)"
    implicit = set(summary.get("triage_implicit") or ())
    shipped = {str(p.resolve()) for p in shipped_paths()}
    shown = []
    for p in files:
        how = (" (loaded implicitly from ./triage: --triage FILE chooses)" if p in implicit else
               " (shipped; --no-shipped-triage leaves it out)" if p in shipped else "")
        shown.append(_shown_path(p) + how)
    return "triage files loaded: " + ", ".join(shown)


def _shown_path(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    import os

    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def summary_json(summary: dict) -> dict:
    return {k: summary.get(k) for k in JSON_KEYS}
