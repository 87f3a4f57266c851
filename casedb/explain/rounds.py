"""Running a round of variants through the normal runner: the variants are saved as the
occurrences of the model ``explain-variants`` (each with its parent's tolerances), one pytest
session runs them (:func:`casedb.run.runner._session`: worker isolation, timeouts, the reference
cache) on the explained run's target, without triage files, into a run of its own; their outcome
and cause are read back, and that run, the occurrences and the cases nothing else uses are
removed. The judge is the one every run uses: nothing is judged here.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from casedb.cases import spec as casespec
from casedb.errors import InputError
from casedb.run import runner
from casedb.run.console import Progress
from casedb.run.runspec import SELECTION_VERSION, RunSpec
from casedb.store import explanations as stored
from casedb.store.run_lifecycle import start_run
from casedb.store.run_listing import delete_runs, set_label
from casedb.store.database import ModelInfo, Occurrence, Store

MODEL = "explain-variants"
SOURCE = "casedb explain"
LABEL = "explain:variants"
ANY = "*"  # the cause of "every failing case of the run": a variant failing at all fails the same way


@dataclass
class Outcome:
    """What one variant did: passed, failed with its parent's cause (``same``), or anything else."""

    signature: str | None
    outcome: str            # passed, failed, error, ..., or "invalid" (the variant is not a valid case)
    cause: str | None
    max_abs_err: float | None = None
    ulp_err: float | None = None
    seconds: float = 0.0

    def verdict(self, cause: str | None) -> str:
        """pass, same (fails with ``cause``; ANY: fails at all) or other."""
        if self.outcome == "passed":
            return "pass"
        if cause == ANY:
            return "same" if self.cause is not None else "other"
        return "same" if cause is not None and self.cause == cause else "other"


class Rounds:
    """Runs rounds of variants for one explained run; counts them and their time."""

    def __init__(self, db_path: Path, spec: RunSpec, *, progress=None):
        self.db_path = db_path
        self.spec = replace(spec, models=[MODEL], all_models=False, keyword=None, markexpr="", op=[], limit=None,
                            shard=None, max_numel=None, triage=[], shipped_triage=False, dedupe=True)
        self.variants_run = 0
        self.rounds = 0
        self.seconds = 0.0
        self.progress = progress

    def run(self, cases: list[dict], backend: str | None = None) -> list[Outcome]:
        """Run ``cases`` (dicts: op, inputs, attrs, dtype, seed, tolerances) in one session on the
        run's backend (or ``backend``); their outcomes, in order."""
        start = time.perf_counter()
        norms: list = []
        for c in cases:
            try:
                norms.append(casespec.normalize_case(_manifest_case(c, len(norms)), {}, where="casedb explain"))
            except InputError:
                norms.append(None)
        valid = [n for n in norms if n is not None]
        got: dict = {}
        if valid:
            got = self._session(valid, backend or self.spec.backend)
        self.variants_run += len(valid)
        self.rounds += 1
        self.seconds += time.perf_counter() - start
        if self.progress:
            self.progress(f"round {self.rounds}: {len(valid)} variants, {time.perf_counter() - start:.1f} s")
        return [Outcome(None, "invalid", None) if n is None else got.get(n.signature, Outcome(n.signature, "lost", None))
                for n in norms]

    def _session(self, norms: list, backend: str) -> dict:
        with Store(self.db_path) as store:
            occs = [Occurrence(model=MODEL, case=n, name=n.name, source=SOURCE, position=i) for i, n in enumerate(norms)]
            store.save([ModelInfo(MODEL, source=SOURCE, description="variants of failing cases (casedb explain); "
                                                                   "removed after each round")],
                       occs, replace_models=[MODEL])
            spec = replace(self.spec, backend=backend)
            run_id = start_run(store.conn, selection={"version": SELECTION_VERSION, "source": SOURCE,
                                                      "options": spec.selection()},
                               args=sys.argv[1:], device=spec.device, backend=backend)
            set_label(store.conn, run_id, LABEL)
        try:
            code, text = runner._session(spec, self.db_path, run_id, len(norms), Progress(None, enabled=False))
            runner._finish(self.db_path, run_id, code, text)
            with Store(self.db_path) as store:
                rows = stored.run_cases(store.conn, run_id)
        finally:
            self._clean(run_id, [n.signature for n in norms])
        return {r["signature"]: Outcome(r["signature"], r["outcome"], r["cause"], r["max_abs_err"], r["ulp_err"],
                                        r["seconds"]) for r in rows}

    def _clean(self, run_id: int, signatures: list[str]) -> None:
        with Store(self.db_path) as store:
            delete_runs(store.conn, [run_id], force=True)
            store.save([], [], replace_models=[MODEL])
            stored.drop_unused_cases(store.conn, signatures)
            stored.drop_empty_model(store.conn, MODEL)


def _manifest_case(c: dict, n: int) -> dict:
    """A variant case dict as a manifest case (what casedb.cases.spec reads and signs)."""
    out = {"name": f"v{n}", "op": c["op"], "inputs": c["inputs"], "attrs": c.get("attrs") or {}, "dtype": c["dtype"]}
    if c.get("seed") is not None:
        out["seed"] = c["seed"]
    for k in ("rtol", "atol", "description"):
        if c.get(k) is not None:
            out[k] = c[k]
    return out
