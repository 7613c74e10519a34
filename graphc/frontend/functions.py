"""numpy functions on traced arrays (``__array_function__``), decomposed onto the primitives.

Each handler mirrors the numpy signature it replaces; arguments that change semantics in ways the
graph cannot express (``out=``, ``where=``, non-constant modes) raise a TraceError naming the function.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any, Literal, cast

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import TraceError, numpy_error
from graphc.frontend.shadows import shadow_of
from graphc.frontend.tracer import (
    HANDLERS,
    Tracer,
    bind,
    convert,
    implements,
    lift,
    rebind,
    result_dtype,
    user_location,
)
from graphc.frontend.ufuncs import apply_ufunc, resolve_loop
from graphc.frontend.views import diagonal_view
from graphc.ops.reduction import reduced_shape


def reject_unsupported(fname: str, **given: Any) -> None:
    """TraceError naming the first keyword argument of ``numpy.fname`` that was given (not None
    and not numpy's no-value marker): graphc does not trace it."""
    for name, value in given.items():
        if value is not None and value is not np._NoValue:
            raise TraceError(f"numpy.{fname}: argument {name}= is not supported while tracing", user_location())


def norm_axis(axis: Any, ndim: int, fname: str = "") -> int:
    """``axis`` in [0, ndim); numpy's errors otherwise (a TraceError that is also numpy's AxisError
    or TypeError, core/errors.py numpy_error)."""
    try:
        axis = int(axis.__index__())
    except (AttributeError, TypeError):
        raise numpy_error(
            TypeError(f"{fname}: axis must be an integer, got {axis!r}"), TraceError, user_location()
        ) from None
    if not -ndim <= axis < ndim:
        raise numpy_error(np.exceptions.AxisError(axis, ndim, fname or None), TraceError, user_location())
    return axis % ndim


def norm_axes(axis: Any, ndim: int, fname: str = "") -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(norm_axis(a, ndim, fname) for a in axis)
        if len(set(axes)) != len(axes):
            raise TraceError(f"{fname}: repeated axis in {axis}", user_location())
        return tuple(sorted(axes))
    return (norm_axis(axis, ndim, fname),)


def reshape_to(x: Tracer, shape: tuple[int, ...]) -> Tracer:
    shape = tuple(shape)
    return x if x.shape == shape else bind("reshape", x, shape=shape)


def broadcast(x: Tracer, shape: tuple[int, ...]) -> Tracer:
    shape = tuple(shape)
    return x if x.shape == shape else bind("broadcast_to", x, shape=shape)


def full(shape: tuple[int, ...], value: Any, dtype: Any) -> Tracer:
    return broadcast(lift(np.asarray(value, dtype=dtypes.canonical(dtype))), shape)


# --- reductions ------------------------------------------------------------------------------


def sum_dtype(dt: np.dtype) -> np.dtype:
    """numpy's accumulation dtype of a sum: bools and small ints add up in int64 (uint64)."""
    if dt.kind == "b" or (dt.kind == "i" and dt.itemsize < 8):
        return np.dtype(np.int64)
    if dt.kind == "u" and dt.itemsize < 8:
        return np.dtype(np.uint64)
    return dt


def ufunc_reduce_axes(axis: Any, ndim: int, fname: str) -> tuple[int, ...]:
    """The axes of a ufunc reduction (np.sum, max, min, all, any): ``norm_axes``, except that numpy
    accepts a single integer axis 0 or -1 on a 0-d array (and reduces nothing); a tuple is checked."""
    if ndim == 0 and not isinstance(axis, (tuple, list)) and axis is not None and not isinstance(axis, bool):
        try:
            if int(axis.__index__()) in (0, -1):
                return ()
        except (AttributeError, TypeError):
            pass
    return norm_axes(axis, ndim, fname)


def _reduce(prim: str, a: Any, axis: Any, keepdims: bool, fname: str) -> Tracer:
    x = lift(a)
    axes = ufunc_reduce_axes(axis, x.ndim, fname)
    if not axes and prim != "reduce_sum":
        return x
    # (numpy's sums start from +0.0, also over no axes: the sum of -0.0, or of a 0-d -0.0, is 0.0)
    return bind(prim, x, axes=axes, keepdims=bool(keepdims))


@implements(np.sum)
def sum_(a, axis=None, dtype=None, out=None, keepdims=False, initial=np._NoValue, where=np._NoValue):
    reject_unsupported("sum", out=out, initial=initial, where=where)
    x = lift(a)
    x = convert(x, dtype if dtype is not None else sum_dtype(x.dtype))
    return _reduce("reduce_sum", x, axis, keepdims, "sum")


def _count(x: Tracer, axes: tuple[int, ...]) -> int:
    return int(np.prod([x.shape[a] for a in axes], dtype=np.int64))


@implements(np.mean)
def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=np._NoValue):
    reject_unsupported("mean", out=out, where=where)
    x = lift(a)
    axes = norm_axes(axis, x.ndim, "mean")
    acc = (
        dtypes.canonical(dtype)
        if dtype is not None
        else (
            np.dtype(np.float64)
            if x.dtype.kind in "biu"
            else np.dtype(np.float32)
            if x.dtype == np.float16
            else x.dtype
        )
    )
    total = sum_(x, axes, dtype=acc, keepdims=keepdims)
    res = apply_ufunc(np.true_divide, total, np.asarray(_count(x, axes), dtype=acc))
    final = dtypes.canonical(dtype) if dtype is not None else (np.dtype(np.float16) if x.dtype == np.float16 else acc)
    return convert(res, final)


@implements(np.var)
def var(
    a,
    axis=None,
    dtype=None,
    out=None,
    ddof=0,
    keepdims=False,
    *,
    where=np._NoValue,
    mean=np._NoValue,
    correction=np._NoValue,
):
    reject_unsupported("var", out=out, where=where, mean=mean, correction=correction)
    x = lift(a)
    axes = norm_axes(axis, x.ndim, "var")
    acc = dtypes.canonical(dtype) if dtype is not None else (np.dtype(np.float64) if x.dtype.kind in "biu" else x.dtype)
    # numpy's own algorithm: mean with keepdims, squared deviations, their sum / (n - ddof)
    m = globals()["mean"](x, axes, dtype=acc, keepdims=True)
    d = apply_ufunc(np.subtract, lift(x, acc), m)
    total = sum_(apply_ufunc(np.multiply, d, d), axes, dtype=acc, keepdims=keepdims)
    return apply_ufunc(np.true_divide, total, np.asarray(max(_count(x, axes) - ddof, 0), dtype=acc))


@implements(np.std)
def std(
    a,
    axis=None,
    dtype=None,
    out=None,
    ddof=0,
    keepdims=False,
    *,
    where=np._NoValue,
    mean=np._NoValue,
    correction=np._NoValue,
):
    reject_unsupported("std", out=out, where=where, mean=mean, correction=correction)
    v = var(a, axis, dtype, ddof=ddof, keepdims=keepdims)
    # std is 0 where all the elements are equal (or there is one): its minimum, where sqrt's
    # derivative at 0 makes a nan (JAX's too) but 0 is the derivative along every direction that
    # keeps them equal. There var passes its own (0) on; the inner where keeps sqrt's derivative
    # away from 0. The values are sqrt(var)'s, nan included.
    select = globals()["where"]
    positive = apply_ufunc(np.greater, v, 0)
    return select(positive, apply_ufunc(np.sqrt, select(positive, v, 1)), v)


@implements(np.max, np.amax)
def max_(a, axis=None, out=None, keepdims=False, initial=np._NoValue, where=np._NoValue):
    reject_unsupported("max", out=out, initial=initial, where=where)
    return _reduce("reduce_max", a, axis, keepdims, "max")


@implements(np.min, np.amin)
def min_(a, axis=None, out=None, keepdims=False, initial=np._NoValue, where=np._NoValue):
    reject_unsupported("min", out=out, initial=initial, where=where)
    return _reduce("reduce_min", a, axis, keepdims, "min")


def _logical_reduce(prim: str, a: Any, axis: Any, keepdims: bool, fname: str, empty: bool) -> Tracer:
    """np.all / np.any: min / max of ``x != 0``; over a zero-size axis numpy gives the identity
    (True for all, False for any), which reduce_min / reduce_max do not have."""
    x = lift(a)
    if x.dtype.kind != "b":
        x = apply_ufunc(np.not_equal, x, 0)
    axes = ufunc_reduce_axes(axis, x.ndim, fname)
    if any(x.shape[i] == 0 for i in axes):
        return full(reduced_shape(x.shape, axes, bool(keepdims)), empty, np.bool_)
    return _reduce(prim, x, axes, keepdims, fname)


@implements(np.all)
def all_(a, axis=None, out=None, keepdims=False, *, where=np._NoValue):
    reject_unsupported("all", out=out, where=where)
    return _logical_reduce("reduce_min", a, axis, keepdims, "all", True)


@implements(np.any)
def any_(a, axis=None, out=None, keepdims=False, *, where=np._NoValue):
    reject_unsupported("any", out=out, where=where)
    return _logical_reduce("reduce_max", a, axis, keepdims, "any", False)


def _arg_reduce(x: Tracer, axis: Any, keepdims: bool, fname: str, first_index: Callable) -> Tracer:
    """``first_index(x, axis)`` over one axis, or over the flattened array when axis is None."""
    if x.ndim == 0 and axis is not None:  # numpy ravels a 0-d array first: axis 0 or -1, result 0
        norm_axis(axis, 1, fname)
        return lift(np.zeros((), np.int64))
    flat, ndim = axis is None, x.ndim
    if flat:
        x, axis = reshape_to(x, (x.size,)), 0
    axis = norm_axis(axis, x.ndim, fname)
    if x.shape[axis] == 0:
        raise TraceError(f"attempt to get {fname} of an empty sequence", user_location())
    res = first_index(x, axis, bool(keepdims) and not flat)
    return reshape_to(res, (1,) * ndim) if flat and keepdims else res


def _first_max(x: Tracer, axis: int, keepdims: bool) -> Tracer:
    return bind("argmax", x, axis=axis, keepdims=keepdims)


def _first_min(x: Tracer, axis: int, keepdims: bool) -> Tracer:
    """Floats: argmax(-x) (negation is exact and keeps nan, and numpy's argmin is the first nan if
    there is one). Ints and bools: the first index where x == min(x) (-x would overflow for the
    most negative int and does not exist for unsigned ints and bools)."""
    if dtypes.is_float(x.dtype):
        return _first_max(bind("neg", x), axis, keepdims)
    low = bind("reduce_min", x, axes=(axis,), keepdims=True)
    return _first_max(bind("compare", x, low, direction="eq"), axis, keepdims)


@implements(np.argmax)
def argmax(a, axis=None, out=None, *, keepdims=False):
    reject_unsupported("argmax", out=out)
    return _arg_reduce(lift(a), axis, keepdims, "argmax", _first_max)


@implements(np.argmin)
def argmin(a, axis=None, out=None, *, keepdims=False):
    reject_unsupported("argmin", out=out)
    return _arg_reduce(lift(a), axis, keepdims, "argmin", _first_min)


# --- elementwise helpers that are functions, not ufuncs ------------------------------------------


@implements(np.where)
def where(condition, x=None, y=None):
    if x is None or y is None:
        raise TraceError(
            "numpy.where(condition) with one argument returns the indices where condition holds, a "
            "data-dependent shape a graph cannot have; keep the shape static with the three-argument form, "
            "np.where(condition, x, 0), or count with np.sum(condition)",
            user_location(),
        )
    c = lift(condition)
    if c.dtype.kind != "b":
        c = apply_ufunc(np.not_equal, c, 0)
    dt = result_dtype(x, y)
    return bind("where", c, _where_operand(x, dt), _where_operand(y, dt))


def _where_operand(v: Any, dt: np.dtype) -> Tracer:
    """np.where casts a Python number that does not fit the result dtype as astype does (int8 with
    -129 is 127, float16 with 1e300 is inf), where ufuncs raise OverflowError."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        with np.errstate(over="ignore", invalid="ignore"):
            return lift(np.asarray(v).astype(dt))
    return lift(v, dt)


def write_out(
    what: str,
    result: Tracer,
    out: Any,
    casting: Literal["no", "equiv", "safe", "same_kind", "unsafe"] = "same_kind",
    where: Any = True,
) -> Tracer:
    """``result`` written into ``out`` (a function's ``out=``, an array or a 1-tuple of one): the
    out array, a Tracer, takes the new value, as numpy's in-place write changes it for every name
    holding it; a numpy out array is replaced by the Tracer that stands for it (shadows.py), which
    the source transform assigns to the name passed as ``out=`` (``autograph_runtime.written``).
    Returns the out array (that Tracer), as numpy does."""
    if isinstance(out, tuple):
        if len(out) != 1:
            raise TraceError(f"{what}: out= must be an array or a tuple of one array here", user_location())
        out = out[0]
    if isinstance(out, np.generic) or (isinstance(out, Tracer) and (out._scalar or out._weak)):
        raise numpy_error(TypeError("return arrays must be of ArrayType"), TraceError, user_location())
    if np.broadcast_shapes(result.shape, out.shape) != out.shape:
        raise TraceError(
            f"non-broadcastable output operand with shape {out.shape} doesn't match the broadcast shape {result.shape}",
            user_location(),
        )
    if not np.can_cast(result.dtype, out.dtype, casting):
        raise TraceError(
            f"Cannot cast {what} output from {result.dtype} to {out.dtype} with casting rule "
            f"'{casting}' (numpy raises here too)",
            user_location(),
        )
    target = out if isinstance(out, Tracer) else shadow_of(out)
    new = broadcast(convert(result, out.dtype), out.shape)
    if where is not True:
        new = cast(Tracer, np.where(where, new, target))
    return rebind(target, new)


@implements(np.clip)
def clip(a, a_min=np._NoValue, a_max=np._NoValue, out=None, *, min=np._NoValue, max=np._NoValue, **kwargs):
    """numpy's np.clip (numpy/_core/_methods.py ``_clip``): for an integer array a Python int bound
    beyond the dtype's range is dropped (it clips nothing) instead of overflowing; no bound is
    np.positive, one bound np.maximum or np.minimum, two the clip ufunc, typed over all three
    operands (``_clip_both``). ``out=`` is written as a ufunc's is (``write_out``)."""
    if out is not None:
        return write_out("clip", clip(a, a_min, a_max, min=min, max=max, **kwargs), out)
    lo = a_min if a_min is not np._NoValue else (None if min is np._NoValue else min)
    hi = a_max if a_max is not np._NoValue else (None if max is np._NoValue else max)
    res = lift(a)
    if res.dtype.kind in "iu":
        info = np.iinfo(res.dtype)
        lo = None if type(lo) is int and lo <= info.min else lo
        hi = None if type(hi) is int and hi >= info.max else hi
    if lo is None and hi is None:
        return apply_ufunc(np.positive, res)
    if lo is None:
        return apply_ufunc(np.minimum, res, hi)
    if hi is None:
        return apply_ufunc(np.maximum, res, lo)
    return _clip_both(res, lo, hi)


_CLIP: np.ufunc = np.__dict__["_core"].umath.clip  # the ufunc np.clip calls (numpy/_core/_methods.py)


def _clip_both(a: Tracer, lo: Any, hi: Any) -> Tracer:
    """The clip ufunc: min(max(x, lo), hi), nan-propagating; except that its float loop, when both
    bounds reach it as scalars (stride 0: 0-d, or of size 1 and broadcast), keeps x on ties (-0.0
    clipped to [0.0, 1.0] stays -0.0), as ``m = lo if lo > x or lo is nan else x``, then
    ``hi if hi < m or hi is nan else m``."""
    sig = resolve_loop(_CLIP, (a, lo, hi))
    x, low, high = (lift(v, dt) for v, dt in zip((a, lo, hi), sig[:3]))
    shape = tuple(np.broadcast_shapes(x.shape, low.shape, high.shape))
    trivial = all(v.ndim == 0 or v.shape == shape for v in (x, low, high))  # numpy's loop without an iterator

    def scalar(v: Tracer) -> bool:
        return v.ndim == 0 or (v.size == 1 and not trivial)

    if not (sig[0].kind == "f" and scalar(low) and scalar(high)):
        return bind("minimum", bind("maximum", x, low), high)
    raise_low = bind("logical_or", bind("compare", low, x, direction="gt"), bind("compare", low, low, direction="ne"))
    m = bind("where", raise_low, low, x)
    lower_high = bind(
        "logical_or", bind("compare", high, m, direction="lt"), bind("compare", high, high, direction="ne")
    )
    return bind("where", lower_high, high, m)


@implements(np.isclose)
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """numpy's definition (numpy/_core/numeric.py): b is made inexact first (ints become float64,
    so a - b and abs(b) cannot overflow), then
    ``(abs(a - b) <= atol + rtol * abs(b)) & isfinite(b) | (a == b)``, and with equal_nan
    ``| isnan(a) & isnan(b)``. Python scalars stay weak, as in numpy."""
    x = a if isinstance(a, (int, float)) else lift(a)
    y: float | Tracer
    if isinstance(b, (int, float)) and not isinstance(b, np.generic):
        y = float(b)
    else:
        lifted = lift(b)
        y = convert(lifted, result_dtype(lifted, 1.0))
    atol, rtol = (t if isinstance(t, (int, float)) else lift(t) for t in (atol, rtol))
    diff = apply_ufunc(np.absolute, apply_ufunc(np.subtract, x, y))
    tol = apply_ufunc(np.add, atol, apply_ufunc(np.multiply, rtol, apply_ufunc(np.absolute, y)))
    close = apply_ufunc(np.logical_and, apply_ufunc(np.less_equal, diff, tol), apply_ufunc(np.isfinite, y))
    result = apply_ufunc(np.logical_or, close, apply_ufunc(np.equal, x, y))
    if equal_nan:
        both_nan = apply_ufunc(np.logical_and, apply_ufunc(np.isnan, x), apply_ufunc(np.isnan, y))
        result = apply_ufunc(np.logical_or, result, both_nan)
    return result


def _is_signed_inf(x: Any, out: Any, negative: bool, fname: str) -> Tracer:
    """numpy's isneginf / isposinf: ``isinf(x) & signbit(x)`` (or ``~signbit``); on an infinity
    the sign bit is ``x < 0``. Integers and bools are never infinite. ``out=`` as a ufunc's."""
    t = lift(x)
    sign = apply_ufunc(np.less if negative else np.greater, t, 0)
    result = apply_ufunc(np.logical_and, apply_ufunc(np.isinf, t), sign)
    return result if out is None else write_out(f"numpy.{fname}", result, out)


@implements(np.isneginf)
def isneginf(x, out=None):
    return _is_signed_inf(x, out, True, "isneginf")


@implements(np.isposinf)
def isposinf(x, out=None):
    return _is_signed_inf(x, out, False, "isposinf")


@implements(np.allclose)
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """numpy returns a Python bool; a traced one is a 0-d bool array."""
    return all_(isclose(a, b, rtol, atol, equal_nan))


@implements(np.count_nonzero)
def count_nonzero(a, axis=None, *, keepdims=False):
    x = lift(a)
    return sum_(apply_ufunc(np.not_equal, x, 0), axis, keepdims=keepdims)


@implements(np.result_type)
def result_type(*arrays_and_dtypes):
    """numpy's result_type, a traced array counting by its dtype (a weak one as a Python number)."""
    return result_dtype(*arrays_and_dtypes)


# numpy functions whose result has one entry per element that passes a test: its shape depends
# on the data, which a graph's static shapes cannot hold
_DATA_DEPENDENT: dict[Callable, str] = {
    np.nonzero: "np.where(x != 0, x, 0) keeps the shape; np.count_nonzero(x) counts",
    np.argwhere: "np.where(condition, x, 0) keeps the shape; np.sum(condition) counts",
    np.flatnonzero: "np.where(x.ravel() != 0, x.ravel(), 0) keeps the shape; np.count_nonzero(x) counts",
    np.unique: "for values known to lie in range(k), np.sum(x.reshape(-1, 1) == np.arange(k), axis=0) counts each",
    np.extract: "np.where(condition, x, 0) keeps the shape",
    np.compress: "np.where(condition, x, 0) keeps the shape (or x[static_indices] with indices known in advance)",
    np.trim_zeros: "slice with static bounds instead",
}


def _data_dependent(func: Callable) -> Callable:
    def reject(*args, **kwargs):
        raise TraceError(
            f"numpy.{func.__name__} on a traced array has a data-dependent shape (it depends on the values), "
            f"which a graph cannot have; {_DATA_DEPENDENT[func]}",
            user_location(),
        )

    return reject


for _func in _DATA_DEPENDENT:
    implements(_func)(_data_dependent(_func))
HANDLERS.methods["nonzero"] = lambda self: np.nonzero(self)

# the supported rewrite of common numpy calls graphc does not implement (named in the TraceError)
HANDLERS.hints.update(
    {
        "numpy.argpartition": "; use np.argsort(x, axis), which puts the k smallest first (sorted)",
        "numpy.partition": "; use np.sort(x, axis), which puts the k smallest first",
        "numpy.median": "; use np.sort(x, axis) and a static index (the middle one, or the mean of the two)",
        "numpy.percentile": "; use np.sort(x, axis) and static indices",
        "numpy.quantile": "; use np.sort(x, axis) and static indices",
        "numpy.diff": "; use x[..., 1:] - x[..., :-1]",
        "numpy.roll": "; use np.concatenate([x[..., -k:], x[..., :-k]], axis=-1)",
        "numpy.diag": "; use x * np.eye(n) for a vector x, np.einsum('ii->i', x) for a matrix",
        "numpy.diagonal": "; use np.einsum('ii->i', x)",
        "numpy.trace": "; use np.einsum('ii', x)",
        "numpy.average": "; use np.sum(x * w, axis) / np.sum(w, axis)",
        "numpy.searchsorted": "; use np.sum(sorted_values <= x[..., None], axis=-1) (side='right')",
        "numpy.nan_to_num": "; use np.where(np.isnan(x), 0.0, x) (and np.clip for infinities)",
        "numpy.dstack": "; use np.stack(arrays, axis=2) (or np.concatenate for 3-d arrays)",
        "numpy.linalg.det": "; write the 2x2 or 3x3 formula (np.linalg.inv and np.linalg.solve are supported)",
        "ndarray.diagonal": "; use np.einsum('ii->i', x)",
        "ndarray.fill": "; x.fill(v) writes in place: use x = np.full_like(x, v)",
        "ndarray.resize": "; use x.reshape(shape) (or np.pad to grow)",
    }
)
HANDLERS.methods["compress"] = lambda self, condition, axis=None: np.compress(condition, self, axis)


# --- contractions ----------------------------------------------------------------------------


def _bool_contraction(contract: Callable, *operands: Any) -> Tracer:
    """numpy contracts bool operands in bool (a logical or of ands); the primitives have no bool
    form, so count the true products in int64 and compare with 0."""
    return apply_ufunc(np.not_equal, contract(*(lift(x, np.dtype(np.int64)) for x in operands)), 0)


def matmul(a: Any, b: Any) -> Tracer:
    """np.matmul with numpy's 1-d rules: a 1-d left operand is a row, a 1-d right one a column."""
    dt = result_dtype(a, b)
    if dt.kind == "b":
        return _bool_contraction(matmul, a, b)
    x, y = lift(a, dt), lift(b, dt)
    if x.ndim == 0 or y.ndim == 0:
        raise TraceError(
            "matmul: input operand does not have enough dimensions (scalars are not allowed)", user_location()
        )
    x2 = reshape_to(x, (1, x.shape[0])) if x.ndim == 1 else x
    y2 = reshape_to(y, (y.shape[0], 1)) if y.ndim == 1 else y
    out = bind("matmul", x2, y2)
    shape = out.shape
    if x.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if y.ndim == 1:
        shape = shape[:-1]
    return reshape_to(out, shape)


HANDLERS.gufuncs[np.matmul] = matmul


@implements(np.dot)
def dot(a, b, out=None):
    reject_unsupported("dot", out=out)
    x, y = lift(a), lift(b)
    if x.ndim == 0 or y.ndim == 0:
        return apply_ufunc(np.multiply, x, y)
    if y.ndim <= 2:
        return matmul(x, y)
    # dot(a, b)[i, j, k, m] = sum(a[i, j, :] * b[k, :, m])
    letters = iter(string.ascii_letters)
    sa = [next(letters) for _ in range(x.ndim)]
    sb = [next(letters) for _ in range(y.ndim)]
    sb[-2] = sa[-1]
    out_s = sa[:-1] + sb[:-2] + sb[-1:]
    return einsum(f"{''.join(sa)},{''.join(sb)}->{''.join(out_s)}", x, y)


@implements(np.inner)
def inner(a, b):
    """numpy's inner: products summed over the last axes, result shape a.shape[:-1] + b.shape[:-1];
    a 0-d operand just multiplies. Python scalars count as arrays here (float64, not weak)."""
    x, y = lift(a), lift(b)
    if x.ndim == 0 or y.ndim == 0:
        return apply_ufunc(np.multiply, x, y)
    if x.shape[-1] != y.shape[-1]:
        raise TraceError(
            f"inner: shapes {x.shape} and {y.shape} not aligned: {x.shape[-1]} (dim {x.ndim - 1}) != "
            f"{y.shape[-1]} (dim {y.ndim - 1})",
            user_location(),
        )
    if x.ndim == 1 and y.ndim == 1:
        return matmul(x, y)
    letters = iter(string.ascii_letters)
    sa = "".join(next(letters) for _ in range(x.ndim))
    sb = "".join(next(letters) for _ in range(y.ndim - 1)) + sa[-1]
    return einsum(f"{sa},{sb}->{sa[:-1]}{sb[:-1]}", x, y)


@implements(np.vdot)
def vdot(a, b):
    """numpy's vdot flattens both operands, which must have the same size, and takes their dot."""
    x, y = lift(a), lift(b)
    if x.size != y.size:
        raise TraceError(f"vdot: vectors have different lengths ({x.size} and {y.size})", user_location())
    return matmul(reshape_to(x, (x.size,)), reshape_to(y, (y.size,)))


@implements(np.outer)
def outer(a, b, out=None):
    reject_unsupported("outer", out=out)
    x, y = lift(a), lift(b)
    return apply_ufunc(np.multiply, reshape_to(x, (x.size, 1)), reshape_to(y, (1, y.size)))


def _expand_einsum(subscripts: str, operands: list[Tracer]) -> tuple[list[str], str]:
    """Explicit form with single letters: expand '...' and add the implicit output (numpy's rule:
    the '...' dims, then the letters that appear once, sorted). Returns (input specs, output spec)."""
    eq = subscripts.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise TraceError(
            f"einsum: {subscripts!r} names {len(ins)} operands but {len(operands)} were given", user_location()
        )
    for i, (s, x) in enumerate(zip(ins, operands)):
        named = len(s.replace("...", ""))
        if named != x.ndim and ("..." not in s or named > x.ndim):
            raise TraceError(
                f"einsum: operand {i} has {x.ndim} dimensions but its subscripts {s!r} name {named}"
                + ("" if "..." in s else " (and there is no '...' for the rest)"),
                user_location(),
            )
    used = set(c for c in eq if c.isalpha())
    free = iter(c for c in string.ascii_letters if c not in used)
    ell_rank = max((x.ndim - len(s.replace("...", "")) for s, x in zip(ins, operands) if "..." in s), default=0)
    ell = "".join(next(free) for _ in range(ell_rank))
    new_ins = []
    for s, x in zip(ins, operands):
        if "..." in s:
            k = x.ndim - len(s.replace("...", ""))
            s = s.replace("...", ell[ell_rank - k :] if k else "")
        new_ins.append(s)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for c in "".join(new_ins):
            counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    repeated = sorted(c for c in set(out) if out.count(c) > 1)
    if repeated:
        raise TraceError(f"einsum: output subscript {repeated[0]!r} appears more than once", user_location())
    return new_ins, out


def _einsum_diagonal(spec: str, x: Tracer, i: int) -> tuple[str, Tracer]:
    """A letter repeated within one operand ('ii->i', 'iij->j') takes the diagonal over its dims:
    those dims go first, then x[arange(n), arange(n), ...] leaves one dim for the letter."""
    while True:
        letter = next((c for c in spec if spec.count(c) > 1), None)
        if letter is None:
            return spec, x
        dims = [d for d, c in enumerate(spec) if c == letter]
        sizes = [x.shape[d] for d in dims]
        if len(set(sizes)) > 1:
            raise TraceError(
                f"einsum: dimensions in operand {i} for collapsing index {letter!r} don't match ({' != '.join(map(str, sizes))})",
                user_location(),
            )
        rest = [d for d in range(x.ndim) if d not in dims]
        if dims + rest != list(range(x.ndim)):
            x = bind("transpose", x, perm=tuple(dims + rest))
        idx = lift(np.arange(sizes[0]))
        x = bind("gather", x, *([idx] * len(dims)), axis=0)
        spec = letter + "".join(spec[d] for d in rest)


def _einsum_broadcast(specs: list[str], xs: list[Tracer]) -> list[Tracer]:
    """numpy broadcasts a size-1 dim against the size the same letter has in the other operands."""
    sizes: dict[str, int] = {}
    for spec, x in zip(specs, xs):
        for c, n in zip(spec, x.shape):
            m = sizes.setdefault(c, n)
            if n != m and 1 not in (n, m):
                raise TraceError(
                    f"einsum: operands could not be broadcast together: index {c!r} has size {m} in one operand and {n} in another",
                    user_location(),
                )
            sizes[c] = n if m == 1 else m
    return [broadcast(x, tuple(sizes[c] for c in spec)) for spec, x in zip(specs, xs)]


@implements(np.einsum)
def einsum(subscripts, *operands, out=None, optimize=False, dtype=None, **kwargs):
    """The subscripts-string form: '...' expanded, repeated letters within an operand taken as
    diagonals, size-1 dims broadcast, then one einsum primitive with distinct letters per operand.
    The primitive computes numpy's default (optimize=False) sums; ``optimize`` is accepted, but the
    order numpy's optimizer would pick (which can turn a nan into an inf, see ops/linalg.py) is not
    reproduced."""
    reject_unsupported("einsum", out=out, dtype=dtype)
    if not isinstance(subscripts, str):
        raise TraceError("numpy.einsum: only the subscripts-string form is supported", user_location())
    dt = result_dtype(*operands)
    xs = [lift(x, dt) for x in operands]
    specs, out_spec = _expand_einsum(subscripts, xs)
    equation = ",".join(specs) + "->" + out_spec
    view = len(xs) == 1 and out_spec and sorted(set(specs[0])) == sorted(out_spec)  # (one operand, nothing summed)
    if view and len(set(specs[0])) == len(specs[0]):
        # no diagonal: numpy returns a view, a permutation of the dims (of a 0-d operand, a numpy scalar)
        return np.transpose(xs[0], tuple(specs[0].index(c) for c in out_spec))
    if dt.kind == "b":
        result = _bool_contraction(lambda *xs: einsum(subscripts, *xs), *operands)
    else:
        specs, ys = map(list, zip(*(_einsum_diagonal(s, x, i) for i, (s, x) in enumerate(zip(specs, xs)))))
        ys = _einsum_broadcast(specs, ys)
        result = bind("einsum", *ys, equation=",".join(specs) + "->" + out_spec)
    # a diagonal ('ii->i', 'iij->ji'): numpy returns a view of it
    return diagonal_view(xs[0], equation, result) if view else result


@implements(np.tensordot)
def tensordot(a, b, axes=2):
    x, y = lift(a), lift(b)
    if isinstance(axes, int):
        ax_a, ax_b = list(range(x.ndim - axes, x.ndim)), list(range(axes))
    else:
        ax_a, ax_b = axes
        ax_a = [ax_a] if isinstance(ax_a, int) else list(ax_a)
        ax_b = [ax_b] if isinstance(ax_b, int) else list(ax_b)
    ax_a = [norm_axis(i, x.ndim, "tensordot") for i in ax_a]
    ax_b = [norm_axis(i, y.ndim, "tensordot") for i in ax_b]
    letters = iter(string.ascii_letters)
    sa = [next(letters) for _ in range(x.ndim)]
    sb = [next(letters) for _ in range(y.ndim)]
    for i, j in zip(ax_a, ax_b):
        sb[j] = sa[i]
    out = [c for i, c in enumerate(sa) if i not in ax_a] + [c for j, c in enumerate(sb) if j not in ax_b]
    return einsum(f"{''.join(sa)},{''.join(sb)}->{''.join(out)}", x, y)


# --- linalg.norm -------------------------------------------------------------------------------


def _abs_max(x: Tracer, axis: int, keepdims: bool = False) -> Tracer:
    """numpy's ``.max(axis, initial=0)`` of a non-negative array: 0 over an empty axis."""
    if x.shape[axis] == 0:
        return full(reduced_shape(x.shape, (axis,), keepdims), 0, x.dtype)
    return max_(x, axis, keepdims=keepdims)


def _vector_norm(x: Tracer, ord: Any, axis: int, keepdims: bool) -> Tracer:
    if isinstance(ord, str):
        raise TraceError(f"numpy.linalg.norm: invalid norm order {ord!r} for vectors", user_location())
    if ord is None or ord == 2:
        return apply_ufunc(np.sqrt, sum_(apply_ufunc(np.multiply, x, x), axis, keepdims=keepdims))
    absx = apply_ufunc(np.absolute, x)
    if ord == np.inf:
        return _abs_max(absx, axis, keepdims)
    if ord == -np.inf:
        return min_(absx, axis, keepdims=keepdims)
    if ord == 0:  # the number of nonzero entries
        return sum_(convert(apply_ufunc(np.not_equal, x, 0), x.dtype), axis, keepdims=keepdims)
    if ord == 1:
        return sum_(absx, axis, keepdims=keepdims)
    # (sum |x|**ord) ** (1 / ord), with numpy's in-place powers keeping x's dtype
    total = sum_(convert(apply_ufunc(np.power, absx, ord), x.dtype), axis, keepdims=keepdims)
    return apply_ufunc(np.power, total, np.reciprocal(ord, dtype=total.dtype))


def _matrix_norm(x: Tracer, ord: Any, axes: tuple[int, int], keepdims: bool) -> Tracer:
    row, col = axes
    if ord in (None, "fro", "f"):
        ret = apply_ufunc(np.sqrt, sum_(apply_ufunc(np.multiply, x, x), axes))
    elif ord in (1, -1, np.inf, -np.inf):
        # ord 1: the largest column sum of |x| (sum over rows), ord inf: the largest row sum
        summed, other = (row, col) if ord in (1, -1) else (col, row)
        sums = sum_(apply_ufunc(np.absolute, x), summed)
        other -= other > summed
        ret = _abs_max(sums, other) if ord in (1, np.inf) else min_(sums, other)
    elif ord in (2, -2, "nuc"):
        raise TraceError(
            f"numpy.linalg.norm: the matrix norm ord={ord!r} needs singular values (SVD), "
            "which graphc does not support",
            user_location(),
        )
    else:
        raise TraceError(f"numpy.linalg.norm: invalid norm order {ord!r} for matrices", user_location())
    if keepdims:
        ret = reshape_to(ret, tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
    return ret


@implements(np.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):
    """numpy's norm: ints become float64; a vector norm over one axis (ord None/2, 1, inf, -inf,
    0 or any p), a matrix norm over two (None/'fro', 1, -1, inf, -inf; 2, -2 and 'nuc' need an SVD)."""
    t = lift(x)
    if not dtypes.is_float(t.dtype):
        t = convert(t, np.float64)
    if axis is None and (ord is None or (ord in ("f", "fro") and t.ndim == 2) or (ord == 2 and t.ndim == 1)):
        ret = apply_ufunc(np.sqrt, sum_(apply_ufunc(np.multiply, t, t)))
        return reshape_to(ret, (1,) * t.ndim) if keepdims else ret
    if axis is None:
        axes = tuple(range(t.ndim))
    elif isinstance(axis, tuple):
        axes = tuple(norm_axis(a, t.ndim, "norm") for a in axis)
    else:
        axes = (norm_axis(axis, t.ndim, "norm"),)
    if len(axes) == 1:
        return _vector_norm(t, ord, axes[0], bool(keepdims))
    if len(axes) == 2:
        if axes[0] == axes[1]:
            raise TraceError("numpy.linalg.norm: duplicate axes given", user_location())
        return _matrix_norm(t, ord, axes, bool(keepdims))
    raise TraceError(f"numpy.linalg.norm: improper number of dimensions to norm ({len(axes)})", user_location())
