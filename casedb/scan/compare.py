"""Coverage of another tracer's op list by a casedb scan of the same model.

Their files (the RFC implementation's model-ops tests) come in three shapes, read here without
the importers (only the op names matter):

* **v2** — ``test_suite_config: files: [tests: [edits: ops: include: [{name: OP, ...}]]]``;
* **v1** — ``cases: [{op: OP, ...}]`` (casedb's own manifests have this shape too);
* **op list** — plain text, one op per line, perhaps followed by a count; ``#`` starts a comment.

Names differ in spelling between the two tracers: theirs records a compiled graph, where a
Tensor method is ``torch.<method>`` and a Python operator is the :mod:`operator` function
(``torch.truediv`` for ``x / y``, ``torch.and_`` for ``x & y``); casedb records what
``__torch_function__`` sees (``torch.Tensor.div``, ``torch.Tensor.__and__``). Both sides are
reduced to one **key** per operator (:func:`op_key`) before they are compared.

Some of their names are no operator at all — graph bookkeeping and context managers that return
no tensor (``torch.nn.attention.sdpa_kernel``, ``torch._C._functorch._add_batch_dim``): a
backend never runs them as a kernel and a case of them could not be judged. They are listed
apart (``not_operators``) and left out of the coverage figure.
"""

from __future__ import annotations

import re
from pathlib import Path

from casedb.scan.config import ScanError

MAX_FILE_BYTES = 64 << 20  # their largest file (granite-4.0-h-tiny) is 1.5 MB
# Namespaces stripped from a name before its key is taken (the longest first).
_PREFIXES = ("torch.ops.aten.", "torch.nn.functional.", "torch.functional.", "torch.Tensor.", "torch.special.",
             "torch.linalg.", "torch.")
# Spellings of one operator: Python operators (the operator module's names and the dunders),
# aliases and in-place/reflected forms whose kernel is the same.
_SAME_OP = {
    "div": ("truediv", "__truediv__", "__rtruediv__", "__itruediv__", "divide", "true_divide"),
    "floor_divide": ("floordiv", "__floordiv__", "__rfloordiv__", "__ifloordiv__"),
    "sub": ("__sub__", "__rsub__", "__isub__", "subtract", "rsub"),
    "add": ("__add__", "__radd__", "__iadd__"),
    "mul": ("__mul__", "__rmul__", "__imul__", "multiply"),
    "eq": ("__eq__",), "ne": ("__ne__", "not_equal"), "lt": ("__lt__", "less"), "le": ("__le__", "less_equal"),
    "gt": ("__gt__", "greater"), "ge": ("__ge__", "greater_equal"),
    "bitwise_and": ("and_", "__and__", "__iand__", "__rand__"), "bitwise_or": ("or_", "__or__", "__ior__", "__ror__"),
    "bitwise_not": ("invert", "__invert__", "inv"), "bitwise_xor": ("xor", "__xor__"),
    "neg": ("__neg__", "negative"), "pow": ("__pow__", "__rpow__"), "matmul": ("__matmul__",),
    "remainder": ("mod", "__mod__", "__rmod__"), "abs": ("__abs__",),
}
_ALIAS = {alias: key for key, aliases in _SAME_OP.items() for alias in aliases}
# Names that are no operator: graph bookkeeping of a compiled trace and context managers.
_NOT_OPERATOR = re.compile(r"^torch\.(_C\.|amp\.|nn\.attention\.|autograd\.|_dynamo\.|cuda\.|_functorch\.)")
_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*)(?:\s+\d+)?\s*$")  # a name, then perhaps a count


def op_key(name: str) -> str:
    """The operator a name spells, the same for both tracers' spellings (``torch.truediv`` and
    ``torch.Tensor.div`` are ``div``; ``torch.functional.split`` and ``torch.Tensor.split``
    are ``split``; an ATen overload drops its overload name)."""
    short = name
    for prefix in _PREFIXES:
        if short.startswith(prefix):
            short = short[len(prefix):]
            break
    if name.startswith("torch.ops.aten."):
        short = short.split(".", 1)[0]
    if short == "getitem" or short == "__getitem__" or short == "index":
        return "getitem"
    return _ALIAS.get(short, short)


def is_operator(name: str) -> bool:
    """False for graph bookkeeping and context managers (see the module docstring)."""
    return not _NOT_OPERATOR.match(name)


def read_ops(path: str | Path) -> list[str]:
    """The op names of a v2, v1 or op-list file, in first-seen order; ScanError names what is wrong."""
    from casedb import files

    path = Path(path)
    try:
        text = files.read_text(path, MAX_FILE_BYTES)
    except ScanError:
        raise
    except Exception as e:  # InputError (not a regular file, too big) or a decoding error
        raise ScanError(f"cannot read the file to compare with: {e}", where=str(path)) from None
    if path.suffix in (".yaml", ".yml"):
        return _yaml_ops(text, str(path))
    return _list_ops(text, str(path))


def _list_ops(text: str, where: str) -> list[str]:
    ops: dict[str, None] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0]
        if not line.strip():
            continue
        match = _LINE.match(line)
        if not match:
            raise ScanError(f"line {number} is not an op name ({line.strip()[:60]!r}); an op list has one "
                            "name per line, e.g. torch.nn.functional.linear", where=where)
        ops[match.group(1)] = None
    if not ops:
        raise ScanError("no op names in the file (one per line, e.g. torch.nn.functional.linear)", where=where)
    return list(ops)


def _yaml_ops(text: str, where: str) -> list[str]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as e:
        raise ScanError(f"cannot read YAML: {e}", where=where) from None
    if isinstance(doc, dict) and isinstance(doc.get("test_suite_config"), dict):
        items = [item for test in _v2_tests(doc["test_suite_config"])
                 for item in (((test.get("edits") or {}).get("ops") or {}).get("include") or [])]
        names = [item.get("name") if isinstance(item, dict) else None for item in items]
        field = "edits.ops.include[].name"
    elif isinstance(doc, dict) and isinstance(doc.get("cases"), list):
        names = [item.get("op") if isinstance(item, dict) else None for item in doc["cases"]]
        field = "cases[].op"
    else:
        raise ScanError("neither a v2 file (test_suite_config: ... edits.ops.include) nor a v1 file (cases: "
                        "[{op: ...}])", where=where)
    bad = next((i for i, n in enumerate(names) if not isinstance(n, str) or not n), None)
    if bad is not None:
        raise ScanError(f"{field}: item {bad + 1} has no op name", where=where)
    if not names:
        raise ScanError(f"{field}: no ops in the file", where=where)
    return list(dict.fromkeys(names))


def _v2_tests(suite: dict) -> list[dict]:
    out = []
    for f in suite.get("files") or []:
        for test in (f.get("tests") or []) if isinstance(f, dict) else []:
            if isinstance(test, dict):
                out.append(test)
    return out


def compare(ours: list[str] | set[str], theirs: list[str]) -> dict:
    """What their ops and ours have in common, by :func:`op_key`: ``missing`` (theirs, not ours),
    ``extra`` (ours, not theirs), ``not_operators`` (theirs, left out) and ``coverage`` (the
    percentage of their operators ours records)."""
    our_keys: dict[str, list[str]] = {}
    for name in sorted(set(ours)):
        our_keys.setdefault(op_key(name), []).append(name)
    their_keys: dict[str, list[str]] = {}
    not_operators = []
    for name in theirs:
        if is_operator(name):
            their_keys.setdefault(op_key(name), []).append(name)
        else:
            not_operators.append(name)
    matched = sorted(k for k in their_keys if k in our_keys)
    missing = sorted(n for k, names in their_keys.items() if k not in our_keys for n in names)
    extra = sorted(n for k, names in our_keys.items() if k not in their_keys for n in names)
    total = len(their_keys)
    return {"theirs": total, "ours": len(our_keys), "matched": len(matched),
            "coverage": round(100.0 * len(matched) / total, 1) if total else 100.0,
            "missing": missing, "extra": extra, "not_operators": not_operators}


def markdown(model: str, file: str, result: dict) -> str:
    """The comparison as Markdown (the ``--compare`` output)."""
    lines = [f"## {model} against {file}: {result['coverage']} % of their {result['theirs']} operators "
             f"({result['matched']} matched; ours records {result['ours']})", ""]
    dropped = result.get("dropped") or {}
    missing = [f"{n} (seen, dropped: {dropped[n]})" if n in dropped else n for n in result["missing"]]
    lines.append("- theirs, not ours: " + (", ".join(missing) or "none"))
    lines.append("- ours, not theirs: " + (", ".join(result["extra"]) or "none"))
    if result["not_operators"]:
        lines.append("- theirs, no operator (bookkeeping / context manager, left out): "
                     + ", ".join(result["not_operators"]))
    return "\n".join(lines) + "\n"


def compare_scan(result, theirs: list[str]) -> dict:
    """:func:`compare` of a scan's recorded ops with theirs; each op of theirs that the scan saw but
    dropped (``dropped_ops`` of the header: a no-op conversion, a call with no tensor result ...)
    is named with the reason in ``dropped``."""
    ours = {rec["case"]["op"] for rec in result.records if rec["type"] == "case"}
    out = compare(ours, theirs)
    seen = {op_key(op): reason for reason, ops in (result.header.get("dropped_ops") or {}).items() for op in ops}
    out["dropped"] = {name: seen[op_key(name)] for name in out["missing"] if op_key(name) in seen}
    return out
