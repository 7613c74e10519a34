"""numpy's shape-manipulation and array-creation functions on traced arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import TraceError, numpy_error
from graphc.frontend.functions import (
    broadcast,
    full,
    matmul,
    norm_axes,
    norm_axis,
    reject_unsupported,
    reshape_to,
    ufunc_reduce_axes,
)
from graphc.frontend.locations import warn_from_user_code
from graphc.frontend.tracer import (
    Tracer,
    bind,
    bind_multi,
    contains_tracer,
    convert,
    implements,
    lift,
    result_dtype,
    user_location,
)
from graphc.ops.shape import normalize_slice


def _resolve_shape(shape: Any, size: int, fname: str = "reshape") -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in shape):
        raise TraceError(f"{fname}: invalid shape {shape}", user_location())
    if unknown:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise TraceError(f"cannot reshape array of size {size} into shape {shape}", user_location())
        shape = tuple(size // known if d == -1 else d for d in shape)
    return shape


@implements(np.reshape)
def reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    if order != "C":
        raise TraceError(f"numpy.reshape: order={order!r} is not supported (only 'C')", user_location())
    x = lift(a)
    shape = newshape if shape is None else shape
    return reshape_to(x, _resolve_shape(shape, x.size))


@implements(np.ravel)
def ravel(a, order="C"):
    return reshape(a, (-1,), order)


@implements(np.transpose)
def transpose(a, axes=None):
    x = lift(a)
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(norm_axis(i, x.ndim, "transpose") for i in axes)
    if sorted(perm) != list(range(x.ndim)):
        raise TraceError(f"transpose: axes {axes} do not match an array of dimension {x.ndim}", user_location())
    return x if perm == tuple(range(x.ndim)) else bind("transpose", x, perm=perm)


@implements(np.swapaxes)
def swapaxes(a, axis1, axis2):
    x = lift(a)
    i, j = norm_axis(axis1, x.ndim, "swapaxes"), norm_axis(axis2, x.ndim, "swapaxes")
    perm = list(range(x.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(x, perm)


@implements(np.moveaxis)
def moveaxis(a, source, destination):
    x = lift(a)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src = [norm_axis(s, x.ndim, "moveaxis") for s in src]
    dst = [norm_axis(d, x.ndim, "moveaxis") for d in dst]
    order = [n for n in range(x.ndim) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


@implements(np.expand_dims)
def expand_dims(a, axis):
    x = lift(a)
    axes = [axis] if isinstance(axis, int) else list(axis)
    out_ndim = x.ndim + len(axes)
    axes = sorted(norm_axis(ax, out_ndim, "expand_dims") for ax in axes)
    shape = list(x.shape)
    for ax in axes:
        shape.insert(ax, 1)
    return reshape_to(x, tuple(shape))


@implements(np.squeeze)
def squeeze(a, axis=None):
    x = lift(a)
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = ufunc_reduce_axes(axis, x.ndim, "squeeze")  # (numpy takes axis 0 or -1 of a 0-d array too)
        bad = [i for i in axes if x.shape[i] != 1]
        if bad:
            raise TraceError(
                f"squeeze: cannot select an axis to squeeze out which has size not equal to one (axis {bad[0]})",
                user_location(),
            )
    return reshape_to(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


@implements(np.broadcast_to)
def broadcast_to(array, shape, subok=False):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return broadcast(lift(array), shape)


@implements(np.broadcast_arrays)
def broadcast_arrays(*args, subok=False):
    xs = [lift(a) for a in args]
    shape = np.broadcast_shapes(*(x.shape for x in xs))
    return tuple(broadcast(x, shape) for x in xs)


def _atleast(arys: tuple, grow) -> Any:
    """numpy's atleast_Nd: one array for one argument, else a tuple."""
    out = tuple(grow(lift(a)) for a in arys)
    return out[0] if len(out) == 1 else out


@implements(np.atleast_1d)
def atleast_1d(*arys):
    return _atleast(arys, lambda x: reshape_to(x, (1,)) if x.ndim == 0 else x)


@implements(np.atleast_2d)
def atleast_2d(*arys):
    return _atleast(arys, lambda x: reshape_to(x, (1,) * (2 - x.ndim) + x.shape) if x.ndim < 2 else x)


def _grow_3d(x: Tracer) -> Tracer:
    """0-d -> (1, 1, 1), (n,) -> (1, n, 1), (m, n) -> (m, n, 1)."""
    shape = {0: (1, 1, 1), 1: (1,) + x.shape + (1,), 2: x.shape + (1,)}.get(x.ndim, x.shape)
    return reshape_to(x, shape)


@implements(np.atleast_3d)
def atleast_3d(*arys):
    return _atleast(arys, _grow_3d)


@implements(np.concatenate)
def concatenate(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    reject_unsupported("concatenate", out=out)
    arrays = list(arrays)
    if not arrays:
        raise TraceError("need at least one array to concatenate", user_location())
    dt = dtypes.canonical(dtype) if dtype is not None else result_dtype(*arrays)
    xs = [lift(a, dt) for a in arrays]
    if axis is None:
        xs = [reshape_to(x, (x.size,)) for x in xs]
        axis = 0
    if any(x.ndim == 0 for x in xs):
        raise TraceError("zero-dimensional arrays cannot be concatenated", user_location())
    axis = norm_axis(axis, xs[0].ndim, "concatenate")
    return xs[0] if len(xs) == 1 else bind("concatenate", *xs, axis=axis)


@implements(np.append)
def append(arr, values, axis=None):
    """numpy's append: both raveled and joined when axis is None, else a concatenate."""
    x, v = lift(arr), lift(values)
    if axis is None:
        return concatenate([reshape_to(x, (x.size,)), reshape_to(v, (v.size,))], axis=0)
    return concatenate([x, v], axis=axis)


@implements(np.stack)
def stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    reject_unsupported("stack", out=out)
    arrays = list(arrays)
    if not arrays:
        raise TraceError("need at least one array to stack", user_location())
    xs = [lift(a) for a in arrays]
    if len({x.shape for x in xs}) != 1:
        raise TraceError(f"all input arrays must have the same shape, got {[x.shape for x in xs]}", user_location())
    axis = norm_axis(axis, xs[0].ndim + 1, "stack")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis, dtype=dtype)


@implements(np.hstack)
def hstack(tup, *, dtype=None, casting="same_kind"):
    xs = [lift(a) for a in tup]
    xs = [reshape_to(x, (1,)) if x.ndim == 0 else x for x in xs]
    return concatenate(xs, axis=0 if xs[0].ndim == 1 else 1, dtype=dtype)


@implements(np.vstack)
def vstack(tup, *, dtype=None, casting="same_kind"):
    xs = [lift(a) for a in tup]
    xs = [reshape_to(x, (1, x.size)) if x.ndim < 2 else x for x in xs]
    return concatenate(xs, axis=0, dtype=dtype)


# numpy 2 keeps row_stack as a deprecated alias of vstack that warns (numpy/_core/shape_base.py);
# graphc warns the same at the user's line. Where row_stack is vstack itself, vstack's handler serves.
_ROW_STACK_DEPRECATED = getattr(np, "row_stack", np.vstack) is not np.vstack
ROW_STACK_WARNING = "`row_stack` alias is deprecated. Use `np.vstack` directly."


def row_stack(tup, *, dtype=None, casting="same_kind"):
    """numpy 2's row_stack: its DeprecationWarning, as if numpy had raised it from the user's line,
    then vstack."""
    warn_from_user_code(ROW_STACK_WARNING, DeprecationWarning)
    return vstack(tup, dtype=dtype, casting=casting)


if _ROW_STACK_DEPRECATED:
    implements(np.row_stack)(row_stack)


@implements(np.column_stack)
def column_stack(tup):
    """numpy's column_stack: 0-d and 1-d arrays become columns ((n,) -> (n, 1)), 2-d and higher
    ones join as they are, all along axis 1 (a 2-d input is concatenated, not stacked)."""
    xs = [lift(a) for a in tup]
    xs = [reshape_to(x, (x.size, 1)) if x.ndim < 2 else x for x in xs]
    return concatenate(xs, axis=1)


def _split_at(x: Tracer, indices: list[int], axis: int) -> list[Tracer]:
    """numpy's split: piece k is x[indices[k-1]:indices[k]] along axis with Python's slice rules
    (negative indices count from the end, indices past the end clamp, and an index smaller than the
    one before gives an empty piece, the next piece starting back at it). Increasing indices are one
    split; otherwise each piece is its own slice."""
    n = x.shape[axis]
    bounds = [0, *indices, n]
    pieces = [slice(lo, hi).indices(n)[:2] for lo, hi in zip(bounds[:-1], bounds[1:])]
    if all(lo <= hi for lo, hi in pieces):
        return list(bind_multi("split", x, indices=tuple(hi for _, hi in pieces[:-1]), axis=axis))
    out = []
    for lo, hi in pieces:
        a, b, _ = normalize_slice(slice(lo, hi), n)
        starts = tuple(a if d == axis else 0 for d in range(x.ndim))
        stops = tuple(b if d == axis else m for d, m in enumerate(x.shape))
        out.append(bind("slice", x, starts=starts, stops=stops, steps=(1,) * x.ndim))
    return out


@implements(np.split)
def split(ary, indices_or_sections, axis=0):
    x = lift(ary)
    axis = norm_axis(axis, x.ndim, "split")
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or x.shape[axis] % k:
            raise TraceError(
                f"array split does not result in an equal division: {x.shape[axis]} into {k}", user_location()
            )
        step = x.shape[axis] // k
        return _split_at(x, [step * i for i in range(1, k)], axis)
    return _split_at(x, [int(i) for i in indices_or_sections], axis)


@implements(np.array_split)
def array_split(ary, indices_or_sections, axis=0):
    x = lift(ary)
    axis = norm_axis(axis, x.ndim, "array_split")
    if isinstance(indices_or_sections, (int, np.integer)):
        k, n = int(indices_or_sections), x.shape[axis]
        if k <= 0:
            raise TraceError("number sections must be larger than 0", user_location())
        each, extra = divmod(n, k)
        sizes = [each + 1] * extra + [each] * (k - extra)
        return _split_at(x, list(np.cumsum(sizes)[:-1]), axis)
    return _split_at(x, [int(i) for i in indices_or_sections], axis)


@implements(np.repeat)
def repeat(a, repeats, axis=None):
    x = lift(a)
    if axis is None:
        x, axis = reshape_to(x, (x.size,)), 0
    elif x.ndim == 0:  # numpy repeats a 0-d array as a 1-d one
        x = reshape_to(x, (1,))
    axis = norm_axis(axis, x.ndim, "repeat")
    if isinstance(repeats, Tracer):
        raise TraceError("numpy.repeat with traced repeat counts has a data-dependent shape", user_location())
    # numpy checks and converts the counts (an empty list, negative or float counts, a wrong length)
    index = np.repeat(np.arange(x.shape[axis]), repeats)
    if np.ndim(repeats) == 0:
        r = int(np.asarray(repeats))
        shape = list(x.shape)
        expanded = expand_dims(x, axis + 1)
        b = broadcast(expanded, tuple(shape[: axis + 1] + [r] + shape[axis + 1 :]))
        shape[axis] *= r
        return reshape_to(b, tuple(shape))
    return bind("gather", x, lift(index), axis=axis)


@implements(np.tile)
def tile(A, reps):
    x = lift(A)
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    nd = max(x.ndim, len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    x = reshape_to(x, (1,) * (nd - x.ndim) + x.shape)
    inter = reshape_to(x, tuple(v for d in x.shape for v in (1, d)))
    b = broadcast(inter, tuple(v for r, d in zip(reps, x.shape) for v in (r, d)))
    return reshape_to(b, tuple(r * d for r, d in zip(reps, x.shape)))


@implements(np.take)
def take(a, indices, axis=None, out=None, mode="raise"):
    reject_unsupported("take", out=out)
    if mode != "raise":
        raise TraceError(f"numpy.take: mode={mode!r} is not supported", user_location())
    x = lift(a)
    if axis is None:
        x, axis = reshape_to(x, (x.size,)), 0
    return bind("gather", x, _take_indices(indices), axis=norm_axis(axis, x.ndim, "take"))


def _take_indices(indices: Any) -> Tracer:
    """np.take's indices as numpy converts them: arrays cast to intp with same_kind casting (bools
    are 0 and 1, floats are a TypeError), other objects converted to intp directly (a list of
    floats truncates, [] is an empty index)."""
    if isinstance(indices, Tracer) or (isinstance(indices, (list, tuple)) and contains_tracer(indices)):
        idx = lift(indices)
        if idx.dtype.kind == "b":
            return convert(idx, np.intp)
        if idx.dtype.kind not in "iu":
            message = f"numpy.take: Cannot cast array data from {idx.dtype} to int64 according to the rule 'same_kind'"
            raise numpy_error(TypeError(message), TraceError, user_location())
        return idx
    if isinstance(indices, (np.ndarray, np.generic)):
        return lift(np.asarray(indices).astype(np.intp, casting="same_kind"))
    return lift(np.asarray(indices, dtype=np.intp))


@implements(np.take_along_axis)
def take_along_axis(arr, indices, axis=-1):
    x, idx = lift(arr), lift(indices)
    if axis is None:
        x, axis = reshape_to(x, (x.size,)), 0
    if idx.ndim != x.ndim:
        raise TraceError("`indices` and `arr` must have the same number of dimensions", user_location())
    axis = norm_axis(axis, x.ndim, "take_along_axis")
    # result[i, j, k] = x[i, idx[i, j, k], k] for axis 1: one index array per dim, broadcast together
    index_arrays = []
    for d in range(x.ndim):
        if d == axis:
            index_arrays.append(idx)
        else:
            shape = [1] * x.ndim
            shape[d] = x.shape[d]
            index_arrays.append(lift(np.arange(x.shape[d]).reshape(shape)))
    return bind("gather", x, *index_arrays, axis=0)


@implements(np.flip)
def flip(m, axis=None):
    x = lift(m)
    axes = norm_axes(axis, x.ndim, "flip")
    starts = tuple(n - 1 if i in axes and n else 0 for i, n in enumerate(x.shape))
    stops = tuple(-1 if i in axes and n else n for i, n in enumerate(x.shape))
    steps = tuple(-1 if i in axes and n else 1 for i, n in enumerate(x.shape))
    return bind("slice", x, starts=starts, stops=stops, steps=steps)


def _pad_widths(pad_width, ndim: int) -> tuple[tuple[int, int], ...]:
    w = np.asarray(pad_width, dtype=np.int64)
    try:
        w = np.broadcast_to(w, (ndim, 2))
    except ValueError:
        raise TraceError(
            f"numpy.pad: pad_width {pad_width!r} does not fit {ndim} dimensions", user_location()
        ) from None
    if (w < 0).any():
        raise TraceError("numpy.pad: negative pad widths", user_location())
    return tuple((int(a), int(b)) for a, b in w)


@implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    if mode != "constant":
        raise TraceError(f"numpy.pad: mode={mode!r} is not supported (only 'constant')", user_location())
    x = lift(array)
    value = kwargs.pop("constant_values", 0)
    if kwargs:
        raise TraceError(f"numpy.pad: unsupported arguments {sorted(kwargs)}", user_location())
    if isinstance(value, Tracer) or np.ndim(value) != 0:
        raise TraceError("numpy.pad: only a single static constant_values is supported", user_location())
    value = value.item() if isinstance(value, np.generic) else value
    widths = _pad_widths(pad_width, x.ndim)
    if all(w == (0, 0) for w in widths):
        return x
    return bind("pad", x, widths=widths, value=float(value) if dtypes.is_float(x.dtype) else int(value))


_CONVOLVE_MODES = {"valid": "valid", "same": "same", "full": "full", 0: "valid", 1: "same", 2: "full"}


def _convolve_operand(x: Any, name: str) -> Tracer:
    """numpy's ``array(x, ndmin=1)`` of a convolve operand, which must be 1-d and not empty."""
    t = lift(x)
    t = reshape_to(t, (1,)) if t.ndim == 0 else t
    if t.ndim != 1:
        raise numpy_error(ValueError("object too deep for desired array"), TraceError, user_location())
    if t.shape[0] == 0:
        raise numpy_error(ValueError(f"{name} cannot be empty"), TraceError, user_location())
    return t


@implements(np.convolve)
def convolve(a, v, mode="full"):
    """numpy's convolve: out[k] = sum_j x[k - j] w[j], where x is the longer operand and w the
    shorter (numpy swaps them when v is longer). The windows of the zero-padded x under the flipped
    w are one gather with a static index table (n_out, m), and their products with w a matmul:
    differentiable and shardable like any gather and matmul. Modes as numpy's: full (n + m - 1
    outputs), same (n, centered) and valid (n - m + 1, where the operands overlap fully)."""
    picked = _CONVOLVE_MODES.get(mode) if isinstance(mode, (str, int)) and not isinstance(mode, bool) else None
    if picked is None:
        message = f"mode must be one of 'valid', 'same', or 'full' (got {mode!r})"
        raise numpy_error(ValueError(message), TraceError, user_location())
    x, w = _convolve_operand(a, "a"), _convolve_operand(v, "v")
    if w.shape[0] > x.shape[0]:
        x, w = w, x
    dt = dtypes.canonical(np.result_type(x.dtype, w.dtype))  # (arrays, never weak: numpy converts them first)
    x, w = convert(x, dt), convert(w, dt)
    n, m = x.shape[0], w.shape[0]
    first, count = {"full": (0, n + m - 1), "same": ((m - 1) // 2, n), "valid": (m - 1, n - m + 1)}[picked]
    padded = pad(x, (m - 1, m - 1))  # padded[i] = x[i - (m - 1)], zero outside x
    outputs, taps = np.arange(first, first + count)[:, None], np.arange(m)[None, :]
    windows = bind("gather", padded, lift(outputs + (m - 1) - taps), axis=0)  # [count, m]: x[k - j]
    return matmul(windows, w)  # [count, m] @ [m] -> [count]


def _triangle(m, k: int, upper: bool) -> Tracer:
    x = lift(m)
    if x.ndim < 2:
        raise TraceError("numpy.triu/tril need at least 2 dimensions", user_location())
    n, cols = x.shape[-2:]
    mask = np.tri(n, cols, k - 1 if upper else k, dtype=bool)
    if upper:
        mask = ~mask
    return bind("where", lift(mask), x, full((), 0, x.dtype))


@implements(np.triu)
def triu(m, k=0):
    return _triangle(m, int(k), True)


@implements(np.tril)
def tril(m, k=0):
    return _triangle(m, int(k), False)


def _like(a, value, dtype, shape):
    """numpy's full_like: an empty array filled with ``np.copyto(res, value, casting="unsafe")``,
    so a fill value outside the dtype is cast as numpy casts it on this machine (``np.inf`` into
    an int array, -1.5 into a uint array), not an OverflowError."""
    x = lift(a)
    dt = dtypes.canonical(dtype) if dtype is not None else x.dtype
    sh = x.shape if shape is None else ((shape,) if isinstance(shape, int) else tuple(shape))
    if isinstance(value, Tracer):
        return broadcast(lift(value, dt), sh)
    if contains_tracer(value):
        return broadcast(lift(value, dt), sh)
    filled = np.empty(np.shape(value), dt)
    np.copyto(filled, value, casting="unsafe")
    if np.broadcast_shapes(filled.shape, sh) != sh:
        raise TraceError(
            f"could not broadcast the fill value from shape {filled.shape} into shape {sh}", user_location()
        )
    return broadcast(lift(filled), sh)


@implements(np.zeros_like)
def zeros_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(a, 0, dtype, shape)


@implements(np.empty_like)
def empty_like(prototype, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(prototype, 0, dtype, shape)


@implements(np.ones_like)
def ones_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(a, 1, dtype, shape)


@implements(np.full_like)
def full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(a, fill_value, dtype, shape)


@implements(np.copy)
def copy(a, order="K", subok=False):
    return lift(a)


@implements(np.shape)
def shape_of(a):
    return lift(a).shape


@implements(np.ndim)
def ndim_of(a):
    return lift(a).ndim


@implements(np.size)
def size_of(a, axis=None):
    x = lift(a)
    return x.size if axis is None else x.shape[norm_axis(axis, x.ndim, "size")]
