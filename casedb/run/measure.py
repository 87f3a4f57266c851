"""How fast a passed case runs: the target's latency and a baseline's, measured with
torch.utils.benchmark (``casedb run --measure``), and the work the call does (FLOPs from
torch.utils.flop_counter, bytes read and written from its inputs and outputs).

Each side is warmed up first (a compiled target's compile is never timed), the device is
synchronized inside the timed statement, and the target and the baseline take turns, block by
block (``Timer.timeit`` of one number of calls), until the case's budget is spent: a load that
comes and goes meets both sides alike, so their ratio (``relative``) holds where the times
themselves move. What is kept per side: the median, the interquartile range, the number of timed
blocks and each block's per-call time (for a rank test across runs: :mod:`casedb.read.latency`).
"""

from __future__ import annotations

from time import perf_counter

import statistics

import torch
import torch.utils.benchmark as benchmark
from torch.utils.flop_counter import FlopCounterMode

from casedb.cases.materialize import prepare, result_leaves
from casedb.cases.ops import op_info
from casedb.run.backend import compile_op
from casedb.run.calls import _sync

MAX_TIMES = 64  # per-block times kept per side (enough for a rank test, small in the DB)
DEFAULT_BUDGET = 2.0


def measure_case(case: dict, *, device: str, backend: str, baseline: str, load_blob, budget: float,
                 replace_device: bool = True) -> dict:
    """``{"target": side, "baseline": side, "relative", "flops", "bytes", "peaks", "speedup", "cost_s"}``
    for one case; a side is ``{"median_s", "iqr_s", "blocks", "calls_per_block", "times"}`` (or
    ``{"error": ...}``); ``relative``: the paired target/baseline ratios' median and IQR."""
    t0 = perf_counter()
    info = op_info(case["op"])
    prepared = prepare(case, load_blob=load_blob)
    dev = torch.device(device)
    args, kwargs = prepared.place(dev, replace_device=replace_device)
    fn = compile_op(info.fn, backend)[0] if backend != "eager" else info.fn
    base_dev, base_backend = _baseline(baseline, dev)
    if (base_dev, base_backend) == (dev, backend):
        out = {"target": _timed([(fn, args, kwargs, dev)], budget)[0]}
        out["baseline"] = dict(out["target"], same_as_target=True)
    else:
        bargs, bkwargs = prepared.place(base_dev, replace_device=replace_device) if base_dev != dev else (args, kwargs)
        bfn = compile_op(info.fn, base_backend)[0] if base_backend != "eager" else info.fn
        out = dict(zip(("target", "baseline"), _timed([(fn, args, kwargs, dev), (bfn, bargs, bkwargs, base_dev)], budget)))
        out["relative"] = _relative(out["target"], out["baseline"])
    out["baseline"]["device"], out["baseline"]["backend"] = str(base_dev), base_backend
    out.update(work(info.fn, args, kwargs))
    out["peaks"] = device_peaks(device)
    t, b = out["target"].get("median_s"), out["baseline"].get("median_s")
    out["speedup"] = round(b / t, 4) if t and b else None
    out["cost_s"] = round(perf_counter() - t0, 3)
    return out


def _baseline(name: str, dev: torch.device) -> tuple[torch.device, str]:
    """``eager`` (the target device, no compile: the default), ``cpu`` (eager on the CPU) or a
    backend name (on the target device)."""
    if name == "cpu":
        return torch.device("cpu"), "eager"
    return dev, name


def _timed(sides: list[tuple], budget: float) -> list[dict]:
    """Each side (fn, args, kwargs, device) timed in blocks of one number of calls, the sides
    taking turns block by block until ``budget`` seconds are spent (at most MAX_TIMES blocks a
    side): a load that comes and goes meets every side alike."""
    timers = []
    try:
        for fn, args, kwargs, dev in sides:
            for _ in range(2):  # compile (a compiled target) and warm caches: never timed
                fn(*args, **kwargs)
            _sync(dev)
            timers.append(benchmark.Timer(stmt="fn(*args, **kwargs); sync(dev)", globals={
                "fn": fn, "args": args, "kwargs": kwargs, "sync": _sync, "dev": dev}))
        # calls per block: what makes the first side's block about 10 ms (timer overhead negligible)
        first = timers[0].timeit(1).mean
        number = max(1, min(10_000, int(0.01 / max(first, 1e-9))))
        times: list[list[float]] = [[] for _ in timers]
        end = perf_counter() + budget
        while len(times[0]) < MAX_TIMES and (perf_counter() < end or len(times[0]) < 3):
            for timer, kept in zip(timers, times):
                kept.append(timer.timeit(number).mean)
    except Exception as e:  # noqa: BLE001 - a side that cannot be timed says why; the verdict stands
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        return [{"error": why} for _ in sides]
    return [_side(kept, number) for kept in times]


def _side(times: list[float], number: int) -> dict:
    q = statistics.quantiles(times, n=4, method="inclusive")
    return {"median_s": statistics.median(times), "iqr_s": q[2] - q[0], "blocks": len(times),
            "calls_per_block": number, "times": [round(t, 12) for t in times]}


def _relative(target: dict, baseline: dict) -> dict | None:
    """The target's time over the baseline's (timed in turns): the ratio of their lower quartiles,
    which a busy machine's preemptions reach least (a block that lost the CPU is slower, never
    faster), with the median and IQR of the block-by-block ratios."""
    if "times" not in target or "times" not in baseline:
        return None
    ratios = [t / b for t, b in zip(target["times"], baseline["times"]) if b > 0]
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    low = statistics.quantiles(target["times"], n=4, method="inclusive")[0] / \
        statistics.quantiles(baseline["times"], n=4, method="inclusive")[0]
    return {"ratio": low, "median": statistics.median(ratios), "iqr": q[2] - q[0]}


def work(fn, args, kwargs) -> dict:
    """FLOPs of one call (torch.utils.flop_counter; 0 for ops it has no formula for) and the bytes
    of its distinct input and output storages (what the call must at least read and write)."""
    try:
        with FlopCounterMode(display=False) as counter:
            out = fn(*args, **kwargs)
        flops = int(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - work is a figure beside the latency, never a failure
        return {"flops": None, "bytes": None}
    seen, nbytes = set(), 0
    for t in list(result_leaves((args, kwargs))) + list(result_leaves(out)):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            key = (t.untyped_storage().data_ptr(), t.device)
            if key not in seen:
                seen.add(key)
                nbytes += min(t.untyped_storage().nbytes(), t.numel() * t.element_size()) if t.numel() else 0
    return {"flops": flops, "bytes": nbytes}


# ----------------------------------------------------------------------------- peaks

KNOWN_PEAKS = {  # dense bf16 FLOP/s and memory bytes/s from the vendors' data sheets
    "H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12), "A100": (312e12, 2.0e12), "L40S": (362e12, 0.864e12),
}
_measured: dict = {}


def device_peaks(device: str) -> dict:
    """``{"flops_per_s", "bytes_per_s", "source"}`` of a device: a known accelerator by name, else
    measured here once per process (a large matmul and a large copy: what this CPU reaches)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(dev)
        for key, (f, b) in KNOWN_PEAKS.items():
            if key in name:
                return {"flops_per_s": f, "bytes_per_s": b, "source": f"data sheet ({key})"}
    if str(dev) not in _measured:
        _measured[str(dev)] = _measure_peaks(dev)
    return _measured[str(dev)]


def _measure_peaks(dev: torch.device) -> dict:
    n = 1024
    a = torch.randn(n, n, device=dev)
    mm = benchmark.Timer("torch.mm(a, a); sync(dev)", globals={"torch": torch, "a": a, "sync": _sync, "dev": dev})
    t_mm = min(mm.blocked_autorange(min_run_time=0.2).times)  # the fastest block: the reachable peak
    big = torch.empty(1 << 24, device=dev)  # 64 MiB: past the caches
    cp = benchmark.Timer("b.clone(); sync(dev)", globals={"b": big, "sync": _sync, "dev": dev})
    t_cp = min(cp.blocked_autorange(min_run_time=0.2).times)
    return {"flops_per_s": 2 * n ** 3 / t_mm, "bytes_per_s": 2 * big.numel() * 4 / t_cp,
            "source": f"measured on {dev} (float32 mm {n}x{n}, 64 MiB copy)"}
