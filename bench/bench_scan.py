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

    python bench/bench_scan.py --zoo --theirs DIR [--models ...] [--keep DIR]

``--zoo`` (issue 27): every recipe of :data:`ZOO` once, each in a fresh process under
``/usr/bin/time -v`` (``casedb scan MODEL --compare DIR/<their file>.txt``: the whole matrix):
wall time, peak RSS, union ops and unique cases, and the coverage of their tracer's ops (op
lists one op per line, as ``casedb scan --compare`` reads them). ``--keep DIR`` keeps the scan
JSONL (what the shipped manifests are exported from).
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
# Recipe -> the RFC implementation's model-ops file (tests/configs/model_ops_tests/<name>.yaml)
# of the same model, or of the same architecture where the shipped recipe is a sibling size.
ZOO = {
    "llama3.1-8b": "Meta-Llama-3.1-8B-Instruct", "mistral-small3.2-24b": "Mistral-Small-3.2-24B-Instruct-2506",
    "ministral3-14b": "Ministral-3-14B-Instruct-2512", "qwen2.5-7b": "Qwen2.5-7B-Instruct",
    "gemma4-12b": "gemma-4-12B-it", "gemma4-26b-a4b": "gemma-4-26B-A4B-it",
    "granite3.3-8b": "granite-3.3-8b-instruct", "granite4.1-8b": "granite-4.1-8b",
    "granite4h-tiny": "granite-4.0-h-tiny", "granite4h": "granite-4.0-h-tiny", "gpt-oss": "gpt-oss-20b",
    "bert-base": "bert-base-uncased", "bert-large": "bert-large-uncased", "bert-base-ner": "bert-base-NER-TokenCls",
    "roberta-base-squad2": "roberta-base-squad2", "roberta-large-mnli": "roberta-large-mnli-SeqCls",
    "roberta-large-ner": "roberta-large-ner-english-TokenCls",
    "distilbert-sst2": "distilbert-base-uncased-finetuned-sst-2-english-SeqCls", "mpnet-base-v2": "all-mpnet-base-v2",
    "minilm-l6-v2": "all-MiniLM-L6-v2-Embed", "clip-vit-b32": "clip-ViT-B-32-MMEmbed",
    "granite-embedding-278m": "granite-embedding-278m-multilingual",
    "slate-153m": "granite-multilingual-slate-153m-distilled", "slate-270m-ner": "granite-multilingual-slate-270m-NER",
    "granite-vision": "granite-vision-3.3-2b", "granite-speech": "granite-speech-3.3-8b",
    "granite-speech-8b": "granite-speech-3.3-8b",
}
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


def zoo(models: list[str], theirs: Path, keep: Path | None, as_json: bool) -> None:
    """The --zoo run: one matrix scan per recipe, its time, memory and coverage of their ops."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for model in models:
            their_file = theirs / f"{ZOO[model]}.txt"
            try:
                wall, rss, stdout = timed([sys.executable, "-m", "casedb", "scan", model, "--json", "--compare",
                                           str(their_file), "-o", str(out / f"{model}.jsonl")])
            except SystemExit as e:  # one model's failure is reported; the others still run
                print(f"{model}: FAILED {str(e)[-600:]}", file=sys.stderr)
                continue
            summary = json.loads(stdout)
            union = coverage(out / f"{model}.jsonl")["union"]
            rows.append({"model": model, "theirs": ZOO[model], "paths": len(summary.get("paths") or [1]),
                         "wall_s": round(wall, 1), "rss_mb": round(rss), "ops": union["ops"], "cases": union["cases"],
                         "compare": summary["compare"]})
            print(f"{model}: {wall:.1f} s, {rss:.0f} MB, {summary['compare']['coverage']} %", file=sys.stderr)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print("| recipe | their file | paths | wall (s) | peak RSS (MB) | ops | unique cases | coverage of their ops "
          "| theirs, not ours |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        c = r["compare"]
        print(f"| {r['model']} | {r['theirs']} | {r['paths']} | {r['wall_s']} | {r['rss_mb']} | {r['ops']} | {r['cases']} "
              f"| {c['coverage']} % ({c['matched']}/{c['theirs']}) | {', '.join(c['missing']) or '—'} |")
    print(f"\nzoo: {len(rows)} recipes, {sum(r['wall_s'] for r in rows):.0f} s in all, peak RSS "
          f"{max(r['rss_mb'] for r in rows)} MB")


def main() -> None:
    from casedb.scan.scanner import load_recipe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--level", default="torch", choices=("torch", "aten"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--zoo", action="store_true", help="every recipe of ZOO once, with coverage of --theirs")
    ap.add_argument("--theirs", type=Path, help="folder of their op lists (<file>.txt), for --zoo")
    ap.add_argument("--keep", type=Path, help="keep the --zoo scans (JSONL) in this folder")
    args = ap.parse_args()
    if args.zoo:
        if args.theirs is None:
            ap.error("--zoo needs --theirs DIR")
        zoo(args.models or list(ZOO), args.theirs, args.keep, args.json)
        return
    args.models = args.models or list(MODELS)
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
