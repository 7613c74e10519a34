"""Constant folding and propagation: a node whose operands are all constants is evaluated at
compile time and becomes one constant (masks and position tables built from constants fold to a
single array).

Assumes: a verified graph. Guarantees: same results bit for bit (the fold runs the op's own
reference implementation); the output verifies. A fold that would make the graph much bigger
(broadcasting a scalar to a large shape) is skipped: the constant stays small and the op stays.
"""

from __future__ import annotations

import numpy as np

from graphc.core.ir import Graph, Node, Value
from graphc.core.traits import Collective, Constant, DeviceLocal
from graphc.ops import precision
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish, map_regions

MAX_GROWTH_BYTES = 1 << 20  # a folded constant may exceed its inputs' total size by at most this


def _constants_of(operands: list[Value]) -> list | None:
    """The values of ``operands`` if every one is a constant, else None (asked no further than the
    first that is not: nearly every node's first operand)."""
    values = []
    for v in operands:
        node = v.producer
        if node is None or not node.op.has(Constant):  # (constant_value, inline: asked of every node)
            return None
        values.append(node.attrs["value"])
    return values


def fold_block(inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
    rw = Rewriter()
    remapped = rw.subst.get
    for node in nodes:
        ins = node.inputs
        operands = list(map(remapped, ins, ins))  # (rw.operands, inline: asked of every node)
        first = operands[0].producer if operands else None
        # (_constants_of asked only when the first operand is a constant: nearly every node's is not)
        values = _constants_of(operands) if first is not None and first.op.has(Constant) else None
        foldable = (
            not node.regions
            and operands
            and values is not None  # first: it rules out nearly every node
            and not node.op.has(Constant)
            and not node.op.has(Collective)  # a collective's value depends on the other devices' operands
            and not node.op.has(DeviceLocal)  # and a device-local op's on the device
            and sum(o.type.nbytes for o in node.outputs) <= sum(v.nbytes for v in values) + MAX_GROWTH_BYTES
        )
        if not foldable or values is None:  # (foldable implies values; said again for the type checker)
            rw.keep(node, map_regions(node, fold_block) if node.regions else None, operands)
            continue
        with np.errstate(all="ignore"):
            try:
                results = precision.evaluate(node, *values)  # bfloat16 and float16 in float32, rounded
            except (ValueError, IndexError, ArithmeticError):  # the error belongs to run time (e.g. a bad index)
                rw.keep(node)
                continue
        # in the result's declared dtype (a 0-d result may come back a numpy scalar)
        outs = [np.array(r, dtype=o.type.dtype, order="C") for r, o in zip(results, node.outputs)]
        rw.replace(node, [rw.constant(r, node) for r in outs])
    return finish(rw, nodes, outputs)


def fold_constants(graph: Graph) -> Graph:
    """Evaluate nodes whose operands are all constants."""
    return apply_to_graph(graph, fold_block)
