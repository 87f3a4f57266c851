"""The tests' own layout (issue 42, item 5): test files in the folders of tests/README.md, one folder
per part of casedb, none loose at the top but the whole-project checks; base names unique (pytest
imports a test file by its base name: there is no __init__.py)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# the whole-project checks and the RFC's entry point (tests/README.md names them)
TOP_LEVEL = {"test_model_ops.py", "test_structure.py", "test_registries.py", "test_readme.py", "test_test_folders.py"}


def _folders_in_readme() -> set[str]:
    return set(re.findall(r"^\| `(\w+)/` \|", (TESTS / "README.md").read_text(), re.MULTILINE))


def test_no_test_file_is_loose_at_the_top():
    loose = sorted(p.name for p in TESTS.glob("test_*.py") if p.name not in TOP_LEVEL)
    assert not loose, f"move {loose} into the folder of the part they test (tests/README.md says which)"


def test_every_test_folder_is_one_the_readme_names():
    folders = {p.parent.relative_to(TESTS).parts[0] for p in TESTS.rglob("test_*.py")
               if p.parent != TESTS and "data" not in p.relative_to(TESTS).parts}
    assert folders == _folders_in_readme(), "tests/README.md's table and the test folders differ"


def test_test_file_names_are_unique_across_folders():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "data" not in p.relative_to(TESTS).parts)
    assert not [n for n, k in names.items() if k > 1]
