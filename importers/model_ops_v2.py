"""The RFC implementation's v2 model-ops configs (``test_suite_config:``) → records.

Where each key lands is tabled in README.md here ("v2 model-ops configs"). In short: every
``edits.ops.include`` item of a test tagged ``model__<name>`` is a case of that model (op =
``name``, inputs = ``sample_inputs_func``, name = its numbered tag ``<op>.<n>``, the other tags
marks); the file's judgement rides on each case (tolerances from ``supported_dtypes[].precision``
of the case's dtype, ``skip_if``/``xfail_if`` from the test's mode and excludes) and its seed on
the model (``input_config.seed``).

Their loader ignores unknown keys everywhere but in a tensor spec; casedb refuses every key it
does not know, naming file:line, so a typo never silently changes what runs. Each case record
carries ``their_key``, the key their runner dedupes by, for :class:`TheirDedupe`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterator

from casedb.cases import bounds, dtypes
from casedb.cases.marks import is_mark_name
from casedb.errors import InputError
from importers import unrunnable, yaml_manifest
from importers.record import CaseRecord, ImportRecord, SkippedRecord
from importers.v2_inputs import (ARG_KINDS, INIT_ARG_KEYS, INITS, TENSOR_KEYS, THEIR_CONFIG_DIR, _arg, _kwarg,  # noqa: F401
                                 _Opaque, tensor)

SUITE_KEYS = ("labels", "global", "files")
GLOBAL_KEYS = ("supported_dtypes", "supported_ops", "supported_modules", "input_config")
DTYPE_KEYS = ("name", "description", "precision", "force_xfail")
FILE_KEYS = ("path", "unlisted_test_mode", "labels", "tests")
TEST_KEYS = ("names", "mode", "tags", "labels", "no_grad", "edits")
EDIT_KEYS = ("ops", "dtypes", "modules", "functions")
# an item-level ``kwargs`` (beside sample_inputs_func, not in it) is read by their loader and by their
# runner not at all (their item model drops unknown keys; only sample_inputs_func.kwargs reach the op):
# accepted and, as there, not used
# ``casedb``: what casedb's export writes beside an item for casedb's own re-import (their item model
# drops unknown keys, so their runner never sees it): RECORD_KEYS, README.md here
RECORD_KEY = "casedb"
OP_KEYS = ("name", "sample_inputs_func", "description", "tags", "kwargs", RECORD_KEY)
RECORD_KEYS = ("expects_error", "op", "inputs", "attrs", "seed", "check")
MODES = ("mandatory_success", "xfail", "xfail_strict", "skip")
# tensor spec defaults of their loader (what repr() of a parsed spec prints for an omitted key)
TENSOR_DEFAULTS = {"device": "privateuse1", "init": "rand", "stride": None, "storage_offset": 0,
                   "device_layout": None}
INIT_DEFAULTS = {"low": 0, "high": None, "total": None, "fill_value": None, "path": None, "key": None}
XFAIL_IF = "device != 'cpu'"
# model__ tags on one test: each makes every item of the test a case of that model, so tags x items
# grows as the square of the file (a 77 KB file made 90,000 occurrences); real tests carry one
MAX_MODEL_TAGS = 16
_SNIFF = re.compile(r"^test_suite_config\s*:", re.M)


def sniff(path: Path, head: str) -> bool:
    """True for a YAML file with a top-level ``test_suite_config:``."""
    return Path(path).suffix.lower() in (".yaml", ".yml") and bool(_SNIFF.search(head))


class _File:
    def __init__(self, path: Path):
        self.path = path

    def where(self, obj=None, parent=None) -> str:
        line = getattr(obj, "line", None) or getattr(parent, "line", None)
        return f"{self.path}:{line}" if line else str(self.path)

    def mapping(self, obj, allowed, what: str, parent=None) -> dict:
        """`obj` checked to be a mapping of only `allowed` keys (None: empty)."""
        if obj is None:
            return {}
        if not isinstance(obj, dict):
            raise InputError(f"{what} must be a mapping, not {str(obj)[:60]!r}", where=self.where(obj, parent))
        for k in obj:
            if k not in allowed:
                close = difflib.get_close_matches(str(k), allowed, n=1)
                hint = f" — did you mean {close[0]!r}?" if close else ""
                raise InputError(f"unknown key {k!r} in {what}{hint} (allowed: {', '.join(allowed)})",
                                 where=self.where(obj, parent))
        return obj

    def seq(self, obj, what: str, parent=None) -> list:
        if obj is None:
            return []
        if not isinstance(obj, list):
            raise InputError(f"{what} must be a list, not {str(obj)[:60]!r}", where=self.where(obj, parent))
        return obj


def parse(path, *, max_bytes: int | None = None) -> Iterator[ImportRecord]:
    path = Path(path)
    doc = yaml_manifest.load(path, max_bytes)
    f = _File(path)
    root = f.mapping(doc, ("test_suite_config",), "the file (a v2 config has only test_suite_config)")
    suite = f.mapping(root.get("test_suite_config"), SUITE_KEYS, "test_suite_config", doc)
    judge = _Judgement(f, f.mapping(suite.get("global"), GLOBAL_KEYS, "global", suite))
    for entry in f.seq(suite.get("files"), "files", suite):
        entry = f.mapping(entry, FILE_KEYS, "files[]", suite)
        mode = entry.get("unlisted_test_mode", "xfail")
        if mode not in MODES:
            raise InputError(f"unlisted_test_mode: unknown mode {mode!r} (known: {', '.join(MODES)})",
                             where=f.where(entry))
        tests = [f.mapping(t, TEST_KEYS, "tests[]", entry) for t in f.seq(entry.get("tests"), "tests", entry)]
        judge.excludes(tests)
        for test in tests:
            yield from _test(f, test, judge)


def _test(f: _File, test: dict, judge: "_Judgement") -> Iterator[ImportRecord]:
    tags = [str(t) for t in f.seq(test.get("tags"), "tags", test)]
    models = [t[len("model__"):] for t in tags if t.startswith("model__")]
    if len(models) > MAX_MODEL_TAGS:
        raise InputError(f"the test has {len(models)} model__<name> tags; at most {MAX_MODEL_TAGS} are read (each "
                         "makes every item of the test a case of that model): split it into one test per model",
                         where=f.where(test))
    mode = test.get("mode", "mandatory_success")
    if mode not in MODES:
        raise InputError(f"mode: unknown mode {mode!r} (known: {', '.join(MODES)})", where=f.where(test))
    ops, _ = _edits(f, test)
    rules = _TestRules(judge, mode, f"{f.path.name}:{getattr(test, 'line', '?')}")
    items = f.seq(ops.get("include"), "edits.ops.include", test)
    if not models:
        for item in items:
            name = item.get("name") if isinstance(item, dict) else None
            yield {"type": "skipped", "where": f.where(item, test), "op": str(name),
                   "reason": "the test has no model__<name> tag (an upstream op test, not a model's case)"}
        return
    for model in models:
        yield {"type": "model", "name": model, "defaults": judge.defaults, "source": str(f.path),
               "description": f"v2 model-ops config {f.path.name}"}
        for item in items:
            yield from _case(f, f.mapping(item, OP_KEYS, "edits.ops.include[]", test), model, rules)


def _edits(f: _File, test: dict) -> tuple[dict, dict]:
    """A test's ``edits.ops`` and ``edits.dtypes`` (checked)."""
    edits = f.mapping(test.get("edits"), EDIT_KEYS, "edits", test)
    return (f.mapping(edits.get("ops"), ("include", "exclude"), "edits.ops", test),
            f.mapping(edits.get("dtypes"), ("include", "exclude"), "edits.dtypes", test))


def _case(f: _File, item: dict, model: str, rules: "_TestRules") -> Iterator[CaseRecord | SkippedRecord]:
    where = f.where(item)
    op = item.get("name")
    if not isinstance(op, str) or not op.strip():
        raise InputError("an edits.ops.include item needs name: <op>", where=where)
    # their registry also runs context calls (torch._C._log_api_usage_once): listed as skipped; an op
    # that reaches files or process state refuses the file (importers.unrunnable: every format's rule)
    unrunnable.refuse_unsafe(op, where)
    skip = unrunnable.skipped(op, where)
    if skip:
        yield skip
        return
    sample = f.mapping(item.get("sample_inputs_func"), ("args", "kwargs"), "sample_inputs_func", item)
    args = f.seq(sample.get("args"), "sample_inputs_func.args", item)
    kwargs = sample.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InputError(f"sample_inputs_func.kwargs must be a mapping, not {str(kwargs)[:60]!r}", where=where)
    record = _record(f, item, op, sample)
    try:
        call = _read_call(op, args, kwargs, record)
    except _Opaque as e:
        yield {"type": "skipped", "where": where, "op": op, "reason": str(e)}
        return
    except ValueError as e:
        line = getattr(e, "line", None)
        raise InputError(str(e), where=f"{f.path}:{line}" if line else where,
                         case=numbered_tag(op, item.get("tags"))) from None
    tags = [str(t) for t in f.seq(item.get("tags"), "tags", item)]
    name = numbered_tag(op, tags)
    case = {"name": name, **call, "marks": [t for t in tags if t != name and is_mark_name(t)]}
    # a tag that is no mark name is listed, never kept in the description: free text an export
    # would have to read back as tags could name a case's marks or its name
    for t in tags:
        if t != name and t not in case["marks"]:
            yield {"type": "skipped", "where": where, "op": f"{op} tag {t!r}",
                   "reason": f"tag {t!r} of {name or op} is no mark name (letters, digits, _): not kept"}
    if item.get("description") is not None:
        case["description"] = str(item["description"])
    variant = variant_dtype(args)
    case.update(rules.judgement(op, variant))
    if record.get("expects_error") is not None:
        # the item's mode stood for its expected error (casedb.read.export_v2): the error, not an xfail
        case["expects_error"] = record["expects_error"]
        for k in ("xfail_if", "xfail_reason", "xfail_strict"):
            case.pop(k, None)
    yield {"type": "case", "model": model, "case": case, "where": where,
           "their_key": (op, repr(_their_args(args)), repr(dict(kwargs)), variant)}


def _read_call(op: str, args: list, kwargs: dict, record: dict) -> dict:
    """The case's op, inputs and attrs: the item's call as casedb reads it, or its record's."""
    if "op" in record:
        out = {"op": str(record["op"]), "inputs": record["inputs"], "attrs": record.get("attrs") or {}}
        return {**out, "seed": record["seed"]} if record.get("seed") is not None else out
    return {"op": op, "inputs": [_arg(a, f"args[{i}]") for i, a in enumerate(args)],
            "attrs": {str(k): _kwarg(v, f"kwargs.{k}") for k, v in kwargs.items()}}


def _record(f: _File, item: dict, op: str, sample: dict) -> dict:
    """An item's casedb record, checked: a call in casedb's form is taken only while the item's own
    call is the one casedb exported with it (its check), so an edit never runs one call here and
    another in their runner."""
    record = f.mapping(item.get(RECORD_KEY), RECORD_KEYS, RECORD_KEY, item)
    where = f.where(record, item)
    call = {"op", "inputs", "attrs", "seed", "check"} & set(record)
    if not call:
        return record
    if not {"op", "inputs", "check"} <= call:
        raise InputError(f"{RECORD_KEY}: a call needs op, inputs and check (casedb export writes them)", where=where)
    if record["check"] != record_check(op, sample):
        raise InputError(f"{RECORD_KEY}: the item's name or sample_inputs_func changed after casedb exported it "
                         f"(check {record['check']!r} no longer matches): delete the item's {RECORD_KEY}: key to "
                         "import the call as written, or export it again", where=where)
    unrunnable.refuse_unsafe(str(record["op"]), where)
    f.seq(record["inputs"], f"{RECORD_KEY}.inputs", record)
    if not isinstance(record.get("attrs") or {}, dict):
        raise InputError(f"{RECORD_KEY}.attrs must be a mapping", where=where)
    return record


def record_check(op: str, sample) -> str:
    """The check of an item's call (its name and sample_inputs_func as written): 16 hex digits
    of the sha256 of their canonical JSON."""
    text = json.dumps({"name": op, "sample_inputs_func": sample}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def numbered_tag(op: str, tags) -> str | None:
    """The item's identity tag ``<op>.<n>`` (``<op>.<n>_spyre``), None without one."""
    pattern = re.compile(re.escape(op) + r"\.\d+(_\w+)?")
    return next((str(t) for t in tags or () if pattern.fullmatch(str(t))), None)


def variant_dtype(args: list) -> str:
    """The dtype their runner files a case under: its first positional tensor's (or first list
    element's), float16 when the first argument is no tensor."""
    first = args[0] if args and isinstance(args[0], dict) else {}
    spec = first.get("tensor")
    if isinstance(first.get("tensor_list"), list) and first["tensor_list"]:
        spec = first["tensor_list"][0]
    if isinstance(spec, list) and spec:
        spec = spec[0]
    try:
        return dtypes.canonical(spec["dtype"]) if isinstance(spec, dict) else "float16"
    except (dtypes.UnknownDtype, KeyError):
        return "float16"


def _their_args(args: list) -> list:
    """The args as their runner's repr sees them: tensor specs with their defaults filled in."""
    out = []
    for a in args:
        if isinstance(a, dict) and isinstance(a.get("tensor"), dict):
            a = {"tensor": _their_tensor(a["tensor"])}
        elif isinstance(a, dict) and isinstance(a.get("tensor_list"), list):
            a = {"tensor_list": [_their_tensor(t) for t in a["tensor_list"]]}
        out.append(_plain(a))
    return out


def _their_tensor(t):
    if not isinstance(t, dict):
        return t
    return {**TENSOR_DEFAULTS, **t, "init_args": {**INIT_DEFAULTS, **(t.get("init_args") or {})}}


def _plain(v):
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


# ----------------------------------------------------------------------------------- judgement

class _Judgement:
    """The file-wide part: seed, per-dtype precision, supported dtypes."""

    def __init__(self, f: _File, glob: dict):
        self.f = f
        cfg = f.mapping(glob.get("input_config"), ("seed",), "input_config", glob)
        seed = cfg.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InputError(f"input_config.seed must be an integer, got {seed!r}", where=f.where(cfg, glob))
        self.defaults = {"seed": seed} if seed is not None else {}
        self.precision: dict[str, dict] = {}
        self.supported: set[str] = set()
        for d in f.seq(glob.get("supported_dtypes"), "supported_dtypes", glob):
            d = f.mapping(d, DTYPE_KEYS, "supported_dtypes[]", glob)
            name = self.dtype_name(d)
            self.supported.add(name)
            prec = f.mapping(d.get("precision"), ("atol", "rtol"), "precision", d)
            checked = {}
            for k, v in prec.items():
                if v is None or isinstance(v, str):  # (their schema: a number; a string is no tolerance)
                    if v is not None:
                        raise InputError(f"precision.{k} must be a number, got {v!r}", where=f.where(prec, d))
                    continue
                try:  # the one tolerance rule (casedb.cases.bounds): finite, >= 0
                    checked[k] = bounds.check_tolerance(v, f"precision.{k}")
                except ValueError as e:
                    raise InputError(str(e), where=f.where(prec, d)) from None
            self.precision[name] = checked

    def dtype_name(self, d: dict) -> str:
        try:
            return dtypes.canonical(d.get("name"))
        except dtypes.UnknownDtype as e:
            raise InputError(str(e), where=self.f.where(d)) from None

    def excludes(self, tests: list) -> None:
        """The edits of a file's tests: every entry is the one method test_model_ops_db, so an op or
        dtype one entry excludes (or includes) is excluded (included) for the cases of all."""
        f = self.f
        self.ops, self.dropped, self.added = [], {}, set()
        for test in tests:
            ops, dts = _edits(f, test)
            where = f"{f.path.name}:{getattr(test, 'line', '?')}"
            self.ops += [(str(f.mapping(e, ("name", "description"), "edits.ops.exclude[]", test).get("name")), where)
                         for e in f.seq(ops.get("exclude"), "edits.ops.exclude", test)]
            for e in f.seq(dts.get("exclude"), "edits.dtypes.exclude", test):
                e = f.mapping(e, ("name", "description"), "edits.dtypes.exclude[]", test)
                self.dropped[self.dtype_name(e)] = where
            self.added |= {self.dtype_name(f.mapping(e, DTYPE_KEYS, "edits.dtypes.include[]", test))
                           for e in f.seq(dts.get("include"), "edits.dtypes.include", test)}


class _TestRules:
    def __init__(self, judge: _Judgement, mode: str, where: str):
        self.judge, self.mode, self.where = judge, mode, where

    def judgement(self, op: str, dtype: str) -> dict:
        """The case fields their runner's decisions become: tolerances, skip_if, xfail_if."""
        out = dict(self.judge.precision.get(dtype, {}))
        skip = self.skip_reason(op, dtype)
        if skip:
            out["skip_if"] = [{"expr": "True", "reason": skip}]
        elif self.mode in ("xfail", "xfail_strict"):
            # their mode judges their device run; the CPU eager run is their reference, not xfailed
            out["xfail_if"] = XFAIL_IF
            out["xfail_reason"] = f"mode: {self.mode} ({self.where})"
            if self.mode == "xfail":  # their runner's xfail is not strict: a pass passes
                out["xfail_strict"] = False
        return out

    def skip_reason(self, op: str, dtype: str) -> str | None:
        j = self.judge
        if self.mode == "skip":
            return f"mode: skip ({self.where})"
        if dtype in j.dropped:
            return f"edits.dtypes.exclude: {dtype} ({j.dropped[dtype]})"
        if j.supported and dtype not in j.supported | j.added:
            return f"{dtype} is not in global.supported_dtypes ({self.where})"
        method = op.replace(".", "_") + "__"
        for name, where in j.ops:
            if name == op or method == name or method.startswith(name + "_"):
                return f"edits.ops.exclude: {name} ({where})"
        return None


# ----------------------------------------------------------------------------------- dedupe

class TheirDedupe:
    """Their runner's dedupe count (key: op, repr(args), repr(kwargs), dtype) beside casedb's
    (signatures), with where the two disagree."""

    def __init__(self):
        self.theirs: dict = {}   # their key -> first signature
        self.ours: dict = {}     # signature -> {their keys}

    def add(self, key: tuple, signature: str) -> None:
        self.theirs.setdefault(key, signature)
        self.ours.setdefault(signature, set()).add(key)

    def summary(self) -> dict:
        split = [keys for keys in self.ours.values() if len(keys) > 1]
        return {"theirs": len(self.theirs), "ours": len(self.ours),
                "disagree": [_why(sorted(keys)) for keys in split[:20]], "disagreements": len(split)}


def _why(keys: list) -> str:
    a, b = keys[0], keys[1]
    part = next(i for i in range(4) if a[i] != b[i])
    field = ("op", "args", "kwargs", "dtype")[part]
    diff = _first_difference(str(a[part]), str(b[part]))
    return (f"{a[0]}: {len(keys)} of their keys are one casedb case ({field} differ in their text only: "
            f"{diff}), e.g. a device string, an omitted default or a spelling casedb reads the same")


def _first_difference(x: str, y: str) -> str:
    i = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    return f"…{x[max(i - 20, 0):i + 20]}… vs …{y[max(i - 20, 0):i + 20]}…"
