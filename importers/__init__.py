"""Input formats casedb imports: the registry. Each format is one module with a pure
``parse(path, *, max_bytes=None, **options)`` yielding records and a ``sniff(path, head) -> bool``
(see README.md here), and one :class:`Format` row in :data:`REGISTRY`; detection, ``casedb import
--format``'s help and the options each parser is handed are read from it (docs/extending.md)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from casedb.files import read_head


@dataclass(frozen=True)
class Format:
    name: str                   # what --format takes and the import report shows
    module: str                 # the module with parse() and sniff()
    about: str                  # a few words for --format's help
    suffixes: tuple[str, ...]   # file-name endings a folder import picks up
    options: tuple[str, ...] = ()  # parse()'s keyword options besides max_bytes
    needs_model: bool = False   # its files do not name their model: `casedb import --model NAME`


# In the order detection asks: the first format whose sniff says yes reads the file (a v2 config is
# YAML too, so it comes before yaml).
REGISTRY = (
    Format("spyre-v2", "importers.model_ops_v2", "the RFC implementation's v2 model-ops config", (".yaml", ".yml")),
    Format("yaml", "importers.yaml_manifest", "RFC-0186 YAML manifest", (".yaml", ".yml")),
    Format("scan", "importers.scan_jsonl", "casedb scan output", (".jsonl",)),
    Format("kineto", "importers.kineto", "Kineto / chrome trace", (".json", ".gz"), ("level", "dtype"),
           needs_model=True),
    Format("et", "importers.execution_trace", "PyTorch Execution Trace", (".json", ".gz"), ("level",),
           needs_model=True),
    Format("oplog", "importers.oplog", "operator_inp_logs text", (".txt", ".log"), ("symbols",), needs_model=True),
)
FORMATS = {f.name: f for f in REGISTRY}
# Formats whose files do not name their model (`casedb import --model NAME` is required).
NEEDS_MODEL = {f.name for f in REGISTRY if f.needs_model}
SUFFIXES = tuple(dict.fromkeys(s for f in REGISTRY for s in f.suffixes))
OPTIONS = tuple(dict.fromkeys(o for f in REGISTRY for o in f.options))


class UnknownFormat(ValueError):
    pass


def help_text() -> str:
    """``--format``'s help: every format with what it reads."""
    return "Force a format: " + "; ".join(f"{f.name} ({f.about})" for f in REGISTRY) + "."


def module(name: str):
    if name not in FORMATS:
        raise UnknownFormat(f"unknown format {name!r}; known: {', '.join(FORMATS)}")
    try:
        return importlib.import_module(FORMATS[name].module)
    except ModuleNotFoundError as e:
        raise UnknownFormat(f"format {name!r} is not available in this build ({e})") from None


def parse_options(name: str, options: dict) -> dict:
    """The options ``name``'s parser takes out of ``options`` (None: not given). An option no
    format takes is refused (a misspelt one would otherwise do nothing)."""
    unknown = sorted(k for k in options if k != "max_bytes" and k not in OPTIONS)
    if unknown:
        raise UnknownFormat(f"unknown import option(s) {', '.join(map(repr, unknown))}; "
                            f"the formats take: max_bytes, {', '.join(OPTIONS)}")
    taken = ("max_bytes",) + FORMATS[name].options
    return {k: v for k, v in options.items() if k in taken and v is not None}


def detect(path: Path) -> str:
    """Name of the format of `path`: every format's sniff is asked (its suffix and first bytes),
    the first in :data:`REGISTRY`'s order that says yes wins."""
    head = read_head(path).decode("utf-8", errors="replace")
    said = []
    for fmt in REGISTRY:
        try:
            mod = module(fmt.name)
        except UnknownFormat:
            continue
        if mod.sniff(path, head):
            said.append(fmt.name)
    if said:
        return said[0]
    raise UnknownFormat(
        f"{path}: cannot tell its format; give --format ({', '.join(FORMATS)})"
    )
