"""Dynamo backends slower on purpose, for `casedb run --measure`'s latency regressions:
``casedb_test_plain`` runs the graph as it is; ``casedb_test_slow_mm_150`` takes 1.5x as long
on graphs with a matmul-like op (mm, bmm, linear, matmul, addmm) and is as fast elsewhere;
``casedb_test_slow_mm_105`` takes 1.05x on those. The delay is a busy wait proportional to the
graph's own time, so it scales with the machine's load as the work does."""

from time import perf_counter

from torch._dynamo import register_backend

MATMUL_LIKE = ("mm", "bmm", "linear", "matmul", "addmm", "baddbmm")


def _matmul_like(gm) -> bool:
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method"):
            name = getattr(n.target, "__name__", str(n.target)).split(".")[-1]
            if name in MATMUL_LIKE:
                return True
    return False


def _slower(factor: float):
    def backend(gm, example_inputs):
        if not _matmul_like(gm):
            return gm.forward

        def run(*args):
            t = perf_counter()
            out = gm(*args)
            spent = perf_counter() - t
            while perf_counter() - t < factor * spent:
                pass
            return out

        return run

    return backend


for _name, _factor in (("casedb_test_plain", 1.0), ("casedb_test_slow_mm_150", 1.5), ("casedb_test_slow_mm_105", 1.05)):
    try:
        register_backend(_slower(_factor), name=_name)
    except Exception:  # registered already in this process
        pass
