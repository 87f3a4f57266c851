"""What a run's selection options pick, without running anything: the plan items `casedb run`
with the same :class:`~casedb.run.runspec.RunSpec` runs (``casedb cases`` lists them).

The same rules as the worker's collection (:mod:`casedb.run.worker`): every model unless
``--model``, ``-m`` against each item's marks and its models' ``model_<name>`` marks, ``-k``
against the words pytest's -k reads for the test: its id, op, case names, models and marks
(so ``-k add`` selects every ``paddedtensor`` case too, as in the run), ``--op``,
``--shard``, ``--max-numel``, then ``--limit``. Triage exclusions depend on the target and are
left to the run.
"""

from __future__ import annotations

from casedb.cases import marks as marks_mod
from casedb.errors import CasedbError
from casedb.names import model_mark
from casedb.run.plan import PlanItem, build_plan, in_shard, op_matches
from casedb.run.runspec import RunSpec, parse_shard

# The RunSpec fields that choose cases (the rest say where and how they run).
SELECTION_FIELDS = ("models", "dedupe", "keyword", "markexpr", "op", "limit", "shard", "max_numel")


def select(store, spec: RunSpec, *, excluded: bool = False) -> list[PlanItem]:
    """The items ``spec`` selects, in plan order; ``excluded``: those its mark expression (default:
    the RFC's) leaves out instead. Raises CasedbError for an unknown mark, or a derived mark no
    case has when nothing matches (marks_mod.absent_derived)."""
    shard = parse_shard(spec.shard)
    markexpr = spec.markexpr or (marks_mod.DEFAULT_EXCLUDE if excluded else "")
    try:
        expr = marks_mod.MarkExpression(markexpr)
        keyword = marks_mod.KeywordExpression(spec.keyword or "")
    except ValueError as e:
        raise CasedbError(str(e)) from None
    items = build_plan(store, spec.models or None, dedupe=spec.dedupe)
    marks_of = {id(it): item_marks(it) for it in items}
    check_marks(markexpr, store.mark_names() | set(marks_mod.DERIVED), marks_of.values())
    out = []
    for it in items:
        if expr.matches(marks_of[id(it)]) == excluded:
            continue
        if not keyword.matches([it.id, it.op, *it.names, *it.models, *marks_of[id(it)]]):
            continue
        if not (op_matches(it.op, spec.op) and in_shard(it.signature, shard)):
            continue
        if spec.max_numel is not None and not it.fits(spec.max_numel):
            continue
        out.append(it)
        if spec.limit is not None and len(out) == spec.limit:
            break
    return out


def item_marks(it: PlanItem) -> list[str]:
    """The marks -m sees on a plan item: its cases' and its models' ``model_<name>``."""
    return list(it.marks) + [model_mark(m) for m in it.models]


def check_store_marks(store, spec: RunSpec) -> None:
    """:func:`check_marks` for ``spec``'s -m over the DB's cases (what `casedb run` checks first)."""
    if spec.markexpr:
        items = build_plan(store, spec.models or None, dedupe=spec.dedupe)
        check_marks(spec.markexpr, store.mark_names() | set(marks_mod.DERIVED), [item_marks(it) for it in items])


def check_marks(markexpr: str, known, marks_per_case) -> None:
    """Refuse an -m naming a mark nobody has (as `casedb run` does), or one naming a derived
    mark no case carries when it matches no case (a clear word, not a silent 0 cases)."""
    if not markexpr:
        return
    problem = marks_mod.unknown_marks(markexpr, known) or marks_mod.absent_derived(markexpr, marks_per_case)
    if problem:
        raise CasedbError(problem)


def selected_occurrences(store, spec: RunSpec, *, excluded: bool = False) -> tuple[list[dict], int]:
    """(the occurrences of the items :func:`select` picks, as ``store.occurrences`` gives them
    and in its order; how many tests `casedb run` makes of them: unique cases, or occurrences with
    ``--no-dedupe``)."""
    items = select(store, spec, excluded=excluded)
    ids = {o.model_case_id for it in items for o in it.occurrences}
    return [r for r in store.occurrences(spec.models or None) if r["id"] in ids], len(items)
