"""Opening the files an import reads: regular files only, size-capped, gzip with a cap on what it
expands to. Every importer (and ``file:`` tensor inputs) reads through here.

* Only regular files (symlinks followed): a FIFO would block the import forever and a device
  such as ``/dev/zero`` never ends. The file is opened non-blocking and checked with ``fstat``
  on the open descriptor, so a file swapped after a check cannot slip through.
* At most ``MAX_INPUT_BYTES`` (1 GiB; ``casedb import --max-input-mb``) read from one file,
  after decompression.
* A gzip file that expands more than ``GZIP_MAX_RATIO`` times once past ``GZIP_RATIO_AFTER``
  bytes is refused as a gzip bomb (real JSON traces compress 10–30×; ``gunzip`` a genuine one
  and import the ``.json``, which only the size cap applies to); so is a tensor file whose tensor
  takes that much more than the file once made contiguous (a ``.pt`` holding an expanded view:
  stride 0 over a huge shape), checked on its shape before it is made (:func:`check_tensor_bomb`).
* A file read from below a folder (``file:`` inputs, :func:`open_below`) is opened once, and what
  was opened (``/proc/self/fd``, else its device and inode) must lie below the folder: a link
  swapped between the check and the read cannot lead out of it.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from pathlib import Path
from typing import BinaryIO

from casedb.errors import InputError

MAX_INPUT_BYTES = 1 << 30
GZIP_MAX_RATIO = 100
GZIP_RATIO_AFTER = 64 << 20
HEAD_BYTES = 1 << 16
_CHUNK = 1 << 20
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n / (1 << 20):.1f} MiB"


def open_regular(path) -> tuple[BinaryIO, int]:
    """``(binary file, size)`` of a regular file; anything else raises InputError naming it."""
    path = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror or e}", where=path) from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise InputError(f"cannot read: {e.strerror or e}", where=path) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise InputError(f"is {kind}, not a regular file; casedb reads only regular files "
                         "(copy the data into a file and import that)", where=path)
    return os.fdopen(fd, "rb"), st.st_size


def _limit(max_bytes: int | None) -> int:
    return MAX_INPUT_BYTES if max_bytes is None else int(max_bytes)


def too_big(path, size: int, max_bytes: int) -> InputError:
    return InputError(f"is {_mib(size)}, over the {_mib(max_bytes)} limit on one input file; if it is genuine, "
                      "raise the limit with casedb import --max-input-mb N", where=str(path))


def _gunzip(f: BinaryIO, path: str, compressed: int, max_bytes: int) -> bytearray:
    out = bytearray()
    with gzip.GzipFile(fileobj=f, mode="rb") as g:
        while True:
            chunk = g.read(_CHUNK)
            if not chunk:
                return out
            out += chunk
            if len(out) > max_bytes:
                raise InputError(f"decompresses to more than the {_mib(max_bytes)} limit on one input file; "
                                 "if it is genuine, raise the limit with casedb import --max-input-mb N", where=path)
            if _bomb(compressed, len(out)):
                raise InputError(f"expands more than {GZIP_MAX_RATIO}x ({_mib(compressed)} of gzip to over "
                                 f"{_mib(len(out))}): refused as a gzip bomb; if it is genuine, gunzip it and "
                                 "import the uncompressed file", where=path)


def _bomb(packed: int, unpacked: int) -> bool:
    return unpacked > GZIP_RATIO_AFTER and unpacked > GZIP_MAX_RATIO * max(packed, 1)


def check_tensor_bomb(path, file_size: int, nbytes: int) -> None:
    """Refuse a tensor read from a file of ``file_size`` bytes that takes ``nbytes`` once made
    contiguous, when that is a bomb (see the module docstring); the cap on one input is the
    caller's."""
    if _bomb(file_size, nbytes):
        raise InputError(f"holds a tensor of {_mib(nbytes)} once made contiguous, from a file of {file_size:,} bytes "
                         f"(more than {GZIP_MAX_RATIO}x: an expanded or overlapping view): refused as a tensor bomb; "
                         "if it is genuine, save tensor.contiguous() and import that file", where=str(path))


def open_below(path, base, max_bytes: int | None = None) -> BinaryIO:
    """A regular file opened once for reading (size-capped as :func:`open_capped`) whose opened
    file lies below folder ``base`` (None: anywhere); InputError otherwise."""
    path = Path(path)
    root = None if base is None else Path(base).resolve()
    outside = InputError(f"is outside the manifest's folder {base}; file: inputs are read only from below it "
                         "(casedb import --allow-outside reads it, if you trust this manifest)")
    if root is not None and not path.resolve().is_relative_to(root):  # (a clear message before any open)
        raise outside
    if not path.exists():
        raise InputError(f"not found (looked at {path})")
    f = open_capped(path, max_bytes)
    if root is not None and not _opened_below(f.fileno(), path, root):
        f.close()
        raise outside
    return f


def _opened_below(fd: int, path: Path, root: Path) -> bool:
    """Whether the file open as ``fd`` is one below ``root``, whatever ``path`` names now."""
    proc = f"/proc/self/fd/{fd}"
    if os.path.islink(proc):  # the kernel's own path of what was opened
        return Path(os.readlink(proc)).is_relative_to(root)
    real = path.resolve()
    try:
        now = os.stat(real)
    except OSError:
        return False
    opened = os.fstat(fd)
    return real.is_relative_to(root) and (opened.st_dev, opened.st_ino) == (now.st_dev, now.st_ino)


def read_bytes(path, max_bytes: int | None = None) -> bytes | bytearray:
    """The whole content of a regular file, gunzipped if it is gzip (by its magic bytes), at most
    ``max_bytes`` (default MAX_INPUT_BYTES). Corrupt gzip raises EOFError / gzip.BadGzipFile /
    zlib.error for the caller to word."""
    cap = _limit(max_bytes)
    f, size = open_regular(path)
    with f:
        magic = f.read(2)
        f.seek(0)
        if magic == b"\x1f\x8b":
            return _gunzip(f, str(path), size, cap)
        if size > cap:
            raise too_big(path, size, cap)
        data = f.read(cap + 1)
    if len(data) > cap:  # grew since fstat
        raise too_big(path, len(data), cap)
    return data


def read_text(path, max_bytes: int | None = None) -> str:
    """A regular file's text (UTF-8, gunzipped if gzip), size-capped as :func:`read_bytes`."""
    try:
        data = read_bytes(path, max_bytes)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"the gzip data is truncated or corrupt ({e})", where=str(path)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8", where=str(path)) from None


def open_capped(path, max_bytes: int | None = None) -> BinaryIO:
    """A regular file opened for reading, refused if over the cap (for readers that stream it)."""
    cap = _limit(max_bytes)
    f, size = open_regular(path)
    if size > cap:
        f.close()
        raise too_big(path, size, cap)
    return f


def read_head(path: Path | str, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of a regular file, decompressed if it is gzip (for format sniffing;
    a corrupt gzip gives b"": the parser reports the real problem)."""
    f, _ = open_regular(path)
    with f:
        if f.read(2) != b"\x1f\x8b":
            f.seek(0)
            return f.read(size)
        f.seek(0)
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                return g.read(size)
        except (OSError, EOFError, zlib.error):
            return b""
