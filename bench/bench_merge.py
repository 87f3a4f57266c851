"""`casedb merge` of a real shard and of hostile ones (issue 24): time and peak RSS of each, in its
own process (bench_hostile.measure: the child's ``ru_maxrss`` from ``os.wait4``).

    python bench/bench_merge.py                                    # this checkout
    python bench/bench_merge.py --compare-checkout /tmp/casedb-main  # + the same merges from another

The shard holds the shipped manifests (about 3000 cases) and one run with a result per case. A
genuine merge verifies every case's signature and blob before it copies; each hostile source
must be refused (exit 2) within 5 s and 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

from bench_hostile import ROOT, casedb, measure

sys.path.insert(0, str(ROOT))

HOSTILE = {
    "blobs a recursive view (1 MB rows)": [
        "DROP TABLE blobs", "CREATE VIEW blobs AS WITH RECURSIVE r(sha256, data, size) AS (SELECT hex(randomblob(32)),"
        " zeroblob(1000000), 1 UNION ALL SELECT hex(randomblob(32)), data, size FROM r) SELECT * FROM r"],
    "runs a recursive view": [
        "DROP TABLE runs", "CREATE VIEW runs AS WITH RECURSIVE r(id, uid) AS (SELECT 1, 'x' UNION ALL"
        " SELECT id + 1, hex(randomblob(16)) FROM r) SELECT * FROM r"],
    "a case's content forged under its signature": [
        "UPDATE cases SET op = 'torch.sub' WHERE signature = (SELECT max(signature) FROM cases)"],
    "a blob's bytes forged": ["UPDATE blobs SET data = zeroblob(12) WHERE rowid = 1"],
    "a bad timestamp": ["UPDATE runs SET started_at = 'yesterday'"],
    "orphan rows": ["INSERT INTO judgements (run_id, model, signature, outcome) VALUES (9, 'x', 'y', 'passed')"],
}


def make_shard(tmp: Path) -> Path:
    from tests import runs_data

    shard = tmp / "shard.db"
    r = measure(casedb(shard, "import", *sorted((ROOT / "manifests").glob("*.yaml"))))
    assert r["rc"] == 0, r
    runs_data.record_run(shard, {k: ("passed", 1e-4) for k in runs_data.occurrences(shard)})
    con = sqlite3.connect(shard)
    con.execute("UPDATE runs SET uid = 'bench-shard'")
    con.commit()
    con.close()
    return shard


def median_of(runs: list[dict]) -> dict:
    return {"s": statistics.median(r["s"] for r in runs), "rss_mib": statistics.median(r["rss_mib"] for r in runs),
            "rc": [r["rc"] for r in runs]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare-checkout", type=Path, help="also merge with `python -m casedb` run from here")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shard = make_shard(tmp)
        con = sqlite3.connect(shard)
        out["shard"] = dict(zip(("cases", "occurrences", "results", "blobs"), con.execute(
            "SELECT (SELECT count(*) FROM cases), (SELECT count(*) FROM model_cases), (SELECT count(*) FROM results),"
            " (SELECT count(*) FROM blobs)").fetchone()), file_mb=round(shard.stat().st_size / 1e6, 1))
        con.close()
        for label, cwd in (("this checkout", ROOT), (str(args.compare_checkout), args.compare_checkout)):
            if cwd is None:
                continue
            out[f"genuine merge into an empty target, {label}"] = median_of(
                [measure(casedb(tmp / f"t{i}-{abs(hash(label))}.db", "merge", shard), cwd=cwd)
                 for i in range(args.repeat)])
        target = tmp / "target.db"
        shutil.copy(shard, target)
        for name, statements in HOSTILE.items():
            src = tmp / "hostile.db"
            shutil.copy(shard, src)
            con = sqlite3.connect(src)
            for s in statements:
                con.execute(s)
            con.commit()
            con.close()
            out[f"refused: {name}"] = measure(casedb(target, "merge", src), timeout=60)
        junk = tmp / "junk.db"
        junk.write_bytes(os.urandom(180_000))
        out["refused: 180 KB of random bytes"] = measure(casedb(target, "merge", junk), timeout=60)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
