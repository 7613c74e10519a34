"""Dead-code elimination: drop nodes none of whose results is used.

Assumes: a verified graph (any stage). Guarantees: the output verifies and computes the same
outputs; every op is pure, so removing unused nodes never changes results. Runs inside regions.
"""

from __future__ import annotations

from graphc.core.ir import Graph, Node, Value
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish, map_regions


def dce_block(inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
    live: set[Value] = set(outputs)
    needed: list[Node] = []
    for node in reversed(nodes):
        if not live.isdisjoint(node.outputs):  # (one of its results is used)
            needed.append(node)
            live.update(node.inputs)
    rw = Rewriter()
    for node in reversed(needed):
        rw.keep(node, map_regions(node, dce_block) if node.regions else None)
    return finish(rw, nodes, outputs)


def dce(graph: Graph) -> Graph:
    """Remove nodes whose results are unused."""
    return apply_to_graph(graph, dce_block)
