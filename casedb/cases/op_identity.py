"""Which operator a name spells, whatever the front end wrote: the one table of op spellings.

A scan records what model code calls (``torch.nn.functional.linear``, ``torch.Tensor.mul``,
``torch.getitem``), a Kineto or Execution Trace what the dispatcher ran
(``torch.ops.aten.linear.default``, ``torch.ops.aten.mul.Tensor``, ``aten::slice``), another tracer
a compiled graph (``torch.truediv``). Two levels of sameness, both here:

* :func:`op_name` — the operator a name spells, for ops whose arguments the two spellings lay out
  alike: namespaces and the ATen overload dropped, Python operators and aliases to the ATen name
  (``torch.Tensor.__mul__``, ``torch.mul``, ``aten::mul.Scalar`` are all ``mul``). A case's call
  identity (:mod:`casedb.cases.call_identity`) is built on it: same name, same arguments, one call.
* :data:`OTHER_LAYOUT` — calls that are the same work with their arguments laid out otherwise
  (``x[1:3]`` is ``torch.getitem`` with a slice, ``aten::slice`` with dim/start/end/step): never
  one case, but the same operator when op lists are compared (``casedb scan --compare``).

Torch-free: the scan's comparison and the import's dedupe read the same table.
"""

from __future__ import annotations

# Namespaces stripped from a name before its operator is taken (the longest first).
PREFIXES = ("torch.ops.aten.", "torch.nn.functional.", "torch.functional.", "torch.Tensor.", "torch.special.",
            "torch.linalg.", "operator.", "_operator.", "torch.")
# Spellings of one operator whose arguments come in the ATen op's order: Python operators (the
# operator module's names and the dunders), aliases and in-place dunders.
SAME_OP = {
    "div": ("truediv", "__truediv__", "divide", "true_divide"),
    "div_": ("itruediv", "__itruediv__"),
    "floor_divide": ("floordiv", "__floordiv__"),
    "sub": ("__sub__", "subtract"), "sub_": ("isub", "__isub__"),
    "add": ("__add__",), "add_": ("iadd", "__iadd__"),
    "mul": ("__mul__", "multiply"), "mul_": ("imul", "__imul__"),
    "eq": ("__eq__",), "ne": ("__ne__", "not_equal"), "lt": ("__lt__", "less"), "le": ("__le__", "less_equal"),
    "gt": ("__gt__", "greater"), "ge": ("__ge__", "greater_equal"),
    "bitwise_and": ("and_", "__and__"), "bitwise_or": ("or_", "__or__"),
    "bitwise_not": ("invert", "__invert__", "inv"), "bitwise_xor": ("xor", "__xor__"),
    "neg": ("__neg__", "negative"), "pow": ("__pow__",), "matmul": ("__matmul__",),
    "remainder": ("mod", "__mod__"), "abs": ("__abs__", "absolute"),
    "getitem": ("__getitem__",), "setitem": ("__setitem__",),
}
# The reflected operators (``2 - x`` is ``x.__rsub__(2)``: the operands the other way round) and the
# in-place ``&=`` / ``|=``: the same op when op lists are compared, never one call.
REFLECTED = {"div": ("__rtruediv__",), "floor_divide": ("__rfloordiv__",), "sub": ("__rsub__", "rsub"),
             "add": ("__radd__",), "mul": ("__rmul__",), "bitwise_and": ("__rand__", "__iand__"),
             "bitwise_or": ("__ror__", "__ior__"), "pow": ("__rpow__",), "remainder": ("__rmod__",)}
# The same work, arguments laid out otherwise: operator (as op_name spells it) -> the ATen ops a
# trace records for it. One case each (their inputs differ), one operator for --compare.
OTHER_LAYOUT = {
    "getitem": ("slice", "select", "unsqueeze", "alias"),  # (aten::index is getitem already: operator_of)
    "setitem": ("index_put_", "index_put", "copy_", "fill_", "masked_fill_", "slice_scatter", "select_scatter"),
    "tensor": ("lift_fresh", "lift_fresh_copy", "scalar_tensor"),
    # x.float() is aten::to(x, torch.float32)
    **{method: ("to", "_to_copy") for method in ("float", "double", "half", "bfloat16", "int", "long", "short",
                                                 "bool", "byte", "char", "type_as")},
}
_ALIAS = {alias: key for key, aliases in SAME_OP.items() for alias in aliases}
_REFLECTED = {alias: key for key, aliases in REFLECTED.items() for alias in aliases}
_STANDS_FOR: dict[str, tuple[str, ...]] = {}
for _key, _atens in OTHER_LAYOUT.items():
    for _aten in _atens:
        _STANDS_FOR[_aten] = _STANDS_FOR.get(_aten, ()) + (_key,)


def short_name(name: str) -> str:
    """The name without its namespace (and an ATen name without its overload)."""
    short = name
    for prefix in PREFIXES:
        if short.startswith(prefix):
            short = short[len(prefix):]
            break
    if name.startswith("torch.ops.aten."):
        short = short.split(".", 1)[0]
    return short


def op_name(name: str) -> str:
    """The operator ``name`` spells, for calls whose arguments its spellings lay out alike
    (``torch.Tensor.__mul__``, ``torch.mul`` and ``torch.ops.aten.mul.Scalar`` are ``mul``;
    ``torch.ops.mylib.op.default`` keeps its namespace)."""
    if name.startswith("torch.ops.") and not name.startswith("torch.ops.aten."):
        return name.rsplit(".", 1)[0] if name.count(".") > 3 else name
    for space in ("linalg", "special"):  # ATen's names of torch.linalg.norm, torch.special.erf
        if name.startswith(f"torch.{space}."):
            return f"{space}_{name[len(space) + 7:]}"
    short = short_name(name)
    return _ALIAS.get(short, short)


def operator_of(name: str) -> str:
    """The operator ``name`` spells when op lists are compared: :func:`op_name` with the reflected
    operators folded in (``torch.Tensor.__rsub__`` is ``sub``; ``torch.Tensor.__getitem__`` and
    ``aten::index`` are ``getitem``)."""
    short = short_name(name)
    short = _ALIAS.get(short, short)
    short = _REFLECTED.get(short, short)
    return "getitem" if short == "index" else short


def stands_for(operator: str) -> tuple[str, ...]:
    """The operators (:func:`operator_of`) a trace's ``operator`` may be the work of, its arguments
    laid out otherwise (:data:`OTHER_LAYOUT`: ``slice`` -> ``getitem``, ``to`` -> ``float`` ...)."""
    return _STANDS_FOR.get(operator, ())
