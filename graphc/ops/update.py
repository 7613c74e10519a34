"""Functional in-place updates: what ``x[key] = v`` becomes in a graph (as JAX's ``x.at[key].set(v)``).

  dynamic_slice(x, *starts) {dims, sizes}         the block of x of ``sizes`` at ``starts`` along ``dims``
  dynamic_update_slice(x, u, *starts) {dims}      x with that block replaced by u
  scatter(x, i1, ..., ik, u) {axis}               x with x[..., i1, ..., ik, ...] = u (gather's layout)

``starts`` are 0-d integer operands (traced or constant), one per dim in ``dims``; the dims not in
``dims`` are taken whole, so sharding them changes no attribute. As in XLA, a start is clamped to
``[0, n - size]`` so the block always fits: numpy would raise for a block that does not fit, which
a graph cannot do for a traced start. ``scatter`` with repeated indices keeps the last update (the
numpy order), so only that update reaches the result: its gradient goes to that update alone, the
earlier ones at the same position get zero (``y[[0, 0]] = v`` has d sum(y) / dv = [0, 1]).
"""

from __future__ import annotations

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.traits import FreshResult, LinearIn
from graphc.ops.dims import DimRule, io_bytes
from graphc.ops.indexing import gather_infer
from graphc.ops.registry import register


def _check_block(name: str, x: TensorType, starts, dims, sizes) -> None:
    if len(starts) != len(dims) or len(sizes) != len(dims):
        raise ShapeError(f"{name}: {len(starts)} starts for dims {dims} with sizes {sizes}")
    if sorted(set(dims)) != list(dims) or any(not 0 <= d < x.ndim for d in dims):
        raise ShapeError(f"{name}: dims {dims} must be increasing dims of a {x.ndim}-d operand")
    for t in starts:
        if t.shape != () or t.dtype.kind not in "iu":
            raise ShapeError(f"{name}: starts must be 0-d integers, got {t}")
    for d, size in zip(dims, sizes):
        if not isinstance(size, int) or not 0 <= size <= x.shape[d]:
            raise ShapeError(f"{name}: a block of size {size} does not fit dim {d} of {x}")


def _block_shape(x: TensorType, dims, sizes) -> tuple[int, ...]:
    by_dim = dict(zip(dims, sizes))
    return tuple(by_dim.get(d, n) for d, n in enumerate(x.shape))


def _dynamic_slice_infer(in_types, dims, sizes):
    x, *starts = in_types
    _check_block("dynamic_slice", x, starts, dims, sizes)
    return (TensorType(_block_shape(x, dims, sizes), x.dtype),)


def _block(shape, starts, dims, sizes) -> tuple[slice, ...]:
    """The clamped block as numpy slices."""
    key = [slice(None)] * len(shape)
    for d, s, size in zip(dims, starts, sizes):
        a = min(max(int(s), 0), shape[d] - size)
        key[d] = slice(a, a + size)
    return tuple(key)


def _dynamic_slice_impl(x, *starts, dims, sizes):
    return np.array(x[_block(x.shape, starts, dims, sizes)], copy=True)


dynamic_slice = register(
    OpDef(
        "dynamic_slice",
        "index",
        _dynamic_slice_infer,
        _dynamic_slice_impl,
        attrs=("dims", "sizes"),
        num_inputs=None,
        min_inputs=1,
        doc="x[..., s:s+size, ...] along dims, starts (0-d operands) clamped so the block fits",
    )
)


def _dus_infer(in_types, dims):
    x, u, *starts = in_types
    if u.dtype != x.dtype or u.ndim != x.ndim:
        raise ShapeError(f"dynamic_update_slice: update {u} must have the dtype and rank of the operand {x}")
    sizes = tuple(u.shape[d] for d in dims) if all(0 <= d < u.ndim for d in dims) else ()
    _check_block("dynamic_update_slice", x, starts, dims, sizes)
    if _block_shape(x, dims, sizes) != u.shape:
        raise ShapeError(f"dynamic_update_slice: update {u} must match the operand {x} outside dims {dims}")
    return (x,)


def _dus_impl(x, u, *starts, dims):
    out = np.array(x, copy=True)
    out[_block(x.shape, starts, dims, tuple(u.shape[d] for d in dims))] = u
    return out


dynamic_update_slice = register(
    OpDef(
        "dynamic_update_slice",
        "index",
        _dus_infer,
        _dus_impl,
        attrs=("dims",),
        num_inputs=None,
        min_inputs=2,
        doc="x with the block of u's shape at starts along dims replaced by u (starts clamped so it fits)",
    )
)


def _scatter_infer(in_types, axis):
    x, *idx, updates = in_types
    if not idx:
        raise ShapeError("scatter needs at least one index array")
    (expected,) = gather_infer((x, *idx), axis)
    if updates.dtype != x.dtype:
        raise ShapeError(f"scatter: updates {updates} must have the dtype of the operand {x}")
    if updates.shape != expected.shape:
        raise ShapeError(f"scatter: updates have shape {updates.shape}, the indexed region has {expected.shape}")
    return (x,)


def _scatter_impl(x, *rest, axis):
    *idx, updates = rest
    out = np.array(x, copy=True)
    out[(slice(None),) * axis + tuple(idx)] = updates
    return out


scatter = register(
    OpDef(
        "scatter",
        "index",
        _scatter_infer,
        _scatter_impl,
        attrs=("axis",),
        num_inputs=None,
        min_inputs=3,
        doc="x with x[..., i1, ..., ik, ...] = updates (the last of repeated indices wins, as in numpy)",
    )
)


# --- autodiff rules (see graphc/autodiff.py) --------------------------------------------------
# Each is linear in (x, update) with the indices fixed: the cotangent of x is g with the written
# positions zeroed, the update's is g read back at those positions.


def _dynamic_slice_vjp(ad, g):
    x, *starts = ad.inputs
    return [ad.bind("dynamic_update_slice", ad.zeros(x), g, *starts, dims=ad.attrs["dims"])] + [None] * len(starts)


def _dynamic_slice_jvp(ad, tx, *tstarts):
    x, *starts = ad.inputs
    return None if tx is None else ad.bind("dynamic_slice", tx, *starts, **ad.attrs)


def _dus_vjp(ad, g):
    x, u, *starts = ad.inputs
    dims = ad.attrs["dims"]
    gx = ad.bind("dynamic_update_slice", g, ad.zeros(u), *starts, dims=dims)
    gu = ad.bind("dynamic_slice", g, *starts, dims=dims, sizes=tuple(u.shape[d] for d in dims))
    return [gx, gu] + [None] * len(starts)


def _dus_jvp(ad, tx, tu, *tstarts):
    if tx is None and tu is None:
        return None
    x, u, *starts = ad.inputs
    return ad.bind("dynamic_update_slice", ad.instantiate(tx, x), ad.instantiate(tu, u), *starts, **ad.attrs)


def _scatter_vjp(ad, g):
    x, *idx, updates = ad.inputs
    axis = ad.attrs["axis"]
    gx = ad.bind("scatter", g, *idx, ad.zeros(updates), axis=axis)
    gu = ad.bind("gather", g, *idx, axis=axis)
    last = _last_writes(ad, x, idx, axis)
    if last is not None:  # repeated indices: only the update written last reaches the result
        shape = (1,) * axis + last.shape + (1,) * (updates.ndim - axis - last.ndim)
        mask = ad.bind("broadcast_to", ad.bind("reshape", last, shape=shape), shape=updates.shape)
        gu = ad.bind("where", mask, gu, ad.zeros(updates))
    return [gx] + [None] * len(idx) + [gu]


def _last_writes(ad, x, idx, axis):
    """Which updates of ``scatter(x, *idx, updates, axis=axis)`` are the last written at their
    position (a bool array of the index arrays' broadcast shape), found by scattering each update's
    ordinal and reading back which one stayed; None when every one is (no repeated index, known
    from constant indices)."""
    k = len(idx)
    bshape = np.broadcast_shapes(*(t.shape for t in idx))
    ordinals = np.arange(int(np.prod(bshape, dtype=np.int64)), dtype=np.int64).reshape(bshape)
    region = x.shape[axis : axis + k]
    producers = [t._value.producer for t in idx]
    if all(p is not None and p.op.name == "constant" for p in producers):
        written = np.zeros(region, np.int64)
        arrays = [np.asarray(p.attrs["value"]) for p in producers]
        written[tuple(arrays)] = ordinals
        last = written[tuple(arrays)] == ordinals
        return None if last.all() else ad.constant(last)
    written = ad.bind("scatter", ad.zeros(TensorType(region, np.dtype(np.int64))), *idx, ad.constant(ordinals), axis=0)
    kept = ad.bind("gather", written, *idx, axis=0)
    return ad.bind("compare", kept, ad.constant(ordinals), direction="eq")


def _scatter_jvp(ad, tx, *rest):
    *tidx, tu = rest
    if tx is None and tu is None:
        return None
    x, *idx, updates = ad.inputs
    return ad.bind("scatter", ad.instantiate(tx, x), *idx, ad.instantiate(tu, updates), axis=ad.attrs["axis"])


dynamic_slice.vjp, dynamic_slice.jvp = _dynamic_slice_vjp, _dynamic_slice_jvp
dynamic_update_slice.vjp, dynamic_update_slice.jvp = _dus_vjp, _dus_jvp
scatter.vjp, scatter.jvp = _scatter_vjp, _scatter_jvp


# --- sharding rules (see graphc/ops/dims.py) --------------------------------------------------
# The dims taken whole (not in ``dims``; not indexed by scatter) are independent: each device
# updates its own slab. The block dims and the index arrays are not split (a write may land in
# any device's piece), so they fall back to replicated.


def _whole_dims(x: TensorType, dims) -> tuple:
    return tuple(None if d in dims else f"x{d}" for d in range(x.ndim))


def _dynamic_slice_dim_rule(in_types, out_types, dims, sizes):
    x, *starts = in_types
    labels = _whole_dims(x, dims)
    return DimRule((labels,) + ((),) * len(starts), (labels,))


def _dus_dim_rule(in_types, out_types, dims):
    x, u, *starts = in_types
    labels = _whole_dims(x, dims)
    return DimRule((labels, labels) + ((),) * len(starts), (labels,))


def _scatter_dim_rule(in_types, out_types, axis):
    x, *idx, updates = in_types
    k = len(idx)
    nb = updates.ndim - (x.ndim - k)
    x_labels = tuple(None if axis <= d < axis + k else f"x{d}" for d in range(x.ndim))
    u_labels = x_labels[:axis] + (None,) * nb + x_labels[axis + k :]
    return DimRule((x_labels, *((None,) * t.ndim for t in idx), u_labels), (x_labels,))


def _dynamic_slice_cost(in_types, out_types, dims, sizes):
    return 0.0, 2 * out_types[0].nbytes


def _dus_cost(in_types, out_types, dims):
    return 0.0, io_bytes(in_types, out_types)  # (copy x, write the block: a backend may update in place)


def _scatter_cost(in_types, out_types, axis):
    updates = in_types[-1]
    return 0.0, io_bytes(in_types, out_types) + updates.nbytes


dynamic_slice.dim_rule, dynamic_slice.cost = _dynamic_slice_dim_rule, _dynamic_slice_cost
dynamic_update_slice.dim_rule, dynamic_update_slice.cost = _dus_dim_rule, _dus_cost
scatter.dim_rule, scatter.cost = _scatter_dim_rule, _scatter_cost


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
def _operand_and_updates(node) -> tuple[frozenset[int], ...]:
    """Linear in the operand and the updates jointly (the last operand)."""
    return (frozenset({0, len(node.inputs) - 1}),)


dynamic_slice.traits = (FreshResult(), LinearIn((frozenset({0}),)))
dynamic_update_slice.traits = (FreshResult(), LinearIn((frozenset({0, 1}),)))
scatter.traits = (FreshResult(), LinearIn(of_node=_operand_and_updates))
