"""What software a run's target is made of, recorded with the run (``runs.software``): each
--import module (where it was loaded from, its distribution's version or its ``__version__``, and
a SHA-256 of its file), torch's version, and the environment variables that steer torch and the
device (``TORCH*``, ``PYTORCH_*``, ``TORCHINDUCTOR_*``, ``CASEDB_MUTANT_BASE`` and those named
after the device type: ``SPYRE_*`` for spyre). Read without importing anything (the recording
process never imports torch), so two runs on one device name can be told apart.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from importlib import metadata
from pathlib import Path

_PREFIXES = ("TORCH", "PYTORCH_", "CASEDB_MUTANT_BASE")


def _file_of(name: str) -> Path | None:
    if name.endswith(".py") or "/" in name or os.sep in name:
        p = Path(name)
        return p.resolve() if p.is_file() else None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve() if spec is not None and spec.origin and Path(spec.origin).is_file() else None


def _version(name: str, path: Path | None) -> str | None:
    top = name.split(".")[0]
    if not name.endswith(".py"):
        try:
            return metadata.version(top)
        except metadata.PackageNotFoundError:
            pass
    if path is not None:  # a module's own __version__ = "..." line, read, not executed
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:200]:
            if line.startswith("__version__") and "=" in line:
                return line.split("=", 1)[1].strip().strip("\"'")
    return None


def module(name: str) -> dict:
    """One --import: its name, file, version and the file's SHA-256 (None where unknown)."""
    path = _file_of(name)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None
    return {"import": name, "file": None if path is None else str(path), "version": _version(name, path),
            "sha256": digest}


def _torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def describe(imports: list, device: str | None) -> dict:
    """The run's software: ``imports``, ``torch``, ``environment`` (see the module docstring)."""
    kind = (device or "").split(":")[0].upper()
    prefixes = _PREFIXES + ((kind + "_",) if kind and kind not in ("CPU", "CUDA") else ())
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}
    return {"imports": [module(n) for n in imports or ()], "torch": _torch_version(), "environment": env}
