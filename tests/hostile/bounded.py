"""One `casedb` command in its own process, with what it cost: wall and CPU time, its peak RSS
(the child's own ``ru_maxrss`` and ``ru_utime + ru_stime``, from ``os.wait4``, as
bench/bench_hostile.py measures) and its exit status; and the files of a folder, for "nothing
written" bounds.

The time bound is on CPU time: this machine's cores are shared, and under load the wall time of
the same command varies threefold; a runaway loop or a flood of writes is CPU all the same. Wall
time is bounded too, loosely (a command that waits forever is killed and fails).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# The bounds issue 24 sets for a refused input.
REFUSED_S = 5.0
REFUSED_RSS_MIB = 1024
REFUSED_WALL_S = 30.0


@dataclass
class Cost:
    rc: int
    s: float
    cpu_s: float
    rss_mib: float
    stdout: str
    stderr: str


def run_casedb(db: Path, *args, timeout: float = 120, cwd: Path | None = None) -> Cost:
    """`python -m casedb --db DB ARGS...`, killed after ``timeout`` seconds (rc -9 then)."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "casedb", "--db", str(db), *map(str, args)],
                            stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > timeout:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.01)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    wall = time.perf_counter() - start
    out.seek(0)
    err.seek(0)
    return Cost(proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
                out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def refused_within_bounds(cost: Cost, *said: str) -> None:
    """Exit 2 with a message (each of ``said`` in it), no traceback, within the issue's bounds."""
    assert cost.rc == 2, (cost.rc, cost.stderr[-2000:])
    assert "Traceback" not in cost.stderr and "error:" in cost.stderr, cost.stderr[-2000:]
    for text in said:
        assert text in " ".join(cost.stderr.split()), (text, cost.stderr)
    assert cost.cpu_s <= REFUSED_S and cost.s <= REFUSED_WALL_S, cost
    assert cost.rss_mib <= REFUSED_RSS_MIB, cost


def snapshot(folder: Path) -> dict[str, str]:
    """name -> sha256 of every file in ``folder`` (what "nothing written" compares)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir()) if p.is_file()}
