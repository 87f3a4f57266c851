"""The terminal: the consoles every command prints through, and data shown on them as written.

Data (model and case names, messages) is never read as Rich markup: a name such as ``[/m]``
prints as written (:func:`text`). Nor is it ever sent to the terminal as control codes: a name
from a database or a file may hold ESC sequences (OSC 52 sets the clipboard, CSI moves the
cursor and repaints), so every character that is not text is written as an escape by
:func:`clean`, which :func:`terminal`'s consoles apply to everything they print. Rich is imported
only when a console is made (the top level imports the standard library alone).
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, bidi embeddings/overrides/isolates (they
# reorder what follows), lone surrogates and the non-characters U+FFFE/U+FFFF.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


def clean(value) -> str:
    """``value`` as text safe to show on a terminal or in a comment: each character of
    :data:`_UNSAFE` written as its escape (``\\x1b``, ``\\u202e``); tab and newline kept."""
    text = "" if value is None else str(value)
    return _UNSAFE.sub(_escape, text)


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal(*, stderr: bool = False):
    """A console for casedb's output: no markup, no emoji codes, and every segment of text it
    prints passed through :func:`clean` (Rich's own control codes, its styles and cursor moves,
    kept)."""
    from rich.console import Console, RenderHook

    class _Escaped:
        def __init__(self, renderable):
            self.renderable = renderable

        def __rich_console__(self, console, options):
            from rich.segment import Segment

            for seg in console.render(self.renderable, options):
                yield seg if seg.control else Segment(clean(seg.text), seg.style)

    class _Hook(RenderHook):
        def process_renderables(self, renderables):
            return [_Escaped(r) for r in renderables]

    console = Console(stderr=stderr, markup=False, emoji=False)
    console.push_render_hook(_Hook())
    return console


def text(value, style: str | None = None):
    """A Rich Text of ``value`` as written (no markup, no emoji codes)."""
    from rich.text import Text

    return Text(clean(value), style=style or "")
