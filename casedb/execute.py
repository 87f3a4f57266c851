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

No database access here; tensors are built by :mod:`casedb.materialize`, ops resolved by
:mod:`casedb.ops`, results compared by :mod:`casedb.compare`.
"""

from __future__ import annotations

import functools
import math
import re
import traceback
import warnings
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable

import torch

from casedb.compare import Comparison, compare
from casedb.materialize import Prepared, prepare, torch_dtype, upcast_caster
from casedb.ops import UnknownOpError, get_arg, op_info

OUTCOMES = ("passed", "failed", "error", "ref_error", "xfailed", "xpassed")
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
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def comparison(self, rtol: float, atol: float) -> Comparison | None:
        """Reference vs target at these tolerances (cached); None when either is missing."""
        if self.reference is None or self.target is None:
            return None
        key = ("main", rtol, atol)
        if key not in self._cache:
            self._cache[key] = compare(self.reference, self.target, rtol=rtol, atol=atol, mode=self.compare_mode)
        return self._cache[key]

    def comparisons_hi(self, rtol: float, atol: float) -> tuple[Comparison | None, Comparison | None]:
        """(target vs upcast reference, reference vs upcast reference), values mode only."""
        if self.reference_hi is None or self.compare_mode != "values":
            return None, None
        key = ("hi", rtol, atol)
        if key not in self._cache:
            tgt = None if self.target is None else compare(
                self.reference_hi, self.target, rtol=rtol, atol=atol, check_dtype=False)
            ref = None if self.reference is None else compare(
                self.reference_hi, self.reference, rtol=rtol, atol=atol, check_dtype=False)
            self._cache[key] = (tgt, ref)
        return self._cache[key]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "op", "signature", "device", "backend", "compare_mode", "reference_dtype", "t_setup",
            "t_ref", "t_ref_hi", "t_compile", "t_exec", "deterministic", "determinism_detail")}
        d["mutated"] = list(self.mutated)
        for name in ("ref_error", "target_error", "ref_hi_error"):
            e = getattr(self, name)
            d[name] = e.to_dict() if e is not None else None
        return d


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


def _call(fn, args, kwargs, dev):
    """(ok, output or exception, seconds)."""
    _sync(dev)
    t = perf_counter()
    try:
        out = fn(*args, **kwargs)
        _sync(dev)
    except Exception as e:  # any failure of the op is a result, not a crash of the runner
        return False, e, perf_counter() - t
    return True, out, perf_counter() - t


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


def _compile(fn, backend):
    def run_op(*args, **kwargs):
        return fn(*args, **kwargs)

    torch._dynamo.reset()
    return torch.compile(run_op, backend=backend, fullgraph=True, dynamic=False)


def run_case(case: dict, *, device: "str | torch.device" = "cpu", backend: "str | Callable" = "eager",
             load_blob: Callable[[str], bytes] | None = None, reference_dtype: "str | None" = None,
             check_determinism: bool = False, replace_device: bool = True) -> Execution:
    """Run ``case`` on the CPU reference and on ``device``/``backend``; see the module docstring.

    ``replace_device=False``: device strings recorded in the case (``cuda:0``) reach the target
    as written (the reference always gets ``cpu``).

    Problems of the case itself (unknown op, inputs that cannot be built) come back as
    ``ref_error`` (phase ``resolve``/``materialize``); a bad ``device``, ``backend`` or
    ``reference_dtype`` raises ValueError/RuntimeError (they concern the whole run).
    """
    dev = torch.device(device)
    check_backend(backend)
    hi_dtype = None
    if reference_dtype is not None:
        hi_dtype = torch_dtype(reference_dtype)
        if not hi_dtype.is_floating_point:
            raise ValueError(f"reference_dtype must be a floating dtype (float32, float64), got {reference_dtype!r}")
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
        if hi_dtype is not None:
            try:
                a, k = prepared.place(cpu, cast=upcast_caster(hi_dtype), fresh=writes)
                ok, out, ex.t_ref_hi = _call(info.fn, a, k, cpu)
            except Exception as e:
                ok, out = False, e
            if ok:
                ex.reference_hi = _result(out, keys, a, k, to_cpu=False)
            else:
                ex.ref_hi_error = ErrorInfo.from_exception(out, "reference_hi")
            del out

        # ---- target
        _run_target(ex, info, prepared, dev, backend, keys, writes, meta, check_determinism,
                    shared=(ref_args, ref_kwargs) if dev.type == "cpu" and not writes and replace_device else None,
                    replace_device=replace_device)
    return ex


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
        return
    try:
        fn = _compile(info.fn, backend) if compiled else info.fn
    except Exception as e:
        ex.target_error = ErrorInfo.from_exception(e, "compile")
        return
    ok, out, t1 = _call(fn, args, kwargs, dev)
    if not ok:
        ex.target_error = ErrorInfo.from_exception(out, "compile" if compiled else "exec")
        return
    if compiled:
        ex.t_compile = t1
    else:
        ex.t_exec = t1
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
        return
    if compiled:
        ex.t_exec = t2
    if check_determinism and not meta:
        second = _result(out2, keys, args, kwargs, to_cpu=True)
        c = compare(ex.target, second, mode="bits")
        ex.deterministic = c.passed
        ex.determinism_detail = None if c.passed else f"two target runs differ: {c.reason}"


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


def judge(execution: Execution, *, rtol: float, atol: float, expects_error: dict | None = None,
          xfail: str | None = None) -> Verdict:
    """The verdict for one model occurrence of an executed case.

    ``expects_error``: ``{"type", "match"}`` — the target must raise it (the reference may raise
    it too), else ``xpassed``; or ``{"ref": {...}, "<device type or device>": {...}}`` per side.
    ``xfail``: the occurrence is expected to fail (reason text): failed/error become ``xfailed``
    and passed becomes ``xpassed``.
    """
    ex = execution
    v = Verdict(outcome="passed", reason="", compare_mode=ex.compare_mode, rtol=rtol, atol=atol,
                deterministic=ex.deterministic, t_ref=ex.t_ref, t_compile=ex.t_compile, t_exec=ex.t_exec)
    ref_spec, tgt_spec = _expectations(expects_error, ex.device)
    ref_expected = False

    def error_fields(err: ErrorInfo):
        d = err.to_dict()
        v.error_phase, v.error_type, v.error_message, v.traceback = (
            d["error_phase"], d["error_type"], d["error_message"], d["traceback"])

    def metrics(c: Comparison | None):
        if c is not None:
            v.max_abs_err, v.max_rel_err, v.mismatch_count = c.max_abs_err, c.max_rel_err, c.mismatch_count
            v.numel, v.nan_inf_mismatch, v.where = c.numel, c.nan_inf_mismatch, c.where
        hi, ref_hi = ex.comparisons_hi(rtol, atol)
        if hi is not None:
            v.max_abs_err_hi, v.max_rel_err_hi = hi.max_abs_err, hi.max_rel_err
        if ref_hi is not None:
            v.ref_max_abs_err_hi, v.ref_max_rel_err_hi = ref_hi.max_abs_err, ref_hi.max_rel_err

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
        else:
            v.outcome = "xpassed"
            c = ex.comparison(rtol, atol)
            metrics(c)
            tail = "" if c is None else (" (its result matches the reference)" if c.passed
                                         else f" (and its result differs: {c.reason})")
            v.reason = f"expected {_describe_spec(tgt_spec)}, but the target did not raise{tail}"
    elif ex.target_error is not None:
        terr = ex.target_error
        v.outcome = "error"
        v.reason = f"{terr.phase}: {terr.type}: {_short(terr.message)}"
        error_fields(terr)
    elif ref_expected:
        if ex.reference_hi is not None and ex.target is not None:
            c = compare(ex.reference_hi, ex.target, rtol=rtol, atol=atol, mode=ex.compare_mode, check_dtype=False)
            metrics(c)
            v.outcome = "passed" if c.passed else "failed"
            v.reason = f"against the {ex.reference_dtype} reference (the CPU reference raised as expected): {c.reason}"
        else:
            v.outcome = "ref_error"
            v.reason = (f"the CPU reference raised the expected {ex.ref_error.type}, so there is nothing to "
                        f"compare the target with (give a reference_dtype to compare against an upcast reference)")
            error_fields(ex.ref_error)
    else:
        c = ex.comparison(rtol, atol)
        metrics(c)
        if c is None:
            v.outcome, v.reason = "error", "no result to compare"
        elif not c.passed:
            v.outcome, v.reason = "failed", c.reason
        elif ex.deterministic is False:
            v.outcome, v.reason = "failed", f"nondeterministic: {ex.determinism_detail}"
        else:
            v.outcome, v.reason = "passed", c.reason

    if xfail and v.outcome in ("passed", "failed", "error"):
        if v.outcome == "passed":
            v.outcome, v.reason = "xpassed", f"expected to fail ({xfail}) but passed"
        else:
            v.outcome, v.reason = "xfailed", f"{xfail}: {v.reason}"
    return v
