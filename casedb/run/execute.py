"""Run one case: the execution core shared by ``casedb run`` and the pytest plugin.

:func:`run_case` executes a normalized case once — the reference on the CPU in eager mode, the
target on ``device`` with ``backend`` (``"eager"``: no compile; otherwise any registered dynamo
backend, compiled with ``fullgraph=True, dynamic=False`` after ``torch._dynamo.reset()``, see
:mod:`casedb.run.backend`) — and returns an :class:`~casedb.judge.execution.Execution` that keeps
the results as CPU tensors, for :func:`casedb.judge.verdict.judge` to judge once per model
occurrence.

What is compared: the op's output, plus every argument the op writes into (in-place ops,
``out=``, ``inplace=True``, and any input whose version counter moved during the reference
call). Ops with random or uninitialized output are compared on metadata only (shape, dtype,
strides).

No database access here; tensors are built by :mod:`casedb.cases.materialize`, ops resolved by
:mod:`casedb.cases.ops`, results compared by :mod:`casedb.judge.compare`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from time import perf_counter
from typing import Callable

import torch

from casedb.cases import dtypes
from casedb.cases.materialize import Prepared, prepare, result_leaves, torch_dtype, upcast_caster, widen_dtype_keyword
from casedb.cases.ops import OpInfo, UnknownOpError, get_arg, op_info
from casedb.judge import accumulation, bias, numerics, ties
from casedb.judge.compare import compare
from casedb.judge.execution import ErrorInfo, Execution
from casedb.judge.nonfinite import nan_inf_differ
from casedb.run import refcache
from casedb.run.backend import Probe, check_backend, classify_lowering, compile_op, failure_stage, op_wrapper
from casedb.run.calls import _call, _to_cpu, _watch, is_case_outcome, watch_interrupts  # noqa: F401 (re-exported)
from casedb.run.refcache import ReferenceCache

_VALUE_FREE = re.compile(r"(^|\.)(zeros|ones|full|empty|rand|randn|randint)_like$|(^|\.)new_(zeros|ones|full|empty)$")


def _result(out, keys, args, kwargs, to_cpu: bool, op: str | None = None) -> dict:
    """The output and the written arguments; ``to_cpu``: copied to the CPU first, so that nothing
    of the judgement (the ties' order included) runs on the target."""
    res = {k: get_arg(args, kwargs, k) for k in keys}
    if to_cpu:
        out, res = _to_cpu(out), _to_cpu(res)
        args = (_to_cpu(args[0]), *args[1:]) if args else args  # ties.canonical reads the input
    return {"output": ties.canonical(op, out, args, kwargs), **res}


_notes: dict = {}


def note(key: str, value) -> None:
    """For a backend: record something about the current target call (kept in Execution.notes)."""
    _notes[key] = value


@dataclass
class _Setup:
    """What running a case needs once its op is resolved and its inputs are built."""

    info: OpInfo
    prepared: Prepared
    keys: list          # written arguments that are compared beside the output ("args[0]", "kwargs[out]")
    writes: bool        # the op writes into its inputs: every call gets fresh ones
    meta: bool          # random or uninitialized output: compared on metadata only
    rebuild: Callable[[], Prepared]  # the inputs again, untouched (after an op wrote into them)


def run_case(case: dict, *, device: "str | torch.device" = "cpu", backend: "str | Callable" = "eager",
             load_blob: Callable[[str], bytes] | None = None, reference_dtype: "str | None" = None,
             check_determinism: bool = False, replace_device: bool = True,
             high_precision: "bool | str" = False, reference_cache: "ReferenceCache | None | bool" = None) -> Execution:
    """Run ``case`` on the CPU reference and on ``device``/``backend``; see the module docstring.

    ``replace_device=False``: device strings recorded in the case (``cuda:0``) reach the target
    as written (the reference always gets ``cpu``). ``high_precision``: also run the upcast
    reference the ULP judge needs, in float32 for outputs of 16 bits or less and float64 otherwise
    (``reference_dtype`` names its dtype instead, and is always run); ``high_precision="needed"``:
    only where a judge can use it — not when the target's result is bit-identical to the
    reference, which every judge passes (tolerance, ULPs: the same error as the reference's own;
    bias: no difference from the reference's own). ``reference_cache``: where cached references
    come from and go to (:mod:`casedb.run.refcache`; None: the one :func:`use_reference_cache`
    set, False: none), and the inputs of cases that are expensive to build (casedb.run.inputcache).

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
    cache = _reference_cache if reference_cache is None else (reference_cache or None)
    setup = _set_up(ex, case, load_blob, cache)
    if setup is None:
        return ex
    if setup.meta:
        cache = None  # random or uninitialized output: no reference to keep
    with torch.no_grad():
        ref_inputs = None
        if not _cached_reference(ex, setup, case, cache):
            ref_inputs = _run_reference(ex, setup)
            if ref_inputs is None:
                return ex
            _keep_reference(ex, setup, case, cache)
        shared = ref_inputs if dev.type == "cpu" and not setup.writes and replace_device else None
        versions = setup.prepared.versions()
        _run_target(ex, setup, dev, backend, check_determinism, shared=shared, replace_device=replace_device)
        if hi_dtype is None and high_precision and (high_precision != "needed" or not _decided(ex)):
            hi_dtype = _upcast_dtype(ex, setup.prepared)
        widen = hi_dtype is None and high_precision and ex.ref_error is not None and ex.ref_error.phase == "reference"
        if hi_dtype is not None or widen:
            if setup.prepared.versions() != versions:  # the target wrote into the inputs it shared
                setup.prepared = setup.rebuild()
            if widen:
                _widened_reference(ex, setup)
            else:
                _high_precision(ex, setup, hi_dtype, case, cache)
        elif "high_precision" in ex.notes and ex.reference is not None:
            # too large to upcast: a summing op's error scale at its inputs' own precision
            ex.reference_mag = _error_scale(ex, setup, ex.op, ex.reference.get("output"), None, None)
    return ex


# ------------------------------------------------------------------------------------ the reference cache

_reference_cache = None


def use_reference_cache(cache: "ReferenceCache | None") -> None:
    """The cache every later :func:`run_case` of this process uses unless given one (the worker
    of a run sets it: casedb.run.worker)."""
    global _reference_cache
    _reference_cache = cache


def _decided(ex: Execution) -> bool:
    """Whether the verdict needs no high-precision reference: the target's result is bit-identical
    to the reference's (see run_case)."""
    return (ex.reference is not None and ex.target is not None
            and compare(ex.reference, ex.target, mode="bits").passed)


def _cached_reference(ex: Execution, s: _Setup, case: dict, cache) -> bool:
    """Take the reference from ``cache``; False on a miss (or without a cache)."""
    if cache is None:
        return False
    t0 = perf_counter()
    found = cache.load(refcache.key(case, "reference"))
    if found is None:
        return False
    ex.reference = found["reference"]
    s.keys[:] = found["mutated"]
    s.writes = s.writes or bool(s.keys)
    ex.mutated = list(s.keys)
    ex.t_ref = perf_counter() - t0
    ex.notes["reference_cache"] = "hit"
    return True


def _keep_reference(ex: Execution, s: _Setup, case: dict, cache) -> None:
    if cache is not None and ex.reference is not None:
        cache.store(refcache.key(case, "reference"), {"reference": ex.reference, "mutated": list(s.keys)})


_HI_KEYS = ("reference_hi", "reference_mag", "bias_values", "bias_factor")  # what the upcast reference gives


def _high_precision(ex: Execution, s: _Setup, hi_dtype: torch.dtype, case: dict, cache) -> None:
    """The upcast reference: from ``cache``, else run (and kept there)."""
    name = None if cache is None else refcache.key(case, "hi", str(hi_dtype))
    if name is not None and ex.reference is not None:
        t0 = perf_counter()
        found = cache.load(name)
        if found is not None:
            for key in _HI_KEYS:
                setattr(ex, key, found.get(key))
            ex.t_ref_hi = perf_counter() - t0
            return
    _run_upcast(ex, s, hi_dtype, case["op"])
    if name is not None and ex.reference is not None and ex.reference_hi is not None:
        cache.store(name, {key: getattr(ex, key) for key in _HI_KEYS})


def _prepare(case: dict, load_blob, cache) -> tuple[Prepared, bool]:
    """``(inputs, whether they came from cache)`` (casedb.run.inputcache)."""
    return (prepare(case, load_blob=load_blob), False) if cache is None else cache.prepare_inputs(case, load_blob)


def _set_up(ex: Execution, case: dict, load_blob, cache) -> _Setup | None:
    """Resolve the op and build the inputs; None (with ``ex.ref_error``) when the case cannot."""
    t0 = perf_counter()
    try:
        info = op_info(case.get("op"))
    except UnknownOpError as e:
        ex.ref_error = ErrorInfo.from_exception(e, "resolve")
        return None
    try:
        prepared, hit = _prepare(case, load_blob, cache)
    except Exception as e:  # bad spec, missing blob, torch refusing a dtype ...
        ex.ref_error = ErrorInfo.from_exception(e, "materialize")
        return None
    if hit:
        ex.notes["input_cache"] = "hit"
    meta = info.metadata_only(prepared.args, prepared.kwargs)
    keys = info.mutated(prepared.args, prepared.kwargs)
    ex.value_free = not prepared.leaves or bool(_VALUE_FREE.search(str(case.get("op"))))
    ex.compare_mode = "metadata" if meta else "values"
    ex.t_setup = perf_counter() - t0
    return _Setup(info, prepared, keys, bool(keys), meta, lambda: _prepare(case, load_blob, cache)[0])


def _run_reference(ex: Execution, s: _Setup) -> tuple | None:
    """The CPU eager reference; returns its (args, kwargs), None when they cannot be placed.
    An input the op was not known to write into but did joins ``s.keys``."""
    cpu = torch.device("cpu")
    try:
        ref_args, ref_kwargs = s.prepared.place(cpu, fresh=s.writes)
    except Exception as e:  # a preset that does not fit the tensor
        ex.ref_error = ErrorInfo.from_exception(e, "materialize")
        return None
    watch = None if s.writes else _watch(ref_args, ref_kwargs)
    base_versions = None if s.writes else s.prepared.versions()
    ok, out, ex.t_ref = _call(s.info.fn, ref_args, ref_kwargs, cpu)
    for key, t, v in watch or ():
        if t._version != v and key not in s.keys:
            s.keys.append(key)
    if ok:
        ex.reference = _result(out, s.keys, ref_args, ref_kwargs, to_cpu=False, op=ex.op)
    else:
        ex.ref_error = ErrorInfo.from_exception(out, "reference")
    del out
    if not s.writes and s.keys:
        # an op not known to write into its inputs did: give the target untouched inputs
        s.writes = True
        if s.prepared.versions() != base_versions:
            s.prepared = s.rebuild()
    ex.mutated = list(s.keys)
    return ref_args, ref_kwargs


def _upcast_dtype(ex: Execution, prepared: Prepared) -> torch.dtype | None:
    """The dtype of the upcast reference the ULP judge needs (None: none is needed, or its
    inputs would exceed numerics.HI_REFERENCE_BYTES, noted in ``ex.notes``)."""
    if ex.reference is None or ex.compare_mode != "values":
        return None
    floats = [d for d in ex.dtypes() if d in dtypes.FLOATING and d != "float64"]
    if not floats:
        return None
    hi_dtype = torch_dtype(numerics.high_precision(floats))
    need = sum(leaf.base.numel() * hi_dtype.itemsize for leaf in prepared.leaves if leaf.base.is_floating_point())
    if hi_dtype != torch.float64 and nan_inf_differ(ex.reference, ex.target) and need * 2 <= numerics.HI_REFERENCE_BYTES:
        # whose NaN/inf are right is decided by the upcast reference, and float32 can share the
        # CPU reference's fault (x86 gelu(inf) is NaN in bfloat16 and float32 alike, inf in float64)
        hi_dtype, need = torch.float64, need * 2
        ex.notes["high_precision"] = "float64: the target and the CPU reference differ in where NaN/inf are"
    if need > numerics.HI_REFERENCE_BYTES:
        ex.notes["high_precision"] = (f"skipped: its inputs take {need / 2**20:.0f} MiB in {hi_dtype}, "
                                      f"over {numerics.HI_REFERENCE_BYTES / 2**20:.0f} MiB")
        return None
    ex.reference_dtype = str(hi_dtype).replace("torch.", "")
    return hi_dtype


def _widened_reference(ex: Execution, s: _Setup) -> None:
    """The CPU reference raised (a kernel the CPU lacks for a dtype: ``histc`` of int32, which
    CUDA has): the call on every number widened to float64, what a case that expects that error
    is judged against (casedb.judge.verdict). Integers up to 2^53 are exact in float64."""
    _run_upcast(ex, s, torch.float64, ex.op,
                cast=lambda dt: None if dt in (torch.bool, torch.float64) or dt.is_complex else torch.float64)
    if ex.reference_hi is not None:
        ex.reference_dtype = "float64"


def _run_upcast(ex: Execution, s: _Setup, hi_dtype: torch.dtype, op: str, cast=None) -> None:
    """The reference on inputs upcast to ``hi_dtype`` (``cast``: a caster of casedb.cases.materialize
    instead) and, for a summing op, its error scale."""
    cpu = torch.device("cpu")
    cast = cast or upcast_caster(hi_dtype)
    try:
        a, k = s.prepared.place(cpu, cast=cast, fresh=True)
        k = widen_dtype_keyword(op, k, cast)
        ok, out, ex.t_ref_hi = _call(s.info.fn, a, k, cpu)
    except Exception as e:
        ok, out = False, e
    if ok:
        ex.reference_hi = _result(out, s.keys, a, k, to_cpu=False, op=ex.op)
    else:
        ex.ref_hi_error = ErrorInfo.from_exception(out, "reference_hi")
    del out
    if ok and isinstance(ex.reference_hi, dict):
        hi_out, low = ex.reference_hi.get("output"), ex.reference.get("output") if isinstance(ex.reference, dict) else None
        if isinstance(low, torch.Tensor) and low.is_floating_point():  # what the bias judge reads beside hi
            ex.bias_values = None if s.keys else bias.values_of(a, k, hi_out)  # written inputs hold results
            ex.bias_factor = accumulation.reciprocal_factor(op, a, k, hi_out, low.dtype)
        ex.reference_mag = _error_scale(ex, s, op, hi_out, (a, k), cast)


def _error_scale(ex: Execution, s: _Setup, op: str, out, inputs: tuple | None, cast) -> dict | None:
    """casedb.judge.accumulation's error scale of the output ``out`` (and of each written
    argument, the output of an in-place op) on ``inputs``; when none are given or the op wrote
    into them, on the case's inputs cast with ``cast`` (fresh ones for an op that writes)."""
    low = ex.reference.get("output") if isinstance(ex.reference, dict) else None
    if accumulation.kind(op) is None or not isinstance(out, torch.Tensor) or not isinstance(low, torch.Tensor) \
            or not low.is_floating_point():
        return None
    if s.keys or inputs is None:
        a, k = s.prepared.place(torch.device("cpu"), cast=cast, fresh=bool(s.keys))
        k = k if cast is None else widen_dtype_keyword(op, k, cast)
    else:
        a, k = inputs
    scale = accumulation.error_scale(op, s.info.fn, a, k, out, low.dtype)
    return None if scale is None else {key: scale for key in ("output", *s.keys)}


def _run_target(ex: Execution, s: _Setup, dev: torch.device, backend, check_determinism: bool, *,
                shared: tuple | None, replace_device: bool = True) -> None:
    """The target: compiled (unless eager), called once, and for a compiled target or a
    determinism check once more. ``shared``: the reference's inputs, reused on the CPU."""
    wrapped = op_wrapper(backend, s.info.fn)
    compiled = backend != "eager" and wrapped is None

    def args_for_call():
        if shared is not None:
            return shared
        return s.prepared.place(dev, fresh=s.writes, replace_device=replace_device)

    try:
        args, kwargs = args_for_call()
    except Exception as e:  # moving / laying out on the device failed
        ex.target_error = ErrorInfo.from_exception(e, "materialize")
        ex.stage = "input build"
        return
    try:
        fn, probe = compile_op(s.info.fn, backend) if compiled else (wrapped or s.info.fn, None)
    except BaseException as e:
        if not is_case_outcome(e):
            raise
        ex.target_error = ErrorInfo.from_exception(e, "compile")
        ex.stage = "compile: dynamo trace"
        return
    if not _first_target_call(ex, fn, probe, (args, kwargs), dev, s.keys, compiled):
        return
    if not (compiled or check_determinism):
        return
    if not check_determinism and _result_bytes(ex.target) > SECOND_CALL_MAX_BYTES:
        # its output would be a third copy beside the reference's and the first call's: the
        # granite4h broadcast mul of 4 GiB took the main job to 12.4 GiB for a timing
        ex.notes["second_call"] = (f"skipped: the output takes {_result_bytes(ex.target) / 2**20:.0f} MiB, "
                                   f"over {SECOND_CALL_MAX_BYTES / 2**20:.0f} MiB (t_exec not measured)")
        return
    if s.writes:
        try:
            args, kwargs = args_for_call()
        except Exception as e:
            ex.target_error = ErrorInfo.from_exception(e, "materialize")
            return
    _second_target_call(ex, fn, (args, kwargs), dev, s.keys, compiled, check_determinism and not s.meta)


SECOND_CALL_MAX_BYTES = 2**30  # a compiled target's output larger than this is not made a second time


def _result_bytes(x) -> int:
    """The bytes of the tensors a kept result holds."""
    return sum(t.numel() * t.element_size() for t in result_leaves(x) if isinstance(t, torch.Tensor))


def _first_target_call(ex: Execution, fn, probe: Probe | None, inputs: tuple, dev: torch.device, keys: list,
                       compiled: bool) -> bool:
    """The first call (a compiled target: compile and run); False when it raised."""
    args, kwargs = inputs
    _notes.clear()
    ok, out, t1 = _call(fn, args, kwargs, dev)
    ex.notes.update(_notes)
    if probe is not None:
        ex.backend_calls, ex.graph_ops = probe.calls, list(probe.ops)
        ex.lowering = classify_lowering(probe.code)
    if not ok:
        ex.target_error = ErrorInfo.from_exception(out, "compile" if compiled else "exec")
        ex.stage = failure_stage(ex.target_error, probe)
        return False
    if compiled:
        ex.t_compile = t1
    else:
        ex.t_exec = t1
    _check_exercised(ex, probe, out, dev)
    if reduced := accumulation.reduced_precision_reduction(ex.op, dev, getattr(out, "dtype", None)):
        ex.notes["reduced_precision_reduction"] = reduced
    return _keep_target(ex, out, keys, args, kwargs)


def _keep_target(ex: Execution, out, keys: list, args, kwargs) -> bool:
    """The target's result copied to the CPU; a copy that raises (the device's copy kernel) is the
    target's error, recorded as such."""
    try:
        ex.target = _result(out, keys, args, kwargs, to_cpu=True, op=ex.op)
    except Exception as e:
        ex.target_error = ErrorInfo.from_exception(e, "copy to cpu")
        ex.stage = "runtime"
        return False
    return True


def _second_target_call(ex: Execution, fn, inputs: tuple, dev: torch.device, keys: list, compiled: bool,
                        check_determinism: bool) -> None:
    """The call of the ready target (a compiled one's run time), and the determinism check."""
    args, kwargs = inputs
    ok, out2, t2 = _call(fn, args, kwargs, dev)
    if not ok:
        ex.target_error = ErrorInfo.from_exception(out2, "exec")
        ex.stage = "runtime"
        return
    if compiled:
        ex.t_exec = t2
    if check_determinism:
        second = _result(out2, keys, args, kwargs, to_cpu=True, op=ex.op)
        c = compare(ex.target, second, mode="bits")
        ex.deterministic = c.passed
        ex.determinism_detail = None if c.passed else f"two target runs differ: {c.reason}"



def _devices(x, found: set) -> None:
    found.update(t.device for t in result_leaves(x) if isinstance(t, torch.Tensor))


def _on_target(found: set, dev: torch.device) -> bool:
    """Some output is on the target device: its index too when the target names one (outputs on
    ``testdev:0`` do not exercise ``testdev:1``)."""
    return any(d.type == dev.type and (dev.index is None or (d.index or 0) == dev.index) for d in found)


def _check_exercised(ex: Execution, probe: Probe | None, out, dev: torch.device) -> None:
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
        if dev.type != "cpu" and found and not _on_target(found, dev):
            why = f"the output is on {', '.join(sorted(map(str, found)))}, not on the target device {dev}"
    if why:
        ex.exercised, ex.not_exercised = False, why


