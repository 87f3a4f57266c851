"""A new default DB starts with the shipped manifests, so `casedb run --model granite4h` works on
a fresh clone. Front ends (the CLI, the pytest plugin, the runner, `casedb serve`) open the DB
here; the store itself never imports."""

from __future__ import annotations

import os

from casedb.ingest.save import import_paths
from casedb.store.database import DEFAULT_DB, SHIPPED_MANIFESTS, Store, db_path


def open_seeded(path: str | os.PathLike | None = None, *, wal: bool = True) -> Store:
    """Open the DB at `path` (default data/casedb.sqlite); a default DB that did not exist yet is
    filled from the shipped manifests."""
    path = db_path(path)
    fresh = not path.exists()
    store = Store(path, wal=wal)
    if fresh and path.resolve() == DEFAULT_DB.resolve():
        seed_from_manifests(store)
    return store


def seed_from_manifests(store: Store) -> None:
    manifests = sorted(SHIPPED_MANIFESTS.glob("*.yaml")) if SHIPPED_MANIFESTS.is_dir() else []
    if manifests:
        import_paths(store, manifests)
