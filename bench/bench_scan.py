"""Wall time and peak RSS of `casedb scan` for the target models, each in a fresh process.

    python bench/bench_scan.py [--models granite4h gpt-oss ...] [--level torch|aten] [--repeat 3] [--json]

Each run is ``/usr/bin/time -v python -m casedb scan MODEL -o <tmp>.jsonl --json`` (prefill and
decode, full-size model on the meta device), so the figures include the Python, torch and
transformers imports: what a user waits for. Baseline, in the same run: the floor of any
meta-device scan — a fresh process that imports, builds the same model and runs the same two
forward passes with nothing recorded. Reported per model: the median wall time and peak RSS
over ``--repeat`` runs, the ratio to the floor, and the unique calls / ops the scan recorded.

Goal (issue 3): < 30 s and < 2 GB per model on a 2-core machine; target < 10 s and < 1.5 GB.
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
MODELS = ("granite4h", "gpt-oss", "granite-vision", "granite-speech")
# The same build and forward passes as a scan, with the recorder off.
FLOOR = """
import sys, torch
from casedb import scan
recipe = scan.load_recipe(sys.argv[1])
model = scan._build(recipe)
rec = scan._Recorder("torch", recipe.model)
with torch.no_grad():
    out = scan._forward(model, scan._prefill_inputs(recipe, model), rec, record=False)
    scan._forward(model, scan._decode_inputs(recipe, model, out), rec, record=False)
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


def run_once(model: str, level: str, out: Path) -> dict:
    wall, rss, stdout = timed([sys.executable, "-m", "casedb", "scan", model, "-o", str(out), "--level", level, "--json"])
    floor_wall, floor_rss, _ = timed([sys.executable, "-c", FLOOR, model])
    summary = json.loads(stdout)
    return {"wall_s": wall, "rss_mb": rss, "floor_s": floor_wall, "floor_mb": floor_rss, "scan_s": summary["seconds"],
            "unique_calls": summary["unique_calls"], "ops": summary["ops"], "calls": summary["calls"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--level", default="torch", choices=("torch", "aten"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            runs = [run_once(model, args.level, Path(tmp) / f"{model}.jsonl") for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "scan_s", "rss_mb", "floor_s", "floor_mb")}
            rows.append({"model": model, "level": args.level, "runs": args.repeat,
                         "wall_s": round(med["wall_s"], 2), "scan_s": round(med["scan_s"], 2),
                         "rss_mb": round(med["rss_mb"]), "floor_s": round(med["floor_s"], 2),
                         "floor_mb": round(med["floor_mb"]), "vs_floor": round(med["wall_s"] / med["floor_s"], 2),
                         **{k: runs[0][k] for k in ("unique_calls", "ops", "calls")}})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| model | level | wall (s) | peak RSS (MB) | floor: build + forward, no recording (s / MB) "
          "| scan / floor | unique calls | ops | calls |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['level']} | {r['wall_s']} | {r['rss_mb']} | {r['floor_s']} / {r['floor_mb']} | "
              f"{r['vs_floor']}x | {r['unique_calls']} | {r['ops']} | {r['calls']} |")


if __name__ == "__main__":
    main()
