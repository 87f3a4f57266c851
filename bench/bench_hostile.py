"""Time and memory of hostile input (issues 15 and 24), each against a baseline measured in the same run.

    python bench/bench_hostile.py                 # all four parts
    python bench/bench_hostile.py --part import   # or: manifest, serve, triage
    python bench/bench_hostile.py --cases 20000   # a smaller big manifest
    python bench/bench_hostile.py --part manifest --compare-checkout /tmp/wt-old  # + an older casedb

* **import**: `casedb import` of each hostile input (alias bombs, 100k-deep nesting, a 3 GiB
  gzip bomb, a FIFO, a link to /dev/zero, an ET ctrl_deps cycle, a tensor_list of 10^6 tensors,
  a shape of 10^6 dimensions, an aten::from_file case ...) in its own process; wall
  time and peak RSS next to `casedb import` of the RFC template (a normal small import, interpreter
  and torch start included on both sides). Every one must exit 2.
* **manifest**: a manifest of ``--cases`` cases (100k by default, mixed ops and shapes): peak RSS
  and time of ``yaml.load(CSafeLoader)`` alone (libyaml, the fastest stock PyYAML loader), of
  casedb's bounded manifest loader alone, and of `casedb import` end to end, each in a fresh
  process; with ``--compare-checkout DIR`` also `casedb import` run from another checkout (e.g. a
  ``git worktree`` of the commit before the change).
* **triage** (issue 24): `casedb triage check` of big triage files (2,000 overlapping wildcards,
  each tie its own reason; 20,000 exact entries, seven targets per case) against a DB of the
  shipped manifests, each in a fresh process, next to reading the same YAML alone; with
  ``--compare-checkout DIR`` also from another checkout.
* **serve**: the real `casedb serve` on a small DB; each hostile query's response time and the
  server's peak RSS, next to a normal page and the RSS after start; and what the per-query byte
  cap costs a 1000-row page fetch, next to Datasette's plain row factory.

Peak RSS is each child's own ``ru_maxrss`` (``os.wait4``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
HOSTILE = ROOT / "tests" / "hostile" / "data"
TEMPLATE = ROOT / "tests" / "data" / "template.yaml"
OPS = ["torch.add", "torch.mul", "torch.nn.functional.silu", "torch.nn.functional.linear", "torch.matmul"]


def measure(cmd: list[str], timeout: float = 600, cwd: Path = ROOT, said_chars: int = 110) -> dict:
    """Run `cmd`; wall seconds, peak RSS (MiB) of that process, exit code, last stderr line
    (its first `said_chars` characters)."""
    err = tempfile.TemporaryFile()
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=cwd)
    deadline = t + timeout
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            pid, status, usage = os.wait4(p.pid, 0)
            break
        time.sleep(0.01)
    wall = time.perf_counter() - t
    err.seek(0)
    lines = err.read().decode(errors="replace").strip().splitlines()
    return {"s": round(wall, 2), "rss_mib": round(usage.ru_maxrss / 1024), "rc": os.waitstatus_to_exitcode(status),
            "said": " ".join(lines[-1].split())[:said_chars] if lines else ""}


def measure_apart(cmd: list[str], timeout: float = 600, cwd: Path = ROOT, said_chars: int = 110) -> dict:
    """:func:`measure` run from a fresh, small Python process: Linux keeps a process's peak RSS
    across fork and exec, so a child of a big process (a pytest worker) reports its parent's."""
    code = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from bench.bench_hostile import measure; a = json.loads(sys.argv[2]); "
            "print(json.dumps(measure(a['cmd'], a['timeout'], Path(a['cwd']), a['said_chars'])))")
    args = json.dumps({"cmd": list(map(str, cmd)), "timeout": timeout, "cwd": str(cwd), "said_chars": said_chars})
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), args], capture_output=True, text=True,
                         timeout=timeout + 60, check=True)
    return json.loads(out.stdout)


def casedb(db: Path, *args) -> list[str]:
    return [sys.executable, "-m", "casedb", "--db", str(db), *map(str, args)]


# ------------------------------------------------------------------------------------ import


def hostile_inputs(tmp: Path) -> dict[str, list]:
    """name -> `casedb import` arguments."""
    deep = tmp / "deep_list.yaml"
    deep.write_text("model: h\ncases:\n  - name: d\n    op: torch.neg\n    inputs:\n      - value: "
                    + "[" * 100_000 + "]" * 100_000 + "\n")
    deep_map = tmp / "deep_map.yaml"
    deep_map.write_text("model: h\ncases:\n  - name: d\n    op: torch.neg\n    attrs: {x: "
                        + "{a: " * 5000 + "1" + "}" * 5000 + "}\n")
    big_int = tmp / "big_int.yaml"
    big_int.write_text("model: h\ncases:\n  - name: d\n    op: torch.add\n    inputs:\n"
                       "      - value: " + "7" * 5000 + "\n")
    bomb = tmp / "bomb.pt.trace.json.gz"
    member = gzip.compress(b" " * (1 << 20), 9)
    with open(bomb, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": ['))
        f.write(member * 3072)  # 3 GiB expanded
    fifo = tmp / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp / "zero.json"
    zero.symlink_to("/dev/zero")
    (tmp / "pt").mkdir()
    os.mkfifo(tmp / "pt" / "x.pt")
    pt_fifo = tmp / "pt" / "m.yaml"
    pt_fifo.write_text("model: h\ncases:\n  - name: f\n    op: torch.relu\n    inputs:\n      - file: x.pt\n")
    big_list = tmp / "tensor_list.yaml"
    big_list.write_text("model: h\ncases:\n  - name: c\n    op: torch.cat\n    inputs:\n      - tensor_list: ["
                        + ", ".join(["{shape: [1]}"] * 1_000_000) + "]\n")
    big_rank = tmp / "rank.yaml"
    big_rank.write_text("model: h\ncases:\n  - name: n\n    op: torch.neg\n    inputs:\n      - tensor: {shape: ["
                        + ", ".join(["1"] * 1_000_000) + "]}\n")
    from_file = tmp / "from_file.yaml"
    from_file.write_text(f"model: h\ncases:\n  - name: grow\n    op: aten::from_file\n    inputs:\n"
                         f"      - value: {tmp / 'grown'}\n      - value: true\n      - value: 1000000\n")
    return {
        "alias bomb (10^9 values, 717 B)": [HOSTILE / "alias_bomb.yaml"],
        "alias doubling (2^21 values)": [HOSTILE / "alias_doubling.yaml"],
        "recursive alias": [HOSTILE / "recursive_alias.yaml"],
        "100k-deep flow list": [deep],
        "5000-deep flow mapping": [deep_map],
        "5000-digit integer": [big_int],
        "gzip bomb (3 MB -> 3 GiB)": [bomb, "--model", "m"],
        "FIFO to import": [fifo, "--model", "m"],
        "link to /dev/zero": [zero, "--model", "m"],
        "file: input that is a FIFO": [pt_fifo],
        "ET ctrl_deps cycle": [HOSTILE / "et_cycle.json", "--model", "m"],
        "tensor_list of 10^6 tensors (14 MB)": [big_list],
        "shape of 10^6 dimensions (3 MB)": [big_rank],
        "aten::from_file case": [from_file],
    }


def part_import(tmp: Path) -> dict:
    out = {}
    base = measure(casedb(tmp / "base.db", "import", TEMPLATE))
    out["baseline: casedb import template.yaml"] = base
    for name, args in hostile_inputs(tmp).items():
        r = measure(casedb(tmp / "h.db", "import", *args), timeout=120)
        r["time_x"] = round(r["s"] / base["s"], 2)
        r["rss_x"] = round(r["rss_mib"] / base["rss_mib"], 2)
        out[name] = r
    return out


# ---------------------------------------------------------------------------------- manifest


def write_manifest(path: Path, n: int) -> None:
    with open(path, "w") as f:
        f.write("model: big\ndefault: {dtype: bf16, seed: 0, rtol: 1.0e-2, atol: 1.0e-2}\ncases:\n")
        for i in range(n):
            a, b = 1 + i % 97, 16 * (1 + i // 97 % 64)
            f.write(f"  - name: c{i}\n    op: {OPS[i % len(OPS)]}\n    description: case {i} of the big manifest\n"
                    f"    inputs:\n      - tensor: {{shape: [1, {a}, {b}]}}\n"
                    f"      - tensor: {{shape: [1, {a}, {b}], init: uniform, init_args: {{low: 0.1, high: 2.0}}}}\n")


def part_manifest(tmp: Path, n: int, other: Path | None = None) -> dict:
    path = tmp / "big.yaml"
    write_manifest(path, n)
    code = ("import gc, sys, yaml; gc.disable(); "
            "yaml.load(open(sys.argv[1], encoding='utf-8').read(), Loader=yaml.CSafeLoader)")
    ours = "import gc, sys; gc.disable(); from importers import yaml_manifest; yaml_manifest.load(sys.argv[1])"
    out = {"cases": n, "file_mb": round(path.stat().st_size / 1e6, 1)}
    out["baseline: yaml.load(CSafeLoader) alone"] = measure([sys.executable, "-c", code, str(path)])
    out["casedb manifest loader alone"] = measure([sys.executable, "-c", ours, str(path)])
    out["casedb import, end to end"] = measure(casedb(tmp / "big.db", "import", path))
    keys = ["casedb manifest loader alone", "casedb import, end to end"]
    if other is not None:  # `python -m casedb` from there runs that checkout's code
        keys.append(f"casedb import, end to end, from {other}")
        out[keys[-1]] = measure(casedb(tmp / "other.db", "import", path), cwd=other)
    base = out["baseline: yaml.load(CSafeLoader) alone"]
    for k in keys:
        out[k]["time_x"] = round(out[k]["s"] / base["s"], 2)
        out[k]["rss_x"] = round(out[k]["rss_mib"] / base["rss_mib"], 2)
    return out


# ------------------------------------------------------------------------------------ triage


def triage_files(tmp: Path, db: Path) -> dict[str, Path]:
    import sqlite3

    occ = sqlite3.connect(db).execute("SELECT model, name FROM model_cases ORDER BY id").fetchall()
    out = {"2,000 overlapping wildcards": tmp / "wild2k.yaml", "20,000 exact entries": tmp / "exact20k.yaml"}
    with open(out["2,000 overlapping wildcards"], "w") as f:
        f.write("version: 1\ncases:\n")
        for i in range(2000):
            status = "known_failure" if i % 2 else "expected_pass"
            f.write(f'  - {{name: "*{i % 10}*", status: {status}, reason: "entry {i}"}}\n')
    with open(out["20,000 exact entries"], "w") as f:
        f.write("version: 1\ncases:\n")
        for n in range(20000):
            model, name = occ[n % len(occ)]
            f.write(f'  - {{model: {model}, name: {name}, device: dev{n // len(occ)}, status: known_failure}}\n')
    return out


def part_triage(tmp: Path, other: Path | None = None) -> dict:
    db = tmp / "shipped.db"
    assert measure(casedb(db, "import", *sorted((ROOT / "manifests").glob("*.yaml"))))["rc"] == 0
    read = ("import sys; from importers import yaml_manifest; yaml_manifest.load(sys.argv[1], 1 << 30)")
    check = "import sys; from casedb import triage; print(len(triage.check([sys.argv[1]], sys.argv[2])))"
    out = {}
    for name, path in triage_files(tmp, db).items():
        base = measure([sys.executable, "-c", read, str(path)])
        runs = {"baseline: reading the YAML alone": base,
                "casedb triage check": measure([sys.executable, "-c", check, str(path), str(db)], timeout=900)}
        if other is not None:
            runs[f"casedb triage check, from {other}"] = measure([sys.executable, "-c", check, str(path), str(db)],
                                                                 timeout=900, cwd=other)
        for k, r in runs.items():
            if k != "baseline: reading the YAML alone":
                r["time_x"] = round(r["s"] / base["s"], 2)
        out[name] = runs
    return out


# ------------------------------------------------------------------------------------- serve


QUERIES = {
    "randomblob(900000000)": "select randomblob(900000000)",
    "4 rows of 60 MB": "select randomblob(60000000) from (values (1), (2), (3), (4))",
    "1 row of 6 x 60 MB": "select " + ", ".join(["randomblob(60000000)"] * 6),
    "endless recursive CTE": "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c",
}


def row_cap_cost() -> dict:
    """Fetch of a 1000-row x 20-column page with sqlite3.Row (Datasette's) and with the capped
    row factory casedb serve installs: best of 20, ms."""
    import sqlite3

    from casedb.read.datasette_plugin import capped_rows

    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (" + ", ".join(f"c{i}" for i in range(20)) + ")")
    con.executemany("INSERT INTO t VALUES (" + ", ".join("?" * 20) + ")",
                    [tuple("x" * 30 if i % 2 else i for i in range(20))] * 1000)
    out = {}
    for name, factory in (("baseline: sqlite3.Row page fetch (ms)", sqlite3.Row),
                          ("capped_rows page fetch (ms)", capped_rows())):
        con.row_factory = factory
        best = float("inf")
        for _ in range(20):
            t = time.perf_counter()
            con.execute("SELECT * FROM t").fetchmany(1001)
            best = min(best, time.perf_counter() - t)
        out[name] = round(best * 1000, 2)
    return out


def part_serve(tmp: Path) -> dict:
    from tests import runs_data

    db = tmp / "serve.db"
    runs_data.two_runs(runs_data.make_cli(db), tmp, db)

    def hwm(pid):
        with open(f"/proc/{pid}/status") as f:
            return round(next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024)

    out = row_cap_cost()
    with runs_data.Server(db, tmp / "serve.log") as server:
        out["server peak RSS after start (MiB)"] = hwm(server.proc.pid)
        t = time.perf_counter()
        for _ in range(5):
            assert server.get("/casedb/latest_failures")[0] == 200
        base = (time.perf_counter() - t) / 5
        out["baseline: latest_failures page (s)"] = round(base, 3)
        for name, q in QUERIES.items():
            t = time.perf_counter()
            status, body = server.get("/casedb.json?" + urllib.parse.urlencode({"sql": q}))
            s = time.perf_counter() - t
            out[name] = {"status": status, "s": round(s, 3), "time_x": round(s / base, 1),
                         "error": json.loads(body).get("error", "")[:70], "server_peak_rss_mib": hwm(server.proc.pid)}
        out["log lines"] = len(server.log_path.read_text().splitlines())
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("import", "manifest", "serve", "triage"), action="append")
    ap.add_argument("--cases", type=int, default=100_000, help="cases in the big manifest")
    ap.add_argument("--compare-checkout", type=Path,
                    help="also time `casedb import` of the big manifest (and `triage check`) from this checkout")
    args = ap.parse_args(argv)
    parts = args.part or ["import", "manifest", "serve", "triage"]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "import" in parts:
            (tmp / "i").mkdir()
            res["import"] = part_import(tmp / "i")
        if "manifest" in parts:
            (tmp / "m").mkdir()
            res["manifest"] = part_manifest(tmp / "m", args.cases, args.compare_checkout)
        if "triage" in parts:
            (tmp / "t").mkdir()
            res["triage"] = part_triage(tmp / "t", args.compare_checkout)
        if "serve" in parts:
            (tmp / "s").mkdir()
            res["serve"] = part_serve(tmp / "s")
    print(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
