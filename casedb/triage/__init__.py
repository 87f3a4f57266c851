"""Known failures: triage files (the format: :mod:`.entries`), their loading and checks (:mod:`.files`,
:mod:`.checks`), what they say of a case (:mod:`.entries`), updates from a run (:mod:`.update`,
:mod:`.editor`) and the RFC import (:mod:`.rfc`). The names the rest of casedb uses, handed on."""

import importlib

# Each name's module, imported on first use (PEP 562): every pytest session imports the plugin,
# which reaches this package, and must not pay for the store (sqlite-utils) unless it runs cases.
_HOME = {
    "check": "checks", "require_clean": "checks",
    "MAX_ITEMS": "entries", "STATUSES": "entries", "TARGET_KEYS": "entries", "Entry": "entries",
    "Triage": "entries", "verdict": "entries",
    "Problem": "files", "default_paths": "files", "implicit_paths": "files", "load": "files", "run_paths": "files", "shipped_paths": "files",
    "occurrences": "reading", "run_target": "reading",
    "import_rfc": "rfc",
    "Proposal": "update", "file_to_edit": "update", "first_error_line": "update", "propose": "update",
    "scope_keys": "update", "update_from_run": "update",
}


def __getattr__(name: str):
    if name == "literal":
        from casedb.judge.selectors import literal

        return literal
    if name not in _HOME:
        raise AttributeError(f"module 'casedb.triage' has no attribute {name!r}")
    return getattr(importlib.import_module(f"casedb.triage.{_HOME[name]}"), name)


__all__ = ["MAX_ITEMS", "STATUSES", "TARGET_KEYS", "Entry", "Problem", "Proposal", "Triage", "check", "default_paths",
           "file_to_edit", "first_error_line", "implicit_paths", "import_rfc", "literal", "load", "occurrences", "propose",
           "require_clean", "run_paths", "run_target", "scope_keys", "shipped_paths", "update_from_run", "verdict"]
