"""Cached inputs: the generated tensors of a case whose inputs are expensive to build, kept in the
reference cache's folder (:mod:`casedb.run.refcache`: same cap, LRU eviction and integrity rules)
so that a rerun does not draw them again.

Which cases: those whose tensors drawn from the case's generator (every ``init`` but the
deterministic ``arange``, ``zeros``, ``ones``, ``full``, ``eye``) hold at least
:data:`MIN_NUMEL` elements together. Elements, not a measured time: the rule gives the same cache
on every machine and under any load, and drawing is what costs (``randn`` is drawn in float64,
serially: ~26 M elements/s on the development machine, so 1 M elements are ~40 ms, where reading
them back costs a few ms); smaller cases would fill the folder with files that save nothing.

What is kept: for each such tensor its generated ``base`` (after an extremal variant's specials
are sprinkled in) and its ``source``; tensors from a blob, from literal data or from a
deterministic init are built again (they take no draw from the generator, so the others' bits do
not depend on them). Layout presets are applied when the inputs are placed, as always; the saved
bases keep their dtype, shape, strides, storage offset and storage sharing (``torch.save``).

A file is a ``torch.save`` archive (loaded with ``mmap=True, weights_only=True``: the pages are
read as the op reads them and a write goes to a private copy, never to the file) holding a JSON
``meta`` (each tensor's source, dtype, shape, strides and offset) and the digest of that meta and
of every storage's bytes — in the cache, an HMAC sealed to the entry's name under the user's key
(``seal``: :mod:`casedb.run.cachekey`), else a SHA-256; a file whose digest or layout does not
match is :class:`Corrupt`. :func:`max_file_bytes` bounds what a case's file can take, so that no
larger file is read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Callable

MIN_NUMEL = 1 << 20
SUFFIX = ".in"
# inits that draw nothing from the case's generator: rebuilt, never cached
DETERMINISTIC = frozenset({"arange", "zeros", "ones", "full", "eye"})


class Corrupt(ValueError):
    """A cached inputs file that does not load or whose digest or layout does not match."""


def _drawn(leaf) -> bool:
    init = leaf.source.get("init")
    return init is not None and init not in DETERMINISTIC


def qualifies(prepared) -> bool:
    """Whether the inputs of ``prepared`` are worth caching (see the module docstring)."""
    return sum(leaf.base.numel() for leaf in prepared.leaves if _drawn(leaf)) >= MIN_NUMEL


def drawn_bytes(prepared) -> int:
    """The bytes of the drawn bases of ``prepared``: about what its file takes."""
    return sum(leaf.base.untyped_storage().nbytes() for leaf in prepared.leaves if _drawn(leaf) and _plain(leaf.base))


def _plain(t) -> bool:
    import torch

    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized
            and not t.is_conj() and not t.is_neg() and not t.requires_grad)


def _layout(t) -> list:
    return [str(t.dtype), list(t.shape), list(t.stride()), t.storage_offset()]


def max_file_bytes(case: dict) -> int:
    """The most a cached inputs file of ``case`` can take: its tensors' bytes (a generated base
    holds its shape's elements), twice, plus room for the archive's records."""
    from casedb.cases import marks

    specs = list(marks.iter_tensors(case.get("inputs") or [], case.get("attrs") or {}))
    data = sum(math.prod(t.get("shape") or []) * _itemsize(t.get("dtype") or case.get("dtype")) for t in specs)
    return 2 * data + 8192 * len(specs) + (1 << 20)


def _itemsize(name) -> int:
    import torch

    dtype = getattr(torch, str(name), None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 16  # (unknown: the widest)


def _digest(meta: str, tensors: list, seal: Callable | None = None) -> str:
    """The digest (``seal()``, else SHA-256) of ``meta`` and of each distinct storage's bytes, in
    order of first use."""
    import torch

    h = seal() if seal is not None else hashlib.sha256()
    h.update(meta.encode())
    seen = set()
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() in seen or s.nbytes() == 0:
            continue
        seen.add(s.data_ptr())
        h.update(torch.empty(0, dtype=torch.uint8).set_(s).numpy())
    return h.hexdigest()


def write(path, prepared, seal: Callable | None = None) -> bool:
    """Save the drawn bases of ``prepared`` to ``path`` (a file name or a binary file), digested
    with ``seal`` (see :func:`_digest`); False when one is not a plain CPU tensor."""
    import torch

    tensors, leaves = [], []
    for leaf in prepared.leaves:
        if not _drawn(leaf):
            leaves.append(None)
            continue
        if not _plain(leaf.base):
            return False
        tensors.append(leaf.base)
        leaves.append({"source": leaf.source, "layout": _layout(leaf.base)})
    meta = json.dumps(leaves)
    torch.save({"meta": meta, "digest": _digest(meta, tensors, seal), "tensors": tensors}, path)
    return True


def read(path, seal: Callable | None = None) -> list:
    """The bases saved in ``path`` (a file name, memory-mapped, or a binary file), one per leaf:
    ``(tensor, source)`` or None (build it again); Corrupt unless its digest (``seal``) matches."""
    try:
        return _read(path, seal)
    except Corrupt:
        raise
    except Exception as e:  # a file that is not this format, cut short, or not a torch archive
        raise Corrupt(f"unreadable: {type(e).__name__}: {e}") from None


def _read(path, seal) -> list:
    import hmac

    import torch

    saved = torch.load(path, mmap=isinstance(path, (str, os.PathLike)), weights_only=True)
    meta, tensors = saved["meta"], saved["tensors"]
    leaves = json.loads(meta)
    if len(tensors) != sum(x is not None for x in leaves):
        raise Corrupt("not a cached inputs file")
    if not isinstance(saved["digest"], str) or not hmac.compare_digest(saved["digest"], _digest(meta, tensors, seal)):
        raise Corrupt("checksum mismatch")
    found, it = [], iter(tensors)
    for x in leaves:
        if x is None:
            found.append(None)
            continue
        t = next(it)
        if _layout(t) != x["layout"] or not isinstance(x["source"], dict):
            raise Corrupt("a tensor's layout does not match its record")
        found.append((t, x["source"]))
    return found
