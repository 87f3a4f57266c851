"""The records every importer's ``parse`` yields and the import (casedb.ingest.save) consumes: the
seam between a format and the store, typed. README.md here ("Records") shows each with an example.
Plain dicts, so a parser stays a pure function of its file; each has a ``type``."""

from __future__ import annotations

from typing import Literal, Optional, TypedDict, Union


class _ModelRequired(TypedDict):
    type: Literal["model"]
    name: str


class ModelRecord(_ModelRequired, total=False):
    """At most one per file, before its cases (trace formats have none: the user gives --model)."""

    defaults: dict               # the manifest's defaults (dtype, seed, rtol, atol ...), as written
    description: Optional[str]
    family: Optional[str]
    variant_of: Optional[str]
    source: str                  # the file it came from


class _CaseRequired(TypedDict):
    type: Literal["case"]
    case: dict                   # written in the RFC YAML schema; the save normalizes and signs it


class CaseRecord(_CaseRequired, total=False):
    """One case occurrence."""

    model: Optional[str]         # None: the file's model, or --model
    where: str                   # path:LINE (or the trace's event)
    count: Union[int, float]     # calls of this exact case in the source (default 1; a case's own count wins)
    their_key: tuple             # a v2 config's: the dedupe key of its own runner (importers.model_ops_v2)
    paths: list                  # a scan's: the scan paths (settings) that recorded it (casedb.scan)


class _SkippedRequired(TypedDict):
    type: Literal["skipped"]
    reason: str


class SkippedRecord(_SkippedRequired, total=False):
    """Something the store cannot represent: counted and listed, never silently dropped."""

    where: str
    op: str
    count: int


ImportRecord = Union[ModelRecord, CaseRecord, SkippedRecord]
