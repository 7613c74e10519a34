"""The verifier rejects broken graphs with an error that names the node."""

import numpy as np
import pytest

import graphc
from graphc.builder import GraphBuilder
from graphc.core.errors import SourceLoc
from graphc.core.ir import TensorType
from graphc.core.pytree import LEAF, TreeDef

F32_23 = TensorType((2, 3), np.float32)


def small_graph():
    b = GraphBuilder("g")
    x = b.input(F32_23, "x")
    y = b.op("exp", x, loc=SourceLoc("model.py", 7))
    z = b.op("add", x, y, loc=SourceLoc("model.py", 8))
    s = b.op("reduce_sum", z, axes=(1,), keepdims=False, loc=SourceLoc("model.py", 9))
    return b.build([s])


def test_valid_graph_verifies():
    g = small_graph()
    assert g.verify() is g


def test_use_before_definition_names_the_node():
    g = small_graph()
    g.nodes[0], g.nodes[1] = g.nodes[1], g.nodes[0]
    with pytest.raises(
        graphc.VerifyError, match=r"node %0 = add\(\.\.\.\) at model.py:8: operand 1 \(%1\) is defined later"
    ):
        g.verify()


def test_operand_from_another_graph():
    g = small_graph()
    other = small_graph()
    g.nodes[1].inputs = (g.inputs[0], other.nodes[0].output)
    with pytest.raises(graphc.VerifyError, match=r"%1 = add.*operand 1 .* is not defined in this graph"):
        g.verify()


def test_declared_type_disagrees_with_rule():
    g = small_graph()
    g.nodes[2].outputs[0].type = TensorType((3,), np.float32)
    with pytest.raises(
        graphc.VerifyError,
        match=r"%2 = reduce_sum\(\.\.\.\) at model.py:9: declared result types f32\[3\] but the op's rule gives f32\[2\]",
    ):
        g.verify()


def test_invalid_attribute():
    g = small_graph()
    g.nodes[2].attrs = {"axes": (4,), "keepdims": False}
    with pytest.raises(graphc.VerifyError, match=r"%2 = reduce_sum.*axis 4 is out of range for a 2-d operand"):
        g.verify()


def test_missing_and_unknown_attributes():
    g = small_graph()
    g.nodes[2].attrs = {"axis": 1}
    with pytest.raises(
        graphc.VerifyError,
        match=r"reduce_sum expects attributes \(axes, keepdims\); missing axes, keepdims; unknown axis",
    ):
        g.verify()


def test_wrong_operand_dtype():
    g = small_graph()
    b = GraphBuilder("h")
    i = b.input(TensorType((2, 3), np.int64), "i")
    g.inputs.append(i)
    g.in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF, LEAF)), TreeDef("dict")))
    g.nodes[1].inputs = (g.inputs[0], i)
    with pytest.raises(graphc.VerifyError, match=r"%1 = add.*add needs operands of one dtype"):
        g.verify()


def test_undefined_output():
    g = small_graph()
    g.outputs = [small_graph().nodes[0].output]
    with pytest.raises(graphc.VerifyError, match="output 0 is not defined in this graph"):
        g.verify()


def test_node_listed_twice():
    g = small_graph()
    g.nodes.append(g.nodes[0])
    with pytest.raises(graphc.VerifyError, match=r"%0 = exp.* appears twice"):
        g.verify()


def test_signature_mismatch():
    g = small_graph()
    g.in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF, LEAF)), TreeDef("dict")))
    with pytest.raises(graphc.VerifyError, match="signature has 2 array leaves but the graph has 1 inputs"):
        g.verify()


def test_verify_accepts_every_traced_model():
    from graphc.models import cnn, gpt, mlp

    for f, ex in [
        (mlp.loss, mlp.example_loss_args),
        (gpt.lm_loss, gpt.example_loss_args),
        (cnn.loss, cnn.example_loss_args),
    ]:
        args, kwargs = ex()
        graphc.trace(f, *args, **kwargs).verify()


def test_networkx_view_is_acyclic():
    import networkx as nx

    from graphc.models import gpt

    args, kwargs = gpt.example_args()
    g = graphc.trace(gpt.gpt, *args, **kwargs).to_networkx()
    assert nx.is_directed_acyclic_graph(g)
