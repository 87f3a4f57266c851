"""Cases only another transformers version records, shipped beside the model's manifest.

The RFC implementation's tracer ran transformers 5.2–5.15; casedb's manifests are scanned with
the venv's (5.24). Code the older versions ran and 5.24 no longer does (granitemoehybrid's
ScatterMoE router, granite-speech's audio-token check, Pixtral's block mask) is scanned under
that version (``casedb scan MODEL --device cpu`` in a venv with it: casedb.scan.cpu_device)
and shipped as a **version manifest**: ``<model>@transformers-<major.minor>.yaml`` in the
folder of the model's manifest, with the same model name, holding only the cases no shipped
manifest of the model holds yet (by case signature, the DB's dedupe).

* :func:`shipped_files` — the shipped manifests of a model (its manifest, its version manifests);
* :func:`write_version_manifest` — a scan file's new cases as the version manifest;
* :func:`compare_shipped` — another tracer's op list against everything shipped for a model
  (``casedb scan MODEL --compare FILE --shipped``).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from casedb.scan.config import ScanError
from casedb.scan.recipes import RECIPE_DIR, display_path, load_recipe
from casedb.store.database import SHIPPED_MANIFESTS

# Folders of manifests/ that hold no model's cases (scan recipes, triage rules).
NOT_MANIFESTS = ("scan", "triage")
_HEAD_BYTES = 16 << 10  # a manifest names its model in its first lines, after the comment
_MODEL_LINE = re.compile(r"^model:[ \t]*(.+?)[ \t]*$", re.MULTILINE)


def shipped_files(model: str, root: Path = SHIPPED_MANIFESTS) -> list[Path]:
    """The manifests under ``root`` whose ``model:`` is ``model``: its manifest first, then its
    version manifests (``<model>@...``), each sorted by path."""
    import yaml

    found = []
    for path in sorted(root.rglob("*.yaml")):
        if path.relative_to(root).parts[0] in NOT_MANIFESTS:
            continue
        with open(path, encoding="utf-8") as f:
            match = _MODEL_LINE.search(f.read(_HEAD_BYTES))
        if match and str(yaml.safe_load(match.group(1))) == model:
            found.append(path)
    return sorted(found, key=lambda p: ("@" in p.stem, str(p)))


def version_manifest_path(model: str, transformers_version: str, root: Path = SHIPPED_MANIFESTS) -> Path:
    """Where the version manifest of ``model`` for that transformers goes: beside its manifest."""
    files = [p for p in shipped_files(model, root) if "@" not in p.stem]
    if not files:
        raise ScanError(f"no shipped manifest of model {model!r} under {root}: a version manifest goes beside it")
    minor = ".".join(transformers_version.split(".")[:2])
    return files[0].parent / f"{model}@transformers-{minor}.yaml"


def read_header(scan_file: Path) -> dict:
    """The first line of a scan JSONL (its model, transformers version, paths ...)."""
    try:
        with open(scan_file, encoding="utf-8") as f:
            header = json.loads(f.readline())
    except (OSError, ValueError) as e:
        raise ScanError(f"cannot read the scan header: {e}", where=str(scan_file)) from None
    if not isinstance(header, dict) or "casedb_scan" not in header or not header.get("model"):
        raise ScanError("not a casedb scan file (its first line is the scan header)", where=str(scan_file))
    return header


def write_version_manifest(scan_file: str | Path, out: str | Path | None = None,
                           root: Path = SHIPPED_MANIFESTS) -> dict:
    """Write the cases of ``scan_file`` that no shipped manifest of its model holds (the version
    manifest, to ``out`` or its place beside the model's manifest), less the :func:`index_repeats`.
    Returns the counts."""
    from casedb.ingest.save import import_paths
    from casedb.read import export
    from casedb.store.database import Store

    scan_file = Path(scan_file)
    header = read_header(scan_file)
    model = header["model"]
    out = Path(out) if out else version_manifest_path(model, header["transformers"], root)
    base = [p for p in shipped_files(model, root) if p.resolve() != out.resolve()]
    with tempfile.TemporaryDirectory(prefix="casedb-versions-") as tmp:
        with Store(Path(tmp) / "shipped.sqlite") as shipped:
            if base:
                import_paths(shipped, base)
            held = shipped.occurrences([model], markexpr="") if base else []
            known = {o["signature"] for o in held}
            # the same call spelt otherwise (linear(x, w) and linear(x, w, None)) is shipped too
            known_calls = {_call(o) for o in held}
        with Store(Path(tmp) / "scan.sqlite") as scanned:
            import_paths(scanned, [scan_file])
            occurrences = scanned.occurrences([model], markexpr="")
            total = len(occurrences)
            repeats = index_repeats(occurrences) - known
            drop = known | repeats
            paths = ", ".join(p["name"] for p in header.get("paths", [])) or "default"
            note = (f"\nCases of a scan under transformers {header['transformers']} (torch {header['torch']}, device "
                    f"{header.get('device', 'meta')}, paths: {paths}) that no other shipped manifest of {model} holds: "
                    f"{', '.join(p.name for p in base) or 'none'}.")
            written = export.write_file(out, lambda f, p: export.write_yaml(
                scanned, model, f, p, keep=lambda occ: occ["signature"] not in drop and _call(occ) not in known_calls,
                note=note))
    return {"model": model, "file": display_path(out), "scanned": total, "new": written,
            "already_shipped": total - written - len(repeats), "index_repeats": len(repeats),
            "transformers": header["transformers"], "base": [str(p) for p in base]}


def _call(occ: dict) -> str:
    from casedb.cases.call_identity import identity

    return identity(occ["op"], occ["inputs"], occ["attrs"], occ["seed"])


def index_repeats(occurrences: list[dict]) -> set[str]:
    """Signatures of the ``getitem`` calls that repeat one source line's call with another integer
    index (``self.weight[i]`` for every expert i of transformers 5.2's ScatterMoE loop: 72 cases of
    one 0.9 GB weight, ~30 s each on the eager CPU reference): all but the first and last index."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for occ in occurrences:
        inputs = occ["inputs"]
        if occ["op"] != "torch.getitem" or len(inputs) != 2 or set(inputs[1]) != {"value"} \
                or not isinstance(inputs[1]["value"], int) or isinstance(inputs[1]["value"], bool):
            continue
        site = (occ["description"] or "").split("\n", 1)[0]  # File: <source line>
        key = json.dumps([site, inputs[0], occ["attrs"]], sort_keys=True)
        groups.setdefault(key, []).append((inputs[1]["value"], occ["signature"]))
    drop = set()
    for calls in groups.values():
        calls.sort()
        drop.update(sig for _, sig in calls[1:-1])
    return drop


def shipped_ops(files: list[Path]) -> dict[str, int]:
    """Op name -> number of cases, over the manifests ``files``."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    ops: dict[str, int] = {}
    for path in files:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader
        for case in doc.get("cases") or []:
            ops[case["op"]] = ops.get(case["op"], 0) + 1
    return ops


def compare_shipped(model: str, theirs_file: str | Path, root: Path = SHIPPED_MANIFESTS) -> dict:
    """Their op list against the cases of every shipped manifest of ``model`` (no scan): the
    comparison of casedb.scan.compare, the files, and the ops only a version manifest brings."""
    from casedb.scan import compare

    theirs = compare.read_ops(theirs_file)
    files = shipped_files(model, root)
    if not files:
        raise ScanError(f"no shipped manifest has model {model!r} (under {root}); the shipped models: "
                        f"casedb models, or the model: line of a manifest")
    per_file = {p: shipped_ops([p]) for p in files}
    ours = {op for ops in per_file.values() for op in ops}
    main = {op for p, ops in per_file.items() if "@" not in p.stem for op in ops}
    result = compare.compare(ours, theirs)
    matched_keys = {compare.op_key(n) for n in theirs if compare.is_operator(n)} - \
        {compare.op_key(n) for n in result["missing"]}
    only_versions = sorted(op for op in ours - main if compare.op_key(op) in matched_keys)
    return {"model": model, "file": str(theirs_file), "shipped": [display_path(p) for p in files],
            "cases": sum(sum(ops.values()) for ops in per_file.values()), **result,
            "from_version_manifests": only_versions}


def shipped_command(model: str, theirs_file: str | Path, root: Path = SHIPPED_MANIFESTS) -> dict:
    """What ``casedb scan MODEL --compare FILE --shipped`` does: :func:`compare_shipped` of the
    recipe's model (or of the model so named), as the summary ``casedb scan`` prints."""
    name = load_recipe(model).model if (RECIPE_DIR / f"{model}.yaml").exists() else model
    result = compare_shipped(name, theirs_file, root)
    return {"model": name, "shipped": result.pop("shipped"), "cases": result.pop("cases"), "compare": result}
