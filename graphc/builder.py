"""Build graphs directly, without tracing: for passes that construct graphs and for tests."""

from __future__ import annotations

from typing import Any

from graphc.core.errors import SourceLoc
from graphc.core.ir import Graph, Node, TensorType, Value
from graphc.core.pytree import LEAF, TreeDef
from graphc.ops import get_op


class GraphBuilder:
    """``b.input(type, name)`` adds a graph input, ``b.op(name, *values, **attrs)`` a node (checked
    by the op's rule), ``b.build(outputs)`` returns the Graph taking the inputs positionally and
    returning the outputs as a tuple."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []

    def input(self, type_: TensorType, name: str | None = None) -> Value:
        v = Value(type_, None, 0, name or f"arg{len(self.inputs)}")
        self.inputs.append(v)
        return v

    def op(self, opname: str, *inputs: Value, loc: SourceLoc | None = None, **attrs: Any) -> Any:
        op = get_op(opname)
        types = op.infer_types(tuple(v.type for v in inputs), attrs)
        node = Node(op, inputs, attrs, types, loc)
        self.nodes.append(node)
        return node.outputs[0] if len(node.outputs) == 1 else node.outputs

    def build(self, outputs: list[Value]) -> Graph:
        in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF,) * len(self.inputs)), TreeDef("dict")))
        out_tree = TreeDef("tuple", (LEAF,) * len(outputs))
        return Graph(self.name, list(self.inputs), list(self.nodes), list(outputs), in_tree, out_tree)
