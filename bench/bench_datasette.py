"""Datasette page time on a large DB: 100k cases, 1M results (10 nightly runs), ~1.2M judgements.

    python bench/bench_datasette.py            # generate into a tmp dir, serve, time every canned query
    python bench/bench_datasette.py --keep DIR # keep (and reuse) the generated DB in DIR

The DB is generated with executemany in one transaction per table (about a minute), after the
schema migrations, so the views, indexes and search triggers are the ones `casedb serve` sees.
Each canned query page (HTML, as a browser gets it, and JSON) is fetched from a real
`casedb serve` subprocess REPEAT times; the median is printed next to the median of a trivial
page (`/-/versions.json`) measured in the same run, so the ratio is machine-independent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

N_CASES = 100_000
N_RUNS = 10  # each run executes every case once: N_CASES * N_RUNS = 1M results
N_MODELS = 50
N_OPS = 200
SHARED = 0.2  # share of occurrences that reuse another model's case (what dedupe saves)
REPEAT = 7
BUDGET_MS = 300

DTYPES = ["bfloat16", "float16", "float32"]
OUTCOMES = [("passed", 0.93), ("failed", 0.03), ("error", 0.01), ("xfailed", 0.01), ("xpassed", 0.005),
            ("skipped", 0.01), ("ref_error", 0.005), ("crashed", 0.005), ("timeout", 0.005)]


def _sig(i: int) -> str:
    return hashlib.sha256(f"case-{i}".encode()).hexdigest()


def generate(path: Path, *, n_cases: int = N_CASES, n_runs: int = N_RUNS, seed: int = 0) -> dict:
    """Write a casedb DB at `path` with the given size; returns row counts."""
    from casedb.store.database import Store, shape_summary

    from casedb.store.migrations import m100_views

    rng = random.Random(seed)
    store = Store(path)
    con = store.db.conn
    # Bulk load without the per-row counting trigger; m100_views (idempotent) recounts at the end.
    con.execute("DROP TRIGGER judgement_counts_ai")
    ops = [f"torch.ops.aten.op{i:03d}" for i in range(N_OPS)]
    models = [f"model_{i:02d}" for i in range(N_MODELS)]
    stamp = "2025-01-01T00:00:00+00:00"
    with con:
        con.executemany("INSERT INTO models (name, key, source, defaults, created_at, updated_at)"
                        " VALUES (?, ?, 'bench', '{}', ?, ?)", [(m, m.replace("_", "-"), stamp, stamp) for m in models])
        cases = []
        for i in range(n_cases):
            dtype = DTYPES[i % len(DTYPES)]
            shape = [1, rng.choice([1, 11, 128, 2048]), rng.choice([64, 2880, 5760, 4096])]
            inputs = [{"tensor": {"shape": shape, "dtype": dtype, "init": "randn"}}] * (1 + i % 2)
            cases.append((_sig(i), ops[i % N_OPS], json.dumps(inputs), "{}", dtype, None, "[]",
                          shape_summary(inputs, {}), stamp))
        con.executemany("INSERT INTO cases (signature, op, inputs, attrs, dtype, seed, marks, shapes, created_at)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", cases)
        # Every case belongs to one model; SHARED of them also occur in a second model.
        occ = []
        for i in range(n_cases):
            occ.append((models[i % N_MODELS], i))
            if rng.random() < SHARED:
                occ.append((models[(i + 1 + rng.randrange(N_MODELS - 1)) % N_MODELS], i))
        mc_rows = [(m, _sig(i), f"{m}_case_{i}", f"op{i % N_OPS:03d} as called by {m}", "bench", k, 1,
                    "[]", 1e-2, 1e-2) for k, (m, i) in enumerate(occ)]
        con.executemany("INSERT INTO model_cases (model, signature, name, description, source, position, count,"
                        " marks, rtol, atol) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", mc_rows)
    mc_ids = [r[0] for r in con.execute("SELECT id FROM model_cases ORDER BY id")]
    by_case: dict[int, list[tuple[int, str]]] = {}
    for mc_id, (m, i) in zip(mc_ids, occ):
        by_case.setdefault(i, []).append((mc_id, m))
    names, weights = zip(*OUTCOMES)
    n_results = n_judgements = 0
    for run in range(1, n_runs + 1):
        started = f"2025-01-{run:02d}T00:00:00+00:00"
        with con:
            con.execute("INSERT INTO runs (id, started_at, finished_at, status, device, backend, torch_version,"
                        " casedb_version, host) VALUES (?, ?, ?, 'finished', 'cuda', 'inductor', '2.13.0', '0.1.0',"
                        " 'bench')", [run, started, started])
            base = (run - 1) * n_cases
            results, judgements = [], []
            for i in range(n_cases):
                outcome = rng.choices(names, weights)[0]
                err = rng.random() * (1e-1 if outcome in ("failed", "xfailed") else 1e-3)
                bad = outcome not in ("passed", "xpassed", "skipped")
                sig = _sig(i)
                results.append((base + i + 1, run, sig, by_case[i][0][0], outcome, "allclose", err, err * 3,
                                rng.randrange(100) if bad else 0, 0, rng.random() * 1e-3, rng.random() * 0.5,
                                rng.random() * 1e-2, "AssertionError" if bad else None,
                                f"mismatch {err:.3g}" if bad else None, started))
                for mc_id, model in by_case[i]:
                    judgements.append((run, base + i + 1, mc_id, model, sig, outcome, 1e-2, 1e-2, started))
            con.executemany("INSERT INTO results (id, run_id, signature, model_case_id, outcome, compare_mode,"
                            " max_abs_err, max_rel_err, mismatch_count, nan_inf_mismatch, t_ref, t_compile, t_exec,"
                            " error_type, error_message, created_at) VALUES"
                            " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", results)
            con.executemany("INSERT INTO judgements (run_id, result_id, model_case_id, model, signature, outcome,"
                            " rtol, atol, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", judgements)
            n_results += len(results)
            n_judgements += len(judgements)
    with con:
        m100_views(store.db)
    # A served DB is read immutable: fold the WAL into the file first.
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return {"cases": n_cases, "occurrences": len(occ), "runs": n_runs, "results": n_results,
            "judgements": n_judgements}


# ------------------------------------------------------------------------------------ timing

def _get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        r.read()
        assert r.status == 200, (url, r.status)
    return (time.perf_counter() - t0) * 1000


def _median_ms(url: str, repeat: int) -> float:
    _get(url)  # warm: the first request also fills SQLite's page cache
    return statistics.median(_get(url) for _ in range(repeat))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pages(db: Path) -> tuple[dict, dict]:
    """(canned query URLs, other page URLs) to time; parameters picked from the DB."""
    import sqlite3
    import urllib.parse

    from casedb.read.serve import load_metadata

    con = sqlite3.connect(db)
    model = con.execute("SELECT name FROM models ORDER BY name LIMIT 1 OFFSET 7").fetchone()[0]
    judgement = con.execute("SELECT id FROM judgements WHERE outcome = 'failed' ORDER BY id DESC LIMIT 1").fetchone()[0]
    con.close()
    params = {"model_cases_by_op": {"model": model, "op": ""}, "repro": {"judgement": judgement}}
    md = load_metadata()
    canned = {}
    for name in md["databases"]["casedb"]["queries"]:
        qs = urllib.parse.urlencode(params.get(name, {}))
        canned[name] = f"/casedb/{name}" + (f"?{qs}" if qs else "")
        canned[name + ".json"] = f"/casedb/{name}.json" + (f"?{qs}" if qs else "")
    other = {"/-/dashboards/casedb": "/-/dashboards/casedb"}
    for name, chart in md["plugins"]["datasette-dashboards"]["casedb"]["charts"].items():
        sql = chart["query"].split("[[")[0] + chart["query"].split("]]")[1]
        other[f"chart {name} (data)"] = "/casedb.json?" + urllib.parse.urlencode({"sql": sql, "_shape": "objects"})
    for view in ("model_pass_rates", "op_pass_rates", "run_summaries", "verdicts", "results"):
        other[f"/casedb/{view}"] = f"/casedb/{view}"
    return canned, other


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="Directory for the DB (reused when it is already there).")
    ap.add_argument("--repeat", type=int, default=REPEAT)
    args = ap.parse_args(argv)
    tmp = None
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        db = args.keep / "bench.db"
    else:
        tmp = tempfile.TemporaryDirectory(prefix="casedb-bench-")
        db = Path(tmp.name) / "bench.db"
    try:
        if not db.exists():
            t0 = time.perf_counter()
            counts = generate(db)
            print(f"generated {counts} in {time.perf_counter() - t0:.0f} s ({db.stat().st_size / 2**20:.0f} MiB)")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        log = open(db.with_suffix(".serve.log"), "wb")
        proc = subprocess.Popen([sys.executable, "-m", "casedb", "--db", str(db), "serve", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(300):
                try:
                    _get(base + "/-/versions.json")
                    break
                except OSError:
                    time.sleep(0.2)
            baseline = _median_ms(base + "/-/versions.json", args.repeat)
            canned, other = pages(db)
            print(f"\nmedian of {args.repeat} after one warm-up; baseline /-/versions.json {baseline:.1f} ms")
            print(f"{'canned query page':42s} {'median ms':>10s} {'x baseline':>10s}  budget {BUDGET_MS} ms")
            over = []
            for name, path in canned.items():
                ms = _median_ms(base + path, args.repeat)
                ok = ms < BUDGET_MS
                over += [] if ok else [name]
                print(f"{name:42s} {ms:10.1f} {ms / baseline:10.1f}  {'ok' if ok else 'OVER'}")
            print(f"\n{'other pages (no budget)':42s} {'median ms':>10s} {'x baseline':>10s}")
            for name, path in other.items():
                ms = _median_ms(base + path, args.repeat)
                print(f"{name:42s} {ms:10.1f} {ms / baseline:10.1f}")
        finally:
            proc.terminate()
            proc.wait(10)
            log.close()
        from casedb.read import report
        from casedb.store.database import Store

        with Store(db) as store:
            t0 = time.perf_counter()
            report.build(store.db)
            print(f"\ncasedb report (latest run vs previous, in process): {(time.perf_counter() - t0) * 1000:.0f} ms")
        if over:
            print(f"over {BUDGET_MS} ms: {', '.join(over)}")
            return 1
        return 0
    finally:
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
