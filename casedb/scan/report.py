"""Coverage of a scan across its paths: the ops and unique cases of each path and of the union,
and which runtime choice (an axis value such as ``cache=static``) or which single path alone
brings an op, so a user sees what a deployment choice adds to what a backend must run."""

from __future__ import annotations

import json

from casedb.cases import spec as casespec


def coverage(result) -> dict:
    """The coverage report of a :class:`casedb.scan.scanner.ScanResult` (or anything with ``header`` and
    ``records``). Unique cases are counted by signature, as an import dedupes them."""
    header, records = result.header, result.records
    settings = header.get("paths") or [{"name": "default", "axes": {}}]
    names = [p["name"] for p in settings]
    defaults = casespec.normalize_defaults(header.get("defaults"), header.get("recipe") or header["model"])
    ops = {name: set() for name in names}
    cases = {name: set() for name in names}
    signatures: set[str] = set()
    for rec in records:
        if rec["type"] != "case":
            continue
        case = rec["case"]
        sig = casespec.normalize_case(case, defaults, where=rec.get("where")).signature
        signatures.add(sig)
        for name in rec.get("paths") or names[:1]:
            ops[name].add(case["op"])
            cases[name].add(sig)
    union_ops = set().union(*ops.values())
    default = names[0]
    paths = [{"path": name, "axes": p.get("axes", {}), "ops": len(ops[name]), "cases": len(cases[name]),
              "adds": sorted(ops[name] - ops[default])} for name, p in zip(names, settings)]
    callers = {op: [n for n in names if op in ops[n]] for op in sorted(union_ops)}
    return {
        "model": header["model"], "level": header["level"], "default": default, "paths": paths,
        "union": {"ops": len(union_ops), "cases": len(signatures)},
        "choices": _choices(settings, ops),
        "only": {op: paths_[0] for op, paths_ in callers.items() if len(paths_) == 1 and len(names) > 1},
        "callers": {op: paths_ for op, paths_ in callers.items() if len(paths_) < len(names)},
    }


def _choices(settings: list[dict], ops: dict[str, set]) -> list[dict]:
    """What each runtime choice brings: for every axis value, the ops its path calls and no path
    that differs from it in that axis alone calls (the others held fixed), over all such groups."""
    axes: dict[str, list] = {}
    for p in settings:
        for axis, value in (p.get("axes") or {}).items():
            axes.setdefault(axis, [])
            if value not in axes[axis]:
                axes[axis].append(value)
    out = []
    for axis, values in axes.items():
        if len(values) < 2:
            continue
        groups: dict[str, dict] = {}
        for p in settings:
            rest = json.dumps({k: v for k, v in p["axes"].items() if k != axis}, sort_keys=True)
            groups.setdefault(rest, {})[json.dumps(p["axes"][axis])] = p["name"]
        for value in values:
            brings: set = set()
            for group in groups.values():
                mine = group.get(json.dumps(value))
                others = [n for v, n in group.items() if n != mine]
                if mine is not None and others:
                    brings |= ops[mine] - set().union(*(ops[n] for n in others))
            out.append({"axis": axis, "value": value, "ops": sorted(brings)})
    return out


def markdown(report: dict) -> str:
    """The report as Markdown tables (for a terminal, a CI summary or bench/README.md)."""
    lines = [f"## {report['model']} ({report['level']} level): {len(report['paths'])} paths, "
             f"union {report['union']['ops']} ops, {report['union']['cases']} unique cases", "",
             "| path | ops | unique cases | ops the default path does not call |", "|---|---:|---:|---|"]
    for p in report["paths"]:
        adds = ", ".join(_short(op) for op in p["adds"]) or ("(default)" if p["path"] == report["default"] else "—")
        lines.append(f"| {p['path']} | {p['ops']} | {p['cases']} | {adds} |")
    lines.append(f"| **union** | **{report['union']['ops']}** | **{report['union']['cases']}** | |")
    if report["choices"]:
        lines += ["", "| runtime choice | ops it brings (the paths that differ in this choice alone do not call them) |",
                  "|---|---|"]
        for c in report["choices"]:
            lines.append(f"| {c['axis']}={_value(c['value'])} | {', '.join(_short(op) for op in c['ops']) or '—'} |")
    if report["only"]:
        lines += ["", "| op | the one path that calls it |", "|---|---|"]
        for op, path in report["only"].items():
            lines.append(f"| {_short(op)} | {path} |")
    return "\n".join(lines) + "\n"


def _short(op: str) -> str:
    for prefix in ("torch.nn.functional.", "torch.Tensor.", "torch.ops.", "torch."):
        if op.startswith(prefix):
            return ("F." if prefix == "torch.nn.functional." else "") + op[len(prefix):]
    return op


def _value(v) -> str:
    return "x".join(map(str, v)) if isinstance(v, list) else str(v)
