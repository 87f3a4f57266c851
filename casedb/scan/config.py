"""A model's ``config.json`` as a scan reads it: untrusted input, checked before transformers sees it.

:func:`check` reads the file (a regular file of at most :data:`MAX_CONFIG_BYTES`; a folder means
its ``config.json``) and refuses, naming the key:

* ``auto_map`` anywhere: it names Python code shipped with the config, which transformers would
  offer to run (``trust_remote_code``); casedb never runs a config's code, and a scan of the class
  transformers ships would not be the model that code makes. The scan also passes
  ``trust_remote_code=False`` and reads nothing from stdin.
* sizes no real model has, which would build for minutes and gigabytes even on the meta device
  (a 195-byte config with 10⁶ layers): more than :data:`MAX_LAYERS` layers, :data:`MAX_EXPERTS`
  experts, or a width (hidden, intermediate, head, vocabulary ... size) over :data:`MAX_WIDTH`.

:func:`check_parameters` bounds the built model's parameter count (on the meta device: nothing
allocated) by :data:`MAX_PARAMETERS`, naming the largest sizes of the config.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from casedb.errors import InputError

MAX_CONFIG_BYTES = 4 << 20          # real configs are a few KB (a long id2label: a few hundred)
MAX_LAYERS = 1024                   # the largest models have ~130
MAX_EXPERTS = 4096                  # ~400
MAX_WIDTH = 1 << 20                 # vocabularies ~260k, hidden sizes ~16k, intermediate ~53k
MAX_PARAMETERS = 10 ** 13           # the largest models have ~2 x 10^12
_BOUNDS = (  # (key pattern, bound, what it bounds)
    (re.compile(r"layers?$"), MAX_LAYERS, "layers"),
    (re.compile(r"experts?$"), MAX_EXPERTS, "experts"),
    (re.compile(r"(size|dim|heads?|embd|d_model|d_state|d_conv|d_head|channels)$"), MAX_WIDTH,
     "per size (hidden, intermediate, head, vocabulary ...)"),
)


class ScanError(InputError):
    """A recipe, config or model that cannot be scanned, with what to do about it."""


def path_of(config: Path) -> Path:
    """The config file of a recipe's ``config:`` (a folder holds ``config.json``)."""
    config = Path(config)
    return config / "config.json" if config.is_dir() else config


def check(config: Path) -> dict:
    """The config's JSON, checked as the module docstring says; raises ScanError."""
    from casedb import files

    path = path_of(config)
    where = str(path)
    try:
        doc = json.loads(files.read_text(path, MAX_CONFIG_BYTES))
    except InputError as e:
        raise ScanError(e.message, where=where) from None
    except (OSError, ValueError, RecursionError) as e:
        raise ScanError(f"cannot read config: {type(e).__name__}: {e}", where=where) from None
    if not isinstance(doc, dict):
        raise ScanError("a config.json is a JSON object of the model's settings", where=where)
    try:
        items = list(_items(doc))
    except RecursionError:
        raise ScanError("nested too deeply to read; a config nests a few levels", where=where) from None
    for key, value in items:
        if key.rsplit(".", 1)[-1] == "auto_map":
            raise ScanError(f"{key} names code shipped with the config ({_short(value)}); casedb never runs a "
                              "config's code (transformers' trust_remote_code): scan a model transformers implements, "
                              "with its config without auto_map", where=where)
        if isinstance(value, int) and not isinstance(value, bool):
            _check_size(key, value, where)
    return doc


def check_parameters(model, doc: dict, where: str) -> None:
    """Refuse a built (meta) model of more than MAX_PARAMETERS parameters."""
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMETERS:
        sizes = sorted(((v, k) for k, v in _items(doc) if isinstance(v, int) and not isinstance(v, bool)
                        and any(p.search(k) for p, _, _ in _BOUNDS)), reverse=True)[:4]
        raise ScanError(f"the model has {n:.3g} parameters, more than {MAX_PARAMETERS:.0e} (the largest real models "
                          f"have ~2e12); its largest sizes: {', '.join(f'{k}={v}' for v, k in sizes)}", where=where)


def _check_size(key: str, value: int, where: str) -> None:
    leaf = key.rsplit(".", 1)[-1]
    for pattern, bound, what in _BOUNDS:
        if pattern.search(leaf):
            if value > bound:
                raise ScanError(f"{key} is {value:,}; casedb scans models of at most {bound:,} {what}: no real "
                                  "model is that big, and building it would take minutes and gigabytes even on the "
                                  "meta device; fix the config", where=where)
            return


def _items(doc: dict, prefix: str = ""):
    """(dotted key, value) of every entry, nested configs (text_config.hidden_size) included."""
    for k, v in doc.items():
        key = f"{prefix}{k}"
        yield key, v
        if isinstance(v, dict):
            yield from _items(v, key + ".")


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 120 else text[:117] + "..."
