"""Triage files edited as text: entries written as YAML lines, and the minimal edit
``casedb triage update`` makes (removing, rewriting and appending entries, every other byte kept)."""

from __future__ import annotations

import re

from casedb.errors import InputError
from casedb.escape import yaml_comment as emit_comment
from casedb.judge.selectors import CASE_KEYS, TARGET_KEYS
from casedb.triage.entries import VERSION, Entry
from importers.yaml_manifest import yaml_scalar as scalar

_ENTRY_ORDER = CASE_KEYS + TARGET_KEYS + ("status", "stage", "reason", "rtol", "atol", "timeout")


def emit_entry(entry: dict, indent: int) -> list[str]:
    """Block-style lines of one list item, its dash at column ``indent``."""
    pad = " " * indent
    keys = [k for k in _ENTRY_ORDER if entry.get(k) is not None] + [k for k in entry if k not in _ENTRY_ORDER]
    out = []
    for i, k in enumerate(keys):
        v = entry[k]
        text = ("[" + ", ".join(scalar(x) for x in v) + "]") if isinstance(v, list) else scalar(v)
        out.append(f"{pad}{'- ' if i == 0 else '  '}{k}: {text}\n")
    return out


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


HEADER = "casedb triage update --from-run"


def _is_header(line: str) -> bool:
    """The comment that heads one update's block of new entries: it belongs to the block, not
    to the first entry under it (removing that entry keeps it)."""
    return line.lstrip().startswith("# " + HEADER)


def _item_follows(lines: list[str], i: int, col: int) -> bool:
    """Whether an entry (a dash at ``col``) comes at line ``i`` after blanks and its own comments."""
    while i < len(lines) and (_blank(lines[i]) or (_is_comment(lines[i]) and not _is_header(lines[i]))):
        i += 1
    return i < len(lines) and lines[i].lstrip().startswith("-") and _indent(lines[i]) == col


def _blank(line: str) -> bool:
    return not line.strip()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _blocks(lines: list[str], entries: list[Entry]) -> tuple[dict, int | None, int]:
    """Per entry: (first line of its leading comments, its dash line, its last line), 0-based;
    the line after which new entries go; their dash column."""
    starts = []
    for e in sorted(entries, key=lambda e: e.line):
        i = e.line - 1
        while i > 0 and not lines[i].lstrip().startswith("-"):
            i -= 1
        starts.append((e, i, lines[i].index("-")))
    blocks = {}
    for n, (e, dash, col) in enumerate(starts):
        if n + 1 < len(starts):
            end = starts[n + 1][1] - 1
        else:
            end = dash
            for j in range(dash + 1, len(lines)):
                ln = lines[j]
                if _blank(ln) or _is_comment(ln):
                    continue
                if _indent(ln) < col or (_indent(ln) == col and not ln.lstrip().startswith("-")):
                    break
                end = j
            else:
                end = len(lines) - 1
        while end > dash and (_blank(lines[end]) or (_is_comment(lines[end]) and _indent(lines[end]) <= col)):
            end -= 1
        lead = dash
        while lead > 0 and _is_comment(lines[lead - 1]) and not _is_header(lines[lead - 1]) \
                and _indent(lines[lead - 1]) <= col:
            lead -= 1
        blocks[e] = (lead, dash, end)
    if not starts:
        return blocks, None, 2
    last = max(blocks.values(), key=lambda b: b[1])
    return blocks, last[2], starts[-1][2]


def edit(text: str, mine: list[Entry], drop: set, rewrite: set, new_entries: list, run_id: int,
         target: dict) -> str:
    """``text`` (a triage file) with the entries ``drop`` removed, ``rewrite`` made expected_pass
    (their tolerance and timeout kept) and ``new_entries`` ((mapping, comment) pairs) appended to
    ``cases:`` under a comment naming run ``run_id`` on ``target``; every other byte as it was.
    ``mine``: the file's entries (their lines place the blocks)."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    head = next((ln for ln in lines if re.match(r"cases\s*:", ln)), "")
    if head.partition(":")[2].split("#")[0].strip() not in ("", "[]"):
        raise InputError("triage update edits a block list of cases (`  - op: ...` items); write `cases:` as one",
                         where=f"{mine[0].path if mine else 'the file'}:{lines.index(head) + 1}")
    blocks, after, col = _blocks(lines, mine)
    inserts: list[str] = []
    if new_entries:
        failures = sum(1 for d, _ in new_entries if d["status"] == "known_failure")
        head = (f"{HEADER} {run_id} ({target['device']}/{target['backend']}"
                f"{', arch ' + target['arch'] if target.get('arch') else ''}): {failures} new failure(s), "
                f"{len(new_entries) - failures} promoted to expected_pass")
        inserts += emit_comment(head, col)
        for d, note in new_entries:
            if note:
                inserts += emit_comment(note, col)
            inserts += emit_entry(d, col)
    if inserts:
        if after is None:
            at = next((i for i, ln in enumerate(lines) if re.match(r"cases\s*:", ln)), None)
            if at is None:
                if not lines:
                    lines = [f"version: {VERSION}\n"]
                lines.append("cases:\n")
                after = len(lines) - 1
            else:
                lines[at] = "cases:\n"  # `cases:` or `cases: []`
                after = at
        lines[after + 1:after + 1] = inserts
    for e in sorted(drop | rewrite, key=lambda e: -blocks[e][1]):
        lead, dash, end = blocks[e]
        if e in rewrite:
            new = {k: v for k, v in e.written.items() if k not in ("reason", "stage")}
            new.update(status="expected_pass", **{k: getattr(e, k) for k in ("rtol", "atol", "timeout")
                                                  if getattr(e, k) is not None})
            was = f"was known_failure{': ' + e.reason if e.reason else ''}"
            lines[dash:end + 1] = emit_comment(f"passes on run {run_id} ({was}); its tolerance and timeout are kept",
                                               _indent(lines[dash])) + emit_entry(new, lines[dash].index("-"))
        else:
            col = lines[dash].index("-")
            del lines[lead:end + 1]
            # the blank line that separated it goes too (one, where two would now meet)
            if lead < len(lines) and _blank(lines[lead]) and (
                    lead == 0 or _blank(lines[lead - 1]) or lines[lead - 1].rstrip().endswith(":")):
                del lines[lead]
            # and the head of an update's block once the last entry under it is gone
            if lead > 0 and _is_header(lines[lead - 1]) and not _item_follows(lines, lead, col):
                del lines[lead - 1]
    return "".join(lines)
