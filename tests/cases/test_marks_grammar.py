"""-m and -k are read by pytest's own expression parser (issue 25): casedb's filters (`casedb
cases`, the smoke set, triage `marks:`) accept and reject what pytest's -m/-k do, and match alike."""

from __future__ import annotations

import pytest
from _pytest.mark.expression import Expression

import runs_data
from casedb.cases.marks import KeywordExpression, MarkExpression

MARKS = ["constant", "None", "class", "paddedtensor"]


@pytest.mark.parametrize("expr", [
    "constant", "not constant and paddedtensor", "(constant or class) and not None", "None", "class",
    "not (not paddedtensor)", "True or constant",
])
def test_mark_expressions_match_as_pytest_matches_them(expr):
    """Mark names that are Python keywords or constants (None, class, True) are names to pytest;
    casedb's old parser (Python's ast) refused them or read them as constants."""
    pytest_says = Expression.compile(expr).evaluate(lambda name, /, **kw: name in MARKS)
    assert MarkExpression(expr).matches(MARKS) is pytest_says


@pytest.mark.parametrize("expr", ["a b", "(a", "a and", "foo == 1", "a or or b"])
def test_what_pytest_refuses_casedb_refuses_in_its_words(expr):
    with pytest.raises(SyntaxError):
        Expression.compile(expr)
    with pytest.raises(ValueError, match=r"bad marker expression .*only mark names, and, or, not and parentheses"):
        MarkExpression(expr)


def test_idents_are_the_names_the_expression_mentions():
    assert MarkExpression("not (None and class) or model_a").idents() == {"None", "class", "model_a"}


def test_keyword_expression_matches_substrings_ignoring_case_as_pytest_k_does():
    words = ["a_add", "torch.add", "model_a"]
    assert KeywordExpression("ADD").matches(words)
    assert KeywordExpression("torch.add and not mul").matches(words)
    assert not KeywordExpression("add and rsqrt").matches(words)
    with pytest.raises(ValueError, match="bad keyword expression 'add mul'"):
        KeywordExpression("add mul")


def test_cases_k_takes_a_pytest_expression(cli, tmp_path):
    runs_data.import_manifests(cli, tmp_path)
    names = {r["name"] for r in cli.json("cases", "-k", "torch.add or rsqrt")}
    assert names == {"a_add", "b_residual", "b_rsqrt"}
    # as casedb run selects: the shared add is one test, judged for both models, which -k sees together
    assert cli.json("cases", "-k", "torch.add and not model_b") == []
    assert {r["name"] for r in cli.json("cases", "--no-dedupe", "-k", "torch.add and not model_b")} == {"a_add"}
    bad = cli("cases", "-k", "add rsqrt")
    assert bad.exit_code == 2 and "bad keyword expression 'add rsqrt'" in bad.stderr
