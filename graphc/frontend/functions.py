"""numpy functions on traced arrays (``__array_function__``), decomposed onto the primitives.

Each handler mirrors the numpy signature it replaces; arguments that change semantics in ways the
graph cannot express (``out=``, ``where=``, non-constant modes) raise a TraceError naming the function.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc import dtypes
from graphc.errors import TraceError
from graphc.frontend.tracer import Tracer, bind, convert, fresh, lift, mark_view, user_location
from graphc.frontend.ufuncs import apply_ufunc

HANDLERS: dict[Callable, Callable] = {}


def implements(*funcs: Callable):
    def register(handler: Callable) -> Callable:
        for f in funcs:
            HANDLERS[f] = handler
        return handler

    return register


# numpy returns views from these; in-place updates through views are rejected (tracer.mark_view)
VIEW_FUNCTIONS = {
    np.reshape, np.ravel, np.transpose, np.swapaxes, np.moveaxis, np.expand_dims, np.squeeze,
    np.broadcast_to, np.split, np.array_split, np.asarray,
}


def handle_function(func: Callable, args: tuple, kwargs: dict):
    handler = HANDLERS.get(func)
    if handler is None:
        mod = getattr(func, "__module__", "numpy") or "numpy"
        mod = "numpy" if mod.startswith("numpy._core") or mod == "numpy" else mod
        raise TraceError(f"{mod}.{func.__name__} is not supported by graphc", user_location())
    result = handler(*args, **kwargs)
    if func in VIEW_FUNCTIONS and args and isinstance(args[0], Tracer):
        mark_view(result, args[0])
    elif isinstance(result, Tracer) and any(result is a for a in args):
        result = fresh(result)  # numpy returned a new array (np.copy, a no-op np.pad, ...)
    return result


def _reject(fname: str, **given: Any) -> None:
    for name, value in given.items():
        if value is not None and value is not np._NoValue:
            raise TraceError(f"numpy.{fname}: argument {name}= is not supported while tracing", user_location())


def norm_axis(axis: Any, ndim: int, fname: str = "") -> int:
    try:
        axis = int(axis.__index__())
    except (AttributeError, TypeError):
        raise TraceError(f"{fname}: axis must be an integer, got {axis!r}", user_location()) from None
    if not -ndim <= axis < ndim:
        raise TraceError(f"{fname}: axis {axis} is out of bounds for array of dimension {ndim}", user_location())
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


def result_dtype(*xs: Any) -> np.dtype:
    """numpy's result_type, with Python scalars weak (NEP 50)."""
    parts = []
    for x in xs:
        if isinstance(x, Tracer):
            parts.append(x.dtype)
        elif isinstance(x, (list, tuple)):
            parts.append(lift(x).dtype)
        else:
            parts.append(x)
    return dtypes.canonical(np.result_type(*parts))


def reshape_to(x: Tracer, shape: tuple[int, ...]) -> Tracer:
    shape = tuple(shape)
    return x if x.shape == shape else bind("reshape", x, shape=shape)


def broadcast(x: Tracer, shape: tuple[int, ...]) -> Tracer:
    shape = tuple(shape)
    return x if x.shape == shape else bind("broadcast_to", x, shape=shape)


def full(shape: tuple[int, ...], value: Any, dtype: Any) -> Tracer:
    return broadcast(lift(np.asarray(value, dtype=dtypes.canonical(dtype))), shape)


# --- reductions ------------------------------------------------------------------------------


def _sum_dtype(dt: np.dtype) -> np.dtype:
    if dt.kind == "b" or (dt.kind == "i" and dt.itemsize < 8):
        return np.dtype(np.int64)
    if dt.kind == "u" and dt.itemsize < 8:
        return np.dtype(np.uint64)
    return dt


def _reduce(prim: str, a: Any, axis: Any, keepdims: bool, fname: str) -> Tracer:
    x = lift(a)
    axes = norm_axes(axis, x.ndim, fname)
    if not axes:
        return x
    return bind(prim, x, axes=axes, keepdims=bool(keepdims))


@implements(np.sum)
def sum_(a, axis=None, dtype=None, out=None, keepdims=False, initial=np._NoValue, where=np._NoValue):
    _reject("sum", out=out, initial=initial, where=where)
    x = lift(a)
    x = convert(x, dtype if dtype is not None else _sum_dtype(x.dtype))
    return _reduce("reduce_sum", x, axis, keepdims, "sum")


def _count(x: Tracer, axes: tuple[int, ...]) -> int:
    return int(np.prod([x.shape[a] for a in axes], dtype=np.int64))


@implements(np.mean)
def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=np._NoValue):
    _reject("mean", out=out, where=where)
    x = lift(a)
    axes = norm_axes(axis, x.ndim, "mean")
    acc = dtypes.canonical(dtype) if dtype is not None else (
        np.dtype(np.float64) if x.dtype.kind in "biu" else np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    )
    total = sum_(x, axes, dtype=acc, keepdims=keepdims)
    res = apply_ufunc(np.true_divide, total, np.asarray(_count(x, axes), dtype=acc))
    final = dtypes.canonical(dtype) if dtype is not None else (np.dtype(np.float16) if x.dtype == np.float16 else acc)
    return convert(res, final)


@implements(np.var)
def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=np._NoValue, mean=np._NoValue, correction=np._NoValue):
    _reject("var", out=out, where=where, mean=mean, correction=correction)
    x = lift(a)
    axes = norm_axes(axis, x.ndim, "var")
    acc = dtypes.canonical(dtype) if dtype is not None else (np.dtype(np.float64) if x.dtype.kind in "biu" else x.dtype)
    # numpy's own algorithm: mean with keepdims, squared deviations, their sum / (n - ddof)
    m = globals()["mean"](x, axes, dtype=acc, keepdims=True)
    d = apply_ufunc(np.subtract, lift(x, acc), m)
    total = sum_(apply_ufunc(np.multiply, d, d), axes, dtype=acc, keepdims=keepdims)
    return apply_ufunc(np.true_divide, total, np.asarray(max(_count(x, axes) - ddof, 0), dtype=acc))


@implements(np.std)
def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=np._NoValue, mean=np._NoValue, correction=np._NoValue):
    _reject("std", out=out, where=where, mean=mean, correction=correction)
    return apply_ufunc(np.sqrt, var(a, axis, dtype, ddof=ddof, keepdims=keepdims))


@implements(np.max, np.amax)
def max_(a, axis=None, out=None, keepdims=False, initial=np._NoValue, where=np._NoValue):
    _reject("max", out=out, initial=initial, where=where)
    return _reduce("reduce_max", a, axis, keepdims, "max")


@implements(np.min, np.amin)
def min_(a, axis=None, out=None, keepdims=False, initial=np._NoValue, where=np._NoValue):
    _reject("min", out=out, initial=initial, where=where)
    return _reduce("reduce_min", a, axis, keepdims, "min")


@implements(np.all)
def all_(a, axis=None, out=None, keepdims=False, *, where=np._NoValue):
    _reject("all", out=out, where=where)
    x = lift(a)
    return _reduce("reduce_min", x if x.dtype.kind == "b" else apply_ufunc(np.not_equal, x, 0), axis, keepdims, "all")


@implements(np.any)
def any_(a, axis=None, out=None, keepdims=False, *, where=np._NoValue):
    _reject("any", out=out, where=where)
    x = lift(a)
    return _reduce("reduce_max", x if x.dtype.kind == "b" else apply_ufunc(np.not_equal, x, 0), axis, keepdims, "any")


@implements(np.argmax)
def argmax(a, axis=None, out=None, *, keepdims=False):
    _reject("argmax", out=out)
    x = lift(a)
    if axis is None:
        res = bind("argmax", reshape_to(x, (x.size,)), axis=0, keepdims=False)
        return reshape_to(res, (1,) * x.ndim) if keepdims else res
    return bind("argmax", x, axis=norm_axis(axis, x.ndim, "argmax"), keepdims=bool(keepdims))


@implements(np.argmin)
def argmin(a, axis=None, out=None, *, keepdims=False):
    _reject("argmin", out=out)
    x = lift(a)
    if x.dtype.kind == "u" or x.dtype.kind == "b":
        raise TraceError("numpy.argmin of unsigned or bool arrays is not supported", user_location())
    return argmax(apply_ufunc(np.negative, x), axis, keepdims=keepdims)


# --- elementwise helpers that are functions, not ufuncs ------------------------------------------


@implements(np.where)
def where(condition, x=None, y=None):
    if x is None or y is None:
        raise TraceError(
            "numpy.where(condition) with one argument has a data-dependent shape; use the "
            "three-argument form np.where(condition, x, y)",
            user_location(),
        )
    c = lift(condition)
    if c.dtype.kind != "b":
        c = apply_ufunc(np.not_equal, c, 0)
    dt = result_dtype(x, y)
    return bind("where", c, lift(x, dt), lift(y, dt))


@implements(np.clip)
def clip(a, a_min=np._NoValue, a_max=np._NoValue, out=None, *, min=np._NoValue, max=np._NoValue, **kwargs):
    _reject("clip", out=out)
    lo = a_min if a_min is not np._NoValue else (None if min is np._NoValue else min)
    hi = a_max if a_max is not np._NoValue else (None if max is np._NoValue else max)
    res = a
    if lo is not None:
        res = apply_ufunc(np.maximum, res, lo)
    if hi is not None:
        res = apply_ufunc(np.minimum, res, hi)
    return lift(res)


@implements(np.isclose)
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if equal_nan:
        raise TraceError("numpy.isclose(..., equal_nan=True) is not supported", user_location())
    diff = apply_ufunc(np.absolute, apply_ufunc(np.subtract, a, b))
    tol = apply_ufunc(np.add, atol, apply_ufunc(np.multiply, rtol, apply_ufunc(np.absolute, b)))
    return apply_ufunc(np.less_equal, diff, tol)


@implements(np.allclose)
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return all_(isclose(a, b, rtol, atol, equal_nan))


# --- contractions ----------------------------------------------------------------------------


def matmul(a: Any, b: Any) -> Tracer:
    """np.matmul with numpy's 1-d rules: a 1-d left operand is a row, a 1-d right one a column."""
    dt = result_dtype(a, b)
    x, y = lift(a, dt), lift(b, dt)
    if x.ndim == 0 or y.ndim == 0:
        raise TraceError("matmul: input operand does not have enough dimensions (scalars are not allowed)", user_location())
    x2 = reshape_to(x, (1, x.shape[0])) if x.ndim == 1 else x
    y2 = reshape_to(y, (y.shape[0], 1)) if y.ndim == 1 else y
    out = bind("matmul", x2, y2)
    shape = out.shape
    if x.ndim == 1:
        shape = shape[:-2] + shape[-1:]
    if y.ndim == 1:
        shape = shape[:-1]
    return reshape_to(out, shape)


@implements(np.dot)
def dot(a, b, out=None):
    _reject("dot", out=out)
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


@implements(np.vdot, np.inner)
def inner(a, b):
    x, y = lift(a), lift(b)
    if x.ndim != 1 or y.ndim != 1:
        raise TraceError("numpy.inner/vdot are supported for 1-d operands only", user_location())
    return matmul(x, y)


@implements(np.outer)
def outer(a, b, out=None):
    _reject("outer", out=out)
    x, y = lift(a), lift(b)
    return apply_ufunc(np.multiply, reshape_to(x, (x.size, 1)), reshape_to(y, (1, y.size)))


def _expand_einsum(subscripts: str, operands: list[Tracer]) -> str:
    """Explicit form with single letters: expand '...' and add the implicit output."""
    eq = subscripts.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise TraceError(f"einsum: {subscripts!r} names {len(ins)} operands but {len(operands)} were given", user_location())
    used = set(c for c in eq if c.isalpha())
    free = iter(c for c in string.ascii_letters if c not in used)
    ell_rank = max((x.ndim - len(s.replace("...", "")) for s, x in zip(ins, operands) if "..." in s), default=0)
    ell = "".join(next(free) for _ in range(ell_rank))
    new_ins = []
    for s, x in zip(ins, operands):
        if "..." in s:
            k = x.ndim - len(s.replace("...", ""))
            s = s.replace("...", ell[ell_rank - k:] if k else "")
        new_ins.append(s)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for c in "".join(new_ins):
            counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return ",".join(new_ins) + "->" + out


@implements(np.einsum)
def einsum(subscripts, *operands, out=None, optimize=False, **kwargs):
    _reject("einsum", out=out)
    if not isinstance(subscripts, str):
        raise TraceError("numpy.einsum: only the subscripts-string form is supported", user_location())
    dt = result_dtype(*operands)
    xs = [lift(x, dt) for x in operands]
    eq = _expand_einsum(subscripts, xs)
    return bind("einsum", *xs, equation=eq)


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


@implements(np.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):
    if ord not in (None, 2, "fro") or (ord == 2 and (axis is None and lift(x).ndim != 1)):
        raise TraceError(f"numpy.linalg.norm: only the 2-norm / Frobenius norm is supported (ord={ord!r})", user_location())
    t = lift(x)
    if t.dtype.kind != "f":
        t = convert(t, np.float64)
    return apply_ufunc(np.sqrt, sum_(apply_ufunc(np.multiply, t, t), axis, keepdims=keepdims))


from graphc.frontend.shape_functions import array_from_nested  # noqa: E402,F401  (registers, re-export)
