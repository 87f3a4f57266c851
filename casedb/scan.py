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

Control tensors (token ids, image sizes, audio masks) stay real CPU tensors so that the model's
Python control flow and masks see real values; everything derived from weights is meta.

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
``init`` from :mod:`casedb.valid_inputs`.
"""

from __future__ import annotations

import contextlib
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

from casedb import dtypes, valid_inputs
from casedb.errors import InputError

SCAN_FORMAT = 1
LEVELS = ("torch", "aten")
PHASES = ("prefill", "decode")
RECIPE_DIR = Path(__file__).resolve().parent.parent / "manifests" / "scan"
RECIPE_KEYS = ("model", "description", "variant_of", "config", "arch", "dtype", "defaults", "inputs")
# Forward-input keys each kind of model takes (see _prefill_inputs); values are the defaults
# used when scanning a bare config.json.
INPUT_DEFAULTS = {
    "causal_lm": {"batch": 1, "seq_len": 256},
    "llava_next": {"batch": 1, "text_len": 32, "image_size": [768, 768]},
    "granite_speech": {"batch": 1, "text_len": 32, "audio_frames": 500},
}
# Real values of a CPU (control) tensor are kept for valid_inputs when it is at most this big.
MAX_CAPTURED_VALUES = 8192


class ScanError(InputError):
    """A recipe, config or model that cannot be scanned, with what to do about it."""


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
    return recipe


def _recipe_from_config(path: Path, arch: str | None) -> Recipe:
    if not path.exists():
        raise ScanError("config file not found", where=str(path))
    if not arch:
        try:
            arch = (json.loads(path.read_text(encoding="utf-8")).get("architectures") or [None])[0]
        except (OSError, ValueError) as e:
            raise ScanError(f"cannot read config: {e}", where=str(path)) from None
        if not arch:
            raise ScanError("config.json has no 'architectures'; give the model class with --arch", where=str(path))
    recipe = Recipe(model=path.stem, config=path, arch=arch, inputs={}, source=_display_path(path))
    recipe.inputs = dict(INPUT_DEFAULTS[recipe.kind])
    return recipe


def _check_inputs(recipe: Recipe) -> None:
    allowed = INPUT_DEFAULTS[recipe.kind]
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


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


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
        return {"model": self.header["model"], "level": self.header["level"], "phase": self.header["phase"],
                "unique_calls": kinds["case"], "skipped": kinds["skipped"], "calls": self.header["calls"],
                "ops": len({r["case"]["op"] for r in self.cases}), "seconds": round(self.seconds, 2)}


# ------------------------------------------------------------------------------- command

DEFAULT_OUT_DIR = Path("data") / "scans"


def scan_command(model: str, *, output: str | Path | None = None, level: str = "torch", phases=PHASES,
                 arch: str | None = None, store=None) -> dict:
    """What ``casedb scan`` does: scan, write the scan JSONL (to ``output``, default
    ``data/scans/<model>-<level>.jsonl``) and, given an open ``store``, import that file.

    Returns a summary dict (unique calls, ops, seconds, the file, and the import report).
    """
    result = scan(model, level=level, phases=phases, arch=arch)
    path = Path(output) if output else DEFAULT_OUT_DIR / f"{result.header['model']}-{level}.jsonl"
    result.write(path)
    summary = {**result.summary(), "output": str(path), "dropped": result.header["dropped"]}
    if store is not None:
        from casedb.ingest import import_paths

        summary["import"] = import_paths(store, [path]).totals()
    return summary


# ---------------------------------------------------------------------------------- scanning

def scan(recipe: Recipe | str | Path, *, level: str = "torch", phases=PHASES, arch: str | None = None) -> ScanResult:
    """Scan a model (a Recipe, a recipe name or path, or a config.json) and return its records."""
    started = time.perf_counter()
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, arch)
    if level not in LEVELS:
        raise ScanError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")
    phases = tuple(phases)
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise ScanError(f"unknown phase {', '.join(bad) or '(none)'}; choose from {', '.join(PHASES)}")

    import transformers

    model = _build(recipe)
    recorder = _Recorder(level, recipe.model)
    with torch.no_grad():
        prefill = _prefill_inputs(recipe, model)
        out = _forward(model, prefill, recorder, record="prefill" in phases)
        if "decode" in phases:
            decode = _decode_inputs(recipe, model, out)
            _forward(model, decode, recorder, record=True)
    header = {
        "casedb_scan": SCAN_FORMAT, "model": recipe.model, "level": level, "phase": "+".join(phases),
        "recipe": recipe.source, "torch": torch.__version__, "transformers": transformers.__version__,
        "arch": recipe.arch, "config": _display_path(recipe.config), "family": model.config.model_type,
        "variant_of": recipe.variant_of, "description": recipe.description,
        "defaults": recipe.defaults or {"dtype": dtypes.short(dtypes.canonical(recipe.dtype))},
        "inputs": recipe.inputs, "calls": recorder.calls, "dropped": dict(recorder.dropped),
    }
    return ScanResult(header=header, records=recorder.records(), seconds=time.perf_counter() - started)


def _build(recipe: Recipe):
    """The model at full size on the meta device, in eval mode, in the recipe's dtype."""
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.from_pretrained(str(recipe.config))
    except (OSError, ValueError, KeyError) as e:
        raise ScanError(f"cannot load the config with transformers {transformers.__version__}: {e}",
                        where=str(recipe.config)) from None
    # mxfp4 quantization needs kernels and real weights; on the meta device it would change nothing.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    cls = getattr(transformers, recipe.arch, None)
    if cls is None:
        raise ScanError(f"transformers {transformers.__version__} has no model class {recipe.arch!r}; "
                        "fix 'arch' in the recipe (or --arch)", where=recipe.source)
    dtype = getattr(torch, dtypes.canonical(recipe.dtype))
    with torch.device("meta"):
        # what the Auto classes' from_config calls: sets the dtype and attention implementation
        model = cls._from_config(config, dtype=dtype)
    return model.eval()


def _forward(model, kwargs: dict, recorder: "_Recorder", record: bool):
    recorder.recording = record
    try:
        with recorder.modes():
            return model(**kwargs)
    except ScanError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        raise ScanError(
            f"the forward pass of {type(model).__name__} failed on the meta device: {type(e).__name__}: {e}"
            f" (at {recorder.last_site or 'unknown location'})"
        ) from e
    finally:
        recorder.recording = False


# ------------------------------------------------------------------------------ forward inputs

def _ids(batch: int, length: int, vocab: int, fill_from: int = 1):
    """Deterministic, in-vocabulary token ids (values only matter for placeholder tokens)."""
    return (torch.arange(batch * length).reshape(batch, length) * 7919 + fill_from) % vocab


def _prefill_inputs(recipe: Recipe, model) -> dict:
    inp = recipe.inputs
    batch = int(inp["batch"])
    common = {"use_cache": True, "logits_to_keep": 1}
    if recipe.kind == "causal_lm":
        return {"input_ids": _ids(batch, int(inp["seq_len"]), model.config.vocab_size), **common}
    text_vocab = model.config.text_config.vocab_size
    text_len = int(inp["text_len"])
    if recipe.kind == "llava_next":
        cfg = model.config
        height, width = (int(x) for x in inp["image_size"])
        image_sizes = torch.tensor([[height, width]] * batch)
        patches, num_tokens = _llava_image_tokens(model, height, width)
        size = cfg.vision_config.image_size
        ids = _ids(batch, text_len, min(text_vocab, cfg.image_token_index))
        placeholder = torch.full((batch, num_tokens), cfg.image_token_index)
        input_ids = torch.cat([ids[:, :1], placeholder, ids[:, 1:]], dim=1)
        pixel_values = torch.empty(batch, patches, 3, size, size, dtype=model.dtype, device="meta")
        return {"input_ids": input_ids, "pixel_values": pixel_values, "image_sizes": image_sizes, **common}
    # granite_speech: input_features are stacked log-mel frames (2 x 80 mels); the projector turns
    # each window of `window_size` frames into window_size // downsample_rate audio tokens.
    cfg = model.config
    frames = int(inp["audio_frames"])
    num_tokens = math.ceil(frames / cfg.window_size) * (cfg.window_size // cfg.downsample_rate)
    ids = _ids(batch, text_len, min(text_vocab, cfg.audio_token_index))
    placeholder = torch.full((batch, num_tokens), cfg.audio_token_index)
    input_ids = torch.cat([ids[:, :1], placeholder, ids[:, 1:]], dim=1)
    features = torch.empty(batch, frames, cfg.encoder_config.input_dim, dtype=model.dtype, device="meta")
    mask = torch.ones(batch, num_tokens, dtype=torch.bool)
    return {"input_ids": input_ids, "input_features": features, "input_features_mask": mask, **common}


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


def _decode_inputs(recipe: Recipe, model, prefill_out) -> dict:
    """One new token per sequence on top of the prefill's cache."""
    cache = prefill_out.past_key_values
    if cache is None:
        raise ScanError(f"{recipe.arch} returned no cache from the prefill; cannot scan a decode step",
                        where=recipe.source)
    vocab = getattr(model.config, "text_config", model.config).vocab_size
    batch = int(recipe.inputs["batch"])
    return {"input_ids": _ids(batch, 1, vocab, fill_from=11), "past_key_values": cache,
            "use_cache": True, "logits_to_keep": 1}


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
    own_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
    site = os.path.dirname(os.path.dirname(transformers.__file__)) + os.sep
    return (torch_dir, own_dir), site


class _Recorder:
    """Collects calls from the torch-level and aten-level modes into deduplicated records."""

    def __init__(self, level: str, model: str | None = None):
        self.level = level
        self.model = model
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


def _tensor_spec(t) -> dict:
    spec = {"shape": list(t.shape), "dtype": _dtype_name(t.dtype)}
    if not t.is_contiguous():
        spec["preset"] = "strided"
        spec["preset_args"] = {"stride": list(t.stride()), "storage_offset": t.storage_offset()}
    if t.device.type == "cpu" and t.numel() <= MAX_CAPTURED_VALUES:
        # Real values of a control tensor, for valid_inputs; stripped before output.
        spec[valid_inputs.VALUES] = t.tolist()
    return spec


def _py(x) -> str | None:
    """Text of a py: literal for x, or None if x holds something a literal cannot."""
    from casedb.safe_eval import format_py_literal

    try:
        return format_py_literal(x)
    except TypeError:
        return None


def _encode(x, *, index: bool = False) -> dict:
    """One argument as an RFC input item (``tensor`` / ``tensor_list`` / ``value`` / ``py``)."""

    if isinstance(x, torch.Tensor):
        return {"tensor": _tensor_spec(x)}
    if isinstance(x, torch.Size):
        return {"py": _py(tuple(x))} if index else {"value": list(x)}
    if isinstance(x, (list, tuple)):
        if x and all(isinstance(v, torch.Tensor) for v in x):
            return {"tensor_list": [_tensor_spec(v) for v in x]}
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


def encode_call(op: str, args, kwargs):
    """(inputs, attrs) of one call in the RFC schema; raises _Unrepresentable."""
    inputs = [_encode(a, index=(op in _INDEX_OPS and i == 1)) for i, a in enumerate(args)]
    attrs = {}
    for k, v in (kwargs or {}).items():
        item = _encode(v)
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
            return func(*args, **kwargs)
        op = torch_name(func)
        try:
            # encoded before the call: in-place ops change their inputs' values (and some, shapes)
            encoded = encode_call(op, args, kwargs) if op else _Unrepresentable(
                f"no public torch name for {getattr(func, '__qualname__', func)!r}")
        except _Unrepresentable as e:
            encoded = e
        out = func(*args, **kwargs)
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
