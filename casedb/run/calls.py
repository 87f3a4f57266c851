"""Calling an op as a case: a user's Ctrl-C told apart from an op that raises KeyboardInterrupt,
the device synchronized around the call, contexts an op leaves entered left, results copied to
the CPU, and the inputs whose version counters a call moves watched (:mod:`casedb.run.execute`)."""

from __future__ import annotations

import signal
import threading
from time import perf_counter

import torch


def _sync(dev: torch.device) -> None:
    if dev.type != "cpu":
        sync = getattr(getattr(torch, dev.type, None), "synchronize", None)
        if sync is not None:
            sync()


_interrupted = False


def watch_interrupts() -> None:
    """Tell a user's Ctrl-C apart from an op that raises KeyboardInterrupt: only the first stops
    a run (a SIGINT handler notes it, then does what the previous handler did)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "casedb", False) or previous in (signal.SIG_IGN, None):
        return

    def on_sigint(signum, frame):
        global _interrupted
        _interrupted = True
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    on_sigint.casedb = True
    signal.signal(signal.SIGINT, on_sigint)


def is_case_outcome(e: BaseException) -> bool:
    """Whatever a case raises is its outcome (SystemExit, KeyboardInterrupt too), except the
    KeyboardInterrupt of a real Ctrl-C."""
    return not (isinstance(e, KeyboardInterrupt) and _interrupted)


def _call(fn, args, kwargs, dev):
    """(ok, output or exception, seconds)."""
    _sync(dev)
    t = perf_counter()
    try:
        out = fn(*args, **kwargs)
        _sync(dev)
    except BaseException as e:  # any failure of the op is a result, not a crash of the runner
        if not is_case_outcome(e):
            raise
        return False, e, perf_counter() - t
    _leave_contexts(out)
    return True, out, perf_counter() - t


def _leave_contexts(out) -> None:
    """An op that enters a context (torch.amp's _enter_autocast) returns it entered: leave it,
    or autocast would stay on for every later case in this process."""
    unmanaged = getattr(torch.amp.autocast_mode, "_UnmanagedAutocast", None)
    parts = out if isinstance(out, (list, tuple)) else [out]
    for x in parts:
        if unmanaged is not None and isinstance(x, unmanaged):
            torch.amp.autocast_mode._exit_autocast(x)


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x if x.device.type == "cpu" else x.detach().to("cpu")
    if isinstance(x, (list, tuple)):
        items = [_to_cpu(i) for i in x]
        if type(x) in (list, tuple):
            return type(x)(items)
        for build in (lambda: type(x)(items), lambda: type(x)(*items)):  # structseq, namedtuple
            try:
                return build()
            except TypeError:
                continue
        return tuple(items)
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    return x


def _watch(args, kwargs) -> list:
    out = []
    for i, a in enumerate(args):
        _watch_one(f"args[{i}]", a, out)
    for k, a in kwargs.items():
        _watch_one(f"kwargs[{k}]", a, out)
    return out


def _watch_one(key, a, out):
    if isinstance(a, torch.Tensor):
        out.append((key, a, a._version))
    elif isinstance(a, (list, tuple)):
        for t in a:
            if isinstance(t, torch.Tensor):
                out.append((key, t, t._version))
