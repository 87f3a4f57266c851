"""An executed case as the judge reads it: :class:`Execution` (the reference and target results
as CPU tensors, their errors as :class:`ErrorInfo`, timings and what the backend did).

:mod:`casedb.run.execute` fills an Execution; :mod:`casedb.judge.verdict` judges it, as often as
there are model occurrences, through the comparisons cached here (judging again with other
tolerances does not run anything).
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from casedb.cases.materialize import result_leaves
from casedb.judge import numerics
from casedb.judge.compare import Comparison, compare
from casedb.judge.ulp import flat_chunks

IN_REPRO = False  # not copied into repro scripts (casedb.read.repro reads every judge module's)

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
    reference_mag: Any = None                    # summing ops: their error scale (casedb.judge.accumulation)
    bias_values: Any = None                      # the input the output's elements come from (casedb.judge.bias.values_of)
    bias_factor: float | None = None             # means: fl(1/n) * n (casedb.judge.accumulation.reciprocal_factor)
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
    stage: str | None = None                     # where the target failed (casedb.outcomes.STAGES)
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
            # (values mode too: where the two differ in NaN/inf, the upcast reference decides whose fault it is)
            self._cache[key] = compare(self.reference, self.target, rtol=rtol, atol=atol, mode=mode,
                                       tolerances=tolerances, hi=self.reference_hi,
                                       hi_mag=self.reference_mag,
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

