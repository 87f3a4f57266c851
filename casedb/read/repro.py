"""`casedb repro`: one case as a standalone Python script (torch only), for an upstream bug report.

The script is a fixed template (``templates/repro.py.tmpl``) plus data. Its first ~60 lines are
what a reader needs: the case in words (:mod:`casedb.read.repro_words`: inputs, call, judge, as
escaped comments), the call and the comparison in ``main()``. Everything about the case -- op,
inputs, seed, tolerances, the models that use it -- is one JSON document that the script reads
with ``json.loads`` from a Python string literal written by ``repr``: no text from a manifest or a
database ever becomes code, whatever a case or model is called. Below a marked line the script
carries casedb's own code, copied with :func:`inspect.getsource` so the two cannot drift: the
input generators of :mod:`casedb.cases.materialize`, the layout presets, the blob codec and the
judge modules that say ``IN_REPRO``, so it rebuilds the exact inputs (same seed, same generator
calls in the same order) and judges with the same rules as a run. It runs the op on the CPU
(eager, the reference) and on the target device (compiled as casedb compiles: ``fullgraph=True,
dynamic=False`` after ``torch._dynamo.reset()``), the ``--import`` modules found from any folder
(:mod:`casedb.read.repro_imports`), a ``device_layout`` laid out by the device's hook. Exit
status 0 when the target matches.
"""

from __future__ import annotations

import base64
import inspect
import json
import math
import re
import shlex
import textwrap
import zlib
from pathlib import Path

from casedb.errors import CasedbError

TEMPLATE = Path(__file__).with_name("templates") / "repro.py.tmpl"
# Modules the script may import; any other module copied code uses is an error.
_SCRIPT_MODULES = {"torch", "math", "io", "sys", "zlib", "base64", "operator", "enum", "types", "dataclasses",
                   "typing", "json", "importlib"}


def _inline_module(module, together: tuple = ()) -> str:
    """A whole casedb module that needs nothing but torch, the standard library and the modules
    inlined before it (``together``: their import lines are dropped, their names are the
    script's own), as the script's own code."""
    import ast

    source = inspect.getsource(module)
    tree = ast.parse(source)
    dropped, doc = set(), ast.get_docstring(tree) or ""
    if doc:  # what the module is to casedb: its first sentence is enough in a script
        dropped.update(range(tree.body[0].lineno, tree.body[0].end_lineno + 1))
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for n in names:
            if n in together:
                dropped.update(range(node.lineno, node.end_lineno + 1))
            elif n != "__future__" and n.split(".")[0] not in _SCRIPT_MODULES:
                raise CasedbError(f"cannot copy {module.__name__} into a repro: it imports {n}")
    lines = [ln for i, ln in enumerate(source.splitlines(), 1)
             if i not in dropped and ln.strip() != "from __future__ import annotations"]
    first = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
    said = f"# {first}.\n\n" if doc else ""
    return f"# ---- {module.__name__}\n{said}" + "\n".join(lines).lstrip("\n") + "\n\n"


def carried_modules() -> list[tuple]:
    """(module, the casedb modules it imports) for every judge module a repro script carries (its
    ``IN_REPRO``), each after those it imports."""
    import ast
    import importlib
    import pkgutil

    import casedb.judge

    found = {}
    for info in sorted(pkgutil.iter_modules(casedb.judge.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"casedb.judge.{info.name}")
        if not isinstance(getattr(module, "IN_REPRO", None), bool):
            raise CasedbError(f"{module.__name__} does not say whether repro scripts carry it: give it "
                              "IN_REPRO = True or False (docs/extending.md)")
        if module.IN_REPRO:
            tree = ast.parse(inspect.getsource(module))
            found[module.__name__] = (module, tuple(sorted({
                n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("casedb.")})))
    ordered: dict = {}

    def visit(name: str) -> None:
        if name not in ordered and name in found:
            for dep in found[name][1]:
                visit(dep)
            ordered[name] = found[name]

    for name in found:
        visit(name)
    return list(ordered.values())


def _check_names(code: str) -> None:
    """Copied code defines each top-level name once (two casedb modules must not collide)."""
    import ast

    seen: set = set()
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if node.name in seen:
                raise CasedbError(f"cannot write a repro: two copied definitions of {node.name}")
            seen.add(node.name)


def _source(fn) -> str:
    lines = inspect.getsource(fn).splitlines()
    while lines and lines[0].lstrip().startswith("@"):
        lines.pop(0)  # registration decorators belong to casedb, not to the script
    return textwrap.dedent("\n".join(lines)) + "\n"


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


def _copy_with_dependencies(objs) -> str:
    """Source of these functions plus every function, class and constant of their own module
    they use (transitively), dependencies first: the script runs casedb's very code."""
    done: set = set()
    blocks: list[str] = []
    consts: dict[str, str] = {}

    def visit(obj):
        key = (obj.__module__, obj.__qualname__)
        if key in done:
            return
        done.add(key)
        code_objects = [obj.__code__] if inspect.isfunction(obj) else [
            m.__code__ for m in vars(obj).values() if inspect.isfunction(m)]
        for code in code_objects:
            module_globals = vars(inspect.getmodule(obj))
            for name in sorted(_code_names(code)):
                if name not in module_globals:
                    continue  # a builtin or an attribute name
                val = module_globals[name]
                if inspect.ismodule(val):
                    if val.__name__ not in _SCRIPT_MODULES:
                        raise CasedbError(f"cannot copy {obj.__qualname__} into a repro: it uses module {val.__name__}")
                elif (inspect.isfunction(val) or inspect.isclass(val)) and val.__module__ == obj.__module__:
                    visit(val)
                elif not callable(val) and name not in consts:
                    text = repr(val)
                    try:
                        import torch

                        ok = eval(text, {"torch": torch}) == val  # noqa: S307 - casedb's own constant's repr
                    except Exception:
                        ok = False
                    if not ok:
                        raise CasedbError(f"cannot copy {obj.__qualname__} into a repro: constant {name} has no literal form")
                    consts[name] = text
        blocks.append(_source(obj))

    for obj in objs:
        visit(obj)
    head = "".join(f"{k} = {v}\n" for k, v in consts.items())
    return (head + "\n\n" if head else "") + "\n\n".join(blocks) + "\n\n"


# ------------------------------------------------------------------------------- the data

def _argument(x, leaf_index: dict):
    """An argument as JSON the script's ``value()`` turns back into it."""
    import torch

    from casedb.cases.materialize import DeviceLeaf, TensorLeaf, TensorListLeaf

    if isinstance(x, TensorLeaf):
        return {"T": leaf_index[id(x)]}
    if isinstance(x, TensorListLeaf):
        items = [None if i is None else {"T": leaf_index[id(i)]} for i in x.items]
        return {"tuple": items} if x.as_tuple else {"tensors": items}
    if isinstance(x, DeviceLeaf):
        return {"device": x.text}
    if isinstance(x, (torch.dtype, torch.memory_format, torch.layout)):
        return {"torch": str(x).replace("torch.", "")}
    if x is Ellipsis:
        return {"ellipsis": True}
    if isinstance(x, float) and not math.isfinite(x):
        return {"float": repr(x)}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, slice):
        return {"slice": [_argument(v, leaf_index) for v in (x.start, x.stop, x.step)]}
    if isinstance(x, tuple):
        return {"tuple": [_argument(v, leaf_index) for v in x]}
    if isinstance(x, list):
        return {"list": [_argument(v, leaf_index) for v in x]}
    if isinstance(x, dict):
        return {"dict": {str(k): _argument(v, leaf_index) for k, v in x.items()}}
    raise CasedbError(f"cannot write {type(x).__name__} {x!r} into a script")


def _tensor(leaf, load_blob, blobs_out: list, embed: bool = False) -> dict:
    """A tensor as the script rebuilds it: its generator call, or (``embed``: values no generator
    makes, such as an extremal variant's NaN and inf) its values as a compressed blob, appended to
    ``blobs_out`` (the script's BLOBS, at its end: the case stays short to read); its preset and
    device layout."""
    src, raw = dict(leaf.source), None
    if embed and "data" not in src:
        from casedb.cases import blobs

        src, raw = {"shape": src["shape"], "dtype": src["dtype"]}, blobs.encode(leaf.base)
    elif "blob" in src:
        raw = load_blob(src["blob"])
    if raw is not None:
        blobs_out.append(base64.b85encode(zlib.compress(raw, 9)).decode("ascii"))
        src["blob"] = len(blobs_out) - 1
    if leaf.preset:
        src.update(preset=leaf.preset, preset_args=leaf.preset_args)
    if leaf.device_layout:
        src["device_layout"] = leaf.device_layout
    return src


def _op(op: str) -> dict:
    from casedb.names import normalize_op
    from casedb.cases.ops import UnknownOpError, op_info

    try:
        info = op_info(op)
    except UnknownOpError as e:
        raise CasedbError(f"cannot write a repro: {e}") from None
    if info.kind in ("overload", "packet"):
        path = str(info.fn)
    elif info.kind == "method":
        path = info.fn.__name__
    elif info.kind == "operator":
        path = info.fn.__name__.lstrip("_") if info.fn.__name__ == "_setitem" else info.fn.__name__
    else:
        path = normalize_op(op)[len("torch."):]
    return {"name": op, "kind": info.kind, "path": path}


def _choose(store, name: str, model: str | None) -> tuple[dict, list[dict]]:
    from casedb.store.lookup import one_case

    rows = one_case(store, name, model)
    return store.case(rows[0]["signature"]), rows


def _tolerance(value: float, flag: str) -> float:
    from casedb.cases.bounds import check_tolerance

    try:
        return check_tolerance(value, flag)
    except ValueError as e:
        raise CasedbError(str(e)) from None


def _unimported(run: int | None, modules: list[str]) -> str:
    """What to say about the modules run ``run`` imported that this repro does not."""
    again = " ".join(f"--import {shlex.quote(m)}" for m in modules)
    return (f"run {run} was recorded with --import {', '.join(modules)}; casedb never imports a module because a "
            f"database names it (the file may come from elsewhere): review it and give it again ({again}) "
            "for the script to import it")


def _target(store, case: dict, occ: dict, run: int | None, given: dict) -> dict:
    """Device, backend, imports, judge, reference dtype, values and tolerances: as given, else
    as run ``run`` had them (casedb.read.repro_run), else casedb's defaults."""
    from casedb.judge import numerics
    from casedb.read import repro_imports, repro_run
    from casedb.run.runspec import RunSpec
    from casedb.run.target import check_import, import_module

    rtol, atol = (None if given[k] is None else _tolerance(given[k], f"--{k}") for k in ("rtol", "atol"))
    ctx = repro_run.run_context(store.db, run, case["signature"], occ) if run is not None else {}
    # only this command line's --import: a database can come from anywhere, and casedb never
    # imports a module because a database names it (as `casedb run --resume`)
    imports = [check_import(m) for m in given["imports"]]
    # imported here so custom ops resolve and the device's layout hook is found while the script is written
    modules = [import_module(mod) for mod in imports]
    portable = [repro_run.portable_import(m) for m in imports]
    t = {"device": given["device"] or ctx.get("device"), "backend": given["backend"] or ctx.get("backend")
         or RunSpec().backend, "modules": modules,
         "imports": [repro_imports.import_record(str(g), m) for g, m in zip(given["imports"], imports)],
         "run_imports": [m for m in ctx.get("imports") or [] if m not in portable],
         "judge": ctx.get("judge") or numerics.DEFAULT_JUDGE, "hi_dtype": ctx.get("reference_dtype"),
         "values": ctx.get("values") or "random", "run": run, "run_outcome": ctx.get("outcome"),
         "replace_device": given["replace_device"] and ctx.get("replace_device", True)}
    # the tolerance a run gives each floating dtype of this occurrence (casedb.judge.numerics, no rules) ...
    plan_occ = {**occ, "defaults": store.models_defaults(occ["model"]),
                **({"rtol": rtol} if rtol is not None else {}), **({"atol": atol} if atol is not None else {})}
    policy = numerics.Policy(device=str(t["device"] or "cpu"), backend=str(t["backend"]))
    tols = {d: policy.tolerance(plan_occ, case, d) for d in ("float16", "bfloat16", "float32", "float64")}
    t["tolerances"] = {d: [x.rtol, x.atol] for d, x in tols.items()}
    t["tolerance_note"] = "the policy's (no tolerance rules)"
    if rtol is not None or atol is not None:  # the caller's: never overruled, judged by tolerance
        t["judge"], t["tolerance_note"] = "tolerance", "given (--rtol/--atol)"
    elif ctx.get("tolerances"):  # ... or the ones the run judged with, rules included
        t["tolerances"].update(ctx["tolerances"])
        t["tolerance_note"] = ctx["tolerance_note"]
    elif run is not None:
        t["tolerance_note"] = ctx["tolerance_note"]
    elif tols.get(case["dtype"], tols["float32"]).explicit:
        t["judge"] = "tolerance"  # a tolerance written on the case is never overruled
    return t


def script(store, name: str, *, device: str | None = None, backend: str | None = None,
           imports: list[str] = (), rtol: float | None = None, atol: float | None = None,
           replace_device: bool = True, model: str | None = None, run: int | None = None,
           notes: list | None = None) -> str:
    """The repro script for the case `name` (signature prefix, case name or model::name);
    ``model`` picks whose tolerances it uses when several models share the case; ``run``: take
    the target, judge, values and tolerances from that recorded run (what was given explicitly
    wins; its --import modules are only named, in ``notes`` and in the script); ``notes``: a
    list that gets what the caller should tell the user."""
    from casedb.cases import materialize, ops, value_ranges

    case, rows = _choose(store, name, model)
    occ = rows[0]
    t = _target(store, case, occ, run, {"device": device, "backend": backend, "imports": list(imports or []),
                                         "rtol": rtol, "atol": atol, "replace_device": replace_device})
    if t["run_imports"] and notes is not None:
        notes.append(_unimported(run, t["run_imports"]))
    try:
        info = ops.op_info(case["op"])
    except ops.UnknownOpError as e:
        hint = f"; {_unimported(run, t['run_imports'])}" if t["run_imports"] else ""
        raise CasedbError(f"cannot write a repro: {e}{hint}") from None
    ran = value_ranges.variant(case, t["values"])
    if ran is None:
        raise CasedbError(f"run {run} ran {t['values']} values, and case {case['signature'][:16]} has none "
                          "(casedb.cases.value_ranges): nothing to reproduce")
    prepared = materialize.prepare(ran, load_blob=store.load_blob)
    leaf_index = {id(leaf): i for i, leaf in enumerate(prepared.leaves)}
    main = t["tolerances"].get(case["dtype"]) or t["tolerances"]["float32"]
    blobs: list[str] = []
    data = {
        "op": _op(case["op"]), "signature": case["signature"], "shapes": case["shapes"], "dtype": case["dtype"],
        "device": t["device"], "backend": t["backend"], "rtol": main[0], "atol": main[1],
        "tolerances": t["tolerances"], "tolerance_note": t["tolerance_note"], "judge": t["judge"],
        "hi_dtype": t["hi_dtype"], "values": t["values"], "run": t["run"], "run_outcome": t["run_outcome"],
        "seed": materialize.case_seed(case) & 0xFFFF_FFFF_FFFF_FFFF, "replace_device": t["replace_device"],
        "writes": info.mutated(prepared.args, prepared.kwargs),
        "metadata_only": info.metadata_only(prepared.args, prepared.kwargs),
        "tensors": [_tensor(leaf, store.load_blob, blobs, embed=ran is not case) for leaf in prepared.leaves],
        "args": [_argument(a, leaf_index) for a in prepared.args],
        "kwargs": {k: _argument(v, leaf_index) for k, v in prepared.kwargs.items()},
        "imports": t["imports"], "run_imports": t["run_imports"], "expects_error": occ.get("expects_error"),
        "layout_hook": _layout_hook(t, prepared),
        "used_by": [{"model": r["model"], "name": r["name"], "rtol": r["rtol"], "atol": r["atol"],
                     "source": r.get("source")} for r in store.find(case["signature"])[:50]],
    }
    return _fill(data, prepared, blobs)


def _layout_hook(t: dict, prepared) -> dict | None:
    """Where the script finds the target device's layout hook, when an input has a device layout."""
    from casedb.read import repro_imports

    if not any(leaf.device_layout for leaf in prepared.leaves):
        return None
    return repro_imports.layout_hook(t["device"], t["modules"])


def _fill(data: dict, prepared, blobs: list) -> str:
    """The template with the case's data, the words of its head and casedb's own code."""
    from casedb.cases import blobs as blob_codec
    from casedb.cases import generators, ops, presets
    from casedb.judge import judges, numerics
    from casedb.read import repro_words
    from casedb.run import execute

    used_presets = sorted({leaf.preset for leaf in prepared.leaves if leaf.preset})
    copied = {"generators": {init: fn.__name__ for init, fn in generators.GENERATORS.items()},
              "presets": {p: presets.PRESETS[p].fn.__name__ for p in used_presets},
              "ulp": [numerics.ULP_K, numerics.ULP_FLOOR], "hi_bytes": numerics.HI_REFERENCE_BYTES}
    helpers = (_inline_module(blob_codec) + "".join(_inline_module(m, together=d) for m, d in carried_modules())
               + "# ---- functions of casedb.cases.generators, ops, execute, presets, judge.numerics\n"
               + _copy_with_dependencies([*generators.GENERATORS.values(), ops._setitem, execute._to_cpu,
                                          numerics.high_precision, *(presets.PRESETS[p].fn for p in used_presets)]))
    _check_names(helpers)
    # ASCII JSON escapes every line break: a module name from a database stays inside the comment
    values = {"HELPERS": helpers, "RUN_IMPORTS": "# run {} was recorded with --import {} (not imported: give it "
              "to `casedb repro --import`)\n".format(data["run"], json.dumps(data["run_imports"]))
              if data["run_imports"] else "",
              **repro_words.head_words(data, getattr(judges.JUDGES.get(data["judge"]), "by_ulp", False))}
    # repr of a str is a Python string literal whatever it holds: the case is data, never code
    values.update({key: repr(json.dumps(value, ensure_ascii=False, sort_keys=True)) for key, value in
                   (("COPIED_JSON", copied), ("BLOBS_JSON", blobs), ("CASE_JSON", data))})
    # one pass over the template: no placeholder is looked for in what replaced another
    text = re.sub(r"@([A-Z_]+)@", lambda m: values[m.group(1)], TEMPLATE.read_text(encoding="utf-8"))
    # the case in one comment line below the #! line; its text JSON-escaped: no newline in it can end the comment
    said = json.dumps(f"{data['op']['name']}({data['shapes']}) computing in {data['dtype']}, "
                      f"signature {data['signature'][:16]}")
    first, _, rest = text.partition("\n")
    return f"{first}\n# case: {said[1:-1]}\n{rest}"
