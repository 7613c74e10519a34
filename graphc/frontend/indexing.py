"""``x[key]`` on a traced array, with numpy's full semantics for basic and advanced indexing.

1. basic part: slices and (when no index arrays are present) integers become one ``slice`` node,
   then one ``reshape`` drops integer-indexed dims and inserts ``None`` dims;
2. advanced part: index arrays (traced, numpy, lists, ranges, static bool masks via nonzero) and,
   when any is present, integers and scalar bools too, broadcast together and become one
   ``gather``. As in numpy, the gathered dims replace the indexed dims in place when the advanced
   indices are adjacent in the key, and move to the front otherwise.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from graphc.core.errors import TraceError, numpy_error
from graphc.core.traits import Constant
from graphc.frontend.functions import broadcast, reshape_to, write_out
from graphc.frontend.masked import masked_setitem, traced_mask
from graphc.frontend.shadows import shadow_of
from graphc.frontend.shape_functions import transpose
from graphc.frontend.tracer import (
    HANDLERS,
    Tracer,
    bind,
    convert,
    fresh,
    implements,
    lift,
    rebind,
    registered_handler,
    user_location,
)
from graphc.frontend.ufuncs import apply_ufunc, ufunc_name
from graphc.ops import OPS
from graphc.ops.shape import normalize_slice, slice_length


class _DynamicInt:
    """A traced 0-d integer in an assignment key: a dynamic start, not an index array."""

    def __init__(self, value: Tracer):
        self.value = value


def _traced_index(k: Tracer) -> Tracer:
    if k.dtype.kind == "b":
        raise TraceError(
            "boolean-mask indexing with a traced mask has a data-dependent shape; use np.where(mask, x, 0) instead",
            user_location(),
        )
    if k.dtype.kind not in "iu":
        raise TraceError(f"arrays used as indices must be of integer type, got {k.dtype}", user_location())
    return k


def _classify(k: Any) -> list[tuple[str, Any]]:
    if k is None:
        return [("none", None)]
    if k is Ellipsis:
        return [("ellipsis", None)]
    if isinstance(k, slice):
        if any(isinstance(b, Tracer) for b in (k.start, k.stop, k.step)):
            return [("dslice", k)]
        return [("slice", k)]
    if isinstance(k, _DynamicInt):
        return [("dint", k.value)]
    if isinstance(k, Tracer):
        return [("array", _traced_index(k))]
    if isinstance(k, (bool, np.bool_)):
        return [("bool", bool(k))]
    if isinstance(k, (int, np.integer)):
        return [("int", int(k))]
    if isinstance(k, (list, tuple, range, np.ndarray)):
        if isinstance(k, (list, tuple)) and any(isinstance(v, Tracer) for v in k):
            return [("array", lift(list(k)))]
        arr = np.asarray(list(k) if isinstance(k, range) else k)
        if arr.dtype == bool:
            return [("bool", bool(arr))] if arr.ndim == 0 else [("mask", arr)]
        if arr.ndim == 0 and arr.dtype.kind in "iu":  # numpy treats a 0-d integer array as an integer
            return [("int", int(arr))]
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu":
            raise TraceError(f"arrays used as indices must be of integer type, got {arr.dtype}", user_location())
        return [("array", arr)]
    raise TraceError(f"unsupported index of type {type(k).__name__}: {k!r}", user_location())


def _expand_masks(x: Tracer, items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """A static bool mask becomes one integer index array per dim it covers (np.nonzero). numpy
    checks only the mask dims of nonzero size against the array (an empty mask selects nothing)."""
    expanded: list[tuple[str, Any]] = []
    dim = 0
    for kind, v in items:
        if kind == "mask":
            covered = x.shape[dim : dim + v.ndim]
            if any(m and m != n for m, n in zip(v.shape, covered)):
                raise TraceError(
                    f"boolean index did not match indexed array along axes {dim}..{dim + v.ndim - 1}: "
                    f"mask shape {v.shape}, array dims {covered}",
                    user_location(),
                )
            expanded.extend(("array", nz) for nz in np.nonzero(v))
            dim += v.ndim
        else:
            expanded.append((kind, v))
            dim += kind not in ("none", "bool")
    return expanded


def _check_int(v: int, n: int, dim: int) -> None:
    if not -n <= v < n:
        raise TraceError(f"index {v} is out of bounds for axis {dim} with size {n}", user_location())


def _advanced_items(x: Tracer, items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """With index arrays present, integers (bounds-checked first) index like 0-d arrays and a scalar
    bool like an index into a new size-1 dim ([0] for True, [] for False). The index arrays must
    broadcast together; static ones are bounds-checked unless they broadcast to size 0, where numpy
    checks nothing (they are then replaced by empty ones, which select the same nothing)."""
    out: list[tuple[str, Any]] = []
    dim = 0
    for kind, v in items:
        if kind == "dint":
            kind = "array"
        if kind == "int":
            _check_int(v, x.shape[dim], dim)
            kind, v = "array", np.asarray(v, dtype=np.int64)
        elif kind == "bool":
            v = np.zeros((int(v),), np.int64)
        out.append((kind, v))
        dim += kind in ("slice", "array")
    shapes = [v.shape for kind, v in out if kind in ("array", "bool")]
    try:
        bshape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise TraceError(
            "shape mismatch: indexing arrays could not be broadcast together with shapes " + " ".join(map(str, shapes)),
            user_location(),
        ) from None
    if 0 in bshape:
        return [(kind, np.zeros(bshape, np.int64) if kind in ("array", "bool") else v) for kind, v in out]
    dim = 0
    for kind, v in out:
        if kind == "array" and not isinstance(v, Tracer) and v.size:
            n = x.shape[dim]
            if not (-n <= v.min() and v.max() < n):
                _check_int(int(v.max() if v.max() >= n else v.min()), n, dim)
        dim += kind in ("slice", "array")
    return out


def _parse(x: Tracer, key: Any) -> tuple[list[tuple[str, Any]], bool, bool]:
    """The key as one (kind, value) item per dim of the result's basic part (ellipsis filled in,
    masks expanded), whether numpy separates its index arrays by an ellipsis, and whether it has
    index arrays (advanced indexing)."""
    items: list[tuple[str, Any]] = []
    for k in key if isinstance(key, tuple) else (key,):
        items.extend(_classify(k))

    if sum(kind == "ellipsis" for kind, _ in items) > 1:
        raise TraceError("an index can only have a single ellipsis ('...')", user_location())
    consumed = sum(
        v.ndim if kind == "mask" else kind in ("slice", "dslice", "int", "dint", "array") for kind, v in items
    )
    if consumed > x.ndim:
        raise TraceError(
            f"too many indices for array: array is {x.ndim}-dimensional, but {consumed} were indexed", user_location()
        )
    fill = [("slice", slice(None))] * (x.ndim - consumed)
    # numpy counts an ellipsis as separating the index arrays around it even when it stands for no dims
    split_by_ellipsis = False
    if any(kind == "ellipsis" for kind, _ in items):
        at = next(i for i, (kind, _) in enumerate(items) if kind == "ellipsis")
        is_array = [kind in ("array", "mask", "int", "dint", "bool") for kind, _ in items]
        split_by_ellipsis = any(is_array[:at]) and any(is_array[at + 1 :])
        items = items[:at] + fill + items[at + 1 :]
    else:
        items = items + fill
    items = _expand_masks(x, items)
    advanced = any(kind in ("array", "bool") for kind, _ in items)
    if advanced:
        if any(kind == "dslice" for kind, _ in items):
            raise TraceError("a slice with traced bounds cannot be combined with index arrays", user_location())
        items = _advanced_items(x, items)
    return items, split_by_ellipsis, advanced


def getitem(x: Tracer, key: Any) -> Tracer:
    items, split_by_ellipsis, advanced = _parse(x, key)
    x, items = _dynamic_slices(x, items)

    # 1. basic part; a scalar bool adds a size-1 dim (like None) that the gather below indexes
    starts, stops, steps, shape = [], [], [], []
    dim = 0
    for kind, v in items:
        if kind in ("none", "bool"):
            shape.append(1)
            continue
        n = x.shape[dim]
        if kind == "slice":
            a, b, s = normalize_slice(v, n)
            shape.append(slice_length(a, b, s))
        elif kind == "int":
            _check_int(v, n, dim)
            a, b, s = v % n, v % n + 1, 1
        else:  # array: keep the whole dim for the gather below
            a, b, s = 0, n, 1
            shape.append(n)
        starts.append(a)
        stops.append(b)
        steps.append(s)
        dim += 1
    y = x
    if (tuple(starts), tuple(stops), tuple(steps)) != ((0,) * x.ndim, x.shape, (1,) * x.ndim):
        y = bind("slice", y, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    y = reshape_to(y, tuple(shape))
    if not advanced:
        return y

    # 2. advanced part: positions of the index arrays among y's dims (one dim per item now)
    positions, indices = [], []
    for pos, (kind, v) in enumerate(items):
        if kind in ("array", "bool"):
            positions.append(pos)
            indices.append(lift(v))
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    if adjacent and not split_by_ellipsis:
        return bind("gather", y, *indices, axis=positions[0])
    rest = [d for d in range(y.ndim) if d not in positions]
    return bind("gather", transpose(y, positions + rest), *indices, axis=0)


# --- slices with traced bounds: x[:, pos:pos + n] ----------------------------------------------


def _static_length(start: Any, stop: Any) -> int | None:
    """``stop - start`` when it is known while tracing: both static, or both a constant away from
    the same traced value (the ``pos:pos + n`` of a KV cache, ``k - 1:k + 1``)."""
    if not isinstance(start, Tracer) and not isinstance(stop, Tracer):
        return int(stop) - int(start or 0)
    if not (isinstance(start, Tracer) and isinstance(stop, Tracer)):
        return None
    (a, da), (b, db) = _offset(start._value), _offset(stop._value)
    return db - da if a is b else None


def _offset(v: Any) -> tuple[Any, int]:
    """(base value, c) with ``v = base + c`` for a 0-d integer constant c added (or subtracted)."""
    node = v.producer
    if node is None or node.op not in (OPS.add, OPS.sub) or v.type.shape:
        return v, 0
    x, y = node.inputs
    for base, other, sign in ((x, y, 1), (y, x, 1)) if node.op is OPS.add else ((x, y, -1),):
        producer = other.producer
        if producer is not None and producer.op.has(Constant) and not other.type.shape:
            return base, sign * int(producer.attrs["value"])
    return v, 0


def _wrap_start(start: Any, n: int) -> Tracer:
    """A slice start or integer index as a 0-d operand; negative values count from the end."""
    if not isinstance(start, Tracer):
        return lift(np.int64(start + n if start < 0 else start))
    if start.shape or start.dtype.kind not in "iu":
        raise TraceError(f"a traced index or slice bound must be a 0-d integer, got {start.dtype}{start.shape}")
    if start.dtype.kind == "u":
        return start
    return cast(Tracer, np.where(start < 0, start + n, start))


def guarded(index: Tracer, bad: Tracer, n: int) -> Tracer:
    """``index`` (a 0-d or n-d int64 in [0, n) wherever ``bad`` is False), raising IndexError
    when the graph runs wherever ``bad`` holds: a gather from ``arange(n)`` at ``n`` there (the
    run-time error is noted with the op and the user's line, runtime/executor.py). Where numpy
    raises, or gives another shape, for a value known only when the graph runs."""
    index = bind("where", bad, lift(np.int64(n)), convert(index, np.int64))
    return bind("gather", lift(np.arange(n, dtype=np.int64)), index, axis=0)


def _checked_start(raw: Any, start: Tracer, n: int, length: int, to_end: bool) -> Tracer:
    """``start`` (``raw`` wrapped), checked when the graph runs to give numpy's block of
    ``length``: dynamic_slice clamps a start so its block fits, where numpy gives a shorter
    slice (or raises, writing). ``x[pos:pos + k]`` needs 0 <= pos <= n - k (a negative pos wraps
    alone in numpy, not its stop), ``x[pos:] = v`` needs pos to wrap to n - k."""
    if not isinstance(raw, Tracer):
        return start
    if to_end:
        bad = apply_ufunc(np.not_equal, start, n - length)
    else:
        bad = apply_ufunc(np.logical_or, apply_ufunc(np.less, raw, 0), apply_ufunc(np.greater, raw, n - length))
    return guarded(start, bad, n - length + 1)


def _dynamic_bounds(s: slice, n: int, dim: int, known_length: int | None) -> tuple[Tracer, int]:
    """(start operand, length) of a slice with traced bounds along a dim of size n."""
    if s.step is not None and (isinstance(s.step, Tracer) or s.step != 1):
        raise TraceError("a slice with traced bounds must have step 1", user_location())
    start = 0 if s.start is None else s.start
    length = None if s.stop is None else _static_length(start, s.stop)
    if length is None and s.stop is None and not isinstance(start, Tracer):
        length = n - (start + n if start < 0 else start)
    if length is None:
        length = known_length
    if length is None:
        raise TraceError(
            f"the length of the slice with traced bounds along dim {dim} must be known while tracing: write "
            "x[pos:pos + n] with a Python int n (a slice to a traced end has a data-dependent shape)",
            user_location(),
        )
    if not 0 <= length <= n:
        raise TraceError(f"a slice of length {length} does not fit dim {dim} of size {n}", user_location())
    return _checked_start(start, _wrap_start(start, n), n, length, s.stop is None), length


def _dynamic_slices(x: Tracer, items: list[tuple[str, Any]]) -> tuple[Tracer, list[tuple[str, Any]]]:
    """Cut the dims sliced by traced bounds with one dynamic_slice; they become whole slices."""
    if not any(kind == "dslice" for kind, _ in items):
        return x, items
    dims, starts, sizes, out = [], [], [], []
    dim = 0
    for kind, v in items:
        if kind == "dslice":
            start, size = _dynamic_bounds(v, x.shape[dim], dim, None)
            dims.append(dim)
            starts.append(start)
            sizes.append(size)
            kind, v = "slice", slice(None)
        out.append((kind, v))
        dim += kind not in ("none", "bool")
    return bind("dynamic_slice", x, *starts, dims=tuple(dims), sizes=tuple(sizes)), out


# --- x[key] = v: a new array (the tracer rebinds itself to it, tracer.py) -------------------------


def _broadcast_value(
    x: Tracer, value: Any, shape: tuple[int, ...], to_dtype: bool = True, advanced: bool = False
) -> Tracer:
    """``value`` as numpy assigns it into ``x[key]`` of ``shape``: cast to x's dtype (numpy casts
    unsafely here; not if ``to_dtype`` is False), leading size-1 dims dropped, broadcast to the
    indexed shape. An ``advanced`` key's assignment reshapes the value to its last dims instead,
    which also drops any leading dims of an empty value whose last dims hold no element."""
    if not to_dtype:
        v = value if isinstance(value, Tracer) else lift(value)
    else:
        v = convert(value, x.dtype) if isinstance(value, Tracer) else lift(value, x.dtype)
    shape = tuple(shape)
    last = v.shape[v.ndim - len(shape) :]
    if advanced and v.ndim > len(shape) and v.size == int(np.prod(last, dtype=np.int64)):
        v = reshape_to(v, last)
    ok = True
    while v.ndim > len(shape) and ok:
        ok = v.shape[0] == 1
        if ok:
            v = reshape_to(v, v.shape[1:])
    try:
        ok = ok and np.broadcast_shapes(v.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise TraceError(f"could not broadcast input array from shape {v.shape} into shape {shape}", user_location())
    return broadcast(v, shape)


def _is_static(key: Any) -> bool:
    parts = key if isinstance(key, tuple) else (key,)
    for k in parts:
        if isinstance(k, (Tracer, _DynamicInt)):
            return False
        if isinstance(k, slice) and any(isinstance(b, Tracer) for b in (k.start, k.stop, k.step)):
            return False
        if isinstance(k, (list, tuple)) and not _is_static(tuple(k)):
            return False
    return True


def _flat_positions(x: Tracer, key: Any) -> np.ndarray:
    """numpy's own answer to which elements ``x[key]`` picks (static keys): their flat positions."""
    try:
        return np.asarray(np.arange(x.size, dtype=np.int64).reshape(x.shape)[key])
    except IndexError as exc:
        raise TraceError(str(exc), user_location()) from None


def _flat_update(x: Tracer, key: Any, value: Tracer, opname: str, advanced: bool = False) -> Tracer:
    """Any static key: scatter into the flattened array at numpy's positions (strided slices,
    index arrays mixed with partial slices or None; ``advanced``: an advanced key's assignment)."""
    pos = _flat_positions(x, key)
    upd = _broadcast_value(x, value, pos.shape, advanced=advanced)
    if pos.size == 0:
        return x
    out = bind(opname, reshape_to(x, (x.size,)), lift(pos), upd, axis=0)
    return reshape_to(out, x.shape)


def _with_dynamic_ints(key: Any) -> Any:
    """Mark traced 0-d integers in the key as dynamic starts (x[t] = v is a dynamic_update_slice)."""
    parts = key if isinstance(key, tuple) else (key,)
    marked = tuple(
        _DynamicInt(k) if isinstance(k, Tracer) and not k.shape and k.dtype.kind in "iu" else k for k in parts
    )
    return marked if isinstance(key, tuple) else marked[0]


def _basic_update(x: Tracer, items: list[tuple[str, Any]], value: Tracer) -> Tracer | None:
    """x[key] = v for a key of integers, unit-step slices, None and Ellipsis, whose integers and
    slice bounds may be traced: one dynamic_update_slice (None for strided slices)."""
    blocks: list[Any] = []  # per dim of x: (start, size) or the dynamic slice
    indexed: list[Any] = []  # numpy's shape of x[key]; None for a dynamic slice's length
    dim = 0
    for kind, v in items:
        if kind == "none":
            indexed.append(1)
            continue
        n = x.shape[dim]
        if kind == "int":
            _check_int(v, n, dim)
            blocks.append((v % n, 1))
        elif kind == "dint":  # numpy's IndexError outside [-n, n), when the graph runs
            start = _wrap_start(v, n)
            bad = apply_ufunc(np.logical_or, apply_ufunc(np.less, start, 0), apply_ufunc(np.greater_equal, start, n))
            blocks.append((guarded(start, bad, n), 1))
        elif kind == "slice":
            a, b, s = normalize_slice(v, n)
            length = slice_length(a, b, s)
            if s != 1 and length > 1:
                return None
            blocks.append((a, length))
            indexed.append(length)
        else:  # dslice
            blocks.append(v)
            indexed.append(None)
        dim += 1
    vshape = value.shape
    dims_of_value = dict(zip(range(len(indexed) - len(vshape), len(indexed)), vshape))
    j = 0
    for d, block in enumerate(blocks):
        if isinstance(block, slice):
            while indexed[j] is not None:
                j += 1
            known = dims_of_value.get(j)
            blocks[d] = _dynamic_bounds(block, x.shape[d], d, known if known != 1 else None)
            indexed[j] = blocks[d][1]
    upd = _broadcast_value(x, value, tuple(indexed))
    sizes = tuple(size for _, size in blocks)
    if 0 in sizes:
        return x
    upd = reshape_to(upd, sizes)
    dims = [d for d, (a, size) in enumerate(blocks) if isinstance(a, Tracer) or (a, size) != (0, x.shape[d])]
    if not dims:
        return fresh(upd) if upd is value else upd
    starts = [blocks[d][0] if isinstance(blocks[d][0], Tracer) else lift(np.int64(blocks[d][0])) for d in dims]
    return bind("dynamic_update_slice", x, upd, *starts, dims=tuple(dims))


def _scatter_form(x: Tracer, items: list[tuple[str, Any]], split_by_ellipsis: bool):
    """For index arrays with every other dim taken whole: (x with the indexed dims moved to the
    front if numpy moves them, the index arrays, the axis they start at, the permutation or None);
    None for other keys."""
    positions = [i for i, (kind, _) in enumerate(items) if kind in ("array", "bool")]
    dim = 0
    for kind, v in items:
        if kind in ("none", "bool"):
            return None
        if kind == "slice" and normalize_slice(v, x.shape[dim]) != (0, x.shape[dim], 1):
            return None
        dim += 1
    indices = [lift(items[p][1]) for p in positions]
    if positions == list(range(positions[0], positions[0] + len(positions))) and not split_by_ellipsis:
        return x, indices, positions[0], None
    perm = positions + [d for d in range(x.ndim) if d not in positions]
    return transpose(x, perm), indices, 0, perm


def _indexed_update(x: Tracer, key: Any, value: Any, opname: str) -> Tracer:
    """x[key] = v (opname "scatter") or np.add.at(x, key, v) ("scatter_add")."""
    if opname == "scatter" and isinstance(value, (int, float, list, tuple)) and not _contains_traced(value):
        # numpy converts Python numbers as np.asarray(value, x.dtype) does: 300 into int8 raises
        # OverflowError, nan into an int array ValueError (a numpy array is cast as astype casts)
        value = lift(value, x.dtype)
    elif not isinstance(value, Tracer):
        value = lift(value)  # (numpy arrays and scalars, lists that may hold traced values)
    items, split_by_ellipsis, advanced = _parse(x, _with_dynamic_ints(key))
    if not advanced and opname == "scatter":
        new = _basic_update(x, items, value)
        if new is not None:
            return new
    elif not advanced:  # add.at with basic indexing: no repeated positions, so x[key] + v
        if _is_static(key):
            return _flat_update(x, key, value, opname)
        current = getitem(x, key)
        return _indexed_update(x, key, np.add(current, _broadcast_value(x, value, current.shape)), "scatter")
    form = _scatter_form(x, items, split_by_ellipsis) if advanced else None
    if form is None:
        if not _is_static(key):
            raise TraceError(
                "assignment with traced index arrays needs every other dim taken whole (x[idx] = v, x[:, idx] = v); "
                "this key mixes them with partial slices or None",
                user_location(),
            )
        return _flat_update(x, key, value, opname, advanced=advanced and opname == "scatter")
    xt, indices, axis, perm = form
    k = len(indices)
    bshape = np.broadcast_shapes(*(t.shape for t in indices))
    upd = _broadcast_value(x, value, xt.shape[:axis] + bshape + xt.shape[axis + k :], advanced=opname == "scatter")
    if upd.size == 0:
        return x
    out = bind(opname, xt, *indices, upd, axis=axis)
    return out if perm is None else transpose(out, list(np.argsort(perm)))


def setitem(x: Tracer, key: Any, value: Any) -> Tracer:
    """The value of ``x`` after numpy's ``x[key] = value`` (a new array; ``x`` is unchanged)."""
    _check_value_dims(x, key, value)
    if traced_mask(key):
        return masked_setitem(x, key, value)
    return _indexed_update(x, key, value, "scatter")


def _check_value_dims(x: Tracer, key: Any, value: Any) -> None:
    """numpy's two rules on the value's dims that broadcasting alone does not give: one element
    (an integer for every dim, or ``()`` of a 0-d array) takes no array of 1 or more dims (but a
    bool element takes an array of one element, of any dims: numpy stores its truth value), and a
    boolean mask over all the dims (the whole key; of a 0-d array, also True or False) none of 2
    or more."""
    parts = key if type(key) is tuple else (key,)
    ndim = np.ndim(value)
    ints = all(_is_int(k) for k in parts)
    one_bool = x.dtype == np.bool_ and isinstance(value, (Tracer, np.ndarray)) and np.size(value) == 1
    if ints and len(parts) == x.ndim and ndim >= 1 and not one_bool:
        raise numpy_error(ValueError("setting an array element with a sequence."), TraceError, user_location())
    mask = parts[0] if len(parts) == 1 else None  # (of a 0-d x, also True or False: a 0-d mask)
    is_mask = _is_bool_array(mask) or isinstance(mask, (bool, np.bool_))
    whole_mask = is_mask and np.ndim(cast(Any, mask)) == x.ndim
    if whole_mask and ndim >= 2:
        raise numpy_error(
            TypeError(
                f"NumPy boolean array indexing assignment requires a 0 or 1-dimensional input, input has {ndim} dimensions"
            ),
            TraceError,
            user_location(),
        )


def _is_int(k: Any) -> bool:
    """An integer index: a Python or numpy integer, or a traced 0-d integer (a numpy integer)."""
    if isinstance(k, Tracer):
        return k.ndim == 0 and k.dtype.kind in "iu"
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def _is_bool_array(k: Any) -> bool:
    return isinstance(k, (np.ndarray, Tracer)) and k.dtype.kind == "b"


def add_at(x: Tracer, key: Any, value: Any) -> Tracer:
    """The value of ``x`` after ``np.add.at(x, key, value)`` (repeated indices accumulate)."""
    return _indexed_update(x, key, value, "scatter_add")


# --- numpy's other in-place writers -------------------------------------------------------------


def _writable(target: Any, what: str) -> Tracer:
    """The Tracer a write into ``target`` goes into: ``target`` itself, or for a numpy array the
    Tracer that stands for it from now on (shadows.py)."""
    if isinstance(target, Tracer):
        return target
    if isinstance(target, np.ndarray):
        return shadow_of(target)
    raise TraceError(f"{what}: the array to write into must be an array, got {type(target).__name__}", user_location())


def ufunc_inplace(ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """``np.add.at(x, key, v)`` (any ufunc's ``.at``) and ufunc calls with ``out=``: the out array
    (a Tracer, or the Tracer that stands for a numpy array from now on: shadows.py) takes the new
    value in place, as numpy's write changes it for every name holding it. Returns what numpy
    returns: None for ``.at``, the out array(s) for ``out=``."""
    name = ufunc_name(ufunc)
    if method == "at":
        if len(inputs) != ufunc.nin + 1 or ufunc.nout != 1:
            raise TraceError(f"{name}.at takes the array, the indices and {ufunc.nin - 1} operand(s)", user_location())
        x, key, *values = inputs
        if isinstance(x, np.generic) or (isinstance(x, Tracer) and (x._scalar or x._weak)):
            raise numpy_error(TypeError("first operand must be array"), TraceError, user_location())
        x = _writable(x, f"{name}.at")
        rebind(x, _ufunc_at(ufunc, x, key, values[0] if values else None))
        return None
    outs = kwargs.pop("out")
    outs = outs if isinstance(outs, tuple) else (outs,)
    where = kwargs.pop("where", True)
    casting = kwargs.pop("casting", "same_kind")
    result = registered_handler(HANDLERS.ufunc, "ufunc")(ufunc, method, *inputs, **kwargs)
    results = result if isinstance(result, tuple) else (result,)
    if len(outs) != len(results):
        raise TraceError(f"{name}: out= needs {len(results)} arrays, got {len(outs)}", user_location())
    written = tuple(
        r if out is None else write_out(f"ufunc '{ufunc.__name__}'", r, out, casting, where)
        for r, out in zip(results, outs)
    )
    return written if isinstance(result, tuple) else written[0]


_MAX_ROUNDS = 64  # ufunc.at with repeated indices and a cast after each step: one gather/scatter per round


def _ufunc_at(ufunc: np.ufunc, x: Tracer, key: Any, value: Any) -> Tracer:
    """The value of ``x`` after ``ufunc.at(x, key, value)``. numpy applies the ufunc once per index,
    in order, unbuffered (repeated indices apply again to the updated element), with the loop of
    x's dtype and the value's (the value taken as np.asarray takes it: a Python float is float64),
    and casts each result back into x's dtype unsafely: ``np.add.at(int_y, [0], -0.6)`` on
    ``int_y = [1]`` gives 0. One scatter_add does that for add and subtract when no cast is needed
    (or an integer one, which is modular); otherwise each round of distinct positions is a
    gather, the ufunc and a scatter (static keys)."""
    if value is None:
        v = None
    elif isinstance(value, Tracer):
        v = Tracer(value._ctx, value._value) if value._weak else value  # (numpy sees an array: not weak)
    elif _contains_traced(value):
        v = lift(value)
    else:
        v = lift(np.asarray(value))
    in_dts = (x.dtype,) if v is None else (x.dtype, v.dtype)
    try:
        sig = ufunc.resolve_dtypes(in_dts + (None,))
    except (TypeError, np.exceptions.DTypePromotionError) as exc:
        raise numpy_error(exc, TraceError, user_location()) from None
    loop, out_dt = sig[0], sig[-1]
    single = (
        ufunc in (np.add, np.subtract)
        and x.dtype.kind != "b"
        and (out_dt == x.dtype or (out_dt.kind in "iu" and x.dtype.kind in "iu"))
    )
    if single:
        assert v is not None  # (add and subtract take a value)
        v = convert(v, loop)
        return add_at(x, key, apply_ufunc(np.negative, v) if ufunc is np.subtract else v)

    def step(current: Tracer, operand: Tracer | None) -> Tracer:
        args = [convert(current, loop)] + ([] if operand is None else [convert(operand, sig[1])])
        return convert(ufunc(*args), x.dtype)

    items, _, advanced = _parse(x, _with_dynamic_ints(key))
    if not advanced:  # basic indexing: every element once
        current = getitem(x, key)
        operand = None if v is None else _broadcast_value(current, v, current.shape, to_dtype=False)
        return setitem(x, key, step(current, operand))
    if not _is_static(key):
        raise TraceError(
            f"{ufunc_name(ufunc)}.at with traced indices is supported for add and subtract whose result needs no "
            f"cast into the array's dtype {x.dtype}; convert the values first (v.astype(x.dtype))",
            user_location(),
        )
    positions = _flat_positions(x, key)
    operands = (
        None if v is None else reshape_to(_broadcast_value(x, v, positions.shape, to_dtype=False), (positions.size,))
    )
    flat = reshape_to(x, (x.size,))
    order = positions.reshape(-1)
    rank = np.zeros(order.shape, np.int64)  # how many earlier entries hit the same position
    seen: dict[int, int] = {}
    for i, p in enumerate(order.tolist()):
        rank[i] = seen.get(p, 0)
        seen[p] = rank[i] + 1
    rounds = int(rank.max()) + 1 if rank.size else 0
    if rounds > _MAX_ROUNDS:
        raise TraceError(
            f"{ufunc_name(ufunc)}.at here repeats an index {rounds} times and casts each result into {x.dtype}; "
            f"graphc computes that one repeat at a time (at most {_MAX_ROUNDS}); convert the values first "
            "(v.astype(x.dtype))",
            user_location(),
        )
    for r in range(rounds):
        entries = np.nonzero(rank == r)[0]
        where_ = lift(order[entries])
        current = bind("gather", flat, where_, axis=0)
        operand = None if operands is None else bind("gather", operands, lift(entries), axis=0)
        flat = bind("scatter", flat, where_, step(current, operand), axis=0)
    return reshape_to(flat, x.shape)


def _contains_traced(x: Any) -> bool:
    if isinstance(x, Tracer):
        return True
    return isinstance(x, (list, tuple)) and any(_contains_traced(v) for v in x)


@implements(np.put)
def put(a: Any, ind: Any, v: Any, mode: str = "raise") -> None:
    a = _writable(a, "np.put")
    n = a.size
    if isinstance(ind, Tracer):
        flat_ind = reshape_to(ind, (ind.size,))
        if mode == "wrap":
            flat_ind = cast(Tracer, np.mod(flat_ind, n))
        elif mode == "clip":
            flat_ind = cast(Tracer, np.clip(flat_ind, 0, n - 1))
    else:
        arr = np.asarray(ind, dtype=np.int64).reshape(-1)
        if mode == "wrap" and n:
            arr = arr % n
        elif mode == "clip":
            arr = np.clip(arr, 0, n - 1)
        elif arr.size and not (arr.min() >= -n and arr.max() < n):
            bad = int(arr.max() if arr.max() >= n else arr.min())
            raise TraceError(f"index {bad} is out of bounds for axis 0 with size {n}", user_location())
        flat_ind = lift(arr)
    k = flat_ind.size
    if k == 0:
        return None
    values = convert(v, a.dtype) if isinstance(v, Tracer) else lift(v, a.dtype)
    values = reshape_to(values, (values.size,))
    if values.size == 0:
        return None
    if values.size != k:  # numpy repeats v as often as needed
        values = bind("gather", values, lift(np.arange(k, dtype=np.int64) % values.size), axis=0)
    rebind(a, reshape_to(bind("scatter", reshape_to(a, (n,)), flat_ind, values, axis=0), a.shape))
    return None


@implements(np.copyto)
def copyto(dst: Any, src: Any, casting: Any = "same_kind", where: Any = True) -> None:
    dst = _writable(dst, "np.copyto")
    if isinstance(src, Tracer) and not src._weak and not np.can_cast(src.dtype, dst.dtype, casting):
        raise TraceError(
            f"Cannot cast array data from {src.dtype} to {dst.dtype} according to the rule '{casting}'",
            user_location(),
        )
    new = _broadcast_value(dst, src, dst.shape)
    if where is not True:
        new = cast(Tracer, np.where(where, new, dst))
    rebind(dst, new)
    return None


HANDLERS.getitem = getitem
HANDLERS.setitem = setitem
HANDLERS.ufunc_inplace = ufunc_inplace
