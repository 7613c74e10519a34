"""The dtypes graphc supports and their short names in the text IR (``f32[4,8]``).

bfloat16 is ml_dtypes' numpy dtype (the one JAX uses). It is a float to graphc although numpy
files it under kind "V": ask ``is_float``, never ``dtype.kind == "f"``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from graphc.core.errors import ShapeError

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

SHORT_NAMES: dict[np.dtype, str] = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint8): "u8",
    np.dtype(np.uint16): "u16",
    np.dtype(np.uint32): "u32",
    np.dtype(np.uint64): "u64",
    np.dtype(np.float16): "f16",
    BFLOAT16: "bf16",
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
}
BY_SHORT_NAME: dict[str, np.dtype] = {v: k for k, v in SHORT_NAMES.items()}
_CANONICAL_IDS = {id(dt): dt for dt in SHORT_NAMES}  # the dtype objects ``canonical`` returns


def canonical(dtype) -> np.dtype:
    """The numpy dtype for ``dtype`` (a dtype, type, or name), or ShapeError if unsupported."""
    known = _CANONICAL_IDS.get(id(dtype))
    if known is not None and known is dtype:  # one already (every TensorType asks)
        return known
    if isinstance(dtype, str) and dtype in BY_SHORT_NAME:
        return BY_SHORT_NAME[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ShapeError(f"not a dtype: {dtype!r}") from exc
    dt = dt.newbyteorder("=") if dt.byteorder not in "=|" else dt
    if dt not in SHORT_NAMES:
        raise ShapeError(f"dtype {dt} is not supported (supported: {', '.join(SHORT_NAMES.values())})")
    return dt


def short_name(dtype: np.dtype) -> str:
    return SHORT_NAMES[np.dtype(dtype)]


def is_float(dtype: np.dtype) -> bool:
    """float16/32/64 and bfloat16."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt == BFLOAT16


# bfloat16 and float16: an op computes on them in float32 and rounds its results (graphc/ops/precision.py)
LOW_FLOATS = frozenset({BFLOAT16, np.dtype(np.float16)})


def is_low_float(dtype) -> bool:
    """bfloat16 or float16: computed in float32, stored rounded."""
    return np.dtype(dtype) in LOW_FLOATS


def is_int(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in "iu"


def is_bool(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "b"


def additive_identity(dtype: np.dtype) -> np.ndarray:
    """The 0-d zero of ``dtype`` that leaves every value unchanged when added: -0.0 for floats
    (x + -0.0 is x for every x, where x + 0.0 turns -0.0 into 0.0)."""
    zero = np.zeros((), dtype)
    return np.negative(zero) if dtype.kind == "f" else zero
