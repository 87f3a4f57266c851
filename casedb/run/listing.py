"""The plugin's listing options (--list-models, --list-cases, --list-cases-by-mark): print what the
DB holds and exit, running nothing."""

from __future__ import annotations

import re

from casedb.cases import marks as marks_mod
from casedb.console import clean
from casedb.names import model_mark
from casedb.run.session import MARK_GIVEN, NO_EXPR
from casedb.ingest.seed import open_seeded


def list_from_config(config) -> None:
    """Print what the session's listing options ask for."""
    opt = config.option
    models = opt.casedb_models or None
    by_mark = opt.casedb_list_cases_by_mark
    with open_seeded(config.option.casedb_db) as store:
        if opt.casedb_list_models:
            for m in store.models():
                print(clean(f"{m['name']}: {m['cases']} cases ({m['unique_cases']} unique), {m['ops']} ops"
                            f"{' — ' + m['source'] if m['source'] else ''}  [-m {model_mark(m['name'])}]"))
        rows = store.occurrences(models) if (opt.casedb_list_cases or by_mark is not None) else []
    if opt.casedb_list_cases:
        for r in rows:
            print(clean(f"{r['model']}::{r['name']}::{r['op']} ({_manifest_path(r['source'])})"))
    if by_mark is not None:
        expr = by_mark
        if expr == NO_EXPR:
            expr = opt.markexpr if config.stash.get(MARK_GIVEN, False) else marks_mod.DEFAULT_EXCLUDE
        matcher = marks_mod.MarkExpression(expr)
        excluded = opt.casedb_show_excluded
        picked = [r for r in rows if matcher.matches(list(r["marks"]) + [model_mark(r["model"])]) != excluded]
        what = "excluded by" if excluded else "selected by"
        print(f"cases {what} -m {expr!r}:")
        for r in picked:
            print(clean(f"{r['model']}::{r['name']}::{r['op']} [{', '.join(r['marks'])}]"))
        counts: dict[str, int] = {}
        for r in picked:
            for m in r["marks"] or ["(no marks)"]:
                counts[m] = counts.get(m, 0) + 1
        print(f"{len(picked)} of {len(rows)} cases {what} -m {expr!r}"
              + (" (" + ", ".join(f"{m}: {n}" for m, n in sorted(counts.items())) + ")" if counts else ""))


def _manifest_path(source: str | None) -> str:
    if not source:
        return "?"
    return re.sub(r":\d+$", "", source)

