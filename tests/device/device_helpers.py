"""Helpers for the PrivateUse1 test device (tests/data/device/testdev.py) driven through the real
`casedb` command: PrivateUse1 is renamed once per process, so each run is a process of its own.
(A module of its own, not conftest: `from conftest import` would find tests/conftest.py.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

DEVICE_DIR = Path(__file__).parents[1] / "data" / "device"
TESTDEV = DEVICE_DIR / "testdev.py"
SMALL = DEVICE_DIR / "small.yaml"


def casedb(db, *args, env=None, cwd=None) -> subprocess.CompletedProcess:
    """`python -m casedb --db DB ARGS` with ``env`` added to this environment (TESTDEV_*)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TESTDEV_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "casedb", "--db", str(db), *map(str, args)], env=full,
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def as_json(proc: subprocess.CompletedProcess):
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def import_small(tmp_path) -> Path:
    db = tmp_path / "dev.db"
    done = casedb(db, "import", SMALL)
    assert done.returncode == 0, done.stderr
    return db


def run_on_testdev(db, *more, env=None, device="testdev"):
    return casedb(db, "run", "--import", TESTDEV, "--device", device, "--backend", "eager", "--json", *more, env=env)
