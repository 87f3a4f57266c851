"""A repro script one can send (issue 46 item 5, issue 45 item 8): the case, the call and the
comparison in its first lines, casedb's judge below a marked line; it runs from any folder the
backend module can be imported from, and says what to put on PYTHONPATH when it cannot."""

import os
import subprocess
import sys

import pytest

MANIFEST = """\
model: send
default: {dtype: fp32, rtol: 1.0e-3, atol: 1.0e-3}
cases:
  - name: residual
    op: torch.add
    inputs:
      - tensor: {shape: [4, 64], init: randn, init_args: {mean: 0.5}}
      - tensor: {shape: [4, 64], preset: transpose_view, preset_args: {dim0: 0, dim1: 1}}
    attrs: {alpha: 2}
"""

# a backend wrong on purpose: every floating output 1 % too large
FAULTY = """\
import torch


def _compile(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        bend = lambda y: y * 1.01 if isinstance(y, torch.Tensor) and y.is_floating_point() else y  # noqa: E731
        return type(out)(bend(y) for y in out) if isinstance(out, (tuple, list)) else bend(out)
    return run


try:
    torch._dynamo.register_backend(_compile, name="casedb_faultyback")
except Exception:  # registered by an earlier import
    pass
"""
MARK = "# casedb's own code, copied"


@pytest.fixture
def project(imported_db, tmp_path, monkeypatch):
    """A folder holding the backend module (the working directory) and a DB with the case; the
    script is written to out/ and run from elsewhere/."""
    imported_db({"send.yaml": MANIFEST})
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "faultyback.py").write_text(FAULTY)
    for d in ("out", "elsewhere"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(proj)
    for name in ("faultyback", "casedb_import_faultyback"):  # each test imports its own file
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield tmp_path
    for name in ("faultyback", "casedb_import_faultyback"):
        sys.modules.pop(name, None)


def write(cli, path, *args):
    made = cli("repro", "send::residual", "--device", "cpu", *args, "-o", path)
    assert made.exit_code == 0, made.output
    return path.read_text()


def run_from(script, cwd, env=None):
    # casedb made unimportable: the script needs torch and the backend module only
    code = ("import runpy, sys; sys.modules['casedb'] = None; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_the_case_the_call_and_the_comparison_come_first(cli, project):
    text = write(cli, project / "out" / "repro.py", "--backend", "eager")
    lines = text.splitlines()
    marked = next(i for i, line in enumerate(lines) if line.startswith(MARK))
    assert marked <= 80, f"{marked} lines before casedb's own code"
    head = "\n".join(lines[:marked])
    # the inputs in words, the call as it is made, the comparison: all above the line
    assert "#   T[0] = float32[4, 64] randn(mean=0.5)" in head
    assert "#   T[1] = float32[4, 64] randn(), then transpose_view(dim0=0, dim1=1)" in head
    assert "# The call: torch.add(T[0], T[1], alpha=2)" in head
    assert "# Used by: send::residual" in head
    for code in ("reference = call(op, *arguments(T, \"cpu\"))", "result = judge(reference, target",
                 "raise AssertionError("):
        assert code in head
    # casedb's judge only below it
    assert "def compare(" not in head and "\ndef compare(" in text[text.index(MARK):]
    assert len(lines) > 2 * marked  # (the judge is most of the file: the head stays what a reader reads)


def test_a_comment_holds_no_line_break_whatever_the_case_holds():
    from casedb.read.repro_words import comment

    said = comment("model\nx = 1\r\u2028\u202e\x0cend")
    assert len(("# " + said).splitlines()) == 1 and said.isprintable()


@pytest.mark.slow
def test_a_file_import_given_relative_runs_from_another_folder(cli, project):
    # `--import faultyback.py` relative to the working directory: the script runs anywhere
    write(cli, project / "out" / "repro.py", "--backend", "casedb_faultyback", "--import", "faultyback.py")
    ran = run_from(project / "out" / "repro.py", project / "elsewhere")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ("AssertionError: torch.add on cpu (casedb_faultyback) vs CPU eager: output: 249 of 256 elements "
            "(97.3%) exceed atol=0.001 + rtol=0.001*|ref|") in ran.stderr


@pytest.mark.slow
def test_a_module_given_by_name_and_a_clear_error_when_it_cannot_be_found(cli, project, monkeypatch):
    monkeypatch.syspath_prepend(str(project / "proj"))
    script = project / "out" / "repro.py"
    write(cli, script, "--backend", "casedb_faultyback", "--import", "faultyback")
    elsewhere = project / "elsewhere"
    # by name where PYTHONPATH holds it, else from the folder it was found in
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for extra in ({"PYTHONPATH": str(project / "proj")}, {}):
        ran = run_from(script, elsewhere, {**env, **extra})
        assert ran.returncode == 1 and "torch.add on cpu (casedb_faultyback) vs CPU eager" in ran.stderr, ran.stderr
    moved = project / "moved"
    (project / "proj").rename(moved)
    ran = run_from(script, elsewhere, env)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert ran.stderr.startswith(f"error: cannot import faultyback: put the folder that holds it ({project / 'proj'} "
                                 "when the script was written) on PYTHONPATH")
    assert run_from(script, elsewhere, {**env, "PYTHONPATH": str(moved)}).returncode == 1


def test_a_layout_hook_the_script_cannot_find_by_name_is_a_clear_error(monkeypatch):
    from casedb.cases.materialize import DEVICE_LAYOUT_HOOKS
    from casedb.errors import CasedbError
    from casedb.read.repro_imports import layout_hook

    monkeypatch.setitem(DEVICE_LAYOUT_HOOKS, "meta", lambda t, dev, layout: t)
    with pytest.raises(CasedbError, match="the device layout hook of meta .* is not a function at module level"):
        layout_hook("meta", [])
    monkeypatch.setitem(DEVICE_LAYOUT_HOOKS, "meta", sys.modules[__name__].write)  # a module-level function
    assert layout_hook("meta:0", []) == {"device": "meta", "import": None, "module": __name__, "attr": "write"}
