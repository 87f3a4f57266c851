"""The reference cache's folder on disk (``<db>.refcache``, :mod:`casedb.run.refcache`), touched
only in ways a link or a planted file cannot redirect.

Layout: ``<folder>/<xx>/<name>`` where ``<name>`` is 64 hex digits and ``.ref`` or ``.in`` and
``<xx>`` its first two; writes go through ``.tmp-<16 hex>`` files in the same shard. These are the
only names casedb creates, and the only ones it reads, counts or deletes: everything else in the
folder is left alone, and only an emptied shard folder is removed.

Never followed: the folder, its shards and its entries are opened with ``O_NOFOLLOW`` (shards and
entries relative to the opened folder), entries are listed with ``lstat`` and only regular files
of the current user count; a temporary file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` mode 0600
and renamed into place, which replaces a name and never writes through it.

Trusted only when it is the user's own: :meth:`Folder.check` refuses (:class:`UnsafeFolder`, exit
2) a folder or shard that is a link, not a folder, owned by someone else or writable by group or
others, saying what to do. New folders are made 0700.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Callable, NamedTuple

from casedb.errors import CasedbError

ENTRY = re.compile(r"[0-9a-f]{64}\.(?:ref|in)")
TEMP = re.compile(r"\.tmp-(?:[0-9a-f]{16}|[a-z0-9_]{8})")  # (8 characters: the mkstemp names earlier casedb wrote)
SHARD = re.compile(r"[0-9a-f]{2}")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _CLOEXEC


class UnsafeFolder(CasedbError):
    """A cache folder (or a shard of it) that is a link, not a folder, or not the user's own."""


class BadEntry(Exception):
    """An entry name that holds a link, not a regular file, or a file of someone else."""


class Entry(NamedTuple):
    name: str      # <64 hex>.<ref|in>
    size: int
    mtime: float


def _problem(st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return ("is a symbolic link; casedb never follows links in its reference cache (one would have it read, "
                "write and delete files elsewhere): remove the link (rm it) and let casedb make the folder")
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder: move it away (casedb makes the folder)"
    if st.st_uid != os.geteuid():
        return (f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): whoever can write it could plant "
                "entries; move it away and let casedb make your own")
    if st.st_mode & 0o022:
        return (f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): anyone who can write it "
                "could plant entries or links; if it is yours, chmod go-w it (casedb makes it 0700)")
    return None


def _refuse(path, why: str) -> UnsafeFolder:
    return UnsafeFolder(f"reference cache {path} {why}; or run with --no-reference-cache")


class Folder:
    """One cache folder (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def exists(self) -> bool:
        return os.path.lexists(self.path)

    def check(self) -> None:
        """Raise UnsafeFolder when the folder, or a shard in it, is not to be used; nothing when
        there is no folder yet."""
        try:
            why = _problem(os.lstat(self.path))
        except FileNotFoundError:
            return
        if why:
            raise _refuse(self.path, why)
        with self._top() as top:
            for name in sorted(os.listdir(top)):
                if SHARD.fullmatch(name):
                    st = os.stat(name, dir_fd=top, follow_symlinks=False)
                    why = _problem(st) if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode) else None
                    if why:
                        raise _refuse(self.path / name, why)

    @contextlib.contextmanager
    def _top(self, create: bool = False):
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.path, 0o700)
        fd = os.open(self.path, _DIR)
        try:
            why = _problem(os.fstat(fd))
            if why:
                raise _refuse(self.path, why)
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _shard(self, shard: str, create: bool = False):
        """The fd of shard folder ``shard`` (made when ``create``)."""
        with self._top(create) as top:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(shard, 0o700, dir_fd=top)
            fd = os.open(shard, _DIR, dir_fd=top)
            try:
                why = _problem(os.fstat(fd))
                if why:
                    raise _refuse(self.path / shard, why)
                yield fd
            finally:
                os.close(fd)

    def open(self, name: str) -> int:
        """A read-only fd of entry ``name`` (FileNotFoundError: none; BadEntry: a link, not a
        regular file, not the user's)."""
        with self._shard(name[:2]) as shard:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=shard)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link
                    raise BadEntry(f"{name} is a symbolic link") from None
                raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise BadEntry(f"{name} is not a regular file of yours")
        return fd

    def write(self, name: str, write: Callable, max_bytes: int) -> int:
        """``write(binary file)`` into a new temporary file renamed to ``name``; its size. Raises
        OSError, UnsafeFolder, what ``write`` raises, and ValueError when over ``max_bytes``."""
        assert ENTRY.fullmatch(name), name
        with self._shard(name[:2], create=True) as shard:
            tmp = f".tmp-{secrets.token_hex(8)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=shard)
            try:
                with os.fdopen(fd, "wb") as f:
                    write(f)
                    f.flush()
                    size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise ValueError(f"{name}: {size} bytes, over the cap")
                os.replace(tmp, name, src_dir_fd=shard, dst_dir_fd=shard)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=shard)
                raise
        return size

    def remove(self, name: str) -> None:
        """Delete entry ``name`` (a link by that name is deleted, never what it points to)."""
        if not (ENTRY.fullmatch(name) or TEMP.fullmatch(name)):
            return
        with contextlib.suppress(OSError, UnsafeFolder), self._shard(name[:2]) as shard:
            os.unlink(name, dir_fd=shard)

    def _shards(self, top: int) -> list[str]:
        return sorted(n for n in os.listdir(top) if SHARD.fullmatch(n)
                      and stat.S_ISDIR(os.stat(n, dir_fd=top, follow_symlinks=False).st_mode))

    def entries(self) -> list[Entry]:
        """Every entry: regular files of the user named as casedb names them (none in a folder
        that is not to be used: :meth:`check` says why)."""
        if not self.exists():
            return []
        found = []
        with contextlib.suppress(OSError, UnsafeFolder), self._top() as top:
            for shard in self._shards(top):
                with contextlib.suppress(OSError, UnsafeFolder), self._shard(shard) as fd:
                    for name in os.listdir(fd):
                        if not ENTRY.fullmatch(name) or name[:2] != shard:
                            continue
                        with contextlib.suppress(OSError):
                            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                                found.append(Entry(name, st.st_size, st.st_mtime))
        return found

    def clear(self) -> None:
        """Delete every entry and temporary file, then every shard folder left empty (nothing in a
        folder that is not to be used: :meth:`check` says why)."""
        if not self.exists():
            return
        with contextlib.suppress(OSError, UnsafeFolder), self._top() as top:
            for shard in self._shards(top):
                with contextlib.suppress(OSError, UnsafeFolder), self._shard(shard) as fd:
                    for name in os.listdir(fd):
                        if (ENTRY.fullmatch(name) and name[:2] == shard) or TEMP.fullmatch(name):
                            with contextlib.suppress(OSError):
                                os.unlink(name, dir_fd=fd)
                with contextlib.suppress(OSError):
                    os.rmdir(shard, dir_fd=top)
