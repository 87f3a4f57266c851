"""``casedb merge --combine``: what may become one run, and what happens when two shards disagree.

A run is of one target: the device, backend and torch it ran on and the options that decide how
each case executes and is judged (:data:`TARGET_OPTIONS`, the ``what`` options of
:class:`casedb.run.runspec.RunSpec` that are part of its target). Source runs of more than one
target are refused whole (:func:`one_target`), naming the targets and where each was found: their
results of the same case would be one row, and one shard's failures would vanish under the other's
passes.

Two shards of one target may still have run the same case (overlapping selections, a rerun): when
their outcomes differ that is a conflict, reported (:class:`Conflicts`) and resolved towards the
worse outcome (:func:`casedb.outcomes.worst`), so a combined run never reads greener than one of
its parts.
"""

from __future__ import annotations

from casedb import outcomes
from casedb.errors import CasedbError
from casedb.serial import dumps, loads

# The RunSpec options that make up a run's target besides its device and backend (RunSpec fields
# whose Flag has what=True and target=True; tests/hostile/test_round4_merge_hostile.py keeps the two in step).
TARGET_OPTIONS = ("imports", "reference_dtype", "run_skipped", "check_determinism", "judge", "values", "replace_device",
                  "arch")
SHOWN = 5
KEPT = 100  # conflicts listed in the report (all are counted)


def run_target(run, selection: dict) -> tuple:
    """A source run's target, as (name, value) pairs (values as JSON text, so comparable)."""
    options = selection.get("options") or {}
    chosen = {k: options.get(k) for k in TARGET_OPTIONS}
    chosen["values"] = chosen["values"] or "random"  # runs from before --values ran random values
    chosen["arch"] = selection.get("arch") or chosen["arch"]  # the arch the run resolved, else the one asked
    return (("device", run["device"]), ("backend", run["backend"]), ("torch", run["torch_version"]),
            *((k, dumps(v)) for k, v in chosen.items()))


def one_target(sources) -> None:
    """CasedbError unless every run of ``sources`` (opened :class:`merge_source.Source` files) has
    one target."""
    seen: dict[tuple, list[str]] = {}
    for src in sources:
        for run in src.conn.execute("SELECT id, device, backend, torch_version, selection FROM runs ORDER BY id"):
            seen.setdefault(run_target(run, loads(run["selection"]) or {}), []).append(f"{src.where} run {run['id']}")
    if len(seen) < 2:
        return
    keys = [k for k, _ in next(iter(seen))]
    differ = [k for i, k in enumerate(keys) if len({t[i][1] for t in seen}) > 1]
    named = [f"{_describe(dict(t), differ)} ({', '.join(where[:SHOWN])}{', ...' if len(where) > SHOWN else ''})"
             for t, where in seen.items()]
    raise CasedbError(f"--combine makes one run of every source run, and these ran on {len(seen)} targets (they "
                      f"differ in {', '.join(differ)}): {'; '.join(named)}. A run is of one target: combine each "
                      "target's shards with a casedb merge --combine of their own, or merge without --combine to keep "
                      "each run as it is. Nothing was merged")


def _describe(target: dict, differ: list[str]) -> str:
    def shown(k):
        value = target[k] if k == "torch" else loads(target[k])
        return "default" if value is None else ",".join(map(str, value)) if isinstance(value, list) else value

    text = f"{target['device']}/{target['backend']}"
    return text + "".join(f" {k}={shown(k)}" for k in differ if k not in ("device", "backend"))


class Conflicts:
    """Results (and judgements) of one case that two combined shards recorded differently."""

    def __init__(self, conn, src, part: dict):
        self.conn, self.src, self.part = conn, src, part
        part.setdefault("conflicting", [])

    def result(self, values: dict) -> int | None:
        """``values`` (a source result) met the combined run's result of the same case: None when
        they agree or the kept one is worse; else the kept row's id, now holding ``values``."""
        mine = self.conn.execute(
            "SELECT id, outcome FROM results WHERE run_id = ? AND signature = ? AND ifnull(model_case_id, 0) = ifnull(?, 0)",
            [values["run_id"], values["signature"], values["model_case_id"]]).fetchone()
        if mine is None or mine["outcome"] == values["outcome"]:
            return None
        if not self._worse(values, mine["outcome"]):
            return None
        cols = [c for c in values if c not in ("run_id", "signature", "model_case_id")]
        self.conn.execute(f"UPDATE results SET {', '.join(f'{c} = ?' for c in cols)} WHERE id = ?",
                          [*(values[c] for c in cols), mine["id"]])
        return mine["id"]

    def judgement(self, values: dict, replaced: bool) -> None:
        """``values`` (a source judgement) met the combined run's judgement of the same occurrence:
        it replaces that one when its result did (``replaced``) or when its own outcome is worse."""
        mine = self.conn.execute("SELECT id, outcome FROM judgements WHERE run_id = ? AND model_case_id = ?",
                                 [values["run_id"], values["model_case_id"]]).fetchone()
        if mine is None or (mine["outcome"] == values["outcome"] and not replaced):
            return
        if not replaced and not self._worse(values, mine["outcome"]):
            return
        cols = ("result_id", "outcome", "reason", "stage", "rtol", "atol", "triage", "triage_where")
        self.conn.execute(f"UPDATE judgements SET {', '.join(f'{c} = ?' for c in cols)} WHERE id = ?",
                          [*(values.get(c) for c in cols), mine["id"]])

    def _worse(self, values: dict, kept: str) -> bool:
        """Count and list the conflict; whether ``values``' outcome is the worse (and so is kept)."""
        worse = outcomes.worst([kept, values["outcome"]])
        self.part["conflicts"] += 1
        if len(self.part["conflicting"]) < KEPT:
            name = self.conn.execute("SELECT model || '::' || name FROM model_cases WHERE signature = ? "
                                     "ORDER BY (id = ?) DESC, model, name LIMIT 1",
                                     [values["signature"], values.get("model_case_id")]).fetchone()
            self.part["conflicting"].append({
                "signature": values["signature"], "case": name[0] if name else None,
                "outcomes": [kept, values["outcome"]], "kept": worse, "source": self.src.where})
        return worse != kept
