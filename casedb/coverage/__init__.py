"""`casedb coverage`: which cases and ops a target can run, before running any (trace, kernels,
measure, summary, agreement, text)."""
