"""PyTorch trace importers: Kineto, Execution Trace, operator_inp_logs (parse and write).

Fixtures in tests/data/traces come from real profiler runs of tiny random-weight transformers
models (regenerate with tests/data/traces/make_traces.py) and one real PyTorch operator log.
"""

import gzip
import io
import json
import math
import shutil
import sqlite3

import pytest

from importers import detect, execution_trace, kineto, op_schema, oplog
from importers.trace_values import PROFILER_DTYPES, SCALAR_TYPES, TraceFormatError
from tests.helpers import DATA, sha256_of

TRACES = DATA / "traces"
LLAMA_K = TRACES / "llama_tiny_forward.kineto.json"
LLAMA_ET = TRACES / "llama_tiny_forward.et.json.gz"
BERT_TRAIN = TRACES / "bert_tiny_train.pt.trace.json.gz"
BERT_LOG = TRACES / "BertForMaskedLM_training.txt"
HAND_LOG = TRACES / "handwritten_oplog.txt"


def cases(records):
    return [r for r in records if r["type"] == "case"]


def skipped(records):
    return [r for r in records if r["type"] == "skipped"]


def op_and_shapes(record):
    """(op without overload, input shapes): what a Kineto and an ET import must agree on."""
    c = record["case"]
    shapes = []
    for i in c["inputs"]:
        if "tensor" in i:
            shapes.append(tuple(i["tensor"]["shape"]))
        elif "tensor_list" in i:
            shapes.append(tuple(tuple(t["shape"]) for t in i["tensor_list"]))
    return ".".join(c["op"].split(".")[:4]), tuple(shapes)


def first(records, op):
    return next(r for r in records if r["type"] == "case" and r["case"]["op"] == op)


# ------------------------------------------------------------------ Kineto vs Execution Trace


@pytest.mark.parametrize("level", ["top", "leaf"])
def test_kineto_and_et_of_one_forward_give_the_same_calls(level):
    k = list(kineto.parse(LLAMA_K, level=level))
    e = list(execution_trace.parse(LLAMA_ET, level=level))
    assert skipped(k) == [] and skipped(e) == []
    assert {op_and_shapes(r) for r in k} == {op_and_shapes(r) for r in e}
    assert sum(r["count"] for r in k) == sum(r["count"] for r in e)
    # Same top-level call multiset, not just the same set.
    count = lambda rs: sorted((op_and_shapes(r), r["count"]) for r in rs)  # noqa: E731
    assert count(k) == count(e)


@pytest.mark.parametrize("level", ["top", "leaf"])
@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_kineto_events_out_of_time_order_give_the_same_calls(tmp_path, level, order):
    # Kineto writes each thread in time order and the importer takes that one-pass path; a trace
    # merged or edited out of order takes the sorting one, with the same result
    doc = json.loads(LLAMA_K.read_text())
    events = doc["traceEvents"]
    if order == "reversed":
        events.reverse()
    else:
        __import__("random").Random(3).shuffle(events)
    moved = tmp_path / f"{order}.pt.trace.json"
    moved.write_text(json.dumps(doc))
    count = lambda rs: sorted((op_and_shapes(r), r["count"]) for r in rs)  # noqa: E731
    assert count(kineto.parse(moved, level=level)) == count(kineto.parse(LLAMA_K, level=level))


def test_top_level_hides_nested_calls_and_leaf_shows_them():
    top: dict = {}
    for r in kineto.parse(LLAMA_K):
        top[r["case"]["op"]] = top.get(r["case"]["op"], 0) + r["count"]
    leaf = {r["case"]["op"] for r in kineto.parse(LLAMA_K, level="leaf")}
    # The model calls F.linear (8 times in a 1-layer Llama: q k v o gate up down lm_head) ...
    assert top["torch.ops.aten.linear.default"] == 8
    assert "torch.ops.aten.mm.default" not in top and "torch.ops.aten.t.default" not in top
    # ... which runs t -> transpose -> as_strided and matmul -> mm -> resolve_conj: the leaves
    # are the innermost calls, so not linear and not even mm (it calls resolve_conj).
    assert {"torch.ops.aten.as_strided.default", "torch.ops.aten.resolve_conj.default",
            "torch.ops.aten._unsafe_view.default"} <= leaf
    assert not leaf & {"torch.ops.aten.linear.default", "torch.ops.aten.matmul.default", "torch.ops.aten.mm.default"}


@pytest.mark.slow
def test_live_profile_of_a_transformers_model_kineto_equals_et(tmp_path):
    """Profile a tiny GPT-2 (random weights) now, with both profilers, and import both files."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 64, (2, 5))
    et_path, k_path = tmp_path / "gpt2.et.json", tmp_path / "gpt2.pt.trace.json"
    with torch.no_grad():
        model(ids)
        obs = ExecutionTraceObserver().register_callback(str(et_path))
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, execution_trace_observer=obs) as prof:
            model(ids)
        prof.export_chrome_trace(str(k_path))
    assert detect(k_path) == "kineto" and detect(et_path) == "et"
    k = list(kineto.parse(k_path))
    e = list(execution_trace.parse(et_path))
    assert skipped(k) == [] and skipped(e) == []
    assert {op_and_shapes(r) for r in k} == {op_and_shapes(r) for r in e}
    ops = {op_and_shapes(r)[0] for r in k}
    assert {"torch.ops.aten.addmm", "torch.ops.aten.scaled_dot_product_attention", "torch.ops.aten.tanh"} <= ops


# ------------------------------------------------------------------------ Kineto records


def test_kineto_records_carry_overloads_names_values_and_strides():
    recs = list(kineto.parse(LLAMA_K))
    assert len(recs) == 58
    path = str(LLAMA_K)
    # Raw event 178: Input type [bf16 x3, "", Scalar x4], Concrete ["", "", "", "", "0.", "True",
    # "0.35355339059327379", "True"], q strides [224, 8, 32, 1] (a transposed view).
    assert first(recs, "torch.ops.aten.scaled_dot_product_attention.default") == {
        "type": "case", "model": None, "where": f"{path}:event 178", "count": 1,
        "case": {
            "op": "torch.ops.aten.scaled_dot_product_attention.default",
            "inputs": [
                {"tensor": {"shape": [1, 4, 7, 8], "dtype": "bf16", "preset": "strided",
                            "preset_args": {"stride": [224, 8, 32, 1], "storage_offset": 0}}},
                {"tensor": {"shape": [1, 2, 7, 8], "dtype": "bf16"}},
                {"tensor": {"shape": [1, 2, 7, 8], "dtype": "bf16"}},
                {"value": None}, {"value": 0.0}, {"value": True},
            ],
            "attrs": {"scale": 0.3535533905932738, "enable_gqa": True},
            "description": f"{path} event 178",
        },
    }
    # mean.dim: ScalarList "[-1]" -> [-1]; the keyword-only ScalarType? dtype "" -> None in attrs.
    assert first(recs, "torch.ops.aten.mean.dim") == {
        "type": "case", "model": None, "where": f"{path}:event 63", "count": 3,
        "case": {"op": "torch.ops.aten.mean.dim",
                 "inputs": [{"tensor": {"shape": [1, 7, 32], "dtype": "fp32"}}, {"value": [-1]}, {"value": True}],
                 "attrs": {"dtype": None}, "description": f"{path} event 63"},
    }
    # to.device: ScalarType code 6 -> torch.float32; the unrecorded Device -> "cpu" placeholder.
    assert first(recs, "torch.ops.aten.to.device")["case"]["inputs"] == [
        {"tensor": {"shape": [4], "dtype": "bf16"}}, {"value": "cpu"}, {"value": "torch.float32"},
        {"value": False}, {"value": False}, {"value": None}]
    # Kineto writes "TensorList" for cat's dtypes: the rotary cat of this bf16 model is float32,
    # as the cos that takes its result says (and ET records), and the description says so.
    assert first(recs, "torch.ops.aten.cat.default") == {
        "type": "case", "model": None, "where": f"{path}:event 35", "count": 1,
        "case": {"op": "torch.ops.aten.cat.default",
                 "inputs": [{"tensor_list": [{"shape": [1, 7, 4], "dtype": "fp32"},
                                             {"shape": [1, 7, 4], "dtype": "fp32"}]}, {"value": -1}],
                 "attrs": {},
                 "description": f"{path} event 35 (Kineto does not record Tensor[] element dtypes: "
                                "fp32, the dtype of the next call taking its result (aten::cos, event 36))"},
    }


def _event(name, ts, dur, types, dims, strides=None, concrete=None, tid=1, cat="cpu_op"):
    args = {"External id": 0, "Input type": types, "Input Dims": dims,
            "Input Strides": strides if strides is not None else [[] for _ in types],
            "Concrete Inputs": concrete if concrete is not None else ["" for _ in types]}
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _synthetic_trace(path):
    """A forward + backward step in Kineto's format, with every kind of nesting."""
    f = "float"
    events = [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "ts": 0, "args": {"name": "main"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 7, "tid": 1, "ts": 0, "dur": 200,
         "args": {"External id": 1}},
        _event("aten::linear", 10, 40, [f, f, f], [[4, 8], [16, 8], [16]], [[8, 1], [8, 1], [1]]),        # 2
        _event("aten::t", 11, 4, [f], [[16, 8]], [[8, 1]]),                                                # 3
        _event("aten::transpose", 12, 2, [f, "Scalar", "Scalar"], [[16, 8], [], []], None, ["", "0", "1"]),  # 4
        _event("aten::addmm", 16, 30, [f, f, f, "Scalar", "Scalar"], [[16], [4, 8], [8, 16], [], []],
               [[1], [8, 1], [1, 8], [], []], ["", "", "", "1", "1"]),                                     # 5
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "pid": 7,
         "tid": 1, "ts": 60, "dur": 30, "args": {"External id": 9}},                                       # 6
        _event("MmBackward0", 61, 28, [f], [[4, 16]]),                                                      # 7
        _event("aten::mm", 62, 20, [f, f], [[4, 16], [16, 8]], [[16, 1], [8, 1]]),                         # 8
        _event("aten::add", 91, 1, [f, f, "Scalar"], [[4, 8], [4, 8], []], None, ["", "", "1"]),          # 9
        _event("aten::add", 93, 1, [f, f, "Scalar"], [[4, 8], [4, 8], []], None, ["", "", "1"]),          # 10
        _event("aten::mul", 10, 10, ["c10::BFloat16", "double"], [[2, 3], []], [[3, 1], []], tid=2),      # 11
        _event("aten::gelu", 95, 1, [f, ""], [[4, 8], []]),                                                 # 12
        _event("aten::_to_copy", 97, 1, [f, "Scalar", "", "", "", "Scalar", ""],                             # 13
               [[4, 8], [], [], [], [], [], []], None, ["", "15", "", "", "", "False", ""]),
    ]
    path.write_text(json.dumps({"schemaVersion": 1, "record_shapes": 1, "traceEvents": events}))
    return str(path)


def test_kineto_nesting_aggregation_and_transparent_ranges(tmp_path):
    path = _synthetic_trace(tmp_path / "step.json")
    f32 = lambda *shape: {"tensor": {"shape": list(shape), "dtype": "fp32"}}  # noqa: E731

    def case(i, op, inputs, attrs=None, count=1):
        return {"type": "case", "model": None, "where": f"{path}:event {i}", "count": count,
                "case": {"op": op, "inputs": inputs, "attrs": attrs or {}, "description": f"{path} event {i}"}}

    linear = case(2, "torch.ops.aten.linear.default", [f32(4, 8), f32(16, 8), f32(16)])
    mm = case(8, "torch.ops.aten.mm.default", [f32(4, 16), f32(16, 8)])
    add = case(9, "torch.ops.aten.add.Tensor", [f32(4, 8), f32(4, 8)], {"alpha": 1}, count=2)
    # x * <a Python float>: a 0-d double "wrapped number" whose value Kineto does not record
    mul = case(11, "torch.ops.aten.mul.Scalar", [{"tensor": {"shape": [2, 3], "dtype": "bf16"}}, {"value": 1.0}])
    mul["case"]["description"] += (" (Kineto does not record the value of the Python number other=1.0: "
                                   "a neutral value (mul's identity, never a zero divisor))")
    gelu = {"type": "skipped", "where": f"{path}:event 12", "op": "aten::gelu", "count": 1,
            "reason": "Kineto does not record the str argument 'approximate'; import an Execution Trace "
                      "(torch.profiler.ExecutionTraceObserver) to get this op"}
    to_copy = case(13, "torch.ops.aten._to_copy.default", [f32(4, 8)],
                   {"dtype": "torch.bfloat16", "layout": None, "device": None, "pin_memory": None,
                    "non_blocking": False, "memory_format": None})
    # Top: linear hides t/transpose/addmm; the autograd wrapper and MmBackward0 are no operators,
    # so the mm under them is top-level; the two identical adds are one record with count 2.
    assert list(kineto.parse(path)) == [linear, mm, add, mul, gelu, to_copy]
    transpose = case(4, "torch.ops.aten.transpose.int", [f32(16, 8), {"value": 0}, {"value": 1}])
    addmm = case(5, "torch.ops.aten.addmm.default",
                 [f32(16), f32(4, 8), {"tensor": {"shape": [8, 16], "dtype": "fp32", "preset": "strided",
                                                  "preset_args": {"stride": [1, 8], "storage_offset": 0}}}],
                 {"beta": 1, "alpha": 1})
    assert list(kineto.parse(path, level="leaf")) == [transpose, addmm, mm, add, mul, gelu, to_copy]


def test_kineto_trace_without_concrete_inputs_never_guesses_scalars(tmp_path):
    """Traces from before Concrete Inputs existed: a passed scalar is unknown, not None."""
    events = [_event("aten::clamp", 1, 1, ["float", "Scalar", ""], [[3], [], []]),
              _event("aten::relu", 3, 1, ["float"], [[3]])]
    for e in events:
        del e["args"]["Concrete Inputs"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"traceEvents": events}))
    p = str(path)
    assert list(kineto.parse(path)) == [
        {"type": "skipped", "where": f"{p}:event 0", "op": "aten::clamp", "count": 1,
         "reason": "argument 'min': Scalar value not recorded (the trace has no Concrete Inputs)"},
        {"type": "case", "model": None, "where": f"{p}:event 1", "count": 1,
         "case": {"op": "torch.ops.aten.relu.default", "inputs": [{"tensor": {"shape": [3], "dtype": "fp32"}}],
                  "attrs": {}, "description": f"{p} event 1"}},
    ]


def test_bert_training_step_from_tensorboard_handler():
    recs = list(kineto.parse(BERT_TRAIN))
    path = str(BERT_TRAIN)
    reason = ("Kineto does not record the str argument 'approximate'; import an Execution Trace "
              "(torch.profiler.ExecutionTraceObserver) to get this op")
    assert [(r["op"], r["reason"]) for r in skipped(recs)] == [
        ("aten::gelu", reason), ("aten::gelu", reason), ("aten::gelu_backward", reason), ("aten::gelu_backward", reason)]
    assert all(r["where"].startswith(f"{path}:event ") for r in recs)
    ops: dict = {}
    for r in cases(recs):
        ops[r["case"]["op"]] = ops.get(r["case"]["op"], 0) + r["count"]
    # Backward kernels run under autograd wrappers and the optimizer under Optimizer.step ranges:
    # they are top-level calls too.
    assert ops["torch.ops.aten.native_layer_norm_backward.default"] == 4  # 4 LayerNorms in the model
    assert ops["torch.ops.aten.embedding_backward.default"] >= 1
    assert "torch.ops.aten.add_.Tensor" in ops
    assert not any("autograd" in op or "Backward0" in op for op in ops)


# ------------------------------------------------------------------------ Execution Trace


def test_et_records_use_op_schema_and_keep_offsets():
    recs = list(execution_trace.parse(LLAMA_ET))
    path = str(LLAMA_ET)
    assert len(recs) == 58
    sdpa = first(recs, "torch.ops.aten.scaled_dot_product_attention.default")
    assert sdpa["case"]["attrs"] == {"scale": 0.353553, "enable_gqa": True}  # ET writes 6 digits
    assert first(recs, "torch.ops.aten.cat.default") == {
        "type": "case", "model": None, "where": f"{path}:event 29", "count": 1,
        "case": {"op": "torch.ops.aten.cat.default",
                 "inputs": [{"tensor_list": [{"shape": [1, 7, 4], "dtype": "fp32"},
                                             {"shape": [1, 7, 4], "dtype": "fp32"}]}, {"value": -1}],
                 "attrs": {}, "description": f"{path} event 29 (node 56)"},
    }
    # rotate_half's x[..., d//2:] is a view 4 elements into its storage.
    neg = first(recs, "torch.ops.aten.neg.default")
    assert neg["case"]["inputs"] == [{"tensor": {"shape": [1, 4, 7, 4], "dtype": "bf16", "preset": "strided",
                                                 "preset_args": {"stride": [224, 8, 32, 1], "storage_offset": 4}}}]


def _et_node(id, name, parent, types=(), values=(), shapes=(), strides=None, schema=""):
    return {"id": id, "name": name, "ctrl_deps": parent,
            "inputs": {"values": list(values), "shapes": list(shapes), "types": list(types),
                       "strides": list(strides) if strides is not None else [[] for _ in types]},
            "outputs": {"values": [], "shapes": [], "types": [], "strides": []},
            "attrs": [{"name": "rf_id", "type": "uint64", "value": id},
                      {"name": "op_schema", "type": "string", "value": schema}]}


def test_et_values_by_schema_type_and_unrepresentable_args(tmp_path):
    t = lambda i, n, off=0: [i, i + 100, off, n, 4, "cpu"]  # noqa: E731
    nodes = [
        _et_node(1, "[pytorch|profiler|execution_trace|process]", 1),
        _et_node(2, "[pytorch|profiler|execution_trace|thread]", 1),
        _et_node(3, "my_block", 2),  # a record_function range: transparent
        _et_node(4, "aten::gelu", 3, ["Tensor(float)", "String"], [t(10, 24), "tanh"], [[4, 6], []],
                 [[6, 1], []], 'aten::gelu(Tensor self, *, str approximate="none") -> Tensor'),
        _et_node(5, "aten::index", 2, ["Tensor(float)", "GenericList[Tensor(nullptr (uninitialized)),Tensor(long int)]"],
                 [t(10, 24), [[0, 0, 0, 0, 0, ""], t(11, 2)]], [[4, 6], [[], [2]]], [[6, 1], [[], [1]]],
                 "aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"),
        _et_node(6, "aten::empty_strided", 2,
                 ["GenericList[Int,Int]", "GenericList[Int,Int]", "Int", "Int", "Device", "Bool"],
                 [[2, 3], [1, 2], 15, 0, "cuda:0", False], [[[], []], [[], []], [], [], [], []], None,
                 "aten::empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, Layout? layout=None, "
                 "Device? device=None, bool? pin_memory=None) -> Tensor"),
        _et_node(7, "aten::clamp", 2, ["Tensor(float)", "Double", "None"], [t(10, 24, 6), "-inf", "<None>"],
                 [[2, 6], [], []], [[1, 2], [], []],
                 "aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor"),
        _et_node(8, "aten::normal_", 2, ["Tensor(float)", "Double", "Double", "Generator"],
                 [t(10, 24), 0.0, 1.0, "<Generator>"], [[4, 6], [], [], []], None,
                 "aten::normal_(Tensor(a!) self, float mean=0., float std=1., *, Generator? generator=None) -> Tensor(a!)"),
        _et_node(9, "aten::clone", 2, ["Tensor(float)", "Int"], [t(12, 24), 2], [[4, 6], []], None,
                 "aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor"),
        _et_node(10, "aten::clone", 2, ["Tensor(float)", "Int"], [t(13, 24), 2], [[4, 6], []], None,
                 "aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor"),
        _et_node(11, "aten::add", 2, ["Tensor(c10::qint8)", "Tensor(float)", "Int"], [t(1, 1), t(2, 1), 1], [[1], [1], []],
                 None, "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"),
    ]
    path = tmp_path / "et.json"
    path.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}))
    p = str(path)
    f32 = lambda *s: {"tensor": {"shape": list(s), "dtype": "fp32"}}  # noqa: E731
    assert list(execution_trace.parse(path)) == [
        {"type": "case", "model": None, "where": f"{p}:event 3", "count": 1,
         "case": {"op": "torch.ops.aten.gelu.default", "inputs": [f32(4, 6)], "attrs": {"approximate": "tanh"},
                  "description": f"{p} event 3 (node 4)"}},
        {"type": "skipped", "where": f"{p}:event 4", "op": "aten::index", "count": 1,
         "reason": "argument 'indices': Tensor?[] list with None entries is not representable"},
        {"type": "case", "model": None, "where": f"{p}:event 5", "count": 1,
         "case": {"op": "torch.ops.aten.empty_strided.default", "inputs": [{"value": [2, 3]}, {"value": [1, 2]}],
                  "attrs": {"dtype": "torch.bfloat16", "layout": "torch.strided", "device": "cuda:0",
                            "pin_memory": False},
                  "description": f"{p} event 5 (node 6)"}},
        {"type": "case", "model": None, "where": f"{p}:event 6", "count": 1,
         "case": {"op": "torch.ops.aten.clamp.default",
                  "inputs": [{"tensor": {"shape": [2, 6], "dtype": "fp32", "preset": "strided",
                                         "preset_args": {"stride": [1, 2], "storage_offset": 6}}},
                             {"py": "-inf"}, {"value": None}],
                  "attrs": {}, "description": f"{p} event 6 (node 7)"}},
        {"type": "skipped", "where": f"{p}:event 7", "op": "aten::normal_", "count": 1,
         "reason": "argument 'generator': opaque object argument (Generator)"},
        {"type": "case", "model": None, "where": f"{p}:event 8", "count": 2,
         "case": {"op": "torch.ops.aten.clone.default", "inputs": [f32(4, 6)],
                  "attrs": {"memory_format": "torch.channels_last"}, "description": f"{p} event 8 (node 9)"}},
        {"type": "skipped", "where": f"{p}:event 10", "op": "aten::add", "count": 1,
         "reason": "argument 'self': tensor of unsupported dtype 'c10::qint8'"},
    ]


def test_schema_parser_handles_alias_lists_defaults_and_kwarg_only():
    s = op_schema.parse_schema(
        'aten::split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]')
    assert (s.name, s.overload, s.op) == ("aten::split_with_sizes", "default", "torch.ops.aten.split_with_sizes.default")
    assert [(a.name, a.type, a.base, a.is_list, a.optional, a.kwarg_only, a.default) for a in s.args] == [
        ("self", "Tensor", "Tensor", False, False, False, None),
        ("split_sizes", "SymInt[]", "SymInt", True, False, False, None),
        ("dim", "int", "int", False, False, False, "0"),
    ]
    s = op_schema.parse_schema(
        'aten::index_put_(Tensor(a!) self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor(a!)')
    assert (s.args[1].is_list, s.args[1].elem_optional, s.args[1].optional) == (True, True, False)
    s = op_schema.parse_schema(
        'aten::pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor')
    assert [(a.name, a.type, a.default) for a in s.args] == [
        ("self", "Tensor", None), ("pad", "SymInt[]", None), ("mode", "str", '"constant"'), ("value", "float?", "None")]


# ------------------------------------------------------------------------ files and errors


@pytest.mark.parametrize("mod,plain_name,gz_name", [
    (kineto, "llama_tiny_forward.kineto.json", None),
    (execution_trace, None, "llama_tiny_forward.et.json.gz"),
])
def test_json_and_json_gz_give_the_same_records(tmp_path, mod, plain_name, gz_name):
    if plain_name:
        plain = tmp_path / "t.json"
        shutil.copy(TRACES / plain_name, plain)
        gz = tmp_path / "t.json.gz"
        gz.write_bytes(gzip.compress(plain.read_bytes()))
    else:
        gz = tmp_path / "t.json.gz"
        shutil.copy(TRACES / gz_name, gz)
        plain = tmp_path / "t.json"
        plain.write_bytes(gzip.decompress(gz.read_bytes()))
    a = json.loads(json.dumps(list(mod.parse(plain))).replace(str(plain), "X"))
    b = json.loads(json.dumps(list(mod.parse(gz))).replace(str(gz), "X"))
    assert a == b and len(a) == 58


def test_format_detection():
    assert detect(LLAMA_K) == "kineto"
    assert detect(BERT_TRAIN) == "kineto"
    assert detect(LLAMA_ET) == "et"
    assert detect(BERT_LOG) == "oplog"
    assert detect(HAND_LOG) == "oplog"
    head = LLAMA_K.read_bytes()[:4096]
    assert kineto.sniff(LLAMA_K, head) and not execution_trace.sniff(LLAMA_K, head) and not oplog.sniff(LLAMA_K, head)
    raw_gz = LLAMA_ET.read_bytes()[:4096]  # raw gzip bytes: the sniffers open the file themselves
    assert execution_trace.sniff(LLAMA_ET, raw_gz) and not kineto.sniff(LLAMA_ET, raw_gz)


def test_gzip_is_known_by_its_bytes_not_its_name(tmp_path):
    """One reader (casedb.files) for sniffing and parsing: a gzip trace saved without .gz,
    and a plain one saved with it, both detect and import."""
    shutil.copy(LLAMA_ET, tmp_path / "et_trace.json")
    (tmp_path / "kineto_trace.json.gz").write_bytes(LLAMA_K.read_bytes())
    assert detect(tmp_path / "et_trace.json") == "et" and detect(tmp_path / "kineto_trace.json.gz") == "kineto"
    calls = lambda records: [(r["case"]["op"], r["case"]["inputs"], r["count"]) for r in cases(records)]  # noqa: E731
    assert calls(execution_trace.parse(tmp_path / "et_trace.json")) == calls(execution_trace.parse(LLAMA_ET))
    assert calls(kineto.parse(tmp_path / "kineto_trace.json.gz")) == calls(kineto.parse(LLAMA_K))


def _truncated(tmp_path, src, cut, compress=False):
    data = gzip.decompress(src.read_bytes()) if src.name.endswith(".gz") else src.read_bytes()
    out = tmp_path / (src.name.split(".")[0] + (".json.gz" if compress else ".json"))
    body = data[: int(len(data) * cut)]
    out.write_bytes(gzip.compress(body) if compress else body)
    return out


@pytest.mark.parametrize("mod,src,what", [(kineto, LLAMA_K, "Kineto trace"), (execution_trace, LLAMA_ET, "Execution Trace")])
def test_truncated_or_corrupt_traces_raise_clear_errors(tmp_path, mod, src, what):
    cut = _truncated(tmp_path, src, 0.5)
    at_end = rf"^{cut}: not a complete {what}: invalid JSON at the end of the file .*truncated or corrupt"
    with pytest.raises(TraceFormatError, match=at_end):
        list(mod.parse(cut))
    # A gzip stream cut in the middle (an interrupted copy of a .json.gz).
    full_gz = tmp_path / "full.json.gz"
    full_gz.write_bytes(gzip.compress(gzip.decompress(src.read_bytes()) if src.name.endswith(".gz") else src.read_bytes()))
    cut_gz = tmp_path / "cut.json.gz"
    cut_gz.write_bytes(full_gz.read_bytes()[: full_gz.stat().st_size // 2])
    with pytest.raises(TraceFormatError, match=rf"^{cut_gz}: the gzip data is truncated or corrupt"):
        list(mod.parse(cut_gz))
    junk = tmp_path / "junk.json"
    junk.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", }]}')
    with pytest.raises(TraceFormatError, match=rf"^{junk}: not a complete {what}: invalid JSON at line 1 column 67"):
        list(mod.parse(junk))


@pytest.mark.parametrize("mod,doc,message", [
    (kineto, {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": "a",
                               "dur": 1, "args": {}}, {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                                       "tid": 1, "ts": "b", "dur": 1, "args": {}}]},
     r"malformed Kineto trace \(TypeError"),
    (execution_trace, {"schema": "1.1.1", "nodes": [{"id": [1], "name": "x"}]}, r"malformed Execution Trace \(TypeError"),
    (execution_trace, {"schema": "1.1.1", "nodes": [{"id": 1, "name": "aten::relu", "ctrl_deps": 1, "inputs": None,
                                                     "attrs": [{"name": "op_schema", "value": "aten::relu(Tensor self) -> Tensor"}]}]},
     r"event 0 \(node 1, aten::relu\): malformed inputs"),
])
def test_valid_json_in_the_wrong_shape_is_a_clear_error(tmp_path, mod, doc, message):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match=rf"^{path}: {message}"):
        list(mod.parse(path))


def test_trace_without_shapes_and_not_a_trace(tmp_path):
    no_shapes = tmp_path / "no_shapes.json"
    no_shapes.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {}}]}))
    with pytest.raises(TraceFormatError, match="recorded without shapes; profile with torch.profiler.profile"):
        list(kineto.parse(no_shapes))
    with pytest.raises(TraceFormatError, match="not an Execution Trace"):
        list(execution_trace.parse(no_shapes))
    with pytest.raises(TraceFormatError, match="not a Kineto/chrome trace"):
        list(kineto.parse(TRACES / "llama_tiny_forward.et.json.gz"))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_profiler_dtype_names_match_torch_and_casedb(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    from casedb.cases import dtypes

    for casedb_dtype in PROFILER_DTYPES.values():
        dtypes.canonical(casedb_dtype)  # every mapped dtype is one the store accepts
    wanted = sorted({dtypes.canonical(v) for v in PROFILER_DTYPES.values()})
    tensors = [torch.empty(2, dtype=getattr(torch, d)) for d in wanted]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for t in tensors:
            torch.ops.aten.alias(t)
    prof.export_chrome_trace(str(tmp_path / "dtypes.json"))
    events = json.loads((tmp_path / "dtypes.json").read_text())["traceEvents"]
    names = [e["args"]["Input type"][0] for e in events if e.get("name") == "aten::alias"]
    assert [dtypes.canonical(PROFILER_DTYPES[n]) for n in names] == wanted
    for code, name in SCALAR_TYPES.items():
        if name.split(".")[1] in wanted:
            assert str(torch.ops.aten.empty.memory_format([1], dtype=code).dtype) == name


# ------------------------------------------------------------------------ operator_inp_logs


def test_real_pytorch_oplog_imports():
    recs = list(oplog.parse(BERT_LOG))
    path = str(BERT_LOG)
    assert len(recs) == 56 and skipped(recs) == []
    assert sum(r["count"] for r in recs) == 707  # the sum of the file's cnt: values
    by_where = {r["where"]: r for r in recs}
    assert by_where[f"{path}:10"] == {
        "type": "case", "model": None, "where": f"{path}:10", "count": 1,
        "case": {"op": "torch.ops.aten._to_copy.default", "inputs": [{"tensor": {"shape": [64, 1, 1, 128], "dtype": "fp32"}}],
                 "attrs": {"dtype": "torch.float16"}, "description": f"{path} line 10"}}
    assert by_where[f"{path}:25"]["case"]["inputs"] == [
        {"tensor": {"shape": [768], "dtype": "fp16"}}, {"tensor": {"shape": [8192, 768], "dtype": "fp16"}},
        {"tensor": {"shape": [768, 768], "dtype": "fp16", "preset": "strided",
                    "preset_args": {"stride": [1, 768], "storage_offset": 0}}}]
    assert by_where[f"{path}:25"]["count"] == 49
    assert by_where[f"{path}:70"]["case"]["inputs"][-1] == {"value": [True, True, True]}
    assert by_where[f"{path}:72"]["case"]["inputs"] == [
        {"tensor": {"shape": [], "dtype": "fp16"}}, {"tensor": {"shape": [8192, 30522], "dtype": "fp16"}},
        {"tensor": {"shape": [8192], "dtype": "int64"}}, {"value": None}, {"value": 1}, {"value": -100},
        {"tensor": {"shape": [], "dtype": "fp16"}}]
    # The old 'aten.sum.SymInt' name is read as its real overload, like the upstream loaders do.
    assert by_where[f"{path}:78"]["case"]["op"] == "torch.ops.aten.sum.dim_IntList"


def test_oplog_write_reproduces_the_real_file():
    recs = list(oplog.parse(BERT_LOG))
    out = io.StringIO()
    left_out = []
    n = oplog.write([dict(r["case"], count=r["count"]) for r in recs], out, skipped=left_out)
    assert (n, left_out) == (56, [])
    assert out.getvalue() == BERT_LOG.read_text().replace("aten.sum.SymInt", "aten.sum.dim_IntList")


def test_handwritten_oplog_edge_cases():
    path = str(HAND_LOG)
    recs = {r["where"].rsplit(":", 1)[1]: r for r in oplog.parse(HAND_LOG)}
    sym = "symbolic size s0 (dynamic-shape log): give its value, e.g. symbols={'s0': 128}"
    assert recs["3"] == {"type": "skipped", "where": f"{path}:3", "op": "torch.ops.aten.add.Tensor", "count": 1, "reason": sym}
    assert recs["7"]["reason"] == "Tensor?[] list with None entries is not representable"
    assert recs["19"]["reason"] == "sparse tensor argument (ST)"
    assert recs["5"]["case"]["inputs"] == [
        {"tensor_list": [{"shape": [2, 3], "dtype": "fp32"},
                         {"shape": [2, 5], "dtype": "fp32", "preset": "strided",
                          "preset_args": {"stride": [1, 2], "storage_offset": 0}}]}, {"value": -1}]
    assert recs["9"]["case"]["inputs"][2] == {"py": "-inf"}
    assert recs["13"]["case"]["attrs"] == {"dtype": "torch.float32", "memory_format": "torch.contiguous_format"}
    assert (recs["15"]["count"], recs["15"]["case"]["description"]) == (1, f"{path} line 15 (cnt: 0, a synthetic input)")
    assert recs["17"]["case"]["inputs"][1:] == [{"py": "nan"}, {"py": "inf"}]
    # The same call listed twice is one record with the counts added.
    assert recs["20"]["count"] == 6 and "21" not in recs
    with_sym = {r["where"].rsplit(":", 1)[1]: r for r in oplog.parse(HAND_LOG, symbols={"s0": 4})}
    assert with_sym["3"]["case"]["inputs"] == [{"tensor": {"shape": [4, 128], "dtype": "bf16"}},
                                               {"tensor": {"shape": [1, 128], "dtype": "bf16"}}]
    assert with_sym["11"]["case"] == {
        "op": "torch.ops.aten.new_empty_strided.default",
        "inputs": [{"tensor": {"shape": [8, 3], "dtype": "fp16"}}, {"value": [4, 3]}, {"value": [3, 1]}],
        "attrs": {"dtype": "torch.float16", "layout": "torch.strided", "device": "cuda", "pin_memory": False},
        "description": f"{path} line 11"}


RELU = "Operator: aten.relu.default\n"
UNREADABLE = r"cannot read the call arguments \("


@pytest.mark.parametrize("text,line,message", [
    ("cnt: 1, ((T([2], f32),), {})\n", 1, "a 'cnt:' line before any 'Operator:' line"),
    ("Operator: aten.relu.default\ncnt: 1, ((T([2], f32),), {})\ngarbage here\n", 3, "unexpected line 'garbage here'"),
    ("Operator: aten.relu.default\ncnt: 1, ((T([2, 3], f32),), {}\n", 2, "cannot read the call arguments"),
    (RELU + "cnt: 1, ((T([2], q9),), {})\n", 2, UNREADABLE + "unknown dtype code 'q9'"),
    (RELU + "cnt: 1, ((T([2], f32), foo), {})\n", 2, UNREADABLE + "unknown name 'foo'"),
    (RELU + "cnt: 1, ((T([2, -1], f32),), {})\n", 2, UNREADABLE + "tensor sizes must be non-negative"),
    ("Operator: aten.relu.default\ncnt: 1, ((__import__('os'),), {})\n", 2, "cannot read the call arguments"),
    ("Operator: relu\ncnt: 1, ((T([2], f32),), {})\n", 1, "bad operator name 'relu'"),
])
def test_bad_oplog_lines_name_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=rf"^{path}:{line}: {message}"):
        list(oplog.parse(path))


def test_oplog_write_layouts_values_and_what_it_cannot_write():
    torch = pytest.importorskip("torch")
    from casedb.cases import presets

    shape = [2, 3, 8]
    tv = presets.transpose_view(torch.zeros(shape), dim0=1, dim1=2).stride()
    ns = presets.noncontig_slice(torch.zeros(shape), dim=1, step=2).stride()
    cases_ = [
        {"op": "torch.ops.aten.add.Tensor", "name": "a",
         "inputs": [{"tensor": {"shape": shape, "preset": "transpose_view", "preset_args": {"dim0": 1, "dim1": 2}}},
                    {"tensor": {"shape": shape, "dtype": "float16", "preset": "noncontig_slice",
                                "preset_args": {"dim": 1, "step": 2}}}],
         "attrs": {"alpha": {"py": "inf"}}, "dtype": "bfloat16", "count": 2},
        {"op": "torch.ops.aten.clamp.default", "inputs": [{"tensor": {"shape": [3], "dtype": "fp32"}},
                                                           {"value": None}, {"py": "nan"}]},
        {"op": "torch.add", "name": "yaml_case", "inputs": []},
        {"op": "torch.ops.aten.addmm", "name": "kineto_without_torch", "inputs": []},
        {"op": "torch.ops.aten.index.Tensor", "name": "py_slice", "inputs": [{"py": "(Ellipsis, None)"}]},
        {"op": "torch.ops.aten.relu.default", "name": "no_dtype", "inputs": [{"tensor": {"shape": [2]}}]},
    ]
    out = io.StringIO()
    left_out = []
    assert oplog.write(cases_, out, skipped=left_out) == 2
    assert out.getvalue() == (
        "Operator: aten.add.Tensor\n"
        f"cnt: 2, ((T([2, 3, 8], bf16, stride={tv}), T([2, 3, 8], f16, stride={ns})), {{'alpha': inf}})\n"
        "Operator: aten.clamp.default\n"
        "cnt: 1, ((T([3], f32), None, float('nan')), {})\n")
    assert left_out == [
        {"case": "yaml_case", "op": "torch.add",
         "reason": "torch.add is not an operator overload torch.ops.<ns>.<op>.<overload>"},
        {"case": "kineto_without_torch", "op": "torch.ops.aten.addmm",
         "reason": "torch.ops.aten.addmm has no overload; the oplog format names one (aten.add.Tensor)"},
        {"case": "py_slice", "op": "torch.ops.aten.index.Tensor", "reason": "py input '(Ellipsis, None)' has no oplog form"},
        {"case": "no_dtype", "op": "torch.ops.aten.relu.default",
         "reason": "tensor dtype unknown (the case relies on a model default dtype)"},
    ]
    with pytest.raises(ValueError, match="4 cases have no operator_inp_logs form, e.g. yaml_case"):
        oplog.write(cases_, io.StringIO())


# ------------------------------------------------------------------------ through `casedb import`


def _table(db, sql):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_cli_imports_traces_with_model(cli, db_path):
    result = cli("import", LLAMA_K)
    assert result.exit_code == 2
    assert "a kineto trace does not name its model: pass --model NAME" in result.stderr
    k = cli.json("import", LLAMA_K, "--model", "llama-tiny")
    # 4 calls compute nothing (empty, lift_fresh, detach_, alias): skipped with their reason
    assert k["totals"] == {"records": 54, "occurrences": 54, "new_cases": 54, "duplicates": 0, "skipped": 4, "files": 1}
    assert k["files"][0]["format"] == "kineto"
    e = cli.json("import", LLAMA_ET, "--model", "llama-tiny-et")
    assert e["files"][0]["format"] == "et"
    # The same forward seen by both profilers: the very same cases but 3 (two negs and an sdpa on
    # views at a storage offset, which Kineto does not record). Kineto's cat dtypes are read off
    # the calls taking their results, so its 4 cats are ET's.
    assert (e["totals"]["records"], e["totals"]["duplicates"], e["totals"]["skipped"]) == (54, 51, 4)
    calls = _table(db_path, "SELECT model, sum(count) FROM model_cases GROUP BY model ORDER BY model")
    assert calls == [("llama-tiny", 81), ("llama-tiny-et", 81)]
    where = _table(db_path, "SELECT source, description FROM model_cases "
                            "WHERE model = 'llama-tiny' AND name LIKE 'aten_embedding%'")
    assert where == [(f"{LLAMA_K}:event 7", f"{LLAMA_K} event 7")]


def test_cli_level_leaf(cli, db_path):
    top = cli.json("import", LLAMA_K, "--model", "top")
    leaf = cli.json("import", LLAMA_K, "--model", "leaf", "--level", "leaf")
    def ops(model):
        return {r[0] for r in _table(db_path, "SELECT c.op FROM model_cases mc JOIN cases c USING (signature) "
                                              f"WHERE mc.model = '{model}'")}

    assert "torch.ops.aten.linear.default" in ops("top") and "torch.ops.aten.mm.default" not in ops("top")
    assert "torch.ops.aten.resolve_conj.default" in ops("leaf") and "torch.ops.aten.linear.default" not in ops("leaf")
    assert leaf["totals"]["records"] > top["totals"]["records"]


def test_cli_skipped_records_are_listed_and_strict_makes_them_an_error(cli, db_path):
    report = cli.json("import", BERT_TRAIN, "--model", "bert-tiny")
    f = report["files"][0]
    assert f["skipped"] == 12  # 4 it cannot represent, 8 detach calls that compute nothing
    assert f["skipped_reasons"][0] == {
        "where": f"{BERT_TRAIN}:event 283", "op": "aten::gelu",
        "reason": "Kineto does not record the str argument 'approximate'; import an Execution Trace "
                  "(torch.profiler.ExecutionTraceObserver) to get this op"}
    before = sha256_of(db_path)
    result = cli("import", BERT_TRAIN, "--model", "bert-strict", "--strict")
    assert result.exit_code == 2
    assert f"{BERT_TRAIN}:event 283: cannot represent aten::gelu" in " ".join(result.stderr.split())
    assert sha256_of(db_path) == before


@pytest.mark.parametrize("src", [LLAMA_K, LLAMA_ET])
def test_cli_corrupt_trace_is_an_error_and_the_db_is_unchanged(cli, db_path, tmp_path, src):
    assert cli("import", BERT_LOG, "--model", "bert-hf").exit_code == 0
    before = sha256_of(db_path)
    good = tmp_path / "good.json"
    good.write_bytes(gzip.decompress(src.read_bytes()) if src.name.endswith(".gz") else src.read_bytes())
    cut = _truncated(tmp_path, src, 0.7, compress=True)
    # One good and one truncated file in one import: nothing of either is written.
    result = cli("import", good, cut, "--model", "llama", "--format", "kineto" if src == LLAMA_K else "et")
    assert result.exit_code == 2
    assert str(cut) in result.stderr and "truncated or corrupt" in " ".join(result.stderr.split())
    assert sha256_of(db_path) == before


def test_cli_export_oplog_round_trip_keeps_signatures(cli, db_path, tmp_path):
    assert cli("import", BERT_LOG, "--model", "bert-hf").exit_code == 0
    assert cli("import", LLAMA_K, "--model", "llama").exit_code == 0
    for model in ("bert-hf", "llama"):
        out = tmp_path / f"{model}.txt"
        assert cli("export", "--model", model, "--format", "oplog", "-o", out).exit_code == 0
        fresh = tmp_path / f"{model}.db"
        assert cli("import", out, "--model", model, db=fresh).exit_code == 0
        sigs = lambda db: sorted(_table(db, f"SELECT signature, count FROM model_cases WHERE model = '{model}'"))  # noqa: E731
        assert sigs(fresh) == sigs(db_path)
    exported = (tmp_path / "bert-hf.txt").read_text()
    assert exported == BERT_LOG.read_text().replace("aten.sum.SymInt", "aten.sum.dim_IntList")


def test_exported_oplog_runs_in_an_upstream_style_loader(cli, tmp_path):
    """The written file loads the way operator_inp_utils/BackendBench load it, and every call runs."""
    torch = pytest.importorskip("torch")
    assert cli("import", LLAMA_K, "--model", "llama").exit_code == 0
    out = tmp_path / "llama.txt"
    assert cli("export", "--model", "llama", "--format", "oplog", "-o", out).exit_code == 0
    codes = {"bf16": torch.bfloat16, "f64": torch.float64, "f32": torch.float32, "f16": torch.float16,
             "i64": torch.int64, "i32": torch.int32, "b8": torch.bool, "u8": torch.uint8}

    def T(size, dtype, stride=None):  # noqa: N802 - the upstream name
        if stride is None:
            return torch.ones(size, dtype=dtype)
        return torch.empty_strided(size, stride, dtype=dtype).fill_(1)

    op, ran = None, 0
    for line in out.read_text().splitlines():
        if line.startswith("Operator: "):
            op = eval("torch.ops." + line[len("Operator: "):], {"torch": torch})
            continue
        args, kwargs = eval(line[line.find(",") + 2:], {"T": T, "th": torch, "inf": math.inf, "torch": torch, **codes})
        op(*args, **kwargs)
        ran += 1
    assert ran == 54  # the trace's 58 calls less 4 that compute nothing
