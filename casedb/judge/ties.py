"""Index outputs whose order among equal values an op leaves open.

``sort`` and ``argsort`` without ``stable=True`` and ``topk`` may put the indices of equal
values in any order, and ``topk`` may take any of the values tied at its k-th place: CUDA's
radix sort of granite4h's expert ids (int64, many repeats) returns another order than the CPU's
for 99 % of the elements, its ``topk`` of gpt-oss's bf16 router logits other experts among
tied ones for 1 %, and both are right. Before a result is compared, :func:`canonical` puts the
indices of each run of equal selected values (``input`` gathered at the indices) in ascending
order, on each side alike; a ``topk`` whose indices are distinct and select its values becomes
the stable choice (the lowest indices among ties). Wrong indices stay wrong: an index that
selects another value, a repeated or a missing one changes the result.
"""

from __future__ import annotations

import torch

IN_REPRO = True  # copied whole into every repro script (casedb.read.repro)

TIE_OPS = frozenset({"torch.sort", "torch.Tensor.sort", "torch.argsort", "torch.Tensor.argsort",
                     "torch.topk", "torch.Tensor.topk"})
_DIM = {"torch.topk": 2, "torch.Tensor.topk": 2}  # where dim is passed by position (else 1)


def canonical(op: str | None, out, args, kwargs):
    """``out`` with its indices in the canonical order (see the module docstring); ``out``
    itself for other ops, stable sorts and anything unexpected."""
    if op not in TIE_OPS or kwargs.get("stable") or not args or not isinstance(args[0], torch.Tensor):
        return out
    pos = _DIM.get(op, 1)
    dim = kwargs.get("dim", args[pos] if len(args) > pos else -1)
    argsort = op.endswith("argsort")
    idx = out if argsort else out[1] if isinstance(out, tuple) and len(out) == 2 else None
    x = args[0]
    if not isinstance(idx, torch.Tensor) or not isinstance(dim, int) or idx.dim() != x.dim() or idx.dim() == 0:
        return out
    selected = x.gather(dim, idx)
    ordered = _ordered(selected, idx, dim)
    if argsort:
        return ordered
    if op.endswith("topk") and _valid_choice(selected, out[0], idx, dim):
        largest = kwargs.get("largest", args[3] if len(args) > 3 else True)
        stable = torch.sort(x, dim=dim, descending=bool(largest), stable=True).indices
        ordered = stable.narrow(dim, 0, idx.shape[dim]).to(idx.dtype)
    return type(out)((out[0], ordered)) if type(out) is not tuple else (out[0], ordered)


def _valid_choice(selected: torch.Tensor, values, idx: torch.Tensor, dim: int) -> bool:
    """The indices select ``values`` (NaN selects NaN) and none repeats."""
    if not isinstance(values, torch.Tensor) or values.shape != selected.shape:
        return False
    same = (selected == values) | (torch.isnan(selected) & torch.isnan(values)) if values.is_floating_point() \
        else selected == values
    s = torch.sort(idx.movedim(dim, -1), -1).values
    return bool(same.all()) and not bool((s[..., 1:] == s[..., :-1]).any())


def _ordered(values: torch.Tensor, idx: torch.Tensor, dim: int) -> torch.Tensor:
    v, i = values.movedim(dim, -1), idx.movedim(dim, -1)
    n = i.shape[-1]
    starts = torch.ones(v.shape, dtype=torch.bool, device=v.device)
    same = v[..., 1:] == v[..., :-1]
    if v.is_floating_point() or v.is_complex():
        same |= torch.isnan(v[..., 1:]) & torch.isnan(v[..., :-1])
    starts[..., 1:] = ~same
    run = torch.cumsum(starts.to(torch.int64), -1)
    # runs keep their places (their numbers grow along the dim); within one, indices ascend
    key = torch.sort(run * n + i.to(torch.int64), -1).values
    return (key - run * n).to(idx.dtype).movedim(-1, dim)
