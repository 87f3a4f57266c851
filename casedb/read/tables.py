"""Listings as a table on a terminal, plain rows in a pipe, or JSON: one choice for every listing.

A Rich table wraps its cells to the terminal's width; piped (no terminal, 80 columns assumed) a
row of a wide listing takes dozens of lines and `grep` returns fragments. ``plain`` writes one
line per row, tab-separated, with a header line: what `cut`, `sort`, `grep` and spreadsheets read.
"""

from __future__ import annotations

import enum
import json
from typing import Iterable, Sequence

from casedb.escape import visible


class Format(str, enum.Enum):
    table = "table"
    plain = "plain"
    json = "json"


def resolve(fmt: Format | None, console) -> Format:
    """The format asked for, else a table on a terminal and plain rows anywhere else."""
    if fmt is not None:
        return Format(fmt)
    return Format.table if console.is_terminal else Format.plain


def _cell(value) -> str:
    if value is None:
        return ""
    # one row, one line: line breaks and control characters written as escapes, a tab as a space
    return visible(str(value)).replace("\t", " ")


def emit(rows: Sequence[dict], columns: Sequence[str], *, console, fmt: Format | None = None,
         headers: dict[str, str] | None = None, title: str | None = None) -> None:
    """Write ``rows`` (dicts) with these columns in the format chosen (see :func:`resolve`)."""
    fmt = resolve(fmt, console)
    headers = headers or {}
    if fmt is Format.json:
        console.file.write(json.dumps(list(rows), indent=2, default=str) + "\n")
        return
    if fmt is Format.plain:
        lines: Iterable[str] = ["\t".join(headers.get(c, c) for c in columns)]
        lines = [*lines, *("\t".join(_cell(r.get(c)) for c in columns) for r in rows)]
        console.file.write("\n".join(lines) + "\n")
        return
    from rich.table import Table

    table = Table(title=title)
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    for i, c in enumerate(columns):
        whole = whole_width(headers.get(c, c), [row[i] for row in cells])
        table.add_column(headers.get(c, c), overflow="fold", no_wrap=whole is not None, min_width=whole)
    for row in cells:
        table.add_row(*row)
    console.print(table)


# An op's name is searched for, copied and compared: shown whole on one line; the other columns
# fold (wrap) to make room, never cut short.
WHOLE_COLUMNS = ("op",)
WHOLE_MAX = 60


def whole_width(header: str, cells: Sequence[str]) -> int | None:
    """The width that keeps a naming column's cells whole (at most WHOLE_MAX), None for others."""
    if header not in WHOLE_COLUMNS:
        return None
    return min(WHOLE_MAX, max([len(header), *map(len, cells)]))
