"""An explanation as JSON (``casedb explain --json``, stored per cause) and as text.

Per cause: ``{"cause", "ops", "cases", "condition": {"feature", "text", "dim", "threshold",
"multiple_of", "dtype", "failing", "passing"} or null, "confirmed", "layer", "variants_run",
"minimal": {"signature", "inputs", ...} or null, "growth"}``.
"""

from __future__ import annotations

from casedb.explain.conditions import Condition, count
from casedb.explain.dims import base_name
from casedb.explain.features import of_case as features_of


def assemble(run_id: int, groups: list[dict], passing: int, rounds) -> dict:
    """The explanation of ``groups`` (casedb.explain.diagnose), ``passing`` passing cases."""
    causes = [_cause(g, passing) for g in groups]
    return {"run_id": run_id, "causes": causes, "passing": passing,
            "variants_run": rounds.variants_run if rounds else 0, "rounds": rounds.rounds if rounds else 0,
            "seconds": round(rounds.seconds, 2) if rounds else 0.0}


def _cause(g: dict, passing: int) -> dict:
    found = g.get("found") or {}
    cond, proof = _chosen(g, found)
    lay = found.get(("layer",))
    grow = found.get(("growth",))
    return {"cause": g["cause"], "ops": sorted({base_name(r["op"]) for r in g["rows"]}), "cases": len(g["rows"]),
            "condition": _condition(cond, proof, len(g["rows"]), passing) if cond else None,
            "confirmed": bool(proof and proof.get("confirmed")), "layer": lay["layer"] if lay else None,
            "layer_text": lay["by"] if lay else None, "variants_run": g.get("variants_run", 0),
            "budget_spent": bool(g.get("cut")), "minimal": None, "growth": grow["text"] if grow else None}


def _chosen(g: dict, found: dict) -> tuple[Condition | None, dict | None]:
    """The first condition confirmed by experiment, else the simplest observed one."""
    conds = g.get("conditions") or []
    tried = found.get(("confirm",)) or {}
    for j, c in enumerate(conds):
        proof = tried.get(j)
        if proof and proof.get("confirmed"):
            return _bisected(c, proof, g), proof
    if not conds:
        return None, None
    return conds[0], tried.get(0)


def _bisected(c: Condition, proof: dict, g: dict) -> Condition:
    """A threshold condition at the size bisection found (its counts taken again)."""
    if "threshold" not in proof or c.also is not None:
        return c
    new = Condition(c.kind, c.key, proof["threshold"], near=proof["near"])
    fail = [features_of(r, r["values"]) for r in g["rows"]]
    new.failing, new.passing = count(new, fail, []).failing, c.passing
    return new


def _condition(c: Condition, proof: dict | None, failing: int, passing: int) -> dict:
    key = c.key
    return {"feature": c.feature, "text": sentence(c, proof, failing, passing),
            "dim": key if c.kind in ("ge", "le", "notmult") and key != "numel" else None,
            "threshold": c.value if c.kind in ("ge", "le") else None,
            "multiple_of": c.value if c.kind == "notmult" else None,
            "dtype": c.value if c.key == "dtype" or c.key.startswith("dtype:in") else None,
            "failing": c.failing, "passing": c.passing}


def sentence(c: Condition, proof: dict | None, failing: int, passing: int) -> str:
    """``fails only when an input is non-contiguous (8 of 8 failing, 0 of 231 passing); confirmed:
    contiguous copies pass``; a threshold: ``fails for K >= 1025, passes at K = 1024 (...)``."""
    counts = f"{c.failing} of {failing} failing, {c.passing} of {passing} passing"
    if c.kind in ("ge", "le") and c.also is None:
        op = ">=" if c.kind == "ge" else "<="
        head = f"fails for {c.key} {op} {c.value}"
        if c.near is not None:
            head += f", passes at {c.key} = {c.near}"
    else:
        head = f"fails only when {c.phrase()}"
    text = f"{head} ({counts})"
    if proof is None:
        return text
    return f"{text}; {'confirmed' if proof.get('confirmed') else 'not confirmed'}: {proof['by']}"


def text(out: dict) -> str:
    """The explanation as lines for a terminal."""
    lines = [f"run {out['run_id']}: {len(out['causes'])} cause(s) to explain, {out['passing']} passing cases"]
    if not out["causes"]:
        lines.append("nothing to explain: no case of this run failed")
    for i, c in enumerate(out["causes"], 1):
        lines.append("")
        lines.append(f"{i}. {c['cause']}  ({c['cases']} case(s); ops: {', '.join(c['ops'])})")
        cond = c["condition"]
        lines.append(f"   condition: {cond['text']}" if cond else "   condition: none found")
        if c["layer"]:
            lines.append(f"   layer: {c['layer']} ({c['layer_text']})")
        if c.get("growth"):
            lines.append(f"   growth: {c['growth']}")
        m = c["minimal"]
        if m:
            lines.append(f"   smallest failing case: {', '.join(m['inputs'])} ({m['elements']} of "
                         f"{m['parent_elements']} elements; {'; '.join(m['transformation'])})")
            lines.append(f"   repro: {m['repro']}")
        spent = " (budget spent)" if c.get("budget_spent") else ""
        lines.append(f"   variants run: {c['variants_run']}{spent}")
    lines.append("")
    lines.append(f"{out['variants_run']} variants in {out['rounds']} round(s), {out['seconds']:.1f} s")
    return "\n".join(lines)
