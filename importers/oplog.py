"""operator_inp_logs importer and writer.

The text format written by PyTorch's ``benchmarks/dynamo/microbenchmarks/operator_inp_utils.py``
(``OperatorInputsMode.log_to_file``) and read by operatorbench / BackendBench::

    Operator: aten.addmm.default
    cnt: 49, ((T([768], f16), T([8192, 768], f16), T([768, 768], f16, stride=(1, 768))), {})
    Operator: aten._to_copy.default
    cnt: 1, ((T([64, 1, 1, 128], f32),), {'dtype': f16})

Each ``cnt`` line is one distinct call (``count`` = cnt) of the operator above it: positional
arguments become ``inputs``, keyword arguments ``attrs``. ``T(shape, dtype[, stride=...])`` is
a tensor (short dtype codes ``f16 bf16 f32 f64 i8 ... b8``), bare dtype codes are dtype values.
Lines are read with a restricted literal parser (no ``eval``). Symbolic sizes (``s0``,
``2*s1``) from dynamic-shape logs need values: ``parse(path, symbols={"s0": 128})``; without
them the call is skipped with that reason.

``write(cases, fileobj)`` writes cases back in the same format (``casedb export --format oplog``)
so they load in those tools: only ``torch.ops.<ns>.<op>.<overload>`` cases fit, with tensor
shapes/dtypes/strides (tensor values, storage offsets and ``init`` are not part of the format).
"""

from __future__ import annotations

import ast
import gzip
import math
import re
import zlib
from typing import Any, Iterable, Iterator, TextIO

from casedb.files import read_bytes
from importers.record import ImportRecord
from .trace_values import TraceFormatError, contiguous, value_input

__all__ = ["parse", "write", "sniff", "DTYPE_CODES"]

# operator_inp_utils.dtype_abbrs, code -> casedb dtype.
DTYPE_CODES: dict[str, str] = {
    "bf16": "bf16",
    "f64": "float64",
    "f32": "fp32",
    "f16": "fp16",
    "c32": "complex32",
    "c64": "complex64",
    "c128": "complex128",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "b8": "bool",
    "u8": "uint8",
}
_TORCH_DTYPE = {
    "bf16": "bfloat16", "f64": "float64", "f32": "float32", "f16": "float16", "c32": "complex32",
    "c64": "complex64", "c128": "complex128", "i8": "int8", "i16": "int16", "i32": "int32",
    "i64": "int64", "b8": "bool", "u8": "uint8",
}
# Every spelling of a dtype a case may carry -> oplog code (for write()).
_TO_CODE: dict[str, str] = {}
for _code, _name in _TORCH_DTYPE.items():
    for _s in (_code, _name, "torch." + _name, DTYPE_CODES[_code]):
        _TO_CODE[_s] = _code
for _s, _code in {"half": "f16", "float": "f32", "double": "f64", "long": "i64", "int": "i32",
                  "short": "i16", "torch.half": "f16", "torch.float": "f32", "torch.double": "f64",
                  "torch.long": "i64", "torch.int": "i32", "torch.short": "i16", "cfloat": "c64",
                  "cdouble": "c128", "torch.cfloat": "c64", "torch.cdouble": "c128"}.items():
    _TO_CODE[_s] = _code

_CNT = re.compile(r"^cnt:\s*(\d+)\s*,\s*(.*?)\s*$")
_OPNAME = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*\.[A-Za-z_]\w*$")
_SYMBOL = re.compile(r"^[a-z]{1,3}\d+$")


class _Unrepresentable(Exception):
    pass


class _Symbolic(Exception):
    pass


def sniff(path, head: bytes | str) -> bool:
    """True if the file is an operator_inp_logs text file (first line ``Operator: ...``)."""
    if isinstance(head, str):
        return head.lstrip().startswith("Operator:")
    return head.lstrip().startswith(b"Operator:")


# ----------------------------------------------------------------------------- reading


class _Reader:
    """Converts one line's AST into Python values with tensor markers (no eval)."""

    def __init__(self, symbols: dict[str, int]):
        self.symbols = symbols

    def value(self, n: ast.AST) -> Any:
        if isinstance(n, ast.Constant):
            if isinstance(n.value, (int, float, str, bool)) or n.value is None:
                return n.value
            raise ValueError(f"unsupported constant {n.value!r}")
        if isinstance(n, (ast.Tuple, ast.List)):
            return [self.value(e) for e in n.elts]
        if isinstance(n, ast.Dict):
            out = {}
            for k, v in zip(n.keys, n.values):
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    raise ValueError("keyword names must be strings")
                out[k.value] = self.value(v)
            return out
        if isinstance(n, ast.Name):
            return self._name(n.id)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            v = self.value(n.operand)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError("sign on a non-number")
            return -v if isinstance(n.op, ast.USub) else v
        if isinstance(n, ast.BinOp):
            return self._arithmetic(n)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("torch", "th"):
            return ("torch", n.attr)
        if isinstance(n, ast.Call):
            return self._call(n)
        raise ValueError(f"unsupported syntax {ast.dump(n)[:60]}")

    def _name(self, name: str) -> Any:
        if name in DTYPE_CODES:
            return ("dtype", name)
        if name == "inf":
            return math.inf
        if name == "nan":
            return math.nan
        if name in self.symbols:
            return self.symbols[name]
        if _SYMBOL.match(name):  # sympy size symbols of dynamic shapes: s0, u3 ...
            raise _Symbolic(name)
        raise ValueError(f"unknown name {name!r}")

    def _arithmetic(self, n: ast.BinOp) -> int:
        """Symbolic size expressions: 2*s0, s0 + 1, (s0 - 1)//2."""
        a, b = self.value(n.left), self.value(n.right)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
            raise ValueError("arithmetic on non-integers")
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
        f = ops.get(type(n.op))
        if f is None:
            raise ValueError(f"unsupported operator {type(n.op).__name__}")
        return f()

    def _call(self, n: ast.Call) -> Any:
        """``T(shape, dtype, stride=...)``, ``float('inf')``, ``torch.device('cuda')``."""
        fn = n.func.id if isinstance(n.func, ast.Name) else None
        if fn == "T":
            if len(n.args) == 2 and isinstance(n.args[1], ast.Name) and n.args[1].id not in DTYPE_CODES:
                raise ValueError(f"unknown dtype code {n.args[1].id!r} (known: {', '.join(DTYPE_CODES)})")
            args = [self.value(a) for a in n.args]
            kw = {k.arg: self.value(k.value) for k in n.keywords}
            if len(args) != 2 or not isinstance(args[0], list) or args[1].__class__ is not tuple \
                    or args[1][0] != "dtype":
                raise ValueError("T(...) needs a shape list and a dtype code")
            if set(kw) - {"stride"}:
                raise ValueError(f"T(...) does not take {', '.join(sorted(set(kw) - {'stride'}))}")
            return ("T", args[0], args[1][1], kw.get("stride"))
        if fn == "ST":
            raise _Unrepresentable("sparse tensor argument (ST)")
        if fn == "float" and len(n.args) == 1 and isinstance(n.args[0], ast.Constant):
            return float(n.args[0].value)
        if (isinstance(n.func, ast.Attribute) and n.func.attr == "device"
                and len(n.args) == 1 and isinstance(n.args[0], ast.Constant)):
            return str(n.args[0].value)  # torch.device('cuda') -> 'cuda'
        raise ValueError(f"unsupported syntax {ast.dump(n)[:60]}")


def _tensor_spec(t: tuple) -> dict:
    _, shape, code, stride = t
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"tensor sizes must be non-negative integers, got {shape}")
    spec: dict[str, Any] = {"shape": list(shape), "dtype": DTYPE_CODES[code]}
    if stride is not None:
        if len(stride) != len(shape):
            raise ValueError("stride and shape lengths differ")
        if not contiguous(shape, stride):
            spec["preset"] = "strided"
            spec["preset_args"] = {"stride": list(stride), "storage_offset": 0}
    return spec


def _is_tensor(v) -> bool:
    return isinstance(v, tuple) and v[0] == "T"


def _plain(v) -> Any:
    """A non-tensor value -> casedb plain value (dtype codes -> torch names)."""
    if isinstance(v, tuple):
        if v[0] == "dtype":
            return "torch." + _TORCH_DTYPE[v[1]]
        if v[0] == "torch":
            return "torch." + v[1]
        raise _Unrepresentable("tensor inside a non-tensor value")
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        raise _Unrepresentable("dict argument")
    return v


def _form(v) -> dict:
    """One argument -> casedb input form."""
    if _is_tensor(v):
        return {"tensor": _tensor_spec(v)}
    if isinstance(v, list) and v and all(_is_tensor(x) for x in v):
        return {"tensor_list": [_tensor_spec(x) for x in v]}
    if isinstance(v, list) and any(_is_tensor(x) for x in v):
        raise _Unrepresentable("Tensor?[] list with None entries is not representable")
    return value_input(_plain(v))


def parse(path, *, symbols: dict[str, int] | None = None, max_bytes: int | None = None,
          **_options) -> Iterator[ImportRecord]:
    """Yield casedb records for an operator_inp_logs file (one per ``cnt`` line).

    symbols: values for symbolic sizes (``{"s0": 128}``) of dynamic-shape logs.
    max_bytes: cap on the file size, default ``casedb.files.MAX_INPUT_BYTES``.
    """
    path = str(path)
    fix = "each call is 'cnt: <n>, ((<args>), {<kwargs>})' under an 'Operator: <ns>.<op>.<overload>' line"
    reader = _Reader(dict(symbols or {}))
    try:
        lines = read_bytes(path, max_bytes).decode("utf-8").splitlines()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceFormatError(f"{path}: the gzip data is truncated or corrupt ({e})") from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{path}: not an operator_inp_logs text file (not UTF-8: {e.reason})") from None

    op = None
    seen: dict[tuple, dict] = {}
    for lineno, line in enumerate(lines, 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("Operator:"):
            name = s[len("Operator:"):].strip()
            if name == "aten.sum.SymInt":  # old logs; both upstream loaders read it as dim_IntList
                name = "aten.sum.dim_IntList"
            if not _OPNAME.match(name):
                raise TraceFormatError(f"{path}:{lineno}: bad operator name {name!r}; "
                                       "expected <ns>.<op>.<overload> like aten.add.Tensor")
            op = "torch.ops." + name
            continue
        m = _CNT.match(s)
        if m is None:
            raise TraceFormatError(f"{path}:{lineno}: unexpected line {s[:80]!r}; {fix}")
        if op is None:
            raise TraceFormatError(f"{path}:{lineno}: a 'cnt:' line before any 'Operator:' line; {fix}")
        cnt = int(m.group(1))
        text = m.group(2).strip().strip("'\"")
        key = (op, text)
        if key in seen:  # the same call listed twice: one record, counts added
            seen[key]["count"] += max(cnt, 1)
            continue
        seen[key] = _read_call(reader, op, text, cnt, path, lineno, fix)
    # Yielded at the end so merged counts are final (these files are small).
    yield from seen.values()


def _read_call(reader: _Reader, op: str, text: str, cnt: int, path: str, lineno: int, fix: str) -> ImportRecord:
    """One ``cnt`` line -> a case or skipped record (TraceFormatError if unreadable)."""
    where = f"{path}:{lineno}"
    try:
        tree = ast.parse(text, mode="eval").body
        call = reader.value(tree)
        if not (isinstance(call, list) and len(call) == 2 and isinstance(call[0], list) and isinstance(call[1], dict)):
            raise ValueError("expected a pair ((args...), {kwargs...})")
        inputs = [_form(a) for a in call[0]]
        attrs = {}
        for k, v in call[1].items():
            fm = _form(v)
            attrs[k] = fm["value"] if len(fm) == 1 and "value" in fm else fm
    except _Unrepresentable as e:
        return {"type": "skipped", "where": where, "op": op, "count": max(cnt, 1), "reason": str(e)}
    except _Symbolic as e:
        return {"type": "skipped", "where": where, "op": op, "count": max(cnt, 1),
                "reason": f"symbolic size {e} (dynamic-shape log): give its value, e.g. symbols={{'{e}': 128}}"}
    except (SyntaxError, ValueError, TypeError, KeyError, RecursionError) as e:
        msg = e.msg if isinstance(e, SyntaxError) else str(e)
        raise TraceFormatError(
            f"{path}:{lineno}: cannot read the call arguments ({msg}); the line is truncated or "
            f"corrupt: {fix}"
        ) from None
    description = f"{path} line {lineno}"
    if cnt == 0:
        description += " (cnt: 0, a synthetic input)"
    return {"type": "case", "model": None, "where": where, "count": max(cnt, 1),
            "case": {"op": op, "inputs": inputs, "attrs": attrs, "description": description}}


# ----------------------------------------------------------------------------- writing


def _fmt_float(x: float) -> str:
    if x != x:
        return "float('nan')"  # the upstream loaders eval with inf but no nan in scope
    return repr(x)


def _fmt_value(v: Any) -> str:
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _fmt_float(v)
    if isinstance(v, str):
        if v in _TO_CODE and v.startswith("torch."):
            return _TO_CODE[v]
        if re.match(r"^torch\.[A-Za-z_]\w*$", v):
            return v  # torch.strided, torch.contiguous_format: loaders have torch in scope
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt_value(x) for x in v) + "]"
    raise _Unrepresentable(f"value {v!r} has no oplog form")


def _strides(shape, preset, pargs) -> list[int] | None:
    """Strides a layout preset gives a tensor of ``shape`` (None: contiguous)."""
    if not preset:
        return None
    if preset == "strided":
        return list(pargs["stride"])
    n = len(shape)

    def contig(sh):
        st, acc = [0] * len(sh), 1
        for i in range(len(sh) - 1, -1, -1):
            st[i] = acc
            acc *= max(sh[i], 1)
        return st

    if preset == "transpose_view":
        d0, d1 = pargs.get("dim0", 0) % n, pargs.get("dim1", 1) % n
        sw = list(shape)
        sw[d0], sw[d1] = sw[d1], sw[d0]
        st = contig(sw)
        st[d0], st[d1] = st[d1], st[d0]
        return st
    if preset == "noncontig_slice":
        d, step = pargs.get("dim", -1) % n, pargs.get("step", 2)
        big = list(shape)
        big[d] *= step
        st = contig(big)
        st[d] *= step
        return st
    raise _Unrepresentable(f"layout preset {preset!r} has no oplog form")


def _fmt_tensor(spec: dict, dtype_default: str | None) -> str:
    dt = spec.get("dtype") or dtype_default
    code = _TO_CODE.get(str(dt)) if dt is not None else None
    if code is None:
        raise _Unrepresentable(f"tensor dtype {dt!r} has no oplog code" if dt else
                               "tensor dtype unknown (the case relies on a model default dtype)")
    shape = spec.get("shape")
    if not isinstance(shape, list):
        raise _Unrepresentable("tensor without a shape")
    st = _strides(shape, spec.get("preset"), spec.get("preset_args") or {})
    if st is not None and not contiguous(shape, st):
        return f"T({_fmt_value(shape)}, {code}, stride={tuple(st)!r})"
    return f"T({_fmt_value(shape)}, {code})"


def _fmt_input(form: Any, dtype_default: str | None) -> str:
    if not isinstance(form, dict):
        return _fmt_value(form)
    if "tensor" in form:
        return _fmt_tensor(form["tensor"], dtype_default)
    if "tensor_list" in form:
        return "[" + ", ".join(_fmt_tensor(t, dtype_default) for t in form["tensor_list"]) + "]"
    if "file" in form and isinstance(form["file"], dict):
        return _fmt_tensor(form["file"], dtype_default)  # a stored tensor: its shape and dtype
    if "value" in form:
        return _fmt_value(form["value"])
    if "py" in form:
        text = str(form["py"]).strip()
        lits = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}
        if text in lits:
            return _fmt_float(lits[text])
        try:
            tree = ast.parse(text, mode="eval").body
            return _fmt_value(_Reader({}).value(tree))
        except Exception:
            raise _Unrepresentable(f"py input {text!r} has no oplog form") from None
    raise _Unrepresentable(f"input {sorted(form)} has no oplog form "
                           "(it holds tensors' shapes, dtypes and strides, and plain values)")


def _oplog_name(op: str) -> str:
    parts = op.split(".")
    if len(parts) == 5 and parts[0] == "torch" and parts[1] == "ops":
        return ".".join(parts[2:])
    if len(parts) == 4 and parts[0] == "torch" and parts[1] == "ops":
        raise _Unrepresentable(f"{op} has no overload; the oplog format names one (aten.add.Tensor)")
    raise _Unrepresentable(f"{op} is not an operator overload torch.ops.<ns>.<op>.<overload>")


def write(cases: Iterable[dict], fileobj: TextIO, *, default_dtype: str | None = None,
          skipped: list | None = None) -> int:
    """Write cases as operator_inp_logs text; return how many cases were written.

    Each case is a casedb case dict (``op``, ``inputs``, ``attrs``/``kwmap``, optional ``count``,
    ``dtype``, ``name``), e.g. a row of ``Store.occurrences``. Tensors without a dtype use the
    case ``dtype``, then ``default_dtype``. Identical calls are merged with their counts added;
    operators are sorted like ``OperatorInputsMode.log_to_file``. Cases the format cannot
    express are appended to ``skipped`` as ``{"case", "op", "reason"}``: pass a list and report
    them (without one they raise ValueError, so nothing is dropped silently).
    """
    by_op: dict[str, dict[str, int]] = {}
    left_out: list[dict] = []
    written = 0
    for case in cases:
        op = case.get("op", "")
        try:
            name = _oplog_name(str(op))
            dflt = case.get("dtype") or default_dtype
            args = [_fmt_input(f, dflt) for f in case.get("inputs") or []]
            kw = case.get("attrs") or case.get("kwmap") or {}
            kws = ", ".join(f"{k!r}: {_fmt_input(v, dflt)}" for k, v in kw.items())
        except _Unrepresentable as e:
            left_out.append({"case": case.get("name") or op, "op": op, "reason": str(e)})
            continue
        tup = "(" + ", ".join(args) + ("," if len(args) == 1 else "") + ")"
        line = f"({tup}, {{{kws}}})"
        calls = by_op.setdefault(name, {})
        calls[line] = calls.get(line, 0) + int(case.get("count") or 1)
        written += 1
    if left_out and skipped is None:
        first = left_out[0]
        raise ValueError(f"{len(left_out)} cases have no operator_inp_logs form, e.g. {first['case']}: "
                         f"{first['reason']}")
    if skipped is not None:
        skipped.extend(left_out)
    for name in sorted(by_op):
        fileobj.write(f"Operator: {name}\n")
        for line, cnt in by_op[name].items():
            fileobj.write(f"cnt: {cnt}, {line}\n")
    return written
