"""A dynamo backend under bring-up, for the triage tests: ``casedb_test_faulty``.

It cannot compile a graph that multiplies (RuntimeError at compile time: stage "compile: backend
compiler") and returns wrong values for a graph that takes an rsqrt (stage "incorrect result");
every other graph runs as captured.
"""

from torch._dynamo import register_backend

NAME = "casedb_test_faulty"


def _faulty(gm, example_inputs):
    targets = {str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")}
    if any("mul" in t for t in targets):
        raise RuntimeError("faulty backend: cannot lower mul")
    wrong = any("rsqrt" in t for t in targets)

    def run(*args):
        out = gm(*args)
        if not wrong:
            return out
        return type(out)(o + 1 for o in out) if isinstance(out, (tuple, list)) else out + 1

    return run


try:
    register_backend(_faulty, name=NAME)
except Exception:  # registered already in this process
    pass
