"""A repro script of a v2 case with a device_layout, on the PrivateUse1 test device: the script
lays the input out with the device module's layout hook, after the stride preset, as a run does;
the device module given as a path relative to where the script is written (issue 45 items 5, 8)."""

import json
import os
import subprocess
import sys

import pytest

from device_helpers import DEVICE_DIR, casedb
from tests.conftest import rows

pytestmark = pytest.mark.slow

# what the script hands the target: the script's own functions, casedb unimportable
PROBE = """\
import json, runpy, sys
sys.modules["casedb"] = None
ns = runpy.run_path(sys.argv[1], run_name="repro")
ns["load_imports"]()
args, _ = ns["arguments"](ns["generate"](), ns["DEVICE"])
print(json.dumps([getattr(args[0], "_device_layout", None), list(args[0].stride()), str(args[0].device)]))
"""


def test_the_repro_lays_the_input_out_with_the_device_hook(tmp_path):
    db = tmp_path / "v2.db"
    assert casedb(db, "import", DEVICE_DIR / "modes-v2.yaml").returncode == 0
    sig = rows(db, "SELECT signature FROM cases WHERE op = 'torch.add'")[0]["signature"]
    script = tmp_path / "repro_add.py"
    # the device module relative to the working directory the repro is written from
    made = casedb(db, "repro", sig[:16], "--import", "testdev.py", "--device", "testdev", "--backend", "eager",
                  "-o", script, cwd=DEVICE_DIR)
    assert made.returncode == 0, made.stderr
    assert "by testdev._layout_hook" in script.read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = subprocess.run([sys.executable, "-c", PROBE, str(script)], capture_output=True, text=True,
                           cwd=elsewhere, timeout=300)
    assert probe.returncode == 0, probe.stderr
    layout, stride, device = json.loads(probe.stdout)
    assert layout == {"device_size": [1, 4, 64], "stride_map": [64, -1, 1], "device_dtype": "float16"}
    assert (stride, device) == ([1, 4], "testdev:0")  # the preset's strides, with the layout
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=elsewhere, timeout=300)
    assert ran.returncode == 0 and "OK: torch.add on testdev (eager)" in ran.stdout, ran.stdout + ran.stderr
    wrong = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=elsewhere, timeout=300,
                           env={**os.environ, "TESTDEV_WRONG": "aten::add.Tensor"})
    assert wrong.returncode == 1 and "AssertionError: torch.add on testdev (eager) vs CPU eager" in wrong.stderr
