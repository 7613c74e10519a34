"""numpy functions that compute indices: ``np.nanargmax`` / ``np.nanargmin`` and ``np.unravel_index``.

numpy raises ValueError on data it cannot answer for (an all-NaN slice, an index past the array's
size). A traced value's data is known only when the graph runs, so each result passes through a
guard: a gather from ``arange(n)`` (which returns the index itself) at the result, or at ``n``
where numpy would raise. The gather raises IndexError at run time there, noted with the op and
the user's line (runtime/executor.py), so no wrong index is ever returned.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from graphc.core.errors import TraceError
from graphc.frontend.functions import (
    all_,
    argmax,
    argmin,
    full,
    norm_axis,
    reject_unsupported,
)
from graphc.frontend.tracer import Tracer, bind, convert, implements, lift, user_location
from graphc.frontend.ufuncs import apply_ufunc


def _guard(index: Tracer, bad: Tracer, n: int) -> Tracer:
    """``index`` (int64, each in [0, n) where ``bad`` is False, and never above n), raising
    IndexError at run time wherever ``bad`` holds: the gather from arange(n) at n."""
    index = bind("where", bad, full(index.shape, n, np.int64), index)
    return bind("gather", lift(np.arange(n, dtype=np.int64)), index, axis=0)


def _nan_arg(a: Any, axis: Any, out: Any, keepdims: bool, fname: str) -> Any:
    reject_unsupported(fname, out=out)
    x = lift(a)
    plain = argmax if fname == "nanargmax" else argmin
    if x.dtype.kind not in "fc":  # no NaN to skip: numpy's nanarg* is arg* there
        return plain(x, axis, keepdims=keepdims)
    if x.dtype.kind == "c":
        raise TraceError(f"numpy.{fname} of complex arrays is not supported while tracing", user_location())
    nan = apply_ufunc(np.isnan, x)
    filler = -np.inf if fname == "nanargmax" else np.inf  # numpy's own: NaN becomes -inf (+inf) first
    filled = bind("where", nan, full(x.shape, filler, x.dtype), x)
    index = cast(Tracer, plain(filled, axis, keepdims=keepdims))  # an empty axis raises here, as numpy
    if x.ndim == 0:
        n = 1
    elif axis is None:
        n = x.size
    else:
        n = x.shape[norm_axis(axis, x.ndim, fname)]
    all_nan = cast(Tracer, all_(nan, axis, keepdims=keepdims))
    return _guard(index, all_nan, n)


@implements(np.nanargmax)
def nanargmax(a, axis=None, out=None, *, keepdims=False):
    """numpy's: the first maximum ignoring NaN; an all-NaN slice raises at run time (numpy:
    ValueError at the call)."""
    return _nan_arg(a, axis, out, bool(keepdims), "nanargmax")


@implements(np.nanargmin)
def nanargmin(a, axis=None, out=None, *, keepdims=False):
    return _nan_arg(a, axis, out, bool(keepdims), "nanargmin")


@implements(np.unravel_index)
def unravel_index(indices, shape, order="C"):
    """numpy's: a tuple of int64 arrays, one per dim of ``shape`` (static), each of the shape of
    ``indices``; an index outside [0, prod(shape)) raises at run time (numpy: ValueError)."""
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    try:
        dims = tuple(int(d.__index__()) for d in dims)
    except (AttributeError, TypeError):
        raise TraceError(
            f"numpy.unravel_index: shape must be ints known when tracing, got {shape!r}", user_location()
        ) from None
    if any(d < 0 for d in dims):
        raise TraceError(f"numpy.unravel_index: dimensions must be non-negative, got {dims}", user_location())
    if order not in ("C", "F"):
        raise TraceError(f"numpy.unravel_index: order must be 'C' or 'F', got {order!r}", user_location())
    idx = lift(indices)
    if idx.dtype.kind not in "iu":
        raise TraceError(
            f"numpy.unravel_index: only int indices permitted (numpy's TypeError), got {idx.dtype}", user_location()
        )
    size = math.prod(dims)
    if size == 0 and idx.size > 0:
        raise TraceError(
            f"numpy.unravel_index: index out of bounds for array with size 0 (shape {dims})", user_location()
        )
    idx = convert(idx, np.int64)
    if idx.size == 0:
        return tuple(full(idx.shape, 0, np.int64) for _ in dims)
    idx = _guard(idx, apply_ufunc(np.less, idx, 0), size)  # numpy takes no negative index here
    order_dims = dims if order == "C" else dims[::-1]
    digits, stride = [], size
    for k, d in enumerate(order_dims):
        stride //= d
        digit = apply_ufunc(np.floor_divide, idx, stride) if stride > 1 else idx
        digits.append(apply_ufunc(np.remainder, digit, d) if k else digit)  # the first is < d: guarded
    return tuple(digits if order == "C" else digits[::-1])
