"""What the head of a repro script says about its case, in comment lines: the inputs as casedb
makes them, the call, the target, the judge and the models that use the case.

Everything here comes from the case's JSON document (``casedb.read.repro``) and is written into
``#`` comments only, each character a comment cannot hold (a line break, a bidi control) escaped
(:func:`comment`): the text describes the case, the script reads the case from ``CASE``.
"""

from __future__ import annotations

import json

from casedb.escape import visible

_MAX = 100  # characters of one written value (data, device_layout) before it is cut


def comment(text: str) -> str:
    """``text`` safe inside a ``#`` comment: line breaks, control and bidi characters escaped
    (casedb.escape.visible, as in every comment casedb writes)."""
    return visible(str(text))


def _short(text: str) -> str:
    return text if len(text) <= _MAX else text[:_MAX - 3] + "..."


def _kwargs(args: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in args.items())


def tensor_line(i: int, leaf: dict, hook: dict | None, device: str | None) -> str:
    """``T[1] = float32[4, 64] randn(mean=0.5), then transpose_view(dim0=0, dim1=1)``."""
    text = f"T[{i}] = {leaf['dtype']}[{', '.join(map(str, leaf['shape']))}] "
    if "blob" in leaf:
        text += f"values stored with the case (BLOBS[{leaf['blob']}])"
    elif "data" in leaf:
        text += f"data {_short(json.dumps(leaf['data']))}"
    else:
        text += f"{leaf['init']}({_kwargs(leaf.get('init_args') or {})})"
    if leaf.get("preset"):
        text += f", then {leaf['preset']}({_kwargs(leaf.get('preset_args') or {})})"
    if leaf.get("device_layout"):
        lay = _short(json.dumps(leaf["device_layout"]))
        if hook is not None:
            text += f", moved with device_layout {lay} by {hook['module']}.{hook['attr']}"
        else:
            text += (f", device_layout {lay} not applied: no layout hook for device {device or 'the default'} "
                     "(as in casedb run: moved with .to)")
    return text


def _arg(v) -> str:
    """An argument's JSON form (``casedb.read.repro._argument``) as the Python it stands for."""
    if not isinstance(v, dict):
        return repr(v)
    (kind, body), = v.items()
    if kind == "T":
        return f"T[{body}]"
    if kind in ("tensors", "list"):
        return "[" + ", ".join(_arg(x) for x in body) + "]"
    if kind == "tuple":
        return "(" + ", ".join(_arg(x) for x in body) + ("," if len(body) == 1 else "") + ")"
    if kind == "device":
        return f"DEVICE (recorded: {body!r})"
    if kind == "torch":
        return f"torch.{body}"
    if kind == "float":
        return f"float({body!r})"
    if kind == "ellipsis":
        return "..."
    if kind == "slice":
        return "slice(" + ", ".join(_arg(x) for x in body) + ")"
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_arg(x)}" for k, x in body.items()) + "}"
    return repr(v)


def call_text(data: dict) -> str:
    """``torch.add(T[0], T[1], alpha=2)``: the op called with the case's arguments."""
    op = data["op"]
    kind, path = op["kind"], op["path"]
    fn = {"method": f"torch.Tensor.{path}", "operator": f"operator.{path}",
          "overload": f"torch.ops.{path}", "packet": f"torch.ops.{path}"}.get(kind, f"torch.{path}")
    parts = [_arg(a) for a in data["args"]] + [f"{k}={_arg(v)}" for k, v in data["kwargs"].items()]
    return f"{fn}({', '.join(parts)})"


def _imports(data: dict) -> str:
    if not data["imports"]:
        return "none"
    return "; ".join(f"{r['module']}" + (f" ({r['file']})" if r.get("file") else "") for r in data["imports"])


def _tolerance(data: dict) -> str:
    """The case's dtype's tolerance first, then the other dtypes'."""
    order = sorted(data["tolerances"], key=lambda d: d != data["dtype"])
    tols = ", ".join(f"{d} rtol={data['tolerances'][d][0]:g} atol={data['tolerances'][d][1]:g}" for d in order)
    return f"{tols} ({data['tolerance_note']})"


def _judge(data: dict, by_ulp: bool) -> str:
    if by_ulp:
        return f"{data['judge']}: the tolerance, then ULPs against an upcast reference, then bias (casedb.judge)"
    return f"{data['judge']}: the tolerance of each output dtype (casedb.judge)"


def _used_by(data: dict) -> str:
    found = [f"{u['model']}::{u['name']}" for u in data["used_by"]]
    return ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "") if found else "none"


def head_words(data: dict, by_ulp: bool) -> dict[str, str]:
    """The text of each ``@NAME@`` comment placeholder of the template's head (one line each,
    ``INPUTS`` one line per tensor)."""
    backend = data["backend"]
    words = {
        "OP": data["op"]["name"],
        "DEVICE": data["device"] or "cuda when available, else cpu",
        "BACKEND": backend + (": no compile" if backend == "eager" else
                              ": torch.compile(backend=BACKEND, fullgraph=True, dynamic=False)"),
        "IMPORTS": _imports(data),
        "SEED": str(data["seed"]),
        "JUDGE": _judge(data, by_ulp),
        "TOLERANCE": _tolerance(data),
        "WRITES": ", ".join(data["writes"]) + " (written by the op): compared too" if data["writes"]
        else "none: the op writes into no argument",
        "METADATA": "random or uninitialized output: shape, dtype, strides compared" if data["metadata_only"]
        else "no: values compared",
        "CALL": call_text(data),
        "USED_BY": _used_by(data),
    }
    words = {k: comment(v) for k, v in words.items()}
    lines = [tensor_line(i, leaf, data.get("layout_hook"), data["device"]) for i, leaf in enumerate(data["tensors"])]
    words["INPUTS"] = "\n".join(f"#   {comment(line)}" for line in lines) or "#   none"
    return words
