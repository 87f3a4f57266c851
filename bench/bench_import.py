"""Import throughput of a large Kineto trace vs a raw SQLite executemany of the same events.

    python bench/bench_import.py [--events 200000] [--variants 20] [--repeat 3] [--gzip] [--json]

Builds a Kineto trace of ``--events`` cpu_op events in the exact format of
``export_chrome_trace`` (the events of tests/data/traces/llama_tiny_forward.kineto.json, a real
profile of a tiny Llama, repeated with shifted timestamps and, per repetition, one of
``--variants`` sequence lengths so the trace holds that many distinct shape sets), then in the
same process:

* **casedb**: ``casedb.ingest.save.import_paths`` into a fresh DB: read + decode JSON, nest, aggregate,
  resolve overloads, normalize, sign and save (the path ``casedb import --model`` takes);
* **casedb's decoder alone** (GC paused): ``importers.kineto.DECODER``, the typed msgspec decode
  casedb uses. It builds only the 7 event fields casedb reads and keeps the 4 argument columns
  as raw text, so it does less than a full decode: the honest ceiling of this importer, and a
  lower bar than the full decoders below;
* **json.loads alone**, **orjson.loads alone** (GC paused, for reference): full decoders that
  build every dict and list of the trace (json.loads: casedb before issue 30; orjson: casedb's
  decoder before the typed one);
* **casedb, DB exists**: the same import into an empty DB whose schema is made beforehand
  (``casedb import`` into a project's DB: the fresh file above also creates the schema);
* **parse only**: ``list(importers.kineto.parse(path))``, the records (file read included);
* **prepare**: ``casedb.ingest.save.prepare``: parse, then normalize and sign every record (no DB);
* **raw executemany**: decode the same file and ``executemany`` one row per cpu_op event
  (name, ts, dur, args JSON) into a fresh SQLite table in one transaction: the least any
  importer of this file must do;
* **raw executemany (pre-built rows)**: the executemany alone, rows already in memory;
* **the same rows**: ``executemany`` of exactly the rows casedb stored (models, cases,
  model_cases) into empty copies of its tables.

Rates are trace events per second. Goal (issue 30): casedb >= 200k events/s, or within 1.2x of
the decoder alone, measured in the same run; the ratios to each decoder are printed, and where
the import's time goes: reading the file, decoding, the Python passes of the importer (parse
minus read and decode: nesting, grouping, the records, freeing the decoded events), normalize +
sign (prepare minus parse), opening the DB and saving (import minus prepare). ``--repeat N``
runs all of it N times in the process and prints each figure's median (ratios: the median of
each run's ratio) and the load average before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT / "tests" / "data" / "traces" / "llama_tiny_forward.kineto.json"


def _resize(obj, old: int, new: int):
    """Replace the sequence length in nested dims/strides/concrete lists (7 -> new)."""
    if isinstance(obj, list):
        return [_resize(x, old, new) for x in obj]
    if isinstance(obj, int) and not isinstance(obj, bool):
        return new if obj == old else obj
    return obj


def make_trace(path: Path, events: int, variants: int) -> int:
    base = json.loads(FIXTURE.read_text())
    ops = [e for e in base["traceEvents"] if e.get("cat") == "cpu_op"]
    t0 = min(e["ts"] for e in ops)
    span = max(e["ts"] + e["dur"] for e in ops) - t0 + 10.0
    sets = []
    for v in range(min(variants, max(1, events // len(ops) + 1))):
        seq = 7 + v * 2  # never 7*k collisions with other dims of the fixture (32, 64, 128 ...)
        vs = []
        for e in ops:
            a = dict(e["args"])
            a["Input Dims"] = _resize(a["Input Dims"], 7, seq)
            a["Input Strides"] = a["Input Strides"]  # strides kept: they stay valid layouts
            vs.append((e, a))
        sets.append(vs)
    out = []
    rep = 0
    while len(out) < events:
        for e, a in sets[rep % len(sets)]:
            if len(out) >= events:
                break
            ev = dict(e)
            ev["ts"] = round(e["ts"] - t0 + rep * span, 3)
            ev["args"] = dict(a, **{"External id": len(out) + 1, "Ev Idx": len(out)})
            out.append(ev)
        rep += 1
    # Written in export_chrome_trace's own layout (one key per line, args on one line), so the
    # file has the size and shape of a real trace of this many events.
    head = {k: v for k, v in base.items() if k not in ("traceEvents", "traceName")}
    with open(path, "w") as f:
        f.write("{\n" + "".join(f'  "{k}": {json.dumps(v)},\n' for k, v in head.items()) + '  "traceEvents": [\n')
        for j, ev in enumerate(out):
            args = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in ev["args"].items())
            f.write(f'  {{\n    "ph": "X",\n    "cat": "cpu_op",\n    "name": "{ev["name"]}",\n'
                    f'    "pid": {ev["pid"]},\n    "tid": {ev["tid"]},\n    "ts": {ev["ts"]},\n'
                    f'    "dur": {ev["dur"]}\n    ,\n    "args": {{\n      {args}\n    }}\n  }}'
                    + (",\n" if j + 1 < len(out) else "\n"))
        f.write(f'  ],"traceName": "{path}" }}\n')
    return len(out)


def raw_executemany(path: Path, db: Path) -> tuple[float, float]:
    """(seconds decode+insert, seconds insert only) for one row per cpu_op event.

    Decoding runs with the GC paused, as the importer does, so both sides pay the same for it.
    """
    from importers.kineto import paused_gc

    t = time.perf_counter()
    with paused_gc():
        data = json.loads(path.read_bytes())
        rows = [(e["name"], e["ts"], e["dur"], json.dumps(e["args"]))
                for e in data["traceEvents"] if e.get("cat") == "cpu_op"]
        del data
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE events (name TEXT, ts REAL, dur REAL, args TEXT)")
    t_ins = time.perf_counter()
    with con:
        con.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", rows)
    end = time.perf_counter()
    con.close()
    return end - t, end - t_ins


def raw_same_rows(casedb_db: Path, db: Path) -> tuple[int, float]:
    """(rows, seconds) to executemany the rows casedb stored into empty copies of its tables."""
    src = sqlite3.connect(casedb_db)
    tables = ["models", "cases", "model_cases"]
    schema = {t: src.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [t]).fetchone()[0]
              for t in tables}
    rows = {t: src.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
    src.close()
    con = sqlite3.connect(db)
    for t in tables:
        con.execute(schema[t])
    t0 = time.perf_counter()
    with con:
        for t in tables:
            if rows[t]:
                con.executemany(f"INSERT INTO {t} VALUES ({', '.join('?' * len(rows[t][0]))})", rows[t])
    seconds = time.perf_counter() - t0
    con.close()
    return sum(len(r) for r in rows.values()), seconds


def _timed(fn, res: dict, key: str):
    """``fn()``, its wall seconds in ``res[key]`` and its CPU seconds (this process) in
    ``res[key + "_cpu"]``: CPU time is what other work on a shared machine inflates least."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    res[key], res[key + "_cpu"] = round(time.perf_counter() - t, 3), round(time.process_time() - c, 3)
    return out


def one_run(trace: Path, tmp: Path, rep: int, gz: Path | None) -> dict:
    """Every figure of one run: the decoders alone, parse, prepare, the whole import, the raw
    baselines (seconds; a fresh DB file per run)."""
    import orjson

    from casedb.ingest.save import import_paths, prepare
    from casedb.store.database import Store
    from importers import kineto
    from casedb.files import read_bytes
    from importers.kineto import paused_gc

    res: dict = {}
    raw = _timed(lambda: read_bytes(trace), res, "read_s")
    with paused_gc():
        for key, decode in (("typed_only_s", kineto.DECODER.decode), ("decode_only_s", json.loads),
                            ("orjson_only_s", orjson.loads)):
            decoded = _timed(lambda: decode(raw), res, key)
            del decoded
    del raw
    recs = _timed(lambda: list(kineto.parse(trace)), res, "parse_s")
    res["records"], res["calls"] = len(recs), sum(r["count"] for r in recs)
    del recs
    _timed(lambda: prepare([trace], model="bench"), res, "prepare_s")

    def import_into(path: Path, db: Path):
        with Store(db) as store:
            return import_paths(store, [path], model="bench")

    report = _timed(lambda: import_into(trace, tmp / f"casedb{rep}.sqlite"), res, "casedb_s")
    res["new_cases"] = report.totals()["new_cases"]
    Store(tmp / f"existing{rep}.sqlite").close()  # the schema made: what importing into a project's DB finds
    _timed(lambda: import_into(trace, tmp / f"existing{rep}.sqlite"), res, "casedb_existing_s")
    res["raw_s"], res["raw_insert_only_s"] = (round(x, 3) for x in raw_executemany(trace, tmp / f"raw{rep}.sqlite"))
    res["same_rows"], same_s = raw_same_rows(tmp / f"casedb{rep}.sqlite", tmp / f"same{rep}.sqlite")
    res["raw_same_rows_s"] = round(same_s, 4)
    if gz is not None:
        _timed(lambda: import_into(gz, tmp / f"casedb_gz{rep}.sqlite"), res, "casedb_gz_s")
    return res


def rates_and_ratios(res: dict, n: int) -> dict:
    """Events/s and the ratios of one run (ratios taken within the run, then the median of them)."""
    rate = lambda s: round(n / s) if s else None  # noqa: E731
    out = {f"{k[:-2]}_events_per_s": rate(res[k]) for k in
           ("decode_only_s", "orjson_only_s", "typed_only_s", "parse_s", "prepare_s", "casedb_s",
            "casedb_existing_s", "raw_s", "casedb_gz_s") if k in res}
    out["raw_insert_only_rows_per_s"] = rate(res["raw_insert_only_s"])
    # casedb's own decoder (typed) is its ceiling; the full decoders for reference
    out["ratio_vs_decoder"] = round(res["casedb_s"] / res["typed_only_s"], 2)
    out["ratio_cpu_vs_decoder"] = round(res["casedb_s_cpu"] / res["typed_only_s_cpu"], 2)
    out["parse_ratio_vs_decoder"] = round(res["parse_s"] / res["typed_only_s"], 2)
    out["ratio_vs_orjson"] = round(res["casedb_s"] / res["orjson_only_s"], 2)
    out["ratio_vs_json"] = round(res["casedb_s"] / res["decode_only_s"], 2)
    out["ratio_vs_raw"] = round(res["raw_s"] / res["casedb_s"], 2)
    out["ratio_vs_raw_insert_only"] = round(res["raw_insert_only_s"] / res["casedb_s"], 2)
    # where the import's time goes: each step is the previous one plus what it adds
    out["passes_s"] = round(res["parse_s"] - res["read_s"] - res["typed_only_s"], 3)
    out["normalize_s"] = round(res["prepare_s"] - res["parse_s"], 3)
    out["save_s"] = round(res["casedb_s"] - res["prepare_s"], 3)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--variants", type=int, default=20,
                    help="sequence-length variants of the forward (distinct shape sets; ~58 distinct calls each)")
    ap.add_argument("--repeat", type=int, default=1, help="runs in this process; each figure is the median")
    ap.add_argument("--gzip", action="store_true", help="also time the same trace as .json.gz")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)

    import torch  # noqa: F401  (loaded by casedb anyway; keep its import time out of the timings)

    res: dict = {"load_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trace = tmp / "big.pt.trace.json"
        n = make_trace(trace, args.events, args.variants)
        res["events"] = n
        res["trace_mb"] = round(trace.stat().st_size / 1e6, 1)
        gz = None
        if args.gzip:
            gz = tmp / "big.pt.trace.json.gz"
            with open(trace, "rb") as src, gzip.open(gz, "wb", compresslevel=1) as dst:
                dst.write(src.read())
        runs = []
        for rep in range(args.repeat):
            one = one_run(trace, tmp, rep, gz)
            runs.append({**one, **rates_and_ratios(one, n)})
    res.update({k: statistics.median_low(r[k] for r in runs) for k in runs[0]})  # a value of a run
    res["runs"] = len(runs)
    res["casedb_s_each"] = [r["casedb_s"] for r in runs]
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    res["goal_met"] = res["casedb_events_per_s"] >= 200_000 or res["ratio_vs_decoder"] <= 1.2
    print(json.dumps(res, indent=2) if args.json else report(res))
    return res


def report(res: dict) -> str:
    n = res["events"]
    med = f"median of {res['runs']} runs, " if res["runs"] > 1 else ""
    lines = [
        f"{n} events ({res['trace_mb']} MB) -> {res['records']} records, {res['new_cases']} new cases"
        f"   ({med}load average {res['load_before'][0]} before, {res['load_after'][0]} after)",
        f"  casedb's decoder alone  {res['typed_only_s']:7.3f} s  {res['typed_only_events_per_s']:>9} events/s"
        "   (kineto.DECODER: typed msgspec, 7 fields built, args columns raw)",
        f"  json.loads alone        {res['decode_only_s']:7.3f} s  {res['decode_only_events_per_s']:>9} events/s"
        "   (full decode, stdlib: casedb before issue 30)",
        f"  orjson.loads alone      {res['orjson_only_s']:7.3f} s  {res['orjson_only_events_per_s']:>9} events/s"
        "   (full decode: casedb's decoder before the typed one)",
        f"  parse only              {res['parse_s']:7.3f} s  {res['parse_events_per_s']:>9} events/s",
        f"  prepare (no DB)         {res['prepare_s']:7.3f} s  {res['prepare_events_per_s']:>9} events/s"
        "   (parse + normalize + sign)",
        f"  casedb import           {res['casedb_s']:7.3f} s  {res['casedb_events_per_s']:>9} events/s"
        + (f"   (each run: {', '.join(map(str, res['casedb_s_each']))} s)" if res["runs"] > 1 else ""),
        f"  casedb import, DB exists {res['casedb_existing_s']:6.3f} s  {res['casedb_existing_events_per_s']:>9} events/s"
        "   (an empty DB with casedb's schema: no schema to create)",
        f"  CPU seconds (this process): decoder alone {res['typed_only_s_cpu']:.3f}, parse {res['parse_s_cpu']:.3f}, "
        f"import {res['casedb_s_cpu']:.3f} = {round(n / res['casedb_s_cpu'])} events per CPU-second, "
        f"{res['ratio_cpu_vs_decoder']}x the decoder's",
        f"  where the import's time goes: read {res['read_s']:.3f} s, decode {res['typed_only_s']:.3f} s, "
        f"nesting + grouping + records + freeing {res['passes_s']:.3f} s, normalize + sign {res['normalize_s']:.3f} s, "
        f"open DB + save {res['save_s']:.3f} s",
        f"  raw decode+executemany  {res['raw_s']:7.3f} s  {res['raw_events_per_s']:>9} events/s"
        f"   casedb/raw = {res['ratio_vs_raw']}x",
        f"  raw executemany only    {res['raw_insert_only_s']:7.3f} s  {res['raw_insert_only_rows_per_s']:>9} rows/s"
        f"     casedb/raw = {res['ratio_vs_raw_insert_only']}x",
        f"  executemany of the {res['same_rows']} rows casedb stored: {res['raw_same_rows_s']} s",
    ]
    if "casedb_gz_s" in res:
        lines.append(f"  casedb import .gz       {res['casedb_gz_s']:7.3f} s  {res['casedb_gz_events_per_s']:>9} events/s")
    lines += [
        f"  casedb import / casedb's decoder alone = {res['ratio_vs_decoder']}x"
        f"   (parse only / decoder = {res['parse_ratio_vs_decoder']}x)",
        f"  casedb import / orjson.loads alone = {res['ratio_vs_orjson']}x, / json.loads alone = {res['ratio_vs_json']}x",
        "  goal (>= 200k events/s, or within 1.2x of the decoder alone): " + ("met" if res["goal_met"] else "NOT met"),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
