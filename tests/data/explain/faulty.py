"""Faulty dynamo backends for casedb explain's tests (``casedb run --import faulty.py --backend
explain_<bug>``): each runs the graph eagerly and is wrong under one condition only.

* ``explain_dtype``: outputs of graphs with a bfloat16 input are 6.25 % too large;
* ``explain_layout``: a graph with a non-contiguous input is off by one;
* ``explain_broadcast``: an add or mul whose inputs broadcast (an input of another shape than the
  output) is off by one;
* ``explain_k``: a matmul whose reduced length K is over 1024 accumulates in bfloat16, in chunks
  of 128 (error that grows with K);
* ``explain_lastdim``: an output whose last dim is not a multiple of 16 is off by one;
* ``explain_numel``: an output of more than 4096 elements is wrong past the 4096th (32-bit
  indexing of a narrow kind: the tail repeats the head).
"""

import re

import torch

K_LIMIT = 1024
NUMEL_LIMIT = 4096


def _targets(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")}


def _tensors(args):
    return [a for a in args if isinstance(a, torch.Tensor)]


def _low_k(a, b, dtype):
    acc = None
    for c in range(0, a.shape[-1], 128):
        part = (a[..., c:c + 128].double() @ b[..., c:c + 128, :].double()).to(torch.bfloat16)
        acc = part if acc is None else (acc + part)
    return acc.to(dtype)


def _bug(kind, gm, args, y):
    ts = _tensors(args)
    names = _targets(gm)
    if kind == "dtype" and any(t.dtype == torch.bfloat16 for t in ts):
        return y * 1.0625
    if kind == "layout" and any(not t.is_contiguous() for t in ts):
        return y + 1
    if kind == "broadcast" and any(re.search(r"\b(add|mul)\b", n) for n in names) and any(t.shape != y.shape for t in ts):
        return y + 1
    if kind == "k" and any("matmul" in n for n in names) and ts[0].shape[-1] > K_LIMIT:
        return _low_k(ts[0], ts[1], y.dtype)
    if kind == "lastdim" and y.dim() and y.shape[-1] % 16:
        return y + 1
    if kind == "numel" and y.numel() > NUMEL_LIMIT:
        flat = y.reshape(-1).clone()
        flat[NUMEL_LIMIT:] = flat[:flat.numel() - NUMEL_LIMIT]
        return flat.reshape(y.shape)
    return y


def _backend(kind):
    def compile_graph(gm, example_inputs):
        def run(*args):
            out = gm(*args)
            if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
                return type(out)([_bug(kind, gm, args, out[0]), *out[1:]])
            return out

        return run

    return compile_graph


for _kind in ("dtype", "layout", "broadcast", "k", "lastdim", "numel"):
    try:
        torch._dynamo.register_backend(_backend(_kind), name=f"explain_{_kind}")
    except Exception:  # registered by an earlier import of this file
        pass
