"""Dispatcher operators a case may not call (issue 24, item 1).

``torch.ops.aten.from_file`` with ``shared=True`` creates or grows a file at any path: every
``torch.ops`` spelling goes through the same allow-list as torch functions (casedb.cases.dispatcher),
at import (exit 2, file:line and case named, DB unchanged) and again at run (the case's resolve
error; the op is never called). A namespace an --import module registers stays callable.
"""

from __future__ import annotations

import importlib.util
import json
import uuid

import pytest

from casedb.judge.verdict import judge
from casedb.names import normalize_op
from casedb.run.execute import run_case
from casedb.cases.ops import UnsafeOpError, refuse_unsafe
from casedb.run.target import import_module
from tests.helpers import rows
from tests.hostile.test_import_hostile import manifest, refused  # noqa: F401 (refused: a fixture)

pytestmark = pytest.mark.timeout(300)

FROM_FILE = ["torch.ops.aten.from_file", "aten::from_file", "torch.ops.aten.from_file.default",
             "aten.from_file.default", "aten::from_file.default"]
# what else reaches files, storages, the profiler, process groups or process-wide state
OTHERS = ["torch.ops.aten.save", "torch.ops.aten.set_.source_Storage", "torch.ops.aten.set_", "torch.ops.aten.set_data",
          "torch.ops.aten.manual_seed", "torch.ops.aten.seed", "torch.ops.aten._print", "torch.ops.aten.wait",
          "torch.ops.aten._cufft_set_plan_cache_max_size", "torch.ops.aten.record_stream",
          "torch.ops.aten.set_grad_enabled", "torch.ops.profiler._record_function_enter_new",
          "profiler::_record_function_exit", "torch.ops.c10d.allreduce_", "torch.ops._c10d_functional.all_reduce",
          "torch.ops.higher_order.cond", "torch.ops.aten._dir", "torch.Tensor.set_"]

LIBRARY = '''\
import torch


@torch.library.custom_op("{ns}::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _fake(x):
    return torch.empty_like(x)
'''


def from_file_case(op, path, shared=True, size=1 << 20):
    return {"signature": "f" * 64, "op": op, "dtype": "float32", "seed": None, "attrs": {},
            "inputs": [{"value": str(path)}, {"value": shared}, {"value": size}]}


def case_yaml(name, op, *inputs) -> str:
    return f"  - name: {name}\n    op: {op}\n    inputs: {json.dumps([{'value': v} for v in inputs])}\n"


@pytest.mark.parametrize("op", FROM_FILE + OTHERS)
def test_import_refuses_ops_that_reach_files_or_global_state(refused, tmp_path, op):
    target = tmp_path / "created_by_the_case"
    err = refused(manifest(tmp_path, case_yaml("grow", op, str(target), True, 1 << 20)))
    assert f"m.yaml:3: case 'grow': op '{normalize_op(op)}' is not a tensor operation casedb runs" in err
    assert not target.exists()


@pytest.mark.parametrize("op", FROM_FILE)
def test_a_run_never_calls_from_file(tmp_path, op):
    new = tmp_path / "new"
    existing = tmp_path / "existing"
    existing.write_bytes(b"0123456789")
    for path in (new, existing):
        ex = run_case(from_file_case(op, path))
        assert ex.ref_error.phase == "resolve" and "aten::from_file is denied" in ex.ref_error.message
        assert ex.reference is None and ex.target is None
        v = judge(ex, rtol=0, atol=0)
        assert v.outcome == "ref_error" and "is not a tensor operation casedb runs" in v.reason
    assert not new.exists() and existing.read_bytes() == b"0123456789"


def test_only_namespaces_an_import_registers_are_callable(cli, db_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns = "casedb_h24_" + uuid.uuid4().hex[:10]
    lib = tmp_path / f"{ns}.py"
    lib.write_text(LIBRARY.format(ns=ns))
    # registered behind casedb's back (not by --import): refused at import and at run
    spec = importlib.util.spec_from_file_location(ns + "_behind", lib)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    case = {"signature": "e" * 64, "op": f"torch.ops.{ns}.double", "dtype": "float32", "seed": None, "attrs": {},
            "inputs": [{"tensor": {"shape": [4], "dtype": "float32", "init": "randn"}}]}
    ex = run_case(case)
    assert ex.ref_error.phase == "resolve"
    assert f"torch.ops.{ns} is not a namespace cases may call" in ex.ref_error.message
    path = manifest(tmp_path, f"  - name: double\n    op: torch.ops.{ns}.double\n"
                              "    inputs: [{tensor: {shape: [4]}}]\n")
    res = cli("import", path)
    assert res.exit_code == 2 and f"m.yaml:3: case 'double': op 'torch.ops.{ns}.double'" in " ".join(res.output.split())
    assert rows(db_path, "SELECT count(*) AS n FROM cases") == [{"n": 0}]
    # the same file given to --import: its namespace is callable (it was imported before: its
    # registrations are in the file), at import and in a run
    import_module(str(lib))
    assert judge(run_case(case), rtol=0, atol=0).outcome == "passed"
    assert cli("import", path).exit_code == 0
    res = cli("run", "--device", "cpu", "--backend", "eager", "-j", "0", "--no-progress", "--import", lib, "--json")
    assert res.exit_code == 0, res.output
    assert (json.loads(res.stdout)["executed"], json.loads(res.stdout)["passed"]) == (1, 1)


def test_torchs_own_namespaces_stay_refused_when_an_import_makes_torch_register_them(tmp_path):
    mod = tmp_path / "imports_torch_parts.py"
    mod.write_text("import torch.ao.quantization.fx._decomposed  # torch registers quantized_decomposed::*\n")
    import_module(str(mod))
    with pytest.raises(UnsafeOpError, match="torch.ops.quantized_decomposed is not a namespace cases may call"):
        refuse_unsafe("torch.ops.quantized_decomposed.quantize_per_tensor")
