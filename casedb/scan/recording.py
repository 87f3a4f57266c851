"""Recording: the torch-level and aten-level modes that see every call of a scanned model, the
recorder that drops what is no operator and dedupes the rest, and the encoding of a call's
arguments as RFC input items (see :mod:`casedb.scan.scanner` for what is dropped and why)."""

from __future__ import annotations

import contextlib
import json
import linecache
import math
import os
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from casedb.cases import dtypes, no_compute, size_rules, valid_inputs
from casedb.scan import pooling
from casedb.scan.recipes import display_path

# Real values of a CPU (control) tensor are kept for the valid_inputs rules that read them
# (valid_inputs.wants_values) when it is at most this big.
MAX_CAPTURED_VALUES = 8192
# casedb's transcription of a sentence-embedding head: model code, recorded at its own lines.
_POOLING_FILE = pooling.__file__


# -------------------------------------------------------------------------------- recording

class _Unrepresentable(Exception):
    pass


_NAMES: dict[int, str] | None = None
_NO_OP_CONVERSIONS = {"to", "type", "type_as", "contiguous", "float", "half", "bfloat16", "double",
                      "int", "long", "bool", "short", "char", "byte", "cpu", "cuda"}
_INDEX_OPS = {"torch.getitem", "torch.setitem"}
_PYTHON_DTYPES = {bool: "torch.bool", int: "torch.int64", float: "torch.float32"}


def torch_name(func) -> str | None:
    """Public qualified name of a callable seen by a TorchFunctionMode, or None."""
    global _NAMES

    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return "torch.ops." + str(func).replace("::", ".")
    if _NAMES is None:
        names: dict[int, str] = {}
        spaces = [("torch.nn.functional", torch.nn.functional), ("torch", torch), ("torch.linalg", torch.linalg),
                  ("torch.fft", torch.fft), ("torch.special", torch.special), ("torch.Tensor", torch.Tensor)]
        for prefix, space in spaces:
            for private in (False, True):  # public spellings win over private aliases
                for attr in dir(space):
                    if attr.startswith("_") != private or (private and attr.startswith("__") and prefix != "torch.Tensor"):
                        continue
                    obj = getattr(space, attr, None)
                    if callable(obj) and not isinstance(obj, type):
                        names.setdefault(id(obj), f"{prefix}.{attr}")
        names[id(torch.Tensor.__getitem__)] = "torch.getitem"
        names[id(torch.Tensor.__setitem__)] = "torch.setitem"
        _NAMES = names
    return _NAMES.get(id(func))


def _site_roots():
    import transformers

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    own_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    site = os.path.dirname(os.path.dirname(transformers.__file__)) + os.sep
    return (torch_dir, own_dir), site


class Recorder:
    """Collects calls from the torch-level and aten-level modes into deduplicated records."""

    def __init__(self, level: str, model: str | None = None, balanced_routing: bool = False,
                 routing_devices: tuple = ("meta",)):
        self.level = level
        self.model = model
        self.balanced_routing = balanced_routing
        self.routing_devices = routing_devices  # the top-k inputs balanced: meta (no values), cpu (random weights)
        # Functions seen failing on CPU tensors meeting meta ones: later calls move them first (a
        # failed call costs ~25x a meta call; the eager experts loop makes thousands of index_add_).
        self.one_device: set = set()
        self.recording = False
        self.calls = 0
        self.dropped: Counter = Counter()
        self.dropped_ops: dict[str, set] = {}  # reason -> op names (the --compare report explains with them)
        self._records: dict[str, dict] = {}
        self._internal, self._site = _site_roots()
        self._code_internal: dict[Any, bool] = {}
        self.last_site: str | None = None
        self._keys: dict[str, str] = {}

    def records(self) -> list[dict]:
        return list(self._records.values())

    def modes(self) -> contextlib.ExitStack:
        # The torch-level mode is always on: it keeps control tensors on the CPU at both levels.
        stack = contextlib.ExitStack()
        stack.enter_context(_TorchMode(self))
        if self.level == "aten":
            stack.enter_context(_AtenMode(self))
        return stack

    # -- where a call comes from
    def site(self) -> tuple[str, str]:
        """(file:line, code) of the innermost frame outside torch and casedb."""
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            internal = self._code_internal.get(code)
            if internal is None:
                internal = (code.co_filename.startswith(self._internal) or code.co_filename.startswith("<")) \
                    and code.co_filename != _POOLING_FILE
                self._code_internal[code] = internal
            if not internal:
                break
            frame = frame.f_back
        if frame is None:
            return "<unknown>", ""
        filename, line = frame.f_code.co_filename, frame.f_lineno
        code_line = linecache.getline(filename, line).strip()
        if filename.startswith(self._site):
            filename = filename[len(self._site):]
        else:
            filename = display_path(Path(filename))
        self.last_site = f"{filename}:{line}"
        return self.last_site, code_line

    # -- one call
    def add(self, op: str, args, out, encoded) -> None:
        self.calls += 1
        reason = self._drop_reason(op, args, out)
        if reason:
            self.dropped[reason] += 1
            self.dropped_ops.setdefault(reason, set()).add(op)
            return
        where, code = self.site()
        if isinstance(encoded, _Unrepresentable):
            self._skip(where, op, str(encoded))
            return
        inputs, attrs = encoded
        # Most calls repeat (one per layer): the raw encoding finds the record without redoing
        # the rules; different raw encodings (e.g. captured values a rule dropped) may share one.
        raw = repr((op, inputs, attrs, where))
        key = self._keys.get(raw)
        if key is None:
            case = valid_inputs.apply({"op": op, "inputs": inputs, "attrs": attrs})
            misfit = size_rules.misfits(case)
            if misfit:
                self._skip(where, op, f"sizes that cannot fit the recorded input: {'; '.join(misfit)}", warn=True)
                return
            case = valid_inputs.strip_values(case)
            case["description"] = f"File: {where}\nCode: {code}"
            key = self._keys[raw] = json.dumps([op, case["inputs"], case["attrs"], where], sort_keys=True)
            if key not in self._records:
                self._records[key] = {"type": "case", "model": self.model, "where": where, "count": 0, "case": case}
        self._records[key]["count"] += 1

    def _skip(self, where: str, op: str, reason: str, warn: bool = False) -> None:
        """A call recorded as ``skipped`` with why (the importer lists them); ``warn``: a call the
        model made that the scan could not record right, warned about once."""
        rec = {"type": "skipped", "where": where, "op": op, "reason": reason}
        key = json.dumps(rec, sort_keys=True)
        if key not in self._records:
            self._records[key] = {**rec, "count": 0}
            if warn:
                warnings.warn(f"{where}: {op} not recorded: {reason}", stacklevel=2)
        self._records[key]["count"] += 1

    def _drop_reason(self, op: str, args, out) -> str | None:
        name = no_compute.base_name(op)  # the one rule every front end drops by (casedb.cases.no_compute)
        if name in no_compute.UNINITIALIZED:
            return "uninitialized allocation"
        if name in no_compute.ALIASES:
            return "alias"
        if op.startswith("torch.Tensor._") and not op.startswith("torch.Tensor.__"):
            return "torch internal"
        if op == "torch.setitem":
            return None
        if not _has_tensor(out):
            return "no tensor result"
        method = op.rsplit(".", 1)[-1]
        if op.startswith("torch.Tensor.") and method in _NO_OP_CONVERSIONS and args and out is args[0]:
            return "no-op conversion"
        if op == "torch.ops.aten._to_copy.default" and args and isinstance(out, torch.Tensor) \
                and out.dtype == args[0].dtype:
            return "no-op conversion"
        return None


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    return False


# ---------------------------------------------------------------------------------- encoding

def _dtype_name(dtype) -> str:
    return dtypes.short(dtypes.canonical(str(dtype)))


def _tensor_spec(t, values: bool = False) -> dict:
    spec = {"shape": list(t.shape), "dtype": _dtype_name(t.dtype)}
    if not t.is_contiguous():
        spec["preset"] = "strided"
        spec["preset_args"] = {"stride": list(t.stride()), "storage_offset": t.storage_offset()}
    if values and t.device.type == "cpu" and t.numel() <= MAX_CAPTURED_VALUES:
        # Real values of a control tensor, for valid_inputs; stripped before output.
        spec[valid_inputs.VALUES] = t.tolist()
    return spec


def _py(x) -> str | None:
    """Text of a py: literal for x, or None if x holds something a literal cannot."""
    from casedb.cases.safe_eval import format_py_literal

    try:
        return format_py_literal(x)
    except TypeError:
        return None


def _encode(x, *, index: bool = False, values: bool = False) -> dict:
    """One argument as an RFC input item (``tensor`` / ``tensor_list`` / ``value`` / ``py``);
    ``values``: keep a small CPU tensor's values for valid_inputs."""

    if isinstance(x, torch.Tensor):
        return {"tensor": _tensor_spec(x, values)}
    if isinstance(x, torch.Size):
        return {"py": _py(tuple(x))} if index else {"value": list(x)}
    if isinstance(x, (list, tuple)):
        if x and all(isinstance(v, torch.Tensor) for v in x):
            return {"tensor_list": [_tensor_spec(v, values) for v in x]}
        if any(_has_tensor(v) for v in x):
            raise _Unrepresentable("a list/tuple mixing tensors with other values (e.g. an index like x[idx, :])")
        if index or any(v is Ellipsis or isinstance(v, slice) for v in x):
            text = _py(tuple(x) if isinstance(x, tuple) else list(x))
            if text is None:
                raise _Unrepresentable(f"an index of {type(x).__name__} holding unsupported values")
            return {"py": text}
        return {"value": [_plain(v) for v in x]}
    if x is Ellipsis or isinstance(x, slice):
        return {"py": _py(x)}
    if isinstance(x, float) and not math.isfinite(x):
        return {"py": _py(x)}
    return {"value": _plain(x)}


def _plain(x):
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            raise _Unrepresentable("a non-finite float inside a list")
        return x
    if isinstance(x, torch.dtype):
        return str(x)
    if isinstance(x, (list, tuple, torch.Size)):  # before the dtype lookup: a list is unhashable
        return [_plain(v) for v in x]
    if x in _PYTHON_DTYPES:  # torch.ones(..., dtype=bool)
        return _PYTHON_DTYPES[x]
    if isinstance(x, torch.device):
        return "cpu" if x.type == "meta" else str(x)  # the runner remaps the device
    if isinstance(x, (torch.memory_format, torch.layout)):
        return str(x)
    raise _Unrepresentable(f"an argument of type {type(x).__module__}.{type(x).__qualname__}")


_WANTS_VALUES: dict[str, bool] = {}


def encode_call(op: str, args, kwargs):
    """(inputs, attrs) of one call in the RFC schema; raises _Unrepresentable."""
    # Values are read (tolist) and keyed only for the ops whose valid-input rule uses them.
    values = _WANTS_VALUES.get(op)
    if values is None:
        values = _WANTS_VALUES[op] = valid_inputs.wants_values(op)
    inputs = [_encode(a, index=(op in _INDEX_OPS and i == 1), values=values) for i, a in enumerate(args)]
    attrs = {}
    for k, v in (kwargs or {}).items():
        item = _encode(v, values=values)
        # keyword values are written plainly unless they need an input form
        attrs[k] = item["value"] if "value" in item else item
    return inputs, attrs


# ------------------------------------------------------------------------------------ modes

def _keep_on_cpu(args, kwargs):
    """Arguments of ``Tensor.to`` / ``torch.as_tensor`` that keep a tensor where its values are:
    a CPU control tensor's ``to(meta)`` stays on the CPU (Mistral3 reads image sizes back with
    ``as_tensor(..., device=)``), and a meta tensor (a weight or buffer: no data) moved to the CPU
    stays meta (RoBERTa's token_type_ids buffer ``.to(position_ids.device)``, the positions real)."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].device.type not in ("cpu", "meta"):
        return args, kwargs
    stay = args[0].device.type
    asked = "meta" if stay == "cpu" else "cpu"

    def fix(x):
        if isinstance(x, torch.device) and x.type == asked or isinstance(x, str) and x == asked:
            return torch.device(stay)
        if isinstance(x, torch.Tensor) and x.device.type == asked:
            return x.dtype  # .to(other) means .to(other.device, other.dtype)
        return x

    return (args[0], *[fix(a) for a in args[1:]]), {k: fix(v) for k, v in kwargs.items()}


def _getter_name(func) -> str | None:
    """The property name when `func` is a tensor attribute read (``x.shape``), else None."""
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor" and getattr(func, "__name__", "") == "__get__":
        return owner.__name__
    return None


_TOPK = {torch.topk, torch.Tensor.topk}


def _call(rec: "Recorder", func, args, kwargs):
    """``func(*args, **kwargs)`` as the scan runs it: balanced routing on request, and a CPU
    control tensor meeting meta tensors in an op that needs one device moves to meta."""
    if rec.balanced_routing and func in _TOPK and args and args[0].device.type in rec.routing_devices:
        return _balanced_topk(args[0], func(*args, **kwargs))
    if func in rec.one_device:
        moved = _meta_if_mixed(args, kwargs)
        if moved is not None:
            return func(*moved[0], **moved[1])
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        moved = _meta_if_mixed(args, kwargs)
        if moved is None:
            raise
        # e.g. index_add_(0, cpu_index, meta_source), a padding mask indexed with meta positions:
        # real values cannot meet meta ones, so this result is meta (values unknown) too.
        rec.one_device.add(func)
        return func(*moved[0], **moved[1])


def _balanced_topk(x, out):
    """Router top-k with real indices: token t's j-th choice is expert (t*k + j) mod E, so every
    expert gets an even share of the tokens (as the grouped_mm offsets rule assumes) and a
    token's k choices differ. The values stay meta."""
    values, indices = out
    k, experts = indices.shape[-1], x.shape[-1]
    if indices.shape[:-1] != x.shape[:-1] or k > experts:
        return out  # not a top-k over the last dim: leave it
    routing = torch.arange(indices.numel()).reshape(indices.shape) % experts
    return torch.return_types.topk((values, routing))


def _meta_if_mixed(args, kwargs):
    """(args, kwargs) with CPU tensors moved to meta when both devices are among them, else None."""
    found = set()

    def scan_devices(x):
        if isinstance(x, torch.Tensor):
            found.add(x.device.type)
        elif isinstance(x, (list, tuple)):
            for v in x:
                scan_devices(v)

    scan_devices(list(args) + list(kwargs.values()))
    if not {"cpu", "meta"} <= found:
        return None

    def move(x):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            return x.to("meta")
        if isinstance(x, (list, tuple)):
            return type(x)(move(v) for v in x)
        return x

    return [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}


class _TorchMode(TorchFunctionMode):
    """Sees every call the model code makes; records them at ``level="torch"``."""

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        if func is torch.Tensor.to or func is torch.as_tensor:
            args, kwargs = _keep_on_cpu(args, kwargs)
        record = rec.recording and rec.level == "torch"
        if _getter_name(func) is not None:
            if record:
                rec.calls += 1
                rec.dropped["attribute read"] += 1
            return func(*args, **kwargs)
        if not record:
            return _call(rec, func, args, kwargs)
        op = torch_name(func)
        try:
            # encoded before the call: in-place ops change their inputs' values (and some, shapes)
            encoded = encode_call(op, args, kwargs) if op else _Unrepresentable(
                f"no public torch name for {getattr(func, '__qualname__', func)!r}")
        except _Unrepresentable as e:
            encoded = e
        out = _call(rec, func, args, kwargs)
        rec.add(op or getattr(func, "__qualname__", str(func)), args, out, encoded)
        return out


class _AtenMode(TorchDispatchMode):
    """Sees every ATen overload dispatched; records them at ``level="aten"``."""

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.recorder.recording:
            return func(*args, **kwargs)
        op = "torch.ops." + str(func)
        try:
            encoded = encode_call(op, args, kwargs)
        except _Unrepresentable as e:
            encoded = e
        out = func(*args, **kwargs)
        self.recorder.add(op, args, out, encoded)
        return out
