"""What one device computes under a strategy: the op on its local pieces.

This is the reference semantics of a strategy, shared by the rule tests (every strategy of every
op, run on every device of a mesh, must reassemble to the op's result) and by the lowering to
device programs. Most ops run unchanged on their pieces; the attributes that spell out sizes
(reshape and broadcast targets, slice bounds, split points, constant values) are rewritten to the
local sizes, and ops with ``masked`` labels (a gather from a row-split table) translate global
indices to local rows and keep only the rows the device owns, so the partial results sum to the
whole.
"""

from __future__ import annotations

import numpy as np

from graphc.core.dtypes import additive_identity
from graphc.core.ir import TensorType
from graphc.core.spec import local_shape, piece_index
from graphc.core.traits import Constant, Fused, IndexedLookup, LocalAttrs
from graphc.interpreter import run_flat
from graphc.passes.sharding.strategies import Strategy, get_rule


def local_types(types, specs, mesh_shape) -> tuple[TensorType, ...]:
    return tuple(TensorType(local_shape(t.shape, s, mesh_shape), t.dtype) for t, s in zip(types, specs))


def local_attrs(node, strategy: Strategy, mesh_shape: tuple[int, ...], coord: tuple[int, ...]) -> dict:
    """The node's attributes for its local pieces on the device at ``coord`` (its op's LocalAttrs
    trait; the attributes as they are for an op without one)."""
    local = node.op.trait(LocalAttrs)
    if local is None:
        return dict(node.attrs)
    ins = local_types([v.type for v in node.inputs], strategy.in_specs, mesh_shape)
    outs = local_types([o.type for o in node.outputs], strategy.out_specs, mesh_shape)
    return local.fn(node, ins, outs, strategy.out_specs, mesh_shape, coord)


def owned_rows(size: int, spec, dim: int, mesh_shape, coord) -> np.ndarray | None:
    """Global row -> local row (or -1) along ``dim`` of a tensor with ``spec`` on the device at
    ``coord``: the table a masked lookup maps its indices through (passes/lower.py); None if
    ``dim`` is not split."""
    for p, n, r in zip(spec, mesh_shape, coord):
        if p.is_split and p.dim == dim:
            rows = piece_index(size, n, r, p.blocks)
            table = np.full(size, -1, dtype=np.int64)
            table[rows] = np.arange(len(rows))
            return table
    return None


def run_local(
    node, strategy: Strategy, mesh_shape: tuple[int, ...], coord: tuple[int, ...], arrays: list[np.ndarray]
) -> list[np.ndarray]:
    """The node's local results on the device at ``coord`` from its local operands."""
    attrs = local_attrs(node, strategy, mesh_shape, coord)
    if node.op.has(IndexedLookup):
        return _run_indexing_local(node, strategy, mesh_shape, coord, arrays, attrs)
    if node.op.has(Fused):
        return _run_region_local(node.regions[0], arrays)
    if node.regions:  # control flow: replicated, so the operands are whole
        return list(node.op.impl(run_flat, node.regions, *arrays, **attrs))
    return list(node.op.evaluate(*arrays, **attrs))


def _run_region_local(region, arrays):
    """A fused region on local pieces: its elementwise ops and row reductions need no rewriting
    (the region's rule only lets dims split that every inner op keeps whole)."""
    env = dict(zip(region.inputs, arrays))
    for inner in region.nodes:
        scalar = inner.op.has(Constant) and inner.outputs[0].type.size == 1
        if inner.op.has(LocalAttrs) and not scalar or inner.regions:
            raise NotImplementedError(f"local execution of {inner.op.name} inside a fused region")
        for o, a in zip(inner.outputs, inner.op.evaluate(*[env[v] for v in inner.inputs], **inner.attrs)):
            env[o] = a
    return [env[v] for v in region.outputs]


def _run_indexing_local(node, strategy, mesh_shape, coord, arrays, attrs):
    """gather / scatter_add on a table split by rows along a masked dim: global indices become
    local rows; indices another device owns contribute zeros (a partial result) or, for an
    ``arange`` index aligned with the split, are all owned. Out-of-range indices raise as numpy
    does, on every device, whichever rows it owns."""
    rule = get_rule(node)
    axis = attrs["axis"]
    assert rule is not None  # a masked split comes from the op's rule
    lookup = node.op.trait(IndexedLookup)
    k = lookup.index_count(len(node.inputs))
    x_type = node.inputs[0].type
    idx = list(arrays[1 : 1 + k])
    owned = None
    for j in range(k):
        if rule.inputs[0][axis + j] not in rule.masked:
            continue
        size = x_type.shape[axis + j]
        table = owned_rows(size, strategy.in_specs[0], axis + j, mesh_shape, coord)
        if table is None:
            continue
        glob = np.where(idx[j] < 0, idx[j] + size, idx[j])
        if np.any((glob < 0) | (glob >= size)):
            bad = idx[j][(glob < 0) | (glob >= size)].flat[0]
            raise IndexError(f"index {bad} is out of bounds for axis {axis + j} with size {size}")
        local = table[glob]
        mine = local >= 0
        idx[j] = np.where(mine, local, 0)
        owned = mine if owned is None else owned & mine
    if owned is None:
        return list(node.op.evaluate(*arrays, **attrs))
    owned = np.broadcast_to(owned, np.broadcast_shapes(*(i.shape for i in idx)))
    gather = lookup.trailing == 0
    nd = node.outputs[0].ndim if gather else arrays[-1].ndim
    mask = owned.reshape((1,) * axis + owned.shape + (1,) * (nd - axis - owned.ndim))
    if gather:
        (out,) = node.op.evaluate(arrays[0], *idx, **attrs)
        return [np.where(mask, out, additive_identity(out.dtype))]
    updates = arrays[-1]
    return list(node.op.evaluate(arrays[0], *idx, np.where(mask, updates, additive_identity(updates.dtype)), **attrs))
