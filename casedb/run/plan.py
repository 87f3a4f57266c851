"""A run's plan: the selected cases as test items, with stable ids, shards and the smoke set.

One item per signature (dedupe: every model occurrence of it is judged from that one
execution) or per occurrence (``--no-dedupe``). Ids are built from the case data (op, input
shapes and literals, dtype, signature prefix), never parsed back from display text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from casedb.cases import dtypes
from casedb.cases import marks as marks_mod
from casedb.serial import loads
from casedb.store.reads_plan import plan_rows

SMOKE_SIZE = 3
TEST_NAME = "test_model_op"


@dataclass
class Occurrence:
    """One model's use of a planned case: how that model judges it."""

    model_case_id: int | None
    model: str
    name: str
    rtol: float | None = None              # the case's own tolerances (None: not written)
    atol: float | None = None
    defaults: dict = field(default_factory=dict)  # the manifest's default dtype, rtol, atol
    skip_if: list | None = None            # conditions ({expr, reason}) that skip it
    expects_error: dict | None = None      # {type, match}, or per side ({ref: ..., <device>: ...})
    xfail: dict | None = None              # a condition ({expr, reason}) under which it is expected to fail
    marks: list[str] = field(default_factory=list)  # derived and hand-written
    source: str | None = None              # manifest file:line


@dataclass
class PlanItem:
    """One test: a case and the model occurrences judged from its execution."""

    id: str
    signature: str
    op: str
    dtype: str                 # the case's dtype (canonical name)
    seed: int | None
    shapes: str                # the input shapes as text (display only)
    attrs: dict                # keyword arguments (RFC items)
    inputs: list               # the case's input specs (RFC items)
    occurrences: list[Occurrence]
    marks: list[str]           # union of the occurrences' marks (derived + hand-written)
    dedupe: bool = True

    @property
    def case(self) -> dict:
        """The normalized case, as the execution core takes it."""
        return {"op": self.op, "dtype": self.dtype, "seed": self.seed, "shapes": self.shapes, "attrs": self.attrs,
                "signature": self.signature, "inputs": self.inputs}

    @property
    def key(self) -> tuple:
        """What "already done in this run" is keyed by (resume, exactly-once)."""
        return (self.signature, None if self.dedupe else self.occurrences[0].model_case_id)

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(o.model for o in self.occurrences))

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(o.name for o in self.occurrences))

    @property
    def numel(self) -> int:
        """Elements the case's input tensors take in all: the storage their strides and offsets
        span (casedb.cases.presets.storage_numel), not only the elements they show."""
        from casedb.cases.presets import storage_numel

        return sum(storage_numel(t) for t in marks_mod.iter_tensors(self.inputs, self.attrs))

    def fits(self, max_numel: int) -> bool:
        """True when the case's inputs hold at most `max_numel` elements in all, and its outputs
        too: sized on fake tensors (:func:`casedb.cases.materialize.output_numel`), as a factory op such
        as ``torch.full([20000, 20000], 1.0)`` makes 4e8 elements from no input tensor."""
        if self.numel > max_numel:
            return False
        from casedb.cases.materialize import output_numel
        from casedb.cases.ops import UnknownOpError, op_info

        try:
            info = op_info(self.op)
        except UnknownOpError:
            return True  # the run gives the case its resolve error; nothing is called
        if info.kind in ("overload", "packet") and not self.op.startswith(("torch.ops.aten.", "torch.ops.prims.")):
            return True  # a library's op: its Python code is not called to size it
        out = output_numel(self.case, info.fn)
        return out is None or out <= max_numel


def op_label(op: str) -> str:
    for prefix, short in (("torch.ops.", ""), ("torch.nn.functional.", "F.")):
        if op.startswith(prefix):
            return short + op[len(prefix):]
    return op


def _dims(t: dict) -> str:
    return "x".join(map(str, t["shape"])) or "scalar"


def _compact(v) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def shape_label(inputs: list, attrs: dict, limit: int = 60) -> str:
    """``4x64,4x64,dim=-1``: tensors by shape (``scalar`` for 0-d), literals as written, then
    keyword arguments (tensors by shape too)."""
    parts = []
    for spec in inputs:
        kind, body = next(iter(spec.items()))
        if kind in ("tensor", "file"):
            parts.append(_dims(body))
        elif kind == "tensor_list":
            parts.append("[" + ",".join(_dims(t) for t in body) + "]")
        elif kind == "py":
            parts.append(str(body).replace(" ", ""))
        else:
            parts.append(_compact(body))
    for k, v in sorted(attrs.items()):
        if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("tensor", "file"):
            parts.append(f"{k}={_dims(next(iter(v.values())))}")
        elif not (isinstance(v, dict) and len(v) == 1 and next(iter(v)) == "tensor_list"):
            parts.append(f"{k}={_compact(v)}")
    text = ",".join(parts) or "noargs"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Ids are ASCII without spaces or colons: the id a report carries is the one the plan made, and
# no id contains pytest's "::" separator.
_UNSAFE_ID = re.compile(r"[^0-9A-Za-z_.,+=()\[\]<>/*-]")


def _safe_id(text: str) -> str:
    return _UNSAFE_ID.sub("_", text)


def _assign_ids(items: list[PlanItem]) -> None:
    for it in items:
        if it.dedupe:
            it.id = _safe_id(f"{op_label(it.op)}-{shape_label(it.inputs, it.attrs)}-"
                             f"{dtypes.short(it.dtype)}-{it.signature[:10]}")
        else:
            o = it.occurrences[0]
            it.id = _safe_id(f"{o.model}-{o.name}")
    seen: dict[str, int] = {}
    for it in items:
        seen[it.id] = seen.get(it.id, 0) + 1
    for it in items:
        if seen[it.id] > 1:  # only when two ids collide: keep every id unique and stable
            it.id = f"{it.id}-{it.signature[:16]}-{it.occurrences[0].model_case_id}"


def param_id(nodeid: str) -> str | None:
    """The plan id in a model-op test's node id (``path::test_model_op[<id>]``), else None."""
    marker = "::" + TEST_NAME + "["
    at = nodeid.find(marker)
    if at < 0 or not nodeid.endswith("]"):
        return None
    return nodeid[at + len(marker):-1]


def _check_tolerances(model: str, name: str, own: dict, defaults: dict) -> None:
    """CasedbError for a tolerance the DB holds that import refuses (infinite, NaN: stored by an
    older casedb or by hand): it would pass every result, and its results could not be stored."""
    from casedb.cases.bounds import check_tolerance
    from casedb.errors import CasedbError

    for what, tols in (("", own), ("its model's default ", defaults)):
        for key in ("rtol", "atol"):
            if tols.get(key) is not None:
                try:
                    check_tolerance(tols[key], key)
                except ValueError as e:
                    raise CasedbError(f"case {model}::{name}: {what}{e}; import its manifest again with a "
                                      "finite tolerance (casedb import --replace)") from None


def build_plan(store, models: list[str] | None = None, *, dedupe: bool = True, smoke: bool = False) -> list[PlanItem]:
    """Items for the given models (all models when none), in manifest order; occurrences a
    ``casedb import --replace`` retired are not planned.

    ``smoke``: only a few small cases (what a plain ``pytest`` without ``--model`` runs).
    """
    names = [store.model(m)["name"] for m in models] if models else None
    items: list[PlanItem] = []
    by_sig: dict[str, PlanItem] = {}
    defaults_of: dict = {}
    for (mcid, model, name, sig, op, shapes, dtype, seed, inputs, attrs, marks, rtol, atol, skip_if,
         expects, xfail, source, defaults) in plan_rows(store.db, names):
        marks = loads(marks)
        if model not in defaults_of:
            defaults_of[model] = {k: v for k, v in (loads(defaults) or {}).items() if k in ("dtype", "rtol", "atol")}
        _check_tolerances(model, name, {"rtol": rtol, "atol": atol}, defaults_of[model])
        occ = Occurrence(model_case_id=mcid, model=model, name=name, rtol=rtol, atol=atol,
                         defaults=defaults_of[model], skip_if=loads(skip_if), expects_error=loads(expects),
                         xfail=loads(xfail), marks=marks, source=source)
        if dedupe and sig in by_sig:
            it = by_sig[sig]
            it.occurrences.append(occ)
            it.marks = sorted(set(it.marks) | set(marks))
            continue
        it = PlanItem(id="", signature=sig, op=op, dtype=dtype, seed=seed, shapes=shapes, attrs=loads(attrs) or {},
                      inputs=loads(inputs) or [], occurrences=[occ], marks=marks, dedupe=dedupe)
        items.append(it)
        if dedupe:
            by_sig[sig] = it
    if smoke:
        items = smoke_set(items)
    _assign_ids(items)
    return items


def smoke_set(items: list[PlanItem], size: int = SMOKE_SIZE) -> list[PlanItem]:
    """The smallest cases the default marker filter keeps, one per op (stable for a given DB)."""
    keep = marks_mod.MarkExpression(marks_mod.DEFAULT_EXCLUDE)
    pool = sorted((it for it in items if keep.matches(it.marks)),
                  key=lambda it: (it.numel, it.op, it.signature))
    out, ops = [], set()
    for it in pool:
        if it.op not in ops:
            ops.add(it.op)
            out.append(it)
        if len(out) == size:
            break
    order = {id(it): i for i, it in enumerate(items)}
    return sorted(out, key=lambda it: order[id(it)])


def in_shard(signature: str, shard: tuple[int, int] | None) -> bool:
    """Stable by signature: a case stays in its slice whatever else the DB holds."""
    if shard is None:
        return True
    i, n = shard
    return int(signature[:8], 16) % n == i - 1


def op_matches(op: str, wanted) -> bool:
    """Whether ``op`` is one of ``wanted`` (an op or a list of them; each exact or a substring);
    nothing wanted matches every op."""
    wanted = [wanted] if isinstance(wanted, str) else wanted or []
    return not wanted or any(op == w or w in op for w in wanted)
