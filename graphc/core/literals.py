"""How attribute values and constant arrays look in the text IR (graphc/core/ir.py prints graphs
with these; graphc/textir.py reads them back).

Constants are bit-exact: small finite arrays as nested lists, others as zlib-compressed base64 of
their little-endian bytes.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import hashlib
import json
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from graphc.core import dtypes

SMALL_ARRAY = 16  # constants with at most this many finite elements print as nested lists
_INT = {int}


def is_int_tuple(v: Any) -> bool:
    """Whether ``v`` is a tuple of plain ints (a shape, axes, a permutation: the usual tuple), or ()."""
    return type(v) is tuple and (not v or {*map(type, v)} == _INT)


def format_float(x: float) -> str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def format_literal(v: Any) -> str:
    if isinstance(v, tuple):  # first: a shape, axes, a permutation (a tuple of ints) is the usual attribute
        inner = ", ".join(map(str, v)) if is_int_tuple(v) else ", ".join(map(format_literal, v))
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, np.dtype):
        return dtypes.SHORT_NAMES.get(v) or dtypes.short_name(v)  # (a canonical dtype, the usual one: at once)
    if isinstance(v, np.ndarray):
        return format_array(v)
    raise TypeError(f"cannot print attribute value of type {type(v).__name__}")


def _scalar_text(x: np.generic) -> str:
    if x.dtype.kind == "b":
        return "true" if x else "false"
    if x.dtype.kind in "iu":
        return str(int(x))
    text = str(x) if x.dtype != np.float64 else repr(float(x))
    return text if any(c in text for c in ".en") else text + ".0"


def _nested(a: np.ndarray) -> str:
    if a.ndim == 0:
        return _scalar_text(a.reshape(1)[0])
    return "[" + ", ".join(_nested(x) for x in a) + "]"


def _small_form(a: np.ndarray) -> str | None:
    if a.size > SMALL_ARRAY or (dtypes.is_float(a.dtype) and not np.isfinite(a).all()):
        return None
    text = _nested(a)
    back = array_from_list(json.loads(text.replace("true", "1").replace("false", "0")), a.dtype, a.shape)
    return text if back.tobytes() == a.tobytes() else None


_DIGESTS = contextvars.ContextVar("graphc_array_digests", default=False)


@contextlib.contextmanager
def arrays_as_digests() -> Iterator[None]:
    """Inside: a large array literal prints as its SHA-256 (``array<f32[2048,2048]>#9f86...``), not
    as its compressed bytes. For hashing a graph's text (plan.py ``graph_hash``): the same bytes
    give the same text, at hashing speed instead of zlib's (0.3 s for a 2048 x 2048 mask). The
    text does not parse back."""
    token = _DIGESTS.set(True)
    try:
        yield
    finally:
        _DIGESTS.reset(token)


def format_array(a: np.ndarray) -> str:
    head = f"array<{dtypes.short_name(dtypes.canonical(a.dtype))}[{','.join(map(str, a.shape))}]>"
    small = _small_form(a)
    if small is not None:
        return head + small
    raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    if _DIGESTS.get():
        return head + "#" + hashlib.sha256(raw).hexdigest()
    return head + '"' + base64.b64encode(zlib.compress(raw, 6)).decode("ascii") + '"'


def array_from_list(data: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The array a literal's nested list ``data`` spells, of ``dtype`` and ``shape`` (an empty
    list stands for any empty shape)."""
    arr = np.array(data, dtype=dtype)
    if arr.size == 0 and 0 in shape:  # "[]" says nothing about the other dims of an empty array
        arr = arr.reshape(shape)
    if arr.shape != shape:
        raise ValueError(f"array literal has shape {arr.shape}, its type says {shape}")
    return arr
