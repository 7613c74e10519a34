"""Fuzzing the inputs graphc reads: the text-IR parser, the ``.gir`` loader, the plan JSON loaders
(``ShardingPlan.from_json``, ``PipelinePlan.from_json``) and the graph -> text -> graph round trip.

The property for bad input: the reader returns something valid (a graph that verifies and prints
back to text that parses to the same graph; a plan that prints and reads back), or raises a
``GraphcError`` subclass that says where. Never another exception. Inputs are mutations of real
printed graphs and plans (characters deleted, inserted or replaced, lines dropped or repeated,
JSON values swapped for others) as well as random text.

The default profile keeps all of these within about 20 s on 2 cores;
``pytest -m fuzz --hypothesis-profile long`` runs 10,000 examples per target (docs/fuzzing.md).
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import graphc
from graphc.core.errors import GraphcError, ParseError
from graphc.passes.pipeline import PipelinePlan
from graphc.passes.sharding.plan import ShardingPlan
from graphc.textir import load, parse
from tests.graphgen import random_graphs
from tests.helpers import fuzz_settings

pytestmark = [pytest.mark.fuzz, pytest.mark.slow]

GOLDEN = Path(__file__).parents[1] / "golden"


# --- seeds: real printed graphs and plans ---------------------------------------------------------


@functools.lru_cache(maxsize=1)
def seed_graphs() -> tuple[str, ...]:
    """Printed graphs with every construct of the text IR: signatures with nested pytrees and static
    values, attributes, regions (control flow, fused kernels), source locations, parts, small and
    compressed constants, and size-0 and size-1 dims."""
    from graphc.models import mlp

    def control(x, n):
        (y,) = graphc.fori_loop(0, 3, lambda i, y: (y * 0.5 + 1.0,), (x,))
        return graphc.cond(np.sum(y) > 0, lambda a: a + 1.0, lambda a: a - 1.0, y), {"n": n, "s": "a\tb"}

    texts = [path.read_text() for path in sorted(GOLDEN.glob("*.gir"))]
    args, kwargs = mlp.example_train_args(batch=2, sizes=(3, 5, 2))
    texts.append(str(graphc.trace(mlp.train_step, *args, **kwargs)))
    texts.append(str(graphc.optimize(graphc.trace(lambda x: np.tanh(x * 2.0) + np.ones((1, 20)), np.ones((1, 20))))))
    texts.append(str(graphc.trace(control, np.ones((1, 0, 2), np.float32), n=3)))
    big = np.arange(40, dtype=np.float32).reshape(2, 20)  # printed as zlib + base64
    texts.append(str(graphc.trace(lambda x: x @ big.T + big.sum(), np.ones((3, 20), np.float32))))
    return tuple(texts)


@functools.lru_cache(maxsize=1)
def seed_plans() -> tuple[str, str]:
    """A sharding plan (dp x tp) and a pipeline plan (pp x dp) of a small training step, as JSON."""

    def loss(w, x):  # [4, 3], [8, 4] -> []
        h = np.tanh(x @ w)
        return np.mean(h * h)

    def step(w, x):
        value, grad = graphc.value_and_grad(loss)(w, x)
        return w - 0.1 * grad, value

    args = (np.ones((4, 3), np.float32), np.ones((8, 4), np.float32))
    sharding = graphc.parallelize(step, mesh={"dp": 2, "tp": 2}, cache=False)
    pipeline = graphc.parallelize(step, mesh={"pp": 2, "dp": 2}, cache=False)
    return sharding.plan(*args).to_json(), pipeline.plan(*args).to_json()


# --- mutations --------------------------------------------------------------------------------------

# characters the grammar gives meaning to, and some it does not
IR_ALPHABET = '%@{}()[]<>,:="\\\n\t #-+.eE0123456789afinrtuxyz_'
INTERESTING = st.sampled_from(
    ["\n", '"', "\\", "%0", "@", "{", "}", "(", ")", "[", "]", "-1", "1e400", "nan", "\u00e9", "\x00"]
)


@st.composite
def mutated(draw, text: str, alphabet: str = IR_ALPHABET) -> str:
    """``text`` after 1 to 4 edits: delete a span, insert or replace characters, drop or repeat a line."""
    rng = random.Random(draw(st.integers(0, 2**64)))  # positions spread evenly (hypothesis favours small ints)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "replace", "line"]))
        i = rng.randint(0, len(text))
        if kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)) :]
        elif kind == "insert":
            piece = draw(st.text(alphabet, min_size=1, max_size=4) | INTERESTING)
            text = text[:i] + piece + text[i:]
        elif kind == "replace" and i < len(text):
            text = text[:i] + draw(st.text(alphabet, min_size=1, max_size=1) | INTERESTING) + text[i + 1 :]
        elif kind == "line":
            lines = text.split("\n")
            k = rng.randint(0, len(lines) - 1)
            lines[k : k + 1] = [] if draw(st.booleans()) else [lines[k], lines[k]]
            text = "\n".join(lines)
    return text


def reshaped_constant(text: str, draw) -> str:
    """``text`` with the declared type of one compressed constant changed (the data stays)."""
    heads = list(re.finditer(r'array<(\w+)\[([\d,]*)\]>"', text))
    if not heads:
        return text
    m = draw(st.sampled_from(heads))
    dims = ",".join(str(d) for d in draw(st.lists(st.sampled_from([0, 1, 2, 3, 40, 10**6, 10**12]), max_size=3)))
    dtype = draw(st.sampled_from([m.group(1), "f64", "i8", "bool"]))
    return text[: m.start()] + f'array<{dtype}[{dims}]>"' + text[m.end() :]


@st.composite
def bad_ir(draw) -> str:
    text = draw(st.sampled_from(seed_graphs()))
    if draw(st.booleans()):
        text = reshaped_constant(text, draw)
    return draw(mutated(text))


# --- the properties ----------------------------------------------------------------------------------


def check_parses_or_fails_cleanly(text: str, source: str | None = None) -> None:
    """``parse(text)`` gives a verified graph that prints to text which parses to the same graph,
    or raises a GraphcError (anything else fails the test with its traceback)."""
    try:
        graph = parse(text, source)
    except GraphcError as exc:
        assert str(exc)
        if source is not None:
            assert str(exc).startswith(f"{source}: ")
        return
    printed = str(graph)
    assert str(parse(printed)) == printed


@fuzz_settings(600)
@given(bad_ir())
def test_text_ir_parser_on_mutated_graphs(text):
    check_parses_or_fails_cleanly(text)


@fuzz_settings(300)
@given(st.text(IR_ALPHABET + "graphreturnyieldlocpart", max_size=200) | st.text(max_size=100))
def test_text_ir_parser_on_random_text(text):
    check_parses_or_fails_cleanly(text)
    check_parses_or_fails_cleanly("graph @g(%x : f32[2]) {\n" + text + "\n  return %x\n}")


@st.composite
def bad_gir_bytes(draw) -> bytes:
    data = draw(bad_ir()).encode()
    for _ in range(draw(st.integers(0, 2))):  # bytes that are not UTF-8, or NUL
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\x00", b"\xed\xa0\x80"])) + data[i:]
    return data


@fuzz_settings(300)
@given(bad_gir_bytes())
def test_gir_loader_on_mutated_bytes(data):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.gir")
        Path(path).write_bytes(data)
        try:
            graph = load(path)
        except GraphcError as exc:
            assert str(exc).startswith(f"{path}: "), str(exc)
            return
        assert str(parse(str(graph))) == str(graph)


# --- plans ---------------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["", "R", "P", "S(0)", "S(1)", "S(9)", "S(0, blocks=3)", "[R, S(0)]", "dp", "f32[2,3]", "%x"])
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _set(doc, path, value):
    _at(doc, path[:-1])[path[-1]] = value


@st.composite
def mutated_document(draw, text: str) -> str:
    """``text`` (JSON) with 1 to 3 values replaced by random JSON, deleted or duplicated into a list."""
    doc = json.loads(text)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent, key = _at(doc, path[:-1]), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "wrap"]))
        if action == "delete":
            del parent[key]
        elif action == "wrap":
            parent[key] = [parent[key], parent[key]]
        else:
            parent[key] = draw(JSON_VALUES)
    return json.dumps(doc)


def check_plan_reads_or_fails_cleanly(cls, text: str) -> None:
    try:
        plan = cls.from_json(text, "plan.json")
    except GraphcError as exc:
        assert "plan.json" in str(exc), str(exc)
        return
    again = cls.from_json(plan.to_json(), "again.json")  # what was read can be written and read back
    assert again.to_json() == plan.to_json()
    plan.summary()


@pytest.mark.parametrize("which", [0, 1], ids=["sharding", "pipeline"])
@fuzz_settings(250)
@given(data=st.data())
def test_plan_loaders_on_mutated_json(which, data):
    cls = (ShardingPlan, PipelinePlan)[which]
    seed = seed_plans()[which]
    if data.draw(st.booleans()):
        text = data.draw(mutated_document(seed))
    else:
        text = data.draw(mutated(seed, alphabet='{}[]",:0123456789.-eE \ntruefalsnul'))
    check_plan_reads_or_fails_cleanly(cls, text)


@pytest.mark.parametrize("which", [0, 1], ids=["sharding", "pipeline"])
@pytest.mark.parametrize("number", ["1e4000", "-1e4000", "NaN", "1e308"])
def test_plan_loaders_on_numbers_out_of_range_in_every_int_field(which, number):
    """Every integer of a plan replaced by a number no int holds (1e4000 reads as inf, whose int()
    is an OverflowError, found by the fuzzer above): the plan reads or fails with a PlanError."""
    cls = (ShardingPlan, PipelinePlan)[which]
    seed = seed_plans()[which]
    doc = json.loads(seed)
    paths = [p for p in _paths(doc) if p and _at(doc, p).__class__ is int]
    assert paths
    for path in paths:
        changed = json.loads(seed)
        _set(changed, path, "@NUMBER@")
        check_plan_reads_or_fails_cleanly(cls, json.dumps(changed).replace('"@NUMBER@"', number))


# --- graph -> text -> graph ---------------------------------------------------------------------------


@fuzz_settings(250)
@given(random_graphs(max_nodes=8, min_dim=0))
def test_graph_text_graph_round_trip(graph):
    text = str(graph)
    back = parse(text)
    assert str(back) == text
    assert [v.type for v in back.inputs] == [v.type for v in graph.inputs]
    assert [v.type for v in back.outputs] == [v.type for v in graph.outputs]
    assert back.in_tree == graph.in_tree and back.out_tree == graph.out_tree


# --- regressions: one example of each class the fuzzers found ---------------------------------------


def test_an_unterminated_string_is_an_error_where_it_starts():
    text = 'graph @g(%x : f32[2]) {\n  %0 = neg(%x) : f32[2] loc("a.py\n  return %0\n}\n'
    with pytest.raises(ParseError) as info:
        parse(text)
    assert (info.value.line, info.value.column) == (2, 29)  # the opening quote, not the next line
    assert "unterminated string" in str(info.value)


def test_a_decompression_bomb_is_refused_quickly_in_bounded_memory():
    import base64
    import time
    import tracemalloc
    import zlib

    bomb = base64.b64encode(zlib.compress(bytes(100_000_000), 9)).decode()  # 100 MB of zeros in 130 KB
    text = f'graph @g() {{\n  %0 = constant(value=array<f32[2,2]>"{bomb}") : f32[2,2]\n  return %0\n}}\n'
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ParseError) as info:
            parse(text)
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (info.value.line, info.value.column) == (2, 38)  # the data's opening quote
    assert "more than the 16 bytes f32[2,2] needs" in str(info.value)
    assert seconds < 2.0 and peak < 20 * len(text), (seconds, peak)


@pytest.mark.parametrize(
    "payload, words",
    [
        (b"", "truncated (0 of 16 bytes)"),
        (bytes(8), "holds 8 bytes, f32[2,2] needs 16"),
        (bytes(17), "more than the 16 bytes"),
    ],
)
def test_constant_data_of_the_wrong_size_is_a_located_error(payload, words):
    import base64
    import zlib

    packed = zlib.compress(payload)
    if not payload:
        packed = packed[:-4]  # cut off before the end of the stream
    data = base64.b64encode(packed).decode()
    text = f'graph @g() {{\n  %0 = constant(value=array<f32[2,2]>"{data}") : f32[2,2]\n  return %0\n}}\n'
    with pytest.raises(ParseError, match=re.escape(words)) as info:
        parse(text)
    assert (info.value.line, info.value.column) == (2, 38)  # the data's opening quote


def test_trailing_bytes_after_constant_data_are_an_error():
    import base64
    import zlib

    data = base64.b64encode(zlib.compress(bytes(16)) + b"junk").decode()
    text = f'graph @g() {{\n  %0 = constant(value=array<f32[4]>"{data}") : f32[4]\n  return %0\n}}\n'
    with pytest.raises(ParseError, match="4 bytes follow the compressed data"):
        parse(text)


def test_gir_loader_names_the_file_line_and_column_of_a_byte_that_is_not_utf8(tmp_path):
    path = tmp_path / "bad.gir"
    path.write_bytes(b"graph @g(%x : f32[2]) {\n  return \xff%x\n}\n")
    with pytest.raises(ParseError) as info:
        load(str(path))
    assert str(info.value) == f"{path}: line 2, column 10: not UTF-8 text (byte 0xff)"


def test_deep_nesting_is_a_parse_error():
    text = "graph @g() {\n  return " + "[" * 50_000 + "]" * 50_000 + "\n}\n"
    with pytest.raises(ParseError, match="nested too deeply"):
        parse(text)


def test_negative_dims_are_located_parse_errors():
    with pytest.raises(ParseError, match="dimension -3 is negative") as info:
        parse("graph @g(%x : f32[2,-3]) {\n  return %x\n}\n")
    assert (info.value.line, info.value.column) == (1, 21)


def test_a_bad_escape_in_a_location_is_a_parse_error():
    with pytest.raises(ParseError, match="bad string literal") as info:
        parse('graph @g(%x : f32[2]) {\n  %0 = neg(%x) : f32[2] loc("a\\q.py":1)\n  return %0\n}\n')
    assert info.value.line == 2


@pytest.mark.parametrize("literal", ["[none, 1]", "[f32, 1]", '["a", 1]'])
def test_array_literals_of_the_wrong_kind_are_parse_errors(literal):
    with pytest.raises(ParseError, match="array literal does not match i64"):
        parse(f"graph @g() {{\n  %0 = constant(value=array<i64[2]>{literal}) : i64[2]\n  return %0\n}}\n")
