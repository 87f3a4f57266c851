"""Bounds on the integers a case holds that SQL adds up: an import refuses a value past them and
``casedb merge`` refuses a source holding one, so no sum the views and listings take (the calls
of a model: ``sum(count)`` over its occurrences) overflows SQLite's 64-bit integers."""

# The calls of one occurrence (``model_cases.count``). A model's real counts are in the thousands;
# 2**31 - 1 of each of 2**32 occurrences still sums under 2**63.
MAX_COUNT = 2**31 - 1
