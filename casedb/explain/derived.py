"""A smallest failing case kept as a derived case: an occurrence of the model ``derived`` (so
`casedb run --model derived`, `casedb export` and `casedb repro` take it like any other case)
with its lineage: the parent's signature and each change that made it (table ``derived_cases``).
"""

from __future__ import annotations

import shlex

from casedb.cases import spec as casespec
from casedb.cases.layout import input_label
from casedb.explain.dims import tensor_inputs
from casedb.explain.minimal import elements
from casedb.explain.rounds import SOURCE, _manifest_case
from casedb.store import explanations as stored
from casedb.store.database import ModelInfo, Occurrence, Store

MODEL = "derived"


def store(db_path, run: dict, cause: str, parent: dict, found: dict) -> dict:
    """Save ``found["case"]`` (derived from ``parent`` by ``found["steps"]``) of run ``run`` (its
    runs row); returns the JSON of the minimal case: signature, inputs, parent, transformation,
    elements, repro (the command reproducing it on the run's target)."""
    run_id = run["id"]
    case = found["case"]
    why = (f"smallest failing case of run {run_id} ({cause}), derived from {parent['signature'][:12]} by: "
           + "; ".join(found["steps"]))
    norm = casespec.normalize_case(_manifest_case({**case, "description": why}, 0), {}, where="casedb explain")
    name = f"min-{parent['signature'][:8]}-{norm.signature[:8]}"
    with Store(db_path) as s:
        s.save([ModelInfo(MODEL, source=SOURCE, description="the smallest failing cases casedb explain found; "
                                                           "lineage: table derived_cases")],
               [Occurrence(model=MODEL, case=norm, name=name, source=f"casedb explain --run {run_id}")])
        stored.save_lineage(s.conn, norm.signature, parent["signature"], found["steps"], run_id, cause)
    return {"signature": norm.signature, "inputs": [input_label(t) for _, t in tensor_inputs(case)],
            "name": f"{MODEL}::{name}", "parent": parent["signature"], "transformation": found["steps"],
            "elements": elements(case), "parent_elements": elements(parent),
            "repro": repro_command(norm.signature, run)}


def repro_command(signature: str, run: dict) -> str:
    """``casedb repro SIG --device D --backend B --import M``: the case on the run's target (the
    run itself never ran a derived case, so ``--run`` cannot name it)."""
    options = (run.get("selection") or {}).get("options") or {}
    words = ["casedb", "repro", signature[:12]]
    for flag, value in (("--device", run.get("device")), ("--backend", run.get("backend"))):
        if value:
            words += [flag, value]
    for module in options.get("imports") or []:
        words += ["--import", module]
    return " ".join(shlex.quote(w) for w in words)
