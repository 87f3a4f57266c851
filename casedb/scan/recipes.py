"""Scan recipes: which model to build (config + class), its forward inputs and the paths of a
deployment (the ``matrix`` / ``alone`` axes). See :mod:`casedb.scan.scanner` for what a scan does."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from casedb.cases import dtypes
from casedb.scan import config as scan_config
from casedb.scan.config import ScanError
from casedb.scan.kinds import INPUT_DEFAULTS, kind_of
from casedb.scan.pooling import POOLINGS

RECIPE_DIR = Path(__file__).resolve().parents[2] / "manifests" / "scan"
RECIPE_KEYS = ("model", "description", "variant_of", "config", "arch", "dtype", "defaults", "inputs", "matrix",
               "alone", "pooling")
# Runtime axes of a path and their values (the first: what the model picks when nothing is asked).
RUNTIME_AXES = {
    "cache": ("dynamic", "static"),
    "attention": ("sdpa", "eager"),
    "experts": ("grouped_mm", "batched_mm", "eager"),
}
# Deployment axes counted in ranks (casedb.scan.expert_parallel): the path is rank 0 of N.
RANK_AXES = {"expert_ranks": "ep"}

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
    pooling: str | None = None  # a sentence-embedding head after an encoder (casedb.scan.pooling)

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
        return kind_of(self.arch, self.source)


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
        defaults=dict(doc.get("defaults") or {}), source=display_path(path),
    )
    _check_inputs(recipe)
    recipe.matrix = _axes(recipe, doc.get("matrix"), "matrix")
    recipe.alone = _axes(recipe, doc.get("alone"), "alone")
    both = sorted(set(recipe.matrix) & set(recipe.alone))
    if both:
        raise ScanError(f"axis {', '.join(both)} is in both matrix and alone; keep it in one", where=recipe.source)
    recipe.pooling = _pooling(recipe, doc.get("pooling"))
    return recipe


def _pooling(recipe: Recipe, pooling) -> str | None:
    if pooling is None:
        return None
    if pooling not in POOLINGS:
        raise ScanError(f"pooling: {pooling!r} is not one of {', '.join(POOLINGS)}", where=recipe.source)
    if recipe.kind != "encoder":
        raise ScanError(f"pooling applies to encoders; {recipe.arch} is not one", where=recipe.source)
    return pooling


def _recipe_from_config(path: Path, arch: str | None) -> Recipe:
    if not path.exists():
        raise ScanError("config file not found", where=str(path))
    if not arch:
        arch = (scan_config.check(path).get("architectures") or [None])[0]
        if not arch or not isinstance(arch, str):
            raise ScanError("config.json has no 'architectures'; give the model class with --arch", where=str(path))
    recipe = Recipe(model=path.stem, config=path, arch=arch, inputs={}, source=display_path(path))
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
        elif axis in RANK_AXES:
            for v in values:
                _check_input_value(axis, v, where)
        elif axis in recipe.inputs:
            for v in values:
                _check_input_value(axis, v, where)
            declared = recipe.inputs[axis]
            if axis in recipe.declared_inputs and declared != values[0]:
                raise ScanError(f"inputs.{axis} is {declared!r} but the {axis} axis starts with {values[0]!r}: "
                                "the first value of an axis is the default path's; drop it from inputs",
                                where=where)
        else:
            raise ScanError(f"unknown axis {axis!r}; axes: {', '.join([*RUNTIME_AXES, *RANK_AXES])} or an input of "
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


def display_path(path: Path) -> str:
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
    expert_ranks: int = 1  # >1: one rank of an expert-parallel deployment
    inputs: dict = field(default_factory=dict, hash=False)
    axes: dict = field(default_factory=dict, hash=False)  # the value of each axis the recipe declares

    def settings(self) -> dict:
        return {"name": self.name, "axes": self.axes, "cache": self.cache, "attention": self.attention,
                "experts": self.experts, "expert_ranks": self.expert_ranks, "inputs": self.inputs}


_INPUT_PARTS = {"batch": "b", "seq_len": "s", "text_len": "t", "audio_frames": "a", "image_size": "i", "images": "n"}


def _path(recipe: Recipe, values: dict) -> ScanPath:
    """The path of one combination of axis values; its name spells every declared axis' value."""
    parts = [values[a] for a in RUNTIME_AXES if a in values]
    inputs = dict(recipe.inputs)
    for key in recipe.inputs:
        if key in values:
            inputs[key] = values[key]
            v = values[key]
            parts.append(_INPUT_PARTS[key] + ("x".join(map(str, v)) if isinstance(v, list) else str(v)))
    # one rank of one is no parallelism: the path keeps the name it had without the axis
    parts += [f"{prefix}{values[axis]}" for axis, prefix in RANK_AXES.items() if values.get(axis, 1) != 1]
    return ScanPath("-".join(parts) or "default", cache=values.get("cache", "dynamic"), attention=values.get("attention"),
                    experts=values.get("experts"), expert_ranks=values.get("expert_ranks", 1), inputs=inputs,
                    axes=dict(values))

