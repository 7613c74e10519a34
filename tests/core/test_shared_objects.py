"""Objects the IR shares instead of making one per node (issue 29, 1,000 layers: fewer objects
for the cycle collector to walk, comparisons that hit identity): result types, the result types of
an op without attributes per operand types, split placements, and source locations. Sharing must
not change what is equal, and an error must still be raised each time."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from graphc.core.errors import ShapeError
from graphc.core.ir import Node, TensorType
from graphc.core.spec import S, parse_spec
from graphc.frontend.entry import trace
from graphc.interpreter import evaluate as graphc_eval
from graphc.ops import get_op

F32 = np.dtype(np.float32)


def test_equal_result_types_are_one_object():
    const = get_op("constant")
    a = Node(const, [], {"value": np.zeros((2, 3), np.float32)}, [TensorType((2, 3), F32)])
    b = Node(const, [], {"value": np.ones((2, 3), np.float32)}, [TensorType((2, 3), F32)])
    c = Node(const, [], {"value": np.ones((3, 2), np.float32)}, [TensorType((3, 2), F32)])
    assert a.outputs[0].type is b.outputs[0].type
    assert c.outputs[0].type != a.outputs[0].type
    # a type sent to another process hashes there as an equal type does
    back = pickle.loads(pickle.dumps(a.outputs[0].type))
    assert back == a.outputs[0].type and hash(back) == hash(a.outputs[0].type)


def test_attribute_free_ops_infer_once_per_operand_types():
    add = get_op("add")
    x, y = TensorType((4, 1), F32), TensorType((1, 5), F32)
    first = add.infer_types((x, y), {})
    assert first == (TensorType((4, 5), F32),)
    assert add.infer_types((TensorType((4, 1), F32), TensorType((1, 5), F32)), {}) is first
    assert add.infer_types((y, x), {}) == (TensorType((4, 5), F32),)
    for _ in range(2):  # a bad pair is refused every time, never remembered
        with pytest.raises(ShapeError, match="could not be broadcast"):
            add.infer_types((TensorType((3,), F32), TensorType((4,), F32)), {})
    with pytest.raises(ShapeError, match="takes 2 operand"):
        add.infer_types((x,), {})
    with pytest.raises(ShapeError, match="unknown"):
        add.infer_types((x, y), {"axis": 0})


def test_ops_with_plain_attributes_infer_once_per_types_and_values(monkeypatch):
    # the table is keyed by each attribute's type too: 1 and True, (1,) and (True,) are told apart
    # (a rule may treat them differently); an unhashable attribute (a list) is not remembered, nor
    # is a failure; equal values of the same types share the result
    seen = []

    def infer(in_types, axes):
        seen.append(axes)
        if axes == (5,):
            raise ShapeError("axis 5 is out of range")
        return (TensorType((len(str(axes)),), F32),)

    op = get_op("reduce_sum")
    monkeypatch.setattr(op, "infer", infer)
    monkeypatch.setattr(op, "attrs", ("axes",))
    x = (TensorType((2, 3), F32),)
    first = op.infer_types(x, {"axes": (1,)})
    assert op.infer_types(x, {"axes": (1,)}) is first and len(seen) == 1
    assert op.infer_types(x, {"axes": (True,)}) == (TensorType((7,), F32),) and len(seen) == 2
    assert op.infer_types(x, {"axes": 1}) == (TensorType((1,), F32),)
    assert op.infer_types(x, {"axes": True}) == (TensorType((4,), F32),) and len(seen) == 4
    assert op.infer_types(x, {"axes": [1]}) == (TensorType((3,), F32),)
    op.infer_types(x, {"axes": [1]})
    assert len(seen) == 6  # a list each time
    for _ in range(2):
        with pytest.raises(ShapeError, match="out of range"):
            op.infer_types(x, {"axes": (5,)})
    assert len(seen) == 8


def test_cse_attribute_keys_tell_types_apart():
    from graphc.passes.cse import attr_key

    keys = [attr_key(v) for v in [(1, 2), (True, 2), (1.0, 2), (), 0, "tuple of ints", ((0, 1), (2, 3)), ((0, 1),)]]
    assert len(set(keys)) == len(keys)
    assert attr_key((1, 2)) == attr_key((1, 2)) and attr_key(((0, 1), (2, 3))) == attr_key(((0, 1), (2, 3)))


def test_ops_by_name_are_the_registered_ones():
    from graphc.ops import OPS, REGISTRY

    for _ in range(2):  # (the second time: kept as an attribute)
        assert OPS.abs_ is REGISTRY["abs"] and OPS.transpose is REGISTRY["transpose"]
        with pytest.raises(AttributeError, match="no op named 'no_such_op'"):
            _ = OPS.no_such_op


def test_a_replaced_infer_rule_is_used(monkeypatch):
    neg = get_op("neg")
    x = TensorType((2,), F32)
    assert neg.infer_types((x,), {}) == (x,)
    monkeypatch.setattr(neg, "infer", lambda in_types: (TensorType((7,), F32),))
    assert neg.infer_types((x,), {}) == (TensorType((7,), F32),)


def test_split_placements_are_one_object():
    assert S(0) is S(0) and S(1, 3) is S(np.int64(1), 3)
    assert S(0) != S(1) and S(0, 2) != S(0)
    assert parse_spec("S(0), R") == (S(0), parse_spec("R")[0])
    assert parse_spec("S(0), R")[0] is S(0)
    back = pickle.loads(pickle.dumps(S(1, 3)))  # its hash is made again in another process
    assert back == S(1, 3) and hash(back) == hash(S(1, 3)) and "_hash" not in pickle.loads(pickle.dumps(S(2))).__dict__


def test_nodes_of_one_line_share_its_location():
    def f(x):
        y = x * 2.0
        return y + y * y

    g = trace(f, np.ones(3, np.float32))
    by_line: dict[int, set[int]] = {}
    for node in g.nodes:
        if node.loc is not None:
            by_line.setdefault(node.loc.line, set()).add(id(node.loc))
    assert len(by_line) == 2 and all(len(ids) == 1 for ids in by_line.values())
    assert all(node.loc.file.endswith("test_shared_objects.py") for node in g.nodes if node.loc is not None)


def test_python_numbers_share_a_constant_by_their_bits():
    # equal numbers lifted again are one constant node; 0.0 and -0.0 are not equal bits, and a
    # number written as an int or a float is the same float32 constant (numpy converts it)
    def f(x):
        return x * 0.5 + x * 0.5 + x * 0.0 + x * -0.0 + x * 2 + x * 2.0 + x * float("nan") + x * float("nan")

    g = trace(f, np.ones(3, np.float32))
    consts = [n.attrs["value"] for n in g.nodes if n.op.name == "constant"]
    assert len(consts) == 5 and all(c.dtype == np.float32 and c.shape == () for c in consts)
    assert sorted(str(c) for c in consts) == ["-0.0", "0.0", "0.5", "2.0", "nan"]
    assert [bool(np.signbit(c)) for c in consts if c == 0] == [False, True]
    assert np.isnan(graphc_eval(g, np.full(3, 2.0, np.float32))).all()


def test_shared_tables_are_bounded(monkeypatch):
    # a long-running process that traces many shapes keeps at most INTERN_LIMIT of each table,
    # and what a table handed out before it started afresh stays valid and equal
    from graphc.core import ir
    from graphc.frontend import locations

    monkeypatch.setattr(ir, "INTERN_LIMIT", 8)
    monkeypatch.setattr(ir, "_TYPES", {})
    monkeypatch.setattr(locations, "_LOCS", {})
    add = get_op("add")
    monkeypatch.setattr(add, "_inferred", (add.infer, {}), raising=False)
    first = trace(lambda x: x + 1.0, np.ones(1, np.float32))
    for n in range(2, 40):
        g = trace(lambda x: x + 1.0, np.ones(n, np.float32))
        assert g.outputs[0].type == TensorType((n,), F32)
        assert add.infer_types((TensorType((n,), F32), TensorType((), F32)), {}) == (TensorType((n,), F32),)
    assert len(ir._TYPES) <= 8 and len(add._inferred[1]) <= 8 and len(locations._LOCS) <= 8
    assert first.outputs[0].type == TensorType((1,), F32)
    again = Node(get_op("constant"), [], {"value": np.ones(1, np.float32)}, [TensorType((1,), F32)])
    assert again.outputs[0].type == first.outputs[0].type
