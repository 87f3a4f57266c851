"""Which dispatcher operators (``torch.ops.<ns>.<op>``, ``aten::<op>``) a case may call.

:mod:`casedb.cases.ops` applies this rule to every ``torch.ops`` spelling, at import (the case is
refused) and again when a run resolves the op (the case's outcome is a ``resolve`` error; the op
is never called):

* **Namespaces**: ``aten`` and ``prims``, and a namespace an ``--import`` module of this process
  registered (:func:`credit`): one that appeared while casedb imported the module, or whose
  Python registrations are in the module's own files (a module imported before, such as a device
  backend torch loads itself). Every other namespace is refused, among them those torch ships
  beside ATen (``profiler``, ``c10d``, ``_c10d_functional``, ``quantized``, ``mkldnn``,
  ``inductor``, ``higher_order`` ...: profilers, process groups, packed weights, global state) even
  when an ``--import`` module makes torch register them.
* **Names**: none of :data:`DENIED_OPS` and none matching :data:`DENIED_NAME` (``file``,
  ``save``, ``load``, ``seed`` anywhere in the name; ``set`` as a word: ``set_``, ``set_data``,
  ``set_grad_enabled``, ``_cufft_set_plan_cache_max_size``). The same name rule holds for
  torch functions and Tensor methods (``torch.Tensor.set_``).
* **Schemas**: no overload with an argument or result of a type that is not a value
  (:data:`DENIED_TYPES`: Storage, Future, RRef, Stream, a torch class such as a process group or
  packed weights, a Python callable), nor a ``str`` argument named like a file or a path. A packet
  (``torch.ops.aten.set_``) is refused when any of its overloads is: its arguments pick the
  overload.

``aten::from_file`` (creates or grows a file), ``aten::save``, ``aten::set_`` with a Storage,
``aten::manual_seed`` and the ``profiler`` ops are refused by more than one of these rules.
"""

from __future__ import annotations

import os
import re

import torch

ALLOWED_NAMESPACES = frozenset({"aten", "prims"})
DENIED_OPS = frozenset("_print warn record_stream _cufft_clear_plan_cache _use_cudnn_rnn_flatten_weight".split())
DENIED_NAME = re.compile(r"file|save|load|seed|(^|_)set(_|$)")
DENIED_TYPES = frozenset({"StorageType", "FutureType", "AwaitType", "RRefType", "StreamObjType", "ClassType",
                          "AnyClassType", "InterfaceType", "CapsuleType", "PyObjectType", "FunctionType"})
_PATH_ARGUMENT = re.compile(r"file|path|dir")
_DEBUG = re.compile(r"^debug: registered at (.+):\d+$", re.M)
_TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__))
# torch's registration helpers: a Library made there names the helper, not the code that asked
_HELPERS = (os.path.join(_TORCH_DIR, "library.py"), os.path.join(_TORCH_DIR, "_library"))

_imported: set[str] = set()
_REFUSALS: dict[str, str | None] = {}


def denied_name(op: str) -> bool:
    """True for an op name (no namespace, no overload) that reaches files or global state."""
    return op in DENIED_OPS or DENIED_NAME.search(op) is not None


def namespaces() -> set[str]:
    """The dispatcher namespaces registered in this process now."""
    return {n.split("::", 1)[0] for n in torch._C._dispatch_get_all_op_names()}


def credit(module, appeared: set[str]) -> None:
    """Allow the namespaces an --import `module` registered: those in `appeared` (new while
    casedb imported it) and those whose Python registrations are in the module's files — but
    never one torch's own code defines (torch registers some lazily, on a submodule's import)."""
    own = _module_paths(module)
    names = torch._C._dispatch_get_all_op_names()
    for ns in namespaces() - ALLOWED_NAMESPACES - _imported:
        files = _registration_files(ns, names)
        if any(_inside(f, _TORCH_DIR) and not any(_inside(f, h) for h in _HELPERS) for f in files):
            continue
        if ns in appeared or any(_inside(f, p) for f in files for p in own):
            _imported.add(ns)


def refusal(fn, ns: str, op: str, schemas) -> str | None:
    """Why a case may not call the dispatcher operator `fn` (``ns::op``, its overloads' `schemas`),
    or None when it may."""
    if ns not in ALLOWED_NAMESPACES and ns not in _imported:
        known = ", ".join(sorted(_imported)) or "none in this run"
        return (f"torch.ops.{ns} is not a namespace cases may call: cases call aten and prims operators, and those "
                f"of a library the run registers with --import MODULE (registered so: {known})")
    if not isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{ns}.{op} is not an operator"
    if denied_name(op):
        return f"{ns}::{op} is denied (ops that reach files, storages, streams or process-wide state)"
    for schema in schemas or ():
        why = _schema_refusal(schema)
        if why:
            return f"{schema.name}{'.' + schema.overload_name if schema.overload_name else ''} {why}"
    return None


def _schema_refusal(schema) -> str | None:
    key = str(schema)  # schemas with defaults (int[2] x=[1, 1]) are not hashable
    if key not in _REFUSALS:
        _REFUSALS[key] = _check_schema(schema)
    return _REFUSALS[key]


def _check_schema(schema) -> str | None:
    for a in list(schema.arguments) + list(schema.returns):
        kind = _denied_kind(a.type)
        if kind:
            what = kind.removesuffix("Type").removesuffix("Obj")
            return f"takes or returns a {what} ({a.name or 'result'}), not a value"
    for a in schema.arguments:
        if _PATH_ARGUMENT.search(a.name) and "str" in str(a.type):
            return f"takes a file name ({a.name})"
    return None


def _denied_kind(t) -> str | None:
    if t.kind() in DENIED_TYPES:
        return t.kind()
    for inner in t.containedTypes():
        kind = _denied_kind(inner)
        if kind:
            return kind
    return None


def _module_paths(module) -> list[str]:
    paths = list(getattr(module, "__path__", None) or ())  # a package: its folders
    if not paths and getattr(module, "__file__", None):
        paths = [module.__file__]
    return [os.path.realpath(p) for p in paths]


def _inside(path: str, root: str) -> bool:
    path = os.path.realpath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _registration_files(ns: str, names) -> set[str]:
    """Where the ops of namespace `ns` were registered (a custom_op's function, else the
    dispatcher's record of the registering file)."""
    from torch._library import custom_ops

    out = set()
    for qualname in names:
        if not qualname.startswith(ns + "::"):
            continue
        init = getattr(custom_ops.OPDEFS.get(qualname.split(".")[0]), "_init_fn", None)
        code = getattr(init, "__code__", None)
        if code is not None:
            out.add(code.co_filename)
            continue
        m = _DEBUG.search(torch._C._dispatch_dump(qualname))
        if m:
            out.add(m.group(1))
    return out
