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
    install = 'pip install torch==2.13.0 && pip install -c constraints.txt -e ".[dev]"'
    assert readme.count(install) == 2  # both commands install the locked versions
    assert ci.index("torch==2.13.0") < ci.index('-c constraints.txt -e ".[dev]"')


def test_the_lock_pins_every_dependency_it_installs():
    import tomllib

    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pinned[name.lower().replace("_", "-")] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    import re

    for req in wanted:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")
        assert name in pinned, f"{name} is a dependency but constraints.txt does not pin it"


def test_cli_lists_its_commands():
    from typer.testing import CliRunner

    from casedb.cli import app

    out = CliRunner().invoke(app, ["--help"]).stdout
    for command in ("import", "models", "cases", "show", "stats", "export", "scan", "run", "repro", "merge",
                    "report", "serve", "triage"):
        assert command in out
