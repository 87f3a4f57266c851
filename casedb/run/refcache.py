"""The reference cache: a case's CPU reference result (and its high-precision reference), kept on
disk so that a rerun pays only for the target.

For a given case (its op, inputs, seed — an extremal variant's rewritten inputs included), torch
version, CPU capability (``torch.backends.cpu.get_cpu_capability()``: the kernels dispatched),
torch thread count (a parallel reduction splits its sums by threads), reference dtype and
version of the code that builds inputs and calls the reference, the reference is the same
tensor: :func:`key` hashes all of them, and an entry is one file named by that hash in a folder
beside the DB (``<db>.refcache/``, :func:`beside`).

Safe to read: tensors go through ``torch.save`` and come back through ``torch.load(...,
weights_only=True)`` (no pickle of arbitrary objects); the structure around them (tuples, dicts,
``torch.return_types``, Python scalars, dtypes) is JSON. Each file starts with the SHA-256 of the
rest; a file that does not match, or does not load, is a miss and is deleted. Writes go to a
temporary file renamed into place, so a reader never sees half a file.

Bounded: at most ``max_bytes`` (default :data:`DEFAULT_MAX_BYTES`, env
``CASEDB_REFERENCE_CACHE_BYTES``, e.g. ``500M``), the least recently used entries (a hit touches
its file) evicted first. Results that are not values (random or uninitialized outputs, compared
on metadata only) are never cached: :mod:`casedb.run.execute` decides what it offers.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
from pathlib import Path

from casedb.errors import CasedbError

DEFAULT_MAX_BYTES = 2 * 2**30
MAX_BYTES_ENV = "CASEDB_REFERENCE_CACHE_BYTES"
FORMAT = 1                      # of the files: a new one misses every old entry
SUFFIX = ".ref"
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
# the code a cached reference depends on besides torch: how inputs are built and the reference called
_CODE = ("cases/materialize.py", "cases/ops.py", "cases/dtypes.py", "run/execute.py", "run/refcache.py")


class Uncacheable(Exception):
    """A result holding something the cache does not store (a sparse tensor, an arbitrary object)."""


def beside(db_path: str | os.PathLike) -> Path:
    """The cache folder of a DB: ``<db>.refcache`` next to it."""
    p = Path(db_path)
    return p.with_name(p.name + ".refcache")


def parse_bytes(text: str | int | None) -> int:
    """``"2G"``, ``"500M"``, ``"1048576"`` -> bytes (None: the default)."""
    if text is None or text == "":
        return DEFAULT_MAX_BYTES
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise CasedbError(f"{MAX_BYTES_ENV}: give a size in bytes, or with K, M, G or T (e.g. 2G), not {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


_code_version: str | None = None


def code_version() -> str:
    global _code_version
    if _code_version is None:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        for rel in _CODE:
            h.update((root / rel).read_bytes())
        _code_version = h.hexdigest()[:16]
    return _code_version


def environment() -> dict:
    """What, besides the case, decides a CPU reference's bits."""
    import torch

    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "code": code_version(), "format": FORMAT}


def key(case: dict, part: str, dtype: str | None = None) -> str:
    """The entry name of ``part`` ("reference" or "hi") of ``case`` computed in ``dtype``."""
    text = json.dumps({"case": case, "part": part, "dtype": dtype, "env": environment()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------------------------ encoding

def _encode(x, tensors: list):
    import torch

    if isinstance(x, torch.Tensor):
        if (x.device.type != "cpu" or x.layout != torch.strided or x.is_quantized or x.is_conj() or x.is_neg()
                or x.requires_grad or type(x) is not torch.Tensor):
            raise Uncacheable(f"a {x.layout} {x.dtype} tensor on {x.device}")
        tensors.append(x)
        return {"t": len(tensors) - 1}
    if x is None or isinstance(x, (bool, int, float, str)):
        return {"v": x}
    if isinstance(x, complex):
        return {"c": [x.real, x.imag]}
    if isinstance(x, torch.dtype):
        return {"dt": str(x).replace("torch.", "")}
    if type(x) is dict and all(isinstance(k, str) for k in x):
        return {"d": [[k, _encode(v, tensors)] for k, v in x.items()]}
    if type(x) in (list, tuple, torch.Size):
        return {{list: "l", tuple: "u", torch.Size: "z"}[type(x)]: [_encode(v, tensors) for v in x]}
    name = type(x).__name__
    if isinstance(x, tuple) and type(x).__module__ == "torch.return_types" and hasattr(torch.return_types, name):
        return {"s": name, "v": [_encode(v, tensors) for v in x]}
    raise Uncacheable(f"a {type(x).__module__}.{name}")


def _decode(x, tensors: list):
    import torch

    tag, value = next(iter(x.items()))
    if tag == "t":
        return tensors[value]
    if tag == "v":
        return value
    if tag == "c":
        return complex(*value)
    if tag == "dt":
        return getattr(torch, value)
    if tag == "d":
        return {k: _decode(v, tensors) for k, v in value}
    items = [_decode(v, tensors) for v in x.get("v" if tag == "s" else tag)]
    if tag == "l":
        return items
    if tag == "u":
        return tuple(items)
    if tag == "z":
        return torch.Size(items)
    if tag == "s":  # a torch.return_types structseq, looked up by name there only
        return getattr(torch.return_types, x["s"])(items)
    raise ValueError(f"unknown tag {tag!r}")


def dumps(value: dict) -> bytes:
    """``value`` (str keys; results as casedb.run.execute keeps them) as file bytes: digest + payload."""
    import torch

    tensors: list = []
    meta = json.dumps(_encode(value, tensors))
    buf = io.BytesIO()
    torch.save({"meta": meta, "tensors": tensors}, buf)
    payload = buf.getvalue()
    return hashlib.sha256(payload).digest() + payload


def loads(data: bytes) -> dict:
    """The value of file bytes; ValueError when the digest does not match or it does not load."""
    import torch

    digest, payload = data[:32], data[32:]
    if len(data) < 32 or hashlib.sha256(payload).digest() != digest:
        raise ValueError("checksum mismatch")
    try:
        saved = torch.load(io.BytesIO(payload), weights_only=True)
        return _decode(json.loads(saved["meta"]), saved["tensors"])
    except Exception as e:  # a file that matches its digest but not this format
        raise ValueError(f"unreadable: {type(e).__name__}: {e}") from None


# ------------------------------------------------------------------------------------ the folder

class ReferenceCache:
    """One cache folder (see the module docstring). Counts its hits, misses and stores."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int | None = None):
        self.folder = Path(folder)
        self.max_bytes = parse_bytes(os.environ.get(MAX_BYTES_ENV)) if max_bytes is None else int(max_bytes)
        self.hits = self.misses = self.stored = self.corrupt = 0
        self._size: int | None = None  # bytes in the folder, scanned on the first store

    def _path(self, name: str) -> Path:
        return self.folder / name[:2] / (name + SUFFIX)

    def load(self, name: str) -> dict | None:
        """The entry ``name``, or None (a miss; a corrupt entry is deleted)."""
        path = self._path(name)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        try:
            value = loads(data)
        except ValueError:
            self.corrupt += 1
            self.misses += 1
            self._remove(path)
            return None
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        self.hits += 1
        return value

    def store(self, name: str, value: dict) -> bool:
        """Keep ``value`` as entry ``name``; False when it cannot be stored (uncacheable, over the
        cap, a folder that cannot be written: the run goes on without the cache)."""
        try:
            data = dumps(value)
        except Uncacheable:
            return False
        if len(data) > self.max_bytes:
            return False
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            return False
        self.stored += 1
        if self._size is None:
            self._size = sum(size for _, size, _ in self.entries())
        else:
            self._size += len(data)
        if self._size > self.max_bytes:
            self.evict()
        return True

    def entries(self) -> list[tuple[Path, int, float]]:
        """(path, bytes, last use) of every entry."""
        found = []
        if not self.folder.is_dir():
            return found
        for p in self.folder.glob(f"*/*{SUFFIX}"):
            try:
                st = p.stat()
            except OSError:
                continue
            found.append((p, st.st_size, st.st_mtime))
        return found

    def evict(self, max_bytes: int | None = None) -> int:
        """Delete the least recently used entries until the folder holds at most ``max_bytes``
        (default: the cap); returns how many were deleted."""
        cap = self.max_bytes if max_bytes is None else max_bytes
        found = sorted(self.entries(), key=lambda e: e[2])
        total, gone = sum(size for _, size, _ in found), 0
        for path, size, _ in found:
            if total <= cap:
                break
            self._remove(path)
            total -= size
            gone += 1
        self._size = total
        return gone

    def _remove(self, path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass

    def info(self) -> dict:
        found = self.entries()
        return {"folder": str(self.folder), "entries": len(found), "bytes": sum(s for _, s, _ in found),
                "max_bytes": self.max_bytes, "exists": self.folder.is_dir()}

    def clear(self) -> int:
        """Delete every entry (and stray temporary files); returns how many entries went."""
        n = len(self.entries())
        if self.folder.is_dir():
            for p in self.folder.glob("*/*"):
                if p.is_file() and (p.suffix == SUFFIX or p.name.startswith(".tmp-")):
                    self._remove(p)
            for d in self.folder.iterdir():
                if d.is_dir():
                    try:
                        d.rmdir()
                    except OSError:
                        pass
        self._size = 0
        return n

    def counts(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "stored": self.stored, "corrupt": self.corrupt}
