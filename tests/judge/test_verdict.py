"""casedb.judge.verdict: one default judge (issue 25: it was defined in three places, and judge()'s
own default said "tolerance" while runs and the numerics policy used "both")."""

from __future__ import annotations

from casedb.judge import numerics
from casedb.judge.verdict import judge
from casedb.run.execute import run_case
from casedb.run.runspec import RunSpec
from casedb.run.target import Target

ADD = {"signature": "ad" * 32, "op": "torch.add", "dtype": "float16", "seed": 0, "attrs": {},
       "inputs": [{"tensor": {"shape": [4, 64], "dtype": "float16", "init": "randn"}}] * 2}


def test_judge_run_and_target_share_the_one_default():
    ex = run_case(ADD, high_precision=True)
    v = judge(ex)
    assert (v.outcome, v.judge) == ("passed", numerics.DEFAULT_JUDGE)
    assert RunSpec().judge == Target().judge == numerics.DEFAULT_JUDGE
    # a tolerance given for the case is never overruled by the ULP judge
    assert judge(ex, rtol=1e-3, atol=1e-5).judge == "tolerance"
