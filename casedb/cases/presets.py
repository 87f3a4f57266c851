"""Layout presets: how a tensor input is re-laid out after it is generated and moved.

A preset turns a freshly generated tensor of the spec's ``shape`` into a view with the same
shape but another layout (non-contiguous, transposed, arbitrary strides). It runs *after* the
move to the target device, so the device sees the same layout the reference sees.

To add one, write ``f(tensor, **args) -> tensor`` and register it with ``@preset(...)``; the
manifest validator reads the allowed/required argument names from this registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Preset:
    name: str
    fn: Callable[..., Any]
    required: tuple[str, ...]
    optional: tuple[str, ...]
    doc: str


PRESETS: dict[str, Preset] = {}


def preset(name: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()):
    def register(fn):
        PRESETS[name] = Preset(name, fn, required, optional, (fn.__doc__ or "").strip())
        return fn

    return register


@preset("noncontig_slice", optional=("dim", "step"))
def noncontig_slice(t, dim: int = -1, step: int = 2):
    """Same shape, but a strided slice of a tensor `step` times larger along `dim`."""
    import torch

    if t.dim() == 0:
        raise ValueError("preset noncontig_slice needs a tensor with at least one dimension")
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"preset noncontig_slice: step must be an integer >= 1, got {step!r}")
    dim = _dim(dim, t.dim(), "noncontig_slice")
    big_shape = list(t.shape)
    big_shape[dim] *= step
    big = torch.zeros(big_shape, dtype=t.dtype, device=t.device)
    index = [slice(None)] * t.dim()
    index[dim] = slice(0, None, step)
    view = big[tuple(index)]
    view.copy_(t)
    return view


@preset("transpose_view", optional=("dim0", "dim1"))
def transpose_view(t, dim0: int = 0, dim1: int = 1):
    """Same shape, stored transposed: a transpose of a contiguous tensor of the swapped shape."""
    if t.dim() < 2:
        raise ValueError(f"preset transpose_view needs a tensor with at least two dimensions, got {t.dim()}")
    dim0, dim1 = _dim(dim0, t.dim(), "transpose_view"), _dim(dim1, t.dim(), "transpose_view")
    swapped = t.transpose(dim0, dim1).contiguous()
    return swapped.transpose(dim0, dim1)


@preset("strided", required=("stride",), optional=("storage_offset",))
def strided(t, stride, storage_offset: int = 0):
    """Exactly the given strides (as recorded by a trace), over a storage large enough for them."""
    import torch

    shape = list(t.shape)
    stride = list(stride)
    if len(stride) != len(shape):
        raise ValueError(f"preset strided: {len(stride)} strides for a {len(shape)}-d tensor of shape {shape}")
    if any(not isinstance(s, int) or s < 0 for s in stride) or storage_offset < 0:
        raise ValueError(f"preset strided: strides and storage_offset must be non-negative integers, "
                         f"got stride={stride}, storage_offset={storage_offset}")
    if any(s == 0 for s in shape):
        return t
    span = storage_offset + 1 + sum((n - 1) * abs(s) for n, s in zip(shape, stride))
    storage = torch.zeros(span, dtype=t.dtype, device=t.device)
    view = storage.as_strided(shape, list(stride), storage_offset)
    # Overlapping strides (e.g. expand, stride 0) cannot hold arbitrary values: copy what fits.
    if _overlaps(shape, stride):
        flat = t.reshape(-1)[: view.numel()]
        storage[storage_offset : storage_offset + flat.numel()] = flat[: span - storage_offset]
        return view
    view.copy_(t)
    return view


def contiguous_strides(shape) -> list[int]:
    out, step = [], 1
    for n in reversed(list(shape)):
        out.append(step)
        step *= max(int(n), 1)
    return out[::-1]


def layout(spec: dict) -> tuple[list[int], int]:
    """(strides, storage offset) a tensor spec runs with: its preset's (applied to a meta tensor),
    contiguous without one."""
    shape, name, args = list(spec["shape"]), spec.get("preset"), spec.get("preset_args") or {}
    if name == "strided":
        return list(args["stride"]), int(args.get("storage_offset", 0))
    if name:
        import torch

        view = PRESETS[name].fn(torch.empty(shape, device="meta"), **args)
        return list(view.stride()), int(view.storage_offset())
    return contiguous_strides(shape), 0


def storage_numel(spec: dict) -> int:
    """Elements of the storage a tensor spec's layout spans (its strides and offset: a 2-element
    ``strided`` view may span 10^8), at least its own; what a case's size caps count."""
    shape = list(spec.get("shape") or [])
    numel = math.prod(shape)
    if numel == 0 or not spec.get("preset"):
        return numel
    try:
        stride, offset = layout(spec)
        span = int(offset) + 1 + sum((int(n) - 1) * abs(int(s)) for n, s in zip(shape, stride))
    except Exception:  # a preset that cannot apply: the case's own error when it runs
        return numel
    return max(numel, span)


def _dim(d: int, ndim: int, name: str) -> int:
    if not isinstance(d, int) or not -ndim <= d < ndim:
        raise ValueError(f"preset {name}: dimension {d!r} is out of range for a {ndim}-d tensor")
    return d % ndim


def _overlaps(shape, stride) -> bool:
    dims = sorted((abs(s), n) for n, s in zip(shape, stride) if n > 1)
    reach = 1
    for s, n in dims:
        if s < reach:
            return True
        reach = s * n
    return False


def check_args(name: str, args: dict) -> str | None:
    """Return an error message if `name`/`args` are not a valid preset use, else None."""
    p = PRESETS.get(name)
    if p is None:
        return f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}"
    allowed = set(p.required) | set(p.optional)
    unknown = sorted(set(args) - allowed)
    if unknown:
        return f"preset {name!r} does not take {', '.join(unknown)}; it takes: {', '.join(sorted(allowed)) or 'no arguments'}"
    missing = [a for a in p.required if a not in args]
    if missing:
        return f"preset {name!r} needs {', '.join(missing)}"
    return None
