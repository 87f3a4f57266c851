"""Kineto / chrome-trace importer (``torch.profiler.profile(record_shapes=True).export_chrome_trace``).

Reads ``.json`` or ``.json.gz`` (TensorBoard's ``*.pt.trace.json.gz``). Every ``cpu_op`` event
named like an operator (``aten::addmm``, ``mylib::op``) is a call; its ``Input type`` /
``Input Dims`` / ``Input Strides`` / ``Concrete Inputs`` become the case inputs.

Nesting: the profiler records every dispatcher call, so ``aten::linear`` contains ``aten::t``
and ``aten::addmm``. Events are nested by time on each thread. ``level="top"`` (default) keeps
the outermost operator of each nest (what the model called); ``level="leaf"`` keeps operators
with no operator inside them (what finally ran). Non-operator events (``record_function``
ranges, ``autograd::engine::evaluate_function: ...``, ``MmBackward0``, ``ProfilerStep#3``) are
transparent: they are never cases and never hide the operators inside them.

Kineto does not record the overload or argument names. When torch is importable the overload
is resolved against the dispatcher's schemas (argument count and kinds must fit), which also
names keyword-only arguments (they go to ``attrs``) and turns ScalarType / Layout /
MemoryFormat codes into ``torch.*`` names. Kineto writes ``""`` for every argument it does not
record: for an optional argument of a recordable kind (Tensor?, int?, ScalarType? ...) that
means None; for a ``str`` argument (gelu's ``approximate``, div's ``rounding_mode``) or a
``Tensor?[]`` list (``aten::index``) the value is unknown, so the call is *skipped* with that
reason rather than imported with a guessed value: use an Execution Trace for those ops. An
unrecorded optional ``Device`` beside a tensor argument is None (the device follows the tensor,
as ET records it); a factory op's is ``"cpu"``, a placeholder the runner maps to the target device.
A 0-d double / long tensor where the op has a Scalar overload was a Python number (``x * 0.5``):
it becomes that overload with a value of its Python type (:func:`importers.op_schema.python_scalars`).
Kineto records neither storage offsets (strided tensors get ``storage_offset: 0``) nor the
element dtypes of a ``Tensor[]`` (``aten::cat``): those elements take the dtype of another tensor
argument of the call, else that of the next call taking a cat's / stack's result, else the
``dtype`` option (``import --dtype``), else the trace's dominant floating dtype, said in the
description (:mod:`importers.kineto_args`).

What both trace importers share is :mod:`importers.trace_values` and :mod:`importers.op_schema`.
"""

from __future__ import annotations

import marshal
import re
from itertools import groupby
from operator import itemgetter
from typing import Any, Iterator, Union

import msgspec

from importers.op_schema import bind, bind_positional, python_scalars, resolve_overload, torch_schemas
from importers.record import ImportRecord
from importers.kineto_args import consumer_dtypes, kineto_args, list_dtype as _list_dtype
from importers.trace_values import TraceFormatError, head_bytes, load_typed, paused_gc, raw_value

_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$")
_OP_CATS = frozenset(("cpu_op", "Operator", "operator"))
_SNIFF_BYTES = 1 << 16
_NO_THREAD = object()


_KINETO_HEAD = re.compile(rb'"traceEvents"\s*:\s*\[|"schemaVersion"\s*:')
_LEGACY_HEAD = re.compile(rb'^\s*\[\s*\{[^{}]*"ph"\s*:')


def sniff(path, head: bytes | str) -> bool:
    """True if the file is a Kineto/chrome trace (``head``: the file's first bytes or text)."""
    data = head_bytes(path, head)
    if not data and str(path).endswith(".gz"):
        return str(path).endswith(".pt.trace.json.gz")
    # (a "traceEvents" key in another spelling still reads as one: its parse error names the format)
    return bool(_KINETO_HEAD.search(data[:_SNIFF_BYTES]) or _LEGACY_HEAD.match(data[:4096])
                or b'"traceEvents"' in data[:_SNIFF_BYTES])


# ----------------------------------------------------------------------------- conversion


_RESOLVED: dict[tuple, Any] = {}


def _convert(name: str, args_cols, schemas_for=torch_schemas, list_default: tuple[str, str] | None = None):
    """One distinct Kineto call -> ``(op, inputs, attrs, note)`` or a skip-reason string."""
    got = kineto_args(*args_cols, list_default=list_default)
    if isinstance(got, str):
        return got
    args, note = got
    schemas = schemas_for(name)
    if not schemas:
        # Not a registered operator here (torch missing, custom op library not loaded):
        # positional arguments on the overload packet; unrecorded ones become None.
        ns, op = name.split("::", 1)
        inputs = bind_positional(args)
        if isinstance(inputs, str):
            return inputs
        return f"torch.ops.{ns}.{op}", inputs, {}, note or "no schema: overload and argument names unknown"
    # Which overload fits depends only on the kind of each argument: resolve once per shape.
    kinds = (name, tuple(("VL" if a[1].__class__ is list else "VS") if a[0] == "V"
                         else ("U", a[2]) if a[0] == "U" else a[0] for a in args))
    schema = _RESOLVED.get(kinds)
    if schema is None:
        schema = _RESOLVED[kinds] = resolve_overload(schemas, args)
    if isinstance(schema, str):
        return schema
    schema, args, scalar_note = python_scalars(schema, args, "Kineto", schemas)
    res = bind(schema, args, source="Kineto")
    if isinstance(res, str):
        return res
    return res[0], res[1], res[2], "; ".join(n for n in (note, scalar_note) if n) or None


# ----------------------------------------------------------------------------- parse

_FIX = "re-export it with torch.profiler.profile(record_shapes=True) ... prof.export_chrome_trace(path)"


class _Args(msgspec.Struct, gc=False):
    """An event's argument columns as raw JSON text (empty: absent): decoded once per distinct
    call, never per event. The other args (External id, Sequence number ...) are skipped."""

    types: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw())
    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw())
    strides: msgspec.Raw = msgspec.field(name="Input Strides", default=msgspec.Raw())
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw())


class _Event(msgspec.Struct, gc=False):
    """The fields of a trace event casedb reads (absent: None). ``args`` is an :class:`_Args`,
    or, for a trace the typed decoder refused, whatever the JSON holds."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Union[_Args, None] = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: Union[list[Union[_Event, None]], None] = None
    record_shapes: Any = None


# The decoder of a Kineto trace: only the fields above are built (bench/bench_import.py times it alone).
DECODER = msgspec.json.Decoder(Union[_Trace, list[Union[_Event, None]]])


def _group(path: str, level: str, max_bytes: int | None = None) -> list[tuple]:
    """Decode the trace, keep the top/leaf operator calls, group identical ones.

    Returns ``[(name, index, count, columns), ...]`` in first-occurrence order, ``columns`` the
    decoded argument columns (None: no shapes), so the decoded trace can be freed before records
    are built.
    """
    events = _events(path, max_bytes)
    return _same_calls(path, events, _nested(path, events, top=level == "top"))


def _events(path: str, max_bytes: int | None) -> list:
    """The ``traceEvents`` of a Kineto trace (or a legacy bare event list), as :class:`_Event`
    (None for what is not an event)."""
    data, typed = load_typed(path, DECODER, "Kineto trace", _FIX, max_bytes)
    if not typed:
        data = _from_plain(path, data)
    if isinstance(data, list):
        return data
    if not isinstance(data.traceEvents, list):
        raise TraceFormatError(f"{path}: no 'traceEvents' list: not a Kineto/chrome trace; {_FIX}")
    if data.record_shapes == 0:
        raise TraceFormatError(
            f"{path}: the trace was recorded without input shapes; profile with "
            "torch.profiler.profile(record_shapes=True) and export it again"
        )
    return data.traceEvents


def _from_plain(path: str, data: Any) -> _Trace | list:
    """A trace the typed decoder refused, as the stdlib read it: the same :class:`_Event` objects,
    args left as they are (a dict, or anything else: no shapes)."""
    if isinstance(data, dict):
        events = data.get("traceEvents")
        data = _Trace(events, data.get("record_shapes"))
    elif isinstance(data, list):
        events = data
    else:
        raise TraceFormatError(f"{path}: not a Kineto/chrome trace (top level is {type(data).__name__}); {_FIX}")
    if isinstance(events, list):
        events[:] = [None if e.__class__ is not dict else
                     _Event(e.get("ph"), e.get("cat"), e.get("name"), e.get("pid"), e.get("tid"),
                            e.get("ts"), e.get("dur"), e.get("args")) for e in events]
    return data


class _OpNames(dict):
    """Event name -> whether it names an operator (``ns::op``), matched once per distinct name."""

    def __missing__(self, name):
        ok = self[name] = name.__class__ is str and _OP_NAME.match(name) is not None
        return ok


def _operator_events(events: list) -> Iterator[tuple]:
    """The operator events in trace order, as (ts, -dur, index, pid, tid): sorting puts parents
    before children (the index is unique: pid and tid are never compared)."""
    cats, is_op = _OP_CATS, _OpNames()
    for i, e in enumerate(events):
        # "cpu_op" compared first: no hash of the category of each event
        if e is not None and (e.cat == "cpu_op" or e.cat in cats) and is_op[e.name] and e.ph == "X":
            yield e.ts, -(e.dur or 0), i, e.pid, e.tid


def _nested(path: str, events: list, *, top: bool) -> list[int]:
    """Nesting by time on each thread: the indexes of the outermost (`top`) or innermost
    operators, sorted."""
    kept: list[int] = []
    try:  # Kineto writes each thread's events in time order: then one pass, no sort
        if _walk(_operator_events(events), top, kept, check=True):
            kept.sort()
            return kept
    except TypeError:  # a missing or non-numeric time: the sorting pass below names the event
        pass
    kept = []
    ops = list(_operator_events(events))
    threads: dict = {}
    for key, run in groupby(ops, itemgetter(3, 4)):  # threads split by runs of one thread
        lst = threads.get(key)
        if lst is None:
            lst = threads[key] = []
        lst.extend(run)
    for lst in threads.values():
        try:
            lst.sort()
        except TypeError:
            bad = next(i for ts, nd, i, *_ in lst if not isinstance(ts, (int, float)) or not isinstance(nd, (int, float)))
            raise TraceFormatError(
                f"{path}: event {bad} ({events[bad].name}): missing or bad 'ts'/'dur'; "
                f"the trace is corrupt: {_FIX}"
            ) from None
        _walk(lst, top, kept, check=False)
    kept.sort()
    return kept


def _walk(ops, top: bool, kept: list, *, check: bool) -> bool:
    """Append to ``kept`` the indexes of the outermost (``top``) or innermost operators of
    ``ops``, (ts, -dur, index, pid, tid) in time order on each thread. ``check``: return
    False as soon as a thread's events are not in the order sorting would give them.

    Outermost: every event since the last outermost one has ended (one of zero length: before
    it starts). The events that ended end before any still open, so the latest end decides:
    it is all that is kept, no stack. Innermost: a stack of the open events.
    """
    threads: dict = {}  # (pid, tid) -> [its last event, latest end (top) or open events]
    pid = tid = state = _NO_THREAD
    for op in ops:
        ts, ndur, i, p, t = op
        if p != pid or t != tid:
            pid, tid = p, t
            state = threads.get((p, t))
            if state is None:
                state = threads[p, t] = [op, None if top else []]
        if check and op < state[0]:
            return False
        state[0] = op
        if top:
            end = state[1]
            if end is None or not (ts < end or (ndur == 0 and ts <= end)):
                kept.append(i)
                state[1] = ts - ndur
            elif ts - ndur > end:  # never true of a NaN end: as on a stack, it counts as ended
                state[1] = ts - ndur
            continue
        stack = state[1]  # [end, index, has_child] of the open events
        while stack:
            end = stack[-1][0]
            if ts < end or (ndur == 0 and ts <= end):
                break
            done = stack.pop()
            if not done[2]:
                kept.append(done[1])
        if stack:
            stack[-1][2] = True
        stack.append([ts - ndur, i, False])
    if not top:
        for _, stack in threads.values():
            kept.extend(d[1] for d in stack if not d[2])
    return True


def _same_calls(path: str, events: list, kept: list[int]) -> list[tuple]:
    """Identical calls grouped: ``[(name, index, count, columns), ...]`` (see :func:`_group`).

    First by the raw text of the columns (cheap: nothing decoded), then the first event of each
    text decoded and keyed by value, so that texts of one value (``1.0`` and ``1.00``) merge.
    """
    by_text: dict = {}  # (name, text key) -> [first index, count], in first-occurrence order
    join = b"\0".join
    for i in kept:  # the hot loop of grouping: one dict lookup per kept event
        e = events[i]
        a = e.args
        if a.__class__ is _Args:  # _text_key, inlined
            # JSON text never holds a NUL byte: the join is unambiguous
            key = e.name, join((a.types, a.dims, a.strides, a.concrete)) if a.types and a.dims else None
        else:
            key = e.name, _text_key(a)
        seen = by_text.get(key)
        if seen is None:
            by_text[key] = [i, 1]
        else:
            seen[1] += 1
    if kept and all(key is None for _, key in by_text):
        raise TraceFormatError(
            f"{path}: no operator event has 'Input Dims': the trace was recorded without shapes; "
            "profile with torch.profiler.profile(record_shapes=True) and export it again"
        )
    groups: dict = {}
    for (name, key), (i, count) in by_text.items():
        cols = None if key is None else _columns(path, events[i].args)
        value_key = (name, None if cols is None else _marshal_key(cols))
        g = groups.get(value_key)
        if g is None:
            groups[value_key] = [name, i, count, cols]
        else:
            g[2] += count
    return [tuple(g) for g in groups.values()]


def _text_key(a) -> bytes | None:
    """The key of the argument columns of an event the typed decoder did not build (args as
    the stdlib read them; None: no shapes). :func:`_same_calls` keys an :class:`_Args` itself."""
    if a.__class__ is dict and "Input Dims" in a and "Input type" in a:
        return _marshal_key(_plain_columns(a))
    return None


def _marshal_key(cols: tuple) -> bytes:
    # marshal version 2 (no back-references) is a canonical byte string of these lists,
    # ~4x cheaper than repr(); 1 and 1.0, True and 1 stay distinct.
    return marshal.dumps(cols, 2)


def _plain_columns(a: dict) -> tuple:
    return a["Input type"], a["Input Dims"], a.get("Input Strides"), a.get("Concrete Inputs")


def _columns(path: str, a) -> tuple:
    """(types, dims, strides, concrete) of an event with shapes, decoded."""
    if a.__class__ is not _Args:
        return _plain_columns(a)
    return tuple(raw_value(r, path, "Kineto trace", _FIX) if r else None
                 for r in (a.types, a.dims, a.strides, a.concrete))


def parse(path, *, level: str = "top", max_bytes: int | None = None, dtype: str | None = None,
          **_options) -> Iterator[ImportRecord]:
    """Yield casedb records for the operator calls in a Kineto trace (see module docstring).

    level: "top" keeps the outermost operator of each nest, "leaf" the innermost ones.
    max_bytes: cap on the (decompressed) file size, default ``casedb.files.MAX_INPUT_BYTES``.
    dtype: the element dtype of Tensor[] arguments (cat's list) in calls without another tensor
    argument; default: the trace's dominant floating dtype (:func:`importers.kineto_args.dominant_dtype`).
    Identical calls are aggregated into one record whose ``count`` is the number of calls and
    whose ``where`` is the first of them (``<path>:event <index in traceEvents>``).
    """
    if level not in ("top", "leaf"):
        raise ValueError(f"level must be 'top' or 'leaf', not {level!r}")
    path = str(path)
    with paused_gc():
        try:
            groups = _group(path, level, max_bytes)
        except (TypeError, AttributeError, KeyError, IndexError) as err:
            # Valid JSON in the wrong shape (a hand-edited or foreign file).
            raise TraceFormatError(f"{path}: malformed Kineto trace ({type(err).__name__}: {err}); {_FIX}") from None
    list_default, consumers = _list_dtype(groups, dtype), consumer_dtypes(groups)
    for g, (name, i, count, cols) in enumerate(groups):
        where = f"{path}:event {i}"
        if cols is None:
            yield {"type": "skipped", "where": where, "op": name, "count": count,
                   "reason": "event has no input shapes (Input Dims / Input type)"}
            continue
        try:
            res = _convert(name, cols, list_default=consumers.get(g, list_default))
        except (TypeError, ValueError, IndexError, KeyError, AttributeError) as err:
            raise TraceFormatError(
                f"{path}: event {i} ({name}): malformed arguments ({err}); the trace is corrupt: {_FIX}"
            ) from None
        if isinstance(res, str):
            yield {"type": "skipped", "where": where, "op": name, "count": count, "reason": res}
            continue
        op, inputs, attrs, note = res
        description = f"{path} event {i}"
        if note:
            description += f" ({note})"
        yield {
            "type": "case",
            "model": None,
            "where": where,
            "count": count,
            "case": {"op": op, "inputs": inputs, "attrs": attrs, "description": description},
        }

