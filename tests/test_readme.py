"""The README's two commands stay true: CI runs the test command the README states."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = [line.strip() for line in ci.splitlines() if line.strip().startswith("python -m pytest")]
    assert len(test_cmd) == 1
    assert test_cmd[0] in readme
    assert "casedb run --model granite4h" in readme
    assert "pip install torch==2.13.0 && pip install -e \".[dev]\"" in readme
    assert ci.index("torch==2.13.0") < ci.index('-e ".[dev]"')


def test_cli_lists_its_commands():
    from typer.testing import CliRunner

    from casedb.cli import app

    out = CliRunner().invoke(app, ["--help"]).stdout
    for command in ("import", "models", "cases", "show", "stats", "export", "scan", "run", "repro", "merge",
                    "report", "serve", "triage"):
        assert command in out
