"""The run path's layout (issue 25): modules of one job under ~500 lines, functions under ~60, a
Target whose fields are written out, and a plugin module that stays cheap to load."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

from casedb.run.runspec import RunSpec, spec_fields
from casedb.run.target import Target

ROOT = Path(__file__).resolve().parents[2] / "casedb"
# the run path, judging, the plugin and the command line (other packages keep their own check)
OWNED = [*sorted((ROOT / "run").glob("*.py")), ROOT / "judge" / "verdict.py", ROOT / "judge" / "execution.py",
         ROOT / "pytest_plugin.py", *sorted((ROOT / "cli").glob("*.py")), ROOT / "cases" / "marks.py"]
MAX_LINES, MAX_FUNCTION_LINES = 500, 60


def test_modules_and_functions_stay_small():
    too_long, long_functions = [], []
    for path in OWNED:
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert (too_long, long_functions) == ([], [])


def test_target_is_a_dataclass_written_out_in_step_with_runspec():
    assert "device: str | None = None" in inspect.getsource(Target)  # (make_dataclass left no source)
    assert [f.name for f in dataclasses.fields(Target)] == [f.name for f, flag in spec_fields() if flag.target]
    spec = RunSpec(device="cpu", backend="eager", judge="ulp", threads=2, arch="sm_90")
    assert dataclasses.asdict(Target.from_spec(spec)) == {
        "device": "cpu", "backend": "eager", "imports": [], "reference_dtype": None, "run_skipped": False,
        "check_determinism": False, "judge": "ulp", "values": "random", "replace_device": True, "arch": "sm_90",
        "measure": False, "measure_baseline": "eager", "measure_budget": 2.0, "threads": 2}
    blank = RunSpec()
    assert Target() == Target.from_spec(blank) and Target().judge == blank.judge == "both"


def test_the_plugin_loads_without_torch_or_the_store():
    """Every pytest session loads the plugin (pytest11): one without model-op tests never imports
    torch or sqlite-utils."""
    code = ("import sys, casedb.pytest_plugin; "
            "print(sorted(m for m in ('torch', 'sqlite_utils') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
