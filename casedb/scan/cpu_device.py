"""Scans on real CPU tensors (``casedb scan RECIPE --device cpu``), for model code that needs data.

The meta device has no values: code that reads one (``.item()``, ``.tolist()`` of a routing, a
block mask built from real sizes) cannot run on it. transformers 5.2's granitemoehybrid (its
ScatterMoE-style router reads the expert sizes back) and Pixtral (autocast on the meta device)
are such code. On the CPU the same recording runs on a model with real, small random weights:

* **depth shrunk** (:func:`shrink`): each config (and nested config) keeps the first layer of
  every kind its per-layer lists name (``layer_types``: one Mamba2, one attention layer), at
  least :data:`KEEP_LAYERS`: the layers of one kind make the same calls, so the unique cases
  are those of the full model, at full width (the shapes are the real ones). A config that
  names layers by index elsewhere breaks when cut (LLaVA-Next's ``vision_feature_layer``:
  granite-vision's CPU scan fails with an IndexError in ``get_image_features``);
* **bounded** (:func:`check_memory`): the shrunk model is first built on the meta device and
  refused above :data:`MAX_CPU_BYTES` of parameters and buffers, naming its size; one model is
  held at a time. The forward's own tensors come on top (transformers 5.2's Mamba2 torch path
  makes a few GB per chunk: granite4h's scan peaks at 10.7 GB RSS);
* **seeded**: weights from the model's own initialisation after ``torch.manual_seed(0)``; the
  inputs a meta scan leaves without values (pixels, audio features) drawn from a seeded normal
  (:func:`real_inputs`);
* **in the recipe's dtype** (the cases' dtype): the CPU has bf16 kernels for what these models call.

Paths of the recipe that the installed transformers cannot take (an expert implementation in a
version without them) are left out and named in the header (:func:`supported_paths`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from pathlib import Path

import torch

from casedb.scan.config import ScanError

DEVICES = ("meta", "cpu")
KEEP_LAYERS = 2
MAX_CPU_BYTES = 8 << 30  # granite-4.0-h-small shrunk (2 layers of 72 experts, 4096 wide): ~4 GB in bf16
_LAYER_COUNTS = ("num_hidden_layers", "num_layers")
SEED = 0


def shrink(doc: dict) -> tuple[dict, list[str]]:
    """A copy of a config JSON with every layer count cut to the first layer of each kind (at least
    KEEP_LAYERS) and the per-layer lists cut with it; and what was cut (``key: 40 -> 2``)."""
    out, notes = {}, []
    for key, value in doc.items():
        if isinstance(value, dict):
            value, inner = shrink(value)
            notes += [f"{key}.{n}" for n in inner]
        out[key] = value
    for count_key in _LAYER_COUNTS:
        count = out.get(count_key)
        if not isinstance(count, int) or isinstance(count, bool) or count <= KEEP_LAYERS:
            continue
        per_layer = [k for k, v in out.items() if isinstance(v, list) and len(v) == count]
        kept = _kept_layers(count, [out[k] for k in per_layer])
        out[count_key] = len(kept)
        for k in per_layer:
            out[k] = [out[k][i] for i in kept]
        alike = f" ({', '.join(per_layer)} cut alike)" if per_layer else ""
        notes.append(f"{count_key} {count} -> {len(kept)}{alike}")
    return out, notes


def _kept_layers(count: int, per_layer: list[list]) -> list[int]:
    """The first layer of each kind (a kind: the layer's values in every per-layer list), then the
    next layers up to KEEP_LAYERS."""
    firsts: dict[str, int] = {}
    for i in range(count):
        firsts.setdefault(json.dumps([values[i] for values in per_layer]), i)
    kept = sorted(firsts.values())
    extra = [i for i in range(count) if i not in kept][:max(0, KEEP_LAYERS - len(kept))]
    return sorted(kept + extra)


@contextlib.contextmanager
def shrunk_recipe(recipe, doc: dict):
    """Inside the block: the recipe with its config replaced by the shrunk one (a temporary file),
    and the notes of what was cut."""
    small, notes = shrink(doc)
    with tempfile.TemporaryDirectory(prefix="casedb-scan-cpu-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(small), encoding="utf-8")
        yield dataclasses.replace(recipe, config=path), small, notes


def check_memory(meta_model, where: str | None) -> int:
    """The bytes the model's parameters and buffers take; ScanError above MAX_CPU_BYTES."""
    size = sum(t.numel() * t.element_size() for t in (*meta_model.parameters(), *meta_model.buffers()))
    if size > MAX_CPU_BYTES:
        raise ScanError(f"the depth-shrunk model takes {size / 2**30:.1f} GiB on the CPU, more than "
                        f"{MAX_CPU_BYTES / 2**30:.0f} GiB: scan it on the meta device (without --device cpu)",
                        where=where)
    return size


def real_inputs(inputs: dict) -> dict:
    """The forward inputs with each meta tensor (values a meta scan never needs) replaced by a seeded
    random CPU tensor of its shape and dtype."""
    generator = torch.Generator().manual_seed(SEED)

    def real(x):
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            if x.is_floating_point():
                return torch.randn(x.shape, generator=generator).to(x.dtype)
            return torch.zeros(x.shape, dtype=x.dtype)
        return x

    return {k: real(v) for k, v in inputs.items()}


def supported_paths(paths: list, cls) -> tuple[list, list[str]]:
    """(the paths the installed transformers can take, the names of those it cannot). A class
    without expert implementations runs its own experts: the paths on the first (default) value
    of the experts axis run without asking for one, the others are left out."""
    can_set = getattr(cls, "_can_set_experts_implementation", None)  # none before transformers 5.3
    if not any(p.experts for p in paths) or (can_set is not None and can_set()):
        return paths, []
    default = paths[0].experts
    kept = [dataclasses.replace(p, experts=None, name="-".join(part for part in p.name.split("-") if part != default),
                                axes={a: v for a, v in p.axes.items() if a != "experts"})
            for p in paths if p.experts == default]
    return kept, [p.name for p in paths if p.experts != default]


def with_generate_cache(model, inputs: dict) -> dict:
    """The inputs with the cache generate would make when the model has its own kind (transformers
    5.2's hybrid Mamba cache: the model makes none itself, so a prefill without it returns none)."""
    supports_default = getattr(type(model), "_supports_default_dynamic_cache", None)
    if inputs.get("past_key_values") is not None or not inputs.get("use_cache") or supports_default is None \
            or supports_default():
        return inputs
    ids = inputs["input_ids"]
    prepared = model.prepare_inputs_for_generation(ids, attention_mask=inputs.get("attention_mask"), use_cache=True,
                                                   cache_position=torch.arange(ids.shape[1]))
    return {**inputs, "past_key_values": prepared.get("past_key_values")}
