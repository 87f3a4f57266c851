"""`casedb repro`: one case as a standalone Python script (torch only), for an upstream bug report.

The script rebuilds the case's inputs exactly as :mod:`casedb.materialize` does — same seed,
same generator calls in the same order; it carries the source of materialize's own generator
functions (copied with :func:`inspect.getsource`, so the two cannot drift) and any data/file
tensor values embedded as base64 — then runs the op on the CPU (eager, the reference) and on
the target device (compiled with the backend as casedb compiles it: ``fullgraph=True,
dynamic=False`` after ``torch._dynamo.reset()``), and asserts closeness with
``torch.testing.assert_close`` at the case's tolerances. Exit status 0 when the target
matches; an AssertionError (or the target's own exception) otherwise.
"""

from __future__ import annotations

import base64
import inspect
import math
import os
import textwrap
import zlib
from pathlib import Path

from casedb.errors import CasedbError



def _source(fn) -> str:
    lines = inspect.getsource(fn).splitlines()
    while lines and lines[0].lstrip().startswith("@"):
        lines.pop(0)  # registration decorators belong to casedb, not to the script
    return textwrap.dedent("\n".join(lines)) + "\n"


# Modules the script imports itself; any other module a copied function uses is an error.
_SCRIPT_MODULES = {"torch", "math", "io", "sys", "zlib", "base64", "operator"}


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


def _copy_with_dependencies(objs) -> str:
    """Source of these functions plus every function, class and constant of their own module
    they use (transitively), dependencies first: the script runs casedb's very code."""
    done: set = set()
    blocks: list[str] = []
    consts: dict[str, str] = {}

    def visit(obj):
        key = (obj.__module__, obj.__qualname__)
        if key in done:
            return
        done.add(key)
        if inspect.isfunction(obj):
            for name in sorted(_code_names(obj.__code__)):
                if name not in obj.__globals__:
                    continue  # a builtin or an attribute name
                val = obj.__globals__[name]
                if inspect.ismodule(val):
                    if val.__name__ not in _SCRIPT_MODULES:
                        raise CasedbError(f"cannot copy {obj.__qualname__} into a repro: it uses module {val.__name__}")
                elif (inspect.isfunction(val) or inspect.isclass(val)) and val.__module__ == obj.__module__:
                    visit(val)
                elif not callable(val) and name not in consts:
                    text = repr(val)
                    try:
                        import torch

                        ok = eval(text, {"torch": torch}) == val  # noqa: S307 - our own constant's repr
                    except Exception:
                        ok = False
                    if not ok:
                        raise CasedbError(f"cannot copy {obj.__qualname__} into a repro: constant {name} has no literal form")
                    consts[name] = text
        blocks.append(_source(obj))

    for obj in objs:
        visit(obj)
    head = "".join(f"{k} = {v}\n" for k, v in consts.items())
    return (head + "\n\n" if head else "") + "\n\n".join(blocks) + "\n\n"


def _lit(v) -> str:
    """Python source for a literal value (what parse_py_literal / JSON values produce)."""
    if v is Ellipsis:
        return "Ellipsis"
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, slice):
        return f"slice({_lit(v.start)}, {_lit(v.stop)}, {_lit(v.step)})"
    if isinstance(v, tuple):
        inner = ", ".join(_lit(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(_lit(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_lit(k)}: {_lit(x)}" for k, x in v.items()) + "}"
    raise CasedbError(f"cannot write {v!r} into a script")


class _Writer:
    """Walks a case's inputs in materialize's order, writing generation and placement code."""

    def __init__(self, case: dict, load_blob):
        from casedb.materialize import torch_dtype

        self.case = case
        self.load_blob = load_blob
        self.case_dtype = case.get("dtype") or "float32"
        self.gen_lines: list[str] = []
        self.n = 0
        self.presets: set[str] = set()
        self.blobs = False
        self.torch_dtype = torch_dtype

    def _dtype(self, spec) -> str:
        return "torch." + str(self.torch_dtype(spec.get("dtype") or self.case_dtype)).replace("torch.", "")

    def tensor(self, spec: dict) -> str:
        i = self.n
        self.n += 1
        dtype = self._dtype(spec)
        shape = tuple(spec.get("shape") or ())
        if "blob" in spec:
            raw = self.load_blob(spec["blob"])
            packed = base64.b85encode(zlib.compress(raw, 9)).decode("ascii")
            chunks = "\n".join(f"        {packed[j:j + 96]!r}" for j in range(0, len(packed), 96)) or "        ''"
            self.gen_lines.append(f"    T.append(tensor_from_bytes(zlib.decompress(base64.b85decode(\n{chunks})),\n"
                                  f"        {shape!r}, {dtype}))  # blob {spec['blob'][:16]}")
            self.blobs = True
        elif spec.get("data") is not None:
            self.gen_lines.append(f"    T.append(torch.tensor({_lit(spec['data'])}, dtype={dtype})"
                                  + (f".reshape({shape!r}))" if "shape" in spec else ")"))
        else:
            t = self.torch_dtype(spec.get("dtype") or self.case_dtype)
            init = spec.get("init") or ("randn" if t.is_floating_point or t.is_complex else
                                        "rand" if str(t) == "torch.bool" else "randint")
            from casedb.materialize import _GEN

            if init not in _GEN:
                raise CasedbError(f"unknown init {init!r}; known: {', '.join(sorted(_GEN))}")
            self.gen_lines.append(f"    T.append({_GEN[init].__name__}({shape!r}, {dtype}, "
                                  f"{_lit(spec.get('init_args') or {})}, g))")
        preset = spec.get("preset")
        if preset:
            self.presets.add(preset)
            return f"_t(T[{i}], dev, fresh, {preset}, {_lit(spec.get('preset_args') or {})})"
        return f"_t(T[{i}], dev, fresh)"

    def value(self, v, key=None, top=True) -> str:
        from casedb.materialize import _torch_object, is_device_string

        if isinstance(v, str):
            if v.startswith("torch.") and _torch_object(v) is not None:
                return v
            if top and (key == "device" or is_device_string(v)):
                return f"(dev_text if REPLACE_DEVICE or dev_text == 'cpu' else {v!r})"
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(self.value(x, top=False) for x in v) + "]"
        return _lit(v)

    def input(self, spec: dict, key=None) -> str:
        from casedb.safe_eval import parse_py_literal

        kind, body = next(iter(spec.items()))
        if kind in ("tensor", "file"):
            return self.tensor(body)
        if kind == "value":
            return self.value(body, key=key)
        if kind == "py":
            return _lit(parse_py_literal(body))
        items = []
        for t in body:
            if t is None:
                items.append("None")
                continue
            if isinstance(t, dict) and len(t) == 1 and next(iter(t)) in ("tensor", "file"):
                t = next(iter(t.values()))
            items.append(self.tensor(t))
        return "[" + ", ".join(items) + "]"

    def arguments(self) -> tuple[list[str], list[tuple[str, str]]]:
        from casedb.materialize import INPUT_KINDS

        args = [self.input(s) for s in self.case.get("inputs") or ()]
        kwargs = []
        attrs = self.case.get("attrs") or {}
        for k in sorted(attrs):  # materialize's order: positional first, then keywords by name
            v = attrs[k]
            if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in INPUT_KINDS:
                kwargs.append((k, self.input(v, key=k)))
            else:
                kwargs.append((k, self.value(v, key=k)))
        return args, kwargs


def _op_expr(op: str) -> tuple[str, str]:
    """(expression for the op's callable, extra definitions it needs)."""
    from casedb.casespec import normalize_op
    from casedb.ops import UnknownOpError, op_info

    try:
        info = op_info(op)
    except UnknownOpError as e:
        raise CasedbError(f"cannot write a repro: {e}") from None
    if info.kind in ("overload", "packet"):
        return f"torch.ops.{info.fn}", ""
    if info.kind == "method":
        return f"torch.Tensor.{info.fn.__name__}", ""
    if info.kind == "operator":
        if info.fn.__name__ == "_setitem":
            return "_setitem", "\ndef _setitem(obj, index, value):\n    obj[index] = value\n"
        return f"operator.{info.fn.__name__}", ""
    return normalize_op(op), ""


def _import_lines(imports: list[str]) -> str:
    lines = []
    for name in imports:
        if name.endswith(".py") or "/" in name or os.sep in name:
            path = str(Path(name).resolve())
            lines.append(f"_load_file({path!r})  # registers the ops/backends this case needs")
        else:
            lines.append(f"import {name}  # registers the ops/backends this case needs")
    return "\n".join(lines)


_LOAD_FILE = '''
def _load_file(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("repro_import_" + str(abs(hash(path))), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
'''


def _choose(store, name: str) -> tuple[dict, list[dict]]:
    rows = store.find(name)
    sigs = list(dict.fromkeys(r["signature"] for r in rows))
    if len(sigs) > 1:
        choices = ", ".join(f"{r['model']}::{r['name']} ({r['signature'][:12]})" for r in rows[:10])
        raise CasedbError(f"{name!r} names {len(sigs)} different cases; give one of: {choices}")
    case = store.case(sigs[0])
    return case, rows


def script(store, name: str, *, device: str | None = None, backend: str | None = None,
           imports: list[str] = (), rtol: float | None = None, atol: float | None = None,
           replace_device: bool = True) -> str:
    """The repro script for the case `name` (signature prefix, case name or model::name)."""
    from casedb import materialize, presets
    from casedb.ops import op_info
    from casedb.runner import default_backend, import_module

    for mod in imports:
        import_module(mod)  # so custom ops resolve while the script is written
    case, rows = _choose(store, name)
    occ = rows[0]
    rtol = occ["rtol"] if rtol is None else rtol
    atol = occ["atol"] if atol is None else atol
    backend = backend or default_backend()
    w = _Writer(case, store.load_blob)
    args, kwargs = w.arguments()
    op_expr, op_defs = _op_expr(case["op"])
    # which arguments the op writes into, decided as the executor decides it
    prepared = materialize.prepare(case, load_blob=store.load_blob)
    info = op_info(case["op"])
    writes = info.mutated(prepared.args, prepared.kwargs)
    metadata_only = info.metadata_only(prepared.args, prepared.kwargs)
    seed = materialize.case_seed(case) & 0xFFFF_FFFF_FFFF_FFFF

    copied = list(materialize._GEN.values())
    if w.blobs:
        copied.append(materialize.tensor_from_bytes)
    copied += [presets.PRESETS[p].fn for p in sorted(w.presets)]
    helpers = _copy_with_dependencies(copied)
    occurrences = "\n".join(f"    {r['model']}::{r['name']} (rtol={r['rtol']:g}, atol={r['atol']:g})"
                            f"{' from ' + r['source'] if r.get('source') else ''}" for r in rows[:20])
    device_line = (f"DEVICE = {device!r}" if device else
                   'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"')
    arg_list = "[" + ", ".join(args) + "]"
    kw_dict = "{" + ", ".join(f"{k!r}: {v}" for k, v in kwargs) + "}"
    expects = occ.get("expects_error")
    note = f"\nThe manifest expects this case to raise: {expects}.\n" if expects else ""
    return f'''#!/usr/bin/env python3
"""Reproduce a casedb case: {case['op']}({case['shapes']}).

signature {case['signature']}
dtype {case['dtype']}; the CPU eager result is the reference, {backend} on DEVICE the target.
Used by:
{occurrences}
{note}
Generated by `casedb repro`; needs only torch (no casedb). Inputs are generated exactly as casedb
generates them (seed {seed}, same generator calls in the same order). Exit status 0: the target
matches the reference within rtol/atol; an AssertionError, or the target's error, otherwise.
"""

import base64  # noqa: F401
import io  # noqa: F401
import math  # noqa: F401
import operator  # noqa: F401
import sys  # noqa: F401
import zlib  # noqa: F401

import torch
{_LOAD_FILE if any(m.endswith('.py') or '/' in m for m in imports) else ''}
{_import_lines(list(imports))}

{device_line}
BACKEND = {backend!r}  # "eager": no compile
RTOL, ATOL = {rtol!r}, {atol!r}
SEED = {seed}
REPLACE_DEVICE = {replace_device!r}  # device strings in the case become the device each side runs on
WRITES = {writes!r}  # arguments the op writes into: compared too
METADATA_ONLY = {metadata_only!r}  # random/uninitialized output: compare shape, dtype, strides only
{op_defs}

{helpers}
def generate():
    """The case's tensors, on the CPU, in casedb's order."""
    g = torch.Generator()
    g.manual_seed(SEED)
    T = []
{chr(10).join(w.gen_lines) if w.gen_lines else '    pass'}
    return T


def _t(t, dev, fresh, preset=None, preset_args=None):
    if dev.type != "cpu":
        t = t.to(dev)
    elif fresh:
        t = t.clone()
    if preset is not None:
        t = preset(t, **preset_args)
    return t


def arguments(T, device, fresh):
    """(args, kwargs) of one call on `device`."""
    dev = torch.device(device)
    dev_text = str(dev)
    args = {arg_list}
    kwargs = {kw_dict}
    return args, kwargs


def call(fn, args, kwargs):
    out = fn(*args, **kwargs)
    result = {{"output": out}}
    for key in WRITES:
        result[key] = args[int(key[5:-1])] if key.startswith("args[") else kwargs[key[7:-1]]
    return result


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(i) for i in x) if type(x) in (list, tuple) else tuple(to_cpu(i) for i in x)
    if isinstance(x, dict):
        return {{k: to_cpu(v) for k, v in x.items()}}
    return x


def main():
    op = {op_expr}
    T = generate()
    fresh = bool(WRITES)
    with torch.no_grad():
        reference = call(op, *arguments(T, "cpu", fresh))

        def run_op(*args, **kwargs):
            return op(*args, **kwargs)

        if BACKEND == "eager":
            target_fn = op
        else:
            torch._dynamo.reset()
            target_fn = torch.compile(run_op, backend=BACKEND, fullgraph=True, dynamic=False)
        target = to_cpu(call(target_fn, *arguments(T, DEVICE, fresh)))
    for key in reference:
        ref, out = reference[key], target[key]
        if ref is None and out is None:
            continue
        if METADATA_ONLY and isinstance(ref, torch.Tensor):
            assert out.shape == ref.shape and out.dtype == ref.dtype, f"{{key}}: {{out.shape}} {{out.dtype}} != {{ref.shape}} {{ref.dtype}}"
            continue
        torch.testing.assert_close(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True,
                                   msg=lambda m, key=key: f"{{key}} on {{DEVICE}} ({{BACKEND}}) vs CPU eager: {{m}}")
    print(f"OK: {case['op']} on {{DEVICE}} ({{BACKEND}}) matches the CPU reference (rtol={{RTOL}}, atol={{ATOL}})")


if __name__ == "__main__":
    main()
'''
