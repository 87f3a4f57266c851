"""Collection of 10k model-op tests: from the case DB (casedb's plugin) vs from YAML manifests.

    python bench/bench_collect.py [--cases 10000] [--models 4] [--repeat 3] [--json]

Writes ``--cases`` distinct cases as ``--models`` RFC-0186 YAML manifests, imports them into a
fresh DB (not timed), then in the same run, best of ``--repeat``:

* **pytest + casedb** — ``pytest --collect-only -q --all-models -m "" --no-dedupe`` over the
  one-line test file, parametrized from the DB (subprocess wall time, interpreter start included);
* **pytest + YAML** — the same collection where a test module parses the YAML files itself
  (``yaml.load`` with the C loader when present, no validation) and parametrizes one test per
  case: the RFC's own design and the least any YAML-driven collection does;
* **plan from the DB** — ``casedb.run.plan.build_plan`` alone, in process;
* **YAML parse + validate** — ``casedb.ingest.save.prepare`` (what importing the same files costs);
* **yaml.load alone** — the C loader over the same files, in process.

Both pytest collections are also timed with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` (casedb's plugin
loaded by ``-p``): the start-up of unrelated plugins installed here (hypothesis, anyio, ...)
is paid by both sides and belongs to neither collection.

Goal: the casedb collection of 10k cases under 3 s and faster than the YAML one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OPS = [("torch.add", 2), ("torch.mul", 2), ("torch.sub", 2), ("torch.nn.functional.silu", 1), ("torch.neg", 1),
       ("torch.rsqrt", 1), ("torch.exp", 1), ("torch.ops.aten.mm.default", 0), ("torch.sigmoid", 1),
       ("torch.nn.functional.softmax", 1)]

YAML_TEST = '''\
"""The RFC's approach: parse the YAML manifests at collection, one test per case."""
import glob
import os

import pytest
import yaml

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _cases():
    out = []
    for path in sorted(glob.glob(os.path.join(os.environ["BENCH_YAML_DIR"], "*.yaml"))):
        with open(path) as f:
            doc = yaml.load(f, Loader=Loader)
        for case in doc["cases"]:
            out.append(pytest.param(case, id=f"{doc['model']}-{case['name']}"))
    return out


@pytest.mark.parametrize("case", _cases())
def test_case(case):
    pass
'''


def write_manifests(folder: Path, cases: int, models: int) -> list[Path]:
    per = -(-cases // models)
    paths = []
    n = 0
    for m in range(models):
        lines = [f"model: bench{m}", "default: {dtype: fp16, rtol: 1.0e-3, atol: 1.0e-3}", "cases:"]
        for _ in range(per):
            if n == cases:
                break
            op, arity = OPS[n % len(OPS)]
            rows, cols = 1 + n // 64, 64 + (n % 64)  # distinct shapes: every case is its own signature
            dtype = " dtype: fp32," if n % 5 == 0 else ""
            lines.append(f"  - name: c{n}")
            lines.append(f"    op: {op}")
            lines.append("    inputs:")
            if arity == 0:
                lines.append(f"      - tensor: {{shape: [{rows}, {cols}],{dtype} init: randn}}")
                lines.append(f"      - tensor: {{shape: [{cols}, 32],{dtype} init: randn}}")
            for _ in range(arity):
                lines.append(f"      - tensor: {{shape: [{rows}, {cols}],{dtype} init: randn}}")
            if op.endswith("softmax"):
                lines.append("    attrs: {dim: -1}")
            n += 1
        path = folder / f"bench{m}.yaml"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def _pytest(args: list[str], cwd: Path, env: dict) -> tuple[float, int, float | None]:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    m = re.search(r"(\d+)(?:/\d+)? tests? collected.* in ([0-9.]+)s", done.stdout)
    if not m:
        raise SystemExit(f"pytest failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall, int(m.group(1)), float(m.group(2))


def best(fn, repeat: int):
    times = []
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import yaml

    from casedb.ingest import save as ingest
    from casedb.run.plan import build_plan
    from casedb.store.database import Store

    with tempfile.TemporaryDirectory(prefix="casedb-bench-collect-") as tmp:
        tmp = Path(tmp)
        ydir = tmp / "yaml"
        ydir.mkdir()
        paths = write_manifests(ydir, a.cases, a.models)
        db = tmp / "bench.db"
        t = time.perf_counter()
        with Store(db) as store:
            ingest.import_paths(store, paths)
        t_import = time.perf_counter() - t
        (tmp / "pytest.ini").write_text("[pytest]\n")
        (tmp / "test_casedb.py").write_text("from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
        (tmp / "test_yaml.py").write_text(YAML_TEST)
        env = dict(os.environ, BENCH_YAML_DIR=str(ydir))
        common = ["-p", "no:cacheprovider", "-q", "--collect-only"]
        casedb_args = [*common, "test_casedb.py", "--casedb-db", str(db), "--all-models", "-m", "", "--no-dedupe"]
        casedb_runs = [_pytest(casedb_args, tmp, env) for _ in range(a.repeat)]
        yaml_runs = [_pytest([*common, "-p", "no:casedb", "test_yaml.py"], tmp, env) for _ in range(a.repeat)]
        pw_casedb = min(casedb_runs)
        pw_yaml = min(yaml_runs)
        # the same without the other pytest plugins this environment has installed (their
        # start-up is paid by both sides and is no part of either collection)
        bare_env = dict(env, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
        pc_casedb = min(_pytest([*casedb_args, "-p", "casedb.pytest_plugin"], tmp, bare_env) for _ in range(a.repeat))
        pc_yaml = min(_pytest([*common, "test_yaml.py"], tmp, bare_env) for _ in range(a.repeat))
        with Store(db) as store:
            t_plan, plan = best(lambda: build_plan(store, None, dedupe=False), a.repeat)
        t_prepare, _ = best(lambda: ingest.prepare(paths), a.repeat)
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

        def load_all():
            return [yaml.load(p.read_text(), Loader=loader) for p in paths]

        t_yaml, _ = best(load_all, a.repeat)

    out = {
        "cases": a.cases, "import_s": round(t_import, 2),
        "pytest_casedb_wall_s": round(pw_casedb[0], 2), "pytest_casedb_collected": pw_casedb[1],
        "pytest_casedb_reported_s": pw_casedb[2],
        "pytest_yaml_wall_s": round(pw_yaml[0], 2), "pytest_yaml_collected": pw_yaml[1],
        "pytest_yaml_reported_s": pw_yaml[2],
        "plan_from_db_s": round(t_plan, 3), "plan_items": len(plan),
        "yaml_parse_and_validate_s": round(t_prepare, 3), "yaml_load_only_s": round(t_yaml, 3),
        "yaml_loader": loader.__name__,
        "no_other_plugins": {"casedb_wall_s": round(pc_casedb[0], 2), "casedb_reported_s": pc_casedb[2],
                             "yaml_wall_s": round(pc_yaml[0], 2), "yaml_reported_s": pc_yaml[2]},
        "ratio_casedb_to_yaml_collection": round(pw_casedb[0] / pw_yaml[0], 2),
        "goal_met": pw_casedb[0] < 3.0 and pw_casedb[0] < pw_yaml[0],
        "goal_met_without_other_plugins": pc_casedb[0] < 3.0 and pc_casedb[0] < pc_yaml[0],
    }
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{a.cases} cases in {a.models} manifests (import into the DB: {out['import_s']} s, not part of collection)")
    print(f"pytest --collect-only, casedb plugin (DB):   {out['pytest_casedb_wall_s']:6.2f} s wall "
          f"({out['pytest_casedb_collected']} tests; pytest says {out['pytest_casedb_reported_s']} s)")
    print(f"pytest --collect-only, YAML parametrize:     {out['pytest_yaml_wall_s']:6.2f} s wall "
          f"({out['pytest_yaml_collected']} tests; pytest says {out['pytest_yaml_reported_s']} s)")
    print(f"  plan from the DB (in process):             {out['plan_from_db_s']:6.3f} s")
    print(f"  YAML parse + validate (casedb.ingest.save):     {out['yaml_parse_and_validate_s']:6.3f} s")
    print(f"  yaml.load alone ({out['yaml_loader']}):          {out['yaml_load_only_s']:6.3f} s")
    n = out["no_other_plugins"]
    print(f"without this environment's other pytest plugins: casedb {n['casedb_wall_s']:.2f} s wall "
          f"(pytest says {n['casedb_reported_s']} s), YAML {n['yaml_wall_s']:.2f} s (pytest says {n['yaml_reported_s']} s)")
    print(f"ratio casedb / YAML collection: {out['ratio_casedb_to_yaml_collection']}  "
          f"goal (< 3 s and faster than YAML): {'met' if out['goal_met'] else 'NOT met'} here, "
          f"{'met' if out['goal_met_without_other_plugins'] else 'NOT met'} without the other plugins")


if __name__ == "__main__":
    main()
