"""Coverage of another tracer's op list by a casedb scan of the same model.

Their files (the RFC implementation's model-ops tests) come in three shapes, read here without
the importers (only the op names matter):

* **v2** — ``test_suite_config: files: [tests: [edits: ops: include: [{name: OP, ...}]]]``;
* **v1** — ``cases: [{op: OP, ...}]`` (casedb's own manifests have this shape too);
* **op list** — plain text, one op per line, perhaps followed by a count; ``#`` starts a comment;
* **a trace** — a Kineto or Execution Trace JSON (``.json``/``.json.gz``, told apart by the
  importers' registry), its ops read by its importer (``aten::linear`` as ``torch.ops.aten.linear.default``).

Names differ in spelling between the two tracers: theirs records a compiled graph, where a
Tensor method is ``torch.<method>`` and a Python operator is the :mod:`operator` function
(``torch.truediv`` for ``x / y``, ``torch.and_`` for ``x & y``); casedb records what
``__torch_function__`` sees (``torch.Tensor.div``, ``torch.Tensor.__and__``). Both sides are
reduced to one **key** per operator (:func:`op_key`, the one table of spellings in
:mod:`casedb.cases.op_identity`) before they are compared; a trace's op that does our op's work
with its arguments laid out otherwise (``aten::slice``/``select``/``index`` for ``getitem``,
``aten::index_put_`` for ``setitem``, ``aten::lift_fresh`` for ``torch.tensor``) is no missing op.

Some of their names are no operator at all — graph bookkeeping and context managers that return
no tensor (``torch.nn.attention.sdpa_kernel``, ``torch._C._functorch._add_batch_dim``): a
backend never runs them as a kernel and a case of them could not be judged. They are listed
apart (``not_operators``) and left out of the coverage figure.
"""

from __future__ import annotations

import re
from pathlib import Path

from casedb.cases import op_identity
from casedb.scan.config import ScanError

MAX_FILE_BYTES = 64 << 20  # their largest file (granite-4.0-h-tiny) is 1.5 MB
# Names that are no operator: graph bookkeeping of a compiled trace and context managers.
_NOT_OPERATOR = re.compile(r"^torch\.(_C\.|amp\.|nn\.attention\.|autograd\.|_dynamo\.|cuda\.|_functorch\.)")
_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*)(?:\s+\d+)?\s*$")  # a name, then perhaps a count
TRACE_FORMATS = ("kineto", "et")  # importers.REGISTRY's names of the profilers' files


def op_key(name: str) -> str:
    """The operator a name spells, the same for both tracers' spellings (``torch.truediv`` and
    ``torch.Tensor.div`` are ``div``; ``torch.functional.split`` and ``torch.Tensor.split``
    are ``split``; an ATen overload drops its overload name): the one table of spellings,
    :func:`casedb.cases.op_identity.operator_of`."""
    return op_identity.operator_of(name)


def is_operator(name: str) -> bool:
    """False for graph bookkeeping and context managers (see the module docstring)."""
    return not _NOT_OPERATOR.match(name)


def read_ops(path: str | Path) -> list[str]:
    """The op names of a v2, v1 or op-list file, in first-seen order; ScanError names what is wrong."""
    from casedb import files

    path = Path(path)
    fmt = _trace_format(path)
    if fmt:
        return _trace_ops(path, fmt)
    try:
        text = files.read_text(path, MAX_FILE_BYTES)
    except ScanError:
        raise
    except Exception as e:  # InputError (not a regular file, too big) or a decoding error
        raise ScanError(f"cannot read the file to compare with: {e}", where=str(path)) from None
    if path.suffix in (".yaml", ".yml"):
        return _yaml_ops(text, str(path))
    return _list_ops(text, str(path))


def _trace_format(path: Path) -> str | None:
    """``kineto`` or ``et`` when the importers' registry detects a profiler's trace, else None."""
    import importers
    from casedb.errors import CasedbError

    try:
        fmt = importers.detect(path)
    except (importers.UnknownFormat, CasedbError, OSError):  # read as the other shapes, which name the problem
        return None
    return fmt if fmt in TRACE_FORMATS else None


def _trace_ops(path: Path, fmt: str) -> list[str]:
    """The ops of a Kineto or ET trace, read by its importer (the calls it imports and those it
    skips: the trace saw them), each as casedb stores it (``torch.ops.aten.linear.default``)."""
    import importers
    from casedb import names

    ops: dict[str, None] = {}
    try:
        for rec in importers.module(fmt).parse(path):
            op = rec.get("case", {}).get("op") if rec.get("type") == "case" else rec.get("op")
            if isinstance(op, str) and op.strip():
                ops[names.normalize_op(op)] = None
    except (OSError, EOFError, ValueError, KeyError) as e:
        raise ScanError(f"cannot read as a {fmt} trace: {type(e).__name__}: {e}", where=str(path)) from None
    if not ops:
        raise ScanError(f"no operator calls in the {fmt} trace (record it with record_shapes=True)", where=str(path))
    return list(ops)


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
    """What their ops and ours have in common, by :func:`op_key` (a trace's op laid out otherwise,
    ``aten::slice`` for our ``getitem``, counts as ours: ``op_identity.OTHER_LAYOUT``): ``missing`` (theirs, not ours),
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
    # a trace's aten::slice is the work of our getitem, laid out otherwise (op_identity.OTHER_LAYOUT)
    ours_for = {k: [o for o in (k, *op_identity.stands_for(k)) if o in our_keys] for k in their_keys}
    theirs_cover = {o for found in ours_for.values() for o in found}
    matched = sorted(k for k in their_keys if ours_for[k])
    missing = sorted(n for k, names in their_keys.items() if not ours_for[k] for n in names)
    extra = sorted(n for k, names in our_keys.items() if k not in theirs_cover for n in names)
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
