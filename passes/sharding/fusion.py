"""What fusion keeps out of memory, for the cost model.

graphc fuses every device program after partitioning (passes/fuse.py): a chain of elementwise
ops and last-axis reductions becomes one kernel whose intermediate values stay in registers or
cache. The planner partitions the unfused graph, so without this it would price every
intermediate as a round trip through memory (on a GPU the softmax of attention alone then costs
as much as its matmuls). A value is *fused away* when the node producing it and every node
using it can join one kernel, and it is not a result of the graph: its bytes are neither
written nor read back, and ``full_time`` is given the bytes a node's roofline then saves.

Only profiles that say so (``MachineProfile.fuses_elementwise``: the GPU presets) are priced
this way. The test is by op kind only (elementwise, or a reduction of the last axis), not by
dtype or by the fusion pass's finer rules (shapes of one kernel, levels of row reductions), and
a redistribution the plan puts between two such nodes is priced as a collective without
charging the value's bytes to the nodes again: an estimate of what a GPU compiler fuses.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import repeat

from graphc.core.ir import Graph, Node, Value
from graphc.core.traits import Elementwise
from graphc.passes.fuse import is_row_reduction


def joins_kernel(node: Node) -> bool:
    """Elementwise ops and reductions of the last axis: what passes/fuse.py puts in one kernel."""
    if node.regions:
        return False
    return node.op.has(Elementwise) or is_row_reduction(node)


def fused_values(graph: Graph) -> frozenset[Value]:
    """The values of ``graph`` that fusion keeps out of memory (the module doc)."""
    read: set[Value] = set()  # values some node reads
    kept: set[Value] = set()  # values some node that joins no kernel reads
    joining: list[Node] = []
    for node in graph.nodes:
        read.update(node.inputs)
        if joins_kernel(node):
            joining.append(node)
        else:
            kept.update(node.inputs)
    outputs = set(graph.outputs)
    return frozenset(v for node in joining for v in node.outputs if v in read and v not in kept and v not in outputs)


def saved_bytes(node: Node, fused: frozenset[Value] | Mapping[Value, int]) -> int:
    """The bytes of ``node``'s operands (each use) and results that fusion keeps out of memory;
    ``fused``: the fused values (``fused_values``), or their bytes by value (``fused_bytes``: each
    value's bytes found once, not per use, for a caller asking of every node)."""
    if isinstance(fused, frozenset):  # (first: a Mapping check is an ABC's, slow for every node)
        return sum(v.type.nbytes for v in (*node.inputs, *node.outputs) if v in fused)
    get = fused.get
    return sum(map(get, node.inputs, repeat(0))) + sum(map(get, node.outputs, repeat(0)))


def fused_bytes(fused: frozenset[Value]) -> dict[Value, int]:
    """The bytes of each of the ``fused`` values (``saved_bytes`` reads them)."""
    return {v: v.type.nbytes for v in fused}
