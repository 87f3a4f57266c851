"""The blob codec: a tensor's values as raw little-endian bytes of the contiguous tensor in its
own dtype (bool as one byte). Blobs are stored once by sha256 (``blobs`` table).

:func:`decode` is copied verbatim into ``casedb repro`` scripts, so it uses torch, math, io and
sys only.
"""

from __future__ import annotations

import io
import math
import sys


def encode(t) -> bytes:
    """The blob bytes of a tensor."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    size, complex_ = t.element_size(), t.dtype.is_complex
    t = t.reshape(-1).view(torch.uint8)
    if sys.byteorder == "big" and size > 1:  # the format is little-endian everywhere
        part = size // 2 if complex_ else size
        t = t.view(-1, part).flip(1).reshape(-1)
    return t.numpy().tobytes()


def decode(raw: bytes, shape, dtype):
    """The tensor of a blob (``dtype`` a torch.dtype); a ``torch.save`` file is accepted too."""
    import torch

    shape = tuple(shape)
    n = math.prod(shape)
    size = dtype.itemsize
    if len(raw) != n * size:
        if raw[:2] == b"PK":  # a torch.save file rather than raw bytes
            t = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
            if isinstance(t, torch.Tensor) and tuple(t.shape) == shape:
                return t.to(dtype)
        raise ValueError(f"blob has {len(raw)} bytes but a {dtype} tensor of shape {list(shape)} needs {n * size}")
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if sys.byteorder == "big" and size > 1:
        part = size // 2 if dtype.is_complex else size
        t = t.view(-1, part).flip(1).reshape(-1)
    return t.view(dtype).reshape(shape)
