"""Random numbers in traced code (graphc/ops/random.py, graphc/frontend/random.py, docs/random.md):
the Philox core and ``random`` equal numpy's ``Generator(Philox(key))`` stream word for word; a
Generator argument advances like numpy's across jitted calls; the legacy functions draw from
``graphc.rng_seed``; a sharded draw holds the unsharded bits; dropout differentiates through x;
what cannot be traced warns or raises at the user's line."""

import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import graphc
from graphc.core.errors import TraceError
from graphc.core.ir import Graph, Node, TensorType, Value
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.pytree import LEAF, TreeDef
from graphc.core.spec import R, S, shard
from graphc.frontend.random import RandomWarning, philox_state, set_philox_state
from graphc.ops import get_op
from graphc.ops.random import int_to_words, local_attrs, mulhilo64, philox4x64, words_to_int
from graphc.passes.sharding.strategies import block_sets, get_rule, node_strategies
from tests.graphgen import random_graphs, random_inputs
from tests.passes.sharding.test_dim_rules import _check_node, _node_values

# default_rng(seed) inside, and PCG64 Generators, warn that their numbers are not numpy's: the two
# tests of that say so; the others use them for graphc's own stream
pytestmark = [
    pytest.mark.filterwarnings("ignore:np.random.default_rng:graphc.frontend.random.RandomWarning"),
    pytest.mark.filterwarnings("ignore:a Generator on PCG64:graphc.frontend.random.RandomWarning"),
]

PHILOX = get_op("philox")
KEYS = [0, 5, 2**64 + 7, 2**128 - 1]
SIZES = [0, 1, 3, 4, 5, 17]
HERE = __file__.rsplit("/", 1)[-1]


def key_words(key: int) -> np.ndarray:
    return np.array([key & (2**64 - 1), key >> 64], np.uint64)


def draw(key: int, position: int, shape, dist="uniform", offset=0, runs=None) -> np.ndarray:
    counter = int_to_words(position)
    (out,) = PHILOX.evaluate(key_words(key), counter, shape=tuple(shape), offset=offset, dist=dist, runs=runs)
    return out


def numpy_gen(key: int, counter: int = 0) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=key, counter=counter))


# --- the core: numpy's Philox stream, word for word -----------------------------------------------


def test_mulhilo_matches_python_integers():
    rng = np.random.default_rng(1)
    b = np.concatenate(
        [rng.integers(0, 2**63, 200, dtype=np.uint64) * np.uint64(2), np.array([0, 1, 2**64 - 1], np.uint64)]
    )
    for a in (np.uint64(0xD2E7470EE14C6C93), np.uint64(2**64 - 1), np.uint64(1)):
        hi, lo = mulhilo64(a, b)
        full = [int(a) * int(x) for x in b]
        assert [int(h) for h in hi] == [p >> 64 for p in full]
        assert [int(x) for x in lo] == [p & (2**64 - 1) for p in full]


def test_philox4x64_10_known_answer():
    # Random123's kat_vectors: philox4x64-10 of counter 0, key 0; and of all-ones
    zero = philox4x64(np.zeros((1, 4), np.uint64), np.zeros(2, np.uint64))[0]
    assert [hex(int(w)) for w in zero] == [
        "0x16554d9eca36314c",
        "0xdb20fe9d672d0fdc",
        "0xd7e772cee186176b",
        "0x7e68b68aec7ba23b",
    ]
    ones = philox4x64(np.full((1, 4), 2**64 - 1, np.uint64), np.full(2, 2**64 - 1, np.uint64))[0]
    assert [hex(int(w)) for w in ones] == [
        "0x87b092c3013fe90b",
        "0x438c3c67be8d0224",
        "0x9cc7d7c69cd777b6",
        "0xa09caebf594f0ba0",
    ]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("n", SIZES)
def test_bits_and_random_equal_numpy_stream(key, n):
    assert np.array_equal(draw(key, 0, (n,), "bits"), numpy_gen(key).bit_generator.random_raw(n))
    assert np.array_equal(draw(key, 0, (n,)), numpy_gen(key).random(n))


@pytest.mark.parametrize("counter", [0, 2**64 - 1, 2**64 - 2, 2**128 - 1, 2**192 - 1, 2**254 - 3])
def test_counter_carries_like_numpy(counter):
    """numpy's 256-bit counter carries across words (a word position holds counters below 2**254)."""
    want = numpy_gen(3, counter).bit_generator.random_raw(11)
    assert np.array_equal(draw(3, 4 * counter, (11,), "bits"), want)


@pytest.mark.parametrize("consumed", [0, 1, 3, 4, 6])
def test_state_conversion_round_trips_with_numpy(consumed):
    """A generator part-way through numpy's 4-word buffer: its word position continues its stream,
    and a generator put at position + k continues like numpy's after k more words."""
    gen = numpy_gen(9)
    gen.bit_generator.random_raw(consumed)
    state = philox_state(gen)
    assert words_to_int(state[2:]) == consumed
    assert np.array_equal(draw(9, consumed, (2, 3)), gen.random((2, 3)))
    other = numpy_gen(1)
    set_philox_state(other, state)
    ahead = state.copy()
    ahead[2:] = int_to_words(consumed + 6)
    moved = numpy_gen(2)
    set_philox_state(moved, ahead)
    assert np.array_equal(moved.random(7), (gen.random(7)))
    assert np.array_equal(
        other.bit_generator.random_raw(6), numpy_gen(9).bit_generator.random_raw(consumed + 6)[consumed:]
    )


# --- sharding: any piece holds the unsharded bits --------------------------------------------------


@pytest.mark.parametrize(
    "spec, mesh_shape",
    [((S(0), R), (2, 2)), ((S(1), S(0)), (2, 2)), ((S(1, blocks=2), R), (2, 2)), ((S(2),), (3,))],
)
def test_every_piece_equals_the_slice_of_the_whole(spec, mesh_shape):
    shape = (4, 8, 3)
    attrs = dict(shape=shape, offset=2, dist="bits", runs=None)
    whole = draw(77, 13, **attrs)
    for coord in np.ndindex(*mesh_shape):
        local = local_attrs(attrs, spec, mesh_shape, coord)  # what the op's LocalAttrs trait calls
        piece = draw(77, 13, **local)
        assert np.array_equal(piece, shard(whole, spec, mesh_shape, coord)), (spec, coord)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(random_graphs(max_nodes=3, ops=["philox"], min_dim=0), hst.sampled_from([(2,), (3,), (2, 2)]))
def test_every_strategy_of_a_random_philox_node_reassembles(graph, mesh_shape):
    """Through the planner's own strategies and the lowering's local attributes (run_local)."""
    mesh = Mesh({f"a{i}": n for i, n in enumerate(mesh_shape)}, profile=MachineProfile.default())
    env = _node_values(graph, random_inputs(graph, 0))
    rules = {n: get_rule(n) for n in graph.nodes}
    sets = block_sets(graph, rules)
    for node in graph.nodes:
        for strategy in node_strategies(node, rules[node], mesh, sets):
            _check_node(node, strategy, mesh_shape, env)


def test_dim_rule_lets_every_dim_split_and_reads_the_state_whole():
    types = (TensorType((2,), np.uint64), TensorType((4,), np.uint64))
    rule = PHILOX.dim_rule(types, (TensorType((3, 5), np.float64),), shape=(3, 5), offset=0, dist="uniform", runs=None)
    assert rule.outputs == (("e0", "e1"),) and rule.inputs == ((None,), (None,)) and not rule.sums


def test_text_ir_round_trip_with_runs():
    key, counter = Value(TensorType((2,), np.uint64), name="key"), Value(TensorType((4,), np.uint64), name="ctr")
    node = Node(
        PHILOX,
        [key, counter],
        dict(shape=(4, 6), offset=3, dist="uniform", runs=(((0, 2),), ((1, 3), (4, 6)))),
        PHILOX.infer_types(
            (key.type, counter.type), dict(shape=(4, 6), offset=3, dist="uniform", runs=(((0, 2),), ((1, 3), (4, 6))))
        ),
        None,
    )
    g = Graph(
        "r",
        [key, counter],
        [node],
        [node.outputs[0]],
        TreeDef("tuple", (TreeDef("tuple", (LEAF, LEAF)), TreeDef("dict"))),
        LEAF,
    )
    text = str(g)
    assert "philox" in text and str(graphc.parse(text)) == text
    assert node.outputs[0].type == TensorType((2, 4), np.float64)


def test_bad_attributes_are_shape_errors():
    types = (TensorType((2,), np.uint64), TensorType((4,), np.uint64))
    with pytest.raises(Exception, match="dist"):
        PHILOX.infer_types(types, dict(shape=(2,), offset=0, dist="gauss", runs=None))
    with pytest.raises(Exception, match="key u64"):
        PHILOX.infer_types((TensorType((2,), np.int64), types[1]), dict(shape=(2,), offset=0, dist="bits", runs=None))
    with pytest.raises(Exception, match="runs"):
        PHILOX.infer_types(types, dict(shape=(2,), offset=0, dist="bits", runs=(((0, 3),),)))


# --- tracing: generators made inside ---------------------------------------------------------------


def test_default_rng_inside_is_philox_of_the_seed_and_draws_advance():
    def f(x):
        rng = np.random.default_rng(42)
        return x + rng.random(x.shape), rng.random(), rng.uniform(-2.0, 3.0, (2,)), rng.random(0)

    x = np.zeros((2, 3))
    with pytest.warns(RandomWarning, match=r"default_rng\(seed\) in traced code is Generator\(Philox") as record:
        g = graphc.trace(f, x)  # (not numpy's PCG64 numbers: said at the line, wrong29)
    assert record[0].lineno == f.__code__.co_firstlineno + 1
    assert not any(n.op.name == "constant" and n.outputs[0].type.shape == (2, 3) for n in g.nodes)
    a, b, c, d = graphc.evaluate(g, x)
    ref = numpy_gen(42)
    assert np.array_equal(a, ref.random((2, 3)))
    assert np.array_equal(b, ref.random()) and np.asarray(b).shape == ()
    assert np.array_equal(c, ref.uniform(-2.0, 3.0, (2,)))
    assert d.shape == (0,)


def test_traced_seed_gives_the_stream_of_its_value():
    def f(seed):
        return np.random.default_rng(seed).random(5)

    out = graphc.jit(f)(np.int64(123))
    assert np.array_equal(out, numpy_gen(123).random(5))


def test_distributions_are_what_they_claim():
    def f():
        rng = np.random.default_rng(7)
        return (
            rng.standard_normal(20000),
            rng.normal(3.0, 0.5, (1,)),
            rng.integers(-3, 4, 5000),
            rng.integers(5, size=(2, 2), endpoint=True),
            rng.permutation(50),
            rng.permutation(np.arange(12.0).reshape(6, 2)),
            rng.choice(np.arange(10, 20), 6, replace=False),
            rng.choice(4, 3),
            rng.random(3, dtype=np.float32),
            rng.standard_normal((0, 3)),
            rng.permutation(1),
        )

    z, nrm, ints, ints2, perm, rows, choice, choice_r, f32, empty, one = graphc.jit(f)()
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05 and np.isfinite(z).all()
    assert nrm.shape == (1,)
    assert ints.min() == -3 and ints.max() == 3 and ints.dtype == np.int64
    assert ints2.shape == (2, 2) and 0 <= ints2.min() and ints2.max() <= 5
    assert sorted(perm) == list(range(50)) and not np.array_equal(perm, np.arange(50))
    assert sorted(map(tuple, rows)) == [(2.0 * i, 2.0 * i + 1) for i in range(6)]
    assert len(set(choice)) == 6 and set(choice) <= set(range(10, 20))
    assert choice_r.shape == (3,) and set(choice_r) <= set(range(4))
    assert f32.dtype == np.float32 and ((0 <= f32) & (f32 < 1)).all()
    assert empty.shape == (0, 3) and list(one) == [0]


# --- a Generator argument: its state is an input, advanced after each call -------------------------


def dropout(rng, x, p=0.5):
    return x * (rng.random(x.shape) > p) / (1 - p)


def test_jitted_calls_with_one_generator_draw_numpys_successive_numbers():
    x = np.ones((3, 4))
    gen, ref = numpy_gen(7), numpy_gen(7)
    fn = graphc.jit(dropout)
    first, second = fn(gen, x), fn(gen, x)
    assert not np.array_equal(first, second)
    assert np.array_equal(first, (ref.random((3, 4)) > 0.5) / 0.5)
    assert np.array_equal(second, (ref.random((3, 4)) > 0.5) / 0.5)
    assert np.array_equal(gen.random(5), ref.random(5))  # the object sits where numpy's would
    assert len(fn._cache) == 1


def test_trace_takes_a_generator_argument_as_its_state():
    g = graphc.trace(dropout, numpy_gen(2), np.ones(4))
    assert g.inputs[0].type == TensorType((6,), np.uint64)
    out = graphc.evaluate(g, philox_state(numpy_gen(2)), np.ones(4))
    assert np.array_equal(out, (numpy_gen(2).random(4) > 0.5) / 0.5)


def test_a_pcg64_generator_gives_each_call_a_fresh_key():
    x = np.ones(8)
    fn = graphc.jit(dropout)
    gen = np.random.default_rng(0)
    with pytest.warns(RandomWarning, match="a Generator on PCG64 .* its numbers are not numpy's") as record:
        a, b = fn(gen, x), fn(gen, x)  # (said at the call, wrong29)
    assert record[0].filename == __file__
    assert not np.array_equal(a, b)
    again = np.random.default_rng(0)
    assert np.array_equal(fn(again, x), a)


# --- the legacy functions: graphc.rng_seed ---------------------------------------------------------


def legacy(x):
    return (
        x * (np.random.rand(*x.shape) < 0.5),
        np.random.randn(2),
        np.random.uniform(0, 1, size=1),
        np.random.randint(3, size=2),
    )


def test_rng_seed_blocks_replay_and_calls_inside_advance():
    x = np.ones(6)
    fn = graphc.jit(legacy)
    with graphc.rng_seed(5) as gen:
        a, b = fn(x), fn(x)
    with graphc.rng_seed(5):
        c = fn(x)
    assert not np.array_equal(a[0], b[0]) or not np.array_equal(a[1], b[1])
    for u, v in zip(a, c):
        assert np.array_equal(u, v)
    assert np.array_equal(a[0], x * (numpy_gen(5).random(6) < 0.5))  # rand is Generator.random
    assert words_to_int(philox_state(gen)[2:]) == 2 * (6 + 4 + 1 + 2)


def test_rng_seed_with_parallelize_and_a_generator_given():
    x = np.ones((4, 4))
    gen = numpy_gen(3)
    with graphc.rng_seed(rng=gen):
        out = graphc.parallelize(lambda x: x * np.random.random(x.shape), mesh={"dp": 2}, cache=False)(x)
    assert np.array_equal(out, numpy_gen(3).random((4, 4)))
    assert words_to_int(philox_state(gen)[2:]) == 16


# --- sharded equals unsharded: a dropout MLP on a 2x2 mesh ----------------------------------------


P_DROP = 0.25


def dropout_mlp(rng, params, x, y):
    shape = (x.shape[0], params["w1"].shape[1])
    u = graphc.shard(rng.random(shape), "S(0)", "S(1)")  # each device draws its own piece
    z = graphc.shard(rng.standard_normal(shape), "R", "S(0)")

    def loss_fn(params):
        h = np.maximum(x @ params["w1"], 0.0)
        h = h * (u >= P_DROP) / (1 - P_DROP) + 1e-3 * z
        return np.mean((h @ params["w2"] - y) ** 2)

    loss, grads = graphc.value_and_grad(loss_fn)(params)
    return loss, grads, u, z


def test_dropout_mlp_on_a_2x2_mesh_draws_the_unsharded_bits():
    r = np.random.default_rng(0)
    params = {"w1": r.standard_normal((8, 16)), "w2": r.standard_normal((16, 4))}
    x, y = r.standard_normal((8, 8)), r.standard_normal((8, 4))
    gen_mesh, gen_one = numpy_gen(11), numpy_gen(11)
    pf = graphc.parallelize(dropout_mlp, mesh={"dp": 2, "tp": 2}, cache=False)
    jf = graphc.jit(dropout_mlp)
    for _ in range(2):  # the second call draws new numbers on both
        loss, grads, u, z = pf(gen_mesh, params, x, y)
        loss1, grads1, u1, z1 = jf(gen_one, params, x, y)
        assert np.array_equal(u, u1) and np.array_equal(z, z1)  # bit for bit
        np.testing.assert_allclose(loss, loss1, rtol=1e-12)
        for k in params:
            np.testing.assert_allclose(grads[k], grads1[k], rtol=1e-10, atol=1e-12)
    lowered = pf.compile(numpy_gen(11), params, x, y).ir("lowered")
    assert "runs=(((0, 4),), ((" in lowered  # the philox ops compute pieces
    assert words_to_int(philox_state(gen_mesh)[2:]) == words_to_int(philox_state(gen_one)[2:]) == 2 * 3 * 128


def test_pipelined_micro_batches_read_the_generator_state_whole():
    """The state is not a batch input: each micro-batch draws its rows of the full-batch draw."""
    r = np.random.default_rng(1)
    params = {"w1": r.standard_normal((4, 8)), "w2": r.standard_normal((8, 2))}
    x, y = r.standard_normal((4, 4)), r.standard_normal((4, 2))

    def step(rng, params, x, y):
        def loss_fn(params):
            h = np.maximum(x @ params["w1"], 0.0)
            return np.mean((dropout(rng, h, P_DROP) @ params["w2"] - y) ** 2)

        return graphc.value_and_grad(loss_fn)(params)

    pf = graphc.parallelize(step, mesh={"pp": 2}, microbatches=2, cache=False)
    gen_pp, gen_one = numpy_gen(5), numpy_gen(5)
    for _ in range(2):
        (loss, grads), (loss1, grads1) = pf(gen_pp, params, x, y), graphc.jit(step)(gen_one, params, x, y)
        np.testing.assert_allclose(loss, loss1, rtol=1e-12)
        np.testing.assert_allclose(grads["w1"], grads1["w1"], rtol=1e-10, atol=1e-12)
    assert gen_pp.random() == gen_one.random()


def test_dropout_gradient_flows_through_x_only():
    x = np.arange(1.0, 7.0).reshape(2, 3)

    def loss(x, rng):
        return np.sum(dropout(rng, x, 0.5) ** 2)

    g = graphc.grad(loss)(x, numpy_gen(4))
    keep = numpy_gen(4).random((2, 3)) > 0.5
    np.testing.assert_allclose(g, 2 * x * keep / 0.25)


# --- what cannot be traced: warnings and errors at the user's line ---------------------------------


def test_unsupported_function_warns_at_the_users_line():
    def f(x):
        return x + np.random.exponential(size=3)  # line of the warning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphc.trace(f, np.zeros(3))
    (w,) = [w for w in caught if issubclass(w.category, RandomWarning)]
    assert w.filename.endswith(HERE) and w.lineno == f.__code__.co_firstlineno + 1
    assert "exponential" in str(w.message)


def test_legacy_call_without_rng_seed_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphc.trace(lambda x: x + np.random.rand(3), np.zeros(3))
    assert any(
        issubclass(w.category, RandomWarning) and "rng_seed" in str(w.message) and w.filename.endswith(HERE)
        for w in caught
    )


def test_unsupported_generator_method_and_loop_draws_raise_at_the_line():
    with pytest.raises(TraceError, match="Generator.exponential") as info:
        graphc.trace(lambda x: x + np.random.default_rng(0).exponential(size=3), np.zeros(3))
    assert info.value.loc is not None and info.value.loc.file.endswith(HERE)

    def in_loop(x, n):
        rng = np.random.default_rng(0)

        def body(i, acc):
            return (acc + rng.random(3),)

        return graphc.fori_loop(0, n, body, (x,))

    with pytest.raises(TraceError, match="inside a traced loop"):
        graphc.trace(in_loop, np.zeros(3), np.int64(2))


def test_unseeded_default_rng_takes_its_key_from_the_ambient_stream():
    def f(x):
        return x + np.random.default_rng().random(2)

    fn = graphc.jit(f)
    with graphc.rng_seed(8) as gen:
        a, b = fn(np.zeros(2)), fn(np.zeros(2))
    key = numpy_gen(8).bit_generator.random_raw(2)
    assert np.array_equal(a, numpy_gen(int(key[0]) | int(key[1]) << 64).random(2))
    assert not np.array_equal(a, b) and words_to_int(philox_state(gen)[2:]) == 4
    with pytest.raises(TraceError, match="without a seed"):
        graphc.trace(f, np.zeros(2))


def test_legacy_draws_in_a_loop_body_raise_under_trace_in_a_rng_seed_block():
    def f(x, n):
        return graphc.fori_loop(0, n, lambda i, acc: (acc + np.random.rand(3),), (x,))

    with graphc.rng_seed(0), pytest.raises(TraceError, match="inside a traced loop"):
        graphc.trace(f, np.zeros(3), np.int64(2))


def test_trace_in_a_rng_seed_block_bakes_the_state_in():
    with graphc.rng_seed(4):
        g = graphc.trace(lambda x: x + np.random.rand(2), np.zeros(2))
    assert len(g.inputs) == 1
    assert np.array_equal(graphc.evaluate(g, np.zeros(2)), numpy_gen(4).random(2))


def test_patches_are_restored_and_other_threads_unaffected():
    original = np.random.rand
    seen = []

    def other_thread():
        seen.append(np.random.default_rng(1).random())  # numpy's own, even while a trace runs

    def f(x):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        return x + np.random.default_rng(1).random()

    out = graphc.jit(f)(np.zeros(()))
    assert np.random.rand is original and np.random.default_rng is not None
    assert seen == [np.random.default_rng(1).random()]  # PCG64: not graphc's Philox
    assert out == numpy_gen(1).random()
