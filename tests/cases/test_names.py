"""casedb.names: the one home of op-name spellings, model keys and the "did you mean" hint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from casedb import names


@pytest.mark.parametrize("written, stored, path", [
    ("aten::add.Tensor", "torch.ops.aten.add.Tensor", "torch.ops.aten.add.Tensor"),
    ("aten.mm", "torch.ops.aten.mm", "torch.ops.aten.mm"),
    ("F.gelu", "torch.nn.functional.gelu", "torch.nn.functional.gelu"),
    ("  torch.add ", "torch.add", "torch.add"),
    # a custom library's trace spelling is stored as written, and resolved under torch.ops
    ("mylib::op.default", "mylib::op.default", "torch.ops.mylib.op.default"),
])
def test_op_spellings(written, stored, path):
    assert (names.normalize_op(written), names.op_path(written)) == (stored, path)


@pytest.mark.parametrize("bad", [None, "", "   ", 3])
def test_an_op_name_is_a_non_empty_string(bad):
    with pytest.raises(ValueError, match="'op' must be a non-empty string"):
        names.normalize_op(bad)


def test_model_keys_and_marks():
    assert {names.model_key(n) for n in ("gpt_oss", "GPT-OSS", " gpt-oss ")} == {"gpt-oss"}
    assert names.model_mark("granite-4.0-h-micro") == "model_granite_4_0_h_micro"


def test_did_you_mean_spellings():
    assert names.did_you_mean("nmae", ["name", "op"]) == "did you mean 'name'?"
    assert names.did_you_mean("zzz", ["name", "op"]) == ""
    assert names.did_you_mean("Staus", ["status", "stage"], ignore_case=True) == "did you mean 'status'?"
    assert names.did_you_mean("ad", ["add", "addmm", "adam", "abs"], n=3, quote=False) == "did you mean add, adam?"
    assert names.unknown_key_message("nmae", ("name", "op")) == (
        "unknown key 'nmae' — did you mean 'name'? (allowed: name, op)")


def test_every_did_you_mean_of_casedb_comes_from_names(tmp_path, cli):
    """The four places that suggest a spelling (case keys, op names, -m marks, triage entries)
    word it through casedb.names."""
    from casedb.cases import marks, ops
    from casedb.errors import InputError
    from casedb.cases.spec import normalize_case

    with pytest.raises(InputError, match=r"unknown key 'inptus' — did you mean 'inputs'\?"):
        normalize_case({"op": "torch.add", "inptus": []}, {})
    with pytest.raises(ops.UnknownOpError, match=r"did you mean .*\bsoftmax\b"):
        ops.resolve_op("torch.softmx")
    assert "(did you mean 'slow'?)" in marks.unknown_marks("slwo", {"slow", "fast"})
    triage = tmp_path / "t.yaml"
    triage.write_text("cases:\n  - op: torch.add\n    staus: known\n")
    out = cli("triage", "check", triage)
    assert "did you mean 'status'?" in out.output


def test_names_imports_no_torch_and_nothing_of_casedb():
    code = ("import sys; import casedb.names; "
            "print(sorted(m for m in sys.modules if m == 'torch' or (m.startswith('casedb.') and m != 'casedb.names')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
