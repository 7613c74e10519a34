"""Shared machinery for passes: rebuild a block (a graph body or a region) node by node.

A pass never mutates the graph it is given. It walks a block in order with a ``Rewriter``,
which remaps each node's operands through the substitutions made so far; the pass then keeps the
node (``keep``), replaces its results by existing values (``replace``), or emits new nodes
(``emit``). Nodes whose operands did not change are reused as they are (nodes are immutable by
convention), so an unchanged graph costs little to rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from graphc.core.ir import Graph, Node, Region, TensorType, Value
from graphc.core.traits import Constant
from graphc.ops import get_op


class Rewriter:
    def __init__(self):
        self.subst: dict[Value, Value] = {}
        self.nodes: list[Node] = []

    def get(self, v: Value) -> Value:
        return self.subst.get(v, v)

    def operands(self, node: Node) -> list[Value]:
        inputs = node.inputs
        return list(map(self.subst.get, inputs, inputs))

    def keep(
        self, node: Node, regions: tuple[Region, ...] | None = None, operands: Sequence[Value] | None = None
    ) -> Node:
        """Add ``node`` with its operands remapped (and, if given, new regions); ``operands``: what
        ``operands(node)`` returned, if the pass asked since the last substitution."""
        inputs = node.inputs
        subst = self.subst
        if not subst and operands is None and (regions is None or regions is node.regions):
            self.nodes.append(node)  # nothing substituted yet: the node as it is
            return node
        # ``operands``, inline and in C: every pass keeps nearly every node
        ins = tuple(map(subst.get, inputs, inputs)) if operands is None else tuple(operands)
        if ins == inputs and (regions is None or regions is node.regions):  # (Values compare by identity)
            self.nodes.append(node)
            return node
        new = node.with_operands(ins, regions)
        outs = node.outputs
        if len(outs) == 1:
            subst[outs[0]] = new.outputs[0]
        else:
            subst.update(zip(outs, new.outputs))
        self.nodes.append(new)
        return new

    def replace(self, node: Node, values: list[Value]) -> None:
        """Drop ``node``: its results are these (already defined) values."""
        for old, v in zip(node.outputs, values):
            if old.type != v.type:
                raise AssertionError(f"rewrite of {node.op.name} changes {old.type} to {v.type}")
            self.subst[old] = v

    def emit(
        self, opname: str, inputs: list[Value], attrs: dict[str, Any], like: Node, regions: tuple[Region, ...] = ()
    ) -> Node:
        """A new node (checked by its op's rule), with ``like``'s source location and part."""
        op = get_op(opname)
        types = op.infer_types(tuple(v.type for v in inputs), attrs, regions)
        node = Node(op, inputs, attrs, types, like.loc, like.part, regions)
        self.nodes.append(node)
        return node

    def constant(self, value, like: Node) -> Value:
        return self.emit("constant", [], {"value": value}, like).outputs[0]


BlockPass = Callable[[list[Value], list[Node], list[Value]], tuple[list[Node], list[Value]]]


def map_regions(node: Node, block_pass: BlockPass) -> tuple[Region, ...]:
    """Run a block pass inside each region of ``node`` (regions keep their inputs)."""
    if not node.regions:
        return node.regions
    out = []
    changed = False
    for r in node.regions:
        nodes, outputs = block_pass(r.inputs, r.nodes, r.outputs)
        if nodes is r.nodes and all(a is b for a, b in zip(outputs, r.outputs)):
            out.append(r)
        else:
            changed = True
            out.append(Region(r.inputs, nodes, outputs))
    return tuple(out) if changed else node.regions


def apply_to_graph(graph: Graph, block_pass: BlockPass) -> Graph:
    """A Graph -> Graph pass from a block pass; returns ``graph`` itself if nothing changed."""
    nodes, outputs = block_pass(graph.inputs, graph.nodes, graph.outputs)
    if nodes is graph.nodes and all(a is b for a, b in zip(outputs, graph.outputs)):
        return graph
    return Graph(graph.name, graph.inputs, nodes, outputs, graph.in_tree, graph.out_tree)


def finish(rw: Rewriter, nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
    """The rewritten block, or the original lists if the rewrite reproduced them exactly."""
    new_outputs = [rw.get(v) for v in outputs]
    if (
        len(rw.nodes) == len(nodes)
        and all(a is b for a, b in zip(rw.nodes, nodes))
        and all(a is b for a, b in zip(new_outputs, outputs))
    ):
        return nodes, outputs
    return rw.nodes, new_outputs


def scalar_constant(v: Value) -> Any:
    """The Python value of a constant with one element, else None."""
    node = v.producer
    if node is None or not node.op.has(Constant) or node.attrs["value"].size != 1:
        return None
    return node.attrs["value"].reshape(()).item()


def constant_value(v: Value):
    node = v.producer
    return node.attrs["value"] if node is not None and node.op.has(Constant) else None


__all__ = ["Rewriter", "map_regions", "apply_to_graph", "finish", "scalar_constant", "constant_value", "TensorType"]
