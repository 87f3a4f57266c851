"""A coverage report's figures from its cases: per model, the cases and ops (torch-level, and the
aten operators they send) the target can run, as counts and the RFC's "% of enabled OpFuncs";
the missing kernels ranked by the cases and models they block.

A torch-level op is enabled for a model when every case of it that the model has is; an aten
operator when the target has a kernel for it (a composite one: for what it calls). Cases whose
trace failed (the CPU raises too) count as neither.
"""

from __future__ import annotations


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def _model_row(model: str, cases: list) -> dict:
    known = [c for c in cases if c["enabled"] is not None]
    ops: dict = {}
    aten: dict = {}
    for c in known:
        ops[c["op"]] = ops.get(c["op"], True) and c["enabled"]
        for name in c["aten_ops"]:
            aten.setdefault(name, True)
        for name in c["missing"]:
            aten[name] = False
    enabled_cases = sum(c["enabled"] for c in known)
    return {"model": model, "cases": len(cases), "traced": len(known), "enabled_cases": enabled_cases,
            "enabled_cases_pct": _pct(enabled_cases, len(known)),
            "ops": len(ops), "enabled_ops": sum(ops.values()), "enabled_ops_pct": _pct(sum(ops.values()), len(ops)),
            "aten_ops": len(aten), "enabled_aten_ops": sum(aten.values()),
            "enabled_aten_ops_pct": _pct(sum(aten.values()), len(aten)),
            "untraced": len(cases) - len(known)}


def _missing_rank(cases: list) -> list:
    blocks: dict = {}
    for c in cases:
        for name in c["missing"]:
            b = blocks.setdefault(name, {"kernel": name, "cases": 0, "models": set(), "ops": set()})
            b["cases"] += 1
            b["models"].update(c["models"])
            b["ops"].add(c["op"])
    ranked = sorted(blocks.values(), key=lambda b: (-b["cases"], -len(b["models"]), b["kernel"]))
    only = {name: sum(1 for c in cases if c["missing"] == [name]) for name in blocks}
    return [{"kernel": b["kernel"], "cases": b["cases"], "unblocks": only[b["kernel"]],
             "models": sorted(b["models"]), "ops": sorted(b["ops"])} for b in ranked]


def summarize(cases: list) -> dict:
    """``models`` (one row each, and ``all``), ``totals`` and ``missing`` of ``cases``."""
    by_model: dict = {}
    for c in cases:
        for m in c["models"]:
            by_model.setdefault(m, []).append(c)
    rows = [_model_row(m, by_model[m]) for m in sorted(by_model)]
    return {"totals": _model_row("all", cases), "models": rows, "missing": _missing_rank(cases)}
