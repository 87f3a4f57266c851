"""RFC-0186 YAML manifests (``model:``, ``default:``, ``cases:``) → records.

Also what the RFC's own implementation writes: ``defaults:`` for ``default:``, and the
``<model>-<backend>.yaml`` naming of backend-specific variants (``gpt_oss-spyre.yaml`` is the
model ``gpt_oss-spyre``, a variant of ``gpt_oss``).

A manifest is untrusted input. It is read as ``yaml.SafeLoader`` reads it, but built straight
from libyaml's events (fast, and without PyYAML's node graph) within bounds on nesting, alias
expansion and integer length; tags other than the plain ones are refused; nothing is executed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, MappingEndEvent, ScalarEvent, SequenceEndEvent, SequenceStartEvent, StreamEndEvent
from yaml.nodes import ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from casedb import files
from casedb.cases.input_specs import MAX_RANK, MAX_TENSOR_LIST
from casedb.errors import InputError
from casedb.names import did_you_mean, model_key
from importers import unrunnable
from importers.record import ImportRecord

try:
    from yaml.cyaml import CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    CParser = None

TOP_KEYS = ("model", "default", "defaults", "description", "family", "variant_of", "cases")
# File-name suffixes that mark a backend-specific variant manifest.
BACKEND_SUFFIXES = ("spyre", "cuda", "cpu", "xpu", "mps", "hpu", "rocm", "inductor", "npu", "tpu")


# Bounds on what a manifest may make the loader build (a manifest is untrusted input):
# nesting depth (legitimate manifests nest < 20 deep; deeper exhausts Python's recursion), and
# what aliases may add by expansion: ALIAS_BASE nodes plus ALIAS_RATIO per node written in the
# file (a 600-byte "billion laughs" file otherwise expands to gigabytes).
MAX_DEPTH = 64
ALIAS_BASE = 10_000
ALIAS_RATIO = 10
# Integers longer than this are refused (a 64-bit value has at most 20 digits; Python refuses
# to read more than 4300, and sexagesimal 1:2:...:9 literals grow without that limit).
MAX_INT_CHARS = 100
# Lists casedb.cases.input_specs bounds, refused here as soon as they pass the bound (a 14 MB tensor_list
# of 10^6 entries otherwise takes 17 s and 750 MB to read before the case is refused).
MAX_ITEMS = {"tensor_list": (MAX_TENSOR_LIST, "tensors in one list"), "shape": (MAX_RANK, "dimensions")}
_SURROGATE = re.compile("[\ud800-\udfff]")
_STR, _SEQ, _MAP = "tag:yaml.org,2002:str", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"
_MISS, _TEXT = object(), object()
_CACHED_CHARS = 64
_IMMUTABLE = (int, float, bool, type(None))


class Located(dict):
    """A mapping that remembers the line it started on (1-based)."""

    line: int | None = None


class _Refused(Exception):
    """The document is refused at ``mark`` (a bound crossed, or what PyYAML's composer and
    constructor would refuse)."""

    def __init__(self, message: str, mark):
        super().__init__(message)
        self.message = message
        self.mark = mark


class _Builder:
    """Python objects straight from parser events: what ``yaml.load(text, SafeLoader)`` gives
    (mappings as :class:`Located`), without PyYAML's node graph, whose nodes and marks took
    most of the time and memory of a large manifest, and within the bounds above.

    Mixed into a loader class that provides the parser (``get_event`` ...), ``resolve`` and
    SafeConstructor's scalar constructors.
    """

    def _init_builder(self, check_surrogates: bool):
        self._anchors: dict = {}   # anchor -> (object, nodes it expands to, collection height)
        self._open: set = set()    # anchors of collections being built (an alias to one is recursive)
        self._nodes = 0            # nodes written in the file
        self._expanded = 0         # nodes added by alias expansion
        self._deepest = 0          # deepest collection level reached (for an anchored height)
        self._surrogates = check_surrogates
        self._plain: dict = {}     # plain scalar text -> its object (_TEXT: the text itself)

    def build_document(self):
        self.get_event()  # stream start
        if self.check_event(StreamEndEvent):
            return None
        self.get_event()  # document start
        obj = self._node(self.get_event(), 0)
        self.get_event()  # document end
        if not self.check_event(StreamEndEvent):
            raise _Refused("expected a single document in the stream, but found another", self.peek_event().start_mark)
        return obj

    def _node(self, ev, depth: int, key=None):
        """The object of the node that starts with event `ev`, at collection level `depth` (the
        value of `key` in its mapping)."""
        cls = ev.__class__
        if cls is ScalarEvent:
            self._nodes += 1
            obj = self._scalar(ev)
            if ev.anchor is not None:
                self._anchor(ev, obj, 1, 0)
            return obj
        if cls is AliasEvent:
            return self._alias(ev, depth)
        depth += 1
        if depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels; a manifest needs far fewer", ev.start_mark)
        if depth > self._deepest:
            self._deepest = depth
        anchor = ev.anchor
        if anchor is not None:
            if anchor in self._anchors or anchor in self._open:
                raise _Refused(f"found duplicate anchor &{anchor}", ev.start_mark)
            self._open.add(anchor)
            before = (self._nodes, self._expanded, self._deepest)
            self._deepest = depth
        self._nodes += 1
        if cls is SequenceStartEvent:
            self._collection_tag(ev, _SEQ)
            obj = []
            get = self.get_event
            most, what = MAX_ITEMS.get(key, (None, None)) if key.__class__ is str else (None, None)
            while True:
                item = get()
                if item.__class__ is SequenceEndEvent:
                    break
                if most is not None and len(obj) == most:
                    raise _Refused(f"{key} holds more than {most:,} items; a case takes at most {most:,} {what}",
                                   ev.start_mark)
                obj.append(self._node(item, depth))
        else:
            self._collection_tag(ev, _MAP)
            obj = self._mapping(ev, depth)
        if anchor is not None:
            nodes, expanded, deepest = before
            size = self._nodes - nodes + self._expanded - expanded
            height = self._deepest - depth + 1
            self._deepest = max(deepest, self._deepest)
            self._open.discard(anchor)
            self._anchor(ev, obj, size, height)
        return obj

    def _mapping(self, ev, depth: int) -> Located:
        obj = Located()
        obj.line = ev.start_mark.line + 1
        merged = None
        get = self.get_event
        while True:
            kev = get()
            cls = kev.__class__
            if cls is MappingEndEvent:
                break
            if cls is ScalarEvent and kev.tag is None and kev.implicit[0] and kev.value in ("<<", "="):
                self._nodes += 1
                if kev.value == "<<":
                    merged = (merged or []) + self._merge(self._node(get(), depth), kev.start_mark)
                    continue
                key = "="  # YAML's "value" key: PyYAML reads it as the string "="
            else:
                key = self._node(kev, depth)
            try:
                hash(key)
            except TypeError:
                raise _Refused("found an unhashable key (a list or mapping used as a key)", kev.start_mark) from None
            obj[key] = self._node(get(), depth, key)
        if merged is None:
            return obj
        out = Located(merged)  # merged first, explicit keys override (PyYAML's order)
        out.update(obj)
        out.line = obj.line
        return out

    @staticmethod
    def _merge(value, mark) -> list:
        if isinstance(value, dict):
            return list(value.items())
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            return [kv for v in reversed(value) for kv in v.items()]  # earlier mappings win
        raise _Refused("a merge key (<<) takes a mapping or a list of mappings", mark)

    @staticmethod
    def _collection_tag(ev, default: str) -> None:
        if ev.tag not in (None, "!", default):
            raise _Refused(f"the YAML tag {ev.tag} is not used in manifests; write a plain "
                           f"{'list' if default == _SEQ else 'mapping'}", ev.start_mark)

    def _scalar(self, ev):
        tag = ev.tag
        value = ev.value
        if tag is None:
            if not ev.implicit[0]:  # quoted: always text
                return self._text(ev)
            # Plain scalars repeat (keys, dtypes, small numbers): resolve and construct each once.
            hit = self._plain.get(value, _MISS)
            if hit is not _MISS:
                return value if hit is _TEXT else hit
        if tag is None or tag == "!":
            tag = self.resolve(ScalarNode, value, ev.implicit)
        if tag == _STR:
            if ev.tag is None and len(value) <= _CACHED_CHARS:
                self._plain[value] = _TEXT
            return self._text(ev)
        node = ScalarNode(tag, value, ev.start_mark, ev.end_mark, style=ev.style)
        obj = self.yaml_constructors.get(tag, self.yaml_constructors[None])(self, node)
        if ev.tag is None and len(value) <= _CACHED_CHARS and obj.__class__ in _IMMUTABLE:
            self._plain[value] = obj
        return obj

    def _text(self, ev) -> str:
        if self._surrogates:
            hit = _SURROGATE.search(ev.value)
            if hit:
                raise _Refused(f"text holds the lone surrogate \\u{ord(hit.group()):04x}, which is not a "
                               "Unicode character; fix the escape", ev.start_mark)
        return ev.value

    def _anchor(self, ev, obj, size: int, height: int) -> None:
        if ev.anchor in self._anchors:
            raise _Refused(f"found duplicate anchor &{ev.anchor}", ev.start_mark)
        self._anchors[ev.anchor] = (obj, size, height)

    def _alias(self, ev, depth: int):
        if ev.anchor in self._open:
            raise _Refused(f"alias *{ev.anchor} refers to a node that contains it (a recursive structure); "
                           "write the values out", ev.start_mark)
        hit = self._anchors.get(ev.anchor)
        if hit is None:
            raise _Refused(f"found undefined alias *{ev.anchor}", ev.start_mark)
        obj, size, height = hit
        self._expanded += size
        if depth + height > MAX_DEPTH:
            raise _Refused(f"alias *{ev.anchor} nests the document deeper than {MAX_DEPTH} levels", ev.start_mark)
        if depth + height > self._deepest:
            self._deepest = depth + height
        if self._expanded > ALIAS_BASE + ALIAS_RATIO * self._nodes:
            raise _Refused(f"aliases expand to more than {ALIAS_BASE:,} + {ALIAS_RATIO} x the {self._nodes:,} "
                           "nodes written so far (an alias bomb?); write the values out or use fewer aliases",
                           ev.start_mark)
        return obj


def _construct_int(loader, node):
    text = node.value
    if len(text) > MAX_INT_CHARS:
        raise _Refused(f"integer {text[:20]}... has {len(text):,} characters; at most {MAX_INT_CHARS} are "
                       "accepted (a 64-bit value has at most 20 digits)", node.start_mark)
    return SafeConstructor.construct_yaml_int(loader, node)


class _PyLoader(_Builder, Reader, Scanner, Parser, SafeConstructor, Resolver):
    """PyYAML's pure-Python parser and the builder above (for a PyYAML built without libyaml)."""

    def __init__(self, stream):
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._init_builder(check_surrogates=True)


_PyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader = _PyLoader

if CParser is not None:
    class _CLoader(_Builder, CParser, SafeConstructor, Resolver):
        """libyaml's parser (fast; it refuses surrogate escapes itself) and the builder above."""

        def __init__(self, stream):
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._init_builder(check_surrogates=False)

    _CLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    _Loader = _CLoader




def load(path, max_bytes: int | None = None, *, loader_class=None):
    """The manifest's YAML document (mappings as :class:`Located`); InputError names file:line.
    (`loader_class`: the libyaml-based loader by default; tests also run the pure-Python one.)"""
    text = files.read_text(path, max_bytes)
    loader = (loader_class or _Loader)(text)
    try:
        return loader.build_document()
    except _Refused as e:
        raise InputError(e.message, where=f"{path}:{e.mark.line + 1}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        if "nesting depth" in problem:
            # PyYAML >= 6.0.4's own limit (its scanner reads ahead of casedb's depth check): the
            # same refusal, in casedb's words, whichever side sees the depth first
            raise InputError(f"nested deeper than {MAX_DEPTH} levels; a manifest needs far fewer",
                             where=where) from None
        raise InputError(f"YAML syntax error: {problem}; fix the file and import again", where=where) from None
    except RecursionError:  # the depth bound above stops it first; never a traceback
        raise InputError(f"nested too deeply to read (more than {MAX_DEPTH} levels)", where=str(path)) from None
    finally:
        loader.dispose()


def sniff(path: Path, head: str) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")


def variant_name(model: str, path: Path) -> tuple[str, str | None]:
    """(model name, base model) following the `<model>-<backend>.yaml` convention."""
    stem = model_key(path.stem)
    key = model_key(model)
    if stem.startswith(key + "-") and len(stem) > len(key) + 1:
        suffix = path.stem[len(model) + 1:]
        return f"{model}-{suffix}", model
    for suffix in BACKEND_SUFFIXES:
        if stem.endswith("-" + suffix) and key.endswith("-" + suffix):
            return model, model[: -len(suffix) - 1]
    return model, None


def parse(path, *, max_bytes: int | None = None) -> Iterator[ImportRecord]:
    path = Path(path)
    doc = load(path, max_bytes)
    if not isinstance(doc, dict):
        raise InputError("a manifest is a mapping with 'model' and 'cases' (RFC-0186 schema)", where=str(path))
    for k in doc:
        if k not in TOP_KEYS:
            hint = did_you_mean(k, TOP_KEYS)
            raise InputError(f"unknown top-level key {k!r}{' — ' + hint if hint else ''} (allowed: {', '.join(TOP_KEYS)})", where=str(path))
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
    del doc
    for i, case in enumerate(cases):
        cases[i] = None  # each case's mapping is freed once the importer has normalized it
        line = getattr(case, "line", None)
        where = f"{path}:{line}" if line else str(path)
        # a call casedb cannot run is listed; an unsafe op is refused by the case's own checks
        skip = unrunnable.skipped(case.get("op") if isinstance(case, dict) else None, where)
        if skip:
            yield skip
            continue
        yield {"type": "case", "model": name, "case": case, "count": 1, "where": where}


# The line breaks a YAML reader knows (a scalar holding one is written on one line, escaped).
_BREAKS = re.compile("[\n\r\x85\u2028\u2029]")


def yaml_scalar(value) -> str:
    """A one-line YAML scalar that reads back as ``value``: plain where that reads back the same,
    else quoted; text with a line break or a control character double-quoted, every such
    character escaped."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 30)
    text = text.removesuffix("\n").removesuffix("\n...").strip()
    if _BREAKS.search(text):  # a multi-line scalar, or one a reader folds (\x85, U+2028): one line, escaped
        text = yaml.safe_dump(value, default_style='"', allow_unicode=True, width=1 << 30).strip()
    return text
