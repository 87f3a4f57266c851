"""A failure's cause: the stage it failed at and its first error line, with what varies from case
to case (numbers, shapes, addresses, paths) written as placeholders, so that eight ``rsqrt`` cases
that hit the same compile error are one cause, not eight.

Torch-free and pure: the run summary, ``casedb report``, ``triage update --group`` and the
Datasette plugin (as the SQL function ``casedb_cause``) all group by :func:`cause`.
"""

from __future__ import annotations

import re

MAX_CHARS = 160
# What is read of a message or reason: its first 64 KiB. The line that says what went wrong comes
# early; read whole, a 16 MB message of short lines took 5 s and a GB per call (the Datasette
# function casedb_cause ran past the server's query time limit, which is checked between calls).
MAX_INPUT_CHARS = 64 << 10
# Order matters: addresses and paths before numbers, so their digits do not become N first.
_VARYING = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@+-]+){2,}"), "<path>"),
    (re.compile(r"'[^'\n]{40,}'|\"[^\"\n]{40,}\""), "'…'"),
    (re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w])"), "N"),
    (re.compile(r"\s+"), " "),
)


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failure|Failed|Interrupt|Exit)\b\s*:")
_ADDRESS = re.compile(r" (object )?at 0x[0-9a-f]+")


def first_error_line(error_type: str | None, message: str | None, reason: str | None) -> str:
    """The line of an error that says what went wrong (a triage entry's reason, a report's table row)."""
    message, reason = (message or "")[:MAX_INPUT_CHARS], (reason or "")[:MAX_INPUT_CHARS]
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].endswith(" raised:"):
        line = lines[1]  # dynamo's "backend='inductor' raised:" says nothing; the next line does
    else:
        line = next((ln for ln in lines if _ERROR_LINE.match(ln)), None)
    if line is None and lines:
        short = (error_type or "").rsplit(".", 1)[-1]
        line = f"{short}: {lines[0]}" if short and not lines[0].startswith(short) else lines[0]
    if line is None:
        line = next((ln.strip() for ln in reason.split(" | ") if ln.strip()), "") or "failed"
    line = _ADDRESS.sub("", line)
    return line if len(line) <= 160 else line[:157] + "..."


def normalize(text: str | None, error_type: str | None = None) -> str:
    """:func:`first_error_line` of ``text`` with varying parts as placeholders, at most :data:`MAX_CHARS`."""
    if not text:
        return ""
    line = first_error_line(error_type, text, None)
    for pattern, placeholder in _VARYING:
        line = pattern.sub(placeholder, line)
    line = re.sub(r"N(?:, N)+", "N, …", line)  # shapes of any rank read alike: [N, …]
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 1] + "…"


_SPREAD_COUNTS = re.compile(r" \([\d,]+ of [\d,]+\)")
_FIGURE = re.compile(r"\d[\d,.]*(?:e[-+]?\d+)?")


def pattern_kind(pattern: str) -> str:
    """A pattern as a cause reads it: one that only measures the error ("wrong at 3.2 % of elements
    (92 of 2,880), off by up to 40 ULP", casedb.judge.pattern) with its figures as N, so that cases
    wrong alike are one cause; the others as they are ("scaled by 0.5")."""
    if not pattern.startswith("wrong at "):
        return pattern
    return _FIGURE.sub("N", _SPREAD_COUNTS.sub("", pattern))


def cause(outcome: str | None, stage: str | None, error_type: str | None, message: str | None,
          reason: str | None = None, pattern: str | None = None) -> str:
    """``stage: ErrorType: first line`` of a case that did not pass (the stage, else the outcome).
    A wrong result's cause is its pattern (:mod:`casedb.judge.pattern`), not the error figures,
    which differ from case to case."""
    head = stage or outcome or "?"
    if outcome == "failed" or stage == "incorrect result":
        return f"{head}: {pattern_kind(pattern)}" if pattern else head
    text = normalize(message, error_type) or normalize(reason)
    return f"{head}: {text}" if text else head
