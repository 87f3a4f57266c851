"""The numbers a case may carry into the store: tolerances, call counts and seeds.

Every reader of cases (manifests, v2 configs, traces, defaults) checks them here, so a value no
run can use never reaches the DB: an infinite or NaN tolerance passes everything and cannot be
written as JSON; a count or seed beyond SQLite's 64-bit integers cannot be stored or summed.
Errors are ValueErrors naming the key; readers add the file, line and case.
"""

from __future__ import annotations

import math

# Calls of one case in one model: real models make millions; 2^31 - 1 keeps the sum over every
# occurrence of a DB far from SQLite's 2^63 - 1 (an overflow there broke `models` and `stats`).
MAX_COUNT = 2**31 - 1
# A seed is stored as an SQLite INTEGER: a signed 64-bit value.
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1


def check_tolerance(value, label: str) -> float:
    """``value`` as a tolerance (a finite number >= 0; a numeric string is read as one), else
    ValueError naming ``label`` (``'rtol'``, ``precision.atol``...)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{label} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value < 0:
        raise ValueError(f"{label} must be a finite number >= 0, got {value!r}"
                         + ("; to accept any value, mark the case xfail or skip it instead"
                            if isinstance(value, float) and math.isinf(value) else ""))
    return float(value)


def check_count(value, label: str = "'count'") -> int:
    """``value`` as a call count (an integer from 1 to :data:`MAX_COUNT`), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"{label} (calls of this case in the model) must be an integer from 1 to "
                         f"{MAX_COUNT:,}, got {_shown(value)}")
    return value


def check_seed(value, label: str = "'seed'") -> int:
    """``value`` as a seed (an integer SQLite can store: -2^63 to 2^63 - 1), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{label} must be an integer, got {_shown(value)}")
    if not MIN_SEED <= value <= MAX_SEED:
        raise ValueError(f"{label} must be an integer from {MIN_SEED} to {MAX_SEED}, got {_shown(value)}")
    return value


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float: not a tolerance anyone means
        return False


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
