"""The value generators of a tensor spec's ``init`` (rand, randn, uniform, randint, arange, zeros,
ones, full, eye, xavier, cumsum_offsets): ``fn(shape, dtype, init_args, generator)``, seeded by the
caller (casedb.cases.materialize). Torch only: `casedb repro` copies them into its scripts."""

from __future__ import annotations

import math

import torch


_NATIVE_RAND = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
DRAW_CHUNK = 1 << 22  # float64 values drawn at a time (32 MiB): see _in_chunks


def _in_chunks(shape, dtype, draw):
    """``draw(size)`` (float64 values, the generator's next ones) cast to ``dtype``, as a tensor of
    ``shape``; a large one is drawn DRAW_CHUNK values at a time, so that it never exists in float64
    whole (a 1 G-element float32 input drawn at once took 12 GiB where it holds 4). The values are
    those of one draw: torch's CPU kernels draw ``rand`` serially and ``randn`` in blocks of 16,
    redrawing the last 16 when the count is not a multiple of 16, so every chunk but the last is a
    multiple of 16 and the last holds more than 16 (tests/cases/test_generators_memory.py checks it)."""
    n = math.prod(shape)
    if n <= DRAW_CHUNK + 16:
        return draw(shape).to(dtype)
    out = torch.empty(shape, dtype=dtype)
    flat, start = out.view(-1), 0
    while n - start > DRAW_CHUNK + 16:
        flat[start:start + DRAW_CHUNK] = draw((DRAW_CHUNK,))
        start += DRAW_CHUNK
    flat[start:] = draw((n - start,))
    return out


def _component(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype == torch.complex64 else torch.float16 if dtype == torch.complex32 else torch.float64


def _ints(shape, dtype, low, high, g):
    if dtype in _NATIVE_RAND or not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(int(low), int(high), shape, generator=g, dtype=dtype)
    # float8 and complex: torch.randint cannot make them directly
    return torch.randint(int(low), int(high), shape, generator=g, dtype=torch.int64).to(dtype)


def _is_int(dtype):
    return not (dtype.is_floating_point or dtype.is_complex) and dtype != torch.bool


def _rand(shape, dtype, a, g):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.bool)
    if _is_int(dtype):
        return _ints(shape, dtype, 0, 10, g)
    if dtype in _NATIVE_RAND:
        return torch.rand(shape, generator=g, dtype=dtype)
    if dtype.is_complex:
        c = _component(dtype)
        return torch.view_as_complex(torch.rand(shape + (2,), generator=g, dtype=c)).to(dtype)
    return torch.rand(shape, generator=g, dtype=torch.float32).to(dtype)


def _randn(shape, dtype, a, g):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.bool)
    if _is_int(dtype):
        return _ints(shape, dtype, 0, 10, g)
    std, mean = a.get("std", 1), a.get("mean", 0)

    def draw(size):
        t = torch.randn(size, generator=g, dtype=torch.complex128 if dtype.is_complex else torch.float64)
        if std != 1:
            t.mul_(std)
        if mean != 0:
            t.add_(mean)
        return t

    return draw(shape).to(dtype) if dtype.is_complex else _in_chunks(shape, dtype, draw)


def _uniform(shape, dtype, a, g):
    low, high = a.get("low", 0.0), a.get("high", 1.0)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.bool)
    if _is_int(dtype):
        lo = math.floor(low)
        return _ints(shape, dtype, lo, max(math.ceil(high), lo + 1), g)

    def draw(size):
        t = torch.rand(size, generator=g, dtype=torch.float64)
        if high - low != 1:
            t.mul_(high - low)
        if low != 0:
            t.add_(low)
        return t

    if dtype.is_complex:
        return torch.view_as_complex(draw(shape + (2,))).to(dtype)
    return _in_chunks(shape, dtype, draw)


def _randint(shape, dtype, a, g):
    low = a.get("low", 0)
    high = a.get("high", 2 if dtype == torch.bool else 10)
    return _ints(shape, dtype, low, high, g)


def _arange(shape, dtype, a, g):
    start, step = a.get("start", 0), a.get("step", 1)
    wide = dtype.is_floating_point or dtype.is_complex or isinstance(start, float) or isinstance(step, float)
    t = torch.arange(math.prod(shape), dtype=torch.float64 if wide else torch.int64)
    if step != 1:
        t.mul_(step)
    if start != 0:
        t.add_(start)
    return t.reshape(shape).to(dtype)


def _zeros(shape, dtype, a, g):
    return torch.zeros(shape, dtype=dtype)


def _ones(shape, dtype, a, g):
    return torch.ones(shape, dtype=dtype)


def _full(shape, dtype, a, g):
    return torch.full(shape, a["fill_value"], dtype=dtype)


def _eye(shape, dtype, a, g):
    """The identity matrix (a square 2-d shape; casedb.cases.spec checks it)."""
    return torch.eye(shape[0], shape[1], dtype=dtype)


def _xavier(shape, dtype, a, g):
    """Glorot uniform, gain 1 (``torch.nn.init.xavier_uniform_``): U(-b, b), b = sqrt(6 / (fan_in +
    fan_out)), drawn from the case's generator in float64."""
    field = math.prod(shape[2:])
    bound = math.sqrt(6.0 / (shape[1] * field + shape[0] * field))

    def draw(size):
        return torch.rand(size, generator=g, dtype=torch.float64).mul_(2 * bound).sub_(bound)

    return _in_chunks(shape, dtype, draw)


def _cumsum_offsets(shape, dtype, a, g):
    """Group end offsets for ``torch._grouped_mm``: ``total`` rows dealt at random to ``shape[0]``
    groups, cumulated (non-decreasing, the last is ``total``)."""
    groups = shape[0]
    picks = torch.randint(0, max(groups, 1), (int(a["total"]),), generator=g, dtype=torch.int64)
    return torch.bincount(picks, minlength=groups)[:groups].cumsum(0).reshape(shape).to(dtype)


GENERATORS = {"rand": _rand, "randn": _randn, "uniform": _uniform, "randint": _randint,
        "arange": _arange, "zeros": _zeros, "ones": _ones, "full": _full, "eye": _eye, "xavier": _xavier,
        "cumsum_offsets": _cumsum_offsets}


