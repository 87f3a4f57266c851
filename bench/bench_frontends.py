"""Three models casedb does not ship, through every front end: `casedb scan`, a Kineto trace and an
Execution Trace of one forward pass, imported into one DB, run on eager, and the calls the scan and
each trace share counted by the one op identity (issue 44 items 4 and must-show).

    python bench/bench_frontends.py [--out DIR] [--models t5 whisper mixtral] [--no-run] [--json]

Models: T5 (encoder-decoder), Whisper (audio) and Mixtral (MoE), transformers' own config classes
at 2 layers and small widths, random weights, built on the CPU from the config (no download). Per
model, in DIR (default: a temporary folder):

* ``<model>.json`` — the config (``architectures`` names the class); ``casedb scan <model>.json``
  writes ``<model>.scan.jsonl`` (every path: prefill and decode, on the meta device, bf16);
* ``<model>.kineto.json`` and ``<model>.et.json`` — ONE bf16 forward of the same model, with the
  inputs of the scan's prefill (batch 1, the scan's default lengths), recorded by both profilers
  at once (``profile(record_shapes=True, execution_trace_observer=...)``).

The scan is imported as model ``<model>``, the traces as ``<model>-kineto`` and ``<model>-et``,
all into ``DIR/frontends.sqlite``; ``casedb run --backend eager`` runs every case of the three
models (each front end's); shared calls are the trace model's cases that are the scan model's too
(one case, counted by ``casedb.cases.identity``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _configs():
    import transformers as tf

    return {
        "tiny-t5": (tf.T5Config(architectures=["T5ForConditionalGeneration"], vocab_size=128, d_model=32, d_kv=8,
                                d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                                relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                decoder_start_token_id=0, pad_token_id=0),
                    {"seq_len": 128, "decoder_len": 1}),
        "tiny-whisper": (tf.WhisperConfig(architectures=["WhisperForConditionalGeneration"], vocab_size=128,
                                          d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                          num_mel_bins=16, max_source_positions=32, max_target_positions=64,
                                          decoder_start_token_id=1, pad_token_id=0, eos_token_id=2,
                                          bos_token_id=1, suppress_tokens=None, begin_suppress_tokens=None),
                         {"decoder_len": 4}),
        "tiny-mixtral": (tf.MixtralConfig(architectures=["MixtralForCausalLM"], vocab_size=128, hidden_size=32,
                                          intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                          max_position_embeddings=512),
                         {"seq_len": 256}),
    }


MODELS = {"t5": "tiny-t5", "whisper": "tiny-whisper", "mixtral": "tiny-mixtral"}


def _inputs(name: str, cfg, lengths: dict):
    import torch

    g = torch.Generator().manual_seed(0)
    if name == "tiny-whisper":
        feats = torch.randn(1, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=g).to(torch.bfloat16)
        return {"input_features": feats,
                "decoder_input_ids": torch.randint(3, cfg.vocab_size, (1, lengths["decoder_len"]), generator=g)}
    ids = torch.randint(1, cfg.vocab_size, (1, lengths["seq_len"]), generator=g)
    if name == "tiny-t5":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "decoder_input_ids": torch.zeros(1, lengths["decoder_len"], dtype=torch.long)}
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def trace(name: str, out: Path) -> dict:
    """One bf16 forward of the model recorded by Kineto and ET at once; the two files' sizes."""
    import torch
    import transformers as tf
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    cfg, lengths = _configs()[name]
    torch.manual_seed(0)
    model = getattr(tf, cfg.architectures[0])(cfg).eval().to(torch.bfloat16)
    inputs = _inputs(name, cfg, lengths)
    kineto, et_path = out / f"{name}.kineto.json", out / f"{name}.et.json"
    with torch.no_grad():
        model(**inputs)  # warm-up: lazy initialisation stays out of the trace
        et = ExecutionTraceObserver().register_callback(str(et_path))
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, execution_trace_observer=et) as prof:
            model(**inputs)
        prof.export_chrome_trace(str(kineto))
    return {"kineto_bytes": kineto.stat().st_size, "et_bytes": et_path.stat().st_size}


def casedb(*args: str, db: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"CASEDB_DB": str(db)} if db else {})}
    return subprocess.run([sys.executable, "-m", "casedb", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env)


def _checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{what} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def generate(name: str, out: Path) -> dict:
    cfg, _ = _configs()[name]
    cfg.to_json_file(str(out / f"{name}.json"))
    t0 = time.perf_counter()
    scan = out / f"{name}.scan.jsonl"
    _checked(casedb("scan", str(out / f"{name}.json"), "-o", str(scan)), f"scan {name}")
    figures = {"scan_s": round(time.perf_counter() - t0, 1)}
    figures.update(trace(name, out))
    return figures


def import_all(name: str, out: Path, db: Path) -> dict:
    """The scan, the Kineto trace and the ET trace into one DB; each import's counts (``linked``:
    calls already cases under another spelling)."""
    reports = {}
    for front, args in (("scan", [str(out / f"{name}.scan.jsonl")]),
                        ("kineto", ["--model", f"{name}-kineto", str(out / f"{name}.kineto.json")]),
                        ("et", ["--model", f"{name}-et", "--format", "et", str(out / f"{name}.et.json")])):
        proc = _checked(casedb("import", "--json", *args, db=db), f"import {name} {front}")
        (report,) = json.loads(proc.stdout)["files"]
        reports[front] = {k: report[k] for k in ("records", "occurrences", "new_cases", "duplicates", "linked",
                                                 "skipped")}
    return reports


def shared(db: Path, name: str) -> dict:
    """Per trace: its cases, and those that are the scan's cases too (one identity, one case)."""
    import sqlite3

    conn = sqlite3.connect(str(db))
    q = """SELECT count(DISTINCT t.signature), count(DISTINCT s.signature) FROM model_cases t
           LEFT JOIN model_cases s ON s.signature = t.signature AND s.model = ? AND s.retired_at IS NULL
           WHERE t.model = ? AND t.retired_at IS NULL"""
    out = {}
    for front in ("kineto", "et"):
        cases, common = conn.execute(q, [name, f"{name}-{front}"]).fetchone()
        out[front] = {"cases": cases, "shared_with_scan": common}
    out["scan_cases"] = conn.execute("SELECT count(DISTINCT signature) FROM model_cases WHERE model = ?",
                                     [name]).fetchone()[0]
    out["kineto_et_shared"] = conn.execute(
        """SELECT count(DISTINCT a.signature) FROM model_cases a JOIN model_cases b ON a.signature = b.signature
           WHERE a.model = ? AND b.model = ?""", [f"{name}-kineto", f"{name}-et"]).fetchone()[0]
    conn.close()
    return out


def run_eager(db: Path, models: list[str], out: Path) -> dict:
    args = ["run", "--backend", "eager", "--json"]
    for m in models:
        args += ["--model", m]
    t0 = time.perf_counter()
    proc = casedb(*args, db=db)
    wall = round(time.perf_counter() - t0, 1)
    (out / "run.json").write_text(proc.stdout)
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"casedb run exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"exit": proc.returncode, "wall_s": wall, "summary": summary.get("totals", summary)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    ap.add_argument("--no-run", action="store_true", help="import and count only (no casedb run)")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    out = opts.out or Path(tempfile.mkdtemp(prefix="frontends-"))
    out.mkdir(parents=True, exist_ok=True)
    db = out / "frontends.sqlite"
    if db.exists():
        db.unlink()
    result = {"out": str(out), "models": {}}
    for key in opts.models:
        name = MODELS[key]
        figures = generate(name, out)
        figures["imports"] = import_all(name, out, db)
        figures["shared"] = shared(db, name)
        result["models"][name] = figures
    if not opts.no_run:
        names = [m for key in opts.models for m in (MODELS[key], f"{MODELS[key]}-kineto", f"{MODELS[key]}-et")]
        result["run"] = run_eager(db, names, out)
    if opts.json:
        print(json.dumps(result, indent=2))
        return
    for name, f in result["models"].items():
        s = f["shared"]
        print(f"{name}: scan {s['scan_cases']} cases ({f['scan_s']} s); kineto {s['kineto']['cases']} cases, "
              f"{s['kineto']['shared_with_scan']} shared with the scan ({f['kineto_bytes']:,} B); et "
              f"{s['et']['cases']} cases, {s['et']['shared_with_scan']} shared ({f['et_bytes']:,} B); "
              f"kineto/et shared {s['kineto_et_shared']}")
    if "run" in result:
        print(f"casedb run --backend eager: exit {result['run']['exit']}, {result['run']['wall_s']} s, "
              f"{json.dumps(result['run']['summary'])}")
    print(f"files in {out}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    main()
