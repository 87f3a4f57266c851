"""What the latencies of a measured run say (``casedb run --measure``): speedups over the
baseline per case, per op (geometric mean) and per model, each op's share of a model's time on
the target, the cases furthest below their roofline bound weighted by how often the models call
them, and the cases that got slower or faster than in another run.

A change is flagged only when it exceeds the threshold (default 10 %) *and* the measurement's
noise (:func:`changes`): the target's time is compared relative to the baseline timed beside it
in the same run, so a machine busier during one run than the other moves both and cancels out,
and a rank test over the per-block times (Mann-Whitney U, p < 0.01) must agree.
"""

from __future__ import annotations

import math

from casedb.store import latency as stored

DEFAULT_THRESHOLD = 0.10
P_VALUE = 0.01
# Below this a change is the jitter of one call's fixed costs (Python, the dispatcher, dynamo's
# guards: a few microseconds that move from process to process), not the kernel's: granite4h's
# tiny ops moved by up to 4 us between unchanged reruns on the CPU.
MIN_CHANGE_S = 5e-6
TOP = 20


geomean = stored.geomean


def summary(db, run_id: int, top: int = TOP) -> dict | None:
    """The run's latency figures, or None when it measured nothing."""
    rows = stored.measured(db, run_id)
    if not rows:
        return None
    calls = stored.per_model_calls(db, [r["signature"] for r in rows])
    cases = [_case(r) for r in rows]
    by_op: dict[str, list] = {}
    for c in cases:
        by_op.setdefault(c["op"], []).append(c)
    ops = [{"op": op, "cases": len(cs), "speedup": geomean(c["speedup"] for c in cs),
            "target_s": sum(c["target_s"] * c["calls"] for c in cs)} for op, cs in by_op.items()]
    ops.sort(key=lambda o: -o["target_s"])
    left = sorted((c for c in cases if c["left_s"] is not None), key=lambda c: -c["left_s"] * c["calls"])
    return {"measured": len(cases), "cost_s": round(sum(r["latency"].get("cost_s") or 0 for r in rows), 2),
            "baseline": rows[0]["latency"]["baseline"].get("backend"),
            "baseline_device": rows[0]["latency"]["baseline"].get("device"),
            "speedup": geomean(c["speedup"] for c in cases), "ops": ops,
            "models": _models(cases, calls), "cases": cases,
            "left_on_table": [dict(c, weighted_left_s=c["left_s"] * c["calls"]) for c in left[:top]],
            "peaks": rows[0]["latency"].get("peaks")}


def _case(r: dict) -> dict:
    lat = r["latency"]
    t = lat["target"]["median_s"]
    roof = _roofline(lat, t)
    return {"signature": r["signature"], "op": r["op"], "models": r["models"], "calls": r["calls"],
            "target_s": t, "target_iqr_s": lat["target"].get("iqr_s"),
            "baseline_s": lat["baseline"].get("median_s"), "speedup": lat.get("speedup"),
            "flops": lat.get("flops"), "bytes": lat.get("bytes"),
            "roofline_fraction": roof["fraction"] if roof else None, "limit": roof["limit"] if roof else None,
            "left_s": max(t - roof["bound_s"], 0.0) if roof else None}


def _roofline(lat: dict, median_s: float) -> dict | None:
    peaks, flops, nbytes = lat.get("peaks"), lat.get("flops"), lat.get("bytes")
    if not peaks or not median_s or flops is None or nbytes is None:
        return None
    compute, memory = flops / peaks["flops_per_s"], nbytes / peaks["bytes_per_s"]
    bound = max(compute, memory)
    # (a small tensor served from the caches can beat the memory peak: at the bound, not past it)
    return {"bound_s": bound, "fraction": round(min(bound / median_s, 1.0), 4),
            "limit": "compute" if compute >= memory else "memory"}


def _models(cases: list[dict], calls: dict) -> list[dict]:
    """Per model: geometric-mean speedup, measured time on the target (each case times how often
    the model calls it) and the ops taking the largest shares of it."""
    out = []
    for model in sorted({m for c in cases for m in c["models"]}):
        mine = [(c, calls.get(c["signature"], {}).get(model, 1)) for c in cases if model in c["models"]]
        total = sum(c["target_s"] * n for c, n in mine)
        shares: dict[str, float] = {}
        for c, n in mine:
            shares[c["op"]] = shares.get(c["op"], 0.0) + c["target_s"] * n
        top = sorted(shares.items(), key=lambda kv: -kv[1])[:5]
        out.append({"model": model, "cases": len(mine), "speedup": geomean(c["speedup"] for c, _ in mine),
                    "target_s": total, "shares": [{"op": op, "share": round(s / total, 4) if total else None}
                                                  for op, s in top]})
    return out


# ------------------------------------------------------------------------ across runs

def changes(db, run_id: int, other: int, threshold: float = DEFAULT_THRESHOLD) -> dict | None:
    """``{"compared_with", "threshold", "compared", "slower": [...], "faster": [...]}``: cases
    measured in both runs whose latency changed beyond the threshold and the noise; each entry
    ``{signature, op, ratio, raw_ratio, p_value}``.

    ``ratio`` is the change of the target's time relative to the baseline timed beside it in the
    same run (the machine's load between the runs cancels out), or of its raw time where the
    baseline is the target itself; ``raw_ratio`` is this run's median over the other's. Both must
    pass the threshold the same way, the times must differ by MIN_CHANGE_S at least, and the noise
    must agree: a rank test over the per-block times (p < 0.01), or non-overlapping spreads where
    there are fewer than 5 blocks a side."""
    new = {r["signature"]: r for r in stored.measured(db, run_id)}
    old = {r["signature"]: r for r in stored.measured(db, other)}
    both = sorted(set(new) & set(old))
    if not both:
        return None
    slower, faster = [], []
    for sig in both:
        entry = _moved(new[sig], old[sig], threshold)
        if entry is not None:
            (slower if entry["ratio"] > 1 else faster).append(entry)
    slower.sort(key=lambda e: -e["ratio"])
    faster.sort(key=lambda e: e["ratio"])
    return {"compared_with": other, "threshold": threshold, "compared": len(both), "slower": slower,
            "faster": faster, "ops_slower": _op_ratios(slower, new, old), "ops_faster": _op_ratios(faster, new, old)}


def relative(lat: dict) -> float | None:
    """The target's time over the baseline's, timed in turns in the same run (None: the baseline
    is the target itself)."""
    return (lat.get("relative") or {}).get("ratio")


def _moved(new: dict, old: dict, threshold: float) -> dict | None:
    a, b = new["latency"]["target"], old["latency"]["target"]
    if not b["median_s"]:
        return None
    raw = a["median_s"] / b["median_s"]
    rel_a, rel_b = relative(new["latency"]), relative(old["latency"])
    ratio = rel_a / rel_b if rel_a and rel_b else raw
    beyond = math.log1p(threshold)
    if abs(math.log(ratio)) < beyond or abs(math.log(raw)) < beyond or (ratio > 1) != (raw > 1):
        return None
    if abs(a["median_s"] - b["median_s"]) < MIN_CHANGE_S:
        return None
    p = mann_whitney_p(a.get("times") or [], b.get("times") or [])
    if (p is None and not _apart(a, b)) or (p is not None and p >= P_VALUE):
        return None
    return {"signature": new["signature"], "op": new["op"], "ratio": round(ratio, 4), "raw_ratio": round(raw, 4),
            "p_value": None if p is None else round(p, 6)}


def _apart(a: dict, b: dict) -> bool:
    """The two spreads (median ± IQR/2) do not overlap."""
    lo_a, hi_a = a["median_s"] - a.get("iqr_s", 0) / 2, a["median_s"] + a.get("iqr_s", 0) / 2
    lo_b, hi_b = b["median_s"] - b.get("iqr_s", 0) / 2, b["median_s"] + b.get("iqr_s", 0) / 2
    return lo_a > hi_b or lo_b > hi_a


def _op_ratios(flagged: list, new: dict, old: dict) -> list[dict]:
    """Per op with flagged cases: the geometric mean ratio over all its cases measured in both."""
    ops = sorted({e["op"] for e in flagged})
    out = []
    for op in ops:
        ratios = [new[s]["latency"]["target"]["median_s"] / old[s]["latency"]["target"]["median_s"]
                  for s in new if s in old and new[s]["op"] == op and old[s]["latency"]["target"]["median_s"]]
        out.append({"op": op, "ratio": geomean(ratios), "cases": len(ratios),
                    "flagged": sum(1 for e in flagged if e["op"] == op)})
    return out


def mann_whitney_p(xs: list[float], ys: list[float]) -> float | None:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, ties corrected);
    None with fewer than 5 measurements a side (too few to say)."""
    n1, n2 = len(xs), len(ys)
    if n1 < 5 or n2 < 5:
        return None
    pooled = sorted([(x, 0) for x in xs] + [(y, 1) for y in ys])
    ranks, ties, i = [0.0] * len(pooled), 0.0, 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / sigma
    return max(0.0, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


# ------------------------------------------------------------------------ in the report

def section(db, run_id: int, compare: int | None, threshold: float = DEFAULT_THRESHOLD) -> dict | None:
    """The report's ``latency`` object: the run's figures and, against ``compare``, what changed;
    None when neither run measured anything."""
    out = summary(db, run_id)
    moved = changes(db, run_id, compare, threshold) if compare is not None else None
    if out is None and moved is None:
        return None
    out = out or {"measured": 0}
    out.update(moved or {"compared_with": compare, "slower": [], "faster": [], "ops_slower": [], "ops_faster": []})
    return out


def tables(table, lat: dict | None) -> None:
    """The report's latency tables (``table`` as casedb.read.report.sections gives it)."""
    if not lat:
        return
    if lat.get("measured"):
        table("Speedup per op (geometric mean; target time weighted by calls, largest first)",
              ["op", "speedup", "cases", "target time"], lat["ops"],
              lambda r: [r["op"], ratio_text(r["speedup"]), str(r["cases"]), time_text(r["target_s"])],
              note=f"{lat['measured']} cases measured against {lat['baseline']} on {lat['baseline_device']}, "
                   f"geometric mean speedup {ratio_text(lat['speedup'])}; measuring took {time_text(lat['cost_s'])}")
        table("Furthest below the roofline (time left, weighted by calls)",
              ["case", "op", "median", "roofline", "bound by", "left x calls"], lat["left_on_table"],
              lambda r: [r["signature"][:10], r["op"], time_text(r["target_s"]), _percent(r["roofline_fraction"]),
                         r["limit"], time_text(r["weighted_left_s"])],
              note=f"peaks: {(lat.get('peaks') or {}).get('source', '?')}")
    if lat.get("compared_with") is None:
        return
    for kind in ("slower", "faster"):
        table(f"Latency: {kind} vs run {lat['compared_with']} (beyond {_percent(lat.get('threshold'))} and the noise)",
              ["case", "op", "ratio", "p"], lat.get(kind, []),
              lambda r: [r["signature"][:10], r["op"], ratio_text(r["ratio"]),
                         "" if r["p_value"] is None else f"{r['p_value']:.2g}"], empty="none")


def ratio_text(v) -> str:
    return "-" if v is None else f"{v:.3g}x"


def _percent(v) -> str:
    return "" if v is None else f"{100 * v:.1f}%"


def time_text(v) -> str:
    """A latency in the unit that reads: 12.3 us, 4.56 ms, 1.23 s."""
    if v is None:
        return ""
    return f"{v * 1e6:.3g} us" if v < 1e-3 else f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"
