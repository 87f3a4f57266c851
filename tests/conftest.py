import json
from pathlib import Path

import pytest
# torch before any test: pytester restores sys.modules after its test, so a torch first imported
# inside one (by a fixture) is dropped, and importing its C extension again crashes the worker
import torch  # noqa: F401
from typer.testing import CliRunner

# (rows, sha256_of, write_sql: importable from here too for tests written before tests/helpers.py;
# new tests import them from tests.helpers)
from tests.helpers import DATA, import_manifests, rows, sha256_of, write_sql  # noqa: F401


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "cases.db"


@pytest.fixture
def cli(db_path):
    """Run `casedb --db <tmp db> ARGS...`; returns the click Result."""
    from casedb.cli import app

    runner = CliRunner()

    def invoke(*args, db=None):
        return runner.invoke(app, ["--db", str(db or db_path), *map(str, args)], catch_exceptions=False)

    invoke.json = lambda *args, db=None: json.loads(invoke(*args, "--json", db=db).stdout)
    return invoke


@pytest.fixture
def imported_db(cli, tmp_path, db_path):
    """The test's DB with manifests in it: ``imported_db({"m.yaml": TEXT, ...}, *import_args)``
    writes them into tmp_path, imports them with one ``casedb import`` (which must succeed) and
    returns the DB's path."""

    def make(manifests: dict[str, str], *args) -> Path:
        import_manifests(cli, tmp_path, manifests, *args)
        return db_path

    return make


# The suite never touches the real default DB (data/casedb.sqlite): tests/test_model_ops.py, the
# RFC's entry point, collects its smoke set from the default DB and records a run there. Without
# CASEDB_DB or --casedb-db, the session gives it a DB of its own, filled from the shipped
# manifests as a new default DB would be; xdist workers inherit the variable.
REAL_DB = Path(__file__).resolve().parents[1] / "data" / "casedb.sqlite"


def _stat(path: Path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def pytest_configure(config):
    import os
    import tempfile

    if hasattr(config, "workerinput"):  # an xdist worker: the controller set it up
        return
    config._casedb_real_db = _stat(REAL_DB)
    if os.environ.get("CASEDB_DB") or getattr(config.option, "casedb_db", None):
        return
    from casedb.ingest.seed import seed_from_manifests
    from casedb.store.database import Store

    session_db = Path(tempfile.mkdtemp(prefix="casedb-tests-")) / "casedb.sqlite"
    if _collects(config, Path(__file__).with_name("test_model_ops.py")):
        with Store(session_db) as store:
            seed_from_manifests(store)
    os.environ["CASEDB_DB"] = str(session_db)


def _collects(config, test_file: Path) -> bool:
    """Whether the session's arguments name `test_file` or a folder holding it."""
    for arg in config.args:
        path = Path(str(arg).split("::")[0]).resolve()
        if path == test_file.resolve() or (path.is_dir() and test_file.resolve().is_relative_to(path)):
            return True
    return False


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput") or not hasattr(config, "_casedb_real_db"):
        return
    if _stat(REAL_DB) != config._casedb_real_db:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        config.get_terminal_writer().line(
            f"\nerror: the test session changed {REAL_DB} (size, mtime {config._casedb_real_db} -> "
            f"{_stat(REAL_DB)}): a test used the real default DB; give it a tmp_path DB", red=True)
