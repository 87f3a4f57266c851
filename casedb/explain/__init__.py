"""`casedb explain`: which condition breaks a backend, per failure cause of a run. Reading the
cases (``dims``, ``features``), the separating condition (``conditions``), variants
(``variants``) run in rounds through the runner (``rounds``, ``schedule``) to confirm it
(``confirm``), the smallest failing case (``minimal``, ``derived``), the layer at fault
(``layer``), the error's growth (``growth``); ``diagnose`` puts them together, ``report`` shapes
the result. May import everything below it: the top level, cases, store, ingest, judge, run."""
