"""The pytest front end without --model selects as `casedb run` does once --op (or -k, --shard,
--limit, --max-numel) narrows the selection; only a bare session runs the smoke set (issue 45)."""

import subprocess
import sys

from device_helpers import SMALL, casedb


def _collect(tmp_path, db, *args) -> list[str]:
    (tmp_path / "test_from_casedb.py").write_text("from casedb.pytest_plugin import test_model_op  # noqa: F401\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "--casedb-db", str(db), "--device", "cpu", *args, "test_from_casedb.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return [line for line in done.stdout.splitlines() if "test_model_op[" in line]


def test_op_without_model_collects_what_casedb_run_selects(tmp_path):
    db = tmp_path / "sel.db"
    assert casedb(db, "import", SMALL).returncode == 0
    got = _collect(tmp_path, db, "--casedb-op", "torch.add", "-m", "")
    assert len(got) == 1 and "torch.add" in got[0]
    listed = casedb(db, "run", "--device", "cpu", "--backend", "eager", "--op", "torch.add", "--json")
    assert '"executed": 1' in listed.stdout
