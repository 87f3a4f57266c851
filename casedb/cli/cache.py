"""`casedb cache info|clear`: the reference cache beside the DB (casedb.run.refcache): references,
and the inputs of cases that are expensive to build (casedb.run.inputcache)."""

from __future__ import annotations

import typer

from casedb.cli.common import app, console, emit_json, fail, state
from casedb.errors import CasedbError

cache_app = typer.Typer(help="The cache of CPU references (and of inputs that are expensive to build) beside the DB "
                        "(<db>.refcache): what it holds, clear it.")
app.add_typer(cache_app, name="cache")


def _cache():
    """The cache beside the DB, checked: a folder that is a link (or holds one for a shard), not
    the user's or writable by others is refused (exit 2) before anything in it is read or deleted."""
    from casedb.run import refcache
    from casedb.store.database import db_path

    cache = refcache.ReferenceCache(refcache.beside(db_path(state.db).resolve()))
    cache.disk.check()
    return cache


@cache_app.command("info")
def info_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Where the cache is, how many references and inputs it holds, their size, the cap and the key
    file that seals its entries."""
    try:
        info = _cache().info()
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json(info)
        return
    refs, inputs = info["references"], info["inputs"]
    console.print(f"{info['folder']}: {refs['entries']} references ({refs['bytes'] / 2**20:.1f} MiB), "
                  f"{inputs['entries']} inputs ({inputs['bytes'] / 2**20:.1f} MiB): {info['bytes'] / 2**20:.1f} MiB "
                  f"of at most {info['max_bytes'] / 2**20:.0f} MiB (least recently used go first); entries sealed with "
                  f"the key {info['key_file']}",
                  highlight=False, soft_wrap=True)


@cache_app.command("clear")
def clear_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Delete every cached reference and input (the next run computes them again)."""
    try:
        cache = _cache()
        gone = cache.clear()
    except CasedbError as e:
        fail(e)
    if as_json:
        emit_json({"folder": str(cache.folder), "deleted": sum(gone.values()), **gone})
        return
    console.print(f"{cache.folder}: {gone['references']} references and {gone['inputs']} inputs deleted",
                  highlight=False, soft_wrap=True)
