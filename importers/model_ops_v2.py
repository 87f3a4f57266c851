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
import re
from pathlib import Path
from typing import Any, Iterator

from casedb.cases import dtypes
from casedb.cases.marks import is_mark_name
from casedb.cases.presets import contiguous_strides
from casedb.errors import InputError
from importers import yaml_manifest

SUITE_KEYS = ("labels", "global", "files")
GLOBAL_KEYS = ("supported_dtypes", "supported_ops", "supported_modules", "input_config")
DTYPE_KEYS = ("name", "description", "precision", "force_xfail")
FILE_KEYS = ("path", "unlisted_test_mode", "labels", "tests")
TEST_KEYS = ("names", "mode", "tags", "labels", "no_grad", "edits")
EDIT_KEYS = ("ops", "dtypes", "modules", "functions")
OP_KEYS = ("name", "sample_inputs_func", "description", "tags")
TENSOR_KEYS = ("shape", "stride", "storage_offset", "dtype", "device", "init", "init_args", "device_layout")
INIT_ARG_KEYS = ("low", "high", "total", "fill_value", "path", "key")
ARG_KINDS = ("tensor", "tensor_list", "cache", "module_path", "config_path", "model_id", "value", "py")
MODES = ("mandatory_success", "xfail", "xfail_strict", "skip")
INITS = ("rand", "randn", "zeros", "ones", "randint", "arange", "eye", "full", "file", "xavier", "cumsum_offsets")
# tensor spec defaults of their loader (what repr() of a parsed spec prints for an omitted key)
TENSOR_DEFAULTS = {"device": "privateuse1", "init": "rand", "stride": None, "storage_offset": 0,
                   "device_layout": None}
INIT_DEFAULTS = {"low": 0, "high": None, "total": None, "fill_value": None, "path": None, "key": None}
XFAIL_IF = "device != 'cpu'"
_SNIFF = re.compile(r"^test_suite_config\s*:", re.M)


def sniff(path: Path, head: str) -> bool:
    return bool(_SNIFF.search(head))


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


def parse(path, *, max_bytes: int | None = None) -> Iterator[dict]:
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


def _test(f: _File, test: dict, judge: "_Judgement") -> Iterator[dict]:
    tags = [str(t) for t in f.seq(test.get("tags"), "tags", test)]
    models = [t[len("model__"):] for t in tags if t.startswith("model__")]
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


def _case(f: _File, item: dict, model: str, rules: "_TestRules") -> Iterator[dict]:
    where = f.where(item)
    op = item.get("name")
    if not isinstance(op, str) or not op.strip():
        raise InputError("an edits.ops.include item needs name: <op>", where=where)
    refused = _refused(op)
    if refused:
        yield {"type": "skipped", "where": where, "op": op, "reason": refused}
        return
    sample = f.mapping(item.get("sample_inputs_func"), ("args", "kwargs"), "sample_inputs_func", item)
    args = f.seq(sample.get("args"), "sample_inputs_func.args", item)
    kwargs = sample.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InputError(f"sample_inputs_func.kwargs must be a mapping, not {str(kwargs)[:60]!r}", where=where)
    try:
        inputs = [_arg(a, f"args[{i}]") for i, a in enumerate(args)]
        attrs = {str(k): _kwarg(v, f"kwargs.{k}") for k, v in kwargs.items()}
    except _Opaque as e:
        yield {"type": "skipped", "where": where, "op": op, "reason": str(e)}
        return
    except ValueError as e:
        line = getattr(e, "line", None)
        raise InputError(str(e), where=f"{f.path}:{line}" if line else where,
                         case=numbered_tag(op, item.get("tags"))) from None
    tags = [str(t) for t in f.seq(item.get("tags"), "tags", item)]
    name = numbered_tag(op, tags)
    case = {"name": name, "op": op, "inputs": inputs, "attrs": attrs,
            "marks": [t for t in tags if t != name and is_mark_name(t)]}
    other = [t for t in tags if t != name and t not in case["marks"]]
    text = item.get("description")
    if other:
        text = (f"{text}\n" if text else "") + "v2 tags: " + " ".join(other)
    if text is not None:
        case["description"] = str(text)
    variant = variant_dtype(args)
    case.update(rules.judgement(op, variant))
    yield {"type": "case", "model": model, "case": case, "where": where,
           "their_key": (op, repr(_their_args(args)), repr(dict(kwargs)), variant)}


def _refused(op: str) -> str | None:
    """Why casedb never calls ``op`` (its allow-list: casedb.cases.ops), None when it may. Their
    registry also runs context calls such as ``torch._C._log_api_usage_once``: listed as skipped."""
    from casedb.cases.ops import UnsafeOpError, refuse_unsafe
    from casedb.names import normalize_op

    try:
        refuse_unsafe(normalize_op(op))
    except UnsafeOpError as e:
        return str(e)
    return None


class _Bad(ValueError):
    """A bad input spec, with the line of the mapping it is in."""

    def __init__(self, message: str, obj=None):
        super().__init__(message)
        self.line = getattr(obj, "line", None)


class _Opaque(ValueError):
    """An input casedb cannot represent (an HF cache, module or config object)."""


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


# ----------------------------------------------------------------------------------- inputs

def _arg(a: Any, label: str) -> dict:
    if not isinstance(a, dict) or not a:
        raise ValueError(f"{label}: each args element is a mapping with one of {', '.join(ARG_KINDS)}")
    kind = next((k for k in ARG_KINDS if k in a), None)
    if kind is None:
        raise _Bad(f"{label}: " + _unknown(next(iter(a)), ARG_KINDS), a)
    if kind in ("cache", "module_path", "config_path", "model_id"):
        raise _Opaque(f"{label}: a {kind} input (an HF cache, module or config object) is not a tensor casedb "
                      "can store")
    if len(a) != 1:
        raise ValueError(f"{label}: give one of {', '.join(ARG_KINDS)} per args element, got {', '.join(map(str, a))}")
    body = a[kind]
    if kind == "tensor" and isinstance(body, list):
        kind = "tensor_list"  # the v1 spelling; their v2 loader refuses it, casedb reads it as a list
    if kind == "tensor":
        t = tensor(body, label)
        return {"file": t["file"]} if "file" in t else {"tensor": t}
    if kind == "tensor_list":
        if not isinstance(body, list):
            raise ValueError(f"{label}: tensor_list is a list of tensor specs")
        items = [tensor(t, f"{label}[{i}]") for i, t in enumerate(body)]
        if any("file" in t for t in items):
            raise ValueError(f"{label}: init: file inside a tensor_list is not supported; give the list's "
                             "tensors another init")
        return {"tensor_list": items}
    if kind == "py":
        return {"py": body}
    return {"value": body}


def _kwarg(v: Any, label: str):
    """A keyword value: an input spec (``{value: X}`` unwrapped to X), else the plain value."""
    if isinstance(v, dict) and any(k in v for k in ARG_KINDS):
        item = _arg(v, label)
        return item["value"] if "value" in item else item
    return v


def _unknown(key, allowed) -> str:
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    return f"unknown key {key!r}" + (f" — did you mean {close[0]!r}?" if close else "") + \
        f" (allowed: {', '.join(allowed)})"


def tensor(spec: Any, label: str) -> dict:
    """One v2 tensor spec as casedb's: the same kind of values (see the README's init table), the
    recorded layout as the ``strided`` preset when it is not the contiguous one."""
    if not isinstance(spec, dict):
        raise ValueError(f"{label}: a tensor spec is a mapping with shape and dtype")
    for k in spec:
        if k not in TENSOR_KEYS:
            raise _Bad(f"{label}: " + _unknown(k, TENSOR_KEYS), spec)
    if "shape" not in spec or "dtype" not in spec:
        raise ValueError(f"{label}: a tensor spec needs shape and dtype")
    shape = spec["shape"]
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"{label}: shape must be a list of integers >= 0, got {shape!r}")
    try:
        dtype = dtypes.canonical(spec["dtype"])
    except dtypes.UnknownDtype as e:
        raise ValueError(f"{label}: {e}") from None
    init_args = spec.get("init_args") or {}
    if not isinstance(init_args, dict):
        raise ValueError(f"{label}: init_args must be a mapping")
    for k in init_args:
        if k not in INIT_ARG_KEYS:
            raise _Bad(f"{label}: init_args: " + _unknown(k, INIT_ARG_KEYS), init_args)
    init = spec.get("init") or "rand"
    if init not in INITS:
        raise ValueError(f"{label}: unknown init {init!r} (known: {', '.join(INITS)})")
    if init == "file":
        if not init_args.get("path"):
            raise ValueError(f"{label}: init: file needs init_args.path")
        # read by casedb.cases.spec into a data tensor (values from the file, checked against shape and
        # dtype) laid out as recorded (their loader makes it contiguous; casedb keeps recorded layouts)
        return {"file": {"path": str(init_args["path"]), "key": init_args.get("key"), "shape": shape,
                         "dtype": dtype, "as": "data", "layout": _layout(spec, shape, label)}}
    out = {"shape": shape, "dtype": dtype, **_init(init, init_args, shape, dtype, label)}
    layout = _layout(spec, shape, label)
    if layout:
        out.update(preset="strided", preset_args=layout)
    if spec.get("device_layout") is not None:
        out["device_layout"] = spec["device_layout"]
    return out


def _layout(spec: dict, shape: list, label: str) -> dict | None:
    stride = spec.get("stride")
    offset = spec.get("storage_offset", 0) or 0
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{label}: storage_offset must be an integer >= 0, got {offset!r}")
    if stride is None:
        return {"stride": contiguous_strides(shape), "storage_offset": offset} if offset else None
    if not isinstance(stride, list) or len(stride) != len(shape) or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in stride):
        raise ValueError(f"{label}: stride must be {len(shape)} integers >= 0 (one per dimension of {shape}), "
                         f"got {stride!r}")
    if stride == contiguous_strides(shape) and not offset:
        return None
    return {"stride": stride, "storage_offset": offset}


def _init(init: str, a: dict, shape: list, dtype: str, label: str) -> dict:
    """casedb's init (and init_args) making the values theirs makes (make_tensor's rules)."""
    floating = dtype in dtypes.FLOATING or dtype in dtypes.COMPLEX
    need = {"randint": "high", "cumsum_offsets": "total", "full": "fill_value"}.get(init)
    if need and a.get(need) is None:
        raise ValueError(f"{label}: init: {init} needs init_args.{need}")
    if init == "rand":
        # make_tensor(low=0, high=1): floats in [0, 1), bools 50 %, integers randint(0, 1): zeros
        return {"init": "rand"} if floating or dtype == "bool" else {"init": "zeros"}
    if init == "randn":
        if not floating:
            raise ValueError(f"{label}: init: randn makes no {dtype} values (torch.randn is floating only)")
        return {"init": "randn"}
    if init == "randint":
        low, high = a.get("low", 0), a["high"]
        if dtype == "bool":
            return {"init": "rand"}
        if floating:
            return {"init": "uniform", "init_args": {"low": float(low), "high": float(high)}}
        low, high = _clamp(low, high, dtype)
        if high <= low:
            raise ValueError(f"{label}: randint needs high > low (got low={low}, high={high})")
        return {"init": "randint", "init_args": {"low": low, "high": high}}
    if init == "arange" and len(shape) != 1:
        raise ValueError(f"{label}: init: arange needs a 1-d shape, got {shape}")
    if init == "full":
        return {"init": "full", "init_args": {"fill_value": a["fill_value"]}}
    if init == "cumsum_offsets":
        return {"init": "cumsum_offsets", "init_args": {"total": a["total"]}}
    return {"init": init}  # zeros, ones, arange, eye, xavier: checked by casedb.cases.spec


def _clamp(low, high, dtype: str) -> tuple[int, int]:
    """randint bounds clamped to the dtype's range, as make_tensor clamps them."""
    import torch

    info = torch.iinfo(getattr(torch, dtype))
    return max(int(low), info.min), min(int(high), info.max)


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
            for k, v in prec.items():
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                    raise InputError(f"precision.{k} must be a number >= 0, got {v!r}", where=f.where(prec, d))
            self.precision[name] = {k: float(v) for k, v in prec.items() if v is not None}

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
