"""A coverage report as text on a terminal."""

from __future__ import annotations

from casedb.console import clean


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1f}%"


def print_report(report: dict, console, *, limit: int = 20) -> None:
    """Per model the enabled cases, ops and aten operators; the missing kernels ranked."""
    say = lambda text: console.print(clean(text), highlight=False, soft_wrap=True)  # noqa: E731
    fallback = " (the key has a backend fallback: every operator runs)" if report["fallback"] else ""
    say(f"coverage of {report['device']} (dispatch key {report['dispatch_key']}), backend {report['backend']}"
        f"{fallback}")
    if report.get("target_problem"):
        say(f"the target cannot compile: {report['target_problem']}")
    say("model\tcases enabled\tops enabled (torch)\taten ops enabled\tuntraced")
    for r in [*report["models"], report["totals"]]:
        say(f"{r['model']}\t{r['enabled_cases']}/{r['traced']} ({_pct(r['enabled_cases_pct'])})\t"
            f"{r['enabled_ops']}/{r['ops']} ({_pct(r['enabled_ops_pct'])})\t"
            f"{r['enabled_aten_ops']}/{r['aten_ops']} ({_pct(r['enabled_aten_ops_pct'])})\t{r['untraced']}")
    if report["missing"]:
        say("missing kernels (by the cases they block)")
        say("kernel\tcases\tunblocks alone\tmodels\tops")
        for m in report["missing"][:limit]:
            say(f"{m['kernel']}\t{m['cases']}\t{m['unblocks']}\t{', '.join(m['models'])}\t{', '.join(m['ops'][:4])}")
    else:
        say("missing kernels: none")
    if report.get("coverage_id") is not None:
        say(f"stored as coverage {report['coverage_id']}: casedb report shows it beside the pass rates of runs on "
            f"{report['device']}/{report['backend']}")
    a = report.get("against")
    if a:
        say(f"against run {a['run']}: {a['agree']}/{a['compared']} cases agree ({_pct(a['agree_pct'])})")
        for d in a["disagree"][:limit]:
            say(f"  {d['op']} {d['signature'][:16]}: predicted missing {d['predicted_missing'] or 'none'}, "
                f"run {d['outcome']} ({d['run_missing'] or 'no missing kernel'})")
