"""`casedb mutants` in one session vs one `casedb run` per backend, on the same cases, in one run.

    python bench/bench_mutants_session.py [--model granite4h] [--limit 20] [--max-numel 200000]
                                          [--mutant NAME ...] [-j 1] [--db PATH] [--json]

Both sides run the control (``casedb_mutant_none``) and every mutant over the same selection,
into copies of one DB (``--db``, else manifests/<model>.yaml imported into a fresh one):

* **one session**: :func:`casedb.mutation.score.run_mutants` — one pytest session, every backend
  in the same worker processes (what ``casedb mutants`` does now);
* **per backend**: one :func:`casedb.run.runner.run` per backend, each its own pytest session
  with its own workers (what ``casedb mutants`` did before issue 30), then the same scoring.

Prints both wall times, the ratio (goal: <= 0.5) and whether the two per-mutant tables are the
same (changed, caught, score, within precision, the survivors' signatures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def table(report: dict) -> dict:
    """The per-mutant table without run ids (what must not change)."""
    c = report["control"]
    out = {"control": (c["executed"], c["passed"], c["false_alarms"])}
    for m in report["mutants"]:
        out[m["name"]] = (m["executed"], m["changed"], m["caught"], m["score"], len(m["within_precision"]),
                          sorted(s["signature"] for s in m["survivors"]))
    return out


def per_backend(spec, names: list[str], base: str, db: Path) -> dict:
    """Before issue 30: one casedb run (one pytest session) per backend, then the same score."""
    from casedb.mutation import harness, score
    from casedb.run import runner

    run_ids = {}
    with score._base_env(base):
        for name in [harness.CONTROL, *names]:
            run_ids[name] = runner.run(replace(spec, backend=harness.PREFIX + name), db=db, progress=False)["run_id"]
    return score.score(db, run_ids[harness.CONTROL], {n: run_ids[n] for n in names})


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="granite4h")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-numel", type=int, default=200_000)
    ap.add_argument("--mutant", action="append", default=None)
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--db", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from casedb.ingest.save import import_paths
    from casedb.store.database import Store
    from casedb.mutation import harness, score
    from casedb.run.runspec import RunSpec

    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.chdir(tmp)  # no ./triage/*.yaml: both sides read the same (shipped) triage only
        src = tmp / "src.sqlite"
        if args.db:
            shutil.copy(args.db, src)
        else:
            with Store(src) as store:
                import_paths(store, [ROOT / "manifests" / f"{args.model}.yaml"])
        spec = RunSpec(models=[args.model], limit=args.limit, max_numel=args.max_numel, jobs=args.jobs,
                       markexpr="", imports=["casedb.mutation.mutants"])
        names = score.pick(args.mutant)
        one, each = tmp / "one.sqlite", tmp / "each.sqlite"
        shutil.copy(src, one)
        shutil.copy(src, each)
        t = time.perf_counter()
        after = score.run_mutants(replace(spec), mutants=names, db=one, progress=False)
        res["one_session_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        before = per_backend(replace(spec), names, harness.DEFAULT_BASE, each)
        res["per_backend_s"] = round(time.perf_counter() - t, 1)
    res.update(backends=1 + len(names), cases=after["control"]["executed"],
               ratio=round(res["one_session_s"] / res["per_backend_s"], 2), same_table=table(after) == table(before))
    if not res["same_table"]:
        res["tables"] = {"one_session": table(after), "per_backend": table(before)}
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{args.model}: {res['cases']} cases x {res['backends']} backends (control + mutants), -j {args.jobs}")
        print(f"  one session        {res['one_session_s']:7.1f} s")
        print(f"  one run per backend {res['per_backend_s']:6.1f} s")
        print(f"  ratio {res['ratio']} (goal <= 0.5); same per-mutant table: {res['same_table']}")
        if not res["same_table"]:
            print(json.dumps(res["tables"], indent=1))
    return res


if __name__ == "__main__":
    main()
