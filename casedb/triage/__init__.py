"""Known failures: triage files (the format: :mod:`.entries`), their loading and checks (:mod:`.files`,
:mod:`.checks`), what they say of a case (:mod:`.entries`), updates from a run (:mod:`.update`,
:mod:`.editor`) and the RFC import (:mod:`.rfc`). The names the rest of casedb uses, handed on."""

from casedb.triage.checks import check, require_clean
from casedb.triage.entries import (MAX_ITEMS, STATUSES, TARGET_KEYS, Entry, Triage, verdict)
from casedb.triage.files import Problem, default_paths, load, run_paths, shipped_paths
from casedb.triage.reading import occurrences, run_target
from casedb.triage.rfc import import_rfc
from casedb.judge.selectors import literal
from casedb.triage.update import Proposal, file_to_edit, first_error_line, propose, scope_keys, update_from_run

__all__ = ["MAX_ITEMS", "STATUSES", "TARGET_KEYS", "Entry", "Problem", "Proposal", "Triage", "check", "default_paths",
           "file_to_edit", "first_error_line", "import_rfc", "literal", "load", "occurrences", "propose",
           "require_clean", "run_paths", "run_target", "scope_keys", "shipped_paths", "update_from_run", "verdict"]
