"""``np.linalg.inv`` and ``np.linalg.solve`` for small matrices, as Gauss-Jordan elimination with
partial pivoting unrolled over the static size n (n steps of pivot search, row swap and
elimination on [A | B], each a handful of primitives), so gradients come from the primitives' own
rules and batches of matrices are one graph.

numpy calls LAPACK (LU with partial pivoting, the same pivot choice): results agree to rounding.
A singular matrix gives inf or nan where numpy raises LinAlgError: the graph cannot raise on
values. Integer and bool matrices are solved in float64, as numpy does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import TraceError
from graphc.frontend.functions import broadcast, reshape_to
from graphc.frontend.shape_functions import take_along_axis
from graphc.frontend.tracer import Tracer, bind, convert, implements, lift, result_dtype, user_location

MAX_SIZE = 64  # the elimination is unrolled: n steps of about a dozen nodes each


def _square(a: Any, fname: str) -> Tracer:
    x = lift(a)
    if x.ndim < 2:
        raise TraceError(
            f"numpy.linalg.{fname}: {x.ndim}-dimensional array given. Array must be at least two-dimensional",
            user_location(),
        )
    if x.shape[-1] != x.shape[-2]:
        raise TraceError(f"numpy.linalg.{fname}: last 2 dimensions of the array must be square", user_location())
    if x.shape[-1] > MAX_SIZE:
        raise TraceError(
            f"numpy.linalg.{fname} of {x.shape[-1]}x{x.shape[-1]} matrices: graphc unrolls the elimination and "
            f"supports matrices up to {MAX_SIZE}x{MAX_SIZE}",
            user_location(),
        )
    if not dtypes.is_float(x.dtype):
        return convert(x, np.float64)
    if x.dtype.itemsize < 4:
        raise TraceError(f"numpy.linalg.{fname}: array type {x.dtype} is unsupported in linalg", user_location())
    return x


def _part(m: Tracer, rows: tuple[int, int], cols: tuple[int, int]) -> Tracer:
    """m[..., r0:r1, c0:c1]."""
    lead = m.ndim - 2
    return bind(
        "slice",
        m,
        starts=(0,) * lead + (rows[0], cols[0]),
        stops=m.shape[:lead] + (rows[1], cols[1]),
        steps=(1,) * m.ndim,
    )


def _gauss_jordan(m: Tracer, n: int) -> Tracer:
    """[A | B] -> [I | A^-1 B], pivoting on the largest remaining |entry| of each column."""
    width = m.shape[-1]
    row = lift(np.arange(n, dtype=np.int64).reshape(n, 1))  # [n, 1]
    zero = lift(np.zeros((), m.dtype))
    for k in range(n):
        below = bind("abs", _part(m, (k, n), (k, k + 1)))  # [..., n-k, 1]
        pivot = bind("add", bind("argmax", below, axis=m.ndim - 2, keepdims=True), lift(np.int64(k)))  # [..., 1, 1]
        at_k = bind("compare", row, lift(np.int64(k)), direction="eq")  # [n, 1]
        at_pivot = bind("compare", row, pivot, direction="eq")  # [..., n, 1]
        swapped = bind("where", at_k, pivot, bind("where", at_pivot, lift(np.int64(k)), row))  # [..., n, 1]
        m = take_along_axis(m, swapped, axis=-2)
        pivot_row = bind("div", _part(m, (k, k + 1), (0, width)), _part(m, (k, k + 1), (k, k + 1)))  # [..., 1, w]
        factor = bind("where", at_k, zero, _part(m, (0, n), (k, k + 1)))  # [..., n, 1]
        m = bind("sub", m, bind("mul", factor, pivot_row))
        m = bind("where", at_k, pivot_row, m)
    return m


@implements(np.linalg.inv)
def inv(a):
    x = _square(a, "inv")
    n = x.shape[-1]
    eye = broadcast(lift(np.eye(n, dtype=x.dtype)), x.shape)
    m = bind("concatenate", x, eye, axis=x.ndim - 1)
    return _part(_gauss_jordan(m, n), (0, n), (n, 2 * n))


@implements(np.linalg.solve)
def solve(a, b):
    """numpy 2's rule: ``b`` is a vector only when it is 1-d; otherwise its last two dims are
    (n, k) and the batch dims broadcast with ``a``'s."""
    x = _square(a, "solve")
    n = x.shape[-1]
    y = lift(b)
    vector = y.ndim == 1
    if vector:
        y = reshape_to(y, (y.shape[0], 1))
    if y.ndim < 2 or y.shape[-2] != n:
        raise TraceError(
            f"numpy.linalg.solve: b of shape {lift(b).shape} does not match a of shape {x.shape} "
            "(b is (..., n) only when 1-d, else (..., n, k))",
            user_location(),
        )
    dt = result_dtype(x, y)
    x, y = convert(x, dt), convert(y, dt if dtypes.is_float(dt) else np.float64)
    try:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]))
    except ValueError:
        raise TraceError(
            f"numpy.linalg.solve: batch dimensions of a {x.shape} and b {y.shape} do not broadcast", user_location()
        ) from None
    k = y.shape[-1]
    m = bind("concatenate", broadcast(x, batch + (n, n)), broadcast(y, batch + (n, k)), axis=len(batch) + 1)
    out = _part(_gauss_jordan(m, n), (0, n), (n, n + k))
    return reshape_to(out, batch + (n,)) if vector else out
