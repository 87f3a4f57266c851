"""casedb explain's reading of cases, without running any: features of stored cases (layout,
broadcasting, K, the last dim), the separating condition and its counts, and the variants that
change one feature at a time (each still a valid case that casedb signs)."""

from casedb.cases import spec as casespec
from casedb.explain import conditions, features, variants
from casedb.explain.minimal import elements


def t(shape, dtype="float32", **kw):
    return {"tensor": {"shape": list(shape), "dtype": dtype, "init": "randn", **kw}}


def case(op, *inputs, dtype="float32", attrs=None):
    return {"op": op, "inputs": list(inputs), "attrs": attrs or {}, "dtype": dtype, "seed": 3}


def test_features_name_layout_broadcast_k_and_the_output_shape():
    mm = features.of_case(case("torch.matmul", t([2, 8, 1100]), t([2, 1100, 16], preset="transpose_view",
                                                                   preset_args={"dim0": 1, "dim1": 2})))
    assert (mm["op"], mm["K"], mm["last"], mm["batch"], mm["numel"], mm["rank"]) == ("matmul", 1100, 16, 2, 256, 3)
    assert mm["noncontiguous"] and mm["layout:in1"] == "transposed" and not mm["broadcast"]
    lin = features.of_case(case("torch.nn.functional.linear", t([4, 300]), t([24, 300]), t([24])))
    assert (lin["K"], lin["last"], lin["numel"]) == (300, 24, 96)
    bc = features.of_case(case("torch.add", t([16, 64]), t([64])))
    assert bc["broadcast"] and not bc["noncontiguous"] and bc["numel"] == 1024
    red = features.of_case(case("torch.sum", t([8, 50]), attrs={"dim": -1}))
    assert (red["K"], red["last"], red["numel"]) == (50, 8, 8)


def test_the_simplest_separating_condition_with_its_counts():
    fail = [{"op": "add", "dtype": "float32", "noncontiguous": False, "last": n, "numel": 4 * n} for n in (24, 40, 7)]
    ok = [{"op": "add", "dtype": "float32", "noncontiguous": False, "last": n, "numel": 4 * n} for n in (16, 48, 64)]
    best = conditions.separating(fail, ok)[0]
    assert (best.kind, best.key, best.value, best.failing, best.passing) == ("notmult", "last", 16, 3, 0)
    assert best.feature == "divisibility" and best.phrase() == "the last dim is not a multiple of 16"
    # K >= t: the passing value nearest the threshold is kept for the bisection to start from
    fail = [{"op": "matmul", "K": k} for k in (1100, 1536)]
    ok = [{"op": "matmul", "K": k} for k in (64, 1000, 1024)]
    ge = next(c for c in conditions.separating(fail, ok) if c.kind == "ge")
    assert (ge.value, ge.near, ge.feature) == (1100, 1024, "dim_size")


def test_a_pair_when_no_single_feature_separates():
    fail = [{"dtype": "bfloat16", "noncontiguous": True}] * 3
    ok = [{"dtype": "bfloat16", "noncontiguous": False}, {"dtype": "float32", "noncontiguous": True}]
    got = conditions.separating(fail, ok)[0]
    assert got.also is not None and got.passing == 0 and got.failing == 3
    assert "non-contiguous" in got.phrase() and "bfloat16" in got.phrase()


def test_nothing_failing_nothing_to_explain():
    assert conditions.separating([], [{"dtype": "float32"}]) == []


def test_variants_change_one_feature_and_stay_valid_cases():
    base = case("torch.matmul", t([8, 1536]), t([1536, 24], preset="transpose_view"))
    made = {"contiguous": variants.contiguous(base), "dtype": variants.other_dtype(base),
            "K": variants.with_size(base, "K", 1025), "round": variants.rounded(base, "last", 16),
            "half": variants.rounded(base, "last", 16, odd_half=True)}
    feats = {k: features.of_case(v) for k, v in made.items()}
    assert not feats["contiguous"]["noncontiguous"] and feats["contiguous"]["K"] == 1536
    assert feats["dtype"]["dtype"] == "bfloat16" and feats["dtype"]["noncontiguous"]
    assert feats["K"]["K"] == 1025 and made["K"]["inputs"][1]["tensor"]["shape"] == [1025, 24]
    assert feats["round"]["last"] == 32 and feats["half"]["last"] % 16 and feats["half"]["last"] % 8 == 0
    for v in made.values():  # each one a case casedb reads and signs
        assert casespec.normalize_case({"name": "v", **v}, {}).signature
    wide = variants.materialized(case("torch.add", t([16, 64]), t([64])))
    assert [s["tensor"]["shape"] for s in wide["inputs"]] == [[16, 64], [16, 64]]
    assert variants.materialized(case("torch.add", t([4, 4]), t([4, 4]))) is None


def test_shrinking_keeps_every_tied_dim_in_step():
    base = case("torch.add", t([64, 128]), t([128]))
    for how, v in variants.shrunk(base):
        a, b = (s["tensor"]["shape"] for s in v["inputs"])
        assert a[-1] == b[-1] and elements(v) < elements(base), how
