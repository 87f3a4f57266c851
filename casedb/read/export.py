"""Write a model's cases back out as an RFC-0186 YAML manifest.

What is written re-imports to the same signatures, names, descriptions, marks and tolerances:
defaults go in ``default:``, and a case repeats a dtype, init or tolerance only where it differs
from what the defaults give. ``init: data`` values are written inline; ``file:`` tensors are
written as ``.pt`` files beside the manifest (``<stem>.files/<sha12>.pt``, named by the sha256 of
the blob's bytes, which must equal the DB's key for the blob: never a path taken from the DB), by
:func:`write_tensor_file`, which never writes through a link.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import secrets
import stat
from pathlib import Path
from typing import IO, Callable

import yaml

from casedb.cases import blobs, dtypes, input_specs, marks as marks_mod
from casedb.cases.spec import DEFAULT_KEYS
from casedb.errors import CasedbError
from casedb.escape import yaml_comment
from casedb.store.database import Store
from importers.yaml_manifest import yaml_scalar


class _Flow(dict):
    pass


class _FlowList(list):
    pass


class _Dumper(yaml.SafeDumper):
    pass


# Line breaks YAML rewrites inside block and plain scalars (\r\n -> \n, NEL -> \n ...): text holding
# one is written double-quoted, where every character is escaped exactly.
_BREAKS = re.compile("[\r\x85\u2028\u2029]")


def _str(dumper, s):
    # Text is written so it reads back exactly (names are identities): multi-line text as a
    # literal block (the emitter adds `|-` or `|+` for the final newline, or falls back to
    # double quotes when a block cannot hold it); other line breaks double-quoted.
    if _BREAKS.search(s):
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style='"')
    if "\n" in s:
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", s)


def _float(dumper, f):
    if math.isnan(f):
        return dumper.represent_scalar("tag:yaml.org,2002:float", ".nan")
    if math.isinf(f):
        return dumper.represent_scalar("tag:yaml.org,2002:float", ".inf" if f > 0 else "-.inf")
    text = repr(f)
    if "e" in text and "." not in text.split("e")[0]:
        # PyYAML reads 1e-05 as a string: write 1.0e-05
        mant, exp = text.split("e")
        text = f"{mant}.0e{exp}"
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


_Dumper.add_representer(str, _str)
_Dumper.add_representer(float, _float)
_Dumper.add_representer(_Flow, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v.items(), flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def _flow(v):
    if isinstance(v, dict):
        return _Flow({k: _flow(x) for k, x in v.items()})
    if isinstance(v, list):
        return _FlowList(_flow(x) for x in v)
    return v


class _Writer:
    def __init__(self, store: Store, out_path: Path | None):
        self.store = store
        self.out_path = out_path
        self.written: set = set()  # the tensor files this export wrote (write_tensor_file)

    def tensor(self, t: dict, case_dtype: str) -> dict:
        out = {"shape": list(t["shape"])}
        if t["init"] == "data":
            import torch

            out["init"] = "data"
            values = blob_tensor(self.blob(t["blob"])[0], t["dtype"], t["shape"])
            # Flat (the shape says how to fold it); bools as 0/1: a big mask stays a few lines.
            out["data"] = (values.to(torch.uint8) if t["dtype"] == "bool" else values).reshape(-1).tolist()
        else:
            default_init = ("randn" if t["dtype"] in dtypes.FLOATING or t["dtype"] in dtypes.COMPLEX
                            else "rand" if t["dtype"] == "bool" else "randint")
            if t["init"] != default_init:
                out["init"] = t["init"]
            args = dict(t.get("init_args") or {})
            if t["init"] == "randint" and args.get("low") == 0 and args.get("high") == (2 if t["dtype"] == "bool" else 10):
                args = {}
            if t["init"] == "uniform" and args.get("low") == 0.0 and args.get("high") == 1.0:
                args = {}
            if args:
                out["init_args"] = args
        if t["dtype"] != case_dtype:
            out["dtype"] = dtypes.short(t["dtype"])
        if t.get("device_layout"):
            out["device_layout"] = t["device_layout"]
        if t.get("preset"):
            out["preset"] = t["preset"]
            if t.get("preset_args"):
                out["preset_args"] = t["preset_args"]
        return out

    def input(self, spec: dict, case_dtype: str) -> dict:
        if "tensor" in spec:
            return {"tensor": self.tensor(spec["tensor"], case_dtype)}
        if "tensor_list" in spec:
            return {"tensor_list": [self.tensor(t, case_dtype) for t in spec["tensor_list"]]}
        if "file" in spec:
            return {"file": self.file(spec["file"])}
        if "value" in spec:
            return {"value": _value(spec["value"])}
        return dict(spec)

    def file(self, f: dict) -> str:
        if self.out_path is None:
            raise ValueError("a case has file: inputs; export it with -o FILE so the .pt files can be written beside it")
        data, sha = self.blob(f["blob"])
        # named by the hash of the bytes, never by the DB's key: always a file of this folder
        return write_tensor_file(self.out_path, sha, lambda: blob_tensor(data, f["dtype"], f["shape"]).clone(),
                                 self.written)

    def blob(self, key) -> tuple[bytes, str]:
        """The bytes of blob `key` and their sha256, which must be the key (a DB from elsewhere
        may hold other bytes, or a path, under a key)."""
        data = self.store.load_blob(key)
        sha = hashlib.sha256(data).hexdigest()
        if sha != key:
            raise ValueError(f"blob {str(key)[:80]!r} of the DB does not hold the bytes it names (their sha256 is "
                             f"{sha}): the DB was altered or damaged; export refuses it (re-import the model's "
                             "manifest into a fresh DB)")
        return data, sha


def _value(v):
    # A stored string that a manifest would read as a literal ("None", "1") is written quoted.
    return input_specs.string_spelling(v) if isinstance(v, str) else v


def _files_folder(out_path: Path) -> int:
    """An fd of ``<stem>.files`` beside ``out_path`` (made when missing), never through a link;
    CasedbError when it is a link or not a folder."""
    folder = out_path.parent / f"{out_path.stem}.files"
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder)
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise CasedbError(f"{folder} is {kind}: export writes the tensor files of {out_path.name} only into a real "
                          "folder of that name; move it away (casedb makes the folder) or export to another -o FILE")
    return os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW)


def write_tensor_file(out_path: Path, sha: str, tensor, written: set | None = None) -> str:
    """Write ``tensor()`` (a callable: built only when written) as ``<stem>.files/<sha12>.pt``
    beside ``out_path``; its path relative to ``out_path``'s folder. The file is created new
    (``O_CREAT | O_EXCL | O_NOFOLLOW``) under a temporary name and renamed into place, so whatever
    was planted under the name (a link, another file) is replaced, never written through; names in
    ``written`` (this export's own) are not written again."""
    import torch

    name = f"{sha[:12]}.pt"
    rel = str(Path(f"{out_path.stem}.files") / name)
    if written is not None and name in written:
        return rel
    folder = _files_folder(out_path)
    try:
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666,
                     dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(tensor(), f)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)
    if written is not None:
        written.add(name)
    return rel


def blob_tensor(data: bytes, dtype: str, shape: list[int]):
    """The tensor stored in a blob (see :mod:`casedb.cases.blobs`)."""
    from casedb.cases.materialize import torch_dtype

    return blobs.decode(data, shape, torch_dtype(dtype))


def manifest(store: Store, model: str, out_path: Path | None = None,
             keep: Callable[[dict], bool] | None = None) -> dict:
    """The manifest of `model` as a Python structure ready for YAML (only the occurrences `keep` keeps)."""
    m = store.model(model)
    defaults = {k: v for k, v in (store.models_defaults(m["name"]) or {}).items()}
    writer = _Writer(store, out_path)
    doc: dict = {"model": m["name"]}
    for k in ("description", "family", "variant_of"):
        if m.get(k):
            doc[k] = m[k]
    if defaults:
        doc["default"] = {k: (dtypes.short(defaults[k]) if k == "dtype" else defaults[k])
                          for k in DEFAULT_KEYS if k in defaults}
    cases = []
    for occ in store.occurrences([m["name"]], markexpr=""):
        if keep is not None and not keep(occ):
            continue
        case_dtype = occ["declared_dtype"] or defaults.get("dtype") or "float32"
        c: dict = {"name": occ["name"], "op": occ["op"]}
        if occ["attrs"]:
            c["attrs"] = _flow({k: (writer.input(v, case_dtype) if isinstance(v, dict) and len(v) == 1
                                    and next(iter(v)) in input_specs.INPUT_KINDS else _value(v))
                                for k, v in occ["attrs"].items()})
        c["inputs"] = [_flow(writer.input(s, case_dtype)) for s in occ["inputs"]]
        if occ["description"]:
            c["description"] = occ["description"]
        if occ["expects_error"]:
            c["expects_error"] = _flow(occ["expects_error"])
        own = occ["own_marks"] or []
        derived = occ["derived_marks"] or []
        all_marks = derived + [x for x in own if x not in derived]
        if all_marks:
            c["marks"] = _FlowList(all_marks)
        if occ["skip_if"]:
            c["skip_if"] = [dict(s) for s in occ["skip_if"]]
        if occ["xfail"]:
            c["xfail_if"] = occ["xfail"]["expr"]
            c["xfail_reason"] = occ["xfail"]["reason"]
            if occ["xfail"].get("strict") is False:
                c["xfail_strict"] = False
        if occ["declared_dtype"]:
            c["dtype"] = dtypes.short(occ["declared_dtype"])
        if occ["seed"] is not None:
            c["seed"] = occ["seed"]
        if occ["count"] and occ["count"] > 1:
            c["count"] = occ["count"]
        for k in ("rtol", "atol"):  # the case's own tolerance; the rest follows from the defaults
            if occ[k] is not None:
                c[k] = occ[k]
        cases.append(c)
    doc["cases"] = cases
    return doc


def write_yaml(store: Store, model: str, out: IO[str], out_path: Path | None = None,
               keep: Callable[[dict], bool] | None = None, note: str = "") -> int:
    doc = manifest(store, model, out_path, keep)
    # the name is data: written as a YAML scalar, and nothing in it can end the comment
    header = (f"casedb manifest for {yaml_scalar(doc['model'])} ({len(doc['cases'])} cases), RFC-0186 schema.\n"
              f"Derived marks ({', '.join(marks_mod.DERIVED)}) are recomputed on import." + note)
    out.writelines(yaml_comment(header, width=None))
    yaml.dump(doc, out, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
    return len(doc["cases"])


def write_oplog(store: Store, model: str, out: IO[str], out_path: Path | None = None,
                skipped: list | None = None) -> int:
    """Write a model's cases in PyTorch's operator_inp_logs format.

    Cases the format cannot express (e.g. `torch.add`, which has no aten overload) are appended
    to `skipped` as {case, op, reason}."""
    from importers import oplog

    m = store.model(model)
    occurrences = store.occurrences([m["name"]], markexpr="")
    return oplog.write(occurrences, out, skipped=skipped if skipped is not None else [])


def write_file(path: Path, write: Callable[[IO[str], Path], int]) -> int:
    """Call ``write(file, path)`` (a writer of one format, returning how many cases it wrote) on a
    file beside ``path`` renamed into place: an unknown model or a failing case leaves a file
    already there as it was."""
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            n = write(f, path)
        # mkstemp makes the file 0600: give it the mode a new file gets (0666 less the umask)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return n
