"""`casedb export` of a DB from elsewhere (issue 24, item 3).

A ``file:`` input's blob is written as ``<stem>.files/<sha12>.pt``: the name comes from the sha256
of the blob's bytes, never from the DB's key, and a blob whose key is not its hash is refused
(exit 2, nothing written outside the output folder).
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
import torch

from tests.helpers import import_manifests, rows

pytestmark = pytest.mark.timeout(300)


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def exported_db(cli, db_path, tmp_path):
    """A DB holding one model whose case reads a file: input (one blob); its blob key."""
    src = tmp_path / "src"
    src.mkdir()
    torch.save(torch.arange(6, dtype=torch.float32).reshape(2, 3), src / "x.pt")
    import_manifests(cli, src, {"m.yaml": "model: m\ncases:\n  - name: f\n    op: torch.relu\n    inputs: [{file: x.pt}]\n"})
    [blob] = rows(db_path, "SELECT sha256, data FROM blobs")
    assert hashlib.sha256(blob["data"]).hexdigest() == blob["sha256"]
    return blob["sha256"]


def rekey(db_path, old: str, new: str) -> None:
    """What a DB from elsewhere may hold: the same bytes under another key (a path)."""
    con = sqlite3.connect(db_path)
    with con:
        con.execute("UPDATE blobs SET sha256 = ? WHERE sha256 = ?", [new, old])
        con.execute("UPDATE cases SET inputs = replace(inputs, ?, ?)", [old, new])
    con.close()


def test_export_names_the_file_by_the_hash_of_its_bytes(cli, exported_db, tmp_path):
    out = tmp_path / "out" / "m.yaml"
    assert cli("export", "--model", "m", "-o", out).exit_code == 0
    assert files_under(tmp_path / "out") == ["m.files/" + exported_db[:12] + ".pt", "m.yaml"]
    assert f"file: m.files/{exported_db[:12]}.pt" in out.read_text()


# the old name was the key's first 12 characters: "../../../x" wrote tmp_path/x.pt, "/tmp/h24x" /tmp/h24x.pt
@pytest.mark.parametrize("key", ["../../../x", "/tmp/h24x", "0" * 64])
def test_export_refuses_a_blob_whose_key_is_not_its_hash(cli, db_path, exported_db, tmp_path, key):
    rekey(db_path, exported_db, key)
    before = files_under(tmp_path)
    out = tmp_path / "out" / "deep" / "m.yaml"
    res = cli("export", "--model", "m", "-o", out)
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert f"blob {key!r} of the DB does not hold the bytes it names (their sha256 is {exported_db})" in said
    assert "Traceback" not in res.output
    assert files_under(tmp_path) == before  # nothing written: no .pt, no manifest
    assert not Path("/tmp/h24x.pt").exists()
