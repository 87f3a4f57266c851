"""Hostile and careless input to `casedb import` (issue 15, items 4, 5, 9, 10, 12).

Each refusal is exit 2 with the file (and line, and case where there is one) named, and the DB
byte-identical to before. Inputs are small but would, without the bound they test, expand to
gigabytes or block forever (time and memory are measured in bench/bench_hostile.py; the
timeout here only turns a regression into a failure instead of a hung suite).
"""

from __future__ import annotations

import gzip
import json
import os
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import DATA, rows, sha256_of

HOSTILE = Path(__file__).parent / "data"
pytestmark = pytest.mark.timeout(300)

GOOD_CASE = """\
  - name: {name}
    op: torch.neg
    inputs:
      - {input}
"""


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def refused(cli, db_path, tmp_path, monkeypatch):
    """Run `casedb import ARGS` on a DB holding the RFC template; assert exit 2, the DB
    byte-identical and no marker file; return the error message (whitespace folded)."""
    monkeypatch.chdir(tmp_path)
    assert cli("import", DATA / "template.yaml").exit_code == 0
    before = sha256_of(db_path)

    def run(*args):
        result = cli("import", *args)
        assert result.exit_code == 2, result.output
        assert sha256_of(db_path) == before
        assert not (tmp_path / "CASEDB_PWNED").exists()
        assert "Traceback" not in result.output
        return flat(result.stderr)

    return run


def quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar, every character but printable ASCII escaped."""
    out = []
    for ch in text:
        if " " <= ch <= "~" and ch not in '"\\':
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'




def manifest(tmp_path: Path, body: str, name: str = "m.yaml", model: str = "hostile") -> Path:
    path = tmp_path / name
    path.write_text(f"model: {model}\ncases:\n{body}", encoding="utf-8")
    return path


# ------------------------------------------------------------------------ 4: YAML alias bombs


@pytest.mark.parametrize("name, line", [("alias_bomb.yaml", 11), ("alias_doubling.yaml", 19)])
def test_alias_bombs_are_refused_at_their_line(refused, name, line):
    err = refused(HOSTILE / name)
    assert f"{name}:{line}: aliases expand to more than 10,000 + 10 x the" in err
    assert "write the values out or use fewer aliases" in err


def test_recursive_alias_is_refused(refused):
    err = refused(HOSTILE / "recursive_alias.yaml")
    assert "recursive_alias.yaml:8: alias *loop refers to a node that contains it (a recursive structure)" in err


def test_aliases_within_the_budget_import_as_written_out(cli, tmp_path, db_path):
    """Anchors shared by many cases are legitimate: they import to the cases written out."""
    spec = "{shape: [4, 8], dtype: bf16, init: uniform, init_args: {low: -1.0, high: 1.0}}"
    with_aliases = "".join(
        GOOD_CASE.format(name=f"c{i}", input=f"tensor: &t {spec}" if i == 0 else "tensor: *t") for i in range(300))
    written_out = "".join(GOOD_CASE.format(name=f"c{i}", input=f"tensor: {spec}") for i in range(300))
    assert cli("import", manifest(tmp_path, with_aliases, "a.yaml", "aliased")).exit_code == 0
    assert cli("import", manifest(tmp_path, written_out, "b.yaml", "plain")).exit_code == 0
    q = "SELECT name, signature FROM model_cases WHERE model = ? ORDER BY name"
    assert rows(db_path, q, ["aliased"]) == rows(db_path, q, ["plain"])
    assert len(rows(db_path, q, ["plain"])) == 300


def test_python_tags_are_never_executed(refused):
    err = refused(HOSTILE / "python_tag.yaml")
    assert "python_tag.yaml:8: the YAML tag tag:yaml.org,2002:python/object/apply:os.system is not used" in err


# ------------------------------------------------------- 10: deep nesting, huge ints, surrogates


def test_deep_flow_list_is_refused(refused, tmp_path):
    path = manifest(tmp_path, "  - name: deep\n    op: torch.neg\n    inputs:\n      - value: "
                    + "[" * 100_000 + "]" * 100_000 + "\n")
    assert "m.yaml:6: nested deeper than 64 levels" in refused(path)


def test_deep_flow_mapping_is_refused(refused, tmp_path):
    path = manifest(tmp_path, "  - name: deep\n    op: torch.neg\n    attrs: {x: "
                    + "{a: " * 5000 + "1" + "}" * 5000 + "}\n")
    assert "m.yaml:5: nested deeper than 64 levels" in refused(path)


def test_deep_json_line_in_a_scan_file_is_refused(refused, tmp_path):
    path = tmp_path / "scan.jsonl"
    header = {"casedb_scan": 1, "model": "hostile", "level": "torch", "phase": "prefill"}
    case = '{"type": "case", "case": {"op": "torch.neg", "inputs": [{"value": ' + "[" * 100_000 + "]" * 100_000 + "}]}}"
    path.write_text(json.dumps(header) + "\n" + case + "\n")
    assert "scan.jsonl:2: JSON nested too deeply to read" in refused(path)


def test_5000_digit_integer_is_refused_at_its_line(refused, tmp_path):
    path = manifest(tmp_path, "  - name: big\n    op: torch.add\n    inputs:\n      - tensor: {shape: [2]}\n"
                    "      - value: " + "7" * 5000 + "\n")
    assert "m.yaml:7: integer 77777777777777777777... has 5,000 characters; at most 100 are accepted" in refused(path)


def test_sexagesimal_integer_is_refused(refused):
    assert "sexagesimal_int.yaml:8: integer 59:59:59:59:59:59:59... has 119 characters" in refused(
        HOSTILE / "sexagesimal_int.yaml")


def test_5000_digit_integer_in_a_scan_file_names_the_line(refused, tmp_path):
    path = tmp_path / "scan.jsonl"
    header = {"casedb_scan": 1, "model": "hostile", "level": "torch", "phase": "prefill"}
    path.write_text(json.dumps(header) + "\n"
                    + '{"type": "case", "case": {"op": "torch.add", "inputs": [{"value": ' + "9" * 5000 + "}]}}\n")
    assert "scan.jsonl:2: Exceeds the limit (4300 digits) for integer string conversion" in refused(path)


def test_5000_digit_integer_in_a_trace_names_the_file(refused, tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::neg", "ts": ' + "1" * 5000 + "}]}")
    err = refused(path, "--model", "m", "--format", "kineto")
    assert "t.json: not a Kineto trace: Exceeds the limit (4300 digits)" in err


def test_surrogate_escape_in_a_yaml_name_is_refused_at_its_line(refused):
    err = refused(HOSTILE / "surrogate_name.yaml")
    assert "surrogate_name.yaml:8: YAML syntax error: found invalid Unicode character escape code" in err


@pytest.mark.parametrize("field, expected", [
    ("name", "case '\\ud800evil': 'name' holds the lone surrogate \\ud800"),
    ("description", "case 'fine': 'description' holds the lone surrogate \\udc00"),
    ("value", "case 'fine': op, inputs or attrs hold the lone surrogate \\udfff"),
])
def test_surrogates_in_scan_records_are_refused_with_the_case(refused, tmp_path, field, expected):
    case = {"name": "fine", "op": "torch.neg", "inputs": [{"tensor": {"shape": [2]}}]}
    if field == "name":
        case["name"] = "\ud800evil"
    elif field == "description":
        case["description"] = "a \udc00 b"
    else:
        case["inputs"].append({"value": "x\udfff"})
    header = {"casedb_scan": 1, "model": "hostile", "level": "torch", "phase": "prefill"}
    path = tmp_path / "scan.jsonl"
    # json.dumps escapes a lone surrogate as \ud800, which json.loads reads back as one
    path.write_text(json.dumps(header) + "\n" + json.dumps({"type": "case", "case": case}) + "\n")
    err = refused(path)
    assert f"scan.jsonl:2: {expected}" in err


def test_surrogate_in_a_model_name_is_refused(refused, tmp_path):
    path = tmp_path / "scan.jsonl"
    path.write_text(json.dumps({"casedb_scan": 1, "model": "m\udc80", "level": "torch", "phase": "p"}) + "\n")
    assert "scan.jsonl: the model name holds the lone surrogate \\udc80" in refused(path)


def test_undecodable_file_name_is_refused(refused, tmp_path):
    raw = os.fsencode(tmp_path) + b"/bad\xffname.yaml"
    with open(raw, "wb") as f:
        f.write((DATA / "template.yaml").read_bytes())
    err = refused(os.fsdecode(raw))
    assert "bad\\udcffname.yaml" in err and "the file name is not valid UTF-8; rename the file" in err


# --------------------------------------------- 5: ET cycles, gzip bombs, FIFOs, endless devices


def test_execution_trace_with_a_ctrl_deps_cycle_is_refused(refused):
    err = refused(HOSTILE / "et_cycle.json", "--model", "m")
    assert "et_cycle.json: event 1 (node 2): ctrl_deps form a cycle of 2 nodes (ids 2, 3); the trace is corrupt" in err


def test_execution_trace_without_the_cycle_imports(cli, tmp_path):
    """The same trace with the cycle cut (node 2 under the root) is fine: the cycle is the fault."""
    et = json.loads((HOSTILE / "et_cycle.json").read_text())
    et["nodes"][1]["ctrl_deps"] = 1
    (tmp_path / "et.json").write_text(json.dumps(et))
    report = cli.json("import", tmp_path / "et.json", "--model", "m")
    assert report["totals"]["occurrences"] == 1


def test_cycle_among_operators_is_refused(refused, tmp_path):
    et = json.loads((HOSTILE / "et_cycle.json").read_text())
    relu = et["nodes"][3]
    et["nodes"] = et["nodes"][:1] + [dict(relu, id=10, ctrl_deps=11), dict(relu, id=11, ctrl_deps=12),
                                     dict(relu, id=12, ctrl_deps=10)]
    (tmp_path / "et.json").write_text(json.dumps(et))
    err = refused(tmp_path / "et.json", "--model", "m")
    assert "event 1 (node 10): ctrl_deps form a cycle of 3 nodes (ids 10, 11, 12)" in err


def _gzip_bomb(path: Path, size: int) -> None:
    """A gzip file that expands to `size` bytes (about 1000:1): the start of a Kineto trace, then
    blanks (valid JSON so far). gzip members concatenate, so one 1 MiB member is repeated."""
    member = gzip.compress(b" " * (1 << 20), 9)
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": ['))
        f.write(member * (size >> 20))


def test_gzip_bomb_is_refused_before_it_expands(refused, tmp_path):
    bomb = tmp_path / "bomb.pt.trace.json.gz"
    _gzip_bomb(bomb, 3 << 30)  # 3 GiB when expanded; about 3 MB here
    assert bomb.stat().st_size < 4 << 20
    err = refused(bomb, "--model", "m")
    assert "bomb.pt.trace.json.gz: expands more than 100x" in err and "refused as a gzip bomb" in err


def test_gzip_over_the_size_limit_is_refused(refused, tmp_path):
    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::neg", "ts": i, "dur": 1,
                              "args": {"Input Dims": [[4]], "Input type": ["float"]}} for i in range(20000)]}
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    err = refused(path, "--model", "m", "--max-input-mb", "1")
    assert "t.json.gz: decompresses to more than the 1 MiB limit on one input file" in err
    assert "casedb import --max-input-mb N" in err


def test_plain_file_over_the_size_limit_is_refused(refused, tmp_path):
    path = manifest(tmp_path, "".join(GOOD_CASE.format(name=f"c{i}", input="tensor: {shape: [2]}")
                                      for i in range(20000)))
    assert path.stat().st_size > 1 << 20
    assert "m.yaml: is 1.4 MiB, over the 1 MiB limit on one input file" in refused(path, "--max-input-mb", "1")


def test_fifo_to_import_is_refused_not_waited_on(refused, tmp_path):
    os.mkfifo(tmp_path / "trace.json")
    err = refused(tmp_path / "trace.json", "--model", "m")
    assert "trace.json: is a FIFO (named pipe), not a regular file; casedb reads only regular files" in err


def test_fifo_in_a_folder_is_refused(refused, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.yaml").write_text((DATA / "template.yaml").read_text())
    os.mkfifo(folder / "b.yaml")
    assert "in/b.yaml: is a FIFO (named pipe)" in refused(folder)


def test_link_to_dev_zero_is_refused(refused, tmp_path):
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    assert "zero.json: is a character device, not a regular file" in refused(tmp_path / "zero.json", "--model", "m")


def _pt_manifest(tmp_path: Path, path_text: str) -> Path:
    return manifest(tmp_path, f"  - name: from_file\n    op: torch.relu\n    inputs:\n      - file: {path_text}\n")


def test_file_input_that_is_a_fifo_is_refused(refused, tmp_path):
    os.mkfifo(tmp_path / "x.pt")
    err = refused(_pt_manifest(tmp_path, "x.pt"))
    assert "m.yaml:3: case 'from_file': inputs[0]: file 'x.pt' is a FIFO (named pipe), not a regular file" in err


def test_file_input_linked_to_dev_zero_is_refused(refused, tmp_path):
    (tmp_path / "x.pt").symlink_to("/dev/zero")
    err = refused(_pt_manifest(tmp_path, "x.pt"))
    assert "m.yaml:3: case 'from_file': inputs[0]: file 'x.pt' is outside the manifest's folder" in err
    err = refused(_pt_manifest(tmp_path, "x.pt"), "--allow-outside")  # trusted, still no endless read
    assert "m.yaml:3: case 'from_file': inputs[0]: file 'x.pt' is a character device" in err


def test_file_input_that_is_no_torch_save_zip_is_refused(refused, tmp_path):
    (tmp_path / "x.pt").write_bytes(b"\x80\x02" + b"\0" * 100)  # a legacy (pre-zip) header
    err = refused(_pt_manifest(tmp_path, "x.pt"))
    assert "case 'from_file': inputs[0]: cannot load 'x.pt' as a tensor: not a .pt file written by torch.save" in err


def test_file_input_with_compressed_entries_is_refused(refused, tmp_path):
    import torch

    torch.save(torch.zeros(1000), tmp_path / "plain.pt")
    with zipfile.ZipFile(tmp_path / "plain.pt") as src, zipfile.ZipFile(tmp_path / "x.pt", "w") as dst:
        for info in src.infolist():  # a zip bomb's way: the storage deflated
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    err = refused(_pt_manifest(tmp_path, "x.pt"))
    assert "cannot load 'x.pt' as a tensor: its zip entries are compressed or larger than the file" in err


def test_file_input_expanding_past_the_limit_is_refused(refused, tmp_path):
    import torch

    torch.save(torch.zeros(1).expand(1 << 20), tmp_path / "x.pt")  # 4 MiB of values from 4 bytes
    assert (tmp_path / "x.pt").stat().st_size < 4096
    err = refused(_pt_manifest(tmp_path, "x.pt"), "--max-input-mb", "1")
    assert "inputs[0]: 'x.pt' holds a tensor of 4,194,304 bytes, over the 1,048,576-byte limit" in err


def test_file_input_pickle_is_never_executed(refused, tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return os.system, ("touch CASEDB_PWNED",)

    import torch

    torch.save({"t": torch.zeros(2)}, tmp_path / "x.pt")  # a real zip, its pickle swapped
    with zipfile.ZipFile(tmp_path / "x.pt") as src:
        members = {i.filename: src.read(i) for i in src.infolist()}
    data_pkl = next(n for n in members if n.endswith("data.pkl"))
    members[data_pkl] = pickle.dumps(Evil(), protocol=2)
    with zipfile.ZipFile(tmp_path / "evil.pt", "w") as dst:
        for name, data in members.items():
            dst.writestr(name, data)
    err = refused(_pt_manifest(tmp_path, "evil.pt"))
    assert "case 'from_file': inputs[0]: cannot load 'evil.pt' as a tensor: UnpicklingError" in err


# ---------------------------------------------------------------- 12: file: paths outside


@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink"])
def test_file_input_outside_the_manifest_folder_is_refused(refused, tmp_path, where):
    import torch

    outside = tmp_path / "secret.pt"
    torch.save(torch.arange(4.0), outside)
    folder = tmp_path / "manifests"
    folder.mkdir()
    path_text = {"absolute": str(outside), "dotdot": "../secret.pt", "symlink": "link.pt"}[where]
    if where == "symlink":
        (folder / "link.pt").symlink_to(outside)
    err = refused(_pt_manifest(folder, path_text))
    assert (f"manifests/m.yaml:3: case 'from_file': inputs[0]: file '{path_text}' is outside the manifest's folder"
            in err)
    assert "casedb import --allow-outside reads it, if you trust this manifest" in err


def test_allow_outside_reads_it(cli, tmp_path, db_path):
    import torch

    torch.save(torch.arange(4.0), tmp_path / "secret.pt")
    folder = tmp_path / "manifests"
    folder.mkdir()
    torch.save(torch.arange(4.0), folder / "inside.pt")
    assert cli("import", _pt_manifest(folder, "../secret.pt"), "--allow-outside").exit_code == 0
    # the same values below the folder: the same case (a file input is its content)
    assert cli("import", _pt_manifest(folder, "inside.pt"), "--model", "again").exit_code == 0
    assert [r["n"] for r in rows(db_path, "SELECT count(DISTINCT signature) AS n FROM model_cases")] == [1]


def test_names_with_line_breaks_round_trip_through_export(cli, tmp_path, db_path):
    names = ["a\nb", "trailing\n", "two\n\n", "\nlead", "cr\r\nlf", "lone\rcr", "nel\x85x", "ls\u2028x", "ps\u2029x",
             "  spaced  ", "tab\tx", "x: y #z", "'q'", '"""', "[/m]", "x;touch /tmp/p;#", "- dash", "null", "1", "~",
             "a\n  indented\nb", "ends with space \nx", "\t\n", "é ü 中文 😀", "bell\x07", "a\u200bb", "\ufeffbom"]
    body = "".join(GOOD_CASE.format(name=quoted(n), input=f"tensor: {{shape: [{i + 1}]}}")
                   + f"    description: {quoted(n)}\n" for i, n in enumerate(names))
    assert cli("import", manifest(tmp_path, body, model="names")).exit_code == 0
    q = "SELECT name, description, signature FROM model_cases ORDER BY name"
    stored = rows(db_path, q)
    assert sorted(r["name"] for r in stored) == sorted(names)
    out = tmp_path / "out" / "names.yaml"
    assert cli("export", "--model", "names", "-o", out).exit_code == 0
    fresh = tmp_path / "fresh.db"
    assert cli("import", out, db=fresh).exit_code == 0
    assert rows(fresh, q) == stored
    assert yaml.safe_load(out.read_text())["model"] == "names"


# --------------------------------------------------------- 9: import --replace with history


def test_replace_keeps_history_and_retires_judged_occurrences(cli, tmp_path, db_path):
    from tests import runs_data

    runs_data.two_runs(cli, tmp_path, db_path)
    ids = {r["name"]: r["id"] for r in rows(db_path, "SELECT id, name FROM model_cases")}
    judgements_before = rows(db_path, "SELECT * FROM judgements ORDER BY id")
    # model_a now: a_add kept, a_silu / a_softmax / a_mul gone (judged: retired), a_new added
    smaller = tmp_path / "model_a.yaml"
    smaller.write_text(runs_data.MANIFEST_A.split("  - name: a_silu")[0]
                       + "  - name: a_new\n    op: torch.neg\n    inputs:\n      - tensor: {shape: [3]}\n")
    report = cli.json("import", "--replace", smaller)
    assert (report["retired"], report["removed"]) == (3, 0)
    assert rows(db_path, "SELECT id, model, name, retired_at IS NOT NULL AS retired FROM model_cases "
                         "WHERE model = 'model_a' ORDER BY id") == [
        {"id": ids["a_add"], "model": "model_a", "name": "a_add", "retired": 0},
        {"id": ids["a_silu"], "model": "model_a", "name": "a_silu", "retired": 1},
        {"id": ids["a_softmax"], "model": "model_a", "name": "a_softmax", "retired": 1},
        {"id": ids["a_mul"], "model": "model_a", "name": "a_mul", "retired": 1},
        {"id": max(ids.values()) + 1, "model": "model_a", "name": "a_new", "retired": 0}]
    # history untouched: every judgement row, and the views still name the retired occurrence
    assert rows(db_path, "SELECT * FROM judgements ORDER BY id") == judgements_before
    failed = rows(db_path, "SELECT case_name FROM verdicts WHERE run_id = 2 AND outcome = 'failed'")
    assert [r["case_name"] for r in failed] == ["a_silu"]
    # listings show what the model has now
    assert [c["name"] for c in cli.json("cases", "--model", "model_a")] == ["a_add", "a_new"]
    assert [(m["name"], m["cases"]) for m in cli.json("models")] == [("model_a", 2), ("model_b", 2)]
    assert cli.json("stats")["occurrences"] == 4
    # a never-judged occurrence replaced away is simply removed
    only_add = GOOD_CASE.format(name="a_add", input="tensor: {shape: [1]}")
    report = cli.json("import", "--replace", manifest(tmp_path, only_add, "again.yaml", "model_a"))
    assert (report["retired"], report["removed"]) == (0, 1)
    assert "a_new" not in [r["name"] for r in rows(db_path, "SELECT name FROM model_cases")]
    # importing the original again brings the retired ones back, with their ids (their history)
    (tmp_path / "original.yaml").write_text(runs_data.MANIFEST_A)
    assert cli("import", tmp_path / "original.yaml").exit_code == 0
    current = rows(db_path, "SELECT id, name FROM model_cases WHERE model = 'model_a' AND retired_at IS NULL ORDER BY id")
    assert current == [{"id": ids[n], "name": n} for n in ("a_add", "a_silu", "a_softmax", "a_mul")]


def test_replace_under_another_spelling_of_the_model_name(cli, tmp_path, db_path):
    from tests import runs_data

    runs_data.two_runs(cli, tmp_path, db_path)
    body = GOOD_CASE.format(name="b_only", input="tensor: {shape: [3]}")
    report = cli.json("import", "--replace", manifest(tmp_path, body, "b.yaml", "Model-B"))
    assert (report["retired"], report["removed"]) == (2, 0)
    assert rows(db_path, "SELECT model, name FROM model_cases WHERE model = 'model_b' AND retired_at IS NULL") == [
        {"model": "model_b", "name": "b_only"}]


def test_failed_replace_changes_nothing(refused, tmp_path):
    err = refused("--replace", DATA / "broken" / "negative_dim.yaml")
    assert "negative_dim.yaml:3: case 'relu_negative'" in err
