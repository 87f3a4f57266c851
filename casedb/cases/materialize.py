"""Turn a normalized case into the arguments of one call: ``materialize(case, device) -> (args, kwargs)``.

Input data is generated on the CPU from the case seed (the case's explicit ``seed``, else
``int(signature[:8], 16)``: :func:`casedb.cases.signature.data_seed`) with one ``torch.Generator``,
tensor by tensor in a fixed order — positional inputs first, then keyword arguments in sorted
name order — so the same case gives the same bytes on any machine. Each tensor is then moved to
the device and its layout preset (:mod:`casedb.cases.presets`) applied there, so the device sees the
layout the reference sees.

Values are portable: ``rand`` and ``randint`` come straight from torch's generator (integer
arithmetic, identical on every CPU); ``randn`` is drawn in float64 (torch's float32/float16
normal kernels differ between AVX2/AVX512 and other CPUs) and ``uniform``/``arange``/``mean``/
``std`` are applied in float64 before the single rounding cast to the tensor's dtype.

Generation is split from placement so one generation serves the reference and the target
(:func:`prepare` then :meth:`Prepared.place`); :func:`materialize` does both.

Init kinds: ``rand`` [0, 1); ``randn`` (``mean`` 0, ``std`` 1); ``uniform`` [``low``, ``high``)
(0, 1); ``randint`` [``low``, ``high``) (0, 10); ``arange`` (``start`` 0, ``step`` 1, row-major
over the shape); ``zeros``; ``ones``; ``full`` (``fill_value``); ``eye`` (square 2-d); ``xavier``
(Glorot uniform); ``cumsum_offsets`` (``total`` rows in ``shape[0]`` groups, cumulated); ``data``
(``blob``: raw little-endian bytes of the contiguous tensor, from ``load_blob(sha)``). Bool tensors
with a random init are 50 % True (``randint`` honours its bounds); integer tensors with
``rand``/``randn`` use ``randint`` [0, 10) and with ``uniform`` use ``randint`` over [low, high).
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any, Callable

import torch

from casedb.cases import blobs
from casedb.cases import dtypes as dtypes_mod
from casedb.cases import presets as presets_mod
from casedb.cases import value_ranges
from casedb.cases.safe_eval import parse_py_literal
from casedb.cases.generators import GENERATORS as _GEN
from casedb.cases.signature import data_seed

INPUT_KINDS = ("tensor", "value", "py", "tensor_list", "file")

# Device strings that stand for "the device under test" when they appear as a value.
_DEVICE_TYPES = {"cpu", "cuda", "xpu", "mps", "meta", "hpu", "mtia", "npu", "xla", "spyre",
                 "privateuseone", "ipu", "maia", "lazy", "vulkan"}
_DEVICE_RE = re.compile(r"^([a-z_][a-z0-9_]*)(:\d+)?$")


class MaterializeError(ValueError):
    """A case cannot be turned into call arguments (bad spec, missing blob, wrong blob size)."""


# ------------------------------------------------------------------------------------ leaves

class TensorLeaf:
    """A generated CPU tensor (``base``, never handed to an op unless no copy is needed), the
    preset that lays it out on the device, and how it was generated (``source``: shape, dtype
    and the blob, the data or the init with its arguments; what a repro script replays)."""

    __slots__ = ("base", "preset", "preset_args", "source", "device_layout")

    def __init__(self, base: torch.Tensor, preset: str | None, preset_args: dict | None, source: dict | None = None,
                 device_layout: dict | None = None):
        self.base = base
        self.preset = preset
        self.preset_args = preset_args or {}
        self.source = source or {}
        self.device_layout = device_layout  # a device backend's layout (DEVICE_LAYOUT_HOOKS)


# Device backends that lay tensors out themselves (the RFC implementation's ``device_layout``:
# ``{device_size, stride_map, device_dtype}``) register ``hook(cpu_tensor, device, layout) ->
# device tensor`` under their device type, e.g. from a ``casedb run --import`` module:
# ``DEVICE_LAYOUT_HOOKS["spyre"] = lambda t, dev, lay: t.to(dev, device_layout=SpyreTensorLayout(**lay))``.
# Without one (and always on the CPU) the layout is ignored: the tensor moves with ``.to(device)``.
DEVICE_LAYOUT_HOOKS: dict[str, Callable] = {}


class TensorListLeaf:
    __slots__ = ("items", "as_tuple")

    def __init__(self, items: list, as_tuple: bool = False):
        self.items = items  # TensorLeaf | None each
        self.as_tuple = as_tuple  # an index x[i0, i1] is a tuple of tensors, not a list


class DeviceLeaf:
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


Caster = Callable[[torch.dtype], "torch.dtype | None"]


class Prepared:
    """Generated inputs of one case, ready to be placed on any device any number of times."""

    __slots__ = ("args", "kwargs", "leaves")

    def __init__(self, args: list, kwargs: dict, leaves: list[TensorLeaf]):
        self.args = args
        self.kwargs = kwargs
        self.leaves = leaves

    def place(self, device: "str | torch.device" = "cpu", *, replace_device: bool = True,
              cast: "Caster | None" = None, fresh: bool = False) -> tuple[list, dict]:
        """Arguments for one call on ``device``.

        ``cast`` maps a tensor dtype to the dtype to convert it to (or None to keep it); the
        conversion happens before the move and the preset, so values and layout are the
        case's. ``fresh`` guarantees no returned tensor shares memory with the generated ones
        (for ops that write into their inputs); otherwise, on the CPU, unpreset tensors are
        passed as generated (no copy).
        """
        dev = device if isinstance(device, torch.device) else torch.device(device)
        ctx = (dev, str(dev), cast, fresh, replace_device)
        args = [_place(a, ctx) for a in self.args]
        kwargs = {k: _place(v, ctx) for k, v in self.kwargs.items()}
        return args, kwargs

    def versions(self) -> list[int]:
        """Version counters of the generated tensors (they change if anything wrote into them)."""
        return [leaf.base._version for leaf in self.leaves]


def _place(x, ctx):
    cls = type(x)
    if cls is TensorLeaf:
        return _place_tensor(x, ctx)
    if cls is TensorListLeaf:
        items = [None if i is None else _place_tensor(i, ctx) for i in x.items]
        return tuple(items) if x.as_tuple else items
    if cls is DeviceLeaf:
        return ctx[1] if ctx[4] else x.text
    return x


def _place_tensor(leaf: TensorLeaf, ctx) -> torch.Tensor:
    dev, _, cast, fresh, _ = ctx
    t = leaf.base
    if cast is not None:
        to = cast(t.dtype)
        if to is not None and to != t.dtype:
            t = t.to(to)
    hook = DEVICE_LAYOUT_HOOKS.get(dev.type) if leaf.device_layout else None
    if hook is not None:
        # a preset's new storage on the device would not have the layout: the preset lays the
        # tensor out on the CPU, then the hook moves it with its device layout
        if leaf.preset:
            t = presets_mod.PRESETS[leaf.preset].fn(t, **leaf.preset_args)
        return hook(t, dev, leaf.device_layout)
    if dev.type != "cpu":
        t = t.to(dev)
    elif fresh and t is leaf.base:
        t = t.clone()
    if leaf.preset:
        t = presets_mod.PRESETS[leaf.preset].fn(t, **leaf.preset_args)
    return t


# ------------------------------------------------------------------------------------ public

def materialize(case: dict, device: "str | torch.device" = "cpu", *,
                load_blob: Callable[[str], bytes] | None = None, replace_device: bool = True,
                dtype_override: "str | torch.dtype | None" = None) -> tuple[list, dict]:
    """``(args, kwargs)`` of ``case`` on ``device``.

    ``dtype_override``: convert every floating tensor input to this dtype (complex ones to the
    complex dtype of the same precision) after generating it in its own dtype — same values,
    other dtype. ``replace_device=False`` keeps device strings (``cuda:0``) as written.
    """
    cast = override_caster(dtype_override) if dtype_override is not None else None
    return prepare(case, load_blob=load_blob).place(device, replace_device=replace_device, cast=cast)


def case_seed(case: dict) -> int:
    """The seed a case's data is generated from."""
    sig = case.get("signature")
    if case.get("seed") is None and not sig:
        return 0
    return data_seed(sig or "", case.get("seed"))


def prepare(case: dict, *, load_blob: Callable[[str], bytes] | None = None, bases: list | None = None) -> Prepared:
    """Generate a case's inputs on the CPU (see the module docstring for order and rules).

    ``bases``: one item per tensor leaf, ``(tensor, source)`` standing for the generated one (the
    input cache, casedb.run.inputcache) or None to generate it; MaterializeError if they do not fit."""
    gen = torch.Generator()
    gen.manual_seed(case_seed(case) & 0xFFFF_FFFF_FFFF_FFFF)
    b = _Builder(gen, case.get("dtype") or "float32", load_blob, bases)
    prepared = _prepare(case, b)
    if bases is not None and len(bases) != len(b.leaves):
        raise MaterializeError(f"{len(bases)} cached tensors for {len(b.leaves)} inputs")
    return prepared


def output_numel(case: dict, fn: Callable) -> int | None:
    """Elements the outputs of ``fn`` (the case's op) hold, from a call on fake tensors (sizes,
    no memory, no values): a factory op (``torch.full([20000, 20000], 1.0)``) or a broadcast
    makes far more than its inputs hold. None when fake tensors cannot tell (an op without a
    fake kernel, an output whose size depends on values)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    # torch logs a traceback at ERROR level when a meta kernel raises (histc over int32): here
    # that only means "size unknown", so it is kept off the run's output
    log = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, log.disabled = log.disabled, True
    try:
        # every tensor made in the mode is fake, a factory's explicit device="cpu" included
        with FakeTensorMode(), torch.no_grad():
            args, kwargs = _prepare(case, _ShapeBuilder(None, case.get("dtype") or "float32", None)).place("cpu")
            out = fn(*args, **kwargs)
            return sum(t.numel() for t in result_leaves(out) if isinstance(t, torch.Tensor))
    except Exception:  # whatever the op raises on fake tensors: the size is unknown
        return None
    finally:
        log.disabled = was_disabled


def shape_inputs(case: dict) -> tuple[list, dict]:
    """``(args, kwargs)`` of ``case`` on the CPU, uninitialized: made in the caller's fake tensor
    mode, sizes only (casedb.coverage traces what a case calls on them)."""
    return _prepare(case, _ShapeBuilder(None, case.get("dtype") or "float32", None)).place("cpu")


def result_leaves(x):
    """The tensors and Python scalars of a result (tuples, lists and dicts walked through)."""
    if isinstance(x, (list, tuple)):
        for i in x:
            yield from result_leaves(i)
    elif isinstance(x, dict):
        for i in x.values():
            yield from result_leaves(i)
    else:
        yield x


def _prepare(case: dict, b: "_Builder") -> Prepared:
    args = [b.input(spec, f"inputs[{i}]") for i, spec in enumerate(case.get("inputs") or ())]
    kwargs = {}
    attrs = case.get("attrs") or {}
    for k in sorted(attrs):
        v = attrs[k]
        if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in INPUT_KINDS:
            kwargs[k] = b.input(v, f"attrs.{k}", key=k)
        else:
            kwargs[k] = _value(v, key=k)
    if len(args) > 1 and type(args[1]) is TensorListLeaf and _is_indexing(case.get("op")):
        args[1].as_tuple = True  # x[i0, i1]: torch reads a list of index tensors as one index (deprecated)
    return Prepared(args, kwargs, b.leaves)


_INDEXING = {"torch.getitem", "torch.setitem", "operator.getitem", "operator.setitem", "operator.__getitem__",
             "operator.__setitem__", "torch.Tensor.__getitem__", "torch.Tensor.__setitem__"}


def _is_indexing(op) -> bool:
    return op in _INDEXING


def override_caster(dtype: "str | torch.dtype") -> Caster:
    """Caster for ``dtype_override``: floating → ``dtype``, complex → complex of that precision."""
    to = torch_dtype(dtype)
    cto = _COMPLEX_OF.get(to)

    def cast(dt: torch.dtype):
        if dt.is_complex:
            return cto
        if dt.is_floating_point:
            return to
        return None

    return cast


def upcast_caster(dtype: "str | torch.dtype") -> Caster:
    """Caster that widens floating (and complex) tensors narrower than ``dtype``; never narrows."""
    to = torch_dtype(dtype)
    cto = _COMPLEX_OF.get(to)

    def cast(dt: torch.dtype):
        if dt.is_complex:
            return cto if cto is not None and dt.itemsize < cto.itemsize else None
        if dt.is_floating_point and dt.itemsize < to.itemsize:
            return to
        return None

    return cast


def widen_dtype_keyword(op: str | None, kwargs: dict, cast: Caster) -> dict:
    """``kwargs`` with a floating ``dtype=`` widened by ``cast`` as the tensors are, for the upcast
    reference: ``softmax(x, dtype=torch.float32)`` then computes in float64 as its inputs do,
    where it would compute in float32 again and so measure the target against the CPU reference
    itself. A view's dtype reinterprets bits: kept."""
    dt = kwargs.get("dtype")
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point or "view" in str(op or ""):
        return kwargs
    to = cast(dt)
    return kwargs if to is None or to == dt else {**kwargs, "dtype": to}


_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}


@functools.lru_cache(maxsize=None)
def torch_dtype(name: "str | torch.dtype") -> torch.dtype:
    """``torch.dtype`` for a dtype name (canonical or any alias casedb accepts)."""
    if isinstance(name, torch.dtype):
        return name
    try:
        canon = dtypes_mod.canonical(name)
    except dtypes_mod.UnknownDtype as e:
        raise MaterializeError(str(e)) from None
    dt = getattr(torch, canon, None)
    if not isinstance(dt, torch.dtype):
        raise MaterializeError(f"dtype {name!r} is not available in this torch {torch.__version__}")
    return dt


# ------------------------------------------------------------------------------------ building

class _Builder:
    def __init__(self, gen: torch.Generator, case_dtype: str, load_blob, bases: list | None = None):
        self.gen = gen
        self.case_dtype = case_dtype
        self.load_blob = load_blob
        self.bases = bases
        self.leaves: list[TensorLeaf] = []

    def input(self, spec: Any, label: str, key: str | None = None):
        if not isinstance(spec, dict) or len(spec) != 1:
            raise MaterializeError(f"{label}: an input is one of {{{', '.join(INPUT_KINDS)}: ...}}, got {spec!r}")
        kind, body = next(iter(spec.items()))
        if kind == "tensor":
            return self.tensor(body, label)
        if kind == "value":
            return _value(body, key=key)
        if kind == "py":
            return _py(body)
        if kind == "tensor_list":
            return TensorListLeaf([self.list_item(t, f"{label}[{i}]") for i, t in enumerate(body)])
        if kind == "file":
            return self.tensor(body, label)
        raise MaterializeError(f"{label}: unknown input kind {kind!r} (known: {', '.join(INPUT_KINDS)})")

    def list_item(self, spec, label):
        if spec is None:
            return None
        if isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in ("tensor", "file"):
            spec = next(iter(spec.values()))
        return self.tensor(spec, label)

    def tensor(self, spec: dict, label: str) -> TensorLeaf:
        if not isinstance(spec, dict):
            raise MaterializeError(f"{label}: a tensor spec is a mapping with shape and dtype, got {spec!r}")
        dtype = torch_dtype(spec.get("dtype") or self.case_dtype)
        source = {"shape": list(spec.get("shape") or ()), "dtype": str(dtype).replace("torch.", "")}
        base = self.cached(dtype, source)
        if base is None:
            try:
                base = self.generate(spec, dtype, label, source)
            except MaterializeError:
                raise
            except (RuntimeError, TypeError, ValueError) as e:
                raise MaterializeError(f"{label}: cannot generate {spec!r}: {e}") from None
            if spec.get(value_ranges.SPECIALS):  # an extremal variant's NaN, inf, ±0, subnormals
                base = value_ranges.sprinkle(base)
        preset = spec.get("preset")
        if preset is not None and preset not in presets_mod.PRESETS:
            raise MaterializeError(f"{label}: {presets_mod.check_args(preset, {})}")
        leaf = TensorLeaf(base, preset, spec.get("preset_args"), source, spec.get("device_layout"))
        self.leaves.append(leaf)
        return leaf

    def cached(self, dtype: torch.dtype, source: dict) -> torch.Tensor | None:
        """The cached base of the next leaf (see prepare), None to generate it."""
        i = len(self.leaves)
        if self.bases is None or i >= len(self.bases) or self.bases[i] is None:
            return None
        base, done = self.bases[i]
        if base.dtype != dtype or list(base.shape) != source["shape"]:
            raise MaterializeError(f"cached input {i} is a {base.dtype} {list(base.shape)}, "
                                   f"not a {dtype} {source['shape']}")
        source.update(done)
        return base

    def generate(self, spec: dict, dtype: torch.dtype, label: str, source: dict) -> torch.Tensor:
        shape = tuple(spec.get("shape") or ())
        if "blob" in spec:
            source["blob"] = spec["blob"]
            if self.load_blob is None:
                raise MaterializeError(f"{label}: the tensor's values are in blob {spec['blob'][:12]}…, "
                                       "but no load_blob was given to read it")
            try:
                raw = self.load_blob(spec["blob"])
            except KeyError:
                raw = None
            if raw is None:
                raise MaterializeError(f"{label}: blob {spec['blob']} not found")
            return blobs.decode(raw, spec.get("shape", ()), dtype)
        if spec.get("data") is not None:
            source["data"] = spec["data"]
            t = torch.tensor(spec["data"], dtype=dtype)
            if "shape" not in spec:
                source["shape"] = list(t.shape)
            return t.reshape(shape) if "shape" in spec else t
        init = spec.get("init") or ("randn" if dtype.is_floating_point or dtype.is_complex else
                                    "rand" if dtype == torch.bool else "randint")
        make = _GEN.get(init)
        if make is None:
            raise MaterializeError(f"{label}: unknown init {init!r}; known: {', '.join(sorted(_GEN))}, data")
        source.update(init=init, init_args=spec.get("init_args") or {})
        return make(shape, dtype, source["init_args"], self.gen)


class _ShapeBuilder(_Builder):
    """Uninitialized tensors of the case's shapes and dtypes (for :func:`output_numel`, in a
    fake tensor mode: sizes only)."""

    def generate(self, spec: dict, dtype: torch.dtype, label: str, source: dict) -> torch.Tensor:
        return torch.empty(tuple(spec.get("shape") or ()), dtype=dtype)


# ------------------------------------------------------------------------------------ values

def _torch_object(text: str):
    obj = getattr(torch, text[6:], None)
    if isinstance(obj, (torch.dtype, torch.memory_format, torch.layout)):
        return obj
    return None


def is_device_string(text: str) -> bool:
    m = _DEVICE_RE.match(text)
    if not m:
        return False
    kind = m.group(1)
    return kind in _DEVICE_TYPES or kind == torch._C._get_privateuse1_backend_name()


def _value(v: Any, key: str | None = None, top: bool = True):
    if isinstance(v, str):
        if v.startswith("torch."):
            obj = _torch_object(v)
            if obj is not None:
                return obj
        if top and (key == "device" or is_device_string(v)):
            return DeviceLeaf(v)
        return v
    if isinstance(v, list):
        return [_value(x, top=False) for x in v]
    return v


@functools.lru_cache(maxsize=4096)
def _py(src: str):
    return parse_py_literal(src)
