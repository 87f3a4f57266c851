"""RFC-0186 YAML manifests (``model:``, ``default:``, ``cases:``) → records.

Also what the RFC's own implementation writes: ``defaults:`` for ``default:``, and the
``<model>-<backend>.yaml`` naming of backend-specific variants (``gpt_oss-spyre.yaml`` is the
model ``gpt_oss-spyre``, a variant of ``gpt_oss``).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterator

import yaml

from casedb.errors import InputError

TOP_KEYS = ("model", "default", "defaults", "description", "family", "variant_of", "cases")
# File-name suffixes that mark a backend-specific variant manifest.
BACKEND_SUFFIXES = ("spyre", "cuda", "cpu", "xpu", "mps", "hpu", "rocm", "inductor", "npu", "tpu")


class Located(dict):
    """A mapping that remembers the line it started on (1-based)."""

    line: int | None = None


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader, node):
    loader.flatten_mapping(node)
    m = Located(loader.construct_pairs(node, deep=True))
    m.line = node.start_mark.line + 1
    return m


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def sniff(path: Path, head: str) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")


def load(path: Path):
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read: {e}", where=str(path)) from None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(f"YAML syntax error: {problem}; fix the file and import again", where=where) from None


def variant_name(model: str, path: Path) -> tuple[str, str | None]:
    """(model name, base model) following the `<model>-<backend>.yaml` convention."""
    norm = lambda s: s.lower().replace("_", "-")  # noqa: E731
    stem = norm(path.stem)
    key = norm(model)
    if stem.startswith(key + "-") and len(stem) > len(key) + 1:
        suffix = path.stem[len(model) + 1:]
        return f"{model}-{suffix}", model
    for suffix in BACKEND_SUFFIXES:
        if stem.endswith("-" + suffix) and key.endswith("-" + suffix):
            return model, model[: -len(suffix) - 1]
    return model, None


def parse(path) -> Iterator[dict]:
    path = Path(path)
    doc = load(path)
    if not isinstance(doc, dict):
        raise InputError("a manifest is a mapping with 'model' and 'cases' (RFC-0186 schema)", where=str(path))
    for k in doc:
        if k not in TOP_KEYS:
            close = difflib.get_close_matches(str(k), TOP_KEYS, n=1)
            hint = f" — did you mean {close[0]!r}?" if close else ""
            raise InputError(f"unknown top-level key {k!r}{hint} (allowed: {', '.join(TOP_KEYS)})", where=str(path))
    if "model" not in doc or not isinstance(doc["model"], (str, int)) or not str(doc["model"]).strip():
        raise InputError("missing 'model: <name>' at the top of the manifest", where=f"{path}:1")
    if "default" in doc and "defaults" in doc:
        raise InputError("give 'default' or 'defaults', not both", where=str(path))
    name, base = variant_name(str(doc["model"]).strip(), path)
    yield {
        "type": "model", "name": name, "variant_of": doc.get("variant_of") or base,
        "family": doc.get("family"), "description": doc.get("description"),
        "defaults": doc.get("default", doc.get("defaults")) or {}, "source": str(path),
    }
    cases = doc.get("cases")
    if cases is None:
        cases = []
    if not isinstance(cases, list):
        raise InputError("'cases' must be a list of case mappings", where=str(path))
    for case in cases:
        line = getattr(case, "line", None)
        yield {"type": "case", "model": name, "case": case, "count": 1,
               "where": f"{path}:{line}" if line else str(path)}
