"""Misbehaving ops for testing casedb's runner: a crash, a hang, and wrong values on the target only.

Importing this module registers (once per process; importing it again is harmless):

* ``torch.ops.casedb_test.abort(Tensor x) -> Tensor`` — calls ``os.abort()`` when it runs (the
  process dies with SIGABRT; under ``torch.compile`` it traces fine and aborts when executed).
* ``torch.ops.casedb_test.sleep(Tensor x, float seconds) -> Tensor`` — sleeps, then returns a
  copy of ``x`` (for timeouts).
* ``torch.ops.casedb_test.wrong_on_device(Tensor x) -> Tensor`` — ``2 * x`` on the CPU (so the
  reference is right) and ``2 * x + 1`` on every other device: wrong values on a device target
  in eager mode.
* ``torch.ops.casedb_test.interrupt(Tensor x, int kind) -> Tensor`` — raises KeyboardInterrupt
  (``kind`` 0) or SystemExit(3) (``kind`` 1): an op, not the user, stopping the process.
* ``torch.ops.casedb_test.gelu_inf_fault(Tensor x) -> Tensor`` — GELU, with NaN at ``+inf`` in
  every dtype but float64: the fault x86's bfloat16/float32 ``gelu`` has (``gelu(inf)`` is NaN
  there, ``inf`` in float64), on every CPU, so a test can rely on the reference being wrong.
* the dynamo backend ``casedb_test_perturb`` — runs the captured graph eagerly and returns every
  floating output as ``y + 0.01 * (1 + |y|)``: wrong values on the target for any op on any
  device, the CPU included (``run_case(case, backend="casedb_test_perturb")``).
* the dynamo backend ``casedb_test_float64`` — runs the captured graph on float64 copies of the
  floating inputs and rounds the outputs back: a target that is right where the CPU reference of
  ``gelu_inf_fault`` is wrong.

Cases use them like any op: ``{"op": "torch.ops.casedb_test.sleep", "inputs": [{"tensor": ...},
{"value": 30.0}]}``.
"""

from __future__ import annotations

import os
import time

import torch

NAMESPACE = "casedb_test"
PERTURB_BACKEND = "casedb_test_perturb"
FLOAT64_BACKEND = "casedb_test_float64"


def perturb(y):
    """What the perturbing backend does to one output."""
    if isinstance(y, torch.Tensor) and (y.is_floating_point() or y.is_complex()):
        return y + 0.01 * (1 + y.abs())
    return y


def _registered() -> bool:
    try:
        torch.ops.casedb_test.gelu_inf_fault.default
        return True
    except (AttributeError, RuntimeError):
        return False


def _register_ops() -> None:
    @torch.library.custom_op(f"{NAMESPACE}::abort", mutates_args=())
    def abort(x: torch.Tensor) -> torch.Tensor:
        os.abort()

    @abort.register_fake
    def _abort_fake(x):
        return torch.empty_like(x)

    @torch.library.custom_op(f"{NAMESPACE}::sleep", mutates_args=())
    def sleep(x: torch.Tensor, seconds: float) -> torch.Tensor:
        time.sleep(seconds)
        return x.clone()

    @sleep.register_fake
    def _sleep_fake(x, seconds):
        return torch.empty_like(x)

    @torch.library.custom_op(f"{NAMESPACE}::wrong_on_device", mutates_args=())
    def wrong_on_device(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return y if x.device.type == "cpu" else y + 1

    @wrong_on_device.register_fake
    def _wrong_fake(x):
        return torch.empty_like(x)

    @torch.library.custom_op(f"{NAMESPACE}::interrupt", mutates_args=())
    def interrupt(x: torch.Tensor, kind: int) -> torch.Tensor:
        if kind == 0:
            raise KeyboardInterrupt("raised by the op")
        raise SystemExit(3)

    @interrupt.register_fake
    def _interrupt_fake(x, kind):
        return torch.empty_like(x)

    @torch.library.custom_op(f"{NAMESPACE}::gelu_inf_fault", mutates_args=())
    def gelu_inf_fault(x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.gelu(x.double()).to(x.dtype)
        return y if x.dtype == torch.float64 else y.masked_fill(x == float("inf"), float("nan"))

    @gelu_inf_fault.register_fake
    def _gelu_fake(x):
        return torch.empty_like(x)


def _perturbing_backend(gm: torch.fx.GraphModule, example_inputs):
    def run(*args):
        out = gm(*args)
        if isinstance(out, (tuple, list)):
            return type(out)(perturb(y) for y in out)
        return perturb(out)

    return run


def _float64_backend(gm: torch.fx.GraphModule, example_inputs):
    def run(*args):
        wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        out = gm(*wide)
        like = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        dtype = like[0].dtype if like else torch.float64

        def back(y):
            return y.to(dtype) if isinstance(y, torch.Tensor) and y.is_floating_point() else y
        return type(out)(back(y) for y in out) if isinstance(out, (tuple, list)) else back(out)

    return run


if not _registered():
    _register_ops()
for _backend, _name in ((_perturbing_backend, PERTURB_BACKEND), (_float64_backend, FLOAT64_BACKEND)):
    try:
        torch._dynamo.register_backend(_backend, name=_name)
    except AssertionError:  # "duplicate name": registered by an earlier import of this file
        pass
