"""Triage files read and checked: paths, parsing, the checks of every value, :func:`load`.

What a triage file holds is described in :mod:`casedb.triage.entries`; the checks that need the DB
(stale entries, ties) are :mod:`casedb.triage.checks`. Nothing in a file is executed: it is read
as data, within the manifest loader's bounds (importers.yaml_manifest).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from casedb import names, outcomes
from casedb.cases import dtypes, marks as marks_mod
from casedb.errors import InputError
from casedb.judge import numerics
from casedb.judge.selectors import CASE_KEYS, LITERAL, REGEX_TELL, SIGNATURE, TARGET_KEYS, WILD, Pattern, brackets_close
from casedb.triage.entries import (DEFAULT_KEYS, ENTRY_KEYS, MAX_FILE_BYTES, MAX_ITEMS, RULE_KEYS, STATUSES, TOP_KEYS,
                                   UNLISTED, VERSION, Entry, RuleSpec, Triage)

# Spellings from tt-xla and the RFC implementation, offered as the suggestion (still an error).
_STATUS_HINTS = {"expected_passing": "expected_pass", "known_failure_xfail": "known_failure", "xfail": "known_failure",
                 "xfail_strict": "known_failure", "not_supported_skip": "not_supported", "skip": "not_supported",
                 "exclude_model": "exclude", "mandatory_success": "expected_pass", "pass": "expected_pass"}
_STAGE_HINTS = {"failed_fe_compilation": "compile: dynamo trace", "failed_ttmlir_compilation": "compile: backend compiler",
                "failed_runtime": "runtime", "incorrect_result": "incorrect result", "compile": "compile: backend compiler",
                "lowering": "compile: lowering", "dynamo": "compile: dynamo trace"}


@dataclass(frozen=True)
class Problem:
    """Something wrong in a triage file, at ``where`` (file:line)."""

    where: str
    message: str
    suggestion: str | None = None
    kind: str = "value"       # syntax, unknown_key, value, stale, conflict, duplicate, limit

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" + (f" ({self.suggestion})" if self.suggestion else "")

    def to_dict(self) -> dict:
        return {"where": self.where, "kind": self.kind, "message": self.message, "suggestion": self.suggestion}


def did_you_mean(word, choices) -> str | None:
    """``did you mean 'x'?`` for the choice closest to ``word`` (case-insensitive), or None."""
    return names.did_you_mean(word, choices, ignore_case=True) or None


def default_paths(root: Path = Path(".")) -> list[Path]:
    """``triage/*.yaml`` (and ``*.yml``) under ``root``, sorted: what a run loads by default."""
    folder = Path(root) / "triage"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def shipped_paths() -> list[Path]:
    """The triage files shipped beside casedb's manifests (``manifests/triage/*.yaml``)."""
    from casedb.store.database import SHIPPED_MANIFESTS

    return default_paths(SHIPPED_MANIFESTS)


def run_paths(given, *, cwd: Path = Path("."), shipped: bool = True) -> list[str]:
    """The triage files a run loads, by absolute path: ``given`` (else ``triage/*.yaml`` under
    ``cwd``), then the shipped ones unless ``shipped`` is off (their entries name the shipped
    models and the backend they fail on, so they apply to nothing else)."""
    paths = [Path(p) for p in given] if given else default_paths(cwd)
    if shipped:
        paths += shipped_paths()
    out: list[str] = []
    for p in paths:
        resolved = str(Path(p).resolve())
        if resolved not in out:
            out.append(resolved)
    return out


def implicit_paths(given, *, cwd: Path = Path(".")) -> list[str]:
    """The files a run loads without being told (``triage/*.yaml`` under ``cwd`` when ``given``
    names none), by absolute path: the run summary says so of each."""
    return [] if given else [str(p.resolve()) for p in default_paths(cwd)]


class YamlFile:
    """One file's text and document, with the line of each key (for problems and edits)."""

    def __init__(self, path: Path):
        from casedb import files
        from importers import yaml_manifest

        self.path = Path(path)
        try:
            self.text = files.read_text(self.path, MAX_FILE_BYTES)
            self.doc = yaml_manifest.load(self.path, MAX_FILE_BYTES)
        except InputError as e:  # (in the words of a triage file, not of an import)
            message = e.message.replace("; fix the file and import again", "; fix the file").replace(
                "; if it is genuine, raise the limit with casedb import --max-input-mb N", ": split it into several files")
            raise InputError(message, where=e.where) from None
        self.lines = self.text.splitlines()

    def where(self, line: int | None) -> str:
        return f"{self.path}:{line}" if line else str(self.path)

    def key_line(self, start: int | None, key: str, stop: int | None = None) -> int | None:
        """The line (1-based) of ``key:`` in the mapping starting at ``start`` (before ``stop``)."""
        if not start:
            return None
        pat = _key_pattern(str(key))
        end = min(len(self.lines), (stop - 1) if stop else start + 400)
        for i in range(start - 1, end):
            if pat.search(self.lines[i]):
                return i + 1
        return start

    def top_line(self, key: str) -> int | None:
        pat = re.compile(rf"^['\"]?{re.escape(key)}['\"]?\s*:")
        return next((i + 1 for i, line in enumerate(self.lines) if pat.match(line)), None)


@functools.lru_cache(maxsize=64)
def _key_pattern(key: str) -> re.Pattern:
    return re.compile(rf"(?:^|[\s{{,\-])['\"]?{re.escape(key)}['\"]?\s*:(?:\s|$)")


def _check_pattern(key: str, value, where: str, problems: list) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        problems.append(Problem(where, f"{key}: takes a name or a wildcard pattern, not {value!r}",
                                "write it in quotes" if isinstance(value, bool) else None))
        return None
    text = str(value)
    if text.startswith(LITERAL):  # the exact value: nothing in it is a pattern
        return text
    exact = f"or write {LITERAL!r} before an exact name that has them"
    if not text.strip():
        problems.append(Problem(where, f"{key}: is empty", "remove the key to select every value"))
        return None
    if text != text.strip():
        problems.append(Problem(where, f"{key}: {text!r} has leading or trailing spaces", f"remove them, {exact}"))
        return None
    if REGEX_TELL.search(text):
        problems.append(Problem(where, f"{key}: {text!r} looks like a regular expression",
                                f"patterns are shell-style wildcards: * ? [abc]; {exact.removeprefix('or ')}"))
        return None
    if not brackets_close(text):
        problems.append(Problem(where, f"{key}: {text!r} has an unbalanced [ ]",
                                f"close the bracket, or write [[] for a [ and []] for a ], {exact}"))
        return None
    return text


def check_number(key: str, value, where: str, problems: list, *, positive: bool = False,
                 most: float = math.inf) -> float | None:
    """``value`` as a number >= 0 (> 0 when ``positive``, at most ``most``); None, with a
    problem, otherwise. YAML 1.1 reads 1e-3 (no dot) as text: text that is a number is one."""
    try:
        x = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < 0 or (positive and x == 0) or x > most:
        bound = f" and at most {most:g}" if math.isfinite(most) else ""
        problems.append(Problem(where, f"{key}: takes a number {'> 0' if positive else '>= 0'}{bound}, not {value!r}"))
        return None
    return x


def _selectors(m: dict, f: YamlFile, line: int, stop, problems: list, keys) -> dict:
    out = {}
    for k in keys:
        if k not in m or m[k] is None:
            continue
        where = f.where(f.key_line(line, k, stop))
        v = m[k]
        if k == "signature":
            text = str(v).strip().lower() if isinstance(v, str) else ""
            if not SIGNATURE.fullmatch(text):
                problems.append(Problem(where, f"signature: takes a hex prefix of a case signature (4 to 64 "
                                               f"characters, no wildcards), not {v!r}", "see `casedb cases`"))
                continue
            out[k] = text
        elif k == "marks":
            if isinstance(v, list):
                bad = [x for x in v if not isinstance(x, str) or not marks_mod.is_mark_name(x)]
                if bad or not v:
                    problems.append(Problem(where, f"marks: takes mark names or a marker expression, not {v!r}"))
                    continue
                out[k] = list(v)
            elif isinstance(v, str) and v.strip():
                try:
                    marks_mod.MarkExpression(v)
                except ValueError as e:
                    problems.append(Problem(where, f"marks: {e}"))
                    continue
                out[k] = v.strip()
            else:
                problems.append(Problem(where, f"marks: takes mark names or a marker expression, not {v!r}"))
        elif k == "dtype":
            text = _check_pattern(k, v, where, problems)
            if text is None:
                continue
            if not WILD.search(text):
                try:
                    text = dtypes.canonical(text)
                except dtypes.UnknownDtype:
                    problems.append(Problem(where, f"dtype: unknown dtype {text!r}",
                                            did_you_mean(text, dtypes.CANONICAL) or f"one of {', '.join(dtypes.CANONICAL)}"))
                    continue
            out[k] = text
        else:
            text = _check_pattern(k, v, where, problems)
            if text is not None:
                out[k] = text
    return out


def _unknown_keys(m: dict, allowed, f: YamlFile, line, stop, problems: list, what: str) -> None:
    for k in m:
        if k not in allowed:
            problems.append(Problem(f.where(f.key_line(line, k, stop)), f"unknown key {k!r} in {what}",
                                    did_you_mean(k, allowed) or f"allowed: {', '.join(allowed)}", "unknown_key"))


@dataclass
class Parsed:
    """What :func:`parse` read of the files, in order."""

    entries: list[Entry] = field(default_factory=list)
    specs: list[RuleSpec] = field(default_factory=list)
    unlisted: dict = field(default_factory=dict)    # file:line -> what its defaults: unlisted says
    files: list[YamlFile] = field(default_factory=list)
    order: int = 0                                  # items read so far (a rule's or an entry's order)

    def unlisted_value(self, problems: list) -> str:
        values = set(self.unlisted.values())
        if len(values) > 1:
            problems.append(Problem(", ".join(self.unlisted), f"files disagree on defaults: unlisted "
                                    f"({', '.join(sorted(values))})", "give it in one file", "conflict"))
        return values.pop() if len(values) == 1 else "unspecified"


def parse(paths, problems: list) -> Parsed:
    """Everything in these files that reads, each problem appended to ``problems``."""
    parsed = Parsed()
    for path in paths:
        try:
            f = YamlFile(path)
        except InputError as e:
            problems.append(Problem(e.where or str(path), e.message, None, "syntax"))
            continue
        parsed.files.append(f)
        doc = f.doc
        if doc is None:
            continue
        if not isinstance(doc, dict):
            problems.append(Problem(f.where(1), "a triage file is a mapping (version, defaults, tolerances, cases)"))
            continue
        _parse_head(doc, f, parsed, problems)
        for section in sorted(("tolerances", "cases"), key=lambda k: f.top_line(k) or 0):  # as written
            _parse_section(doc, section, f, parsed, problems)
    return parsed


def _parse_head(doc: dict, f: YamlFile, parsed: Parsed, problems: list) -> None:
    """The file's keys, ``version`` and ``defaults``."""
    _unknown_keys(doc, TOP_KEYS, f, 1, None, problems, "the file")
    if "version" in doc and doc["version"] != VERSION:
        problems.append(Problem(f.where(f.top_line("version")), f"version: {doc['version']!r} is not a triage "
                                                               f"format this casedb reads", f"write version: {VERSION}"))
    d = doc.get("defaults")
    if d is None:
        return
    line = f.top_line("defaults")
    if not isinstance(d, dict):
        problems.append(Problem(f.where(line), "defaults: takes a mapping (unlisted: ...)"))
        return
    _unknown_keys(d, DEFAULT_KEYS, f, line, None, problems, "defaults")
    if "unlisted" not in d:
        return
    if d["unlisted"] not in UNLISTED:
        problems.append(Problem(f.where(f.key_line(line, "unlisted")),
                                f"defaults: unlisted: takes {' or '.join(UNLISTED)}, not {d['unlisted']!r}",
                                did_you_mean(d["unlisted"], UNLISTED)))
    else:
        parsed.unlisted[f.where(f.key_line(line, "unlisted"))] = d["unlisted"]


def _parse_section(doc: dict, section: str, f: YamlFile, parsed: Parsed, problems: list) -> None:
    """The items of ``tolerances:`` or ``cases:``."""
    items = doc.get(section)
    if items is None:
        return
    if not isinstance(items, list):
        problems.append(Problem(f.where(f.top_line(section)), f"{section}: takes a list of mappings"))
        return
    if len(items) > MAX_ITEMS:
        problems.append(Problem(f.where(f.top_line(section)), f"{section}: has {len(items):,} items; a triage "
                                f"file holds at most {MAX_ITEMS:,}", "split it into several files", "limit"))
        return
    lines = _item_lines(f, items, f.top_line(section))
    stops = _next_lines(lines)
    for i, m in enumerate(items):
        line = lines[i] or f.top_line(section)
        if not isinstance(m, dict):
            problems.append(Problem(f.where(line), f"each item of {section}: is a mapping, not {m!r}"))
            continue
        parsed.order += 1
        if section == "tolerances":
            spec = _parse_rule(m, f, line, stops[i], parsed.order, problems)
            if spec is not None:
                parsed.specs.append(spec)
            continue
        entry = _parse_entry(m, f, line, stops[i], parsed.order, problems)
        if entry is None:
            continue
        parsed.entries.append(entry)
        if entry.rtol is not None or entry.atol is not None:
            parsed.specs.append(_entry_rule(entry))


def _entry_rule(entry: Entry) -> RuleSpec:
    """The tolerance rule of a case entry that sets rtol/atol."""
    kw = {k: v for k, v in entry.selectors.items() if k in numerics.RULE_KEYS}
    rule = numerics.Rule(rtol=entry.rtol, atol=entry.atol, **kw, where=entry.where, order=entry.order)
    arch = Pattern(entry.selectors["arch"], "arch") if "arch" in entry.selectors else None
    return RuleSpec(rule, arch, entry.selectors)


def _item_lines(f: YamlFile, items: list, start: int | None) -> list:
    """The line of each list item: a mapping's own; a scalar's, found after the item before it
    (within 400 lines: a file of unmatched scalars is not searched to its end per item)."""
    out, at = [], start or 1
    for m in items:
        line = getattr(m, "line", None)
        if line is None and not isinstance(m, (dict, list)):
            pat = re.compile(rf"^\s*-\s*['\"]?{re.escape(str(m))}")
            line = next((i + 1 for i in range(at, min(len(f.lines), at + 400)) if pat.match(f.lines[i])), None)
        out.append(line)
        at = line or at
    return out


def _next_lines(lines: list) -> list:
    """For each item, the first known line of an item after it (None: none)."""
    out, after = [None] * len(lines), None
    for i in range(len(lines) - 1, -1, -1):
        out[i] = after
        after = lines[i] or after
    return out


def _parse_rule(m: dict, f: YamlFile, line, stop, order: int, problems: list) -> RuleSpec | None:
    before = len(problems)
    _unknown_keys(m, RULE_KEYS, f, line, stop, problems, "a tolerance rule")
    sel = _selectors(m, f, line, stop, problems, [k for k in RULE_KEYS if k not in ("rtol", "atol")])
    values = {}
    for k in ("rtol", "atol"):
        if m.get(k) is not None:
            values[k] = check_number(k, m[k], f.where(f.key_line(line, k, stop)), problems)
    if not values:
        problems.append(Problem(f.where(line), "a tolerance rule sets rtol, atol or both"))
    if len(problems) > before:
        return None
    kw = {k: v for k, v in sel.items() if k != "arch"}
    return RuleSpec(numerics.Rule(**values, **kw, where=f.where(line), order=order),
                     Pattern(sel["arch"], "arch") if "arch" in sel else None, sel)


def _parse_entry(m: dict, f: YamlFile, line, stop, order: int, problems: list) -> Entry | None:
    before = len(problems)
    where = f.where(line)
    _unknown_keys(m, ENTRY_KEYS, f, line, stop, problems, "a case entry")
    sel = _selectors(m, f, line, stop, problems, CASE_KEYS + TARGET_KEYS)
    status = m.get("status")
    misspelt = any(did_you_mean(k, ENTRY_KEYS) == "did you mean 'status'?" for k in m if k not in ENTRY_KEYS)
    if status is None and not misspelt:  # (a misspelt status is reported as such)
        problems.append(Problem(where, "an entry needs a status", f"one of {', '.join(STATUSES)}; tolerances alone "
                                                                  "go under tolerances:"))
    elif status is not None and status not in STATUSES:
        hint = _STATUS_HINTS.get(str(status).lower())
        problems.append(Problem(f.where(f.key_line(line, "status", stop)), f"status: unknown status {status!r}",
                                f"did you mean {hint!r}?" if hint else
                                (did_you_mean(status, STATUSES) or f"one of {', '.join(STATUSES)}")))
    stage = m.get("stage")
    if stage is not None and stage not in outcomes.STAGES:
        hint = _STAGE_HINTS.get(str(stage).lower())
        problems.append(Problem(f.where(f.key_line(line, "stage", stop)), f"stage: unknown stage {stage!r}",
                                f"did you mean {hint!r}?" if hint else
                                (did_you_mean(stage, outcomes.STAGES) or f"one of {', '.join(outcomes.STAGES)}")))
    reason = m.get("reason")
    if reason is not None and not isinstance(reason, str):
        problems.append(Problem(f.where(f.key_line(line, "reason", stop)), "reason: takes text", "write it in quotes"))
    nums = {}
    for k in ("rtol", "atol", "timeout"):
        if m.get(k) is not None:
            nums[k] = check_number(k, m[k], f.where(f.key_line(line, k, stop)), problems, positive=k == "timeout",
                                   most=outcomes.MAX_TIMEOUT if k == "timeout" else math.inf)
    if ("rtol" in nums or "atol" in nums) and "marks" in sel:
        problems.append(Problem(where, "rtol/atol on an entry that selects by marks cannot be applied",
                                "select the cases by op, name, model, signature or dtype for a tolerance"))
    if len(problems) > before:
        return None
    return Entry(status=status, where=where, reason=reason, stage=stage, rtol=nums.get("rtol"), atol=nums.get("atol"),
                 timeout=nums.get("timeout"), selectors=sel, order=order, path=str(f.path), line=line or 0,
                 written=dict(m))


def load(paths) -> Triage:
    """The triage of these files (in this order); InputError at the first problem, naming its
    file:line (``casedb triage check`` lists them all). Stale entries and conflicts need the DB:
    :func:`casedb.triage.checks.check`."""
    paths = [Path(p) for p in paths]
    problems: list[Problem] = []
    parsed = parse(paths, problems)
    unlisted = parsed.unlisted_value(problems)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more: run `casedb triage check`)" if len(problems) > 1 else ""
        raise InputError(first.message + (f" — {first.suggestion}" if first.suggestion else "") + more,
                         where=first.where)
    return Triage(parsed.entries, parsed.specs, unlisted, paths)
