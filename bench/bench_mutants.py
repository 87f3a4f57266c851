"""Mutation score of a model's real cases against PyTorch's own OpInfo sample inputs for the same ops.

    python bench/bench_mutants.py [--model granite4h] [--cases 16] [--samples 2] [--mutant NAME ...]
                                  [--backend eager] [--judge both] [--db PATH] [--exclude-op OP] [--json]

The RFC's claim — real shapes and values catch what synthetic tests miss — as a number. The same
faulty backends (:mod:`casedb.mutation.mutants`), the same execution core and the same judge
(:func:`casedb.run.target.execute_item`: ``execute.run_case`` + ``verdict.judge`` with the
``numerics.Policy`` tolerances, exactly what a ``casedb run`` worker does per case) run, in this
one process, over:

* **real**: ``--cases`` of the model's cases (every mark; a stable sample: one case per op first,
  then the rest, each in signature order — a hash, so sizes are mixed; ``--cases 0``: all), imported from
  ``manifests/<model>.yaml`` into a temporary DB unless ``--db`` holds the model;
* **OpInfo**: for every op of the model with an OpInfo in
  ``torch.testing._internal.common_methods_invocations.op_db`` (casedb op names mapped to OpInfo
  names: ``torch.Tensor.add_`` -> ``add``'s samples through the in-place op, ``torch.nn.functional.
  linear`` -> ``nn.functional.linear``, ``__and__`` -> ``bitwise_and`` ...; every variant), in each
  dtype the model's cases of that op use, ``--samples`` of its ``sample_inputs`` (evenly spread over
  the list) plus each one's ``.noncontiguous()`` version (as OpInfo's ``test_noncontiguous_samples``
  runs them). Each sample becomes a case whose tensors are ``init: data`` blobs (strides kept with
  the ``strided`` preset), judged with the default dtype tolerances (an OpInfo case has no manifest).

Per mutant and side: cases the bug changed (the mutant's own note), cases caught (a failing
outcome), score = caught / changed, over the cases the control (``casedb_mutant_none``) passed —
:func:`casedb.mutation.score.classify`, the definition ``casedb mutants`` uses. Needs ``expecttest``
(``pip install expecttest``): torch's test internals import it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# casedb op name (after torch. / torch.Tensor.) -> OpInfo name, where they differ
OPINFO_NAME = {"__and__": "bitwise_and", "__or__": "bitwise_or", "__eq__": "eq", "__floordiv__": "floor_divide",
               "__invert__": "bitwise_not", "getitem": "__getitem__", "greater": "gt", "less": "lt",
               "nn.functional.softmax": "softmax"}


def opinfo_name(op: str) -> tuple[str, bool]:
    """(OpInfo name, in-place) of a casedb op string."""
    name = op
    for prefix in ("torch.Tensor.", "torch.ops.aten.", "torch."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = name.split(".default")[0]
    inplace = name.endswith("_") and not name.endswith("__")
    if inplace:
        name = name[:-1]
    return OPINFO_NAME.get(name, name), inplace


class Blobs(dict):
    def put(self, t) -> str:
        import torch

        from casedb.cases.blobs import encode

        # a fresh dense copy: a "contiguous" view can still have odd strides on size-1 dims
        raw = encode(torch.empty(t.shape, dtype=t.dtype).copy_(t))
        sha = hashlib.sha256(raw).hexdigest()
        self[sha] = raw
        return sha


def _tensor_spec(t, blobs: Blobs) -> dict:
    spec = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "blob": blobs.put(t)}
    if not t.is_contiguous() and t.numel() > 1:
        spec["preset"] = "strided"
        spec["preset_args"] = {"stride": list(t.stride()), "storage_offset": 0}
    return {"tensor": spec}


def _value_spec(v, blobs: Blobs):
    """A case input for a sample's argument, or None when casedb cannot hold it."""
    import torch

    from casedb.cases.safe_eval import parse_py_literal

    if isinstance(v, torch.Tensor):
        return _tensor_spec(v, blobs)
    if isinstance(v, (list, tuple)) and v and all(isinstance(i, torch.Tensor) for i in v):
        return {"tensor_list": [_tensor_spec(i, blobs)["tensor"] for i in v]}
    if isinstance(v, torch.Size):
        v = tuple(v)
    if isinstance(v, torch.device):
        return {"value": str(v)}
    try:
        text = repr(v)
        back = parse_py_literal(text)
    except Exception:
        return None
    same = back == v or (isinstance(v, float) and math.isnan(v) and math.isnan(back))
    return {"py": text} if same else None


def opinfo_items(model_ops: dict, samples: int, blobs: Blobs, noncontiguous: bool = True):
    """Plan items for the OpInfo samples of the model's ops; returns (items, ops without an OpInfo)."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    from casedb.run import plan
    from casedb.cases.materialize import torch_dtype

    by_name: dict[str, list] = {}
    for o in op_db:
        by_name.setdefault(o.name, []).append(o)
        for a in o.aliases:
            by_name.setdefault(a.name, []).append(o)
    items, missing, seen = [], [], set()
    for op, dtypes_used in sorted(model_ops.items()):
        name, inplace = opinfo_name(op)
        infos = by_name.get(name)
        if not infos:
            missing.append(op)
            continue
        for info in infos:
            if inplace and info.inplace_variant is None:
                continue
            for dt in sorted(dtypes_used):
                dtype = torch_dtype(dt)
                key = (info.name, info.variant_test_name, inplace, dt)
                if key in seen or dtype not in info.supported_dtypes("cpu"):
                    continue
                seen.add(key)
                try:
                    every = list(info.sample_inputs("cpu", dtype))
                except Exception:
                    continue
                step = max(1, len(every) // max(1, samples))
                picked = every[::step][:samples]
                for i, s in enumerate(picked):
                    variants = [("", s)]
                    if noncontiguous:
                        try:
                            variants.append(("noncontig", s.noncontiguous()))
                        except Exception:
                            pass
                    for tag, sample in variants:
                        inputs = [_value_spec(a, blobs) for a in (sample.input, *sample.args)]
                        attrs = {k: _value_spec(v, blobs) for k, v in sample.kwargs.items()}
                        if any(x is None for x in inputs) or any(x is None for x in attrs.values()):
                            continue
                        sig = hashlib.sha256(json.dumps([op, inputs, attrs, dt], sort_keys=True).encode()).hexdigest()
                        case_name = f"{info.name}.{info.variant_test_name or 'default'}.{dt}.{i}{tag}"
                        occ = plan.Occurrence(model_case_id=None, model="opinfo", name=case_name)
                        items.append(plan.PlanItem(id=case_name, signature=sig, op=op, dtype=dt, seed=0, shapes="",
                                                   attrs=attrs, inputs=inputs,
                                                   occurrences=[occ], marks=[]))
    return items, missing


def _verdicts(ex, item, policy) -> dict:
    """judge -> Verdict of one execution for the item's first occurrence, under every judge (judging
    again runs nothing)."""
    from casedb.judge import numerics, verdict

    occ = item.occurrences[0]
    tols = policy.tolerances(vars(occ), item.case, ex.dtypes() or [item.case["dtype"]])
    return {j: verdict.judge(ex, tolerances=tols, judge=j, expects_error=occ.expects_error)
            for j in numerics.JUDGES}


def score_items(items, names, base: str, load_blob, label: str, progress: bool) -> dict:
    """Run the control and each mutant over ``items`` through the execution core (``run_case``, as a
    run's worker calls it) and judge each execution under every judge; tally per judge and mutant."""
    from casedb.run import execute
    from casedb.mutation import harness, mutants, score as mutation  # noqa: F401 (mutants: registers the bugs)
    from casedb.judge import numerics

    os.environ[harness.BASE_ENV] = base

    def new_tally():
        return {"changed": 0, "caught": 0, "survivors": [], "within_precision": 0, "failed_unchanged": 0,
                "ops_changed": set(), "ops_caught": set()}

    judges = {j: {"control": {"executed": 0, "passed": 0, "false_alarms": [], "other": {}, "ops": set()},
                  "mutants": {n: new_tally() for n in names}} for j in numerics.JUDGES}
    t0 = time.perf_counter()
    for k, item in enumerate(items, 1):
        def run(name):
            backend = harness.PREFIX + name
            ex = execute.run_case(item.case, device="cpu", backend=backend, load_blob=load_blob, high_precision=True)
            return ex, _verdicts(ex, item, numerics.Policy([], device="cpu", backend=backend))

        _, ctrl = run(harness.CONTROL)
        for j, v in ctrl.items():
            c = judges[j]["control"]
            c["executed"] += 1
            if v.outcome == "passed":
                c["passed"] += 1
                c["ops"].add(item.op)
            elif v.outcome in mutation.FAILING:
                c["false_alarms"].append(f"{item.occurrences[0].name} {item.op}: {v.reason[:160]}")
            else:
                c["other"][v.outcome] = c["other"].get(v.outcome, 0) + 1
        if any(v.outcome == "passed" for v in ctrl.values()):
            for n in names:
                ex, verdicts = run(n)
                note = ex.notes.get("mutant")
                # one measure of "within precision" for every judge (the tolerance judge measures no
                # ULPs), so that the judges' scores share their denominators
                ulp = next((v.ulp_err for v in verdicts.values() if v.ulp_err is not None), None)
                for j, v in verdicts.items():
                    t = judges[j]["mutants"][n]
                    what = mutation.classify(ctrl[j].outcome, v.outcome, note, ulp)
                    if what in ("caught", "survived"):
                        t["changed"] += 1
                        t["ops_changed"].add(item.op)
                        if what == "caught":
                            t["caught"] += 1
                            t["ops_caught"].add(item.op)
                        else:
                            t["survivors"].append({"case": item.occurrences[0].name, "op": item.op,
                                                   "shapes": item.shapes, "ulp_err": v.ulp_err,
                                                   "ref_ulp_err": v.ref_ulp_err, "max_abs_err": v.max_abs_err,
                                                   "max_rel_err": v.max_rel_err, "tolerance": v.tolerance})
                    elif what == "failed_unchanged":
                        t["failed_unchanged"] += 1
                    elif what == "within_precision":
                        t["within_precision"] += 1
                del ex
        if progress:
            print(f"\r{label}: {k}/{len(items)} cases, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr,
                  flush=True)
    if progress:
        print(file=sys.stderr)
    for per in judges.values():
        for t in per["mutants"].values():
            t["score"] = round(t["caught"] / t["changed"], 4) if t["changed"] else None
            t["ops_changed"], t["ops_caught"] = sorted(t["ops_changed"]), sorted(t["ops_caught"])
        per["control"]["ops"] = sorted(per["control"]["ops"])
    return {"judges": judges, "seconds": round(time.perf_counter() - t0, 1)}


def rescored(out: dict) -> dict:
    """A saved report with survivors within precision (``mutation.classify``) counted apart, for
    reports saved before that class existed (the survivors carry their ``ulp_err``)."""
    from casedb.mutation.score import within_precision

    for side in ("real", "opinfo"):
        for per in out[side]["judges"].values():
            for t in per["mutants"].values():
                if "within_precision" in t:
                    continue
                within = [sv for sv in t["survivors"] if within_precision(sv["ulp_err"])]
                t["survivors"] = [sv for sv in t["survivors"] if sv not in within]
                t["within_precision"] = len(within)
                t["changed"] -= len(within)
                t["score"] = round(t["caught"] / t["changed"], 4) if t["changed"] else None
    return out


def print_tables(out: dict, judge: str) -> None:
    print(f"{out['model']}: {out['ops']} ops, {len(out['ops_without_opinfo'])} without an OpInfo "
          f"({', '.join(out['ops_without_opinfo'])}); {out['real_cases']} real cases, {out['opinfo_cases']} OpInfo "
          f"samples; base {out['base']}")
    for side in ("real", "opinfo"):
        for j, per in out[side]["judges"].items():
            c = per["control"]
            print(f"{side}, judge {j}: control passed {c['passed']} of {c['executed']}, false alarms "
                  f"{len(c['false_alarms'])}, other {c['other']}")
            for a in c["false_alarms"][:3]:
                print(f"  false alarm: {a}")
        print(f"{side}: {out[side]['seconds']} s")

    def pct(t):
        return "-" if t["score"] is None else f"{100 * t['score']:.0f} %"

    for j in (judge, *[x for x in out["real"]["judges"] if x != judge]):
        real_j, op_j = out["real"]["judges"][j], out["opinfo"]["judges"][j]
        # the ops a mutant is caught on, counted over ops with a passing control case on both sides
        common = set(real_j["control"]["ops"]) & set(op_j["control"]["ops"])
        print(f"\njudge {j} ({len(common)} ops with passing control cases on both sides)\n")
        print("| mutant | real: caught / changed | score | within precision | ops caught "
              "| OpInfo: caught / changed | score | within precision | ops caught |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in out["mutants"]:
            r, o = real_j["mutants"][n], op_j["mutants"][n]
            rc, oc = len(set(r["ops_caught"]) & common), len(set(o["ops_caught"]) & common)
            print(f"| {n} | {r['caught']} / {r['changed']} | {pct(r)} | {r['within_precision']} | {rc} "
                  f"| {o['caught']} / {o['changed']} | {pct(o)} | {o['within_precision']} | {oc} |")
    judges = list(out["real"]["judges"])
    print("\njudges side by side: caught / changed (score) on real cases; control false alarms first\n")
    print(f"| mutant | {' | '.join(judges)} |")
    print(f"|---|{'---:|' * len(judges)}")
    print(f"| control false alarms | "
          f"{' | '.join(str(len(out['real']['judges'][j]['control']['false_alarms'])) for j in judges)} |")
    for n in out["mutants"]:
        cells = [out["real"]["judges"][j]["mutants"][n] for j in judges]
        print(f"| {n} | " + " | ".join(f"{t['caught']} / {t['changed']} ({pct(t)})" for t in cells) + " |")
    for side in ("real", "opinfo"):
        for n in out["mutants"]:
            for sv in out[side]["judges"][judge]["mutants"][n]["survivors"][:3]:
                print(f"{side} survivor of {n} (judge {judge}): {sv}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="granite4h")
    ap.add_argument("--db", help="A casedb DB holding the model (default: manifests/<model>.yaml in a temp DB).")
    ap.add_argument("--cases", type=int, default=16,
                    help="Real cases: one per op first, then the rest, each by signature (a hash); 0: all.")
    ap.add_argument("--samples", type=int, default=2,
                    help="OpInfo samples per (OpInfo, dtype), each also noncontiguous.")
    ap.add_argument("--no-noncontiguous", action="store_true", help="OpInfo samples as given only.")
    ap.add_argument("--mutant", action="append", help="Only these mutants (default: all).")
    ap.add_argument("--exclude-op", action="append", default=[], metavar="OP",
                    help="Leave this op's real cases out (e.g. torch._grouped_mm: bf16 on a CPU without bf16 "
                         "instructions runs for minutes per execution, 15 executions per case).")
    ap.add_argument("--max-numel", type=int, default=None, metavar="N",
                    help="Leave out real cases whose inputs hold more than N elements (granite-vision's "
                         "largest bf16 matmuls take minutes per execution on a CPU).")
    ap.add_argument("--backend", default="eager", help="The base backend the mutants wrap.")
    ap.add_argument("--judge", default="both", choices=("tolerance", "ulp", "both"),
                    help="The judge whose table comes first (every judge is measured).")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="No progress on stderr.")
    ap.add_argument("--save", metavar="PATH", help="Also write the JSON report here.")
    ap.add_argument("--report", metavar="PATH", help="Print the tables of a report saved with --save; run nothing.")
    args = ap.parse_args()
    if args.report:
        print_tables(rescored(json.loads(Path(args.report).read_text())), args.judge)
        return

    import logging

    import torch  # noqa: F401

    from casedb.ingest import save as ingest
    from casedb.mutation import score as mutation

    logging.disable(logging.ERROR)  # dynamo logs every sample it cannot compile (the control reports them)
    from casedb.run.plan import build_plan
    from casedb.store.database import Store

    names = mutation.pick(args.mutant)
    with tempfile.TemporaryDirectory(prefix="casedb-bench-mutants-") as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "cases.db"
        store = Store(db)
        if not args.db:
            ingest.import_paths(store, [ROOT / "manifests" / f"{args.model}.yaml"])
        every = [it for it in build_plan(store, [args.model]) if it.op not in args.exclude_op
                 and (args.max_numel is None or it.numel <= args.max_numel)]
        # one case per op first (the first by signature, a hash), then the rest by signature
        by_sig = sorted(every, key=lambda it: it.signature)
        firsts = list({it.op: it for it in reversed(by_sig)}.values())
        firsts.sort(key=lambda it: it.signature)
        chosen = {id(it) for it in firsts}
        real = firsts + [it for it in by_sig if id(it) not in chosen]
        real = real[: args.cases] if args.cases else real
        model_ops: dict[str, set] = {}
        for it in every:
            model_ops.setdefault(it.op, set()).add(it.case["dtype"])
        blobs = Blobs()
        t0 = time.perf_counter()
        op_items, missing = opinfo_items(model_ops, args.samples, blobs, noncontiguous=not args.no_noncontiguous)
        t_samples = time.perf_counter() - t0

        def load(sha):
            return blobs[sha] if sha in blobs else store.load_blob(sha)

        progress = not args.quiet
        out = {"model": args.model, "base": args.backend, "judge": args.judge, "mutants": names,
               "max_numel": args.max_numel, "excluded_ops": args.exclude_op,
               "ops": len(model_ops), "ops_without_opinfo": missing, "real_cases": len(real),
               "model_cases": len(every), "opinfo_cases": len(op_items), "opinfo_build_s": round(t_samples, 1),
               "real": score_items(real, names, args.backend, load, "real cases", progress),
               "opinfo": score_items(op_items, names, args.backend, load, "OpInfo samples", progress)}
        store.close()
    if args.save:
        Path(args.save).write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print_tables(out, args.judge)


if __name__ == "__main__":
    main()
