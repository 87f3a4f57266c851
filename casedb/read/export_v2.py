"""Write a model's cases as the RFC implementation's v2 model-ops config (``casedb export --format
spyre-v2``), the file their runner (``tests/models/test_model_ops_v2.py``) collects and runs.

Each call is written as their op table spells it, its arguments in the form their entry takes
(casedb.read.spyre_calls; a call their table lacks is left out and noted); every tensor gets its
exact layout (``stride`` and ``storage_offset``, from the layout preset) and its init in their terms
(the reverse of the importer's table), values kept as stored. The judgement goes where their
runner reads it: tolerances as ``supported_dtypes[].precision`` of each case's dtype (which also
lists every dtype a case is filed under, or their runner drops it), the model's own tolerance for
its dtype, the model's seed as ``input_config.seed``, and one test per mode (mandatory_success,
xfail, xfail_strict, skip) from the cases' ``xfail_if``/``skip_if``/``expects_error``. Data tensors
and what their loader cannot make (an ``arange`` with a start, a 0-d ``randn``) are ``.pt`` files in
``<out>.files/``, written under their root token
(``${TORCH_DEVICE_ROOT}/tests/configs/model_ops_tests/<out>.files/``). Descriptions are written
verbatim: no text in them becomes a tag.

What an item cannot say for casedb's own re-import rides beside it as its ``casedb:`` record
(their item model drops unknown keys): the expected error, and the call in casedb's form wherever
the item would read back as another case (checked here by reading it as the importer does), so a
round trip keeps every signature (importers/README.md, "v2 model-ops configs").

What v2 cannot say to their runner is listed in ``notes`` (a case's own seed, tolerances that differ
between cases of one dtype, integer-valued randint floats, the cases left out).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import IO

import yaml

from casedb.cases import dtypes, input_specs, presets, valid_inputs
from casedb.cases import spec as casespec
from casedb.errors import CasedbError
from casedb.read import spyre_calls
from casedb.read.export import _Dumper, _flow, _Writer, _value
from casedb.store.database import Store
from importers import model_ops_v2, v2_inputs

RUNNER_PATH = "${TORCH_DEVICE_ROOT}/tests/models/test_model_ops_v2.py"
TEST_NAME = "TestSpyreModelOps::test_model_ops_db"
THEIR_MARKS = ("constant", "fp32operation", "bf16operation")
# the device names their runner runs on (PrivateUse1 renamed ``spyre``)
THEIR_DEVICES = ("spyre", "privateuse1", "privateuseone")


class _V2Writer(_Writer):
    def __init__(self, store: Store, out_path: Path | None, notes: list):
        super().__init__(store, out_path)
        self.notes = notes
        self.case = ""
        self.safe_ops: set = set()  # ops casespec found safe already (the read-back check)

    def v2_tensor(self, t: dict) -> dict:
        out: dict = {"shape": _flow(list(t["shape"]))}
        stride, offset = presets.layout(t)
        out.update(stride=_flow(list(stride)), storage_offset=offset, dtype=f"torch.{t['dtype']}")
        out.update(_flow(self.v2_init(t)))
        if t.get("device_layout"):
            out["device_layout"] = _flow(dict(t["device_layout"]))
        return out

    def v2_init(self, t: dict) -> dict:
        init, args, dtype = t.get("init"), dict(t.get("init_args") or {}), t["dtype"]
        floating = dtype in dtypes.FLOATING or dtype in dtypes.COMPLEX
        if "blob" in t:
            return {"init": "file", "init_args": {"path": self.file(t)}}
        if init == "uniform" or (init == "randint" and not floating):
            low = args.get("low", 0 if init == "randint" else 0.0)
            high = args.get("high", 10 if init == "randint" else 1.0)
            if init == "randint" and dtype == "bool":
                return {"init": "rand"}
            if float(low) != int(low) or float(high) != int(high) or (init == "uniform" and not floating):
                self.notes.append(f"{self.case}: {init} [{low}, {high}) of {dtype} written as randint [{int(low)}, "
                                  f"{int(high)}) (their init_args are integers)")
            return {"init": "randint", "init_args": {"low": int(low), "high": int(high)}}
        if init == "randint":
            self.notes.append(f"{self.case}: integer-valued {dtype} randint written as their randint (uniform floats)")
            return {"init": "randint", "init_args": {"low": int(args.get("low", 0)), "high": int(args.get("high", 10))}}
        if init in ("rand", "randn") and not floating and dtype != "bool":
            return {"init": "randint", "init_args": {"low": 0, "high": 10}}  # casedb's integer rand/randn
        if init == "arange" and (args or len(t["shape"]) != 1):
            return {"init": "file", "init_args": {"path": self.values_file(t)}}  # their arange is 1-d, from 0
        if init == "randn" and not t["shape"]:
            # their loader calls torch.randn(*shape): no size for a 0-d tensor (a TypeError)
            return {"init": "file", "init_args": {"path": self.values_file(t)}}
        if init in ("full", "cumsum_offsets"):
            return {"init": init, "init_args": args}
        return {"init": init or "rand"}

    def v2_input(self, spec: dict) -> dict:
        if "tensor" in spec:
            return {"tensor": self.v2_tensor(spec["tensor"])}
        if "tensor_list" in spec:
            return {"tensor_list": [self.v2_tensor(t) for t in spec["tensor_list"]]}
        if "file" in spec:
            return {"tensor": self.v2_tensor(spec["file"])}
        if "value" in spec:
            return {"value": _flow(_value(spec["value"]))}
        return dict(spec)

    def record_input(self, spec: dict) -> dict:
        """An input in casedb's own manifest form (``casedb export --format yaml``'s, dtype always
        written, data tensors as their values, file tensors as the files written beside the config)."""
        if "tensor" in spec:
            return {"tensor": _flow(_Writer.tensor(self, spec["tensor"], ""))}
        if "tensor_list" in spec:
            return {"tensor_list": [_flow(_Writer.tensor(self, t, "")) for t in spec["tensor_list"]]}
        if "file" in spec:
            return {"file": _Writer.file(self, spec["file"])}
        if "value" in spec:
            return {"value": _flow(_value(spec["value"]))}
        return dict(spec)

    def reads_back(self, occ: dict, item: dict) -> bool:
        """Whether casedb's importer reads ``item`` back as the case ``occ`` (the same signature):
        the v2 reading (importers.v2_inputs), the valid-input rules and normalization of an import."""
        sample = copy.deepcopy(item["sample_inputs_func"])
        try:
            inputs = [v2_inputs._arg(a, f"args[{i}]") for i, a in enumerate(sample["args"])]
            attrs = {str(k): v2_inputs._kwarg(v, f"kwargs.{k}") for k, v in (sample.get("kwargs") or {}).items()}
            case = valid_inputs.apply_raw({"op": item["name"], "inputs": inputs, "attrs": attrs})
            base = self.out_path.parent if self.out_path is not None else None
            norm = casespec.normalize_case(case, {}, where=self.case, base_dir=base, safe_ops=self.safe_ops)
        except (ValueError, CasedbError):  # casedb would refuse it: only the record can bring it back
            return False
        return norm.signature == occ["signature"]

    def values_file(self, t: dict) -> str:
        """A .pt file of a generated tensor's values (what v2's inits cannot make), beside the config."""
        import hashlib

        import torch

        from casedb.cases import blobs
        from casedb.cases.materialize import prepare

        values = prepare({"inputs": [{"tensor": t}], "seed": 0}).leaves[0].base
        sha = hashlib.sha256(blobs.encode(values)).hexdigest()
        init = " ".join(str(x) for x in (t["init"], t.get("init_args")) if x)
        self.notes.append(f"{self.case}: {init} over {t['shape']} written as a file of its values (init: file)")
        self.file_check()
        folder = self.out_path.parent / f"{self.out_path.stem}.files"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{sha[:12]}.pt"
        if not target.exists():
            torch.save(values.clone(), target)
        return self.their_path(target.name)

    def file_check(self) -> None:
        if self.out_path is None:
            raise ValueError("a case has data or file tensors; export it with -o FILE so the .pt files can be "
                             "written beside it")

    def file(self, f: dict) -> str:
        self.file_check()
        return self.their_path(Path(super().file(f)).name)

    def their_path(self, name: str) -> str:
        """A .pt path as their configs write paths: under their root token, in the folder their
        model-ops configs live in (their runner resolves a plain path from its working folder);
        casedb reads it beside the config (importers/v2_inputs.py)."""
        return f"{model_ops_v2.THEIR_CONFIG_DIR}{self.out_path.stem}.files/{name}"


_NUMBERED = re.compile(r"(?P<op>.+)\.(?P<n>\d+)(_\w+)?")


def _numbered_tags(occs: list) -> list[str]:
    """One ``<op>.<n>`` tag per case: its own name when it is one, else the next free number."""
    taken = {o["name"] for o in occs}
    counters: dict = {}
    out = []
    for o in occs:
        m = _NUMBERED.fullmatch(o["name"])
        if m and m["op"] == o["op"]:
            out.append(o["name"])
            continue
        n = counters.get(o["op"], 0)
        while True:
            n += 1
            tag = f"{o['op']}.{n}"
            if tag not in taken:
                break
        counters[o["op"]], tag = n, tag
        taken.add(tag)
        out.append(tag)
    return out


def _mode(occ: dict, case: str, notes: list) -> str:
    """The v2 mode of a case's judgement (a mode is unconditional: conditions are noted). Their
    runner (torch-spyre's oot_test_base_common ``_should_run``): ``skip`` is not collected,
    ``xfail`` runs and may pass, ``xfail_strict`` runs and must fail, ``mandatory_success`` must pass."""
    skips = occ.get("skip_if") or ()
    if any(s.get("expr") == "True" for s in skips):
        return "skip"
    for s in skips:
        notes.append(f"{case}: skip_if {s['expr']!r} not written (a v2 mode has no condition)")
    if _raises_on_their_run(occ.get("expects_error")):
        # the call raises by design on their reference (the CPU) or their device: their runner
        # reports a strict xfail as xfailed, and a pass (the error gone) as a failure, as casedb does;
        # the expected error itself rides in the item's casedb record
        if occ.get("xfail"):
            notes.append(f"{case}: xfail_if {occ['xfail']['expr']!r} not written beside its expects_error")
        return "xfail_strict"
    if not occ.get("xfail"):
        return "mandatory_success"
    if occ["xfail"]["expr"] not in ("True", model_ops_v2.XFAIL_IF):
        notes.append(f"{case}: xfail_if {occ['xfail']['expr']!r} written as mode: xfail")
    # casedb's xfail is strict unless it says otherwise; their mode: xfail is not
    return "xfail" if occ["xfail"].get("strict") is False else "xfail_strict"


def _raises_on_their_run(expects: dict | None) -> bool:
    """Whether an expected error applies to their run: the reference's (``ref``, ``cpu`` or
    unscoped; their reference is the CPU) or their device's."""
    if not expects:
        return False
    return "type" in expects or any(k in expects for k in ("ref", "cpu", *THEIR_DEVICES))


def config(store: Store, model: str, out_path: Path | None = None, notes: list | None = None) -> dict:
    """The v2 config of `model` as a Python structure ready for YAML."""
    notes = notes if notes is not None else []
    m = store.model(model)
    defaults = store.models_defaults(m["name"]) or {}
    writer = _V2Writer(store, out_path, notes)
    calls = []
    for occ in store.occurrences([m["name"]], markexpr=""):
        writer.case = f"{m['name']}::{occ['name']}"
        call = _call(writer, occ)
        if isinstance(call, str):
            notes.append(f"{writer.case}: left out: {call}")
        else:
            calls.append((occ, call))
    precision: dict[str, dict] = {}
    tests: dict[str, list] = {}
    tags = _numbered_tags([{"name": occ["name"], "op": call[0]} for occ, call in calls])
    for (occ, (name, args, kwargs)), tag in zip(calls, tags):
        writer.case = f"{m['name']}::{occ['name']}"
        args = [{"value": _flow(a["value"])} if set(a) == {"value"} else a for a in args]
        kwargs = {k: _flow(v) if isinstance(v, list) else v for k, v in kwargs.items()}
        item = {"name": name, "sample_inputs_func": {"args": args, **({"kwargs": kwargs} if kwargs else {})}}
        if occ["description"]:
            item["description"] = occ["description"]  # verbatim: text never becomes tags
        # their per-op marks among casedb's derived ones (recomputed on import), then the case's own
        marks = [x for x in occ["derived_marks"] or [] if x in THEIR_MARKS]
        marks += [x for x in occ["own_marks"] or [] if x not in marks]
        item["tags"] = _flow([t for t in marks if t != tag] + [tag])
        record = _record(writer, occ, item)
        if record:
            item[model_ops_v2.RECORD_KEY] = record
        if occ["seed"] is not None:
            notes.append(f"{writer.case}: its own seed {occ['seed']} (v2 has one seed per file; casedb's "
                         "record keeps it)")
        _precision(precision, model_ops_v2.variant_dtype(args), occ, writer.case, notes)
        tests.setdefault(_mode(occ, writer.case, notes), []).append(item)
    _model_tolerance(precision, defaults)
    glob: dict = {"supported_dtypes": [{"name": d, **({"precision": p} if p else {})}
                                       for d, p in sorted(precision.items())]}
    if defaults.get("seed") is not None:
        glob["input_config"] = {"seed": defaults["seed"]}
    entries = [{"names": [TEST_NAME], "mode": mode, "tags": _flow([f"model__{m['name']}"]),
                "edits": {"ops": {"include": items}}} for mode, items in tests.items()]
    return {"test_suite_config": {"labels": _flow(["trunk"]), "global": glob, "files": [
        {"path": RUNNER_PATH, "unlisted_test_mode": "skip", "tests": entries}]}}


def _record(writer: "_V2Writer", occ: dict, item: dict) -> dict:
    """What casedb's importer needs beside the item to read the case back as it is (their runner
    ignores an item's unknown keys): the expected error their mode cannot hold, and, where the item
    reads back as another case (their op spelling, an ``arange`` with a start, a 0-d ``randn``, a
    file inside a tensor list...), the call in casedb's form with a check of the item's call."""
    record: dict = {}
    if occ.get("expects_error"):
        record["expects_error"] = _flow(occ["expects_error"])
    if writer.reads_back(occ, item):
        return record
    record["op"] = occ["op"]
    record["inputs"] = [writer.record_input(s) for s in occ["inputs"]]
    if occ["attrs"]:
        record["attrs"] = _flow({k: writer.record_input(v) if isinstance(v, dict) and len(v) == 1
                                 and next(iter(v)) in input_specs.INPUT_KINDS else _value(v)
                                 for k, v in occ["attrs"].items()})
    if occ["seed"] is not None:
        record["seed"] = occ["seed"]
    record["check"] = model_ops_v2.record_check(item["name"], item["sample_inputs_func"])
    return record


def _call(writer: "_V2Writer", occ: dict):
    """(their op name, args, kwargs) of an occurrence as v2 items, or why their runner cannot run it."""
    args = [writer.v2_input(s) for s in occ["inputs"]]
    kwargs = {k: writer.v2_input(v) if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in
              ("tensor", "tensor_list", "file", "py") else _value(v) for k, v in (occ["attrs"] or {}).items()}
    return spyre_calls.their_call(occ["op"], args, kwargs)


def _model_tolerance(precision: dict, defaults: dict) -> None:
    """The model's own tolerance (its manifest's ``default: rtol/atol``) as the precision of its
    dtype where no case set one: their runner otherwise judges it at 5e-3."""
    dtype = dtypes.canonical(defaults.get("dtype") or "bfloat16")
    own = {k: defaults[k] for k in ("atol", "rtol") if defaults.get(k) is not None}
    if own and dtype in precision and not precision[dtype]:
        precision[dtype] = own


def _precision(out: dict, dtype: str, occ: dict, case: str, notes: list) -> None:
    own = {k: occ[k] for k in ("atol", "rtol") if occ[k] is not None}
    if dtype not in out:
        out[dtype] = own
    elif own and own != out[dtype]:
        notes.append(f"{case}: tolerance {own} differs from the {dtype} precision written ({out[dtype]})")


def write(store: Store, model: str, out: IO[str], out_path: Path | None = None, notes: list | None = None) -> int:
    doc = config(store, model, out_path, notes)
    yaml.dump(doc, out, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
    return sum(len(t["edits"]["ops"]["include"]) for t in doc["test_suite_config"]["files"][0]["tests"])
