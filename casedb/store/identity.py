"""The SQL of call identities (:mod:`casedb.cases.call_identity`): which stored case an import's
call already is."""

from __future__ import annotations

from typing import Iterable


def cases_by_identity(db, identities: Iterable[str]) -> dict[str, dict]:
    """identity -> the stored case that has it (the first stored, when an older casedb stored the
    same call twice): its signature, op, inputs, attrs, seed, dtype and marks as stored."""
    wanted = list(set(identities))
    found: dict[str, dict] = {}
    for i in range(0, len(wanted), 900):
        chunk = wanted[i:i + 900]
        q = f"""SELECT identity, signature, op, inputs, attrs, seed, dtype, marks FROM cases
                WHERE identity IN ({','.join('?' * len(chunk))}) ORDER BY created_at, rowid"""
        for row in db.execute(q, chunk).fetchall():
            found.setdefault(row[0], dict(zip(("identity", "signature", "op", "inputs", "attrs", "seed", "dtype",
                                                "marks"), row)))
    return found
