"""Integer-array indexing. ``gather(x, i1, ..., ik, axis=a)`` is numpy's ``x[:, ..., :, i1, ..., ik]``
with the k index arrays applied to dims a..a+k-1 and broadcast together: the result has shape
``x.shape[:a] + broadcast(i1..ik).shape + x.shape[a+k:]``. Negative indices wrap and out-of-range
indices raise IndexError, exactly as numpy does. ``emb[tokens]`` and ``x[np.arange(n), labels]``
are both one gather."""

from __future__ import annotations

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.traits import FreshResult, IndexedLookup, LinearIn
from graphc.ops.dims import DimRule, io_bytes
from graphc.ops.elementwise import broadcast_shapes
from graphc.ops.registry import register


def gather_infer(in_types, axis):
    """The shape rule of ``gather`` (scatter ops check their updates against it)."""
    x, *idx = in_types
    if not isinstance(axis, int) or not 0 <= axis <= x.ndim - len(idx):
        raise ShapeError(f"gather: axis {axis!r} with {len(idx)} index arrays does not fit a {x.ndim}-d operand")
    for t in idx:
        if t.dtype.kind not in "iu":
            raise ShapeError(f"gather: index arrays must be integers, got {t}")
    b = broadcast_shapes("gather", *(t.shape for t in idx))
    for d, t in enumerate(idx):
        if x.shape[axis + d] == 0 and t.size > 0:
            raise ShapeError(f"gather: cannot index into dimension {axis + d} of size 0")
    return (TensorType(x.shape[:axis] + b + x.shape[axis + len(idx) :], x.dtype),)


def _gather_impl(x, *idx, axis):
    out = x[(slice(None),) * axis + tuple(idx)]
    # numpy treats 0-d index arrays as ints, which give a view: a gather's result is its own
    return out.copy() if all(np.ndim(i) == 0 for i in idx) else out


gather = register(
    OpDef(
        "gather",
        "index",
        gather_infer,
        _gather_impl,
        attrs=("axis",),
        num_inputs=None,
        min_inputs=2,
        doc="x[..., i1, ..., ik, ...] with the k index arrays at dims axis..axis+k-1",
    )
)


def _scatter_add_infer(in_types, axis):
    x, *idx, updates = in_types
    if not idx:
        raise ShapeError("scatter_add needs at least one index array")
    (expected,) = gather_infer((x, *idx), axis)
    if updates.dtype != x.dtype:
        raise ShapeError(f"scatter_add: updates {updates} must have the dtype of the operand {x}")
    if updates.shape != expected.shape:
        raise ShapeError(f"scatter_add: updates have shape {updates.shape}, the indexed region has {expected.shape}")
    return (x,)


def _scatter_add_impl(x, *rest, axis):
    *idx, updates = rest
    out = np.array(x, copy=True)
    np.add.at(out, (slice(None),) * axis + tuple(idx), updates)
    return out


scatter_add = register(
    OpDef(
        "scatter_add",
        "index",
        _scatter_add_infer,
        _scatter_add_impl,
        attrs=("axis",),
        num_inputs=None,
        min_inputs=3,
        doc="x with updates added at x[..., i1, ..., ik, ...] (repeated indices accumulate); gather's transpose",
    )
)


# --- autodiff rules (see graphc/autodiff.py) --------------------------------------------------


def _gather_vjp(ad, g):  # gather's transpose: add each picked row's cotangent back (repeats add up)
    x, *idx = ad.inputs
    return [ad.bind("scatter_add", ad.zeros(x), *idx, g, axis=ad.attrs["axis"])] + [None] * len(idx)


def _gather_jvp(ad, tx, *tidx):
    x, *idx = ad.inputs
    return None if tx is None else ad.bind("gather", tx, *idx, axis=ad.attrs["axis"])


def _scatter_add_vjp(ad, g):
    x, *idx, updates = ad.inputs
    return [g] + [None] * len(idx) + [ad.bind("gather", g, *idx, axis=ad.attrs["axis"])]


def _scatter_add_jvp(ad, tx, *rest):
    *tidx, tu = rest
    if tx is None and tu is None:
        return None
    x, *idx, updates = ad.inputs
    return ad.bind("scatter_add", ad.instantiate(tx, x), *idx, ad.instantiate(tu, updates), axis=ad.attrs["axis"])


gather.vjp, gather.jvp = _gather_vjp, _gather_jvp
scatter_add.vjp, scatter_add.jvp = _scatter_add_vjp, _scatter_add_jvp


# --- sharding rules (see graphc/ops/dims.py) --------------------------------------------------
# The index arrays' dims become result dims and can be split like any batch dim. With one index
# array, the indexed dim of the table can be split by row ranges ("v", masked): each device looks
# up the indices that fall in its rows and contributes zeros elsewhere, so the result is a partial
# sum (P), the vocab-parallel embedding. scatter_add, gather's transpose, adds each device's share
# of the updates into its partial copy of the operand.


def _index_dims(x, idx, axis, out_shape, iota):
    """Labels of x's dims and of the index arrays' dims, aligned with the gather result, and the
    masked labels. ``iota`` maps an index array that is ``arange`` along one broadcast dim to that
    dim (``x[np.arange(n), labels]``): then the indexed dim of x and that result dim are one dim,
    split by rows on both sides (the local op offsets the global row numbers)."""
    k = len(idx)
    nb = len(out_shape) - (x.ndim - k)
    i_labels = [f"i{j}" for j in range(nb)]
    x_labels = [f"x{d}" for d in range(axis)] + [None] * k + [f"x{d}" for d in range(axis + k, x.ndim)]
    masked = set()
    for j, d in (iota or {}).items():
        if x.shape[axis + j] == out_shape[axis + d]:
            x_labels[axis + j] = i_labels[d]
            masked.add(i_labels[d])
    if k == 1 and not masked:
        x_labels[axis] = "v"
        masked.add("v")
    idx_entries = []
    for t in idx:
        off = nb - t.ndim
        idx_entries.append(
            tuple(
                None if (t.shape[d] == 1 and out_shape[axis + off + d] != 1) else i_labels[off + d]
                for d in range(t.ndim)
            )
        )
    res = tuple(x_labels[:axis]) + tuple(i_labels) + tuple(x_labels[axis + k :])
    return tuple(x_labels), idx_entries, res, frozenset(i_labels), frozenset(masked)


def _gather_dim_rule(in_types, out_types, axis, iota=None):
    x, *idx = in_types
    xl, il, res, _, masked = _index_dims(x, idx, axis, out_types[0].shape, iota)
    v = frozenset({"v"}) & masked
    return DimRule((xl, *il), (res,), sums=v, masked=masked)


def _scatter_add_dim_rule(in_types, out_types, axis, iota=None):
    x, *idx, updates = in_types
    xl, il, res, index_labels, masked = _index_dims(x, idx, axis, updates.shape, iota)
    return DimRule((xl, *il, res), (xl,), sums=index_labels - masked, masked=masked, partial_inputs=frozenset({0}))


def _gather_cost(in_types, out_types, axis, iota=None):
    out = out_types[0]
    return 0.0, 2 * out.nbytes + sum(t.nbytes for t in in_types[1:])


def _scatter_add_cost(in_types, out_types, axis, iota=None):
    updates = in_types[-1]
    return float(updates.size), io_bytes(in_types, out_types) + updates.nbytes


gather.dim_rule, gather.cost = _gather_dim_rule, _gather_cost
scatter_add.dim_rule, scatter_add.cost = _scatter_add_dim_rule, _scatter_add_cost


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
def _table_and_updates(node) -> tuple[frozenset[int], ...]:
    """Linear in the table and the updates jointly (the last operand)."""
    return (frozenset({0, len(node.inputs) - 1}),)


gather.traits = (FreshResult(), IndexedLookup(trailing=0), LinearIn((frozenset({0}),)))
scatter_add.traits = (FreshResult(), IndexedLookup(trailing=1), LinearIn(of_node=_table_and_updates))
