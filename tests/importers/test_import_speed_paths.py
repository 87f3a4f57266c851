"""The JSON trace importers decode with orjson (issue 30): a valid trace never takes the stdlib's
slower path; what only the stdlib reads still imports; bad JSON keeps the stdlib's clear message."""

import gzip
import json
import math

import pytest

from importers import execution_trace, kineto, trace_values
from importers.trace_values import TraceFormatError

DATA = "tests/data/traces/"
LLAMA_K = DATA + "llama_tiny_forward.kineto.json"
LLAMA_ET = DATA + "llama_tiny_forward.et.json.gz"


@pytest.fixture
def no_stdlib_json(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the stdlib json decoder was used for a valid trace")

    monkeypatch.setattr(trace_values.json, "loads", refuse)


@pytest.mark.parametrize("mod,src", [(kineto, LLAMA_K), (execution_trace, LLAMA_ET)])
def test_a_valid_trace_is_decoded_by_orjson_alone(no_stdlib_json, mod, src):
    records = list(mod.parse(src))
    assert len(records) > 20 and {r["type"] for r in records} <= {"case", "skipped"}


def test_what_only_the_stdlib_reads_imports_as_before(tmp_path):
    """NaN and integers over 64 bits: orjson refuses them, the stdlib reads them (the fallback)."""
    doc = json.loads(open(LLAMA_K).read())
    doc["extra"] = [float("nan"), 2**70]
    path = tmp_path / "nan.pt.trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception):
        import orjson

        orjson.loads(path.read_bytes())
    same = json.dumps(list(kineto.parse(path))).replace(str(path), "TRACE")
    assert same == json.dumps(list(kineto.parse(LLAMA_K))).replace(LLAMA_K, "TRACE") != "[]"
    got = trace_values.load_json(path, "Kineto trace", "fix")
    assert math.isnan(got["extra"][0]) and got["extra"][1] == 2**70


@pytest.mark.parametrize("mod,what", [(kineto, "Kineto trace"), (execution_trace, "Execution Trace")])
def test_bad_json_names_the_file_line_and_column(tmp_path, mod, what):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [\n  {"ph": "X",\n   "name": "aten::mm" "cat": 1}]}'))
    with pytest.raises(TraceFormatError, match=rf"^{bad}: not a complete {what}: invalid JSON at line 3 column 23 "
                                               r"\(Expecting ',' delimiter\); the file looks truncated or corrupt"):
        list(mod.parse(bad))
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"traceEvents": [{"name": "caf\xe9"}]}')
    with pytest.raises(TraceFormatError, match=rf"^{latin}: not a {what}: not UTF-8 text \(invalid continuation byte\)"):
        list(mod.parse(latin))
