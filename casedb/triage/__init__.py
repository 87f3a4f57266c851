"""Known failures: triage files, their check, matching and verdicts, updates, the RFC import."""
