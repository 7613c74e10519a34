"""Text IR: round trips, bit-exact constants, golden files, and parse errors with line:column."""

import importlib
from pathlib import Path

import numpy as np
import pytest

import graphc
from graphc.builder import GraphBuilder
from graphc.core.ir import TensorType

GOLDEN = Path(__file__).parents[1] / "golden"


def test_golden_file_parses_and_prints_identically():
    text = (GOLDEN / "softmax_mlp.gir").read_text()
    graph = graphc.parse(text)
    assert str(graph) == text


def test_golden_file_evaluates_like_numpy():
    graph = graphc.parse((GOLDEN / "softmax_mlp.gir").read_text())
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    x = rng.standard_normal((2, 4)).astype(np.float32)
    out = graphc.evaluate(graph, params, x, temperature=2.0)
    z = (x @ params["w"] + params["b"]) / np.float32(2.0)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    probs = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out["probs"], probs, rtol=1e-6)
    np.testing.assert_array_equal(out["label"], probs.argmax(axis=1))
    np.testing.assert_array_equal(out["classes"], [0, 1, 2])
    assert out["version"] == "v1"
    with pytest.raises(graphc.EvaluationError, match="static value 2.0, got 3.0"):
        graphc.evaluate(graph, params, x, temperature=3.0)


@pytest.mark.parametrize(
    "module, func, example",
    [
        ("graphc.models.mlp", "mlp", "example_args"),
        ("graphc.models.mlp", "loss", "example_loss_args"),
        ("graphc.models.gpt", "gpt", "example_args"),
        ("graphc.models.gpt", "lm_loss", "example_loss_args"),
        ("graphc.models.cnn", "cnn", "example_args"),
        ("graphc.models.cnn", "loss", "example_loss_args"),
    ],
)
def test_model_round_trip_is_identity_and_reruns(module, func, example):
    mod = importlib.import_module(module)
    args, kwargs = getattr(mod, example)()
    graph = graphc.trace(getattr(mod, func), *args, **kwargs)
    text = str(graph)
    parsed = graphc.parse(text)
    assert str(parsed) == text
    np.testing.assert_array_equal(graphc.evaluate(parsed, *args, **kwargs), graphc.evaluate(graph, *args, **kwargs))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int64", "uint16", "bool"])
@pytest.mark.parametrize("size", [1, 5, 17, 1000])
def test_constants_round_trip_bit_exactly(dtype, size):
    rng = np.random.default_rng(size)
    if dtype == "bool":
        value = rng.random(size) < 0.5
    elif np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        value = rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
    else:
        value = (rng.standard_normal(size) * 10.0 ** rng.integers(-30, 30, size)).astype(dtype)
        value[0] = -0.0
        if size > 2:
            value[1] = np.nan
            value[2] = np.finfo(dtype).tiny / 4  # subnormal
    b = GraphBuilder("consts")
    c = b.op("constant", value=value.reshape(size))
    graph = b.build([c])
    text = str(graph)
    back = graphc.parse(text)
    assert str(back) == text
    (got,) = graphc.evaluate(back)
    assert got.dtype == value.dtype
    assert got.tobytes() == value.tobytes()


def test_small_constants_are_readable():
    b = GraphBuilder("g")
    b.op("constant", value=np.array([[1.5, -2.0], [0.1, 3e20]], dtype=np.float32))
    c = b.op("constant", value=np.array([True, False]))
    text = str(b.build([c]))
    assert "array<f32[2,2]>[[1.5, -2.0], [0.1, 3e+20]]" in text
    assert "array<bool[2]>[true, false]" in text


def test_static_values_and_nesting_in_signature_round_trip():
    def f(params, x, *, mode, scale, eps, flags):
        return {"y": x * params["a"][0], "t": (x, 1), "m": mode}

    params = {"a": [np.ones(3)], "empty": [], "none": None, 'we"ird key': (1, 2.5, "s")}
    g = graphc.trace(f, params, np.zeros(3), mode="train", scale=-1.5e-300, eps=float("inf"), flags=(True, None))
    text = str(g)
    assert str(graphc.parse(text)) == text
    assert 'mode="train"' in text and "eps=inf" in text


PARSE_ERRORS = [
    # (text, line, column, words the message must contain)
    ("graph @g() {\n  return (\n}", 3, 1, ["unexpected", "expected"]),
    ("graph @g(%x : f32[2]) {\n  %0 = frobnicate(%x) : f32[2]\n  return %0\n}", 2, 8, ["unknown op 'frobnicate'"]),
    (
        "graph @g(%x : f32[2]) {\n  %0 = add(%x, %y) : f32[2]\n  return %0\n}",
        2,
        16,
        ["%y is used before it is defined"],
    ),
    ("graph @g(%x : f33[2]) {\n  return %x\n}", 1, 15, ["unknown dtype 'f33'"]),
    ("graph @g(%x : f32[2]) {\n  %0 = add(%x, %x) : f32[3]\n  return %0\n}", 2, 8, ["add gives f32[2]", "f32[3]"]),
    (
        "graph @g(%x : f32[2,3]) {\n  %0 = reduce_sum(%x, axes=(5,), keepdims=false) : f32[2]\n  return %0\n}",
        2,
        8,
        ["axis 5 is out of range"],
    ),
    (
        "graph @g(%x : f32[2]) {\n  %0 = add(%x, %x) : f32[2]\n  %0 = add(%x, %x) : f32[2]\n  return %0\n}",
        3,
        3,
        ["%0 is defined twice"],
    ),
    (
        'graph @g(%x : f32[2]) {\n  %0 = neg(%x) : f32[2] loc("a.py":1)\n  return %0 $\n}',
        3,
        13,
        ["unexpected character '$'"],
    ),
    ("graph @g(%x : f32[2]) {\n  %0 = neg(%x) : f32[2]\n", 3, 1, ["end of input"]),
    ("graph @g(%x) {\n  return %x\n}", 1, 10, ["graph inputs need a type"]),
    (
        "graph @g() {\n  %0 = constant(value=array<f32[3]>[1.0, 2.0]) : f32[3]\n  return %0\n}",
        2,
        36,
        ["array literal does not match f32[3]"],
    ),
    (
        'graph @g() {\n  %0 = constant(value=array<f32[3]>"bm90IHpsaWI=") : f32[3]\n  return %0\n}',
        2,
        36,
        ["bad array data"],
    ),
    ("graph @g(%x : f32[2]) {\n  %0 = reshape(%x) : f32[2]\n  return %0\n}", 2, 8, ["missing shape"]),
    # a string ends on its line: the error is at its opening quote, not on a later line
    ('graph @g(%x : f32[2]) {\n  return {"a\n: %x}\n}', 2, 11, ["unterminated string", "ends on the line"]),
    (
        'graph @g() {\n  %0 = constant(value=array<f32[4]>"eJxjYEADAAARAAE=") : f32[4]\n  return %0\n}',
        2,
        36,
        ["bad array data", "more than the 16 bytes f32[4] needs"],
    ),
]


@pytest.mark.parametrize("text, line, column, words", PARSE_ERRORS)
def test_parse_errors_give_line_column_and_expectation(text, line, column, words):
    with pytest.raises(graphc.ParseError) as info:
        graphc.parse(text)
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert str(err).startswith(f"line {line}, column {column}: ")
    for w in words:
        assert w in str(err)


def test_types_print_compactly():
    assert str(TensorType((2, 3), np.float32)) == "f32[2,3]"
    assert str(TensorType((), np.bool_)) == "bool[]"


def test_attribute_texts_remembered_per_graph_keep_types_apart():
    """The printer remembers the text of plain attribute values per graph (ir.py ``_NodePrinter``):
    values that compare equal but print differently (1 and True, (1,) and (True,), 0.0 and -0.0)
    each still print as ``format_literal`` prints them, in either order."""
    from graphc.core.ir import Node, Value, _NodePrinter
    from graphc.core.literals import format_literal
    from graphc.ops import OPS

    values = [1, True, (1,), (True,), (), 0.0, -0.0, 1.0, "eq", None, np.dtype(np.float32), ((0, 1),), ((False, 1),)]
    for order in (values, values[::-1]):
        x = Value(TensorType((2,), np.float32), name="x")
        names = {x: "x"}
        nodes = [Node(OPS.neg, [x], {"a": v}, [x.type]) for v in order]
        names.update({n.outputs[0]: str(i) for i, n in enumerate(nodes)})
        printer = _NodePrinter(names)
        for node, v in zip(nodes, order):
            (line,) = printer.lines(node, "")
            assert f"(%x, a={format_literal(v)})" in line, (v, line)
