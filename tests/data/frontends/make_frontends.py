"""Regenerate the fixtures of tests/test_same_call.py: ONE forward of a small module recorded by
every front end casedb imports.

    python tests/data/frontends/make_frontends.py [OUT_DIR]

* ``block.scan.jsonl`` — what ``casedb scan`` records (its torch-level recorder,
  :class:`casedb.scan.recording.Recorder`, on CPU tensors): ``torch.nn.functional.linear``,
  ``torch.Tensor.mul``, ``torch.getitem`` ...;
* ``block.kineto.json`` and ``block.et.json`` — the same forward under ``torch.profiler.profile(
  record_shapes=True, execution_trace_observer=...)``: ``aten::linear``, ``aten::mul``,
  ``aten::slice``, ``aten::index_put_``, ``aten::lift_fresh`` ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 8)
        self.gate = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = self.proj(x)                      # F.linear / aten::linear
        h = h * self.gate                     # Tensor.mul / aten::mul.Tensor
        s = torch.matmul(h, h.transpose(0, 1))
        p = F.softmax(s, dim=-1)
        part = p[:, 1:3]                      # getitem / aten::slice
        p[0] = part.sum()                     # setitem / aten::index_put_ (or fill_)
        bias = torch.tensor([0.5, -0.5])      # tensor / aten::lift_fresh
        return part + bias


def forward_inputs():
    torch.manual_seed(0)
    return Block().eval(), torch.randn(4, 16)


def scan(out: Path) -> None:
    from casedb.scan.recording import Recorder

    model, x = forward_inputs()
    rec = Recorder("torch", "block")
    rec.recording = True
    with torch.no_grad(), rec.modes():
        model(x)
    header = {"casedb_scan": 1, "model": "block", "level": "torch", "phase": "prefill",
              "defaults": {"dtype": "fp32"}, "calls": rec.calls}
    with open(out / "block.scan.jsonl", "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for r in rec.records():
            f.write(json.dumps(r) + "\n")


def traces(out: Path) -> None:
    model, x = forward_inputs()
    with torch.no_grad():
        model(x)  # warm-up: lazy initialisation stays out of the trace
        et = ExecutionTraceObserver().register_callback(str(out / "block.et.json"))
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, execution_trace_observer=et) as prof:
            model(x)
        prof.export_chrome_trace(str(out / "block.kineto.json"))


def main(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for write in (scan, traces):
        write(target)
    print("\n".join(f"{p} {p.stat().st_size}" for p in sorted(target.glob("block.*"))))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
