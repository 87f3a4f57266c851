"""A case's call in the terms of the RFC implementation's model-ops runner, for the spyre-v2 export.

Their runner looks an item's ``name`` up in its op table (``spyre_op_table.yaml`` here, with its
source) and silently drops a name it lacks; it calls the entry as ``fn(input, *args, **kwargs)``.
So casedb's spelling becomes theirs (``torch.Tensor.transpose`` -> ``torch.transpose``,
``torch.einsum`` -> ``torch.functional.einsum``, ``torch.nn.functional.conv1d`` -> ``torch.conv1d``)
and the arguments the form their entry takes: ``torch.reshape``'s sizes as one tuple,
``Tensor.to``'s dtype as ``kwargs: {dtype: ...}`` (a positional string is a device to them),
``clamp_``'s bounds as keywords, tensor keyword arguments of layer_norm, batch_norm and
scaled_dot_product_attention positional (their older loader passes keyword tensors unbuilt).
A call with no such form is ``None``: the export leaves it out and says why.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("spyre_op_table.yaml")
TENSOR_KINDS = ("tensor", "tensor_list", "file")

# casedb's spelling -> theirs, where the entry means the same call
ALIASES = {
    "torch.Tensor.__and__": "torch.__and__", "torch.Tensor.__eq__": "torch.__eq__",
    "torch.Tensor.__floordiv__": "torch.floordiv", "torch.Tensor.__invert__": "torch.invert",
    "torch.Tensor.__or__": "torch.bitwise_or", "torch.Tensor.__getitem__": "torch.getitem",
    "torch.Tensor.index_add": "torch.index_add", "torch.Tensor.index_add_": "torch.index_add",
    "torch.einsum": "torch.functional.einsum", "torch.meshgrid": "torch.functional.meshgrid",
    "torch.greater": "torch.gt", "torch.nn.functional.conv1d": "torch.conv1d",
    "torch.nn.functional.conv2d": "torch.conv2d",
}
# their entries that wrap a Tensor method with required dims (x.squeeze(dim), x.transpose(dim0, dim1))
DIMS = {"torch.squeeze": 1, "torch.unsqueeze": 1, "torch.transpose": 2}
# the positional parameters (name, default) of ops whose tensors casedb may hold as keywords
POSITIONAL = {
    "torch.nn.functional.layer_norm": (("normalized_shape", None), ("weight", None), ("bias", None), ("eps", 1e-05)),
    "torch.nn.functional.batch_norm": (("running_mean", None), ("running_var", None), ("weight", None),
                                       ("bias", None), ("training", False), ("momentum", 0.1), ("eps", 1e-05)),
    "torch.nn.functional.scaled_dot_product_attention": (("key", None), ("value", None), ("attn_mask", None),
                                                         ("dropout_p", 0.0), ("is_causal", False), ("scale", None)),
}


@lru_cache(maxsize=1)
def table() -> frozenset:
    """The op names their runner knows."""
    return frozenset(str(n) for n in yaml.safe_load(TABLE.read_text())["names"])


def source() -> dict:
    return dict(yaml.safe_load(TABLE.read_text())["source"])


def their_name(op: str) -> str | None:
    """Their spelling of ``op``, None when their table has none."""
    names = table()
    if op in ALIASES:
        return ALIASES[op]
    if op in names:
        return op
    if op.startswith("torch.Tensor.") and "torch." + op.rsplit(".", 1)[1] in names:
        return "torch." + op.rsplit(".", 1)[1]
    return None


def their_call(op: str, args: list, kwargs: dict) -> tuple[str, list, dict] | str:
    """(their name, args, kwargs) of a call written as v2 items (``{tensor: ...}``, ``{value: ...}``),
    or why their runner cannot make it."""
    name = their_name(op)
    if name is None:
        return f"{op} is not in their op table ({source()['path']}); their runner would drop it"
    args, kwargs = list(args), dict(kwargs)
    if name == "torch.reshape" and len(args) >= 2 and all(_int_value(a) for a in args[1:]):
        args = [args[0], {"value": [a["value"] for a in args[1:]]}]
    elif name == "torch.to":
        for a in list(args[1:]):
            if isinstance(a.get("value"), str) and a["value"].startswith("torch.") and "dtype" not in kwargs:
                args.remove(a)
                kwargs["dtype"] = a["value"]
    elif name == "torch.clamp_" and len(args) > 1:
        kwargs.update({k: a.get("value") for k, a in zip(("min", "max"), args[1:3])})
        args = args[:1]
    elif name == "torch.repeat_interleave" and len(args) > 2:
        kwargs["dim"], args = args[2].get("value"), args[:2]
    elif name in DIMS and len(args) - 1 + len(kwargs) < DIMS[name]:
        return f"{op} without its dim: their entry needs it"
    if op in POSITIONAL and any(_is_tensor(v) for v in kwargs.values()):
        args, kwargs = _positional(op, args, kwargs)
    return name, args, kwargs


def _positional(op: str, args: list, kwargs: dict) -> tuple[list, dict]:
    """Tensor keywords moved into their positions (the parameters between filled with defaults)."""
    params = POSITIONAL[op][len(args) - 1:]
    at = [i for i, (p, _) in enumerate(params) if _is_tensor(kwargs.get(p))]
    if not at:  # a tensor keyword their signature has no position for: left as a keyword
        return args, kwargs
    last = max(at)
    out = list(args)
    for p, default in params[:last + 1]:
        value = kwargs.pop(p, {"value": default})
        out.append(value if isinstance(value, dict) and any(k in value for k in TENSOR_KINDS + ("value",))
                   else {"value": value})
    return out, kwargs


def _is_tensor(v) -> bool:
    return isinstance(v, dict) and any(k in v for k in TENSOR_KINDS)


def _int_value(a) -> bool:
    return isinstance(a, dict) and isinstance(a.get("value"), int) and not isinstance(a["value"], bool)
