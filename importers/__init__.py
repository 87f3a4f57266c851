"""Input formats casedb imports. Each module has a pure ``parse(path, **options)`` yielding
records (see README.md here); :func:`detect` picks the module for a file."""

from __future__ import annotations

import importlib
from pathlib import Path

from casedb.files import read_head

# name -> module; each module may define sniff(path, head: str) -> bool
FORMATS = {
    "yaml": "importers.yaml_manifest",
    "spyre-v2": "importers.model_ops_v2",
    "scan": "importers.scan_jsonl",
    "kineto": "importers.kineto",
    "et": "importers.execution_trace",
    "oplog": "importers.oplog",
}
# Formats whose files do not name their model (`casedb import --model NAME` is required).
NEEDS_MODEL = {"kineto", "et", "oplog"}
SUFFIXES = (".yaml", ".yml", ".jsonl", ".json", ".gz", ".txt", ".log")


class UnknownFormat(ValueError):
    pass


def module(name: str):
    if name not in FORMATS:
        raise UnknownFormat(f"unknown format {name!r}; known: {', '.join(FORMATS)}")
    try:
        return importlib.import_module(FORMATS[name])
    except ModuleNotFoundError as e:
        raise UnknownFormat(f"format {name!r} is not available in this build ({e})") from None


def detect(path: Path) -> str:
    """Name of the format of `path`, from its suffix and first bytes."""
    name = path.name.lower()
    head = read_head(path).decode("utf-8", errors="replace")
    if name.endswith((".yaml", ".yml")):
        return "spyre-v2" if module("spyre-v2").sniff(path, head) else "yaml"
    stripped = head.lstrip()
    if name.endswith(".jsonl") or stripped.startswith('{"casedb_scan"'):
        return "scan"
    for fmt in ("kineto", "et", "oplog"):
        try:
            mod = module(fmt)
        except UnknownFormat:
            continue
        sniff = getattr(mod, "sniff", None)
        if sniff and sniff(path, head):
            return fmt
    if stripped.startswith("Operator:"):
        return "oplog"
    if '"traceEvents"' in head:
        return "kineto"
    if '"nodes"' in head and '"schema"' in head:
        return "et"
    raise UnknownFormat(
        f"{path}: cannot tell its format; give --format ({', '.join(FORMATS)})"
    )
