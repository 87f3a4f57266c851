"""Model scanner: the operators a real model calls, with the real shapes it calls them with.

A scan builds a target model at full size from its architecture config on PyTorch's meta
device (no weights, no memory for them), runs one inference forward pass per phase and records
every operator call under a PyTorch mode:

* ``level="torch"`` — :class:`~torch.overrides.TorchFunctionMode`: what the model code calls
  (``torch.nn.functional.linear``, ``torch.Tensor.mul``, ``torch.getitem`` ...), the RFC's level.
* ``level="aten"`` — :class:`~torch.utils._python_dispatch.TorchDispatchMode`: overload-precise
  ATen ops (``torch.ops.aten.mm.default``), the level of PyTorch's operator logs.

Phases: ``prefill`` is a forward over the whole prompt (with images / audio for the multimodal
models); ``decode`` is one generated token (sequence length 1) on top of the KV / SSM cache
that the prefill left. Both use ``logits_to_keep=1`` as ``generate`` does.

Paths: a recipe's ``matrix`` names the runtime choices a deployment varies — the KV cache
(``dynamic`` / ``static``), the attention implementation (``sdpa`` / ``eager``), the expert
implementation (``grouped_mm`` / ``batched_mm``, which generate runs for decode steps only /
``eager``) and forward inputs (``batch`` > 1
means left-padded prompts with an attention mask; ``seq_len`` / ``text_len``). Every combination
of the ``matrix`` axes is one path, and each value of an ``alone`` axis is one more path on the
default one (the first value of every axis). A scan runs every path (or one) and writes the union:
each record lists the ``paths`` that produced it (also the ``Paths:`` line of its description)
and its ``count`` is the most calls any one path made.

Control tensors (token ids, image sizes, audio masks) stay real CPU tensors so that the model's
Python control flow and masks see real values; everything derived from weights is meta. Where a
control tensor meets meta tensors in an op that needs one device (a padding mask read at meta
positions, ``index_add_`` with a real index), it joins them on meta for that op. On the
eager-experts path the router's top-k indices are real — an even routing — so that the
per-expert loop, whose trip count and token lists depend on them, can run.

Dropped (counted in the header's ``dropped``, never recorded):

* ``no tensor result`` — calls that return no tensor: metadata queries (``size``, ``dim``,
  ``stride``, ``is_contiguous``, ``prim.device``, ``aten.sym_size``), scalar reads (``item``,
  ``tolist``, ``__bool__``), grad-mode switches. ``Tensor.__setitem__`` is kept (it computes in place).
* ``attribute read`` — tensor properties (``.shape``, ``.dtype``, ``.device``, ``.T`` ...).
* ``no-op conversion`` — ``to``/``type_as``/``contiguous``/``float``... that return their input
  unchanged (same dtype, device move only).
* ``uninitialized allocation`` — ``empty``, ``empty_like``, ``new_empty``, ``empty_strided``:
  their values are undefined, so no reference comparison can be made.
* ``alias`` — ``detach``, ``aten.alias``, ``aten.lift_fresh``: a new name for the same data.
* ``torch internal`` — private Tensor methods that torch's own helpers call on the model's
  behalf (``Tensor._is_all_true`` inside ``torch._check``).

Calls the case schema cannot represent (an index mixing tensors and slices, an opaque object
argument) become ``skipped`` records with the reason; the importer counts and lists them.

Each unique call — op, inputs, keyword arguments and the model source line that made it — is
one record with its ``count``. Value-sensitive inputs (indices, offsets, masks) get their
``init`` from :mod:`casedb.cases.valid_inputs`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import linecache
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from casedb.cases import dtypes, valid_inputs
from casedb.scan import config as scan_config
from casedb.scan.config import ScanError

SCAN_FORMAT = 1
LEVELS = ("torch", "aten")
PHASES = ("prefill", "decode")
RECIPE_DIR = Path(__file__).resolve().parents[2] / "manifests" / "scan"
RECIPE_KEYS = ("model", "description", "variant_of", "config", "arch", "dtype", "defaults", "inputs", "matrix",
               "alone")
# Runtime axes of a path and their values (the first: what the model picks when nothing is asked).
RUNTIME_AXES = {
    "cache": ("dynamic", "static"),
    "attention": ("sdpa", "eager"),
    "experts": ("grouped_mm", "batched_mm", "eager"),
}
# A static cache is allocated for the prompt plus this many new tokens (generate's max_length).
STATIC_CACHE_ROOM = 64
# Expert implementations generate runs for the decode steps only, on top of a grouped_mm prefill
# (GenerationMixin._optimize_model_for_decode on an accelerator): batched_mm copies each routed
# token's expert weights, a few MB per token in decode but tens of GB for a prompt.
DECODE_EXPERTS = {"batched_mm": "grouped_mm"}
# Forward-input keys each kind of model takes (see _prefill_inputs); values are the defaults
# used when scanning a bare config.json.
INPUT_DEFAULTS = {
    "causal_lm": {"batch": 1, "seq_len": 256},
    "llava_next": {"batch": 1, "text_len": 32, "image_size": [768, 768]},
    "granite_speech": {"batch": 1, "text_len": 32, "audio_frames": 500},
}
# Real values of a CPU (control) tensor are kept for the valid_inputs rules that read them
# (valid_inputs.wants_values) when it is at most this big.
MAX_CAPTURED_VALUES = 8192


# ----------------------------------------------------------------------------------- recipes

@dataclass
class Recipe:
    """What to scan: a model name, its architecture config and class, and the forward inputs."""

    model: str
    config: Path
    arch: str
    inputs: dict
    dtype: str = "bf16"
    description: str | None = None
    variant_of: str | None = None
    defaults: dict = field(default_factory=dict)
    source: str | None = None
    declared_inputs: tuple = ()  # the input keys the recipe itself sets (the rest are defaults)
    matrix: dict = field(default_factory=dict)
    alone: dict = field(default_factory=dict)

    def paths(self) -> list["ScanPath"]:
        """Every path of the recipe, the default one first (one ``default`` path without a matrix)."""
        if not self.matrix and not self.alone:
            return [ScanPath("default", inputs=dict(self.inputs))]
        axes = {**self.matrix, **self.alone}
        first = {axis: values[0] for axis, values in axes.items()}
        combos = [dict(zip(self.matrix, values)) for values in itertools.product(*self.matrix.values())]
        combos = [{**first, **c} for c in combos]
        for axis, values in self.alone.items():
            combos += [{**first, axis: v} for v in values[1:]]
        return [_path(self, c) for c in combos]

    @property
    def kind(self) -> str:
        if self.arch.endswith("ForCausalLM"):
            return "causal_lm"
        if self.arch == "LlavaNextForConditionalGeneration":
            return "llava_next"
        if self.arch == "GraniteSpeechForConditionalGeneration":
            return "granite_speech"
        raise ScanError(
            f"no input builder for architecture {self.arch!r}; supported: *ForCausalLM, "
            "LlavaNextForConditionalGeneration, GraniteSpeechForConditionalGeneration",
            where=self.source,
        )


def recipe_names() -> list[str]:
    """Names of the recipes shipped under manifests/scan/."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def load_recipe(model: str | Path, arch: str | None = None) -> Recipe:
    """A recipe by name (``granite4h``), by path to its YAML, or a bare ``config.json`` + ``arch``."""
    path = Path(model)
    if path.suffix == ".json":
        return _recipe_from_config(path, arch)
    if path.suffix in (".yaml", ".yml"):
        recipe_path = path
    else:
        recipe_path = RECIPE_DIR / f"{model}.yaml"
        if not recipe_path.exists():
            raise ScanError(
                f"unknown model {str(model)!r}; known recipes: {', '.join(recipe_names()) or '(none)'} "
                "(or give a path to a recipe .yaml, or to a config.json with --arch)"
            )
    return _read_recipe(recipe_path, arch)


def _read_recipe(path: Path, arch: str | None) -> Recipe:
    import yaml

    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ScanError(f"cannot read recipe: {e}", where=where) from None
    if not isinstance(doc, dict):
        raise ScanError("a scan recipe is a mapping with model, config, arch and inputs", where=where)
    unknown = sorted(set(doc) - set(RECIPE_KEYS))
    if unknown:
        raise ScanError(f"unknown recipe key(s) {', '.join(unknown)}; allowed: {', '.join(RECIPE_KEYS)}", where=where)
    missing = [k for k in ("model", "config", "arch") if not doc.get(k)]
    if missing:
        raise ScanError(f"recipe needs {', '.join(missing)}", where=where)
    config = Path(doc["config"])
    if not config.is_absolute():
        config = path.parent / config
    recipe = Recipe(
        model=str(doc["model"]), config=config, arch=arch or str(doc["arch"]),
        inputs=dict(doc.get("inputs") or {}), dtype=str(doc.get("dtype") or "bf16"),
        description=doc.get("description"), variant_of=doc.get("variant_of"),
        defaults=dict(doc.get("defaults") or {}), source=_display_path(path),
    )
    _check_inputs(recipe)
    recipe.matrix = _axes(recipe, doc.get("matrix"), "matrix")
    recipe.alone = _axes(recipe, doc.get("alone"), "alone")
    both = sorted(set(recipe.matrix) & set(recipe.alone))
    if both:
        raise ScanError(f"axis {', '.join(both)} is in both matrix and alone; keep it in one", where=recipe.source)
    return recipe


def _recipe_from_config(path: Path, arch: str | None) -> Recipe:
    if not path.exists():
        raise ScanError("config file not found", where=str(path))
    if not arch:
        arch = (scan_config.check(path).get("architectures") or [None])[0]
        if not arch or not isinstance(arch, str):
            raise ScanError("config.json has no 'architectures'; give the model class with --arch", where=str(path))
    recipe = Recipe(model=path.stem, config=path, arch=arch, inputs={}, source=_display_path(path))
    recipe.inputs = dict(INPUT_DEFAULTS[recipe.kind])
    return recipe


def _check_inputs(recipe: Recipe) -> None:
    allowed = INPUT_DEFAULTS[recipe.kind]
    recipe.declared_inputs = tuple(recipe.inputs)
    unknown = sorted(set(recipe.inputs) - set(allowed))
    if unknown:
        raise ScanError(
            f"inputs {', '.join(unknown)} do not apply to {recipe.arch}; it takes: {', '.join(allowed)}",
            where=recipe.source,
        )
    recipe.inputs = {**allowed, **recipe.inputs}
    try:
        dtypes.canonical(recipe.dtype)
    except dtypes.UnknownDtype as e:
        raise ScanError(str(e), where=recipe.source) from None


def _axes(recipe: Recipe, doc, key: str) -> dict:
    """The axes of a recipe's ``matrix`` / ``alone``: {axis: [values]}, checked."""
    if doc is None:
        return {}
    where = f"{recipe.source}: {key}"
    if not isinstance(doc, dict):
        raise ScanError(f"{key} is a mapping of axis -> list of values", where=where)
    axes = {}
    for axis, values in doc.items():
        if not isinstance(values, list) or not values:
            raise ScanError(f"axis {axis!r} needs a non-empty list of values", where=where)
        if axis in RUNTIME_AXES:
            bad = [v for v in values if v not in RUNTIME_AXES[axis]]
            if bad:
                raise ScanError(f"{axis}: unknown value(s) {', '.join(map(str, bad))}; choose from "
                                f"{', '.join(RUNTIME_AXES[axis])}", where=where)
        elif axis in recipe.inputs:
            for v in values:
                _check_input_value(axis, v, where)
            declared = recipe.inputs[axis]
            if axis in recipe.declared_inputs and declared != values[0]:
                raise ScanError(f"inputs.{axis} is {declared!r} but the {axis} axis starts with {values[0]!r}: "
                                "the first value of an axis is the default path's; drop it from inputs",
                                where=where)
        else:
            raise ScanError(f"unknown axis {axis!r}; axes: {', '.join(RUNTIME_AXES)} or an input of "
                            f"{recipe.arch} ({', '.join(recipe.inputs)})", where=where)
        if len({json.dumps(v) for v in values}) != len(values):
            raise ScanError(f"axis {axis!r} repeats a value", where=where)
        axes[axis] = list(values)
    return axes


def _check_input_value(axis: str, value, where: str) -> None:
    ok = (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)
          if axis == "image_size" else isinstance(value, int) and not isinstance(value, bool) and value > 0)
    if not ok:
        raise ScanError(f"{axis}: {value!r} is not a valid value "
                        f"({'[height, width]' if axis == 'image_size' else 'a positive integer'})", where=where)


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# -------------------------------------------------------------------------------------- paths

@dataclass(frozen=True)
class ScanPath:
    """One way through the model: runtime choices and forward inputs (None: the model's default)."""

    name: str
    cache: str = "dynamic"
    attention: str | None = None
    experts: str | None = None
    inputs: dict = field(default_factory=dict, hash=False)
    axes: dict = field(default_factory=dict, hash=False)  # the value of each axis the recipe declares

    def settings(self) -> dict:
        return {"name": self.name, "axes": self.axes, "cache": self.cache, "attention": self.attention,
                "experts": self.experts, "inputs": self.inputs}


_INPUT_PARTS = {"batch": "b", "seq_len": "s", "text_len": "t", "audio_frames": "a", "image_size": "i"}


def _path(recipe: Recipe, values: dict) -> ScanPath:
    """The path of one combination of axis values; its name spells every declared axis' value."""
    parts = [values[a] for a in RUNTIME_AXES if a in values]
    inputs = dict(recipe.inputs)
    for key in recipe.inputs:
        if key in values:
            inputs[key] = values[key]
            v = values[key]
            parts.append(_INPUT_PARTS[key] + ("x".join(map(str, v)) if isinstance(v, list) else str(v)))
    return ScanPath("-".join(parts), cache=values.get("cache", "dynamic"), attention=values.get("attention"),
                    experts=values.get("experts"), inputs=inputs, axes=dict(values))


# ------------------------------------------------------------------------------------ results

@dataclass
class ScanResult:
    header: dict
    records: list[dict]
    seconds: float

    @property
    def cases(self) -> list[dict]:
        return [r for r in self.records if r["type"] == "case"]

    def write(self, path: str | Path) -> Path:
        """Write the scan JSONL: the header line, then one record per unique call."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.header) + "\n")
            for rec in self.records:
                f.write(json.dumps(rec) + "\n")
        return path

    def summary(self) -> dict:
        kinds = Counter(r["type"] for r in self.records)
        out = {"model": self.header["model"], "level": self.header["level"], "phase": self.header["phase"],
               "unique_calls": kinds["case"], "skipped": kinds["skipped"], "calls": self.header["calls"],
               "ops": len({r["case"]["op"] for r in self.cases}), "seconds": round(self.seconds, 2)}
        if "path_stats" in self.header:
            out["paths"] = self.header["path_stats"]
        return out


# ------------------------------------------------------------------------------- command

DEFAULT_OUT_DIR = Path("data") / "scans"


def scan_command(model: str, *, output: str | Path | None = None, level: str = "torch", phases=PHASES,
                 arch: str | None = None, store=None, path: str | None = None, report: bool = False) -> dict:
    """What ``casedb scan`` does: scan (every path of the recipe, or ``path``), write the scan JSONL
    (to ``output``, default ``data/scans/<model>-<level>.jsonl``) and, given an open ``store``,
    import that file.

    Returns a summary dict (unique calls, ops, seconds, per-path figures, the file, the import
    report, and with ``report`` the coverage report of :mod:`casedb.scan.report`).
    """
    result = scan(model, level=level, phases=phases, arch=arch, path=path)
    out = Path(output) if output else DEFAULT_OUT_DIR / f"{result.header['model']}-{level}.jsonl"
    result.write(out)
    summary = {**result.summary(), "output": str(out), "dropped": result.header["dropped"]}
    if store is not None:
        from casedb.ingest.save import import_paths

        summary["import"] = import_paths(store, [out]).totals()
    if report:
        from casedb.scan.report import coverage

        summary["report"] = coverage(result)
    return summary


# ---------------------------------------------------------------------------------- scanning

def scan(recipe: Recipe | str | Path, *, level: str = "torch", phases=PHASES, arch: str | None = None,
         path: str | None = None) -> ScanResult:
    """Scan a model (a Recipe, a recipe name or path, or a config.json) along every path of its
    recipe (or the one named ``path``) and return the union of the records."""
    started = time.perf_counter()
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, arch)
    if level not in LEVELS:
        raise ScanError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")
    phases = tuple(phases)
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise ScanError(f"unknown phase {', '.join(bad) or '(none)'}; choose from {', '.join(PHASES)}")
    paths = recipe.paths()
    if path is not None:
        chosen = [p for p in paths if p.name == path]
        if not chosen:
            raise ScanError(f"{recipe.model} has no path {path!r}; its paths: {', '.join(p.name for p in paths)}",
                            where=recipe.source)
        paths = chosen
    doc = scan_config.check(recipe.config)  # before transformers reads it

    import transformers

    models: dict = {}
    runs = []
    for p in paths:
        path_started = time.perf_counter()
        key = (p.attention, p.experts)
        if key not in models:
            models[key] = _build(recipe, p, doc)
        model = models[key]
        # The eager experts loop over the experts a routing hits: it needs real routing values.
        recorder = _Recorder(level, recipe.model, balanced_routing=p.experts == "eager")
        with torch.no_grad():
            prefill = _prefill_inputs(recipe, model, p)
            with _experts(model, DECODE_EXPERTS.get(p.experts)):
                out = _forward(model, prefill, recorder, record="prefill" in phases, path=p)
            if "decode" in phases:
                _forward(model, _decode_inputs(recipe, model, out, p, prefill), recorder, record=True, path=p)
        runs.append((p, recorder, time.perf_counter() - path_started))
    model = models[(paths[0].attention, paths[0].experts)]
    provenance = bool(recipe.matrix or recipe.alone)
    dropped: Counter = Counter()
    for _, recorder, _ in runs:
        dropped.update(recorder.dropped)
    header = {
        "casedb_scan": SCAN_FORMAT, "model": recipe.model, "level": level, "phase": "+".join(phases),
        "recipe": recipe.source, "torch": torch.__version__, "transformers": transformers.__version__,
        "arch": recipe.arch, "config": _display_path(recipe.config), "family": model.config.model_type,
        "variant_of": recipe.variant_of, "description": recipe.description,
        "defaults": recipe.defaults or {"dtype": dtypes.short(dtypes.canonical(recipe.dtype))},
        "inputs": paths[0].inputs, "calls": sum(r.calls for _, r, _ in runs), "dropped": dict(dropped),
    }
    if provenance:
        header["paths"] = [p.settings() for p in paths]
        header["path_stats"] = [_path_stats(p, r, seconds) for p, r, seconds in runs]
    records = _union([(p.name, r.records()) for p, r, _ in runs], provenance)
    return ScanResult(header=header, records=records, seconds=time.perf_counter() - started)


def _path_stats(p: "ScanPath", recorder: "_Recorder", seconds: float) -> dict:
    cases = [r for r in recorder.records() if r["type"] == "case"]
    return {"path": p.name, "calls": recorder.calls, "unique_calls": len(cases),
            "ops": len({r["case"]["op"] for r in cases}), "seconds": round(seconds, 2)}


def record_key(rec: dict) -> str:
    """What makes a record one unique call: op, inputs, keyword arguments and the source line."""
    if rec["type"] == "case":
        case = rec["case"]
        return json.dumps([case["op"], case.get("inputs"), case.get("attrs"), rec.get("where")], sort_keys=True)
    return json.dumps([rec.get("where"), rec.get("op"), rec.get("reason")], sort_keys=True)


def _union(runs: list[tuple[str, list[dict]]], provenance: bool) -> list[dict]:
    """One record per unique call across the paths, in first-seen order; ``count``: the most calls
    one path made; with ``provenance``, the ``paths`` that made it (also in the description)."""
    if not provenance:
        return [rec for _, records in runs for rec in records]
    merged: dict[str, dict] = {}
    for name, records in runs:
        for rec in records:
            key = record_key(rec)
            seen = merged.get(key)
            if seen is None:
                seen = merged[key] = {**rec, "case": dict(rec["case"])} if rec["type"] == "case" else dict(rec)
                seen["paths"] = []
            seen["count"] = max(seen["count"], rec["count"])
            seen["paths"].append(name)
    for rec in merged.values():
        if rec["type"] == "case":
            rec["case"]["description"] += "\nPaths: " + ", ".join(rec["paths"])
    return list(merged.values())


def _build(recipe: Recipe, path: "ScanPath | None" = None, doc: dict | None = None):
    """The model at full size on the meta device, in eval mode, in the recipe's dtype, with the
    path's attention and expert implementations. No code of the config runs (trust_remote_code
    is off, stdin closed to any prompt) and the model's size is bounded (casedb.scan.config)."""
    import transformers

    transformers.logging.set_verbosity_error()
    doc = scan_config.check(recipe.config) if doc is None else doc
    try:
        with _no_stdin():
            config = transformers.AutoConfig.from_pretrained(str(recipe.config), trust_remote_code=False)
    except (OSError, ValueError, KeyError) as e:
        raise ScanError(f"cannot load the config with transformers {transformers.__version__}: {e}",
                        where=str(recipe.config)) from None
    # mxfp4 quantization needs kernels and real weights; on the meta device it would change nothing.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    cls = _model_class(recipe)
    dtype = getattr(torch, dtypes.canonical(recipe.dtype))
    kwargs = {}
    if path is not None and path.attention:
        kwargs["attn_implementation"] = path.attention
    if path is not None and path.experts:
        if not cls._can_set_experts_implementation():
            raise ScanError(f"{recipe.arch} has no expert implementations to choose from; drop the experts axis",
                            where=recipe.source)
        kwargs["experts_implementation"] = path.experts
    try:
        with torch.device("meta"), _no_stdin():
            # what the Auto classes' from_config calls: sets the dtype and attention implementation
            model = cls._from_config(config, dtype=dtype, **kwargs)
    except (ValueError, ImportError) as e:
        raise ScanError(f"path {path.name}: {e}" if path else str(e), where=recipe.source) from None
    scan_config.check_parameters(model, doc, str(scan_config.path_of(recipe.config)))
    return model.eval()


def _model_class(recipe: Recipe):
    """The transformers model class the recipe names (an Auto class or a helper is not one)."""
    import transformers

    try:
        cls = getattr(transformers, recipe.arch, None)
    except Exception:  # transformers' lazy module raises what a failed import of the name raised
        cls = None
    if cls is None:
        raise ScanError(f"transformers {transformers.__version__} has no model class {recipe.arch!r}; "
                        "fix 'arch' in the recipe (or --arch)", where=recipe.source)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise ScanError(f"{recipe.arch!r} is not a model class (an Auto class picks one from a config; a scan builds "
                        "the class itself): give the model's own class, e.g. LlamaForCausalLM, in 'arch' (or --arch) "
                        "or the config's architectures", where=recipe.source)
    return cls


@contextlib.contextmanager
def _no_stdin():
    """stdin at end of file while transformers runs: nothing it asks (run the config's code?) is
    ever answered from casedb's stdin."""
    saved = sys.stdin
    with open(os.devnull, encoding="utf-8") as empty:
        sys.stdin = empty
        try:
            yield
        finally:
            sys.stdin = saved


@contextlib.contextmanager
def _experts(model, implementation: str | None):
    """The model runs with this expert implementation inside the block (None: as built)."""
    if implementation is None:
        yield
        return
    built = model.get_experts_implementation()
    model.set_experts_implementation(implementation)
    try:
        yield
    finally:
        model.set_experts_implementation(built)


def _forward(model, kwargs: dict, recorder: "_Recorder", record: bool, path: "ScanPath | None" = None):
    recorder.recording = record
    try:
        with recorder.modes():
            return model(**kwargs)
    except ScanError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        on = f" on path {path.name}" if path is not None and path.name != "default" else ""
        raise ScanError(
            f"the forward pass of {type(model).__name__} failed on the meta device{on}: {type(e).__name__}: {e}"
            f" (at {recorder.last_site or 'unknown location'})"
        ) from e
    finally:
        recorder.recording = False


# ------------------------------------------------------------------------------ forward inputs

def _ids(batch: int, length: int, vocab: int, fill_from: int = 1):
    """Deterministic, in-vocabulary token ids (values only matter for placeholder tokens)."""
    return (torch.arange(batch * length).reshape(batch, length) * 7919 + fill_from) % vocab


def _padding(batch: int, length: int) -> list[int]:
    """Left-padding per row of a batch: the first prompt is the longest, the others are a quarter
    shorter (what a tokenizer gives for prompts of different lengths)."""
    return [0] + [max(1, length // 4)] * (batch - 1)


def _pad_id(config, vocab: int) -> int:
    pad = getattr(config, "pad_token_id", None)
    return pad if isinstance(pad, int) and 0 <= pad < vocab else 0


def _prefill_inputs(recipe: Recipe, model, path: "ScanPath | None" = None) -> dict:
    inp = path.inputs if path is not None else recipe.inputs
    batch = int(inp["batch"])
    common = {"use_cache": True, "logits_to_keep": 1}
    text_config = model.config.get_text_config(decoder=True)
    if recipe.kind == "causal_lm":
        length = int(inp["seq_len"])
        input_ids = _ids(batch, length, model.config.vocab_size)
        pads = _padding(batch, length)
        for row, pad in enumerate(pads):
            input_ids[row, :pad] = _pad_id(text_config, model.config.vocab_size)
        return {"input_ids": input_ids, **_mask_and_cache(model, pads, length, path), **common}
    text_vocab = model.config.text_config.vocab_size
    text_len = int(inp["text_len"])
    pads = _padding(batch, text_len)
    if recipe.kind == "llava_next":
        cfg = model.config
        height, width = (int(x) for x in inp["image_size"])
        image_sizes = torch.tensor([[height, width]] * batch)
        patches, num_tokens = _llava_image_tokens(model, height, width)
        size = cfg.vision_config.image_size
        input_ids = _with_placeholders(_ids(batch, text_len, min(text_vocab, cfg.image_token_index)), num_tokens,
                                       cfg.image_token_index, pads, _pad_id(text_config, text_vocab))
        pixel_values = torch.empty(batch, patches, 3, size, size, dtype=model.dtype, device="meta")
        return {"input_ids": input_ids, "pixel_values": pixel_values, "image_sizes": image_sizes,
                **_mask_and_cache(model, pads, input_ids.shape[1], path), **common}
    # granite_speech: input_features are stacked log-mel frames (2 x 80 mels); the projector turns
    # each window of `window_size` frames into window_size // downsample_rate audio tokens.
    cfg = model.config
    frames = int(inp["audio_frames"])
    num_tokens = math.ceil(frames / cfg.window_size) * (cfg.window_size // cfg.downsample_rate)
    input_ids = _with_placeholders(_ids(batch, text_len, min(text_vocab, cfg.audio_token_index)), num_tokens,
                                   cfg.audio_token_index, pads, _pad_id(text_config, text_vocab))
    features = torch.empty(batch, frames, cfg.encoder_config.input_dim, dtype=model.dtype, device="meta")
    mask = torch.ones(batch, num_tokens, dtype=torch.bool)
    return {"input_ids": input_ids, "input_features": features, "input_features_mask": mask,
            **_mask_and_cache(model, pads, input_ids.shape[1], path), **common}


def _with_placeholders(ids, num_tokens: int, token: int, pads: list[int], pad_id: int):
    """Each row: its left padding, the first text token, the placeholders, the rest of its text."""
    rows = []
    for row, pad in enumerate(pads):
        text = ids[row, :ids.shape[1] - pad]
        rows.append(torch.cat([torch.full((pad,), pad_id), text[:1], torch.full((num_tokens,), token), text[1:]]))
    return torch.stack(rows)


def _mask_and_cache(model, pads: list[int], length: int, path: "ScanPath | None") -> dict:
    """The attention mask of a padded batch, and the static cache a static path pre-allocates."""
    extra = {}
    if any(pads):
        mask = torch.ones(len(pads), length, dtype=torch.long)
        for row, pad in enumerate(pads):
            mask[row, :pad] = 0
        extra["attention_mask"] = mask
    if path is not None and path.cache == "static":
        from transformers import StaticCache

        extra["past_key_values"] = StaticCache(config=model.config.get_text_config(decoder=True),
                                               max_cache_len=length + STATIC_CACHE_ROOM)
    return extra


def _llava_image_tokens(model, height: int, width: int) -> int:
    """How many placeholder tokens one image of (height, width) becomes (the processor's count),
    computed with the model's own packing code on meta features (not recorded)."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    cfg = model.config
    patches = image_size_to_num_patches((height, width), cfg.image_grid_pinpoints, cfg.vision_config.image_size)
    side = cfg.vision_config.image_size // cfg.vision_config.patch_size
    feats = torch.empty(patches, side * side, cfg.text_config.hidden_size, device="meta")
    packed, _ = model.model.pack_image_features(
        [feats], torch.tensor([[height, width]]), cfg.vision_feature_select_strategy,
        image_newline=model.model.image_newline,
    )
    return patches, packed[0].shape[0]


def _decode_inputs(recipe: Recipe, model, prefill_out, path: "ScanPath | None" = None,
                   prefill: dict | None = None) -> dict:
    """One new token per sequence on top of the prefill's cache (and the padded batch's mask)."""
    cache = prefill_out.past_key_values
    if cache is None:
        raise ScanError(f"{recipe.arch} returned no cache from the prefill; cannot scan a decode step",
                        where=recipe.source)
    vocab = getattr(model.config, "text_config", model.config).vocab_size
    batch = int((path.inputs if path is not None else recipe.inputs)["batch"])
    out = {"input_ids": _ids(batch, 1, vocab, fill_from=11), "past_key_values": cache,
           "use_cache": True, "logits_to_keep": 1}
    mask = (prefill or {}).get("attention_mask")
    if mask is not None:
        out["attention_mask"] = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
    return out


# -------------------------------------------------------------------------------- recording

class _Unrepresentable(Exception):
    pass


_NAMES: dict[int, str] | None = None
_NO_OP_CONVERSIONS = {"to", "type", "type_as", "contiguous", "float", "half", "bfloat16", "double",
                      "int", "long", "bool", "short", "char", "byte", "cpu", "cuda"}
_ALLOCATIONS = {"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.Tensor.new_empty",
                "torch.Tensor.new_empty_strided", "torch.ops.aten.empty.memory_format",
                "torch.ops.aten.empty_like.default", "torch.ops.aten.empty_strided.default",
                "torch.ops.aten.new_empty.default", "torch.ops.aten.new_empty_strided.default"}
_ALIASES = {"torch.Tensor.detach", "torch.ops.aten.detach.default", "torch.ops.aten.alias.default",
            "torch.ops.aten.lift_fresh.default"}
_INDEX_OPS = {"torch.getitem", "torch.setitem"}
_PYTHON_DTYPES = {bool: "torch.bool", int: "torch.int64", float: "torch.float32"}


def torch_name(func) -> str | None:
    """Public qualified name of a callable seen by a TorchFunctionMode, or None."""
    global _NAMES

    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return "torch.ops." + str(func).replace("::", ".")
    if _NAMES is None:
        names: dict[int, str] = {}
        spaces = [("torch.nn.functional", torch.nn.functional), ("torch", torch), ("torch.linalg", torch.linalg),
                  ("torch.fft", torch.fft), ("torch.special", torch.special), ("torch.Tensor", torch.Tensor)]
        for prefix, space in spaces:
            for private in (False, True):  # public spellings win over private aliases
                for attr in dir(space):
                    if attr.startswith("_") != private or (private and attr.startswith("__") and prefix != "torch.Tensor"):
                        continue
                    obj = getattr(space, attr, None)
                    if callable(obj) and not isinstance(obj, type):
                        names.setdefault(id(obj), f"{prefix}.{attr}")
        names[id(torch.Tensor.__getitem__)] = "torch.getitem"
        names[id(torch.Tensor.__setitem__)] = "torch.setitem"
        _NAMES = names
    return _NAMES.get(id(func))


def _site_roots():
    import transformers

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    own_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    site = os.path.dirname(os.path.dirname(transformers.__file__)) + os.sep
    return (torch_dir, own_dir), site


class _Recorder:
    """Collects calls from the torch-level and aten-level modes into deduplicated records."""

    def __init__(self, level: str, model: str | None = None, balanced_routing: bool = False):
        self.level = level
        self.model = model
        self.balanced_routing = balanced_routing
        # Functions seen failing on CPU tensors meeting meta ones: later calls move them first (a
        # failed call costs ~25x a meta call; the eager experts loop makes thousands of index_add_).
        self.one_device: set = set()
        self.recording = False
        self.calls = 0
        self.dropped: Counter = Counter()
        self._records: dict[str, dict] = {}
        self._internal, self._site = _site_roots()
        self._code_internal: dict[Any, bool] = {}
        self.last_site: str | None = None
        self._keys: dict[str, str] = {}

    def records(self) -> list[dict]:
        return list(self._records.values())

    def modes(self) -> contextlib.ExitStack:
        # The torch-level mode is always on: it keeps control tensors on the CPU at both levels.
        stack = contextlib.ExitStack()
        stack.enter_context(_TorchMode(self))
        if self.level == "aten":
            stack.enter_context(_AtenMode(self))
        return stack

    # -- where a call comes from
    def site(self) -> tuple[str, str]:
        """(file:line, code) of the innermost frame outside torch and casedb."""
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            internal = self._code_internal.get(code)
            if internal is None:
                internal = code.co_filename.startswith(self._internal) or code.co_filename.startswith("<")
                self._code_internal[code] = internal
            if not internal:
                break
            frame = frame.f_back
        if frame is None:
            return "<unknown>", ""
        filename, line = frame.f_code.co_filename, frame.f_lineno
        code_line = linecache.getline(filename, line).strip()
        if filename.startswith(self._site):
            filename = filename[len(self._site):]
        else:
            filename = _display_path(Path(filename))
        self.last_site = f"{filename}:{line}"
        return self.last_site, code_line

    # -- one call
    def add(self, op: str, args, out, encoded) -> None:
        self.calls += 1
        reason = self._drop_reason(op, args, out)
        if reason:
            self.dropped[reason] += 1
            return
        where, code = self.site()
        if isinstance(encoded, _Unrepresentable):
            rec = {"type": "skipped", "where": where, "op": op, "reason": str(encoded)}
            key = json.dumps(rec, sort_keys=True)
            self._records.setdefault(key, {**rec, "count": 0})["count"] += 1
            return
        inputs, attrs = encoded
        # Most calls repeat (one per layer): the raw encoding finds the record without redoing
        # the rules; different raw encodings (e.g. captured values a rule dropped) may share one.
        raw = repr((op, inputs, attrs, where))
        key = self._keys.get(raw)
        if key is None:
            case = valid_inputs.strip_values(valid_inputs.apply({"op": op, "inputs": inputs, "attrs": attrs}))
            case["description"] = f"File: {where}\nCode: {code}"
            key = self._keys[raw] = json.dumps([op, case["inputs"], case["attrs"], where], sort_keys=True)
            if key not in self._records:
                self._records[key] = {"type": "case", "model": self.model, "where": where, "count": 0, "case": case}
        self._records[key]["count"] += 1

    def _drop_reason(self, op: str, args, out) -> str | None:
        if op in _ALLOCATIONS:
            return "uninitialized allocation"
        if op in _ALIASES:
            return "alias"
        if op.startswith("torch.Tensor._") and not op.startswith("torch.Tensor.__"):
            return "torch internal"
        if op == "torch.setitem":
            return None
        if not _has_tensor(out):
            return "no tensor result"
        method = op.rsplit(".", 1)[-1]
        if op.startswith("torch.Tensor.") and method in _NO_OP_CONVERSIONS and args and out is args[0]:
            return "no-op conversion"
        if op == "torch.ops.aten._to_copy.default" and args and isinstance(out, torch.Tensor) \
                and out.dtype == args[0].dtype:
            return "no-op conversion"
        return None


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    return False


# ---------------------------------------------------------------------------------- encoding

def _dtype_name(dtype) -> str:
    return dtypes.short(dtypes.canonical(str(dtype)))


def _tensor_spec(t, values: bool = False) -> dict:
    spec = {"shape": list(t.shape), "dtype": _dtype_name(t.dtype)}
    if not t.is_contiguous():
        spec["preset"] = "strided"
        spec["preset_args"] = {"stride": list(t.stride()), "storage_offset": t.storage_offset()}
    if values and t.device.type == "cpu" and t.numel() <= MAX_CAPTURED_VALUES:
        # Real values of a control tensor, for valid_inputs; stripped before output.
        spec[valid_inputs.VALUES] = t.tolist()
    return spec


def _py(x) -> str | None:
    """Text of a py: literal for x, or None if x holds something a literal cannot."""
    from casedb.cases.safe_eval import format_py_literal

    try:
        return format_py_literal(x)
    except TypeError:
        return None


def _encode(x, *, index: bool = False, values: bool = False) -> dict:
    """One argument as an RFC input item (``tensor`` / ``tensor_list`` / ``value`` / ``py``);
    ``values``: keep a small CPU tensor's values for valid_inputs."""

    if isinstance(x, torch.Tensor):
        return {"tensor": _tensor_spec(x, values)}
    if isinstance(x, torch.Size):
        return {"py": _py(tuple(x))} if index else {"value": list(x)}
    if isinstance(x, (list, tuple)):
        if x and all(isinstance(v, torch.Tensor) for v in x):
            return {"tensor_list": [_tensor_spec(v, values) for v in x]}
        if any(_has_tensor(v) for v in x):
            raise _Unrepresentable("a list/tuple mixing tensors with other values (e.g. an index like x[idx, :])")
        if index or any(v is Ellipsis or isinstance(v, slice) for v in x):
            text = _py(tuple(x) if isinstance(x, tuple) else list(x))
            if text is None:
                raise _Unrepresentable(f"an index of {type(x).__name__} holding unsupported values")
            return {"py": text}
        return {"value": [_plain(v) for v in x]}
    if x is Ellipsis or isinstance(x, slice):
        return {"py": _py(x)}
    if isinstance(x, float) and not math.isfinite(x):
        return {"py": _py(x)}
    return {"value": _plain(x)}


def _plain(x):
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            raise _Unrepresentable("a non-finite float inside a list")
        return x
    if isinstance(x, torch.dtype):
        return str(x)
    if x in _PYTHON_DTYPES:  # torch.ones(..., dtype=bool)
        return _PYTHON_DTYPES[x]
    if isinstance(x, torch.device):
        return "cpu" if x.type == "meta" else str(x)  # the runner remaps the device
    if isinstance(x, (torch.memory_format, torch.layout)):
        return str(x)
    if isinstance(x, (list, tuple, torch.Size)):
        return [_plain(v) for v in x]
    raise _Unrepresentable(f"an argument of type {type(x).__module__}.{type(x).__qualname__}")


_WANTS_VALUES: dict[str, bool] = {}


def encode_call(op: str, args, kwargs):
    """(inputs, attrs) of one call in the RFC schema; raises _Unrepresentable."""
    # Values are read (tolist) and keyed only for the ops whose valid-input rule uses them.
    values = _WANTS_VALUES.get(op)
    if values is None:
        values = _WANTS_VALUES[op] = valid_inputs.wants_values(op)
    inputs = [_encode(a, index=(op in _INDEX_OPS and i == 1), values=values) for i, a in enumerate(args)]
    attrs = {}
    for k, v in (kwargs or {}).items():
        item = _encode(v, values=values)
        # keyword values are written plainly unless they need an input form
        attrs[k] = item["value"] if "value" in item else item
    return inputs, attrs


# ------------------------------------------------------------------------------------ modes

def _keep_on_cpu(args, kwargs):
    """Arguments of ``Tensor.to`` that keep a CPU control tensor real: ``to(meta)`` stays on the CPU."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].device.type != "cpu":
        return args, kwargs

    def fix(x):
        if isinstance(x, torch.device) and x.type == "meta" or x == "meta":
            return torch.device("cpu")
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            return x.dtype  # .to(other) means .to(other.device, other.dtype)
        return x

    return (args[0], *[fix(a) for a in args[1:]]), {k: fix(v) for k, v in kwargs.items()}


def _getter_name(func) -> str | None:
    """The property name when `func` is a tensor attribute read (``x.shape``), else None."""
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor" and getattr(func, "__name__", "") == "__get__":
        return owner.__name__
    return None


_TOPK = {torch.topk, torch.Tensor.topk}


def _call(rec: "_Recorder", func, args, kwargs):
    """``func(*args, **kwargs)`` as the scan runs it: balanced routing on request, and a CPU
    control tensor meeting meta tensors in an op that needs one device moves to meta."""
    if rec.balanced_routing and func in _TOPK and args and args[0].device.type == "meta":
        return _balanced_topk(args[0], func(*args, **kwargs))
    if func in rec.one_device:
        moved = _meta_if_mixed(args, kwargs)
        if moved is not None:
            return func(*moved[0], **moved[1])
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        moved = _meta_if_mixed(args, kwargs)
        if moved is None:
            raise
        # e.g. index_add_(0, cpu_index, meta_source), a padding mask indexed with meta positions:
        # real values cannot meet meta ones, so this result is meta (values unknown) too.
        rec.one_device.add(func)
        return func(*moved[0], **moved[1])


def _balanced_topk(x, out):
    """Router top-k with real indices: token t's j-th choice is expert (t*k + j) mod E, so every
    expert gets an even share of the tokens (as the grouped_mm offsets rule assumes) and a
    token's k choices differ. The values stay meta."""
    values, indices = out
    k, experts = indices.shape[-1], x.shape[-1]
    if indices.shape[:-1] != x.shape[:-1] or k > experts:
        return out  # not a top-k over the last dim: leave it
    routing = torch.arange(indices.numel()).reshape(indices.shape) % experts
    return torch.return_types.topk((values, routing))


def _meta_if_mixed(args, kwargs):
    """(args, kwargs) with CPU tensors moved to meta when both devices are among them, else None."""
    found = set()

    def scan_devices(x):
        if isinstance(x, torch.Tensor):
            found.add(x.device.type)
        elif isinstance(x, (list, tuple)):
            for v in x:
                scan_devices(v)

    scan_devices(list(args) + list(kwargs.values()))
    if not {"cpu", "meta"} <= found:
        return None

    def move(x):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            return x.to("meta")
        if isinstance(x, (list, tuple)):
            return type(x)(move(v) for v in x)
        return x

    return [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}


class _TorchMode(TorchFunctionMode):
    """Sees every call the model code makes; records them at ``level="torch"``."""

    def __init__(self, recorder: _Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        if func is torch.Tensor.to:
            args, kwargs = _keep_on_cpu(args, kwargs)
        record = rec.recording and rec.level == "torch"
        if _getter_name(func) is not None:
            if record:
                rec.calls += 1
                rec.dropped["attribute read"] += 1
            return func(*args, **kwargs)
        if not record:
            return _call(rec, func, args, kwargs)
        op = torch_name(func)
        try:
            # encoded before the call: in-place ops change their inputs' values (and some, shapes)
            encoded = encode_call(op, args, kwargs) if op else _Unrepresentable(
                f"no public torch name for {getattr(func, '__qualname__', func)!r}")
        except _Unrepresentable as e:
            encoded = e
        out = _call(rec, func, args, kwargs)
        rec.add(op or getattr(func, "__qualname__", str(func)), args, out, encoded)
        return out


class _AtenMode(TorchDispatchMode):
    """Sees every ATen overload dispatched; records them at ``level="aten"``."""

    def __init__(self, recorder: _Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.recorder.recording:
            return func(*args, **kwargs)
        op = "torch.ops." + str(func)
        try:
            encoded = encode_call(op, args, kwargs)
        except _Unrepresentable as e:
            encoded = e
        out = func(*args, **kwargs)
        self.recorder.add(op, args, out, encoded)
        return out
