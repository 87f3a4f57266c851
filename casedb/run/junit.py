"""The JUnit XML properties the RFC implementation's model-ops runner records per test, for a casedb
case: a CI that already reads their JUnit reports (``capability.*`` properties and ``tag``
properties) reads casedb's pytest front end the same way (``pytest --junitxml``).

Their rules (tests/models/model_ops_capability.py): only ops under ``torch.`` are capabilities
(after their op-name normalisation); the signature lists each positional tensor's (and each
``tensor_list`` element's) shape, dtype and stride, skipping 0-d tensors; a factory op's shape
value (``torch.zeros([2, 3])``) is a shape; with no tensor at all, integer values are the shapes
(``torch.arange(24)`` gives ``["[24]"]``). ``capability.tag`` is the per-op numbered name of every
model occurrence, ``capability.subject`` the first model, and each model is a ``tag`` property
``model__<name>`` as their report injector adds it.
"""

from __future__ import annotations

import json
import re

from casedb.cases import dtypes, presets

_FACTORIES = {"torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.rand", "torch.randn",
              "torch.sym_sum"}


def capability_name(op: str) -> str:
    """Their capability name of an op."""
    name = op.replace("nn_", "nn.").replace("functional_", "functional.")
    m = re.fullmatch(r"(?:torch\.ops\.)?aten\.(\w+)\.(?:default|out)", name)
    if m:
        name = f"torch.{m[1]}"
    if "embedding" in name:
        return "torch.nn.functional.embedding"
    if "index_copy" in name or "index.copy" in name:
        return "torch.index_copy_"
    return name


def _text(values) -> str:
    return "[" + ",".join(str(int(v)) for v in values) + "]"


def signature(op: str, inputs: list) -> dict:
    """``{input_shapes, input_dtypes, input_strides}`` of a case's positional inputs, their way."""
    shapes, types, strides, values = [], [], [], []
    for item in inputs:
        for t in item.get("tensor_list") or [item.get("tensor") or item.get("file")]:
            if t and t.get("shape"):
                shapes.append(_text(t["shape"]))
                types.append("torch." + dtypes.canonical(t["dtype"]))
                strides.append(_text(presets.layout(t)[0]))
        v = item.get("value")
        if op in _FACTORIES and isinstance(v, list) and v and all(isinstance(x, int) for x in v):
            shapes.append(_text(v))
        elif isinstance(v, int) and not isinstance(v, bool):
            values.append(v)
    if not shapes and values:
        shapes = [_text(values)]
    return {"input_shapes": shapes, "input_dtypes": types, "input_strides": strides}


def capability_properties(item, device: str | None = None, outcome: str | None = None) -> list[tuple[str, str]]:
    """``(name, value)`` JUnit properties of one plan item (casedb.run.plan.PlanItem)."""
    compact = {"separators": (",", ":")}
    models = list(dict.fromkeys(o.model for o in item.occurrences))
    out = [("tag", f"model__{m}") for m in models]
    name = capability_name(item.op)
    if not name.startswith("torch.") or not models:
        return out
    sig = signature(item.op, item.inputs)
    out += [("capability.test_type", "model_ops"), ("capability.subject", models[0]), ("capability.name", name),
            ("capability.sig.input_shapes", json.dumps(sig["input_shapes"], **compact)),
            ("capability.sig.input_dtypes", json.dumps(sig["input_dtypes"], **compact))]
    out += [("capability.tag", o.name) for o in item.occurrences]
    if sig["input_strides"]:
        out.append(("capability.prop.input_strides", json.dumps(sig["input_strides"], **compact)))
    if device:
        backend = "cpu" if outcome == "not_exercised" else device.partition(":")[0]
        out.append(("capability.backend", backend))
    return [(k, v) for k, v in out if v not in ("", "[]")]
