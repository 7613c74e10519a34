"""Common-subexpression elimination: a node equal to an earlier one (same op, same operands,
equal attributes) is replaced by it; equal constants become one constant.

A node tagged ``part="recompute"`` (passes/lower.py) is never replaced by an earlier equal one:
it is there so that the earlier one can be freed.

Assumes: a verified graph. Guarantees: same results (ops are pure and deterministic); the output
verifies. Control-flow nodes are not merged with each other (their regions are compared by
identity), but CSE runs inside their regions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core.ir import Graph, Node, Value
from graphc.core.literals import is_int_tuple
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish, map_regions


def attr_key(v: Any) -> Any:
    """A hashable key for an attribute value (arrays by dtype, shape and bytes)."""
    if is_int_tuple(v):  # a shape, axes, a permutation: itself
        return ("tuple of ints", v)  # (no type's name has spaces: no other value's key is equal)
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, tuple):
        return tuple(attr_key(x) for x in v)
    if isinstance(v, float):  # by bits: 0.0 and -0.0 differ, nan equals itself
        return ("float", v.hex())
    return (type(v).__name__, v)


def node_key(op_name: str, inputs: tuple[Value, ...], attrs: dict[str, Any]) -> tuple:
    """Equal for nodes that compute the same thing: op, operands (Values are equal only to
    themselves, and the key keeps them alive), attributes."""
    if not attrs:  # (most nodes)
        return (op_name, inputs, ())
    return (op_name, inputs, tuple(sorted([(k, attr_key(v)) for k, v in attrs.items()])))


def cse_block(inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
    rw = Rewriter()
    seen: dict[tuple, Node] = {}
    remapped = rw.subst.get
    for node in nodes:
        if node.regions:
            rw.keep(node, map_regions(node, cse_block))
            continue
        ins = node.inputs
        operands = tuple(map(remapped, ins, ins))  # (rw.operands, inline: asked of every node)
        attrs = node.attrs
        key = node_key(node.op.name, operands, attrs) if attrs else (node.op.name, operands, ())  # (node_key, inline)
        earlier = seen.get(key)
        if earlier is not None and node.part != "recompute":  # a recomputed copy is meant to be one
            rw.replace(node, list(earlier.outputs))
            continue
        seen[key] = rw.keep(node, None, operands)
    return finish(rw, nodes, outputs)


def cse(graph: Graph) -> Graph:
    """Merge nodes that compute the same thing."""
    return apply_to_graph(graph, cse_block)
