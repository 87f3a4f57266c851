"""Text from data (a DB, a run, a file) written into YAML or Markdown, escaped for where it lands.

A name, reason or error message is data wherever casedb writes it: it must never become a YAML
key, a Markdown heading or an HTML comment. ``export``, ``triage update``/``import`` and
``report --markdown`` write such text through these functions only (a YAML scalar:
``importers.yaml_manifest.yaml_scalar``, beside the reader it must read back through).
"""

from __future__ import annotations

import re
import textwrap

# What a YAML reader refuses in a stream (PyYAML: anything outside \t, \n, \r, printable ASCII,
# \x85 and U+00A0 up) or reads as a line break (\r, \n, \x85, U+2028, U+2029), and the bidi
# controls that reorder what a reader sees: shown as escapes in comments and Markdown.
_UNSAFE = re.compile("[^\t\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with line breaks, control characters and bidi controls written as escapes (``\\n``,
    ``\\x1b``, ``\\u2028``): one line, shown as it is."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def yaml_comment(text: str, indent: int = 0, width: int | None = 100) -> list[str]:
    """Comment lines (``# ...``, each ending in a newline) saying ``text``, wrapped at ``width``
    (None: one line per line of ``text``); nothing in ``text`` can end the comment."""
    out = []
    for para in str(text).splitlines():
        para = visible(para)
        lines = [para] if width is None else textwrap.wrap(
            para, width=max(40, width - indent - 2), break_long_words=False, break_on_hyphens=False)
        for ln in lines or [""]:
            out.append(f"{' ' * indent}# {ln}\n" if ln else f"{' ' * indent}#\n")
    return out


# What Markdown (GitHub's) reads as markup inside a line: escapes, code, emphasis, HTML and
# entities, table cells, strikethrough, math, a heading's closing #s; a `](` that makes a link
# or an image (a reference link needs a definition, which only a line's start can hold); `_`
# except inside a word (where it cannot emphasize: snake_case names stay as they are).
_MD_PUNCT = re.compile(r"[\\`*<&|~$#]|\](?=\()|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def markdown(value) -> str:
    """``value`` as Markdown text that renders as written, on one line (a table cell, a heading):
    markup characters backslash-escaped, line breaks and control characters shown as escapes."""
    return visible(_MD_PUNCT.sub(lambda m: "\\" + m.group(), str(value)))


def markdown_code(value) -> str:
    """``value`` as an inline code span in a Markdown table cell: fenced with more backticks than
    it holds, ``|`` escaped (GitHub splits cells before reading code), one line."""
    text = visible(str(value)).replace("|", "\\|")
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
