"""Which part of casedb may import which: the layering as data. tests/test_structure.py checks
every import of every module against it (imports through a package's ``__init__`` included:
``from casedb.triage import load`` is an import of the module defining ``load``);
docs/architecture.md says what each part holds.

A part is a subpackage, the ``importers`` package, or ``casedb``: the top level's shared words
(``errors``, ``outcomes``, ``names``, ``console``, ``files``...), which import the standard
library alone when they are imported (``console`` reaches Rich inside its functions). A module
imports its own part freely. No part may import a part that may import it, and nothing but a
front end imports a front end.
"""

from __future__ import annotations

TOP = "casedb"

# part -> the parts it may import (besides itself); the order is the way data flows, bottom up
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    TOP: (),
    "casedb.cases": (TOP,),
    "importers": (TOP, "casedb.cases"),
    "casedb.store": (TOP, "casedb.cases"),
    "casedb.ingest": (TOP, "casedb.cases", "importers", "casedb.store"),
    "casedb.judge": (TOP, "casedb.cases"),
    "casedb.triage": (TOP, "casedb.cases", "importers", "casedb.store", "casedb.judge"),
    "casedb.run": (TOP, "casedb.cases", "casedb.store", "casedb.ingest", "casedb.judge", "casedb.triage"),
    "casedb.read": (TOP, "casedb.cases", "importers", "casedb.store", "casedb.ingest", "casedb.judge",
                    "casedb.triage", "casedb.run", "casedb.coverage"),
    "casedb.scan": (TOP, "casedb.cases", "importers", "casedb.store", "casedb.ingest", "casedb.read"),
    "casedb.mutation": (TOP, "casedb.cases", "casedb.store", "casedb.ingest", "casedb.judge", "casedb.triage",
                        "casedb.run"),
    # casedb coverage: which cases a target can run, traced on the CPU, checked against a run
    "casedb.coverage": (TOP, "casedb.cases", "casedb.store", "casedb.ingest", "casedb.judge", "casedb.triage",
                        "casedb.run"),
    # casedb explain: variants of failing cases run through the runner, read like a report
    "casedb.explain": (TOP, "casedb.cases", "casedb.store", "casedb.ingest", "casedb.judge", "casedb.triage",
                       "casedb.run", "casedb.read"),
}

# The front ends: they may import any part; no part imports them.
FRONT_ENDS = ("casedb.cli", "casedb.pytest_plugin", "casedb.__main__")

