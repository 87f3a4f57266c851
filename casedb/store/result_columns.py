"""The columns of ``results`` a run records, each with where the run's payload takes it from: the
one list the store's insert (casedb.store.recorder) and the payload of an executed case
(casedb.run.target) derive their keys from. It imports nothing: the plugin's processes read it
before they open a DB."""

VERDICT = "verdict"  # the judge's Verdict field of the same name (casedb.judge.verdict)
RUN = "run"          # set by casedb.run.target: the worst occurrence's outcome, the execution's figures, the values

RESULT_SOURCES = {
    "outcome": RUN, "reason": RUN, "compare_mode": RUN, "max_abs_err": VERDICT, "max_rel_err": VERDICT,
    "mismatch_count": VERDICT, "nan_inf_mismatch": RUN, "t_ref": RUN, "t_compile": RUN, "t_exec": RUN,
    "error_type": VERDICT, "error_message": VERDICT, "traceback": VERDICT, "stage": VERDICT, "judge": VERDICT,
    "tolerance": VERDICT, "ulp_err": VERDICT, "ref_ulp_err": VERDICT, "vacuous": VERDICT, "exercised": RUN,
    "lowering": RUN, "bias_mean": VERDICT, "bias_toward": VERDICT, "bias_count": VERDICT, "input_values": RUN,
}
RESULT_COLUMNS = tuple(RESULT_SOURCES)
FROM_VERDICT = tuple(k for k, source in RESULT_SOURCES.items() if source == VERDICT)
