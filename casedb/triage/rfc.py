"""``casedb triage import``: a triage file from the RFC implementation's ``skip_files.yaml`` and
test-suite config (:func:`import_rfc` documents the mapping)."""

from __future__ import annotations

import re
from pathlib import Path

from casedb.cases import dtypes
from casedb.errors import InputError
from casedb.escape import yaml_comment as emit_comment
from casedb.console import clean
from casedb.triage.editor import emit_entry
from casedb.triage.entries import SETTING_KEYS, VERSION
from casedb.triage.files import YamlFile, check_number

_SKIP_PATH = re.compile(r"^(?:.*/)?models/(?P<model>[^/]+)(?:/(?:test_(?P<case>.+?)\.py)?)?/?$")
_MODES = {"mandatory_success": "expected_pass", "xfail": "known_failure", "xfail_strict": "known_failure",
          "skip": "not_supported"}


def import_rfc(paths, *, scope: dict | None = None) -> str:
    """Triage YAML (text, with comments naming each source line) from the RFC implementation's
    files. ``scope``: target keys (device, backend, arch) put on every entry and rule.

    * ``skip_files.yaml``: ``skip:`` and ``xfail:``, each a list of test files or a mapping of
      reason (the category) to a list of test files. A file ``models/<model>/test_<case>.py``
      (wildcards allowed) becomes ``{model, name: <case>}``; ``models/<model>/`` the whole model.
      skip → not_supported, xfail → known_failure, the category as reason.
    * the test-suite config (``test_suite_config:``): a test with ``model__<model>`` tags becomes
      ``{model}`` with its ``mode`` (mandatory_success → expected_pass, xfail/xfail_strict →
      known_failure, skip → not_supported); its ``edits.ops.exclude`` (cases by ``name``/``op``
      or ops by name) and ``edits.dtypes.exclude`` → exclude; a file's ``unlisted_test_mode`` →
      ``defaults: unlisted: expected_pass`` (mandatory_success) or an entry for every case
      (xfail → known_failure, skip → not_supported); ``global.supported_dtypes[].precision`` and
      ``global.supported_ops[].dtypes[].precision`` → tolerance rules (per dtype, per op and
      dtype); ``supported_ops[].force_xfail`` → known_failure for the op. Tests without a model
      tag (upstream PyTorch tests) are listed as not imported. Op names without a dot are
      ``torch.<name>``.

    Every value is checked before it is written: a section that is not the mapping or list it
    should be, a name or mode that is not text or holds a control character, a precision that is
    not a number >= 0 is refused (InputError naming file:line); file paths in comments are written
    with their control characters escaped.
    """
    scope = {k: v for k, v in (scope or {}).items() if v}
    found = _Found()
    for path in paths:
        found.read(Path(path))
    return "".join(_head(found, scope) + _rules(found, scope) + _cases(found, scope) + _notes(found))


class _Found:
    """What the files given hold: case entries and tolerance rules (each with the comment naming its
    source), what is not imported, and ``unlisted_test_mode`` ((status, source) of the first file)."""

    def __init__(self):
        self.cases: list[tuple[dict, str]] = []
        self.rules: list[tuple[dict, str]] = []
        self.notes: list[str] = []
        self.unlisted: tuple[str, str] | None = None
        self.sources: list[str] = []

    def read(self, path: Path) -> None:
        self.sources.append(str(path))
        f = YamlFile(path)
        doc = f.doc
        if isinstance(doc, dict) and "test_suite_config" in doc:
            _import_config(doc["test_suite_config"], f, self)
        elif isinstance(doc, dict) and set(doc) & {"skip", "xfail"} and set(doc) <= {"skip", "xfail"}:
            _import_skip_files(doc, f, self)
        else:
            raise InputError("not a file of the RFC implementation: expected skip_files.yaml (skip:, xfail:) or a "
                             "test-suite config (test_suite_config:)", where=str(path))

    @property
    def unlisted_passes(self) -> bool:
        return bool(self.unlisted) and self.unlisted[0] == "expected_pass"


def _head(found: _Found, scope: dict) -> list[str]:
    out = _comment(f"Imported by `casedb triage import` from {', '.join(found.sources)}.", 0) + [
        "# Review it (`casedb triage check`) before committing: see casedb/triage/rfc.py for the mapping.\n",
        f"version: {VERSION}\n"]
    if found.unlisted_passes:
        out += _comment(found.unlisted[1], 0) + ["defaults:\n", "  unlisted: expected_pass\n"]
    return out


def _rules(found: _Found, scope: dict) -> list[str]:
    if not found.rules:
        return []
    out = ["tolerances:\n"]
    for d, src in found.rules:
        out += _comment(src, 2) + emit_entry({**d, **scope}, 2)
    return out


def _cases(found: _Found, scope: dict) -> list[str]:
    """``cases:``: an entry for the unlisted tests (unless they must pass), then each case entry once."""
    unlisted = found.unlisted if found.unlisted and not found.unlisted_passes else None
    out = ["cases:\n" if found.cases or unlisted else "cases: []\n"]
    if unlisted:
        out += _comment(unlisted[1], 2) + emit_entry({**scope, "status": unlisted[0], "reason": unlisted[1]}, 2)
    seen = set()
    for d, src in found.cases:
        key = tuple(sorted((k, str(v)) for k, v in d.items()))
        if key in seen:
            continue
        seen.add(key)
        sel = {k: v for k, v in d.items() if k not in SETTING_KEYS}
        out += _comment(src, 2) + emit_entry({**sel, **scope, **{k: v for k, v in d.items() if k in SETTING_KEYS}}, 2)
    return out


def _notes(found: _Found) -> list[str]:
    return ["# Not imported:\n"] + _comment("\n".join(found.notes), 0) if found.notes else []


def _comment(text: str, indent: int) -> list[str]:
    """Comment lines of text that names files and values from elsewhere (control characters
    escaped: YAML refuses them even in a comment)."""
    return emit_comment(clean(text), indent)


def _line(obj, parent=None) -> int | None:
    return getattr(obj, "line", None) or getattr(parent, "line", None)


def _rfc(value, kind: type, what: str, f: YamlFile, line: int | None):
    """``value`` checked to be a ``kind`` (dict, list or str: text without control characters);
    None is an empty one (no text). InputError naming file:line otherwise."""
    if value is None and kind is not str:
        return kind()
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, kind):
        shown = {dict: "a mapping", list: "a list", str: "text"}[kind]
        raise InputError(f"{what}: takes {shown}, not {str(value)[:60]!r}", where=f.where(line))
    if kind is str:
        if clean(value) != value or any(c in value for c in "\n\u2028\u2029"):
            raise InputError(f"{what}: {clean(value)[:80]!r} holds a control character or line break; a name is "
                             "one line of text", where=f.where(line))
    return value


def _import_skip_files(doc: dict, f: YamlFile, found: _Found) -> None:
    for kind in ("skip", "xfail"):
        section = doc.get(kind)
        if section is None:
            continue
        status = "not_supported" if kind == "skip" else "known_failure"
        if isinstance(section, list):
            groups = [(f"listed under {kind} in {f.path.name}", section, f.top_line(kind))]
        elif isinstance(section, dict):
            groups = [(_rfc(reason, str, f"{kind}: a reason", f, f.top_line(kind)), paths,
                       f.key_line(f.top_line(kind), reason)) for reason, paths in section.items()]
        else:
            raise InputError(f"{kind}: takes a list of test files or a mapping of reason to test files",
                             where=f.where(f.top_line(kind)))
        for reason, paths, line in groups:
            for p in _rfc(paths, list, f"{kind}: {reason}: the test files", f, line):
                p = _rfc(p, str, f"{kind}: {reason}: a test file", f, line)
                m = _SKIP_PATH.match(p.strip())
                if not m:
                    found.notes.append(f"{f.where(line)}: {p} (not models/<model>/test_<case>.py)")
                    continue
                sel = {"model": m["model"]}
                if m["case"]:
                    sel["name"] = m["case"]
                found.cases.append(({**sel, "status": status, "reason": reason}, f"{f.where(line)}: {kind}: {p}"))


def _op_name(name: str) -> str:
    return name if "." in name else f"torch.{name}"


def _import_config(cfg, f: YamlFile, found: _Found) -> None:
    cfg = _rfc(cfg, dict, "test_suite_config", f, _line(cfg))
    glob = _rfc(cfg.get("global"), dict, "global", f, _line(cfg.get("global"), cfg))
    _import_global(glob, f, found)
    for entry in _rfc(cfg.get("files"), list, "files", f, _line(cfg.get("files"), cfg)):
        _import_file(_rfc(entry, dict, "files: an entry", f, _line(entry, cfg)), f, found)


def _import_file(entry: dict, f: YamlFile, found: _Found) -> None:
    """One test file of ``files:``: its ``unlisted_test_mode`` (the first file's counts) and its tests."""
    mode = _rfc(entry.get("unlisted_test_mode", "skip"), str, "unlisted_test_mode", f, _line(entry))
    if mode not in _MODES:
        raise InputError(f"unlisted_test_mode: unknown mode {mode!r}", where=f.where(entry.line))
    src = f"unlisted_test_mode: {mode} ({f.where(f.key_line(entry.line, 'unlisted_test_mode'))})"
    if found.unlisted is None:
        found.unlisted = (_MODES[mode], src)
    elif found.unlisted[0] != _MODES[mode]:
        found.notes.append(f"{src}: differs from the first file's ({found.unlisted[1]})")
    for test in _rfc(entry.get("tests"), list, "tests", f, _line(entry.get("tests"), entry)):
        _import_test(_rfc(test, dict, "tests: an entry", f, _line(test, entry)), f, found)


def _import_global(glob: dict, f: YamlFile, found: _Found) -> None:
    for d in _rfc(glob.get("supported_dtypes"), list, "supported_dtypes", f, _line(glob)):
        d = _rfc(d, dict, "supported_dtypes: an entry", f, _line(d, glob))
        if d.get("precision"):
            _rule(found, f, d, {"dtype": d.get("name")}, d["precision"], "global.supported_dtypes")
    for op in _rfc(glob.get("supported_ops"), list, "supported_ops", f, _line(glob)):
        op = _rfc(op, dict, "supported_ops: an entry", f, _line(op, glob))
        name = _op_name(_rfc(op.get("name"), str, "supported_ops: name", f, _line(op)))
        for d in _rfc(op.get("dtypes"), list, f"supported_ops: {name}: dtypes", f, _line(op)):
            d = _rfc(d, dict, f"supported_ops: {name}: a dtype", f, _line(d, op))
            if d.get("precision"):
                _rule(found, f, d, {"op": name, "dtype": d.get("name")}, d["precision"], "global.supported_ops")
        if op.get("force_xfail"):
            found.cases.append(({"op": name, "status": "known_failure", "reason": f"force_xfail in {f.path.name}"},
                                f"{f.where(op.line)}: supported_ops: force_xfail"))


def _import_test(test: dict, f: YamlFile, found: _Found) -> None:
    """One test of a file's ``tests:``: an entry per ``model__`` tag, and its edits."""
    tags = [_rfc(t, str, "tags: a tag", f, test.line) for t in _rfc(test.get("tags"), list, "tags", f, test.line)]
    models = [t[len("model__"):] for t in tags if t.startswith("model__")]
    names = ", ".join(_rfc(n, str, "names: a name", f, test.line)
                      for n in _rfc(test.get("names"), list, "names", f, test.line))
    if not models:
        found.notes.append(f"{f.where(test.line)}: {names} (an upstream test: no model__ tag)")
        return
    mode = _rfc(test.get("mode", "mandatory_success"), str, "mode", f, test.line)
    if mode not in _MODES:
        raise InputError(f"mode: unknown mode {mode!r}", where=f.where(test.line))
    edits = _rfc(test.get("edits"), dict, "edits", f, test.line)
    ops = _rfc(_rfc(edits.get("ops"), dict, "edits: ops", f, test.line).get("exclude"), list, "ops: exclude", f,
               test.line)
    dts = _rfc(_rfc(edits.get("dtypes"), dict, "edits: dtypes", f, test.line).get("exclude"), list,
               "dtypes: exclude", f, test.line)
    for model in models:
        found.cases.append(({"model": model, "status": _MODES[mode], "reason": f"mode: {mode} ({names})"},
                            f"{f.where(test.line)}: {names}: mode {mode}"))
        _import_excludes(model, ops, dts, test, f, found)


def _import_excludes(model: str, ops: list, dts: list, test: dict, f: YamlFile, found: _Found) -> None:
    """A test's ``edits``: the ops and dtypes it excludes, for one of its models."""
    cases = found.cases
    for item in ops:
        item = _rfc(item, dict, "ops: exclude: an entry", f, _line(item, test))
        name = _rfc(item.get("name"), str, "ops: exclude: name", f, _line(item, test))
        sel = {"model": model, "name": name} if item.get("op") else {"model": model, "op": _op_name(name)}
        cases.append(({**sel, "status": "exclude", "reason": _reason(item, "edits.ops.exclude", f, test)},
                      f"{f.where(_line(item, test))}: edits.ops.exclude"))
    for item in dts:
        name = _rfc(item, dict, "dtypes: exclude: an entry", f, _line(item, test)).get("name")
        try:
            dt = dtypes.canonical(name)
        except (dtypes.UnknownDtype, TypeError):
            found.notes.append(f"{f.where(_line(item, test))}: dtype {name!r} (unknown to casedb)")
            continue
        cases.append(({"model": model, "dtype": dt, "status": "exclude",
                       "reason": _reason(item, "edits.dtypes.exclude", f, test)},
                      f"{f.where(_line(item, test))}: edits.dtypes.exclude"))


def _reason(item: dict, default: str, f: YamlFile, parent) -> str:
    text = item.get("description")
    return default if text is None else _rfc(text, str, "description", f, _line(item, parent))


def _rule(found: _Found, f: YamlFile, d, sel: dict, prec, what: str) -> None:
    where = f.where(_line(d))
    try:
        sel["dtype"] = dtypes.canonical(sel["dtype"])
    except (dtypes.UnknownDtype, TypeError):
        found.notes.append(f"{where}: {what}: dtype {sel['dtype']!r} (unknown to casedb)")
        return
    prec = _rfc(prec, dict, "precision", f, _line(d))
    values, problems = {}, []
    for k in ("rtol", "atol"):
        if prec.get(k) is not None:
            values[k] = check_number(f"precision: {k}", prec[k], where, problems)
    if problems:
        raise InputError(problems[0].message, where=where)
    if values:
        found.rules.append(({**sel, **values}, f"{where}: {what}"))
