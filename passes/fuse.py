"""Elementwise fusion: maximal clusters of elementwise ops, together with reductions over the last
axis and their elementwise prologue and epilogue (softmax, layer norm, GELU), become one
``fused`` node whose region holds the original ops. The runtime compiles each fused node into one
Numba kernel that makes one or a few passes over each row instead of one numpy call per op.

A cluster has an iteration space S = (..., n). Its ops are either *elementwise* on S, *row*
ops on S[:-1] (+ (1,)) (per-row scalars such as a mean or a variance), or last-axis reductions
from S to a row. Operands from outside the cluster may broadcast. A node joins a cluster only if
all its operands from outside the cluster were computed before the cluster's first node, so a
cluster never depends on itself through outside nodes; the fused node takes the place of the
cluster's first node.

Assumes: a verified graph (best after simplify/cse/dce). Guarantees: same results (the region is
the original ops); the output verifies. Runs inside control-flow regions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphc.core.dtypes import BFLOAT16
from graphc.core.ir import Graph, Node, Region, Value
from graphc.core.traits import Constant, Elementwise, Fused, Reduction
from graphc.ops import elementwise
from graphc.ops.precision import fuses_in_bfloat16
from graphc.passes.dce import dce_block
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish, map_regions


@dataclass(eq=False)
class Cluster:
    space: tuple[int, ...]
    part: str | None
    first: int
    nodes: list[int] = field(default_factory=list)
    values: dict[Value, str] = field(default_factory=dict)  # value -> "elem" | "row"
    low: bool = False  # holds bfloat16 values: elementwise ops only (runtime/lowkernel.py)
    rows: bool = False  # holds a reduction or a per-row value

    def admits(self, kind: NodeKind, level: str) -> bool:
        """Whether a node of ``kind`` may join at ``level``: a kernel on bfloat16 values is one
        elementwise loop, so a cluster holds bfloat16 values or reductions and per-row values,
        never both."""
        if not (self.low or kind.low):
            return True
        return level == "elem" and not self.rows and not kind.row_reduction

    def add(self, i: int, node: Node, level: str, kind: NodeKind) -> None:
        self.nodes.append(i)
        self.low = self.low or kind.low
        self.rows = self.rows or level != "elem"
        for o in node.outputs:
            self.values[o] = level

    @property
    def row_shapes(self) -> tuple[tuple[int, ...], ...]:
        return (self.space[:-1] + (1,), self.space[:-1]) if self.space else ()


def is_row_reduction(node: Node) -> bool:
    """A sum, max or min over the last axis only: a kernel computes it along its rows."""
    if not node.op.has(Reduction):  # (remembered per op: most nodes are not reductions)
        return False
    reduction = node.op.trait(Reduction)
    x = node.inputs[0] if node.inputs else None
    return (
        reduction is not None
        and reduction.row_reducible
        and x is not None
        and x.ndim >= 1
        and node.attrs["axes"] == (x.ndim - 1,)
    )


_FLOAT16 = np.dtype(np.float16)


def touches_bfloat16(node: Node) -> bool:
    return any([v.type.dtype == BFLOAT16 for v in (*node.inputs, *node.outputs)])


def fusable(node: Node) -> bool:
    if node.regions:
        return False
    types = [v.type for v in (*node.inputs, *node.outputs)]
    if any([0 in t.shape for t in types]):
        return False  # empty arrays need no kernel
    dts = {t.dtype for t in types}  # (canonical dtypes: float16 is the only 2-byte one of kind "f")
    if BFLOAT16 in dts:  # the ops a kernel computes with the op-by-op path's bits (ops/precision.py)
        return node.op.has(Elementwise) and fuses_in_bfloat16(node)
    if _FLOAT16 in dts:
        return False  # Numba has no float16 arithmetic
    if node.op is elementwise.pow_ and node.outputs[0].dtype.kind in "iu":
        return False  # numpy raises for negative integer exponents; a kernel would not
    if node.op.has(Elementwise):
        return all(o.dtype.kind in "biuf" for o in node.outputs)
    return is_row_reduction(node)


def _level(cluster: Cluster, node: Node, row_reduction: bool) -> str | None:
    """The level the node would have in the cluster, or None if it does not fit.

    A per-row value of shape S[:-1] + (1,) broadcasts over a row as numpy does; one of shape
    S[:-1] (a reduction without keepdims) would line up with the trailing axes instead, so an
    elementwise op may not use it. A row op's operands from outside must be row-shaped or scalars.
    """
    out = node.outputs[0]
    if row_reduction:  # (is_row_reduction(node))
        x = node.inputs[0]
        return (
            "row" if cluster.values.get(x) == "elem" or (x not in cluster.values and x.shape == cluster.space) else None
        )
    if out.shape == cluster.space:
        keep_row = cluster.space[:-1] + (1,)
        levels = cluster.values
        for v in node.inputs:  # (nearly every node: no per-row operand)
            if levels.get(v) == "row" and v.shape != keep_row and v.type.size != 1:
                return None
        return "elem"
    if out.shape in cluster.row_shapes and all(cluster.values.get(v, "row") == "row" for v in node.inputs):
        outside = [v for v in node.inputs if v not in cluster.values]
        if all(v.shape == out.shape or v.type.size == 1 for v in outside):
            return "row"
    return None


def _producer_index(v: Value, index: dict[int, int]) -> int:
    """The position of ``v``'s producer in the nodes clustered; -1 for a graph input or a node
    before them (``find_clusters`` of a tail of a block: earlier than every cluster there)."""
    return -1 if v.producer is None else index.get(id(v.producer), -1)


@dataclass(frozen=True)
class NodeKind:
    """What clustering reads of a node: the same for the nodes of one kind (op, operand and
    result types, reduced axes), as ``fusable``, ``touches_bfloat16`` and ``is_row_reduction``
    answer them."""

    fusable: bool
    low: bool  # touches bfloat16 values
    row_reduction: bool


_IN_REGIONS = NodeKind(fusable=False, low=False, row_reduction=False)  # a node with regions: never fused


def node_kind(node: Node) -> NodeKind:
    if node.regions:
        return _IN_REGIONS
    return NodeKind(fusable(node), touches_bfloat16(node), is_row_reduction(node))


def _kinds_remembered() -> Callable[[Node], NodeKind]:
    """``node_kind``, remembered per (op, operand types, result types, reduced axes): all it reads
    of a node without regions (the nodes of repeated layers ask the same few hundred times)."""
    memo: dict[tuple, NodeKind] = {}

    def kind_of(node: Node) -> NodeKind:
        if node.regions:
            return _IN_REGIONS
        key = (
            node.op,
            tuple([v.type for v in node.inputs]),
            tuple([o.type for o in node.outputs]),
            node.attrs.get("axes"),
        )
        try:
            got = memo.get(key)
        except TypeError:  # an unhashable attribute
            return node_kind(node)
        if got is None:
            got = memo[key] = node_kind(node)
        return got

    return kind_of


def find_clusters(nodes: list[Node]) -> list[Cluster]:
    index = {id(n): i for i, n in enumerate(nodes)}
    owner: dict[Value, Cluster] = {}
    clusters: list[Cluster] = []
    recent: Cluster | None = None
    kind_of = _kinds_remembered()
    for i, node in enumerate(nodes):
        kind = kind_of(node)
        if not kind.fusable:
            recent = None  # a cluster is only extended by the run of fusable ops that builds it
            continue
        joined = None
        for v in node.inputs:
            c = owner.get(v)
            if c is None or c.part != node.part:
                continue
            level = _level(c, node, kind.row_reduction)
            if level is not None and c.admits(kind, level) and _before(node.inputs, c, index):
                joined = (c, level)
                break
        if joined is None and recent is not None and recent.part == node.part:
            # operands all from outside any cluster (0.5 * x in GELU, evaluated before the rest):
            # join the cluster being built if it has this space and the operands predate it
            level = _level(recent, node, kind.row_reduction)
            if (
                level == "elem"
                and recent.admits(kind, level)
                and all(_producer_index(u, index) < recent.first for u in node.inputs)
            ):
                joined = (recent, level)
        if joined is None:
            space = node.inputs[0].shape if kind.row_reduction else node.outputs[0].shape
            c = Cluster(space, node.part, i)
            clusters.append(c)
            level = _level(c, node, kind.row_reduction) or "elem"
            joined = (c, level)
        c, level = joined
        recent = c
        c.add(i, node, level, kind)
        for o in node.outputs:
            owner[o] = c
    return [c for c in clusters if len(c.nodes) >= 2]


def _before(inputs: tuple[Value, ...], c: Cluster, index: dict[int, int]) -> bool:
    """Whether the operands of ``inputs`` from outside ``c`` were all computed before its first node."""
    inside, first = c.values, c.first
    for u in inputs:
        if u not in inside and u.producer is not None and index.get(id(u.producer), -1) >= first:
            return False  # (_producer_index(u, index) < first, inline)
    return True


def _is_scalar_constant(v: Value) -> bool:
    p = v.producer
    return p is not None and p.op.has(Constant) and p.attrs["value"].size == 1


def fuse_block(inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
    # dead nodes first: clusters are runs of fusable ops, and a dead op between two live ones would
    # split a cluster that a second run (after the first one's DCE) would form (not idempotent)
    nodes, outputs = dce_block(inputs, nodes, outputs)
    original = nodes
    # constants have no operands: hoisting them first keeps the order valid and lets clusters use
    # constants that the trace happened to create late (the eps of a layer norm, a mask)
    nodes = [n for n in nodes if n.op.has(Constant)] + [n for n in nodes if not n.op.has(Constant)]
    clusters = find_clusters(nodes)
    if not clusters:
        rw = Rewriter()
        for node in original:
            rw.keep(node, _fuse_inside(node))
        return finish(rw, original, outputs)
    member = {i: c for c in clusters for i in c.nodes}
    users: dict[Value, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if member.get(i) is None or v not in member[i].values:
                users[v] = users.get(v, 0) + 1
    live_out = set(outputs)
    rw = Rewriter()
    for i, node in enumerate(nodes):
        c = member.get(i)
        if c is None:
            rw.keep(node, _fuse_inside(node))
        elif i == c.first:
            _emit_fused(rw, c, nodes, users, live_out)
    new_nodes, new_outputs = finish(rw, original, outputs)
    return dce_block(inputs, new_nodes, new_outputs)  # scalar constants copied into kernels are dead outside


def _fuse_inside(node: Node):
    """Fuse inside control-flow regions; a fused node's region is already one kernel."""
    return node.regions if node.op.has(Fused) else map_regions(node, fuse_block)


def _emit_fused(rw: Rewriter, c: Cluster, nodes: list[Node], users: dict[Value, int], live_out: set[Value]) -> None:
    region_inputs: list[Value] = []
    operands: list[Value] = []
    local: dict[Value, Value] = {}
    body: list[Node] = []

    def inside(v: Value) -> Value:
        if v in local:
            return local[v]
        if _is_scalar_constant(v):  # scalar constants become literals of the kernel
            const = v.producer
            assert const is not None
            copy = Node(const.op, [], const.attrs, [v.type], const.loc, const.part)
            body.append(copy)
            local[v] = copy.outputs[0]
            return local[v]
        arg = Value(v.type)
        region_inputs.append(arg)
        operands.append(rw.get(v))
        local[v] = arg
        return arg

    for i in c.nodes:
        node = nodes[i]
        ins = [inside(v) for v in node.inputs]
        copy = Node(node.op, ins, node.attrs, [o.type for o in node.outputs], node.loc, node.part)
        body.append(copy)
        local.update(zip(node.outputs, copy.outputs))
    results = [v for i in c.nodes for v in nodes[i].outputs if users.get(v) or v in live_out]
    region = Region(region_inputs, body, [local[v] for v in results])
    first = nodes[c.first]
    fused = rw.emit("fused", operands, {}, first, (region,))
    for v, out in zip(results, fused.outputs):
        rw.subst[v] = out


def fuse(graph: Graph) -> Graph:
    """Group elementwise ops and last-axis reductions into fused nodes."""
    return apply_to_graph(graph, fuse_block)
