"""Run one case and judge it: the execution core shared by ``casedb run`` and the pytest plugin.

:func:`run_case` executes a normalized case once — the reference on the CPU in eager mode, the
target on ``device`` with ``backend`` (``"eager"``: no compile; otherwise any registered dynamo
backend, compiled with ``fullgraph=True, dynamic=False`` after ``torch._dynamo.reset()``) — and
returns an :class:`Execution` that keeps the results as CPU tensors. :func:`judge` turns an
Execution into a :class:`Verdict` for one model occurrence (its tolerances and expected error);
judging again with other tolerances does not run anything.

What is compared: the op's output, plus every argument the op writes into (in-place ops,
``out=``, ``inplace=True``, and any input whose version counter moved during the reference
call). Ops with random or uninitialized output are compared on metadata only (shape, dtype,
strides).

No database access here; tensors are built by :mod:`casedb.cases.materialize`, ops resolved by
:mod:`casedb.cases.ops`, results compared by :mod:`casedb.judge.compare`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import traceback
import warnings
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable

import torch

from casedb.cases import dtypes
from casedb.judge import bias, numerics
from casedb import outcomes
from casedb.judge.compare import Comparison, compare, flat_chunks
from casedb.cases.materialize import Prepared, prepare, result_leaves, torch_dtype, upcast_caster
from casedb.cases.ops import UnknownOpError, get_arg, op_info

# The outcomes judge() gives (the others come from the runner: crashed, timeout, skipped ...).
OUTCOMES = ("passed", "failed", "error", "ref_error", "xfailed", "xpassed", "not_exercised")
TEXT_LIMIT = 2048          # error_message / traceback excerpt in to_dict()
_MESSAGE_KEEP = 65536      # message kept for matching expects_error


# ------------------------------------------------------------------------------------ errors

def _qualname(cls: type) -> str:
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class ErrorInfo:
    """An exception reduced to text (no frames, no tensors kept alive)."""

    phase: str          # resolve | materialize | reference | reference_hi | compile | exec
    type: str           # qualified class name: RuntimeError, torch._dynamo.exc.Unsupported ...
    message: str        # str(exc), plus the messages of its causes that it does not already hold
    traceback: str      # the last TEXT_LIMIT characters of the formatted traceback
    types: tuple = ()   # class names (short and qualified) over the MRO of the exception and its causes

    @classmethod
    def from_exception(cls, exc: BaseException, phase: str) -> "ErrorInfo":
        chain, seen, x = [], set(), exc
        while x is not None and id(x) not in seen:
            chain.append(x)
            seen.add(id(x))
            x = x.__cause__ if x.__cause__ is not None else (None if x.__suppress_context__ else x.__context__)
        names: list[str] = []
        for x in chain:
            for k in type(x).__mro__:
                if k in (object, BaseException):
                    continue
                for n in (k.__name__, _qualname(k)):
                    if n not in names:
                        names.append(n)
        message = str(exc)
        for x in chain[1:]:
            m = str(x)
            if m and m not in message:
                message += f"\n[caused by] {_qualname(type(x))}: {m}"
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if len(tb) > TEXT_LIMIT:
            tb = "…" + tb[-(TEXT_LIMIT - 1):]
        return cls(phase=phase, type=_qualname(type(exc)), message=message[:_MESSAGE_KEEP],
                   traceback=tb, types=tuple(names))

    def matches(self, spec: dict) -> bool:
        """Whether this error is the one ``spec`` (``{"type": ..., "match": ...}``) expects.

        The type matches by class name anywhere in the MRO of the exception or of its causes
        (so ``RuntimeError`` matches a dynamo ``TorchRuntimeError`` wrapping it, and
        ``torch.OutOfMemoryError`` matches by its last component); ``match`` is a substring or
        a regular expression searched in the message.
        """
        want = str(spec.get("type") or "Exception")
        short = want.rsplit(".", 1)[-1]
        if want not in self.types and short not in self.types:
            return False
        pattern = spec.get("match")
        if not pattern:
            return True
        if pattern in self.message:
            return True
        try:
            return re.search(pattern, self.message) is not None
        except re.error:
            return False

    def to_dict(self) -> dict:
        msg = self.message if len(self.message) <= TEXT_LIMIT else self.message[:TEXT_LIMIT - 1] + "…"
        return {"error_phase": self.phase, "error_type": self.type, "error_message": msg,
                "traceback": self.traceback}


# ------------------------------------------------------------------------------------ execution

@dataclass
class Execution:
    """One run of one case. ``reference``/``target``/``reference_hi`` are CPU results:
    ``{"output": ..., "args[0]": ...}`` (the output plus each written argument)."""

    op: str
    signature: str | None
    device: str
    backend: str
    compare_mode: str = "values"                 # "values" | "metadata"
    reference_dtype: str | None = None
    mutated: list = field(default_factory=list)  # keys of written arguments that are compared
    reference: Any = None
    target: Any = None
    reference_hi: Any = None
    reference_mag: Any = None                    # accumulating ops: the hi call on |inputs| (ULP scale)
    ref_error: ErrorInfo | None = None
    target_error: ErrorInfo | None = None
    ref_hi_error: ErrorInfo | None = None
    t_setup: float | None = None                 # generating inputs (seconds)
    t_ref: float | None = None
    t_ref_hi: float | None = None
    t_compile: float | None = None               # first compiled call (compile + run)
    t_exec: float | None = None                  # a call of the ready target (eager: its only call)
    deterministic: bool | None = None            # None: not checked
    determinism_detail: str | None = None
    stage: str | None = None                     # where the target failed (see STAGES)
    backend_calls: int | None = None             # compiled targets: graphs the backend was given
    graph_ops: list = field(default_factory=list)  # ... the operations in them
    lowering: dict | None = None                 # inductor: generated kernels, extern kernels, ATen fallbacks
    exercised: bool = True                       # False: the target never computed the op (see not_exercised)
    not_exercised: str | None = None
    notes: dict = field(default_factory=dict)    # what the backend noted (casedb.mutation.mutants: whether it mutated)
    value_free: bool = False                     # the output cannot depend on input values (factories, *_like)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def dtypes(self) -> list[str]:
        """Dtype names of the reference's compared parts (tensors, and float64 for Python floats)."""
        found: list[str] = []
        _dtypes(self.reference, found)
        return found

    def comparison(self, rtol: float = 0.0, atol: float = 0.0, *, tolerances: dict | None = None,
                   judge: str = "tolerance") -> Comparison | None:
        """Reference vs target (cached): ``judge`` "tolerance" (rtol/atol, per dtype in
        ``tolerances``) or "ulp" (against the high-precision reference; parts without one are
        judged by tolerance); None when either result is missing."""
        if self.reference is None or self.target is None:
            return None
        tolerances = {k: tuple(v) for k, v in (tolerances or {}).items()}
        mode = self.compare_mode
        if mode == "values" and judge == "ulp" and self.reference_hi is not None:
            mode = "ulp"
        key = ("main", mode, rtol, atol, tuple(sorted(tolerances.items())))
        if key not in self._cache:
            self._cache[key] = compare(self.reference, self.target, rtol=rtol, atol=atol, mode=mode,
                                       tolerances=tolerances, hi=self.reference_hi if mode == "ulp" else None,
                                       hi_mag=self.reference_mag if mode == "ulp" else None,
                                       ulp_k=numerics.ULP_K, ulp_floor=numerics.ULP_FLOOR)
        return self._cache[key]

    def vacuous(self, tolerances: dict) -> str | None:
        """Why a trivial target would match the reference, or None: "zero" (all zeros within each
        dtype's tolerance), "constant" (one value repeated, 8 elements or more), "constant op"
        (either, from an op whose output never depends on input values: factories, ``*_like``)."""
        if self.reference is None or self.compare_mode != "values":
            return None
        parts: list = []
        _tensors(self.reference, parts)
        if not parts:
            return None
        kinds = {_constant_kind(t, tolerances.get(_dtype_name(t.dtype), (0.0, 0.0))) for t in parts}
        kind = "zero" if kinds == {"zero"} else "constant" if kinds <= {"zero", "constant"} else None
        return "constant op" if kind and self.value_free else kind

    def comparisons_hi(self, tolerances: dict) -> tuple[Comparison | None, Comparison | None]:
        """(target vs upcast reference, reference vs upcast reference), values mode only."""
        if self.reference_hi is None or self.compare_mode != "values":
            return None, None
        key = ("hi", tuple(sorted((k, tuple(v)) for k, v in tolerances.items())))
        if key not in self._cache:
            tgt = None if self.target is None else compare(
                self.reference_hi, self.target, tolerances=tolerances, check_dtype=False)
            ref = None if self.reference is None else compare(
                self.reference_hi, self.reference, tolerances=tolerances, check_dtype=False)
            self._cache[key] = (tgt, ref)
        return self._cache[key]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "op", "signature", "device", "backend", "compare_mode", "reference_dtype", "t_setup",
            "t_ref", "t_ref_hi", "t_compile", "t_exec", "deterministic", "determinism_detail", "stage",
            "backend_calls", "graph_ops", "lowering", "exercised", "not_exercised", "notes")}
        d["mutated"] = list(self.mutated)
        for name in ("ref_error", "target_error", "ref_hi_error"):
            e = getattr(self, name)
            d[name] = e.to_dict() if e is not None else None
        return d


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _dtypes(x, found: list) -> None:
    for leaf in result_leaves(x):
        name = (_dtype_name(leaf.dtype) if isinstance(leaf, torch.Tensor)
                else "float64" if isinstance(leaf, float) else None)
        if name is not None and name not in found:
            found.append(name)


def _tensors(x, found: list) -> None:
    found += [t for t in result_leaves(x) if isinstance(t, torch.Tensor) and t.numel() and t.layout == torch.strided]


def _constant_kind(t: torch.Tensor, tol) -> str | None:
    rtol, atol = tol
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    if t.dtype.is_floating_point:
        zero = constant = True
        c = None
        for (x,) in flat_chunks(t):  # float64 of a whole 890M-element output would take 14 GiB more
            v = x.to(torch.float64)
            if not bool(torch.isfinite(v).all()):
                return None
            c = v[0] if c is None else c
            zero = zero and bool((v.abs() <= atol).all())
            constant = constant and bool(((v - c).abs() <= atol + rtol * c.abs()).all())
            if not (zero or constant):
                return None
        if zero:
            return "zero"
        return "constant" if t.numel() >= 8 and constant else None
    flat = t.reshape(-1)
    if not bool((flat == flat[0]).all()):
        return None
    return "zero" if not bool(flat[0]) else ("constant" if t.numel() >= 8 else None)


_VALUE_FREE = re.compile(r"(^|\.)(zeros|ones|full|empty|rand|randn|randint)_like$|(^|\.)new_(zeros|ones|full|empty)$")


@functools.lru_cache(maxsize=1)
def _registered_backends() -> frozenset:
    with warnings.catch_warnings():  # listing imports every backend module (torch.jit deprecations)
        warnings.simplefilter("ignore")
        return frozenset(torch._dynamo.list_backends(exclude_tags=()))


def check_backend(backend) -> None:
    """Raise ValueError unless ``backend`` is ``"eager"``, a registered dynamo backend or a callable."""
    if backend == "eager" or callable(backend):
        return
    if backend not in _registered_backends():
        _registered_backends.cache_clear()
        known = _registered_backends()
        if backend not in known:
            raise ValueError(f"unknown compile backend {backend!r}: use 'eager' (no compile) or a registered "
                             f"dynamo backend: {', '.join(sorted(known))}")


def _sync(dev: torch.device) -> None:
    if dev.type != "cpu":
        sync = getattr(getattr(torch, dev.type, None), "synchronize", None)
        if sync is not None:
            sync()


_interrupted = False


def watch_interrupts() -> None:
    """Tell a user's Ctrl-C apart from an op that raises KeyboardInterrupt: only the first stops
    a run (a SIGINT handler notes it, then does what the previous handler did)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "casedb", False) or previous in (signal.SIG_IGN, None):
        return

    def on_sigint(signum, frame):
        global _interrupted
        _interrupted = True
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    on_sigint.casedb = True
    signal.signal(signal.SIGINT, on_sigint)


def is_case_outcome(e: BaseException) -> bool:
    """Whatever a case raises is its outcome (SystemExit, KeyboardInterrupt too), except the
    KeyboardInterrupt of a real Ctrl-C."""
    return not (isinstance(e, KeyboardInterrupt) and _interrupted)


def _call(fn, args, kwargs, dev):
    """(ok, output or exception, seconds)."""
    _sync(dev)
    t = perf_counter()
    try:
        out = fn(*args, **kwargs)
        _sync(dev)
    except BaseException as e:  # any failure of the op is a result, not a crash of the runner
        if not is_case_outcome(e):
            raise
        return False, e, perf_counter() - t
    _leave_contexts(out)
    return True, out, perf_counter() - t


def _leave_contexts(out) -> None:
    """An op that enters a context (torch.amp's _enter_autocast) returns it entered: leave it,
    or autocast would stay on for every later case in this process."""
    unmanaged = getattr(torch.amp.autocast_mode, "_UnmanagedAutocast", None)
    parts = out if isinstance(out, (list, tuple)) else [out]
    for x in parts:
        if unmanaged is not None and isinstance(x, unmanaged):
            torch.amp.autocast_mode._exit_autocast(x)


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x if x.device.type == "cpu" else x.detach().to("cpu")
    if isinstance(x, (list, tuple)):
        items = [_to_cpu(i) for i in x]
        if type(x) in (list, tuple):
            return type(x)(items)
        for build in (lambda: type(x)(items), lambda: type(x)(*items)):  # structseq, namedtuple
            try:
                return build()
            except TypeError:
                continue
        return tuple(items)
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    return x


def _watch(args, kwargs) -> list:
    out = []
    for i, a in enumerate(args):
        _watch_one(f"args[{i}]", a, out)
    for k, a in kwargs.items():
        _watch_one(f"kwargs[{k}]", a, out)
    return out


def _watch_one(key, a, out):
    if isinstance(a, torch.Tensor):
        out.append((key, a, a._version))
    elif isinstance(a, (list, tuple)):
        for t in a:
            if isinstance(t, torch.Tensor):
                out.append((key, t, t._version))


def _result(out, keys, args, kwargs, to_cpu: bool) -> dict:
    res = {"output": out}
    for k in keys:
        res[k] = get_arg(args, kwargs, k)
    return _to_cpu(res) if to_cpu else res


_notes: dict = {}


def note(key: str, value) -> None:
    """For a backend: record something about the current target call (kept in Execution.notes)."""
    _notes[key] = value


class _Probe:
    """Wraps the dynamo backend: what it was given (graphs, their operations), whether it
    compiled, and for inductor what it generated; the raw material of exercised, lowering and
    the failure stage."""

    def __init__(self, backend):
        self.backend = backend
        # dynamo names the backend in its errors: the backend's own name, not this wrapper's
        self.__name__ = backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
        self.calls = 0
        self.compiled = 0
        self.failed = False
        self.ops: list[str] = []
        self.code: list[str] = []

    def __repr__(self) -> str:
        return self.__name__

    def __call__(self, gm, example_inputs):
        self.calls += 1
        for n in gm.graph.nodes:
            if n.op in ("call_function", "call_method", "call_module"):
                self.ops.append(_node_label(n))
        real = self.backend if callable(self.backend) else torch._dynamo.lookup_backend(self.backend)
        try:
            with _inductor_code(self.code) if self.backend == "inductor" else contextlib.nullcontext():
                fn = real(gm, example_inputs)
        except BaseException:
            self.failed = True
            raise
        self.compiled += 1
        return fn


def _node_label(n) -> str:
    t = n.target
    if isinstance(t, str):
        return t
    return getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)


@contextlib.contextmanager
def _inductor_code(sink: list):
    """Collect the output code inductor writes for a graph (also on a cache hit)."""
    try:
        from torch._inductor.graph import GraphLowering
    except Exception:  # an inductor-less build: nothing to classify
        yield
        return
    original = GraphLowering.save_output_code

    def save(code: str) -> None:
        sink.append(code)
        if callable(original):
            original(code)

    GraphLowering.save_output_code = staticmethod(save)
    try:
        yield
    finally:
        GraphLowering.save_output_code = original


_KERNEL = re.compile(r"^\s*(?:\w+\s*=\s*)?(cpp_fused_\w+|triton_\w+)(?:\.run)?\(", re.M)
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_FALLBACK = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)(?:\.\w+)?\(")


def classify_lowering(code: list[str]) -> dict | None:
    """What inductor made of a graph, from its output code: generated kernels, extern kernels
    (mm, bmm, convolution libraries) and ATen fallbacks; ``kind`` is generated, extern,
    fallback, mixed or none (views and copies only)."""
    if not code:
        return None
    text = "\n".join(code)
    body = text[text.find("def call("):] if "def call(" in text else text
    kernels = sorted(set(_KERNEL.findall(body)))
    extern = sorted(set(_EXTERN.findall(body)))
    fallback = sorted({f"{ns}.{op}" for ns, op in _FALLBACK.findall(body)})
    present = [k for k, v in (("generated", kernels), ("extern", extern), ("fallback", fallback)) if v]
    kind = present[0] if len(present) == 1 else ("mixed" if present else "none")
    return {"kind": kind, "kernels": len(kernels), "extern": extern, "fallback": fallback}


def _compile(fn, backend):
    def run_op(*args, **kwargs):
        return fn(*args, **kwargs)

    torch._dynamo.reset()
    probe = _Probe(backend)
    return torch.compile(run_op, backend=probe, fullgraph=True, dynamic=False), probe


def run_case(case: dict, *, device: "str | torch.device" = "cpu", backend: "str | Callable" = "eager",
             load_blob: Callable[[str], bytes] | None = None, reference_dtype: "str | None" = None,
             check_determinism: bool = False, replace_device: bool = True,
             high_precision: bool = False) -> Execution:
    """Run ``case`` on the CPU reference and on ``device``/``backend``; see the module docstring.

    ``replace_device=False``: device strings recorded in the case (``cuda:0``) reach the target
    as written (the reference always gets ``cpu``). ``high_precision``: also run the upcast
    reference the ULP judge needs, in float32 for outputs of 16 bits or less and float64 otherwise
    (``reference_dtype`` names its dtype instead).

    Problems of the case itself (unknown op, inputs that cannot be built) come back as
    ``ref_error`` (phase ``resolve``/``materialize``); a bad ``device``, ``backend`` or
    ``reference_dtype`` raises ValueError/RuntimeError (they concern the whole run).
    """
    dev = torch.device(device)
    check_backend(backend)
    hi_dtype = None if reference_dtype is None else torch_dtype(dtypes.reference_dtype(reference_dtype))
    ex = Execution(op=case.get("op"), signature=case.get("signature"), device=str(dev),
                   backend=backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend)),
                   reference_dtype=None if hi_dtype is None else str(hi_dtype).replace("torch.", ""))
    t0 = perf_counter()
    try:
        info = op_info(case.get("op"))
    except UnknownOpError as e:
        ex.ref_error = ErrorInfo.from_exception(e, "resolve")
        return ex
    try:
        prepared = prepare(case, load_blob=load_blob)
    except Exception as e:  # bad spec, missing blob, torch refusing a dtype ...
        ex.ref_error = ErrorInfo.from_exception(e, "materialize")
        return ex
    meta = info.metadata_only(prepared.args, prepared.kwargs)
    keys = info.mutated(prepared.args, prepared.kwargs)
    ex.value_free = not prepared.leaves or bool(_VALUE_FREE.search(str(case.get("op"))))
    writes = bool(keys)
    ex.compare_mode = "metadata" if meta else "values"
    ex.t_setup = perf_counter() - t0
    cpu = torch.device("cpu")

    with torch.no_grad():
        # ---- reference: CPU eager
        try:
            ref_args, ref_kwargs = prepared.place(cpu, fresh=writes)
        except Exception as e:  # a preset that does not fit the tensor
            ex.ref_error = ErrorInfo.from_exception(e, "materialize")
            return ex
        watch = None if writes else _watch(ref_args, ref_kwargs)
        base_versions = None if writes else prepared.versions()
        ok, out, ex.t_ref = _call(info.fn, ref_args, ref_kwargs, cpu)
        if watch:
            for key, t, v in watch:
                if t._version != v and key not in keys:
                    keys.append(key)
        if ok:
            ex.reference = _result(out, keys, ref_args, ref_kwargs, to_cpu=False)
        else:
            ex.ref_error = ErrorInfo.from_exception(out, "reference")
        del out
        if not writes and keys:
            # an op not known to write into its inputs did: give the target untouched inputs
            writes = True
            if prepared.versions() != base_versions:
                prepared = prepare(case, load_blob=load_blob)
        ex.mutated = list(keys)

        # ---- upcast reference
        if hi_dtype is None and high_precision and ex.reference is not None and ex.compare_mode == "values":
            floats = [d for d in ex.dtypes() if d in dtypes.FLOATING and d != "float64"]
            if floats:
                hi_dtype = torch_dtype(numerics.high_precision(floats))
                need = sum(leaf.base.numel() * hi_dtype.itemsize for leaf in prepared.leaves
                           if leaf.base.is_floating_point())
                if need > numerics.HI_REFERENCE_BYTES:
                    ex.notes["high_precision"] = (f"skipped: its inputs take {need / 2**20:.0f} MiB in {hi_dtype}, "
                                                  f"over {numerics.HI_REFERENCE_BYTES / 2**20:.0f} MiB")
                    hi_dtype = None
                else:
                    ex.reference_dtype = str(hi_dtype).replace("torch.", "")
        if hi_dtype is not None:
            try:
                a, k = prepared.place(cpu, cast=upcast_caster(hi_dtype), fresh=True)
                ok, out, ex.t_ref_hi = _call(info.fn, a, k, cpu)
            except Exception as e:
                ok, out = False, e
            if ok:
                ex.reference_hi = _result(out, keys, a, k, to_cpu=False)
            else:
                ex.ref_hi_error = ErrorInfo.from_exception(out, "reference_hi")
            del out
            if ok and not keys and numerics.accumulates(case["op"]):
                ex.reference_mag = _magnitudes(info.fn, a, k, cpu)

        # ---- target
        _run_target(ex, info, prepared, dev, backend, keys, writes, meta, check_determinism,
                    shared=(ref_args, ref_kwargs) if dev.type == "cpu" and not writes and replace_device else None,
                    replace_device=replace_device)
    return ex


def _magnitudes(fn, args, kwargs, cpu) -> Any:
    """The sum of the terms' magnitudes of each output element of an accumulating op: the same
    call on ``|inputs|`` (the upcast ones); None when that call fails."""
    from torch.utils import _pytree

    def absolute(t):
        return t.abs() if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) else t

    a, k = _pytree.tree_map(absolute, (args, kwargs))
    ok, out, _ = _call(fn, a, k, cpu)
    return {"output": out} if ok else None


def _run_target(ex: Execution, info, prepared: Prepared, dev, backend, keys, writes, meta,
                check_determinism, shared, replace_device=True):
    compiled = backend != "eager"

    def args_for_call():
        if shared is not None:
            return shared
        return prepared.place(dev, fresh=writes, replace_device=replace_device)

    try:
        args, kwargs = args_for_call()
    except Exception as e:  # moving / laying out on the device failed
        ex.target_error = ErrorInfo.from_exception(e, "materialize")
        ex.stage = "input build"
        return
    probe = None
    try:
        fn, probe = _compile(info.fn, backend) if compiled else (info.fn, None)
    except BaseException as e:
        if not is_case_outcome(e):
            raise
        ex.target_error = ErrorInfo.from_exception(e, "compile")
        ex.stage = "compile: dynamo trace"
        return
    _notes.clear()
    ok, out, t1 = _call(fn, args, kwargs, dev)
    ex.notes.update(_notes)
    if probe is not None:
        ex.backend_calls, ex.graph_ops = probe.calls, list(probe.ops)
        ex.lowering = classify_lowering(probe.code)
    if not ok:
        ex.target_error = ErrorInfo.from_exception(out, "compile" if compiled else "exec")
        ex.stage = _failure_stage(ex.target_error, probe)
        return
    if compiled:
        ex.t_compile = t1
    else:
        ex.t_exec = t1
    _check_exercised(ex, probe, out, dev)
    ex.target = _result(out, keys, args, kwargs, to_cpu=True)
    del out
    if not (compiled or check_determinism):
        return
    if writes:
        try:
            args, kwargs = args_for_call()
        except Exception as e:
            ex.target_error = ErrorInfo.from_exception(e, "materialize")
            return
    ok, out2, t2 = _call(fn, args, kwargs, dev)
    if not ok:
        ex.target_error = ErrorInfo.from_exception(out2, "exec")
        ex.stage = "runtime"
        return
    if compiled:
        ex.t_exec = t2
    if check_determinism and not meta:
        second = _result(out2, keys, args, kwargs, to_cpu=True)
        c = compare(ex.target, second, mode="bits")
        ex.deterministic = c.passed
        ex.determinism_detail = None if c.passed else f"two target runs differ: {c.reason}"


STAGES = outcomes.STAGES


def _failure_stage(err: ErrorInfo, probe: "_Probe | None") -> str:
    """The stage of a target error: dynamo's trace (before the backend got a graph), inductor's
    lowering or the backend's compiler (while it compiled), or the compiled code at run time."""
    if probe is None:
        return "runtime"
    if probe.failed:
        lowering = any(n in err.types for n in ("LoweringException", "MissingOperatorWithoutDecomp",
                                                "MissingOperatorWithDecomp"))
        return "compile: lowering" if lowering else "compile: backend compiler"
    if probe.compiled == 0:
        return "compile: dynamo trace"
    return "runtime"


def _devices(x, found: set) -> None:
    found.update(t.device.type for t in result_leaves(x) if isinstance(t, torch.Tensor))


def _check_exercised(ex: Execution, probe: "_Probe | None", out, dev: torch.device) -> None:
    """A target that never computed the op proves nothing: the backend was not called, got a
    graph without an operation, or left the output off the target device."""
    why = None
    if probe is not None and probe.calls == 0:
        why = "the backend was never called: dynamo ran the call without compiling a graph"
    elif probe is not None and not probe.ops:
        why = "the backend got a graph without an operation (constant-folded or a no-op)"
    else:
        found: set = set()
        _devices(out, found)
        # some ops return CPU bookkeeping beside device results (flash attention's RNG state)
        if dev.type != "cpu" and found and dev.type not in found:
            why = f"the output is on {', '.join(sorted(found))}, not on the target device {dev.type}"
    if why:
        ex.exercised, ex.not_exercised = False, why


# ------------------------------------------------------------------------------------ judging

@dataclass
class Verdict:
    outcome: str                                 # one of OUTCOMES
    reason: str
    compare_mode: str
    rtol: float
    atol: float
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatch_count: int | None = None
    numel: int | None = None
    nan_inf_mismatch: bool | None = None
    where: str | None = None
    max_abs_err_hi: float | None = None          # target vs upcast reference
    max_rel_err_hi: float | None = None
    ref_max_abs_err_hi: float | None = None      # CPU reference vs upcast reference
    ref_max_rel_err_hi: float | None = None
    deterministic: bool | None = None
    t_ref: float | None = None
    t_compile: float | None = None
    t_exec: float | None = None
    error_phase: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    judge: str | None = None                     # tolerance | ulp | both
    tolerance: str | None = None                 # where the output's tolerance came from
    tolerances: dict | None = None               # dtype -> [rtol, atol, source]
    ulp_err: float | None = None                 # the target's error in ULPs (judge ulp/both)
    ref_ulp_err: float | None = None             # the CPU reference's own error in ULPs
    vacuous: str | None = None                   # "zero" / "constant": the reference cannot catch a bug
    bias_mean: float | None = None               # the target's mean signed error in ULPs (casedb.judge.bias)
    bias_toward: float | None = None             # ... toward the reference's magnitude (truncation: -0.5)
    bias_count: int | None = None                # ... over this many elements
    stage: str | None = None                     # where it failed (STAGES), for a result that is not a pass

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def _expectations(expects_error: dict | None, device: str) -> tuple[dict | None, dict | None]:
    """(reference spec, target spec) from ``{"type", "match"}`` or ``{"ref": ..., "<device>": ...}``."""
    if not expects_error:
        return None, None
    if "type" in expects_error:
        return expects_error, expects_error
    dev = torch.device(device)
    tgt = expects_error.get(str(dev)) or expects_error.get(dev.type) or expects_error.get("target")
    return expects_error.get("ref"), tgt


def _describe_spec(spec: dict) -> str:
    m = spec.get("match")
    return f"{spec.get('type')}" + (f" matching {m!r}" if m else "")


def _short(msg: str, n: int = 300) -> str:
    """The start of a message on one line (lines joined with ' | ')."""
    msg = " | ".join(line.strip() for line in msg.strip().splitlines() if line.strip())
    return msg if len(msg) <= n else msg[: n - 1] + "…"


def judge(execution: Execution, *, rtol: float | None = None, atol: float | None = None,
          tolerances: dict | None = None, judge: str = "tolerance", expects_error: dict | None = None,
          xfail: str | None = None) -> Verdict:
    """The verdict for one model occurrence of an executed case.

    ``tolerances``: dtype name -> :class:`casedb.judge.numerics.Tolerance` (or ``(rtol, atol)``) for
    each compared dtype (:meth:`casedb.judge.numerics.Policy.tolerances`); ``rtol``/``atol`` instead
    give every part the same. ``judge``: "tolerance", "ulp" or "both" (see casedb.judge.numerics).
    ``expects_error``: ``{"type", "match"}`` — the target must raise it (the reference may raise
    it too), else ``xpassed``; or ``{"ref": {...}, "<device type or device>": {...}}`` per side.
    ``xfail``: the occurrence is expected to fail (reason text): failed/error become ``xfailed``
    and passed becomes ``xpassed``. A target that never computed the op is ``not_exercised``,
    never ``passed``.
    """
    ex = execution
    if judge not in numerics.JUDGES:
        raise ValueError(f"judge must be one of {', '.join(numerics.JUDGES)}, not {judge!r}")
    def given(r, a) -> numerics.Tolerance:  # the caller's: never overruled
        return numerics.Tolerance(float(r or 0.0), float(a or 0.0), "given", explicit=True)

    tols = {d: (t if isinstance(t, numerics.Tolerance) else given(*t)) for d, t in (tolerances or {}).items()}
    if rtol is not None or atol is not None:
        for d in ex.dtypes() or ["float32"]:
            tols.setdefault(d, given(rtol, atol))
    pairs = {d: (t.rtol, t.atol) for d, t in tols.items()}
    main = tols.get((ex.dtypes() or [None])[0]) or next(iter(tols.values()), None)
    if judge != "tolerance" and main is not None and main.explicit:
        judge = "tolerance"  # a tolerance written down for the case is never overruled
    v = Verdict(outcome="passed", reason="", compare_mode=ex.compare_mode,
                rtol=main.rtol if main else float(rtol or 0.0), atol=main.atol if main else float(atol or 0.0),
                deterministic=ex.deterministic, t_ref=ex.t_ref, t_compile=ex.t_compile, t_exec=ex.t_exec,
                judge=judge, tolerance=main.source if main else None,
                tolerances={d: [t.rtol, t.atol, t.source] for d, t in tols.items()} or None,
                vacuous=ex.vacuous(pairs))
    ref_spec, tgt_spec = _expectations(expects_error, ex.device)
    ref_expected = False

    def error_fields(err: ErrorInfo):
        d = err.to_dict()
        v.error_phase, v.error_type, v.error_message, v.traceback = (
            d["error_phase"], d["error_type"], d["error_message"], d["traceback"])

    def compared() -> Comparison | None:
        """The comparison this judge decides by (for "both": the first that fails)."""
        values = ex.comparison(tolerances=pairs)
        if values is None:
            return None
        v.max_abs_err, v.max_rel_err, v.mismatch_count = values.max_abs_err, values.max_rel_err, values.mismatch_count
        v.numel, v.nan_inf_mismatch, v.where = values.numel, values.nan_inf_mismatch, values.where
        hi, ref_hi = ex.comparisons_hi(pairs)
        if hi is not None:
            v.max_abs_err_hi, v.max_rel_err_hi = hi.max_abs_err, hi.max_rel_err
        if ref_hi is not None:
            v.ref_max_abs_err_hi, v.ref_max_rel_err_hi = ref_hi.max_abs_err, ref_hi.max_rel_err
        if judge == "tolerance":
            return values
        ulp = ex.comparison(tolerances=pairs, judge="ulp")
        v.ulp_err, v.ref_ulp_err = ulp.ulp_err, ulp.ref_ulp_err
        if judge == "ulp" or ulp.ulp_err is None:
            return ulp if judge == "ulp" else values
        # both: the first that fails decides; a pass says what both found
        if not values.passed:
            return values
        if not ulp.passed:
            return ulp
        return Comparison(passed=True, reason=f"{values.reason}; {ulp.reason}", mode="both",
                          comparable=values.comparable, opaque=values.opaque)

    err = ex.ref_error
    if err is not None:
        if err.phase not in ("resolve", "materialize") and ref_spec and err.matches(ref_spec):
            ref_expected = True
        else:
            v.outcome = "ref_error"
            what = {"resolve": "the op cannot be resolved", "materialize": "the inputs cannot be built"}.get(
                err.phase, "the CPU reference raised")
            v.reason = f"{what}: {err.type}: {_short(err.message)}"
            if ref_spec:
                v.reason += f" (expected {_describe_spec(ref_spec)})"
            v.stage = {"resolve": "resolve", "materialize": "input build"}.get(err.phase, "reference")
            error_fields(err)
            return v

    if tgt_spec:
        terr = ex.target_error
        if terr is not None:
            error_fields(terr)
            if terr.matches(tgt_spec):
                v.outcome = "xfailed"
                v.reason = f"raised the expected {terr.type}: {_short(terr.message)}"
            else:
                v.outcome = "error"
                v.reason = (f"expected {_describe_spec(tgt_spec)}, but {terr.phase} raised "
                            f"{terr.type}: {_short(terr.message)}")
                v.stage = ex.stage
        else:
            v.outcome = "xpassed"
            c = compared()
            tail = "" if c is None else (" (its result matches the reference)" if c.passed
                                         else f" (and its result differs: {c.reason})")
            v.reason = f"expected {_describe_spec(tgt_spec)}, but the target did not raise{tail}"
    elif ex.target_error is not None:
        terr = ex.target_error
        v.outcome = "error"
        v.reason = f"{terr.phase}: {terr.type}: {_short(terr.message)}"
        v.stage = ex.stage
        error_fields(terr)
    elif ref_expected:
        if ex.reference_hi is not None and ex.target is not None:
            # the upcast reference's parts are float32/float64: the output dtype's tolerance applies
            c = compare(ex.reference_hi, ex.target, rtol=v.rtol, atol=v.atol, mode=ex.compare_mode, check_dtype=False)
            v.max_abs_err, v.max_rel_err, v.mismatch_count = c.max_abs_err, c.max_rel_err, c.mismatch_count
            v.outcome = "passed" if c.passed else "failed"
            v.reason = f"against the {ex.reference_dtype} reference (the CPU reference raised as expected): {c.reason}"
        else:
            v.outcome = "ref_error"
            v.reason = (f"the CPU reference raised the expected {ex.ref_error.type}, so there is nothing to "
                        f"compare the target with (give a reference_dtype to compare against an upcast reference)")
            v.stage = "reference"
            error_fields(ex.ref_error)
    else:
        c = compared()
        if c is not None and judge != "tolerance":
            c = bias.decide(ex, v, c)
        if c is None:
            v.outcome, v.reason = "error", "no result to compare"
        elif not c.comparable:  # nothing but opaque objects: no difference seen, nothing verified
            v.outcome, v.reason, v.stage = "not_exercised", c.reason, "not exercised"
        elif not c.passed:
            v.outcome, v.reason, v.stage = "failed", c.reason, "incorrect result"
        elif ex.deterministic is False:
            v.outcome, v.reason, v.stage = "failed", f"nondeterministic: {ex.determinism_detail}", "incorrect result"
        elif not ex.exercised:
            v.outcome, v.reason, v.stage = "not_exercised", f"not exercised: {ex.not_exercised}", "not exercised"
        else:
            v.outcome, v.reason = "passed", c.reason

    if xfail and v.outcome in ("passed", "failed", "error"):
        if v.outcome == "passed":
            v.outcome, v.reason = "xpassed", f"expected to fail ({xfail}) but passed"
        else:
            v.outcome, v.reason = "xfailed", f"{xfail}: {v.reason}"
    return v
