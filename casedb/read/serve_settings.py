"""What `casedb serve` sets: the served database's name, Datasette's settings and the bounds on
what one query may take. Read by :mod:`casedb.read.serve` and its Datasette plugin
(:mod:`casedb.read.datasette_plugin`) alike."""

DB_NAME = "casedb"
# suggest_facets off: suggesting facets runs a query per column, slow on million-row tables.
# sql_time_limit_ms 3000 (default 1000): the pass-rate chart aggregates up to 30 runs.
SETTINGS = {"suggest_facets": False, "sql_time_limit_ms": 3000, "max_returned_rows": 1000}
# One string or blob value (SQLite's SQLITE_LIMIT_LENGTH: randomblob(900000000) fails at once
# instead of building 900 MB). Stored values over it cannot be shown either.
MAX_VALUE_BYTES = 64 << 20
# Values one query may return, summed over its rows (a page of 1000 rows of 60 MB blobs).
MAX_RESULT_BYTES = 64 << 20
# SQLite's own memory in the server process (a row of thirty 60 MB values is built inside SQLite
# before Python sees it). Sorts and GROUP BYs spill to temporary files long before this.
MAX_SQLITE_HEAP = 256 << 20
