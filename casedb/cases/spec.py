"""Validate and normalize one case (RFC-0186 schema, plus what real manifests and traces use).

Input: a case mapping as written in a manifest (or produced by an importer), the model's
defaults and where it came from. Output: a :class:`Normalized` — the executed part (``op``,
``inputs``, ``attrs``, explicit ``seed``: signed by :mod:`casedb.cases.signature`) and the
occurrence part (name, description, tolerances, marks, ``skip_if``, expectations), plus the
blobs that data/file tensors need. The normalization rules are in :mod:`casedb.cases.signature`;
inputs are read by :mod:`casedb.cases.input_specs`, marks and expectations by
:mod:`casedb.cases.expectations`.

Every error names the place (``file:line``), the case and what is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from casedb import names
from casedb.cases import bounds, dtypes, expectations, marks as marks_mod, safe_eval, signature as sig_mod
from casedb.cases.input_specs import INPUT_KINDS, InputContext, read_input, value_item
from casedb.errors import InputError

CASE_KEYS = ("name", "op", "inputs", "attrs", "kwmap", "description", "expects_error", "marks",
             "skip_if", "dtype", "seed", "rtol", "atol", "xfail_if", "xfail_reason", "xfail_strict",
             "count")
DEFAULT_KEYS = ("dtype", "seed", "rtol", "atol")


@dataclass
class Normalized:
    signature: str
    op: str
    inputs: list
    attrs: dict
    seed: int | None
    dtype: str                      # the dtype the case computes in (derived from its tensors)
    derived_marks: list[str]
    # occurrence (per model)
    name: str | None
    description: str | None
    marks: list[str]
    declared_dtype: str | None      # the case's own `dtype:` override, if it had one
    rtol: float | None              # the case's own tolerance (None: casedb.judge.numerics decides)
    atol: float | None
    skip_if: list[dict] | None
    expects_error: dict | None
    xfail: dict | None
    blobs: dict[str, bytes] = field(default_factory=dict)
    identity: str | None = None     # the call it is (casedb.cases.call_identity), filled when first asked


def line_of(obj) -> int | None:
    return getattr(obj, "line", None)


def _where(source: str | None, obj, fallback: str | None = None) -> str | None:
    line = line_of(obj)
    if source and line:
        return f"{source}:{line}"
    return fallback or source


def _refuse_unsafe_op(op: str) -> None:
    """Ops are tensor operations: a name that reaches os.system, a file writer, a module loader
    or process-wide state through torch — ``torch.ops.aten.from_file`` as much as ``torch.from_file``
    — is refused at import (casedb.cases.ops and casedb.cases.dispatcher have the rule; the run checks again)."""
    from casedb.cases.ops import UnsafeOpError, refuse_unsafe

    try:
        refuse_unsafe(op)
    except UnsafeOpError as e:
        raise ValueError(str(e)) from None


def normalize_defaults(defaults: Any, where: str | None) -> dict:
    if defaults is None:
        return {}
    if not isinstance(defaults, dict):
        raise InputError("'default' must be a mapping of dtype, seed, rtol, atol", where=where)
    out = {}
    for k, v in defaults.items():
        if k not in DEFAULT_KEYS:
            raise InputError(names.unknown_key_message(k, DEFAULT_KEYS) + " in 'default'", where=_where(where, defaults, where))
    try:
        if defaults.get("dtype") is not None:
            out["dtype"] = dtypes.canonical(defaults["dtype"])
        if defaults.get("seed") is not None:
            out["seed"] = bounds.check_seed(defaults["seed"])
        for k in ("rtol", "atol"):
            if defaults.get(k) is not None:
                out[k] = bounds.check_tolerance(defaults[k], f"'{k}'")
    except (ValueError, dtypes.UnknownDtype) as e:
        raise InputError(f"in 'default': {e}", where=where) from None
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: Any, what: str) -> None:
    """Raise ValueError if a string in `value` holds a lone surrogate (JSON's "\\ud800" escape,
    an undecodable file name): it is not Unicode text, and SQLite cannot store it."""
    if isinstance(value, str):
        hit = _SURROGATE.search(value)
        if hit:
            raise ValueError(f"{what} holds the lone surrogate \\u{ord(hit.group()):04x}, which is not a "
                             "Unicode character; fix the text")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, what)
            check_text(v, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_text(v, what)


def normalize_case(case: Any, defaults: dict, *, source: str | None = None, where: str | None = None,
                   base_dir: Path | None = None, allow_outside: bool = False,
                   max_bytes: int | None = None, safe_ops: set | None = None) -> Normalized:
    """Validate one case mapping and return its normalized form (raises InputError).

    ``file:`` inputs are read from below `base_dir` only, unless `allow_outside`; `max_bytes`
    caps each such file (default ``casedb.files.MAX_INPUT_BYTES``). `safe_ops`: the ops
    this import found safe already (not checked again; an op that passes is added)."""
    where = _where(source, case, where)
    if not isinstance(case, dict):
        raise InputError(f"a case must be a mapping with at least 'op' and 'inputs', got {type(case).__name__}", where=where)
    name = _case_name(case, where)
    try:
        for k in case:
            if k not in CASE_KEYS:
                raise ValueError(names.unknown_key_message(k, CASE_KEYS))
        op, declared, ctx = _op_and_context(case, defaults, source, base_dir, allow_outside, max_bytes, safe_ops)
        inputs = _inputs(case, ctx)
        attrs = _attrs(case, ctx)
        seed = bounds.check_seed(case["seed"]) if case.get("seed") is not None else None
        occurrence = _occurrence(case)
        key = sig_mod.signature(op, inputs, attrs, seed)
    except UnicodeEncodeError as e:  # a lone surrogate in op, inputs or attrs (signing encodes them)
        raise InputError(f"op, inputs or attrs hold the lone surrogate \\u{ord(e.object[e.start]):04x}, which "
                         "is not a Unicode character; fix the text", where=where, case=name) from None
    except (ValueError, dtypes.UnknownDtype, safe_eval.UnsafeExpression) as e:
        raise InputError(str(e), where=where, case=name) from None
    except InputError as e:
        e.case = e.case or name
        raise
    except RecursionError:
        raise InputError("nested too deeply to read; a case needs far fewer levels", where=where, case=name) from None
    derived = marks_mod.derive(inputs, attrs)
    # A derived mark written into a manifest (as `casedb export` does) is not a hand-written one.
    occurrence["marks"] = [m for m in occurrence["marks"] if m not in derived]
    return Normalized(
        signature=key, op=op, inputs=inputs, attrs=attrs, seed=seed,
        dtype=computed_dtype(inputs, attrs, ctx.case_dtype), derived_marks=derived, name=name,
        declared_dtype=declared, blobs=ctx.blobs, **occurrence,
    )


def _case_name(case: dict, where: str | None) -> str | None:
    name = case.get("name")
    if name is not None and not isinstance(name, (str, int)):
        raise InputError("'name' must be a string", where=where)
    name = None if name is None else str(name)
    try:
        check_text(name, "'name'")
    except ValueError as e:
        raise InputError(str(e), where=where, case=name) from None
    return name


def _op_and_context(case: dict, defaults: dict, source, base_dir, allow_outside, max_bytes, safe_ops):
    """(op, the case's own dtype or None, the context its inputs are read in)."""
    if "op" not in case:
        raise ValueError("missing 'op' (e.g. op: torch.add)")
    op = names.normalize_op(case["op"])
    if safe_ops is None or op not in safe_ops:
        # the dispatcher's verdict on an op does not change within one import: a big trace's
        # thousand cases of a few dozen ops look it up once each
        _refuse_unsafe_op(op)
        if safe_ops is not None:
            safe_ops.add(op)
    declared = dtypes.canonical(case["dtype"]) if case.get("dtype") is not None else None
    case_dtype = declared or dtypes.canonical(defaults.get("dtype") or "float32")
    return op, declared, InputContext(source, base_dir, case_dtype, allow_outside, max_bytes)


def _inputs(case: dict, ctx: InputContext) -> list:
    raw_inputs = case.get("inputs", [])
    if raw_inputs is None:
        raw_inputs = []
    if isinstance(raw_inputs, dict):
        raise ValueError("'inputs' must be a list of {tensor|value|py|tensor_list|file: ...} items, not a mapping")
    if not isinstance(raw_inputs, list):
        raise ValueError("'inputs' must be a list")
    return [read_input(item, ctx, f"inputs[{i}]") for i, item in enumerate(raw_inputs)]


def _attrs(case: dict, ctx: InputContext) -> dict:
    if "attrs" in case and "kwmap" in case:
        raise ValueError("give keyword arguments in 'attrs' or 'kwmap', not both")
    raw_attrs = case.get("attrs", case.get("kwmap")) or {}
    if not isinstance(raw_attrs, dict):
        raise ValueError("'attrs' must be a mapping of keyword arguments")
    attrs = {}
    for k, v in raw_attrs.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"keyword argument name {k!r} is not an identifier")
        if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in INPUT_KINDS:
            attrs[k] = read_input(v, ctx, f"attrs.{k}")
        else:
            item = value_item(v, f"attrs.{k}", key=k)
            attrs[k] = item["value"] if "value" in item else item
    return attrs


def _occurrence(case: dict) -> dict:
    """The fields of :class:`Normalized` that belong to the case's occurrence in its model."""
    if "count" in case:
        bounds.check_count(case["count"])
    # the case's own tolerance only: the rest is casedb.judge.numerics' (per compared dtype, at run time)
    out = {"rtol": bounds.check_tolerance(case["rtol"], "'rtol'") if case.get("rtol") is not None else None,
           "atol": bounds.check_tolerance(case["atol"], "'atol'") if case.get("atol") is not None else None,
           "marks": expectations.marks_of(case.get("marks")),
           "skip_if": expectations.conditions(case.get("skip_if"), "skip_if"),
           "xfail": expectations.xfail(case.get("xfail_if"), case.get("xfail_reason"), case.get("xfail_strict")),
           "expects_error": expectations.expects_error(case.get("expects_error"))}
    description = case.get("description")
    if description is not None:
        description = str(description).rstrip("\n")
    check_text(description, "'description'")
    out["description"] = description
    for label, key in (("'skip_if'", "skip_if"), ("'xfail_if'", "xfail"), ("'expects_error'", "expects_error")):
        if out[key] is not None:
            check_text(out[key], label)
    return out

def computed_dtype(inputs: list, attrs: dict, case_dtype: str) -> str:
    """The dtype a case computes in: its floating tensors' promotion, else its first tensor's,
    else (no tensors) the case's own dtype."""
    tensors = list(marks_mod.iter_tensors(inputs, attrs))
    return dtypes.promote_floating(t["dtype"] for t in tensors) or (tensors[0]["dtype"] if tensors else case_dtype)
