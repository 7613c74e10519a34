"""Ops of device programs: the collectives and local resharding steps the lowering inserts.

They appear only after partitioning (passes/lower.py), in the program of one device, with local
shapes. ``group`` is the tuple of device ids taking part, in rank order; the device running the
op is one of them and its rank is its position. The reference implementations below are the
semantics of one device's call given every member's operand (``reference``); the runtime
(runtime/comm.py) performs the exchange between devices.

  all_reduce(x) {axis = "tp", group = (0, 1)}                          sum over the group
  reduce_scatter(x) {axis, group, dim, blocks}                         sum, keep this rank's piece of dim
  all_gather(x) {axis, group, dim, blocks}                             concatenate the ranks' pieces of dim
  all_to_all(x) {axis, group, split_dim, split_blocks, concat_dim, concat_blocks}
                                                                       S(concat_dim) -> S(split_dim)
  shard_slice(x) {dim, blocks, parts, index}                           local R -> S(dim): piece ``index`` of ``parts``
  partial_zero(x) {keep}                                               local R -> P: x, or zeros off rank 0

A piece of a dim split in ``blocks`` blocks is the rank's share of every block, concatenated (the
layout of graphc.core.spec); the collectives below assume even splits, which is all a plan produces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError, ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.spec import piece_bounds, piece_index
from graphc.core.traits import Collective, DeviceLocal, LinearIn
from graphc.ops.dims import DimRule, io_bytes
from graphc.ops.precision import up
from graphc.ops.registry import check_axis, get_op, register


def _no_autodiff(name):
    def rule(ad, *args):
        raise GraphcError(f"{name} belongs to a partitioned device program; differentiate before partitioning")

    return rule


def _check_group(group) -> int:
    if not (
        isinstance(group, tuple)
        and group
        and all(isinstance(d, int) and d >= 0 for d in group)
        and len(set(group)) == len(group)
    ):
        raise ShapeError(f"group must be a non-empty tuple of distinct device ids, got {group!r}")
    return len(group)


def _check_blocks(size: int, blocks, parts: int, what: str) -> None:
    if not isinstance(blocks, int) or blocks < 1:
        raise ShapeError(f"{what}: blocks must be a positive int, got {blocks!r}")
    if size % (blocks * parts):
        raise ShapeError(f"{what}: a dim of size {size} does not split evenly into {parts} pieces of {blocks} block(s)")


def _with_dim(shape, dim, size):
    out = list(shape)
    out[dim] = size
    return tuple(out)


def _all_reduce_infer(in_types, axis, group):
    _check_group(group)
    return (in_types[0],)


def _reduce_scatter_infer(in_types, axis, group, dim, blocks):
    (x,) = in_types
    n = _check_group(group)
    check_axis(dim, x.ndim, "dim")
    _check_blocks(x.shape[dim], blocks, n, "reduce_scatter")
    return (TensorType(_with_dim(x.shape, dim, x.shape[dim] // n), x.dtype),)


def _all_gather_infer(in_types, axis, group, dim, blocks):
    (x,) = in_types
    n = _check_group(group)
    check_axis(dim, x.ndim, "dim")
    _check_blocks(x.shape[dim] * n, blocks, n, "all_gather")
    return (TensorType(_with_dim(x.shape, dim, x.shape[dim] * n), x.dtype),)


def _all_to_all_infer(in_types, axis, group, split_dim, split_blocks, concat_dim, concat_blocks):
    (x,) = in_types
    n = _check_group(group)
    check_axis(split_dim, x.ndim, "split_dim")
    check_axis(concat_dim, x.ndim, "concat_dim")
    if split_dim == concat_dim:
        raise ShapeError("all_to_all: split_dim and concat_dim must differ")
    _check_blocks(x.shape[split_dim], split_blocks, n, "all_to_all")
    _check_blocks(x.shape[concat_dim] * n, concat_blocks, n, "all_to_all")
    shape = _with_dim(x.shape, split_dim, x.shape[split_dim] // n)
    return (TensorType(_with_dim(shape, concat_dim, x.shape[concat_dim] * n), x.dtype),)


def _shard_slice_infer(in_types, dim, blocks, parts, index):
    (x,) = in_types
    check_axis(dim, x.ndim, "dim")
    if not (isinstance(parts, int) and parts >= 1 and isinstance(index, int) and 0 <= index < parts):
        raise ShapeError(f"shard_slice: need 0 <= index < parts, got index {index!r} of {parts!r}")
    _check_blocks(x.shape[dim], blocks, parts, "shard_slice")
    return (TensorType(_with_dim(x.shape, dim, x.shape[dim] // parts), x.dtype),)


def _partial_zero_infer(in_types, keep):
    if not isinstance(keep, bool):
        raise ShapeError(f"partial_zero: keep must be a bool, got {keep!r}")
    return (in_types[0],)


# --- the reference semantics of every collective ---------------------------------------------
# The one definition of what each rank gets, given every rank's operand (in rank order): the
# interpreter, the lock-step simulator of device programs (graphc/programs.py) and the tests of
# every communicator (runtime/comm.py) use it. A piece of a dim is graphc.core.spec's layout.


def take_piece(x: np.ndarray, dim: int, n: int, r: int, blocks: int = 1) -> np.ndarray:
    """Rank ``r``'s piece of dim ``dim`` of ``x`` cut into ``n`` pieces (``blocks`` blocks each)."""
    if blocks == 1:
        lo, hi = piece_bounds(x.shape[dim], n, r)
        return x[(slice(None),) * dim + (slice(lo, hi),)]
    return np.take(x, piece_index(x.shape[dim], n, r, blocks), axis=dim)


def join_pieces(pieces: list[np.ndarray], dim: int, blocks: int = 1) -> np.ndarray:
    """The inverse of ``take_piece`` over all ranks' pieces (in rank order)."""
    if blocks == 1:
        return np.concatenate(pieces, axis=dim)
    n = len(pieces)
    p0 = pieces[0]
    shape = p0.shape[:dim] + (p0.shape[dim] * n,) + p0.shape[dim + 1 :]
    whole = np.empty(shape, p0.dtype)
    for r, p in enumerate(pieces):
        index: list[Any] = [slice(None)] * whole.ndim
        index[dim] = piece_index(shape[dim], n, r, blocks)
        whole[tuple(index)] = p
    return whole


def _sum_in_rank_order(xs: list[np.ndarray]) -> np.ndarray:
    """((x0 + x1) + x2) + ...: the order every communicator must reproduce, bit for bit. 16-bit
    floats (bfloat16, float16) are added in float32 and rounded once (ops/precision.py)."""
    total = np.array(up(xs[0]), copy=True)
    for x in xs[1:]:
        total += x
    return total.astype(xs[0].dtype, copy=False)


def reference(kind: str, xs_by_rank: list, **attrs) -> list:
    """Every rank's result of collective ``kind`` given every rank's operand, in plain numpy.
    None stands for "no result on this rank" (reduce and gather off the root, barrier)."""
    xs: list[Any] = [None if x is None else np.asarray(x) for x in xs_by_rank]
    n = len(xs)
    root = attrs.get("root", 0)
    blocks = attrs.get("blocks", 1)
    if kind == "all_reduce":
        total = _sum_in_rank_order(xs)
        return [total.copy() for _ in xs]
    if kind == "reduce":
        return [_sum_in_rank_order(xs) if r == root else None for r in range(n)]
    if kind == "reduce_scatter":
        total = _sum_in_rank_order(xs)
        return [np.array(take_piece(total, attrs["dim"], n, r, blocks)) for r in range(n)]
    if kind == "all_gather":
        whole = join_pieces(xs, attrs["dim"], blocks)
        return [whole.copy() for _ in xs]
    if kind == "gather":
        return [join_pieces(xs, attrs["dim"], blocks) if r == root else None for r in range(n)]
    if kind == "broadcast":
        return [xs[root].copy() for _ in xs]
    if kind == "scatter":
        return [np.array(take_piece(xs[root], attrs["dim"], n, r, blocks)) for r in range(n)]
    if kind == "all_to_all":
        sd, cd = attrs["split_dim"], attrs["concat_dim"]
        sb, cb = attrs.get("split_blocks", 1), attrs.get("concat_blocks", 1)
        return [join_pieces([take_piece(x, sd, n, r, sb) for x in xs], cd, cb) for r in range(n)]
    if kind == "barrier":
        return [None] * n
    raise ValueError(f"{kind!r} is not a collective")


def _collective_impl(name):
    def impl(x, **attrs):
        if len(attrs["group"]) == 1:
            return reference(name, [x], **attrs)[0]
        raise GraphcError(f"{name} over group {attrs['group']} needs the multi-device runtime (runtime/comm.py)")

    return impl


def _collective_cost(in_types, out_types, **_attrs):
    return 0.0, io_bytes(in_types, out_types)


_COLLECTIVES: dict[str, tuple[Callable[..., tuple[TensorType, ...]], tuple[str, ...], str]] = {
    "all_reduce": (_all_reduce_infer, ("axis", "group"), "sum over the devices of the group"),
    "reduce_scatter": (
        _reduce_scatter_infer,
        ("axis", "group", "dim", "blocks"),
        "sum over the group; each device keeps its piece of dim",
    ),
    "all_gather": (_all_gather_infer, ("axis", "group", "dim", "blocks"), "concatenate the group's pieces of dim"),
    "all_to_all": (
        _all_to_all_infer,
        ("axis", "group", "split_dim", "split_blocks", "concat_dim", "concat_blocks"),
        "re-split across the group: pieces of split_dim out, pieces of concat_dim in",
    ),
}

for _name, (_infer, _attrs, _doc) in _COLLECTIVES.items():
    _op = register(OpDef(_name, "comm", _infer, _collective_impl(_name), attrs=_attrs, doc=_doc))
    _op.vjp = _op.jvp = _no_autodiff(_name)
    _op.cost = _collective_cost

shard_slice = register(
    OpDef(
        "shard_slice",
        "comm",
        _shard_slice_infer,
        lambda x, dim, blocks, parts, index: np.ascontiguousarray(take_piece(x, dim, parts, index, blocks)),
        attrs=("dim", "blocks", "parts", "index"),
        doc="this device's piece of a replicated tensor (R -> S, local)",
    )
)
partial_zero = register(
    OpDef(
        "partial_zero",
        "comm",
        _partial_zero_infer,
        lambda x, keep: x if keep else np.zeros_like(x),
        attrs=("keep",),
        doc="a replicated tensor as partial sums: kept on rank 0, zeros elsewhere (R -> P, local)",
    )
)
for _op in (shard_slice, partial_zero):
    _op.vjp = _op.jvp = _no_autodiff(_op.name)
    _op.cost = _collective_cost


# --- dimension rules: a device program partitioned again (pipeline stages planned on a sub-mesh) --
# A collective acts along its group, elementwise across the dims it does not cut, so those dims
# can be split further; the dims it cuts or joins stay whole.


def _keep_dims_rule(*cut_attrs):
    def rule(in_types, out_types, **attrs):
        x, out = in_types[0], out_types[0]
        cut = {attrs[a] % x.ndim for a in cut_attrs}
        labels = tuple(None if d in cut else f"e{d}" for d in range(x.ndim))
        return DimRule((labels,), (tuple(None if d in cut else f"e{d}" for d in range(out.ndim)),))

    return rule


for _name, _cut in (
    ("all_reduce", ()),
    ("reduce_scatter", ("dim",)),
    ("all_gather", ("dim",)),
    ("all_to_all", ("split_dim", "concat_dim")),
    ("shard_slice", ("dim",)),
    ("partial_zero", ()),
):
    get_op(_name).dim_rule = _keep_dims_rule(*_cut)


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
for _name in _COLLECTIVES:
    get_op(_name).traits = (Collective(),)
# a sum over the group is linear in its operand: an all_reduce over the micro-batch axis (gradient
# accumulation, passes/microbatch.py) carries a data-parallel partial sum through, so the
# all-reduce over the devices runs once per step, after the micro-batches meet
get_op("all_reduce").traits = (Collective(), LinearIn((frozenset({0}),), on_meshes=True))
for _op in (shard_slice, partial_zero):
    _op.traits = (DeviceLocal(),)
