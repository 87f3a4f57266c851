"""Signature keys: one stable hash per distinct thing that is executed.

The key is ``sha256`` of a canonical JSON text of the *normalized* case:

``{"op": ..., "inputs": [...], "attrs": {...}, "seed": <explicit seed or null>}``

Normalization (done by :mod:`casedb.cases.spec` before hashing):

* **op** — surrounding whitespace removed; profiler spellings ``aten::add`` and
  ``aten.add.Tensor`` become ``torch.ops.aten.add`` / ``torch.ops.aten.add.Tensor``;
  ``F.x`` becomes ``torch.nn.functional.x``. Method and function forms stay distinct
  (``torch.Tensor.mul`` and ``torch.mul`` may dispatch differently).
* **dtypes** — every alias (``fp16``, ``float16``, ``torch.float16``, ``half``) becomes the
  torch name (``float16``); a tensor without a ``dtype`` gets the case's dtype, else the
  manifest ``default.dtype``, else ``float32`` — so the default is *in* the key.
* **tensor init** — resolved: ``randn`` for floating tensors, ``randint`` in [0, 10) for
  integers, ``rand`` (50 % True) for bool; ``randint``/``uniform`` bounds filled in. Writing the
  default explicitly gives the same key.
* **data / file tensors** — the values are replaced by the sha256 of their raw bytes (blob),
  so the same values give the same key whatever file or manifest they came from; the file
  path is not part of the key.
* **py literals** — re-printed in one canonical spelling (``...`` = ``Ellipsis``,
  ``slice(None)`` = ``slice(None, None, None)``, ``torch.half`` = ``torch.float16``).
* **string values** (``value:`` and keyword values) — read as a literal when they are one
  (:func:`casedb.cases.input_specs.literal_string`, the RFC implementation's rule): the result is keyed
  as if spelled natively (``"None"`` = ``null``, ``"[3, 64]"`` = ``[3, 64]``, ``"-inf"`` =
  ``-.inf``), or as ``py:`` text when YAML has no spelling for it (``"(2, 64)"`` =
  ``py: (2, 64)``); other strings stay strings. A ``dtype`` keyword ``fp16`` is
  ``torch.float16``.
* **numbers** — ``3`` and ``3.0`` are different values (they change result dtypes);
  ``1e-3`` and ``0.001`` are the same float.
* **key order** — JSON objects are written with sorted keys and no whitespace; lists keep
  their order.

Not in the key (judgement and bookkeeping only): case name, description, model, tolerances,
marks, ``skip_if``, ``xfail_if``, ``expects_error``, the manifest's ``default.seed``.

Input data is generated from :func:`data_seed`: the case's explicit ``seed`` if it has one,
else a number derived from the key — so the same case gives the same tensors whatever model
brought it in, on any machine.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _strip_paths(spec: Any) -> Any:
    # A file input is identified by its content only.
    if isinstance(spec, dict) and "file" in spec:
        return {"file": {k: v for k, v in spec["file"].items() if k != "path"}}
    return spec


def signature_payload(op: str, inputs: list, attrs: dict, seed: int | None) -> dict:
    return {
        "op": op,
        "inputs": [_strip_paths(s) for s in inputs],
        "attrs": {k: _strip_paths(v) for k, v in attrs.items()},
        "seed": seed,
    }


def signature(op: str, inputs: list, attrs: dict, seed: int | None) -> str:
    """The 64-hex-digit key of a normalized case."""
    text = canonical_json(signature_payload(op, inputs, attrs, seed))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def data_seed(signature_key: str, explicit_seed: int | None) -> int:
    """Seed for generating a case's input data."""
    if explicit_seed is not None:
        return int(explicit_seed)
    return int(signature_key[:8], 16)
