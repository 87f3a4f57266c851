"""The reference cache: a case's CPU reference result (and its high-precision reference), kept on
disk so that a rerun pays only for the target — and, for cases whose inputs are expensive to
build, those inputs (:mod:`casedb.run.inputcache`: which cases, the file format; keyed by
:func:`input_key`, without the thread count or reference dtype, which do not change them).

For a given case (its op, inputs, seed — an extremal variant's rewritten inputs included), torch
version, CPU capability (``torch.backends.cpu.get_cpu_capability()``: the kernels dispatched),
torch thread count (a parallel reduction splits its sums by threads), reference dtype and
version of the code that builds inputs and calls the reference, the reference is the same
tensor: :func:`key` hashes all of them, and an entry is one file named by that hash in a folder
beside the DB (``<db>.refcache/``, :func:`beside`; on disk: :mod:`casedb.run.cachefolder`, which
never follows a link and touches only the names it writes).

Trusted only as far as it is checked: the folder must be the user's own (not a link, not writable
by group or others: :meth:`ReferenceCache.check`), and each entry is sealed with an HMAC-SHA256
under the user's secret key (:mod:`casedb.run.cachekey`, kept outside the folder) over its kind,
its name and its bytes. An entry that does not match its seal (forged, damaged, moved to another
name, written under another key), that is a link or not a regular file of the user, or larger than
its case can need, is a miss and is deleted. Tensors go through ``torch.save`` and come back through
``torch.load(..., weights_only=True)`` (no pickle of arbitrary objects), only after the seal
matched; the structure around them (tuples, dicts, ``torch.return_types``, Python scalars, dtypes)
is JSON. Writes go to a temporary file renamed into place, so a reader never sees half a file.

Bounded: at most ``max_bytes`` (default :data:`DEFAULT_MAX_BYTES`, env
``CASEDB_REFERENCE_CACHE_BYTES``, e.g. ``500M``), the least recently used entries (a hit touches
its file) evicted first, references and inputs alike — but never an entry this cache object
stored or used (a run): a run whose entries exceed the cap keeps its first ones and stores no
more, where plain LRU would evict each before the next run reaches it and keep nothing. Results
that are not values (random or uninitialized outputs, compared on metadata only) are never cached: :mod:`casedb.run.execute` decides what it offers.
A read is bounded before it starts: a reference entry by the cap (its seal is checked streaming
before a large one is read into memory), an inputs entry by what its case's tensors take.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import sys
import time
from pathlib import Path

from casedb.errors import CasedbError
from casedb.run import cachekey, inputcache
from casedb.run.cachefolder import BadEntry, Folder, UnsafeFolder

DEFAULT_MAX_BYTES = 2 * 2**30
MAX_BYTES_ENV = "CASEDB_REFERENCE_CACHE_BYTES"
FORMAT = 2                      # of the files: a new one misses every old entry (2: sealed by key)
SUFFIX = ".ref"
KINDS = {SUFFIX: "references", inputcache.SUFFIX: "inputs"}
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
# the code cached inputs depend on besides torch: how they are generated and kept
_INPUT_CODE = ("cases/materialize.py", "cases/generators.py", "cases/value_ranges.py", "cases/dtypes.py",
               "cases/blobs.py", "run/inputcache.py")
# ... and a cached reference: those inputs, their layout and how the reference is called
_CODE = _INPUT_CODE + ("cases/presets.py", "cases/ops.py", "run/execute.py", "run/refcache.py",
                       "judge/accumulation.py", "judge/ties.py", "judge/bias.py")


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


_code_versions: dict = {}


def code_version(files: tuple = _CODE) -> str:
    """A hash of casedb's own ``files`` (paths under casedb/)."""
    if files not in _code_versions:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        for rel in files:
            h.update((root / rel).read_bytes())
        _code_versions[files] = h.hexdigest()[:16]
    return _code_versions[files]


def environment(inputs_only: bool = False) -> dict:
    """What, besides the case, decides a CPU reference's bits; ``inputs_only``: its inputs' bits
    (not the threads: they split a reduction, not a draw)."""
    import torch

    env = {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(), "format": FORMAT}
    if inputs_only:
        return {**env, "code": code_version(_INPUT_CODE)}
    return {**env, "threads": torch.get_num_threads(), "code": code_version()}


def key(case: dict, part: str, dtype: str | None = None) -> str:
    """The entry name of ``part`` ("reference", "hi" or "inputs") of ``case`` computed in ``dtype``."""
    env = environment(inputs_only=part == "inputs")
    text = json.dumps({"case": case, "part": part, "dtype": dtype, "env": env}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def input_key(case: dict) -> str:
    """The entry name of ``case``'s cached inputs (not keyed by threads or reference dtype: they
    do not change them)."""
    return key(case, "inputs")


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


def _seal(name: str, payload) -> bytes:
    mac = cachekey.seal(SUFFIX, name)
    mac.update(payload)
    return mac.digest()


def dumps(value: dict, name: str = "") -> bytes:
    """``value`` (str keys; results as casedb.run.execute keeps them) as the bytes of entry
    ``name``: its seal (:mod:`casedb.run.cachekey`) + payload."""
    import torch

    tensors: list = []
    meta = json.dumps(_encode(value, tensors))
    buf = io.BytesIO()
    torch.save({"meta": meta, "tensors": tensors}, buf)
    payload = buf.getvalue()
    return _seal(name, payload) + payload


def _storage_bytes(tensors: list) -> int:
    """The bytes ``torch.save`` writes for ``tensors``: each distinct storage whole."""
    seen: dict = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


class _Sealing:
    """A binary file that seals what is written through it (:func:`_write_sealed`)."""

    def __init__(self, f, mac):
        self.f, self.mac = f, mac

    def write(self, data) -> int:
        self.mac.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _write_sealed(f, name: str, meta: str, tensors: list) -> bool:
    """Write the bytes :func:`dumps` gives into the binary file ``f``: the payload straight to the
    file, sealed as it is written, and the seal before it (no copy of a large reference in memory)."""
    import torch

    start = f.tell()
    f.write(bytes(32))
    sealing = _Sealing(f, cachekey.seal(SUFFIX, name))
    torch.save({"meta": meta, "tensors": tensors}, sealing)
    f.flush()
    os.pwrite(f.fileno(), sealing.mac.digest(), start)
    return True


def loads(data: bytes, name: str = "") -> dict:
    """The value of the bytes of entry ``name``; ValueError when the seal does not match (forged,
    damaged, another entry's) or it does not load."""
    import torch

    digest, payload = data[:32], memoryview(data)[32:]
    if len(data) < 32 or not hmac.compare_digest(_seal(name, payload), digest):
        raise ValueError("seal mismatch")
    try:
        saved = torch.load(io.BytesIO(payload), weights_only=True)
        return _decode(json.loads(saved["meta"]), saved["tensors"])
    except Exception as e:  # a file that matches its digest but not this format
        raise ValueError(f"unreadable: {type(e).__name__}: {e}") from None


# ------------------------------------------------------------------------------------ the folder

_STREAM_AFTER = 64 << 20  # a reference entry larger than this has its seal checked before it is read


def _chunks(fd: int, at: int, size: int):
    """The bytes of ``fd`` from ``at`` to ``size``, in chunks."""
    while at < size:
        chunk = os.pread(fd, min(size - at, 1 << 22), at)
        if not chunk:
            return
        yield chunk
        at += len(chunk)


def _pread_all(fd: int, size: int) -> bytearray:
    data = bytearray()
    for chunk in _chunks(fd, 0, size):
        data += chunk
    return data


def _sealed_streaming(fd: int, size: int, name: str) -> bool:
    """Whether entry ``name``'s bytes match its seal, read in chunks (no memory for a forged one)."""
    mac = cachekey.seal(SUFFIX, name)
    for chunk in _chunks(fd, 32, size):
        mac.update(chunk)
    return hmac.compare_digest(mac.digest(), os.pread(fd, 32, 0))


def _read_reference(fd: int, size: int, name: str) -> dict:
    if size > _STREAM_AFTER and not _sealed_streaming(fd, size, name):
        raise ValueError("seal mismatch")
    return loads(_pread_all(fd, size), name)


def _read_inputs(fd: int, size: int, name: str) -> list:
    seal = lambda: cachekey.seal(inputcache.SUFFIX, name)  # noqa: E731
    if os.path.isdir("/proc/self/fd"):  # the file opened, by a name a swap cannot redirect: memory-mapped
        return inputcache.read(f"/proc/self/fd/{fd}", seal)
    return inputcache.read(io.BytesIO(_pread_all(fd, size)), seal)


class ReferenceCache:
    """One cache folder (see the module docstring). Counts its hits, misses and stores, of
    references and (``inputs_*``) of inputs."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int | None = None):
        self.folder = Path(folder)
        self.disk = Folder(self.folder)
        self.max_bytes = parse_bytes(os.environ.get(MAX_BYTES_ENV)) if max_bytes is None else int(max_bytes)
        self.hits = self.misses = self.stored = self.corrupt = 0
        self.inputs_hits = self.inputs_misses = self.inputs_stored = 0
        self._size: int | None = None  # bytes in the folder, scanned on the first store
        self._since = time.time()  # entries used or stored since (this run's) are not evicted by a store

    def check(self) -> None:
        """Raise CasedbError (exit 2, saying what to do) when the folder is not to be trusted (a
        link, not the user's, writable by others: casedb.run.cachefolder) or the key is not
        (casedb.run.cachekey)."""
        self.disk.check()
        cachekey.secret(fresh=True)

    def _path(self, name: str, suffix: str = SUFFIX) -> Path:
        return self.folder / name[:2] / (name + suffix)

    def _bad(self, entry: str) -> None:
        self.corrupt += 1
        self.disk.remove(entry)

    def _fetch(self, name: str, suffix: str, read, bound: int):
        """``read(fd, size, name)`` of entry ``name``, or None: a miss when there is none, and one
        that is bad (a link, not the user's file, over ``bound``, its seal or format not
        matching: ValueError raised) is deleted."""
        entry = name + suffix
        try:
            fd = self.disk.open(entry)
        except BadEntry:
            self._bad(entry)
            return None
        except (OSError, UnsafeFolder):
            return None
        try:
            size = os.fstat(fd).st_size
            if size > bound:
                raise ValueError(f"{size} bytes, more than its case can need ({bound})")
            value = read(fd, size, name)
            try:
                os.utime(fd)  # least recently used goes first
            except OSError:
                pass
            return value
        except ValueError:
            self._bad(entry)
            return None
        except OSError:
            return None
        finally:
            os.close(fd)

    def load(self, name: str) -> dict | None:
        """The entry ``name``, or None (a miss; a bad entry is deleted)."""
        value = self._fetch(name, SUFFIX, _read_reference, self.max_bytes)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def load_inputs(self, name: str, case: dict | None = None) -> list | None:
        """The cached inputs ``name`` (of ``case``: read only when no larger than its tensors can
        need; :func:`casedb.run.inputcache.read`), or None (a miss; a bad file is deleted)."""
        bound = self.max_bytes if case is None else min(self.max_bytes, inputcache.max_file_bytes(case))
        bases = self._fetch(name, inputcache.SUFFIX, _read_inputs, bound)
        if bases is None:
            self.inputs_misses += 1
        else:
            self.inputs_hits += 1
        return bases

    def prepare_inputs(self, case: dict, load_blob=None) -> tuple:
        """``(Prepared, hit)``: the inputs of ``case`` from the cache when it holds them, else
        generated (:func:`casedb.cases.materialize.prepare`) and kept when they qualify."""
        from casedb.cases.materialize import MaterializeError, prepare

        name = input_key(case)
        bases = self.load_inputs(name, case)
        if bases is not None:
            try:
                return prepare(case, load_blob=load_blob, bases=bases), True
            except MaterializeError:  # tensors that do not fit the case: a bad entry
                self.inputs_hits -= 1
                self.inputs_misses += 1
                self._bad(name + inputcache.SUFFIX)
        prepared = prepare(case, load_blob=load_blob)
        if inputcache.qualifies(prepared):
            self.store_inputs(name, prepared)
        return prepared, False

    def store(self, name: str, value: dict) -> bool:
        """Keep ``value`` as entry ``name``; False when it cannot be stored (uncacheable, over the
        cap, a folder that cannot be written: the run goes on without the cache)."""
        tensors: list = []
        try:
            meta = json.dumps(_encode(value, tensors))
        except Uncacheable:
            return False
        if _storage_bytes(tensors) > self.max_bytes:  # over the cap whatever else it holds: not even written
            return False
        if not self._write(name + SUFFIX, lambda f: _write_sealed(f, name, meta, tensors)):
            return False
        self.stored += 1
        return True

    def store_inputs(self, name: str, prepared) -> bool:
        """Keep the generated inputs of ``prepared`` (:func:`casedb.run.inputcache.write`) as
        ``name``; False when they cannot be stored (as :meth:`store`)."""
        if inputcache.drawn_bytes(prepared) > self.max_bytes:  # (the granite4h sum's 4 GiB: not written, then deleted)
            return False
        seal = lambda: cachekey.seal(inputcache.SUFFIX, name)  # noqa: E731
        if not self._write(name + inputcache.SUFFIX, lambda f: inputcache.write(f, prepared, seal)):
            return False
        self.inputs_stored += 1
        return True

    def _write(self, entry: str, write) -> bool:
        """``write(file)`` into entry ``entry`` (casedb.run.cachefolder), then evict down to the
        cap; False when it did not write or the file is over the cap."""
        def written(f):
            if not write(f):
                raise Uncacheable(entry)

        try:
            size = self.disk.write(entry, written, self.max_bytes)
        except (OSError, ValueError, Uncacheable, UnsafeFolder):
            return False
        if self._size is None:
            self._size = sum(size for _, size, _ in self.entries())
        else:
            self._size += size
        if self._size > self.max_bytes:
            self.evict(keep_since=self._since)
            if self._size > self.max_bytes:  # only this run's entries are left: keep them, not this one
                self.disk.remove(entry)
                self._size -= size
                return False
        return True

    def entries(self, suffix: str | None = None) -> list[tuple[Path, int, float]]:
        """(path, bytes, last use) of every entry (of one kind: its ``suffix``)."""
        return [(self.folder / e.name[:2] / e.name, e.size, e.mtime) for e in self.disk.entries()
                if suffix is None or e.name.endswith(suffix)]

    def evict(self, max_bytes: int | None = None, keep_since: float | None = None) -> int:
        """Delete the least recently used entries until the folder holds at most ``max_bytes``
        (default: the cap), sparing those used at ``keep_since`` or later; returns how many went."""
        cap = self.max_bytes if max_bytes is None else max_bytes
        found = sorted(self.entries(), key=lambda e: e[2])
        total, gone = sum(size for _, size, _ in found), 0
        for path, size, used in found:
            if total <= cap:
                break
            if keep_since is not None and used >= keep_since:
                continue
            self.disk.remove(path.name)
            total -= size
            gone += 1
        self._size = total
        return gone

    def info(self) -> dict:
        """The folder, its entries and bytes in all and per kind (``references``, ``inputs``), the
        cap and the key file that seals them."""
        found = self.entries()
        kinds = {kind: {"entries": 0, "bytes": 0} for kind in KINDS.values()}
        for p, size, _ in found:
            kinds[KINDS[p.suffix]]["entries"] += 1
            kinds[KINDS[p.suffix]]["bytes"] += size
        return {"folder": str(self.folder), "entries": len(found), "bytes": sum(s for _, s, _ in found), **kinds,
                "max_bytes": self.max_bytes, "exists": self.folder.is_dir(), "key_file": str(cachekey.key_path())}

    def clear(self) -> dict:
        """Delete every entry, references and inputs (and stray temporary files; nothing else:
        casedb.run.cachefolder); returns how many of each went (``references``, ``inputs``)."""
        gone = {kind: len(self.entries(suffix)) for suffix, kind in KINDS.items()}
        self.disk.clear()
        self._size = 0
        return gone

    def counts(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "stored": self.stored, "corrupt": self.corrupt,
                "inputs_hits": self.inputs_hits, "inputs_misses": self.inputs_misses,
                "inputs_stored": self.inputs_stored}


_warned: set = set()


def for_run(db_path: str | os.PathLike) -> ReferenceCache | None:
    """The cache of a run's worker, or None (with one warning per folder and process) when it is
    not to be trusted; ``casedb run`` refuses such a folder before it starts (:meth:`check`)."""
    cache = ReferenceCache(beside(db_path))
    try:
        cache.check()
    except CasedbError as e:
        if str(cache.folder) not in _warned:
            _warned.add(str(cache.folder))
            print(f"casedb: warning: {e}: running without the reference cache", file=sys.stderr)
        return None
    return cache
