"""One case from what a user types (`casedb show`, `casedb repro`): a signature prefix, a case
name or model::name, refused with the candidates when it names several different cases."""

from __future__ import annotations

from casedb.errors import CasedbError


def one_case(store, name: str, model: str | None = None) -> list[dict]:
    """The occurrences (store.find rows) of the one case ``name`` names; ``model`` picks among
    cases of the same name. A CasedbError listing the candidates when it names several."""
    rows = store.find(name)
    if model is not None:
        wanted = store.model(model)["name"]
        rows = [r for r in rows if r["model"] == wanted] or rows
    sigs = list(dict.fromkeys(r["signature"] for r in rows))
    if len(sigs) > 1:
        choices = ", ".join(f"{r['model']}::{r['name']} ({r['signature'][:12]})" for r in rows[:10])
        raise CasedbError(f"{name!r} names {len(sigs)} different cases; give one of: {choices}"
                          + (" (or more of the signature)" if _hex(name) else ""))
    return rows


def _hex(text: str) -> bool:
    return all(ch in "0123456789abcdef" for ch in text.strip().lower())
