"""Which layer of a compile backend is at fault: the failing case rerun with eager on the same
device (the device's kernels alone) and with ``aot_eager`` (the compiler's front half: the same
graph capture and decompositions, no code generation). Eager failing: the device's kernel;
eager passing and aot_eager failing: a decomposition; both passing: the generated code. A chain
(:mod:`casedb.explain.schedule`) of one round on two backends.
"""

from __future__ import annotations

EAGER = ("eager", None, "")
LAYERS = ("kernel", "decomposition", "codegen")


def chain(examples: list[dict], backend: str | None):
    """Returns {"layer": one of LAYERS or None, "by": text}."""
    if backend in EAGER:
        return {"layer": "kernel", "by": "the run used no compiler: the device's eager kernels"}
    cases = list(examples)
    outs = yield [{**c, "_backend": "eager"} for c in cases] + [{**c, "_backend": "aot_eager"} for c in cases]
    eager, aot = outs[:len(cases)], outs[len(cases):]
    if any(o.outcome in ("invalid", "lost") for o in outs):
        return {"layer": None, "by": "eager or aot_eager could not run the case"}
    if not all(o.outcome == "passed" for o in eager):
        return {"layer": "kernel", "by": "eager on the device fails too: the device's kernel is wrong"}
    if not all(o.outcome == "passed" for o in aot):
        return {"layer": "decomposition", "by": "eager passes, aot_eager fails: a decomposition is wrong"}
    return {"layer": "codegen", "by": f"eager and aot_eager pass: {backend}'s generated code is wrong"}
