"""A dynamo backend that doubles what a graph with an add returns: ``casedb_test_broken_add``,
for the regression of an expected pass."""

from torch._dynamo import register_backend

NAME = "casedb_test_broken_add"


def _broken_add(gm, example_inputs):
    adds = any("add" in str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))

    def run(*args):
        out = gm(*args)
        return type(out)(o * 2 for o in out) if isinstance(out, (tuple, list)) and adds else (out * 2 if adds else out)

    return run


try:
    register_backend(_broken_add, name=NAME)
except Exception:  # registered already in this process
    pass
