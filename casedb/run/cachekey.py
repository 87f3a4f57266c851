"""The secret that seals reference cache entries (:mod:`casedb.run.refcache`): one per user, kept
outside every cache folder, so that whoever can write a cache folder (or hands you one) cannot make
an entry casedb accepts.

Each entry carries an HMAC-SHA256, under this key, of its kind, its name (the hash of the case,
environment and code it answers: :func:`casedb.run.refcache.key`) and its bytes: a forged entry, an
entry moved to another name or one written with another user's key is refused (a miss, deleted).

The key is 32 random bytes in ``$CASEDB_REFERENCE_CACHE_KEY`` if set, else
``$XDG_CONFIG_HOME/casedb/refcache.key`` (``~/.config/casedb/refcache.key``), created on first use
mode 0600 in a 0700 folder. A key file that is a link, not a regular file of 32 bytes, not yours,
or readable or writable by group or others is refused (:class:`UnsafeKey`, exit 2): it may be known.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from casedb.errors import CasedbError

KEY_ENV = "CASEDB_REFERENCE_CACHE_KEY"
KEY_BYTES = 32


class UnsafeKey(CasedbError):
    """A key file that may be known to someone else, or cannot be made."""


def key_path() -> Path:
    """Where the key is (see the module docstring)."""
    given = os.environ.get(KEY_ENV)
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "casedb" / "refcache.key"


_secrets: dict[str, bytes] = {}


def secret(fresh: bool = False) -> bytes:
    """The key (created when there is none; read once per process unless ``fresh``: checked
    again); raises UnsafeKey."""
    path = key_path()
    if fresh or str(path) not in _secrets:
        _secrets[str(path)] = _read(path) if os.path.lexists(path) else _create(path)
    return _secrets[str(path)]


def _unsafe(path: Path, why: str) -> UnsafeKey:
    return UnsafeKey(f"reference cache key {path} {why}; casedb does not use a key someone else may know: remove "
                     f"it (a new one is made, and cached entries are computed again), point {KEY_ENV} at a file "
                     "of yours, or run with --no-reference-cache")


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        why = "is a symbolic link" if os.path.islink(path) else f"cannot be read ({e.strerror})"
        raise _unsafe(path, why) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _unsafe(path, "is not a regular file")
        if st.st_uid != os.geteuid():
            raise _unsafe(path, f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise _unsafe(path, f"is open to group or others (mode {mode:04o}; casedb makes it 0600)")
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise _unsafe(path, f"holds {len(data)} bytes, not the {KEY_BYTES} casedb writes")
    return data


def _create(path: Path) -> bytes:
    """A new key, written to a private temporary file and linked into place: of two processes
    making it at once, one wins and both read its key."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    except OSError as e:
        raise UnsafeKey(f"cannot make the reference cache key {path} ({e.strerror or e}): set {KEY_ENV} to a file "
                        "path you can write, or run with --no-reference-cache") from None
    return _read(path)


def seal(kind: str, name: str):
    """An HMAC-SHA256 under the key, started on ``kind`` and ``name`` (feed it the entry's bytes)."""
    return hmac.new(secret(), f"casedb-refcache\0{kind}\0{name}\0".encode(), "sha256")
