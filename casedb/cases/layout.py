"""The memory layout of one stored tensor input, in a word: what listings, reports and marks show.

A stored tensor spec (``shape``, ``dtype``, ``preset``, ``preset_args``) runs with the strides and
storage offset of its preset (:mod:`casedb.cases.presets`). Those read as one of:

* ``contiguous`` — row-major strides, no offset (no preset, or one that changes nothing);
* ``broadcast`` — a stride 0 along a dimension of size > 1 (an expanded tensor);
* ``offset`` — row-major strides starting past the beginning of the storage;
* ``transposed`` — dense (no gaps, no overlap) but with its dimensions permuted;
* ``strided`` — anything else: gaps between elements (a slice with a step), overlaps.

Dimensions of size 1 have no meaningful stride and are ignored; an empty tensor is contiguous.
Worked out from the spec alone (no torch), so every listing can afford it.
"""

from __future__ import annotations

import json

from casedb.cases import dtypes

LAYOUTS = ("contiguous", "strided", "transposed", "offset", "broadcast")


def shape_text(spec: dict) -> str:
    """``bf16[1, 11, 2880]``: a tensor spec's dtype and shape, as every casedb listing spells them."""
    return f"{dtypes.short(spec['dtype'])}[{', '.join(map(str, spec['shape']))}]"


def input_label(spec: dict) -> str:
    """``f32[1, 100, 128, 64] strided``: :func:`shape_text`, plus the layout word unless contiguous."""
    word = tensor_layout(spec)
    return shape_text(spec) if word == "contiguous" else f"{shape_text(spec)} {word}"


def inputs_summary(inputs: list, attrs: dict) -> str:
    """`bf16[1, 11, 2880], bf16[2880] transposed`: a case's inputs in short form, each tensor by
    :func:`input_label`, literals as written, keyword tensors as ``name=...`` (``cases.shapes``)."""
    parts = []
    for spec in inputs:
        if "tensor" in spec or "file" in spec:
            parts.append(input_label(spec.get("tensor") or spec["file"]))
        elif "tensor_list" in spec:
            parts.append("[" + ", ".join(input_label(t) for t in spec["tensor_list"]) + "]")
        elif "value" in spec:
            parts.append(json.dumps(spec["value"]))
        else:
            parts.append(spec["py"])
    for k, spec in attrs.items():
        if isinstance(spec, dict) and "tensor" in spec:
            parts.append(f"{k}={input_label(spec['tensor'])}")
    return ", ".join(parts)


def tensor_layout(spec: dict) -> str:
    """One of :data:`LAYOUTS` for a stored tensor spec (see the module docstring)."""
    shape = [int(n) for n in spec["shape"]]
    strides, offset = preset_strides(spec)
    return classify(shape, strides, offset)


def preset_strides(spec: dict) -> tuple[list[int], int]:
    """(strides, storage offset) the spec's preset gives, computed as the preset builds its view."""
    shape = [int(n) for n in spec["shape"]]
    name, args = spec.get("preset"), spec.get("preset_args") or {}
    if name == "strided":
        return [int(s) for s in args["stride"]], int(args.get("storage_offset", 0) or 0)
    if name == "noncontig_slice" and shape:
        dim, step = int(args.get("dim", -1)) % len(shape), int(args.get("step", 2))
        big = list(shape)
        big[dim] *= step
        strides = row_major(big)
        strides[dim] *= step
        return strides, 0
    if name == "transpose_view" and len(shape) >= 2:
        d0, d1 = int(args.get("dim0", 0)) % len(shape), int(args.get("dim1", 1)) % len(shape)
        swapped = list(shape)
        swapped[d0], swapped[d1] = swapped[d1], swapped[d0]
        strides = row_major(swapped)
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return strides, 0
    return row_major(shape), 0


def row_major(shape) -> list[int]:
    out, step = [], 1
    for n in reversed(list(shape)):
        out.append(step)
        step *= max(int(n), 1)
    return out[::-1]


def classify(shape: list[int], strides: list[int], offset: int) -> str:
    """The layout word for a view of ``shape`` with ``strides`` at ``offset``."""
    if any(n == 0 for n in shape):
        return "contiguous"
    dims = [(s, n) for n, s in zip(shape, strides) if n > 1]  # size-1 dims: any stride is the same view
    if any(s == 0 for s, _ in dims):
        return "broadcast"
    if _dense([s for s, _ in dims], [n for _, n in dims]):
        return "offset" if offset else "contiguous"
    ordered = sorted(dims, key=lambda sn: -sn[0])
    if _dense([s for s, _ in ordered], [n for _, n in ordered]):
        return "transposed"
    return "strided"


def _dense(strides: list[int], sizes: list[int]) -> bool:
    return strides == row_major(sizes)


def input_layouts(inputs: list, attrs: dict) -> list[dict]:
    """Each tensor argument's place, label and layout: ``{"input": "inputs[0]", "label":
    "bf16[4, 8] transposed", "layout": "transposed"}`` (a tensor list gives one per element,
    ``inputs[1][0]``; keyword tensors are ``attrs.<name>``); other arguments are left out."""
    out = []
    places = [(f"inputs[{i}]", spec) for i, spec in enumerate(inputs)]
    places += [(f"attrs.{k}", v) for k, v in attrs.items() if isinstance(v, dict)]
    for place, spec in places:
        if "tensor" in spec or "file" in spec:
            tensors = [(place, spec.get("tensor") or spec.get("file"))]
        elif "tensor_list" in spec:
            tensors = [(f"{place}[{j}]", t) for j, t in enumerate(spec["tensor_list"])]
        else:
            continue
        out += [{"input": where, "label": input_label(t), "layout": tensor_layout(t)} for where, t in tensors]
    return out


def case_layout(inputs: list, attrs: dict) -> str:
    """The case's tensor layouts in one facetable word: ``contiguous`` when every tensor input is,
    else its other layouts, sorted (``broadcast, transposed``); stored as ``cases.layout``."""
    words = sorted({d["layout"] for d in input_layouts(inputs, attrs)} - {"contiguous"})
    return ", ".join(words) or "contiguous"
