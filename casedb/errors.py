"""Domain errors. The CLI turns each into a clean message and exit code 2."""

from __future__ import annotations


class CasedbError(Exception):
    """Base class of errors the CLI reports without a traceback."""

    exit_code = 2


class InputError(CasedbError):
    """Bad input: a file, a line or a case that cannot be accepted, and what to do about it."""

    def __init__(self, message: str, *, where: str | None = None, case: str | None = None):
        self.message = message
        self.where = where
        self.case = case
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = []
        if self.where:
            parts.append(self.where)
        if self.case:
            parts.append(f"case {self.case!r}")
        parts.append(self.message)
        return ": ".join(parts)


class NotFound(CasedbError):
    """A model, case or run that the user named does not exist."""
