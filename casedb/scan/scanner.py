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
that the prefill left. Both use ``logits_to_keep=1`` as ``generate`` does. Encoders (BERT-like,
CLIP) have one forward, the prefill; a recipe's ``pooling`` adds a sentence-embedding head.

Paths: a recipe's ``matrix`` names the runtime choices a deployment varies — the KV cache
(``dynamic`` / ``static``), the attention implementation (``sdpa`` / ``eager``), the expert
implementation (``grouped_mm`` / ``batched_mm``, which generate runs for decode steps only /
``eager``), one rank of an expert-parallel deployment (``expert_ranks``: each rank holds a
slice of the experts and masks the tokens routed to the others: casedb.scan.expert_parallel)
and forward inputs (``batch`` > 1
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
argument) become ``skipped`` records with the reason; the importer counts and lists them. So do,
with a warning, split / view / reshape calls whose recorded sizes cannot fit their recorded input
(:mod:`casedb.cases.size_rules`): sizes the model computed as integer tensors are recorded with
the values the scan saw (Mistral3's tokens per image), never as random ones.

Modules: :mod:`~casedb.scan.recipes` (recipes and paths), :mod:`~casedb.scan.inputs` (forward
inputs per kind of model), :mod:`~casedb.scan.recording` (modes, recorder, encoding), this module
(building, running and writing a scan), :mod:`~casedb.scan.report` (coverage across paths) and
:mod:`~casedb.scan.compare` (coverage of another tracer's op list).

Each unique call — op, inputs, keyword arguments and the model source line that made it — is
one record with its ``count``. Value-sensitive inputs (indices, offsets, masks) get their
``init`` from :mod:`casedb.cases.valid_inputs`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from casedb.cases import dtypes
from casedb.scan import config as scan_config
from casedb.scan import cpu_device
from casedb.scan.config import ScanError
from casedb.scan.inputs import decode_inputs, prefill_inputs  # noqa: F401 (bench_scan)
from casedb.scan.expert_parallel import one_rank
from casedb.scan.kinds import NO_DECODE, refuse_lookalike
from casedb.scan.recipes import Recipe, ScanPath, display_path, load_recipe, recipe_names  # noqa: F401 (tests)
from casedb.scan.recording import Recorder

SCAN_FORMAT = 1
LEVELS = ("torch", "aten")
PHASES = ("prefill", "decode")
# Expert implementations generate runs for the decode steps only, on top of a grouped_mm prefill
# (GenerationMixin._optimize_model_for_decode on an accelerator): batched_mm copies each routed
# token's expert weights, a few MB per token in decode but tens of GB for a prompt.
DECODE_EXPERTS = {"batched_mm": "grouped_mm"}

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
                 arch: str | None = None, store=None, path: str | None = None, report: bool = False,
                 compare: str | Path | None = None, device: str = "meta",
                 new_cases: str | Path | None = None) -> dict:
    """What ``casedb scan`` does: scan (every path of the recipe, or ``path``), write the scan JSONL
    (to ``output``, default ``data/scans/<model>-<level>.jsonl``) and, given an open ``store``,
    import that file.

    Returns a summary dict (unique calls, ops, seconds, per-path figures, the file, the import
    report, with ``report`` the coverage report of :mod:`casedb.scan.report`, and with ``compare``
    (a file of another tracer's ops) the comparison of :mod:`casedb.scan.compare`; with
    ``new_cases``, the version manifest of :mod:`casedb.scan.versions` written there).
    """
    if compare is not None:
        from casedb.scan import compare as scan_compare

        theirs = scan_compare.read_ops(compare)  # a bad file fails before the scan's minutes
    result = scan(model, level=level, phases=phases, arch=arch, path=path, device=device)
    out = Path(output) if output else DEFAULT_OUT_DIR / f"{result.header['model']}-{level}.jsonl"
    result.write(out)
    summary = {**result.summary(), "output": str(out), "dropped": result.header["dropped"]}
    if store is not None:
        from casedb.ingest.save import import_paths

        summary["import"] = import_paths(store, [out]).totals()
    if new_cases is not None:
        from casedb.scan.versions import write_version_manifest

        summary["new_cases"] = write_version_manifest(out, new_cases)
    if report:
        from casedb.scan.report import coverage

        summary["report"] = coverage(result)
    if compare is not None:
        summary["compare"] = {"file": str(compare), **scan_compare.compare_scan(result, theirs)}
    return summary


# ---------------------------------------------------------------------------------- scanning

def scan(recipe: Recipe | str | Path, *, level: str = "torch", phases=PHASES, arch: str | None = None,
         path: str | None = None, device: str = "meta") -> ScanResult:
    """Scan a model (a Recipe, a recipe name or path, or a config.json) along every path of its
    recipe (or the one named ``path``) and return the union of the records. ``device="cpu"``: the
    depth-shrunk model on real CPU tensors (casedb.scan.cpu_device)."""
    started = time.perf_counter()
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, arch)
    if level not in LEVELS:
        raise ScanError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")
    phases = tuple(phases)
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise ScanError(f"unknown phase {', '.join(bad) or '(none)'}; choose from {', '.join(PHASES)}")
    if device not in cpu_device.DEVICES:
        raise ScanError(f"unknown device {device!r}; choose one of {', '.join(cpu_device.DEVICES)}")
    doc = scan_config.check(recipe.config)  # before transformers reads it
    if device == "meta":
        return _scan(recipe, level, phases, _chosen(recipe, recipe.paths(), path), doc, device, started)
    with cpu_device.shrunk_recipe(recipe, doc) as (small, small_doc, notes):
        paths, unsupported = cpu_device.supported_paths(recipe.paths(), _model_class(small))
        result = _scan(small, level, phases, _chosen(recipe, paths, path), small_doc, device, started)
    result.header.update(config=display_path(recipe.config), device=device, shrunk=notes,
                         unsupported_paths=unsupported)
    return result


def _chosen(recipe: Recipe, paths: list, path: str | None) -> list:
    """The recipe's paths, or the one named ``path``."""
    if path is None:
        return paths
    chosen = [p for p in paths if p.name == path]
    if not chosen:
        raise ScanError(f"{recipe.model} has no path {path!r}; its paths: {', '.join(p.name for p in paths)}",
                        where=recipe.source)
    return chosen


def _scan(recipe: Recipe, level: str, phases: tuple, paths: list, doc: dict, device: str,
          started: float) -> ScanResult:
    """Every path of ``paths``, each in its own recorder, and the union of their records."""
    models: dict = {}
    runs = []
    for p in paths:
        path_started = time.perf_counter()
        key = (p.attention, p.experts)
        if key not in models:
            if device != "meta":
                models.clear()  # one real model at a time: the memory bound is per model
            models[key] = _build(recipe, p, doc, device)
        model = models[key]
        # The eager experts loop over the experts a routing hits: it needs real routing values. On
        # the CPU, random weights would route unevenly: a linear per expert and token count.
        recorder = Recorder(level, recipe.model, balanced_routing=p.experts == "eager" or device == "cpu",
                            routing_devices=cpu_device.DEVICES if device == "cpu" else ("meta",))
        with torch.no_grad():
            prefill = prefill_inputs(recipe, model, p)
            if device == "cpu":
                prefill = cpu_device.with_generate_cache(model, cpu_device.real_inputs(prefill))
            with one_rank(model, p.expert_ranks, recipe.source):
                with _experts(model, DECODE_EXPERTS.get(p.experts)):
                    out = _forward(model, prefill, recorder, record="prefill" in phases, path=p,
                                   pooling=recipe.pooling)
                if "decode" in phases and recipe.kind not in NO_DECODE:
                    _forward(model, decode_inputs(recipe, model, out, p, prefill), recorder, record=True, path=p)
        runs.append((p, recorder, time.perf_counter() - path_started))
    model = next(iter(models.values()))  # the header reads its config (every path's model has it)
    provenance = bool(recipe.matrix or recipe.alone)
    header = _header(recipe, level, phases, model, paths, runs)
    if provenance:
        header["paths"] = [p.settings() for p in paths]
        header["path_stats"] = [_path_stats(p, r, seconds) for p, r, seconds in runs]
    records = _union([(p.name, r.records()) for p, r, _ in runs], provenance)
    return ScanResult(header=header, records=records, seconds=time.perf_counter() - started)


def _header(recipe: Recipe, level: str, phases, model, paths: list, runs: list) -> dict:
    """The scan file's first line: what was scanned, with what, and what the recorders dropped."""
    import transformers

    dropped: Counter = Counter()
    dropped_ops: dict[str, set] = {}
    for _, recorder, _ in runs:
        dropped.update(recorder.dropped)
        for reason, ops in recorder.dropped_ops.items():
            dropped_ops.setdefault(reason, set()).update(ops)
    return {
        "casedb_scan": SCAN_FORMAT, "model": recipe.model, "level": level, "phase": "+".join(phases),
        "recipe": recipe.source, "torch": torch.__version__, "transformers": transformers.__version__,
        "arch": recipe.arch, "config": display_path(recipe.config), "family": model.config.model_type,
        "variant_of": recipe.variant_of, "description": recipe.description,
        "defaults": recipe.defaults or {"dtype": dtypes.short(dtypes.canonical(recipe.dtype))},
        "inputs": paths[0].inputs, "calls": sum(r.calls for _, r, _ in runs), "dropped": dict(dropped),
        "dropped_ops": {reason: sorted(ops) for reason, ops in sorted(dropped_ops.items())},
    }


def _path_stats(p: "ScanPath", recorder: "Recorder", seconds: float) -> dict:
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


def _build(recipe: Recipe, path: "ScanPath | None" = None, doc: dict | None = None, device: str = "meta"):
    """The model at full size on the meta device (or on the CPU, with seeded weights, within
    cpu_device's bound), in eval mode, in the recipe's dtype, with the path's attention and
    expert implementations. No code of the config runs (trust_remote_code is off, stdin closed
    to any prompt) and the model's size is bounded (casedb.scan.config)."""
    import transformers

    if device != "meta":
        cpu_device.check_memory(_build(recipe, path, doc), recipe.source)
        torch.manual_seed(cpu_device.SEED)
    from huggingface_hub.errors import StrictDataclassError  # a config value of the wrong type

    transformers.logging.set_verbosity_error()
    doc = scan_config.check(recipe.config) if doc is None else doc
    try:
        with _no_stdin():
            config = transformers.AutoConfig.from_pretrained(str(recipe.config), trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as e:
        raise ScanError(f"cannot load the config with transformers {transformers.__version__}: {e}",
                        where=str(recipe.config)) from None
    # mxfp4 quantization needs kernels and real weights; on the meta device it would change nothing.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    cls = _model_class(recipe)
    refuse_lookalike(recipe.arch, recipe.kind, cls.forward, config, where=recipe.source)
    dtype = getattr(torch, dtypes.canonical(recipe.dtype))
    kwargs = {}
    if path is not None and path.attention:
        kwargs["attn_implementation"] = path.attention
    if path is not None and path.experts:
        if not getattr(cls, "_can_set_experts_implementation", lambda: False)():
            raise ScanError(f"{recipe.arch} has no expert implementations to choose from; drop the experts axis",
                            where=recipe.source)
        kwargs["experts_implementation"] = path.experts
    try:
        with torch.device(device), _no_stdin():
            # what the Auto classes' from_config calls: sets the dtype and attention implementation
            model = cls._from_config(config, dtype=dtype, **kwargs)
    except (ValueError, ImportError) as e:
        raise ScanError(f"path {path.name}: {e}" if path else str(e), where=recipe.source) from None
    scan_config.check_parameters(model, doc, str(scan_config.path_of(recipe.config)))
    if device == "meta" and any(p.device.type != "meta" for p in model.parameters()):
        # a parameter made outside the device context (Wav2Vec2's masked_spec_embed, a CPU
        # torch.Tensor(...)): on the meta device too, or its forward mixes devices and its
        # errors name the CPU
        model.to("meta")
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


def _forward(model, kwargs: dict, recorder: "Recorder", record: bool, path: "ScanPath | None" = None,
             pooling: str | None = None):
    recorder.recording = record
    try:
        with recorder.modes():
            out = model(**kwargs)
            if pooling is not None:  # the sentence-embedding head runs on the encoder's output
                from casedb.scan.pooling import mean_normalize

                mean_normalize(out[0], kwargs["attention_mask"])
            return out
    except ScanError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        on = f" on path {path.name}" if path is not None and path.name != "default" else ""
        raise ScanError(
            f"the forward pass of {type(model).__name__} failed on the {model.device.type} device{on}: "
            f"{type(e).__name__}: {e}"
            f" (at {recorder.last_site or 'unknown location'})"
        ) from e
    finally:
        recorder.recording = False


