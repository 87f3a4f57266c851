"""Peak memory of a model's largest cases against what they hold: the floor of a run's peak.

    python bench/bench_memory.py [--model granite4h] [--cases 3] [--backend inductor] [--max-gib G] [--json]

A run's peak resident memory is its largest case's: a worker keeps no case's tensors once it is
recorded (the main job's RSS falls back to under 1 GiB between its large cases). So this takes the
``--cases`` largest cases of ``--model`` (by the bytes their inputs span plus what their outputs
take on fake tensors, twice: the reference's and the target's; ``--max-gib``: of those under it),
from a DB built from
the shipped manifests, and runs each alone in a fresh process exactly as a run's worker does
(``casedb.run.target.execute_item`` on the prepared target, the default judge, no reference
cache), and prints per case:

* **data**: the bytes the case holds — its inputs, its outputs (the CPU reference's and the
  target's) and the upcast reference when one is computed;
* **peak**: the process's peak RSS less its RSS before the case (interpreter, torch, the target's
  imports: ``base``);
* **(peak - base) / data**: what the run needs beyond the data (goal for the largest: <= 1.5,
  bench/README.md, "Memory of the main job"). The judge's own temporaries count here: a summing
  op too large for the upcast reference has its error scale computed on ``|x|``, one more copy
  of its inputs (the 4 GiB float32 ``sum``: 2.0).

Needs the memory of the largest case (granite4h: 8.8 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r'''
import json, os, resource, sys
from casedb.run import execute
from casedb.run.plan import build_plan
from casedb.run.runspec import RunSpec
from casedb.run.target import Target, execute_item, prepare_target
from casedb.store.database import Store

db, model, wanted, backend = sys.argv[1:5]
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
store = Store(db)
item = next(it for it in build_plan(store, [model]) if it.id == wanted)
target = prepare_target(Target.from_spec(RunSpec(models=[model], backend=backend, device="cpu")))
kept = []
run_case = execute.run_case
execute.run_case = lambda *a, **k: kept.append(run_case(*a, **k)) or kept[-1]
base = rss()
payload = execute_item(item, target, store.load_blob)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ex = kept[0] if kept else None
leaves = lambda x: [t for t in (x.values() if isinstance(x, dict) else [x]) if hasattr(t, "untyped_storage")]
out = sum(t.untyped_storage().nbytes() for part in ("reference", "target", "reference_hi")
          for t in leaves(getattr(ex, part, None)))
print(json.dumps({"outcome": payload["outcome"], "base": base, "peak": peak, "outputs": out,
                  "notes": getattr(ex, "notes", {})}))
'''


def input_bytes(item) -> int:
    """The bytes the case's input tensors span (casedb.cases.presets.storage_numel)."""
    import torch

    from casedb.cases.marks import iter_tensors
    from casedb.cases.materialize import torch_dtype
    from casedb.cases.presets import storage_numel

    return sum(storage_numel(t) * torch.empty(0, dtype=torch_dtype(t.get("dtype") or item.dtype)).element_size()
               for t in iter_tensors(item.inputs, item.attrs))


def estimate(item) -> int:
    """The case's inputs and, sized on fake tensors, its two outputs (reference, target), in bytes."""
    import torch

    from casedb.cases.materialize import output_numel, torch_dtype
    from casedb.cases.ops import UnknownOpError, op_info

    try:
        out = output_numel(item.case, op_info(item.op).fn) or 0
    except UnknownOpError:
        out = 0
    return input_bytes(item) + 2 * out * torch.empty(0, dtype=torch_dtype(item.dtype)).element_size()


def largest(db: Path, model: str, count: int, max_bytes: float) -> list:
    from casedb.ingest.seed import seed_from_manifests
    from casedb.run.plan import build_plan
    from casedb.store.database import Store

    with Store(db) as store:
        seed_from_manifests(store)
        plan = build_plan(store, [model])
    sized = [(estimate(it), it) for it in plan]
    return [it for size, it in sorted(sized, key=lambda x: -x[0]) if size <= max_bytes][:count]


def measure(db: Path, model: str, item, backend: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", CHILD, str(db), model, item.id, backend], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{item.id}: exit {done.returncode}\n{done.stderr[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    data = input_bytes(item) + found["outputs"]
    grown = found["peak"] - found["base"]
    return {"case": item.id, "outcome": found["outcome"], "inputs": input_bytes(item), "outputs": found["outputs"],
            "data": data, "base": found["base"], "peak": found["peak"], "peak_over_data": round(grown / data, 3),
            "notes": found["notes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="granite4h")
    ap.add_argument("--cases", type=int, default=3, help="How many of the largest cases (default 3).")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--max-gib", type=float, default=float("inf"), help="Only cases whose data is under this.")
    ap.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    opt = ap.parse_args()
    gib = 2 ** 30
    with tempfile.TemporaryDirectory(prefix="casedb-bench-memory-") as tmp:
        db = Path(tmp) / "casedb.sqlite"
        rows = [measure(db, opt.model, it, opt.backend) for it in largest(db, opt.model, opt.cases, opt.max_gib * gib)]
    if opt.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['case'][:70]}: {r['outcome']}, inputs {r['inputs'] / gib:.2f} GiB + outputs "
              f"{r['outputs'] / gib:.3f} GiB = data {r['data'] / gib:.2f} GiB; peak {r['peak'] / gib:.2f} GiB "
              f"(base {r['base'] / gib:.2f}): (peak - base) / data = {r['peak_over_data']:.2f}"
              + (f" [{'; '.join(f'{k}: {v}' for k, v in r['notes'].items())}]" if r["notes"] else ""))


if __name__ == "__main__":
    main()
