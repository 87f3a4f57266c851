"""What one recorded run did with one case, for `casedb repro --run N`: its target (device,
backend), the --import modules it was recorded with (named, never imported: see casedb.read.repro;
written relative to the working directory: a script must not carry this machine's absolute
paths), its judge, high-precision reference dtype and values mode,
the tolerance it judged each dtype with (tolerance rules included: they are stored with the
result) and the outcome it recorded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from casedb.errors import CasedbError
from casedb.store.reads_run_results import case_judgement, case_result
from casedb.store.run_rows import get_run


def portable_import(name: str, cwd: Path | None = None) -> str:
    """An --import as a script may carry it: a module name as it is, a file relative to ``cwd``
    (the working directory)."""
    if not (name.endswith(".py") or os.sep in name or "/" in name):
        return name
    return os.path.relpath(Path(name).resolve(), (cwd or Path.cwd()).resolve())


def run_context(db, run_id: int, signature: str, occurrence: dict) -> dict:
    """What run ``run_id`` did with the case ``signature`` for ``occurrence`` (a store.find row):
    ``device``, ``backend``, ``imports``, ``judge``, ``reference_dtype``, ``values``,
    ``replace_device``, ``tolerances`` (dtype -> [rtol, atol], None when the run stored none),
    ``tolerance_note`` (where they came from), ``outcome`` (the occurrence's) and ``result_outcome``."""
    run = get_run(db, run_id, "--run")
    options = run["selection"].get("options") or {}
    result = case_result(db, run_id, signature)
    judged = case_judgement(db, run_id, signature, occurrence["model"])
    if result is None and judged is None:
        raise CasedbError(f"run {run_id} did not run case {signature[:16]} ({occurrence['model']}::"
                          f"{occurrence['name']}); see `casedb report --run {run_id}` for what it ran")
    metrics = _metrics(result[2] if result else None)
    tolerances, note = _tolerances(metrics, judged, occurrence)
    return {
        "device": run["device"], "backend": run["backend"],
        "imports": [portable_import(m) for m in options.get("imports") or []],
        "judge": (result[1] if result and result[1] else None) or options.get("judge"),
        "reference_dtype": metrics.get("reference_dtype") or options.get("reference_dtype"),
        "values": options.get("values") or "random",
        "replace_device": options.get("replace_device", True),
        "tolerances": tolerances, "tolerance_note": note,
        "outcome": judged[0] if judged else result[0], "result_outcome": result[0] if result else None,
    }


def _metrics(text) -> dict:
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _tolerances(metrics: dict, judged, occurrence: dict) -> tuple[dict | None, str]:
    """(dtype -> [rtol, atol] the run judged with, where they came from)."""
    stored = metrics.get("tolerances")
    if not isinstance(stored, dict) or not stored:
        return None, "the run stored no tolerance for this case (it did not compare results): the policy's, without tolerance rules"
    tols = {d: [float(t[0]), float(t[1])] for d, t in stored.items()}
    sources = {d: t[2] for d, t in stored.items() if len(t) > 2}
    if metrics.get("judged_for") != f"{occurrence['model']}::{occurrence['name']}" and judged is not None:
        # the result holds another occurrence's tolerances; this one's main dtype is in its judgement
        main = next(iter(tols))
        tols[main] = [float(judged[1]), float(judged[2])]
        sources[main] = "this occurrence's judgement"
    return tols, "the run's: " + "; ".join(f"{d}: {s}" for d, s in sources.items())
