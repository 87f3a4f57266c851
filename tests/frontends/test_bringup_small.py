"""Small things a user trips over in the bring-up loop (issue 28, item 8)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_an_exported_file_gets_the_mode_of_a_new_file(cli, tmp_path):
    cli("import", ROOT / "tests" / "data" / "causes" / "small.yaml")
    old = os.umask(0o022)
    try:
        assert cli("export", "--model", "small", "-o", tmp_path / "small.yaml").exit_code == 0
    finally:
        os.umask(old)
    assert (tmp_path / "small.yaml").stat().st_mode & 0o777 == 0o644


def test_the_readmes_show_example_names_a_shipped_case(cli):
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("casedb show "))
    name = line.split()[2]
    model = name.split("::")[0]
    assert cli("import", ROOT / "manifests" / f"{model}.yaml").exit_code == 0
    shown = cli("show", name, "--json")
    assert shown.exit_code == 0, shown.stderr
    assert re.search(r'"op": "torch\.', shown.stdout)


def test_piped_listings_are_one_line_per_row(cli):
    assert cli("import", ROOT / "tests" / "data" / "template.yaml").exit_code == 0
    cases = cli("cases", "--op", "add", "--op", "mul").stdout.splitlines()  # CliRunner's stdout is not a terminal
    assert cases[0].split("\t") == ["model", "name", "op", "inputs", "marks", "sig"]
    assert sorted(ln.split("\t")[1] for ln in cases[1:]) == [
        "add_basic", "mul_inttensor_scalar", "mul_tensor_scalar", "op_different_dtypes"]
    models = cli("models").stdout.splitlines()
    assert models[0].split("\t")[:3] == ["model", "variant of", "cases"] and len(models) == 2
    assert "┃" in cli("models", "--format", "table").stdout
