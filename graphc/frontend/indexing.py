"""``x[key]`` on a traced array, with numpy's full semantics for basic and advanced indexing.

1. basic part: slices and (when no index arrays are present) integers become one ``slice`` node,
   then one ``reshape`` drops integer-indexed dims and inserts ``None`` dims;
2. advanced part: index arrays (traced, numpy, lists, ranges, static bool masks via nonzero) and,
   when any is present, integers and scalar bools too, broadcast together and become one
   ``gather``. As in numpy, the gathered dims replace the indexed dims in place when the advanced
   indices are adjacent in the key, and move to the front otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core.errors import TraceError
from graphc.frontend.functions import reshape_to
from graphc.frontend.shape_functions import transpose
from graphc.frontend.tracer import HANDLERS, Tracer, bind, lift, user_location
from graphc.ops.shape import normalize_slice, slice_length


def _classify(k: Any) -> list[tuple[str, Any]]:
    if k is None:
        return [("none", None)]
    if k is Ellipsis:
        return [("ellipsis", None)]
    if isinstance(k, slice):
        return [("slice", k)]
    if isinstance(k, Tracer):
        if k.dtype.kind == "b":
            raise TraceError(
                "boolean-mask indexing with a traced mask has a data-dependent shape; use np.where(mask, x, 0) instead",
                user_location(),
            )
        if k.dtype.kind not in "iu":
            raise TraceError(f"arrays used as indices must be of integer type, got {k.dtype}", user_location())
        return [("array", k)]
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


def getitem(x: Tracer, key: Any) -> Tracer:
    items: list[tuple[str, Any]] = []
    for k in key if isinstance(key, tuple) else (key,):
        items.extend(_classify(k))

    if sum(kind == "ellipsis" for kind, _ in items) > 1:
        raise TraceError("an index can only have a single ellipsis ('...')", user_location())
    consumed = sum(v.ndim if kind == "mask" else kind in ("slice", "int", "array") for kind, v in items)
    if consumed > x.ndim:
        raise TraceError(
            f"too many indices for array: array is {x.ndim}-dimensional, but {consumed} were indexed", user_location()
        )
    fill = [("slice", slice(None))] * (x.ndim - consumed)
    # numpy counts an ellipsis as separating the index arrays around it even when it stands for no dims
    split_by_ellipsis = False
    if any(kind == "ellipsis" for kind, _ in items):
        at = next(i for i, (kind, _) in enumerate(items) if kind == "ellipsis")
        is_array = [kind in ("array", "mask", "int", "bool") for kind, _ in items]
        split_by_ellipsis = any(is_array[:at]) and any(is_array[at + 1 :])
        items = items[:at] + fill + items[at + 1 :]
    else:
        items = items + fill
    items = _expand_masks(x, items)
    advanced = any(kind in ("array", "bool") for kind, _ in items)
    if advanced:
        items = _advanced_items(x, items)

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


HANDLERS.getitem = getitem
