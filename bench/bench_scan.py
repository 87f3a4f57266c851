"""Wall time and peak RSS of `casedb scan` for the target models, each in a fresh process: one
path against the whole matrix of paths, and the ops / unique cases of each path.

    python bench/bench_scan.py [--models granite4h gpt-oss ...] [--level torch|aten] [--repeat 3] [--json]

Per model and run, three fresh processes under ``/usr/bin/time -v`` (the figures include the
Python, torch and transformers imports: what a user waits for):

* ``single``: ``python -m casedb scan MODEL --path <default path>`` — the one path the shipped
  manifests came from before issue 14 (prefill + decode, full-size model on the meta device);
* ``matrix``: ``python -m casedb scan MODEL`` — every path of the recipe's matrix;
* ``floor``: the baseline of any meta-device scan — a process that imports, builds the model and
  runs the default path's two forward passes with nothing recorded.

Reported per model: medians over ``--repeat`` runs of each wall time and peak RSS, the medians
of the per-run ratios matrix / single (goal: < 4x) and single / floor, and from the matrix scan
the ops and unique cases (by signature, as an import counts them) of every path and of the union.

Goals: the matrix within 4x a single path (issue 14); a single path < 10 s and < 1.5 GB (issue 3).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODELS = ("granite4h", "gpt-oss", "granite-vision", "granite-speech")
# The same build and forward passes as a scan of the default path, with the recorder off.
FLOOR = """
import sys, torch
from casedb.scan import scanner as scan
recipe = scan.load_recipe(sys.argv[1])
path = recipe.paths()[0]
model = scan._build(recipe, path)
rec = scan.Recorder("torch", recipe.model)
with torch.no_grad():
    prefill = scan.prefill_inputs(recipe, model, path)
    out = scan._forward(model, prefill, rec, record=False)
    scan._forward(model, scan.decode_inputs(recipe, model, out, path, prefill), rec, record=False)
"""


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stdout) of one command under /usr/bin/time -v."""
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", proc.stderr).group(1)
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    seconds = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":"))))
    return seconds, rss_kb / 1024, proc.stdout


def run_once(model: str, default: str, level: str, tmp: Path) -> dict:
    scan = [sys.executable, "-m", "casedb", "scan", model, "--level", level, "--json"]
    single_s, single_mb, _ = timed([*scan, "--path", default, "-o", str(tmp / f"{model}-single.jsonl")])
    matrix_s, matrix_mb, stdout = timed([*scan, "-o", str(tmp / f"{model}-matrix.jsonl")])
    floor_s, floor_mb, _ = timed([sys.executable, "-c", FLOOR, model])
    return {"single_s": single_s, "single_mb": single_mb, "matrix_s": matrix_s, "matrix_mb": matrix_mb,
            "floor_s": floor_s, "floor_mb": floor_mb, "summary": json.loads(stdout)}


def coverage(path: Path) -> dict:
    from casedb.scan.scanner import ScanResult
    from casedb.scan.report import coverage as report

    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return report(ScanResult(header=lines[0], records=lines[1:], seconds=0.0))


def main() -> None:
    from casedb.scan.scanner import load_recipe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--level", default="torch", choices=("torch", "aten"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            default = load_recipe(model).paths()[0].name
            runs = [run_once(model, default, args.level, Path(tmp)) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "summary"}
            report = coverage(Path(tmp) / f"{model}-matrix.jsonl")
            seconds = {p["path"]: statistics.median(next(q["seconds"] for q in r["summary"]["paths"]
                                                         if q["path"] == p["path"]) for r in runs)
                       for p in report["paths"]}
            rows.append({"model": model, "level": args.level, "runs": args.repeat, "paths": len(report["paths"]),
                         **{k: round(v, 2 if k.endswith("_s") else None) for k, v in med.items()},
                         # ratios per run (a run's three processes ran back to back), then the median
                         "matrix_vs_single": round(statistics.median(r["matrix_s"] / r["single_s"] for r in runs), 2),
                         "single_vs_floor": round(statistics.median(r["single_s"] / r["floor_s"] for r in runs), 2),
                         "union": report["union"],
                         "per_path": [{"path": p["path"], "ops": p["ops"], "cases": p["cases"],
                                       "seconds": seconds[p["path"]], "adds": p["adds"]} for p in report["paths"]]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| model | paths | single path (s / MB) | matrix (s / MB) | matrix / single | floor (s) | single / floor "
          "| union ops | union unique cases |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['paths']} | {r['single_s']} / {r['single_mb']} | {r['matrix_s']} / {r['matrix_mb']} | "
              f"{r['matrix_vs_single']}x | {r['floor_s']} | {r['single_vs_floor']}x | {r['union']['ops']} | "
              f"{r['union']['cases']} |")
    for r in rows:
        print(f"\n{r['model']} (in-process seconds per path, from the matrix scan):\n")
        print("| path | ops | unique cases | s |")
        print("|---|---:|---:|---:|")
        for p in r["per_path"]:
            print(f"| {p['path']} | {p['ops']} | {p['cases']} | {p['seconds']} |")
        print(f"| union | {r['union']['ops']} | {r['union']['cases']} | |")


if __name__ == "__main__":
    main()
