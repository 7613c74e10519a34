"""Op traits: what an op *is*, declared once with the op (graphc/ops/) and asked by every layer.

A pass, the planner's memory model, the lowering and the runtime never recognise an op by its
name: they ask ``op.has(ViewOf)`` or ``op.trait(Reduction).combine``, as xDSL's passes query op
traits and tinygrad's query its ``GroupOp`` sets. So the planner's memory model and the executor
cannot disagree about which results alias their operands: both read ``ViewOf``
(tests/core/test_traits.py checks every registered op's traits against what its numpy implementation
really does).

Each trait is a small frozen dataclass; an op holds a tuple of them (``OpDef.traits``). The
family an op belongs to (``OpDef.kind``: elementwise, reduction, shape, ...) stays as the coarse
grouping the text IR documents; traits say what the rest of graphc needs to know.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Trait:
    """Base of every op trait."""


# How much an elementwise op costs per element, next to loading and storing it (Elementwise.cost)
LOAD_STORE = 1  # add, sub, mul, neg, abs, max, min, where, compare, convert: a kernel recomputes
#                 them in a loop of its own rather than staging their result (runtime/kernelsource.py)
CHEAP = 2  # also div, sign and the logical ops: the backward recomputes them from kept values
#            rather than keeping their results (passes/recompute/cheap.py)
MATH = 3  # exp, log, tanh, sqrt, pow, ...: kept


@dataclass(frozen=True)
class Elementwise(Trait):
    """Each result element depends on the operand elements at the same (broadcast) index.
    ``cost``: LOAD_STORE, CHEAP or MATH (above)."""

    cost: int = MATH


@dataclass(frozen=True)
class Reduction(Trait):
    """Reduces operand 0 over ``attrs["axes"]`` with ``combine`` ("add", "max", "min"; "argmax"
    keeps an index). ``row_reducible``: a fused kernel can compute it along its last axis."""

    combine: str

    @property
    def row_reducible(self) -> bool:
        return self.combine in ("add", "max", "min")


@dataclass(frozen=True)
class Contraction(Trait):
    """A sum of products over contracted dims (matmul, einsum): priced at the profile's matmul rate."""


@dataclass(frozen=True)
class ViewOf(Trait):
    """numpy's implementation returns a view of ``operand``: the result looks into the operand's
    buffer and costs no memory of its own. ``strided(node)`` says whether the view is not
    C-contiguous; ``copies_strided``: the op copies (numpy's reshape does) when its operand is a
    strided view, so the result is a new buffer then. ``writeable``: numpy's view can be written
    through (broadcast_to's cannot)."""

    operand: int = 0
    strided: Callable[[Any], bool] | None = None
    copies_strided: bool = False
    writeable: bool = True


@dataclass(frozen=True)
class FreshResult(Trait):
    """Every result is a new buffer, never an operand's or another result's (elementwise ops,
    reductions, contractions, fused kernels, gathers)."""


@dataclass(frozen=True)
class Constant(Trait):
    """No operands: its one result is ``attrs["value"]``, read-only and shared between calls."""


@dataclass(frozen=True)
class Random(Trait):
    """Draws counter-based random bits (philox): the same attributes give the same bits.
    ``stream_position``: the attributes that only place the draw in its stream (where two layers'
    dropout masks differ); the op's strategies and costs do not read them, so the planner's ties
    of repeated layers (sharding/problem.py) and the block search's signatures (passes/blocks.py)
    leave them out."""

    stream_position: tuple[str, ...] = ()


@dataclass(frozen=True)
class Collective(Trait):
    """Meets the other devices of ``attrs["group"]``: every device of the group runs it, in the
    same order (an all-reduce, reduce-scatter, all-gather or all-to-all)."""


@dataclass(frozen=True)
class DeviceLocal(Trait):
    """Its result depends on the device's coordinate in the mesh (a local slice of a replicated
    value, zeroing a partial sum on all but one device): it cannot be shared between devices or
    micro-batches."""


@dataclass(frozen=True)
class LinearIn(Trait):
    """The op is (jointly) linear in each set of ``operands``: a partial sum (P) in those
    operands, with the others replicated, gives a partial sum of the result (``P + P``, ``-P``,
    ``P * R``, ``sum(P)``: sum_k f(x_k, y) = f(sum_k x_k, y)). ``of_node``, where the sets depend
    on the node (einsum's operand count, a float-to-float convert), gives them instead.
    ``on_meshes``: it also carries partial sums on meshes of several axes, where each partial
    variant multiplies the strategies (passes/sharding/strategies.py); on one axis every linear
    op does. Micro-batching carries per-micro-batch gradient pieces through these ops."""

    operands: tuple[frozenset[int], ...] = ()
    of_node: Callable[[Any], tuple[frozenset[int], ...]] | None = None
    on_meshes: bool = False

    def operand_sets(self, node: Any) -> tuple[frozenset[int], ...]:
        return self.of_node(node) if self.of_node is not None else self.operands


@dataclass(frozen=True)
class Selects(Trait):
    """Each result element is one of the operand elements at its index, bit for bit (maximum,
    minimum): no arithmetic to round, so a 16-bit float result is computed in its own dtype
    (graphc/ops/precision.py). numpy's float16 loop returns the first of two equal operands
    (maximum(0, -0) is 0), its float32 loop the second, so computing in float32 would change
    the sign of a zero."""


@dataclass(frozen=True)
class Fused(Trait):
    """A region of elementwise ops and row reductions run as one kernel."""


@dataclass(frozen=True)
class ControlFlow(Trait):
    """Runs its regions (cond, loops): replicated by the planner, run as sub-programs."""


@dataclass(frozen=True)
class ShardingConstraint(Trait):
    """The identity, pinning its operand's spec: the plan honours the pin, the op itself vanishes."""


@dataclass(frozen=True)
class FollowsProducer(Trait):
    """Costs little next to a redistribution: when the planner must shrink a large problem, the
    node may take its producer's strategy (passes/sharding/ilp.py)."""


@dataclass(frozen=True)
class IndexedLookup(Trait):
    """Reads (or adds into) operand 0 at the integer index operands that follow it, and then
    ``trailing`` more operands (gather: 0; scatter_add: 1, its updates). Split along an indexed
    dim, each device looks up the rows it owns and masks the rest (passes/lower.py), and index
    operands that are constant position tables (iota) split with the dim they index
    (passes/sharding/strategies.py)."""

    trailing: int = 0

    def index_count(self, n_operands: int) -> int:
        return n_operands - 1 - self.trailing


@dataclass(frozen=True)
class LocalAttrs(Trait):
    """Its attributes name global shapes or data: on a device, the op runs on its pieces with
    ``fn(node, local_in_types, local_out_types, out_specs, mesh_shape, coord) -> attrs`` (a
    reshape's target shape, a slice's stops, a constant's piece, the runs of the stream a philox
    draw holds)."""

    fn: Callable[..., dict]


def stream_position(node: Any) -> tuple[str, ...]:
    """The attributes of ``node`` that only place its random draw in the stream (``Random``): ()
    for every other op."""
    t = node.op.trait(Random)
    return t.stream_position if t is not None else ()
