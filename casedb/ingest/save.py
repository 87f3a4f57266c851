"""Files → stored cases: detect the format, parse, normalize every record, then save once.

Everything is parsed and validated before the database is touched, and the save is one
transaction, so a bad file leaves the database byte-identical.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import importers
from importers.record import CaseRecord, ImportRecord, ModelRecord, SkippedRecord
from casedb.cases import no_compute, valid_inputs
from casedb.cases import spec as casespec
from casedb.ingest import check, same_call
from casedb.errors import InputError
from casedb.names import model_key
from casedb.store.database import ModelInfo, Occurrence, Store


@dataclass
class FileReport:
    path: str
    format: str
    model: str | None = None
    records: int = 0           # case records read
    occurrences: int = 0       # occurrences after merging identical unnamed calls
    new_cases: int = 0         # signatures not in the DB before (nor earlier in this import)
    duplicates: int = 0        # occurrences whose case was already known
    linked: int = 0            # of those, calls known under another spelling (casedb.ingest.same_call)
    skipped: int = 0
    skipped_reasons: list = field(default_factory=list)
    warnings: list = field(default_factory=list)  # {where, case, problem}: invalid inputs (casedb.ingest.check)
    their_dedupe: dict | None = None  # v2 configs: their runner's dedupe count beside casedb's (model_ops_v2)


@dataclass
class ImportReport:
    files: list[FileReport]
    dry_run: bool = False
    retired: int = 0   # --replace: occurrences no longer imported but judged by runs (kept for history)
    removed: int = 0   # --replace: occurrences no longer imported and never judged (deleted)

    def totals(self) -> dict:
        keys = ("records", "occurrences", "new_cases", "duplicates", "skipped")
        out = {k: sum(getattr(f, k) for f in self.files) for k in keys}
        out["files"] = len(self.files)
        return out

    def to_dict(self) -> dict:
        return {"dry_run": self.dry_run, "files": [asdict(f) for f in self.files], "totals": self.totals(),
                "retired": self.retired, "removed": self.removed}


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files to import: the paths given, folders replaced by their importable files. A folder
    entry that is not a regular file (a FIFO, a link to a device) is kept, so reading refuses it."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if not f.is_dir() and f.name.lower().endswith(importers.SUFFIXES))
            if not found:
                raise InputError("folder has no importable files (.yaml, .jsonl, .json[.gz], .txt)", where=str(p))
            out += found
        elif p.exists() or p.is_symlink():
            out.append(p)
        else:
            raise InputError("no such file or folder", where=str(p))
    for p in out:
        try:
            str(p).encode("utf-8")
        except UnicodeEncodeError:
            raise InputError("the file name is not valid UTF-8; rename the file", where=ascii(str(p))) from None
    return out


_OP_PREFIX = re.compile(r"^(torch\.ops\.|torch\.nn\.functional\.|torch\.Tensor\.|torch\.)")


def _auto_name(op: str, sig: str) -> str:
    short = _OP_PREFIX.sub("", op)
    return f"{short.replace('.', '_').strip('_')}_{sig[:8]}"


@contextmanager
def _paused_gc():
    """Many small live objects and no cycles: the collector's repeated walks would dominate."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_paused_gc()
def prepare(paths, *, format: str | None = None, model: str | None = None,
            strict: bool = False, options: dict | None = None, allow_outside: bool = False,
            max_bytes: int | None = None):
    """Parse and normalize every file; returns (models, occurrences, reports). No DB access.

    allow_outside: read ``file:`` inputs outside the manifest's folder too. max_bytes: cap on
    each file read (decompressed), default ``casedb.files.MAX_INPUT_BYTES``."""
    models: dict[str, ModelInfo] = {}
    occurrences: dict[tuple[str, str], Occurrence] = {}
    named_at: dict[tuple[str, str], str] = {}
    reports = []
    safe_ops: set = set()  # ops the dispatcher let through in this import (casespec.normalize_case)
    for path in expand(paths):
        fmt, parse = _parser(path, format, model, {**(options or {}), "max_bytes": max_bytes})
        reader = _FileReader(path, fmt, model, strict, models, occurrences, named_at,
                             {"allow_outside": allow_outside, "max_bytes": max_bytes, "safe_ops": safe_ops})
        try:
            for rec in parse():
                reader.read(rec)
        except (OSError, EOFError, ValueError, KeyError) as e:
            # A parser's own error on a damaged file: name the file, lose nothing.
            raise InputError(f"cannot read as {fmt}: {type(e).__name__}: {e}", where=str(path)) from None
        except RecursionError:
            raise InputError(f"cannot read as {fmt}: nested too deeply", where=str(path)) from None
        reader.report.their_dedupe = reader.their.summary() if reader.their else None
        if strict:
            check.fail_on(reader.report.warnings)
        reports.append((reader.report, reader.file_keys))
    return list(models.values()), occurrences, reports


def _parser(path: Path, format: str | None, model: str | None,
            options: dict) -> tuple[str, Callable[[], Iterator[ImportRecord]]]:
    """(format, a call that parses the file) for one file: its importer given the options its
    registry row (importers.REGISTRY) says it takes; an option no format takes is refused."""
    try:
        fmt = format or importers.detect(path)
        mod = importers.module(fmt)
        kwargs = importers.parse_options(fmt, options)
    except importers.UnknownFormat as e:
        raise InputError(str(e), where=str(path)) from None
    if fmt in importers.NEEDS_MODEL and not model:
        raise InputError(f"a {fmt} trace does not name its model: pass --model NAME", where=str(path))
    return fmt, lambda: mod.parse(path, **kwargs)


class _FileReader:
    """Turns one file's parsed records into models and occurrences (shared across the files of
    one import: a case name is unique per model, identical unnamed calls add up)."""

    def __init__(self, path: Path, fmt: str, model: str | None, strict: bool, models: dict, occurrences: dict,
                 named_at: dict, case_options: dict):
        self.path, self.model, self.strict = path, model, strict
        self.base_dir = path.parent
        self.models, self.occurrences, self.named_at = models, occurrences, named_at
        self.case_options = case_options
        self.report = FileReport(path=str(path), format=fmt)
        self.file_model: ModelInfo | None = None
        self.defaults: dict = {}
        self.position = 0
        self.file_keys: list = []
        self.their = None  # v2 configs: their runner's dedupe beside casedb's (importers.model_ops_v2)

    def read(self, rec: ImportRecord) -> None:
        kind = rec.get("type")
        if kind == "model":
            self._model(rec)
        elif kind == "skipped":
            self._skip(rec)
        elif kind == "case":
            self._case(rec)
        else:
            raise InputError(f"parser produced a record of unknown type {kind!r}", where=str(self.path))

    def _skip(self, rec: SkippedRecord, nothing_to_judge: bool = False) -> None:
        if self.strict and not nothing_to_judge:
            raise InputError(f"cannot represent {rec.get('op', 'record')}: {rec.get('reason')} "
                             "(drop --strict to skip such records)", where=rec.get("where", str(self.path)))
        self.report.skipped += 1
        self.report.skipped_reasons.append({k: rec.get(k) for k in ("where", "op", "reason")})

    def _model(self, rec: ModelRecord) -> None:
        path = str(self.path)
        name = self.model or rec["name"]
        _check_model_name(name, path)
        self.defaults = casespec.normalize_defaults(rec.get("defaults"), path)
        self.file_model = ModelInfo(name=name, family=rec.get("family"), variant_of=rec.get("variant_of"),
                                    source=rec.get("source", path), description=rec.get("description"),
                                    defaults=self.defaults)
        _add_model(self.models, self.file_model)

    def _case(self, rec: CaseRecord) -> None:
        self.report.records += 1
        name = self._case_model(rec)
        where = rec.get("where") or str(self.path)
        # Every front end makes the same valid inputs: the scanner's rules (an index within its
        # dim, grouped_mm's offsets, a non-zero divisor) for every tensor the file left unset.
        norm = casespec.normalize_case(valid_inputs.apply_raw(rec["case"]), self.defaults, where=where,
                                       base_dir=self.base_dir, **self.case_options)
        idle = no_compute.reason(norm.op, norm.inputs, norm.attrs)
        if idle:
            self.report.records -= 1
            self._skip({"type": "skipped", "where": where, "op": norm.op, "reason": idle}, nothing_to_judge=True)
            return
        if "their_key" in rec:
            from importers.model_ops_v2 import TheirDedupe

            self.their = self.their or TheirDedupe()
            self.their.add(rec["their_key"], norm.signature)
        count = _count(rec, where, norm.name)
        if norm.name is None:
            case_name = _auto_name(norm.op, norm.signature)
            if not norm.description:
                norm.description = where
        else:
            case_name = norm.name
            first = self.named_at.get((name, case_name))
            if first:
                raise InputError(f"duplicate case name (first defined at {first}); names are unique per model",
                                 where=where, case=case_name)
            self.named_at[(name, case_name)] = where
        key = (name, case_name)
        if key in self.occurrences:
            self.occurrences[key].count = _count({"count": self.occurrences[key].count + count}, where, case_name,
                                                 "the calls of this case summed over the file")
        else:
            self.occurrences[key] = Occurrence(model=name, case=norm, name=case_name, source=where,
                                               count=count, position=self.position)
            self.report.occurrences += 1
            self.file_keys.append(key)
            self.report.warnings += check.import_problems(norm, where=where, case=case_name)
        self.position += 1
        self.report.model = name

    def _case_model(self, rec: CaseRecord) -> str:
        """The name of the model a case record belongs to (registered on first sight)."""
        name = self.model or rec.get("model") or (self.file_model.name if self.file_model else None)
        if not name:
            raise InputError("these cases do not name their model: pass --model NAME", where=str(self.path))
        if self.file_model is None or model_key(self.file_model.name) != model_key(name):
            _check_model_name(name, rec.get("where") or str(self.path))
            self.file_model = self.models.get(model_key(name)) or ModelInfo(name=name, source=str(self.path))
            _add_model(self.models, self.file_model)
        return self.file_model.name


def _count(rec: dict, where: str, case: str | None, what: str = "'count'") -> int:
    """The calls a record stands for (the case's own `count`, else the importer's), bounded."""
    from casedb.cases import bounds

    count = rec["case"]["count"] if isinstance(rec.get("case"), dict) and rec["case"].get("count") else rec.get("count")
    try:
        if isinstance(count, float):  # an importer's tally
            count = int(count)
        return bounds.check_count(count or 1, what)
    except (ValueError, OverflowError) as e:
        raise InputError(str(e), where=where, case=case) from None


def _check_model_name(name, where: str) -> None:
    if not isinstance(name, (str, int)) or not str(name).strip():
        raise InputError(f"the model name must be a non-empty string, got {name!r}", where=where)
    try:
        casespec.check_text(str(name), "the model name")
    except ValueError as e:
        raise InputError(str(e), where=where) from None


def _add_model(models: dict, info: ModelInfo) -> None:
    key = model_key(info.name)
    old = models.get(key)
    if old is None or info.defaults or not old.defaults:
        models[key] = info


@_paused_gc()  # while the records are prepared and saved
def import_paths(store: Store, paths, *, format: str | None = None, model: str | None = None,
                 dry_run: bool = False, strict: bool = False, replace: bool = False,
                 options: dict | None = None, allow_outside: bool = False,
                 max_bytes: int | None = None) -> ImportReport:
    """Import files into `store` in one transaction (nothing is written on any error).

    replace: each imported model's cases become exactly the imported ones (see Store.save)."""
    models, occurrences, reports = prepare(paths, format=format, model=model, strict=strict, options=options,
                                           allow_outside=allow_outside, max_bytes=max_bytes)
    same_call.link(store, occurrences, reports)
    known = store.existing_signatures(o.case.signature for o in occurrences.values())
    files = []
    for report, keys in reports:
        for key in keys:
            sig = occurrences[key].case.signature
            if sig in known:
                report.duplicates += 1
            else:
                report.new_cases += 1
                known.add(sig)
        files.append(report)
    out = ImportReport(files=files, dry_run=dry_run)
    if not dry_run:
        saved = store.save(models, occurrences.values(), replace_models=[m.name for m in models] if replace else ())
        out.retired, out.removed = saved["retired"], saved["removed"]
    return out
