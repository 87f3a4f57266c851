"""Hostile queries against `casedb serve` (issue 15, item 11): the real server on a loopback port.

Anyone who reaches the server can run read-only SQL. What one query can take is bounded (value
length, bytes returned, SQLite heap, time), a refused query is a 400 saying why, logged as one
line, and the server goes on serving. Timings are in bench/bench_hostile.py.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse

import pytest

from tests import runs_data
from tests.helpers import import_manifests

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_hostile")
    db = tmp / "cases.db"
    cli = runs_data.make_cli(db)
    runs_data.two_runs(cli, tmp, db)
    import_manifests(cli, tmp, {"blobby.yaml": "model: blobby\ncases:\n  - name: inline\n    op: torch.relu\n    inputs:\n"
                                              "      - tensor: {shape: [3], init: data, data: [1.0, -2.0, 3.0], dtype: fp32}\n"})
    with runs_data.Server(db, tmp / "serve.log") as server:
        yield server


def sql(query: str, fmt: str = ".json") -> str:
    return f"/casedb{fmt}?" + urllib.parse.urlencode({"sql": query})


def request(served, path: str):
    """(status, body, log lines the request added)."""
    before = len(served.log_path.read_text().splitlines())
    status, body = served.get(path)
    return status, body, served.log_path.read_text().splitlines()[before:]


def peak_rss_mib(served) -> float:
    with open(f"/proc/{served.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


HUGE = [
    # one value of 900 MB: over SQLite's length limit before it is built
    ("select randomblob(900000000)", "string or blob too big"),
    # 60 MB values row after row: over the bytes one query may return
    ("select randomblob(60000000) from (values (1), (2), (3), (4))", "the query returns more than 64 MiB"),
    # one row of six 60 MB values, built inside SQLite before Python sees it: over the heap limit
    ("select " + ", ".join(["randomblob(60000000)"] * 6),
     "the query needs more than the 256 MiB of memory casedb serve allows"),
    ("select length(group_concat(zeroblob(60000000))) from (values (1), (2))", "string or blob too big"),
]


@pytest.mark.parametrize("query, reason", HUGE)
def test_huge_results_are_refused_with_one_log_line(served, query, reason):
    status, body, log = request(served, sql(query))
    assert status == 400
    assert reason in json.loads(body)["error"]
    assert len(log) == 1 and reason in log[0]
    status, html, log = request(served, sql(query, ""))  # the HTML page says it too
    assert status == 400 and reason in html and len(log) == 1


def test_memory_stays_bounded_through_every_refusal(served):
    start = peak_rss_mib(served)
    for query, _ in HUGE * 2:
        assert served.get(sql(query))[0] == 400
    # without the bounds the first query alone takes 4 GB
    assert peak_rss_mib(served) - start < 768
    assert [m["name"] for m in served.json("/casedb/models.json?_shape=array&_col=name")] == [
        "blobby", "model_a", "model_b"]


def test_slow_query_hits_the_time_limit(served):
    status, body, log = request(served, sql(
        "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c"))
    assert status == 400
    assert "SQL query took too long" in json.loads(body)["error"]
    assert log == [log[0]] and "SQL query took too long" in log[0] and "<" not in log[0]


@pytest.mark.parametrize("path, status, line", [
    (sql("insert into models (name, key) values ('x', 'x')", ""), 400, "400 /casedb: Statement must be a SELECT"),
    (sql("select nosuch"), 400, "no such column: nosuch"),
    ("/casedb/no_such_table", 404, "404 /casedb/no_such_table: Table not found"),
])
def test_every_refused_request_logs_one_line_not_a_traceback(served, path, status, line):
    got, body, log = request(served, path)
    assert got == status
    assert len(log) == 1 and line in log[0]
    assert "Traceback" not in served.log_path.read_text()


def test_normal_pages_still_serve(served):
    before = hashlib.sha256(served.db_path.read_bytes()).hexdigest()
    blobs = served.json("/casedb/blobs.json?_shape=array&_col=size")  # pages of 10 tensor blobs
    assert [b["size"] for b in blobs] == [12]
    status, html = served.get("/casedb/latest_failures")
    assert status == 200 and "a_silu" in html
    assert served.json(sql("select length(randomblob(1000000)) as n") + "&_shape=array") == [{"n": 1000000}]
    assert hashlib.sha256(served.db_path.read_bytes()).hexdigest() == before
