"""Op names → callables, and what an op does to its arguments.

:func:`resolve_op` accepts every spelling casedb stores or a trace produces:

* ``torch.add``, ``torch.nn.functional.softmax``, ``torch.special.erf`` — any callable under ``torch``;
* Tensor methods: ``torch.Tensor.mul``, ``torch.Tensor.__rsub__``, and the short ``torch.view`` /
  ``torch.contiguous`` / ``torch.to`` / ``torch.float`` (a ``torch.<name>`` that is not a torch
  function is the Tensor method of that name);
* Python operators: ``torch.getitem`` / ``torch.setitem`` / ``torch.invert`` (``operator.<name>``),
  also written ``operator.getitem`` or ``operator.__getitem__``;
* operator overloads: ``torch.ops.aten.add.Tensor``, the packet ``torch.ops.aten.view``, any
  namespace (``torch.ops.mylib.op``), and trace spellings ``aten::add``, ``aten.add.Tensor``,
  ``mylib::op.default``.

:func:`op_info` adds the classification the executor needs: which arguments the op writes
(in-place ops, ``out=``, ``inplace=True``) and whether its output is random or uninitialized
(compare metadata only). Both are cached per name.

What a case may call is an allow-list, checked when a manifest is imported (:func:`refuse_unsafe`)
and again when a run resolves the op (:func:`op_info`; a refused op is the case's ``resolve``
error, never called): torch functions that ``torch.overrides`` lists, torch's ATen bindings and
the factories of :data:`EXTRA_TORCH_FUNCTIONS`; Tensor methods (private ones only when
overridable); Python operators of :data:`OPERATOR_NAMES`; dispatcher operators under the rule of
:mod:`casedb.cases.dispatcher` (aten and prims, and namespaces an ``--import`` module registered; no
op that reaches files, processes or process-wide state). :data:`DENIED` and the dispatcher's name
rule (``file``/``save``/``load``/``seed``, ``set_``) hold for every spelling.
"""

from __future__ import annotations

import functools
import inspect
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch

from casedb import names
from casedb.cases import dispatcher, no_compute


class UnknownOpError(LookupError):
    """The op name resolves to nothing callable in this torch (or its library is not loaded)."""


FORMS = ("torch.<fn>, torch.nn.functional.<fn>, torch.Tensor.<method> (or torch.<method>), "
         "torch.ops.<ns>.<op>[.<overload>], aten::<op>[.<overload>], operator.<fn>")

# Outputs whose values are random or uninitialized: compared on metadata only.
RANDOM_NAMES = frozenset("""
    bernoulli cauchy exponential geometric log_normal multinomial normal poisson rand rand_like
    randint randint_like randn randn_like randperm uniform random binomial _standard_gamma
    _sample_dirichlet _fused_dropout native_dropout dropout alpha_dropout feature_dropout
    feature_alpha_dropout dropout1d dropout2d dropout3d rrelu rrelu_with_noise
    rrelu_with_noise_functional gumbel_softmax kaiming_uniform kaiming_normal xavier_uniform
    xavier_normal trunc_normal orthogonal sparse
    scaled_dot_product_attention _scaled_dot_product_flash_attention
    _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_efficient_attention
    _scaled_dot_product_cudnn_attention _scaled_dot_product_fused_attention_overrideable
    _flash_attention_forward _efficient_attention_forward lstm gru rnn_tanh rnn_relu
""".split())
UNINITIALIZED_NAMES = no_compute.UNINITIALIZED
# Arguments that switch randomness off when false/zero (all present ones must be truthy).
_GATES = ("training", "train", "dropout_p", "dropout")
_INPLACE_DUNDERS = frozenset("""__setitem__ __iadd__ __isub__ __imul__ __itruediv__ __ifloordiv__
    __imod__ __ipow__ __iand__ __ior__ __ixor__ __ilshift__ __irshift__ __imatmul__""".split())
_INPLACE_OPERATORS = frozenset("""setitem iadd isub imul itruediv ifloordiv imod ipow iand ior ixor
    ilshift irshift imatmul iconcat""".split())


def _setitem(obj, index, value):
    """``operator.setitem`` as Python code (dynamo cannot trace the builtin itself)."""
    obj[index] = value


_OPERATOR_SHIMS = {"setitem": _setitem}


@dataclass(frozen=True)
class OpInfo:
    name: str
    fn: Callable
    kind: str                                      # "torch" | "method" | "overload" | "packet" | "operator"
    writes: tuple = ()                             # ((position | None, keyword | None), ...)
    random: bool = False                           # random or uninitialized output (unless a gate is off)
    gates: tuple = ()                              # ((position | None, keyword, default), ...)
    inplace_flag: tuple | None = None              # (position | None, "inplace") for F.relu(inplace=True)

    def mutated(self, args, kwargs) -> list[str]:
        """Keys (``args[i]`` / ``kwargs[name]``) of the arguments this call writes into."""
        keys = []
        for pos, name in self.writes:
            if pos is not None and pos < len(args):
                keys.append(f"args[{pos}]")
            elif name is not None and name in kwargs:
                keys.append(f"kwargs[{name}]")
        if "out" in kwargs and "kwargs[out]" not in keys:
            keys.append("kwargs[out]")
        if self.inplace_flag is not None and _arg(args, kwargs, *self.inplace_flag, False) and args:
            if "args[0]" not in keys:
                keys.append("args[0]")
        return keys

    def metadata_only(self, args, kwargs) -> bool:
        """True when this call's output values are random/uninitialized (compare metadata only)."""
        if not self.random:
            return False
        for pos, name, default in self.gates:
            value = _arg(args, kwargs, pos, name, default)
            if value is not None and not value:
                return False
        return True


def _arg(args, kwargs, pos, name, default):
    if name is not None and name in kwargs:
        return kwargs[name]
    if pos is not None and pos < len(args):
        return args[pos]
    return default


def get_arg(args, kwargs, key: str):
    """The argument named by a key from :meth:`OpInfo.mutated`."""
    if key.startswith("args["):
        return args[int(key[5:-1])]
    return kwargs[key[7:-1]]


def resolve_op(name: str) -> Callable:
    """The callable for an op name (cached). Raises :class:`UnknownOpError`."""
    return op_info(name).fn


@functools.lru_cache(maxsize=None)
def op_info(name: str) -> OpInfo:
    """Callable and classification for an op name (cached). Raises :class:`UnknownOpError`."""
    fn, kind, base = _resolve(name)
    writes: list = []
    gates: tuple = ()
    inplace_flag = None
    schemas = _schemas(fn) if kind in ("overload", "packet") else None
    if schemas is None and kind in ("torch", "method"):
        schemas = _schemas(_aten_packet(base))
    if kind in ("overload", "packet"):
        for s in schemas or ():
            for i, a in enumerate(s.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    w = (None if a.kwarg_only else i, a.name)
                    if w not in writes:
                        writes.append(w)
    elif base in _INPLACE_DUNDERS or (kind == "operator" and base in _INPLACE_OPERATORS) or (
            base.endswith("_") and not base.endswith("__")):
        writes.append((0, None))
    stem = base[:-1] if base.endswith("_") and not base.endswith("__") else base
    random = stem in RANDOM_NAMES or stem in UNINITIALIZED_NAMES or base in RANDOM_NAMES
    params = _python_params(fn)
    if params is not None:
        if "inplace" in params:
            inplace_flag = (params["inplace"][0], "inplace")
        if random:
            gates = _gates_from_params(params, stem)
    elif random and schemas:
        gates = _gates_from_schema(schemas[0], stem)
    return OpInfo(name=name, fn=fn, kind=kind, writes=tuple(writes), random=random, gates=gates,
                  inplace_flag=inplace_flag)


def _gate_names(stem: str):
    return _GATES + (("p",) if "dropout" in stem else ())


def _gates_from_params(params: dict, stem: str) -> tuple:
    out = []
    for g in _gate_names(stem):
        if g in params:
            pos, default = params[g]
            out.append((pos, g, True if default is inspect.Parameter.empty else default))
    return tuple(out)


def _gates_from_schema(schema, stem: str) -> tuple:
    out = []
    names = _gate_names(stem)
    for i, a in enumerate(schema.arguments):
        if a.name in names:
            default = a.default_value if a.has_default_value() else True
            out.append((None if a.kwarg_only else i, a.name, default))
    return tuple(out)


def _python_params(fn) -> dict | None:
    if not inspect.isfunction(fn):
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    out = {}
    for i, p in enumerate(sig.parameters.values()):
        pos = i if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else None
        out[p.name] = (pos, p.default)
    return out


def _schemas(obj) -> list | None:
    if isinstance(obj, torch._ops.OpOverload):
        return [obj._schema]
    if isinstance(obj, torch._ops.OpOverloadPacket):
        out = []
        for o in obj.overloads():
            try:
                out.append(getattr(obj, o)._schema)
            except Exception:  # an overload that cannot be loaded in this build
                continue
        return out
    return None


def _aten_packet(base: str):
    try:
        return getattr(torch.ops.aten, base)
    except Exception:  # AttributeError / RuntimeError for names aten does not have
        return None


class UnsafeOpError(UnknownOpError):
    """The name resolves to something that is not a tensor operation (a file writer, a module
    loader, ``os.system`` reached through ``torch.os``): casedb never calls it."""


# Python operators a model applies to tensors (operator.<name>); attrgetter, methodcaller, call
# and the like are not operations on values.
OPERATOR_NAMES = frozenset("""abs add and_ concat contains delitem eq floordiv ge getitem gt iadd iand iconcat
    ifloordiv ilshift imatmul imod imul index inv invert ior ipow irshift is_ is_not isub itruediv ixor le lshift
    lt matmul mod mul ne neg not_ or_ pos pow rshift setitem sub truediv truth xor""".split())
# torch functions outside torch.overrides' overridable set that real models call: factories,
# dtype arithmetic and the context objects the RFC implementation's tracer records.
EXTRA_TORCH_FUNCTIONS = frozenset("""arange as_strided as_tensor asarray bartlett_window blackman_window empty
    empty_permuted empty_strided eye fill full hamming_window hann_window kaiser_window linspace logspace normal
    ones rand rand_like randint randint_like randn randn_like randperm range scalar_tensor tensor tril_indices
    triu_indices vander zeros promote_types result_type can_cast finfo iinfo device autocast no_grad enable_grad
    inference_mode set_grad_enabled get_default_dtype is_grad_enabled is_autocast_enabled
    nn.functional.grouped_mm nn.functional.scaled_mm nn.functional.scaled_grouped_mm nn.functional.hardsigmoid
    nn.functional.hardswish nn.functional.sigmoid nn.functional.tanh nn.functional.upsample
    nn.functional.upsample_bilinear nn.functional.upsample_nearest
    amp.autocast_mode._enter_autocast amp.autocast_mode._exit_autocast""".split())
# What is never called, whatever lists it: Tensor methods that take a callable or share memory,
# and functions that reach files or process-wide settings.
DENIED = frozenset("""apply_ map_ map2_ register_hook register_post_accumulate_grad_hook share_memory_ from_file
    _cufft_set_plan_cache_max_size __reduce__ __reduce_ex__ __setstate__ __getstate__ __init_subclass__
    __subclasshook__ __new__ __init__ __del__ __setattr__ __delattr__""".split())
_ATEN_BINDINGS = ("_VariableFunctions", "_nn", "_linalg", "_fft", "_special", "_nested", "_sparse")


@functools.lru_cache(maxsize=1)
def _overridable() -> frozenset:
    from torch.overrides import get_overridable_functions

    return frozenset(f for fns in get_overridable_functions().values() for f in fns)


def _is_aten_binding(fn, base: str) -> bool:
    """A function torch generates for an ATen op (torch.abs, torch._grouped_mm, F.gelu ...)."""
    for module in _ATEN_BINDINGS:
        holder = getattr(torch._C, module, None)
        if holder is not None and getattr(holder, base, None) is fn:
            return True
    return False


def _check_allowed(name: str, fn, kind: str, base: str, path: str) -> None:
    if kind in ("overload", "packet"):
        # dispatcher operators: casedb.cases.dispatcher's rule (namespaces, names, schemas)
        ns, op = path.split(".")[2:4]
        why = dispatcher.refusal(fn, ns, op, _schemas(fn))
        if why:
            raise UnsafeOpError(f"op {name!r} is not a tensor operation casedb runs: {why}")
        return
    if base in DENIED:
        ok = False
    elif path in EXTRA_TORCH_FUNCTIONS:
        ok = True  # reviewed one by one (torch.set_grad_enabled: a context the RFC's tracer records)
    elif dispatcher.denied_name(base):
        ok = False  # the dispatcher's name rule holds for every spelling (torch.Tensor.set_)
    elif kind == "operator":
        ok = base in OPERATOR_NAMES or base in _OPERATOR_SHIMS
    elif kind == "method":
        ok = not base.startswith("_") or fn in _overridable()
    else:
        ok = fn in _overridable() or _is_aten_binding(fn, base)
    if not ok:
        raise UnsafeOpError(f"op {name!r} is not a tensor operation casedb runs: ops are torch functions and Tensor "
                            "methods (those torch.overrides lists, torch's ATen bindings and factories), "
                            "torch.ops operators and Python operators (operator.<name>)")


def refuse_unsafe(name: str) -> None:
    """Raise UnsafeOpError when ``name`` resolves to something casedb never calls (an import
    checks this; a name that resolves to nothing yet may be a custom op a run registers)."""
    try:
        found = _lookup(name)
    except UnsafeOpError:
        raise
    except UnknownOpError:
        return
    _check_allowed(name, *found)


def refusal(name: str) -> tuple[str, str] | None:
    """Why casedb never calls ``name``, as ``("unsafe", why)`` for what reaches files, processes or
    process-wide state (the denied names, torch.ops operators the dispatcher refuses, dunder walks:
    an input naming one is refused) or ``("not an op", why)`` for the rest (a tracer's bookkeeping
    call such as ``torch.nn.attention._backend_from_string``: an importer lists it as skipped);
    None when casedb may call it."""
    try:
        refuse_unsafe(name)
    except UnsafeOpError as e:
        path = names.op_path(name)
        parts = path.split(".")
        base = parts[-1]
        private = any(p.startswith("_") for p in parts[1:-1])  # torch._C._functorch...: never public API
        unsafe = (path.startswith("torch.ops.") or any(p.startswith("__") for p in parts[:-1])
                  or (not private and (base in DENIED or dispatcher.denied_name(base))))
        return ("unsafe" if unsafe else "not an op"), str(e)
    return None


def _resolve(name: str) -> tuple[Callable, str, str]:
    fn, kind, base, path = _lookup(name)
    _check_allowed(name, fn, kind, base, path)
    return fn, kind, base


def _lookup(name: str) -> tuple[Callable, str, str, str]:
    """(callable, kind, base name, path under torch) of an op name, unchecked."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownOpError(f"op name must be a non-empty string, got {name!r}; forms: {FORMS}")
    try:
        n = names.op_path(name)
    except ValueError as e:
        raise UnknownOpError(str(e)) from None
    parts = n.split(".")
    if any(p.startswith("__") for p in parts[:-1]) or any(p.startswith("_") for p in parts[1:-2]):
        raise UnsafeOpError(f"op {name!r}: private attributes are not ops")
    if n.startswith("torch.ops."):
        fn, kind, base = _resolve_ops(name, parts[2:])
        return fn, kind, base, n
    if parts[0] in ("operator", "_operator") and len(parts) == 2:
        fn = _operator(parts[1])
        if fn is None:
            raise UnknownOpError(f"unknown op {name!r}: the operator module has no {parts[1]!r}")
        return fn, "operator", _operator_name(parts[1]), n
    if parts[0] != "torch" or len(parts) < 2:
        raise UnknownOpError(f"unknown op {name!r}: ops are written {FORMS}")
    if parts[1] == "Tensor" and len(parts) == 3:
        fn = getattr(torch.Tensor, parts[2], None)
        if fn is None or not callable(fn):
            raise UnknownOpError(f"unknown op {name!r}: torch.Tensor has no method {parts[2]!r}"
                                 + _suggest(parts[2], dir(torch.Tensor)))
        return fn, "method", parts[2], n
    if len(parts) == 2 and parts[1].startswith("__") and parts[1].endswith("__"):
        # torch.__eq__ / torch.__and__ (how the RFC tracer spells `a == b`, `m & m`) are the Tensor
        # operators, never the torch module's own attributes; the method rule below still applies
        fn = getattr(torch.Tensor, parts[1], None)
        if fn is None or not callable(fn):
            raise UnknownOpError(f"unknown op {name!r}: torch.Tensor has no operator {parts[1]!r}")
        return fn, "method", parts[1], n
    obj: Any = torch
    for p in parts[1:]:
        obj = getattr(obj, p, None)
        if obj is None:
            break
    if obj is not None and callable(obj):
        return obj, "torch", parts[-1], ".".join(parts[1:])
    if len(parts) == 2:
        short = parts[1]
        fn = getattr(torch.Tensor, short, None)
        if fn is not None and callable(fn):
            return fn, "method", short, n
        fn = _operator(short)
        if fn is not None:
            return fn, "operator", _operator_name(short), n
        raise UnknownOpError(f"unknown op {name!r}: not a torch function, Tensor method or Python operator"
                             + _suggest(short, set(dir(torch)) | set(dir(torch.Tensor))))
    where = ".".join(parts[:-1])
    raise UnknownOpError(f"unknown op {name!r}: {where} has no callable {parts[-1]!r}"
                         + _suggest(parts[-1], _dir(where)))


def _operator_name(short: str) -> str:
    """``__getitem__`` -> ``getitem`` (the operator module's own name)."""
    if short.startswith("__") and short.endswith("__") and len(short) > 4 and hasattr(operator, short[2:-2]):
        return short[2:-2]
    return short


def _operator(short: str):
    if short.startswith("__") and short.endswith("__") and len(short) > 4:
        # operator.__getitem__ (the RFC implementation's spelling) is operator.getitem
        plain = short[2:-2]
        if getattr(operator, plain, None) is not None and getattr(operator, plain) is getattr(operator, short, None):
            short = plain
    if short in _OPERATOR_SHIMS:
        return _OPERATOR_SHIMS[short]
    fn = getattr(operator, short, None)
    return fn if callable(fn) and not short.startswith("_") else None


def _resolve_ops(name: str, parts: list[str]):
    if len(parts) not in (2, 3) or not all(parts):
        raise UnknownOpError(f"unknown op {name!r}: operator names are torch.ops.<ns>.<op>[.<overload>]")
    ns = parts[0]
    try:
        packet = getattr(getattr(torch.ops, ns), parts[1])
    except Exception:
        hint = "" if ns == "aten" else (f" (if {ns} is a custom op library, import the module that "
                                        f"registers it before running)")
        known = []
        if ns == "aten":
            known = [n for n in dir(torch.ops.aten) if not n.startswith("__")]
        raise UnknownOpError(f"unknown op {name!r}: torch.ops.{ns} has no op {parts[1]!r}{hint}"
                             + _suggest(parts[1], known)) from None
    if len(parts) == 2:
        return packet, "packet", parts[1]
    try:
        return getattr(packet, parts[2]), "overload", parts[1]
    except Exception:
        raise UnknownOpError(f"unknown op {name!r}: {ns}::{parts[1]} has no overload {parts[2]!r} "
                             f"(overloads: {', '.join(packet.overloads())})") from None


def _dir(path: str) -> list[str]:
    obj: Any = None
    for i, p in enumerate(path.split(".")):
        obj = torch if i == 0 else getattr(obj, p, None)
        if obj is None:
            return []
    return dir(obj)


def _suggest(word: str, choices) -> str:
    hint = names.did_you_mean(word, [c for c in choices if not c.startswith("_")], n=3, quote=False)
    return f" — {hint}" if hint else ""
