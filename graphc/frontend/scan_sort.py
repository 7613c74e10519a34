"""numpy's scans, products, sorting and set membership on traced arrays, composed from the
primitives (pad, slice, add / mul, compare, reduce_sum, gather), so each is differentiable and
shardable through the rules of the primitives it is made of.

- ``cumsum`` / ``cumprod``: a Hillis-Steele scan, ceil(log2 n) steps of ``x + shift(x, k)``
  (``shift`` pads k identities in front and drops the last k). Sums of floats are added in a
  different order than numpy's running sum, so they agree to rounding (far apart in float16,
  whose running sum numpy rounds at every step; where numpy's running sum overflows to inf, a
  partial sum here may stay finite or meet -inf: docs/numpy_coverage.md); integer results are
  exact.
- ``prod``: pairwise products (the array padded with ones to a power of two, halves multiplied).
- ``sort`` / ``argsort`` over an axis of static length n: each element's rank is the number of
  elements that sort before it (n x n comparisons), and position r of the result takes the element
  of rank r. NaN sorts last, as in numpy. The order of equal elements is the stable one (numpy's
  ``kind='stable'``); numpy's default quicksort may order equal elements differently.
- ``isin``: an n x m comparison, reduced.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import TraceError
from graphc.frontend.functions import norm_axes, norm_axis, reject_unsupported, reshape_to, sum_dtype
from graphc.frontend.shape_functions import moveaxis, take_along_axis
from graphc.frontend.tracer import HANDLERS, Tracer, bind, convert, implements, lift, user_location
from graphc.frontend.ufuncs import apply_ufunc
from graphc.ops.reduction import reduced_shape

_MAX_SORT = 4096  # sort / argsort build n x n comparisons; beyond this the graph would be too large


def _identity(value: int, dt: np.dtype) -> int | float:
    """The identity of add (0) or mul (1) in ``dt``: the float sum's is -0.0 (x + -0.0 is x for
    every x, -0.0 included, where x + 0.0 turns -0.0 into 0.0)."""
    if not dtypes.is_float(dt):
        return int(value)
    return -0.0 if value == 0 else float(value)


def _shift(x: Tracer, k: int, axis: int, fill: int | float) -> Tracer:
    """y[..., i, ...] = x[..., i - k, ...] along ``axis``, ``fill`` for i < k."""
    widths = tuple((k, 0) if d == axis else (0, 0) for d in range(x.ndim))
    padded = bind("pad", x, widths=widths, value=fill)
    return bind("slice", padded, starts=(0,) * x.ndim, stops=x.shape, steps=(1,) * x.ndim)


def _scan(x: Tracer, axis: int, prim: str, identity: int) -> Tracer:
    """Inclusive scan of ``prim`` (add or mul) along ``axis``: after the step with shift k every
    element holds the combination of the 2k elements ending at it."""
    fill = _identity(identity, x.dtype)
    k = 1
    while k < x.shape[axis]:
        x = bind(prim, x, _shift(x, k, axis, fill))
        k *= 2
    return x


def _accumulate_dtype(x: Tracer, dtype: Any) -> np.dtype:
    """numpy's cumsum / cumprod / prod dtype: small ints and bools accumulate in int64 (uint64)."""
    return dtypes.canonical(dtype) if dtype is not None else sum_dtype(x.dtype)


def _ravel_0d(x: Tracer, axis: Any, fname: str) -> tuple[Tracer, Any]:
    """numpy's cumsum, cumprod and argsort of a 0-d array take axis 0 or -1 (an axis of a 1-d
    array) and ravel it; other axes raise numpy's AxisError."""
    if x.ndim == 0 and axis is not None:
        return reshape_to(x, (1,)), norm_axis(axis, 1, fname)
    return x, axis


def _cumulative(a: Any, axis: Any, dtype: Any, prim: str, identity: int, fname: str) -> Tracer:
    x, axis = _ravel_0d(lift(a), axis, fname)
    if axis is None:
        x, axis = reshape_to(x, (x.size,)), 0
    axis = norm_axis(axis, x.ndim, fname)
    dt = _accumulate_dtype(x, dtype)
    if dt.kind == "b":
        raise TraceError(f"numpy.{fname} with dtype=bool is not supported", user_location())
    return _scan(convert(x, dt), axis, prim, identity)


@implements(np.cumsum)
def cumsum(a, axis=None, dtype=None, out=None):
    reject_unsupported("cumsum", out=out)
    return _cumulative(a, axis, dtype, "add", 0, "cumsum")


@implements(np.cumprod)
def cumprod(a, axis=None, dtype=None, out=None):
    reject_unsupported("cumprod", out=out)
    return _cumulative(a, axis, dtype, "mul", 1, "cumprod")


def _pairwise_product(x: Tracer) -> Tracer:
    """The product over the last axis: pad with ones to a power of two, multiply the two halves
    until one element is left (an empty axis gives 1)."""
    n = x.shape[-1]
    size = 1
    while size < max(n, 1):
        size *= 2
    if size != n:
        widths = tuple((0, size - n) if d == x.ndim - 1 else (0, 0) for d in range(x.ndim))
        x = bind("pad", x, widths=widths, value=_identity(1, x.dtype))
    while size > 1:
        size //= 2
        low, high = (
            bind("slice", x, starts=(0,) * (x.ndim - 1) + (lo,), stops=x.shape[:-1] + (hi,), steps=(1,) * x.ndim)
            for lo, hi in ((0, size), (size, 2 * size))
        )
        x = bind("mul", low, high)
    return reshape_to(x, x.shape[:-1])


@implements(np.prod)
def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=np._NoValue, where=np._NoValue):
    reject_unsupported("prod", out=out, initial=initial, where=where)
    x = lift(a)
    x = convert(x, _accumulate_dtype(x, dtype))
    axes = norm_axes(axis, x.ndim, "prod")
    rest = [d for d in range(x.ndim) if d not in axes]
    moved = x if not axes or list(axes) == list(range(x.ndim - len(axes), x.ndim)) else None
    if moved is None:
        moved = bind("transpose", x, perm=tuple(rest) + tuple(axes))
    count = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    flat = reshape_to(moved, tuple(x.shape[d] for d in rest) + (count,))
    return reshape_to(_pairwise_product(flat), reduced_shape(x.shape, axes, bool(keepdims)))


# --- sorting ----------------------------------------------------------------------------------


def _sort_axis(a: Any, axis: Any, kind: Any, order: Any, fname: str) -> tuple[Tracer, int]:
    if order is not None:
        raise TraceError(f"numpy.{fname}: order= (structured arrays) is not supported", user_location())
    x = lift(a)
    if fname == "argsort":
        x, axis = _ravel_0d(x, axis, fname)
    if axis is None:
        x, axis = reshape_to(x, (x.size,)), 0
    if x.ndim == 0:
        raise TraceError(f"numpy.{fname} of a 0-d array: use axis=None", user_location())
    axis = norm_axis(axis, x.ndim, fname)
    if x.shape[axis] > _MAX_SORT:
        raise TraceError(
            f"numpy.{fname} over an axis of {x.shape[axis]} elements: graphc sorts with n x n comparisons "
            f"and supports at most {_MAX_SORT}",
            user_location(),
        )
    return x, axis


def _ranks(x: Tracer, axis: int) -> Tracer:
    """Each element's position in the stable ascending order along ``axis`` (NaN last): the count
    of elements less than it, plus the equal ones before it. int64, shaped like x."""
    moved = moveaxis(x, axis, -1)
    n = moved.shape[-1]
    mine = reshape_to(moved, moved.shape + (1,))  # [..., i, 1]
    other = reshape_to(moved, moved.shape[:-1] + (1, n))  # [..., 1, j]
    less = bind("compare", other, mine, direction="lt")
    equal = bind("compare", other, mine, direction="eq")
    if dtypes.is_float(x.dtype):  # NaN is greater than every number and equal to NaN
        mine_nan = bind("compare", mine, mine, direction="ne")
        other_nan = bind("compare", other, other, direction="ne")
        less = bind("logical_or", less, bind("logical_and", mine_nan, bind("logical_not", other_nan)))
        equal = bind("logical_or", equal, bind("logical_and", mine_nan, other_nan))
    before = lift(np.tri(n, n, -1, dtype=bool))  # [i, j]: j < i
    earlier_equal = bind("logical_and", equal, before)
    counts = bind("logical_or", less, earlier_equal)
    rank = bind("reduce_sum", convert(counts, np.int64), axes=(moved.ndim,), keepdims=False)
    return rank  # [..., i], axis last


def _order(x: Tracer, axis: int) -> Tracer:
    """argsort along ``axis`` with the axis moved last: position r holds the index of rank r."""
    rank = _ranks(x, axis)
    n = rank.shape[-1]
    positions = lift(np.arange(n, dtype=np.int64).reshape((1,) * (rank.ndim - 1) + (1, n)))  # [.., 1, r]
    hit = bind("compare", reshape_to(rank, rank.shape + (1,)), positions, direction="eq")  # [..., i, r]
    index = lift(np.arange(n, dtype=np.int64).reshape((1,) * (rank.ndim - 1) + (n, 1)))  # [..., i, 1]
    chosen = bind("where", hit, index, lift(np.zeros((), np.int64)))
    return bind("reduce_sum", chosen, axes=(rank.ndim - 1,), keepdims=False)


@implements(np.argsort)
def argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    x, axis = _sort_axis(a, axis, kind, order, "argsort")
    if x.shape[axis] == 0:
        return convert(x, np.int64)
    return moveaxis(_order(x, axis), -1, axis)


@implements(np.sort)
def sort(a, axis=-1, kind=None, order=None, *, stable=None):
    x, axis = _sort_axis(a, axis, kind, order, "sort")
    if x.shape[axis] == 0:
        return x
    order_last = _order(x, axis)
    return take_along_axis(x, moveaxis(order_last, -1, axis), axis=axis)


# --- set membership -------------------------------------------------------------------------------


@implements(np.isin)
def isin(element, test_elements, assume_unique=False, invert=False, *, kind=None):
    """``element`` compared with every test element (numpy's promotion), any along the tests."""
    x, tests = lift(element), lift(test_elements)
    flat = reshape_to(tests, (1,) * x.ndim + (tests.size,))
    hits = apply_ufunc(np.equal, reshape_to(x, x.shape + (1,)), flat)
    if tests.size == 0:
        found = lift(np.zeros(x.shape, bool)) if x.shape else lift(np.zeros((), bool))
    else:
        found = bind("reduce_max", hits, axes=(x.ndim,), keepdims=False)
    return bind("logical_not", found) if invert else found


# --- ndarray methods that are these functions -----------------------------------------------------


def _method(fn):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    return method


HANDLERS.methods.update(
    cumsum=_method(np.cumsum),
    cumprod=_method(np.cumprod),
    prod=_method(np.prod),
    argsort=_method(np.argsort),
)
HANDLERS.hints["ndarray.sort"] = (
    "; x.sort() sorts in place, which a graph cannot express: use x = np.sort(x, axis) instead"
)
