"""Bringing cases in: the one save of importer records, and the valid-input check of what comes in."""
