"""A failure's cause: the stage it failed at and its first error line, with what varies from case
to case (numbers, shapes, addresses, paths) written as placeholders, so that eight ``rsqrt`` cases
that hit the same compile error are one cause, not eight.

Torch-free and pure: the run summary, ``casedb report``, ``triage update --group`` and the
Datasette plugin (as the SQL function ``casedb_cause``) all group by :func:`cause`.
"""

from __future__ import annotations

import re

MAX_CHARS = 160
# Order matters: addresses and paths before numbers, so their digits do not become N first.
_VARYING = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@+-]+){2,}"), "<path>"),
    (re.compile(r"'[^'\n]{40,}'|\"[^\"\n]{40,}\""), "'…'"),
    (re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w])"), "N"),
    (re.compile(r"\s+"), " "),
)


def first_line(text: str | None) -> str:
    """The first non-empty line of ``text`` (an exception's message often ends in a traceback)."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def normalize(text: str | None) -> str:
    """``text``'s first line with varying parts as placeholders, at most :data:`MAX_CHARS`."""
    line = first_line(text)
    for pattern, placeholder in _VARYING:
        line = pattern.sub(placeholder, line)
    line = re.sub(r"N(?:, N)+", "N, …", line)  # shapes of any rank read alike: [N, …]
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 1] + "…"


def cause(outcome: str | None, stage: str | None, error_type: str | None, message: str | None,
          reason: str | None = None, pattern: str | None = None) -> str:
    """``stage: ErrorType: first line`` of a case that did not pass (the stage, else the outcome).
    A wrong result's cause is its pattern (:mod:`casedb.judge.pattern`), not the error figures,
    which differ from case to case."""
    head = stage or outcome or "?"
    if outcome == "failed" or stage == "incorrect result":
        return f"{head}: {pattern}" if pattern else head
    text = normalize(message) or normalize(reason)
    kind = f"{error_type}: " if error_type else ""
    return f"{head}: {kind}{text}".rstrip(": ") if (kind or text) else head
