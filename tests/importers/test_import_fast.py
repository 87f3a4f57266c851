"""The Kineto importer's typed decode (issue 30): msgspec builds only the fields casedb reads and
keeps the argument columns as raw text; the records, the odd events and the error messages are
those of the full decode it replaced."""

import gzip
import json

import pytest

from importers import execution_trace, kineto, trace_values
from importers.trace_values import TraceFormatError
from tests.helpers import DATA

TRACES = DATA / "traces"
# Every record of each fixture at both levels, as the importers gave them before the typed
# decode (commit 6286dbe), then with issue 44's Python numbers, devices and Tensor[] dtypes (every
# other record unchanged): {"<path>:<level>": [record, ...]}, paths relative to the checkout.
BEFORE = TRACES / "records_before_issue30.json.gz"
MODULES = {"kineto.json": kineto, "trace.json.gz": kineto, "et.json.gz": execution_trace}


@pytest.fixture
def no_full_decode(monkeypatch):
    """A full decode of the document (orjson, tried first, or the stdlib) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the whole trace was decoded into dicts")

    monkeypatch.setattr(trace_values.orjson, "loads", refuse)
    monkeypatch.setattr(trace_values, "_stdlib", refuse, raising=False)


def _before() -> dict:
    return json.loads(gzip.decompress(BEFORE.read_bytes()))


@pytest.mark.parametrize("key", sorted(_before()))
def test_fixture_records_are_the_records_of_before(key):
    path, level = key.rsplit(":", 1)
    mod = next(m for end, m in MODULES.items() if path.endswith(end))
    assert json.loads(json.dumps(list(mod.parse(path, level=level)))) == _before()[key]


@pytest.mark.parametrize("path", ["tests/data/traces/llama_tiny_forward.kineto.json",
                                  "tests/data/traces/bert_tiny_train.pt.trace.json.gz"])
def test_a_kineto_fixture_is_never_decoded_into_dicts(no_full_decode, path):
    for level in ("top", "leaf"):
        assert json.loads(json.dumps(list(kineto.parse(path, level=level)))) == _before()[f"{path}:{level}"]


def _event(name, ts, dur, dims, *, ph="X", cat="cpu_op", extra="", args=True):
    """One event as JSON text; ``dims`` is written as given (raw text), None leaves out dur."""
    fields = [f'"ph": "{ph}"', f'"cat": "{cat}"', f'"name": "{name}"', '"pid": 7', '"tid": 1', f'"ts": {ts}']
    if dur is not None:
        fields.append(f'"dur": {dur}')
    if args is None:
        fields.append('"args": null')
    elif dims is not None:
        fields.append(f'"args": {{"External id": {ts}, "Input type": ["float"], "Input Dims": {dims}, '
                      f'"Input Strides": [[]], "Concrete Inputs": [""]{extra}}}')
    return "{" + ", ".join(fields) + "}"


def _odd_trace(path, tail_args: str) -> str:
    """A step with what real traces hold besides plain operators; ``tail_args`` goes into a
    CUDA runtime event's args (the fields casedb skips)."""
    events = [
        '{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "python"}}',        # 0 metadata
        "null",                                                                            # 1
        '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 7, "tid": 1, "ts": 0, "dur": 100}',
        '{"ph": "X", "cat": "user_annotation", "name": "block", "pid": 7, "tid": 1, "ts": 5, "dur": 70, '
        '"args": {"External id": 2}}',                                                     # 3 nested range
        _event("aten::relu", 10, 5, "[[4, 8]]"),                                           # 4
        _event("aten::relu", 20, 5, "[ [4,8] ]"),                                          # 5 same value
        _event("aten::relu", 30, None, "[[2, 2]]"),                                        # 6 no dur
        _event("aten::neg", 40, 2, None),                                                  # 7 no args
        _event("aten::neg", 45, 2, None, args=None),                                       # 8 args null
        '{"ph": "s", "id": 1, "pid": 7, "tid": 1, "ts": 10, "cat": "ac2g", "name": "ac2g"}',  # 9 flow
        '{"ph": "f", "id": 1, "pid": 0, "tid": 3, "ts": 12, "cat": "ac2g", "name": "ac2g", "bp": "e"}',
        _event("aten::abs", 50, None, "[[9]]", ph="i"),                                    # 11 instant
        _event("aten::relu", 60, 10, "[[3]]",
               extra=', "Record function id": 3, "more": {"nested": [1, {"a": null}], "s": "\\u00e9"}'),
        _event("aten::abs", 62, 2, "[[3]]"),                                               # 13 in 12
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 1, "ts": 63, '
        f'"dur": 1, "args": {tail_args}}}',                                                # 14
    ]
    path.write_text('{"schemaVersion": 1, "record_shapes": 1, "traceEvents": [\n' + ",\n".join(events) + "\n]}")
    return str(path)


def _odd_records(p: str, level: str) -> list[dict]:
    def relu(i, shape, count=1, op="relu"):
        return {"type": "case", "model": None, "where": f"{p}:event {i}", "count": count,
                "case": {"op": f"torch.ops.aten.{op}.default",
                         "inputs": [{"tensor": {"shape": shape, "dtype": "fp32"}}],
                         "attrs": {}, "description": f"{p} event {i}"}}

    neg = {"type": "skipped", "where": f"{p}:event 7", "op": "aten::neg", "count": 2,
           "reason": "event has no input shapes (Input Dims / Input type)"}
    last = relu(12, [3]) if level == "top" else relu(13, [3], op="abs")
    return [relu(4, [4, 8], count=2), relu(6, [2, 2]), neg, last]


@pytest.mark.parametrize("level", ["top", "leaf"])
def test_odd_events_import_typed(no_full_decode, tmp_path, level):
    """No args, args null, no dur, nested ranges, flows, instants, null, unknown nested args;
    one value written two ways is one call."""
    p = _odd_trace(tmp_path / "odd.json", '{"cbid": 211, "correlation": 5}')
    assert list(kineto.parse(p, level=level)) == _odd_records(p, level)


@pytest.mark.parametrize("tail_args", ['{"x": NaN}', "[1, 2]"])
def test_what_the_typed_decoder_refuses_gives_the_same_records(tmp_path, tail_args):
    """NaN (the stdlib reads it) and args of another shape take the full decode: same records."""
    p = _odd_trace(tmp_path / "odd.json", tail_args)
    with pytest.raises(ValueError):
        kineto.DECODER.decode(open(p, "rb").read())
    for level in ("top", "leaf"):
        assert list(kineto.parse(p, level=level)) == _odd_records(p, level)


def test_an_integer_over_64_bits_is_read_as_the_stdlib_reads_it(tmp_path):
    """orjson made 2**64 a float (18446744073709551616.0); the typed decode keeps the int."""
    p = _odd_trace(tmp_path / "big.json", "{}")
    text = open(p).read().replace("[[2, 2]]", f"[[{2**64}, 2]]")
    open(p, "w").write(text)
    shape = [r["case"]["inputs"][0]["tensor"]["shape"] for r in kineto.parse(p) if r["type"] == "case"][1]
    assert shape == [2**64, 2] and type(shape[0]) is int


@pytest.mark.parametrize("tail_args,message", [
    (b'{"name": "caf\xe9"}', r"not a Kineto trace: not UTF-8 text \(invalid continuation byte\)"),
    (b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", r"not a Kineto trace: JSON nested too deeply to read"),
    (b'{"x": 1,}', r"not a complete Kineto trace: invalid JSON at line 16 column 120 "
                   r"\(Expecting property name enclosed in double quotes\)"),
])
def test_bad_json_in_skipped_fields_keeps_its_message(tmp_path, tail_args, message):
    """msgspec does not check the UTF-8 of what it skips: the file is still refused as before."""
    p = _odd_trace(tmp_path / "bad.json", "TAIL")
    data = open(p, "rb").read().replace(b"TAIL", tail_args)
    open(p, "wb").write(data)
    with pytest.raises(TraceFormatError, match=rf"^{p}: {message}"):
        list(kineto.parse(p))


def test_an_unreadable_number_in_a_raw_column_names_the_file(tmp_path):
    """A column is decoded only when its call is kept: its error is the one the full decode gave."""
    p = _odd_trace(tmp_path / "digits.json", "{}")
    text = open(p).read().replace("[[3]]", "[[" + "9" * 5000 + "]]")
    open(p, "w").write(text)
    with pytest.raises(TraceFormatError, match=rf"^{p}: not a Kineto trace: Exceeds the limit \(4300 digits\)"):
        list(kineto.parse(p))
