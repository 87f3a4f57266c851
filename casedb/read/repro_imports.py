"""The modules a repro script imports (``casedb repro --import``) and the device layout hook it
calls, recorded so that the script runs from any folder the module can be imported from.

A module given by name is imported by name, the folder it was found in kept as a fallback; a
module given as a file is loaded from its absolute path, its name kept as a fallback. The
script says, at its start, what to put on PYTHONPATH when neither works.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from casedb.errors import CasedbError


def _folder_of(name: str) -> str | None:
    """The sys.path folder that holds module ``name`` (None: not a module found on a path)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.has_location:
        return None
    origin = Path(spec.origin).resolve()
    up = len(name.split(".")) + (origin.name == "__init__.py")
    return str(origin.parents[up - 1])


def import_record(given: str, resolved: str) -> dict:
    """How the script imports one --import: ``given`` as typed, ``resolved`` as
    :func:`casedb.run.target.check_import` returned it (a file's absolute path, or a module name).
    ``{"module", "file", "folder", "given"}``: the module name, the absolute file (None for a
    module found by name), the folder to put on sys.path for the name, and which was given."""
    from casedb.run.target import is_path

    if is_path(resolved):
        path = Path(resolved)
        return {"module": path.stem, "file": str(path), "folder": str(path.parent),
                "given": "file" if is_path(given) else "name"}
    return {"module": resolved, "file": None, "folder": _folder_of(resolved), "given": "name"}


def layout_hook(device: str | None, modules: list) -> dict | None:
    """Where the script finds the device layout hook of ``device`` (casedb's DEVICE_LAYOUT_HOOKS,
    registered by an imported module): ``{"device", "import", "module", "attr"}``, ``import`` the
    index of the --import module that defines it (None: imported by ``module``'s name); None when
    the device has no hook."""
    import torch

    from casedb.cases.materialize import DEVICE_LAYOUT_HOOKS

    if not device:
        return None
    kind = torch.device(device).type
    hook = DEVICE_LAYOUT_HOOKS.get(kind)
    if hook is None:
        return None
    name, attr = getattr(hook, "__module__", None), getattr(hook, "__qualname__", "")
    home = sys.modules.get(name or "")
    index = next((i for i, m in enumerate(modules) if m is home), None)
    if "<" in attr or home is None or (index is None and importlib.util.find_spec(name) is None):
        raise CasedbError(f"cannot write a repro: the device layout hook of {kind} ({hook!r}) is not a function "
                          "at module level of an --import module; define it at module level (def hook(t, dev, "
                          "layout)) so that the script can call it")
    return {"device": kind, "import": index, "module": name if index is None else name.removeprefix("casedb_import_"),
            "attr": attr}
