"""bfloat16 and float16 run (graphc/ops/precision.py): every op computes in float32 and rounds
each 16-bit result, as XLA's CPU backend does.

The oracle is the graph's float32 twin rounded at the same points, built without graphc's
rounding code: the graph rebuilt with every 16-bit type made float32 and run op by op by the
ops' float32 reference implementations, each value the original graph types as 16-bit
rounded to that type (numpy's / ml_dtypes' ``astype``: to nearest, ties to even). graphc's
interpreter must equal it bit for bit; compiled runs must equal it within the bound the oracle's
own values give (``rounded_float32_run_with_bounds``): bit for bit where no sum added in another
order reaches a 16-bit rounding boundary, and within the reordering's float32 error carried
through the graph where one may.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphc
from graphc.bench.bounds import outside, reference_with_bounds
from graphc.builder import GraphBuilder
from graphc.core.errors import GraphcError
from graphc.core.ir import TensorType
from graphc.core.pytree import flatten, unflatten
from graphc.interpreter import run_flat
from graphc.models import gpt, mlp
from graphc.programs import simulate
from graphc.runtime.comm import ThreadWorld
from graphc.runtime.einsum import BlasEinsum, einsum_step
from graphc.runtime.executor import Executable
from graphc.runtime.pieces import sum_in_rank_order
from tests.graphgen import random_graphs, random_inputs
from tests.helpers import cache_of_its_own, fuzz_settings, quiet
from tests.runtime.mpi_jobs import mlp_case
from tests.runtime.test_mpi import JOBS, MPIEXEC, mpirun, needs_mpi

BF16 = np.dtype(graphc.bfloat16)
F16 = np.dtype(np.float16)
LOW = [pytest.param(BF16, id="bf16"), pytest.param(F16, id="f16")]


# --- the oracle and the comparisons ----------------------------------------------------------------


def with_dtypes(graph: graphc.Graph, change: dict) -> graphc.Graph | None:
    """``graph`` rebuilt node by node with every dtype in ``change`` replaced (input types,
    constants, dtype attributes), its types inferred again; None if an op refuses the new dtype."""
    b = GraphBuilder(graph.name)
    env = {v: b.input(TensorType(v.type.shape, change.get(v.type.dtype, v.type.dtype)), v.name) for v in graph.inputs}
    for node in graph.nodes:
        assert not node.regions, "graphs without control flow"
        attrs = {k: _changed(a, change) for k, a in node.attrs.items()}
        try:
            outs = b.op(node.op.name, *[env[v] for v in node.inputs], **attrs)
        except GraphcError:
            return None
        env.update(zip(node.outputs, outs if isinstance(outs, (list, tuple)) else [outs]))
    return b.build([env[v] for v in graph.outputs])


def _changed(attr, change: dict):
    if isinstance(attr, np.ndarray) and attr.dtype in change:
        with np.errstate(over="ignore"):  # 3.4e38 is inf in 16 bits
            return attr.astype(change[attr.dtype])
    if isinstance(attr, np.dtype) and attr in change:
        return change[attr]
    return attr


def _up(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype in (BF16, F16) else x


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """How many 16-bit floats lie between ``got`` and ``want`` elementwise (0 where both are NaN).
    Both dtypes keep the sign in the top bit and order magnitudes as integers."""
    assert got.dtype == want.dtype and got.dtype in (BF16, F16) and got.shape == want.shape

    def ordinal(x):
        bits = x.view(np.uint16).astype(np.int64)
        return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)

    nan_got, nan_want = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(nan_got, nan_want, err_msg="NaN in other places")
    return np.where(nan_want, 0, np.abs(ordinal(got) - ordinal(want)))


def assert_same_bits(got, want) -> None:
    got_leaves, want_leaves = flatten(got)[0], flatten(want)[0]
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype in (BF16, F16):
            assert ulps(g, w).max(initial=0) == 0, f"leaf {i}: {ulps(g, w).max()} ulps apart"
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"leaf {i}")


def assert_within_ulps(got, want, n: int) -> None:
    """16-bit float leaves within ``n`` ulps; other leaves (integers, booleans, and floats made
    by the same float32/float64 routines on both sides) equal."""
    for i, (g, w) in enumerate(zip(flatten(got)[0], flatten(want)[0])):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype not in (BF16, F16):
            np.testing.assert_array_equal(g, w, err_msg=f"leaf {i}")
            continue
        worst = ulps(g, w).max(initial=0)
        assert worst <= n, f"leaf {i}: {worst} ulps apart (at most {n})"


# --- how far a compiled run may be from the oracle -------------------------------------------------
#
# A compiled run computes the oracle's ops on the same rounding points, but adds the terms of a
# matmul, einsum, sum or scatter_add in an order of its own and computes exp / tanh / log in its
# fused kernels with formulas of its own: graphc/bench/bounds.py bounds, for every value, how far
# the compiled value may be from the oracle's (the same bounds ``graphc run`` checks a run with).


def rounded_float32_run_with_bounds(
    graph: graphc.Graph, arrays: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The oracle: the graph run node by node in float32, each value rounded to the 16-bit dtype
    ``graph`` gives it (results in ``graph``'s dtypes); and for each result the elementwise bound
    (float64) on how far a compiled run of ``graph`` on one device may be from it."""
    return reference_with_bounds(graph, arrays)


def outside_bounds(got, want, bounds) -> list[int]:
    """The 16-bit float leaves of ``got`` with an element farther from ``want`` than its bound."""
    leaves = zip(flatten(got)[0], flatten(want)[0], bounds)
    return [i for i, (g, w, b) in enumerate(leaves) if np.asarray(w).dtype in (BF16, F16) and outside(g, w, b).any()]


def assert_each_leaf_off_by_2_percent_fails(want, bounds, leaves: list[int] | None = None) -> None:
    """The bounds can tell a wrong result: ``want`` with one 16-bit leaf (of ``leaves``, default
    all) scaled by 1.02 is outside them in that leaf."""
    flat = [np.asarray(w) for w in flatten(want)[0]]
    for i, w in enumerate(flat):
        if w.dtype not in (BF16, F16) or not w.any() or (leaves is not None and i not in leaves):
            continue
        wrong = [*flat[:i], (w.astype(np.float64) * 1.02).astype(w.dtype), *flat[i + 1 :]]
        assert outside_bounds(wrong, flat, bounds) == [i], f"leaf {i} off by 2% passes"


def assert_within_bounds(got, want, bounds) -> None:
    """Every 16-bit float leaf within its bound of the oracle's (NaN where the oracle's is NaN,
    infinities equal); other leaves equal."""
    for i, (g, w, b) in enumerate(zip(flatten(got)[0], flatten(want)[0], bounds)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype not in (BF16, F16):
            np.testing.assert_array_equal(g, w, err_msg=f"leaf {i}")
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g64), np.isnan(w64), err_msg=f"leaf {i}: NaN in other places")
        same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
        with np.errstate(invalid="ignore"):  # inf - inf where both are inf (then the same)
            off = np.where(same, 0.0, np.abs(g64 - w64))
        worst = int(np.argmax(off - b)) if off.size else 0
        assert (off <= b).all(), (
            f"leaf {i}: {off.ravel()[worst]:.3g} from the oracle's {w64.ravel()[worst]:.3g} at flat index {worst}, "
            f"bound {b.ravel()[worst]:.3g} ({ulps(g, w).ravel()[worst]} ulps)"
        )


# --- the semantics, op by op ----------------------------------------------------------------------


def every_value(dtype: np.dtype) -> np.ndarray:
    """All 65,536 bit patterns of a 16-bit float dtype: every number, both infinities, NaNs."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(
    "op",
    [np.exp, np.tanh, np.log, np.sqrt, np.negative, np.abs, np.square, lambda x: x**2, lambda x: x**3],
    ids=["exp", "tanh", "log", "sqrt", "negative", "abs", "square", "pow2", "pow3"],
)
def test_elementwise_ops_are_float32_rounded_bit_for_bit_on_every_value(dtype, op):
    x = every_value(dtype)
    want = quiet(lambda: op(x.astype(np.float32)).astype(dtype))
    got = quiet(graphc.jit(op), x)
    assert got.dtype == dtype
    assert_same_bits(got, want)
    assert_same_bits(quiet(graphc.evaluate, graphc.trace(op, x), x), want)


@pytest.mark.parametrize("dtype", LOW)
def test_binary_ops_round_once_per_op(dtype):
    rng = np.random.default_rng(0)
    a = every_value(dtype)
    b = rng.permutation(a)
    for op in (np.add, np.multiply, np.divide, np.subtract, np.maximum):
        want = quiet(lambda op=op: op(a.astype(np.float32), b.astype(np.float32)).astype(dtype))
        assert_same_bits(quiet(graphc.jit(op), a, b), want)
    # two ops: rounded in between (x * y rounded, then + z rounded), not fused into one rounding
    x, y, z = (rng.standard_normal(4096).astype(dtype) for _ in range(3))
    between = ((x.astype(np.float32) * y.astype(np.float32)).astype(dtype).astype(np.float32) + z).astype(dtype)
    once = (x.astype(np.float32) * y.astype(np.float32) + z.astype(np.float32)).astype(dtype)
    assert not np.array_equal(between.view(np.uint16), once.view(np.uint16))  # the test can tell them apart
    assert_same_bits(graphc.jit(lambda x, y, z: x * y + z)(x, y, z), between)


@pytest.mark.parametrize("dtype", LOW)
def test_sums_and_matmuls_accumulate_in_float32_and_round_once(dtype):
    # 1 + 256 * tiny: a 16-bit running sum stays at 1 (each tiny addend is below half an ulp of 1)
    tiny = np.finfo(np.float16).eps / 4 if dtype == F16 else 2.0**-9
    x = np.full(257, tiny, dtype)
    x[0] = 1
    want = np.float32(1 + 256 * tiny).astype(dtype)
    assert float(want) != 1.0
    for f in (
        lambda x: x.sum(),
        lambda x: x @ np.ones(257, x.dtype),
        lambda x: x.reshape(1, -1) @ np.ones((257, 2), x.dtype),
    ):
        got = np.asarray(graphc.jit(f)(x))
        assert got.dtype == dtype and (got.astype(np.float32) == float(want)).all()
        assert (np.asarray(graphc.evaluate(graphc.trace(f, x), x)).astype(np.float32) == float(want)).all()


def test_python_floats_stay_weak_and_integers_promote_as_numpy():
    x = np.ones(3, graphc.bfloat16)
    out = graphc.jit(lambda x, i: (x * 0.5, x + np.float32(1), x * i))(x, np.arange(3, dtype=np.int8))
    assert [o.dtype for o in out] == [BF16, np.float32, BF16]


# --- the bfloat16 MLP: value and gradients under jit --------------------------------------------


@pytest.mark.parametrize("dtype", LOW)
def test_mlp_value_and_grad_under_jit_equal_the_rounded_float32_graph(dtype):
    params, x, labels = mlp_case(dtype)
    vg = graphc.value_and_grad(mlp.loss)
    loss, grads = graphc.jit(vg)(params, x, labels)
    leaves = flatten((loss, grads))[0]
    assert all(np.asarray(a).dtype == dtype for a in leaves)

    graph = graphc.trace(vg, params, x, labels)
    arrays = flatten((params, x, labels))[0]
    want, bounds = rounded_float32_run_with_bounds(graph, arrays)
    # the interpreter and the oracle call the same float32 routines on the same values
    assert_same_bits(flatten(graphc.evaluate(graph, params, x, labels))[0], want)
    # the executor within the bound of its matmuls and sums added in BLAS's order
    assert_within_bounds(leaves, want, bounds)
    # and the rounding points matter: the float32 graph rounded only at its end is another result,
    # out of the bound in bfloat16 (float16's finer ulps leave more of its sums near a boundary)
    float32_end = [np.asarray(a).astype(dtype) for a in flatten(graphc.jit(vg)(*_up_tree((params, x, labels))))[0]]
    assert any(ulps(np.asarray(g), e).max(initial=0) > 1 for g, e in zip(leaves, float32_end))
    assert outside_bounds(float32_end, want, bounds) if dtype == BF16 else True
    # a gradient 2% off is out of the bound, whichever leaf
    assert_each_leaf_off_by_2_percent_fails(want, bounds)


def _batched_loss(w, x, v):  # x [B, T, d] @ w: w's gradient is a sum over B of batched products
    return np.sum(np.tanh(x @ w) * v)


def _shared_loss(w, b, x1, x2):  # w and b used twice: their gradients are sums of two products / row sums
    return np.sum(np.tanh(x1 @ w + b) * np.tanh(x2 @ w + b))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(
    "loss, shapes",
    [(_batched_loss, [(16, 8), (8, 12, 16), (8, 12, 8)]), (_shared_loss, [(16, 8), (8,), (12, 16), (12, 16)])],
    ids=["batched", "shared"],
)
def test_no_pass_moves_a_rounding_point_of_a_16_bit_gradient(dtype, loss, shapes):
    """The batching pass's sums of products (passes/batching.py) would round once where the
    graph rounds each product: they leave 16-bit floats alone."""
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    vg = graphc.value_and_grad(loss)
    want, bounds = rounded_float32_run_with_bounds(graphc.trace(vg, *args), args)
    assert_within_bounds(flatten(graphc.jit(vg)(*args))[0], want, bounds)


def test_the_optimized_bfloat16_gpt_gradient_keeps_the_graphs_rounding_points():
    """Every pass jit runs keeps each rounding point: the optimized graph, interpreted, is the
    traced one interpreted, within the ulp a product regrouped for BLAS may move."""
    (params, tokens, targets), kwargs = gpt.example_loss_args(batch=4, seq=16, n_layer=1)
    leaves, treedef = flatten(params)
    params = unflatten(treedef, [a.astype(BF16) if a.dtype == np.float32 else a for a in leaves])
    vg = graphc.value_and_grad(gpt.lm_loss)
    traced = graphc.trace(vg, params, tokens, targets, **kwargs)
    optimized = graphc.jit(vg, static_argnames=tuple(kwargs)).compile(params, tokens, targets, **kwargs).graph
    arrays = [np.asarray(a) for a in flatten((params, tokens, targets))[0]]
    want, bounds = rounded_float32_run_with_bounds(traced, arrays)
    assert_same_bits(run_flat(traced, arrays), want)
    assert sum(np.asarray(a).dtype == BF16 for a in want) > 10
    assert_within_bounds(run_flat(optimized, arrays), want, bounds)


def _up_tree(tree):
    leaves, treedef = flatten(tree)
    return unflatten(treedef, [_up(np.asarray(a)) for a in leaves])


def test_mlp_train_step_example_runs_in_bfloat16():
    (params, x, labels), kwargs = mlp.example_train_args_bf16(batch=16, sizes=(32, 16, 8))
    new, loss = graphc.jit(mlp.train_step, static_argnames=("lr",))(params, x, labels, **kwargs)
    assert loss.dtype == BF16 and all(a.dtype == BF16 for a in flatten(new)[0])
    graph = graphc.trace(mlp.train_step, params, x, labels, **kwargs)
    want, bounds = rounded_float32_run_with_bounds(graph, flatten((params, x, labels))[0])
    assert_within_bounds((new, loss), want, bounds)


@pytest.mark.parametrize("dtype", LOW)
def test_control_flow_regions_round_their_ops_too(dtype):
    def f(x, n):
        for i in range(n):
            if x.sum() > 0:
                x = np.tanh(x) * 2.0 - i
            else:
                x = x + 1.0
        return x

    x = np.array([0.5, -0.2, 0.1], dtype)
    for n in (0, 1, 4):
        graph = graphc.trace(f, x, np.int64(n))
        assert any(node.regions for node in graph.nodes)
        got = graphc.jit(f)(x, np.int64(n))
        assert got.dtype == dtype
        # one op per step of the loop, each rounded: as the interpreter, which runs the same routines
        assert_same_bits(got, graphc.evaluate(graph, x, np.int64(n)))
        want = x.astype(np.float32)

        def r(v):
            return np.asarray(v, np.float32).astype(dtype).astype(np.float32)

        for i in range(n):  # by hand, rounding each op's result
            want = r(r(r(np.tanh(want)) * 2) - i) if r(want.sum()) > 0 else r(want + 1)
        assert_same_bits(got, want.astype(dtype))


# --- collectives and meshes -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOW)
def test_collectives_add_16_bit_partial_sums_in_float32_and_round_once(dtype):
    tiny = np.finfo(np.float16).eps / 4 if dtype == F16 else 2.0**-9
    parts = [np.array([1.0, 3.0], dtype)] + [np.array([tiny, 1.0], dtype)] * 3
    want = np.array([1 + 3 * tiny, 6.0], np.float32).astype(dtype)
    assert float(want[0]) != 1.0  # added in 16 bits, the tiny parts would vanish
    out = np.empty(2, dtype)
    sum_in_rank_order(out, parts)
    assert_same_bits(out, want)
    world = ThreadWorld(4, timeout_s=20)
    results: dict = {}
    threads = [
        threading.Thread(target=lambda d=d: results.__setitem__(d, world.comm(d).all_reduce(parts[d], (0, 1, 2, 3))))
        for d in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for d in range(4):
        assert_same_bits(results[d], want)


@pytest.mark.parametrize("dtype", [pytest.param(BF16, id="bf16"), pytest.param(F16, id="f16", marks=pytest.mark.slow)])
def test_mlp_value_and_grad_on_dp2_tp2_threads(dtype):
    params, x, labels = mlp_case(dtype)
    vg = graphc.value_and_grad(mlp.loss)
    pf = graphc.parallelize(vg, mesh="dp=2,tp=2", cache=False)
    got = pf(params, x, labels)
    leaves = [np.asarray(a) for a in flatten(got)[0]]
    assert all(a.dtype == dtype for a in leaves)
    # the device programs' own semantics (each op in float32 rounded, collectives adding in float32)
    compiled = pf.compile(params, x, labels)
    program = compiled.partitioned.lowered
    inputs = program.shard_inputs([np.asarray(a) for a in flatten((params, x, labels))[0]])
    assert_within_ulps(leaves, program.gather_outputs(simulate(program, inputs)), 1)
    # against one device: a sum split over the mesh is rounded once per partial sum and once more
    single = flatten(graphc.jit(vg)(params, x, labels))[0]
    assert_normwise_close_low(leaves, single, terms=x.shape[0], dtype=dtype)


@pytest.mark.parametrize(
    "mesh, options",
    [
        pytest.param("pp=2", {"microbatches": 2}, id="pp2-microbatches2"),
        pytest.param("dp=2", {"zero": 2}, id="dp2-zero2", marks=pytest.mark.slow),
    ],
)
def test_a_bfloat16_train_step_with_float32_layers_on_pipelines_and_zero(mesh, options):
    (params, x, labels), kwargs = mlp.example_train_args_bf16(batch=32, sizes=(24, 16, 16, 6))
    params["layers"][-1] = {k: a.astype(np.float32) for k, a in params["layers"][-1].items()}  # mixed
    step = graphc.parallelize(mlp.train_step, mesh=mesh, static_argnames=("lr",), cache=False, **options)
    got = [
        np.asarray(a.gather(0) if isinstance(a, graphc.ShardedArray) else a)
        for a in flatten(step(params, x, labels, **kwargs))[0]
    ]
    want = flatten(graphc.jit(mlp.train_step, static_argnames=("lr",))(params, x, labels, **kwargs))[0]
    assert [a.dtype for a in got] == [np.asarray(a).dtype for a in want]
    assert {a.dtype for a in got} == {BF16, np.dtype(np.float32)}
    # micro-batches add their gradients in bfloat16: the batch's sum is rounded once per micro-batch
    assert_normwise_close_low(
        [a.astype(np.float32) for a in got], [np.asarray(a, np.float32) for a in want], terms=32, dtype=BF16
    )


def assert_normwise_close_low(got, want, terms: int, dtype: np.dtype) -> None:
    """As tests/helpers.assert_normwise_close, with the eps of the 16-bit ``dtype`` the results
    were computed in: two computations rounding at other points, each within about terms * eps
    of the exact result normwise."""
    eps = float(ml_dtypes.finfo(dtype).eps)
    g = np.concatenate([np.asarray(a, np.float64).ravel() for a in got])
    w = np.concatenate([np.asarray(a, np.float64).ravel() for a in want])
    assert np.linalg.norm(g - w) <= 2 * terms * eps * np.linalg.norm(w)


# --- random graphs ----------------------------------------------------------------------------------

RANDOM_OPS = [  # every sampler of tests/graphgen.py but control flow, fused regions, random and sharding ops
    "abs", "add", "argmax", "broadcast_to", "compare", "concatenate", "convert", "cos", "div", "dynamic_slice",
    "dynamic_update_slice", "einsum", "exp", "expm1", "gather", "log", "log1p", "matmul", "maximum", "minimum",
    "mul", "neg", "pad", "pow", "reduce_max", "reduce_min", "reduce_sum", "reshape", "scatter", "scatter_add",
    "sign", "sin", "slice", "split", "sqrt", "sub", "tanh", "transpose", "where",
]  # fmt: skip


@st.composite
def low_float_graphs(draw):
    """A random float32 graph (tests/graphgen.py, size-0 and size-1 dims included) rebuilt in a
    16-bit dtype; None where an op of it takes no 16-bit float."""
    dtype = draw(st.sampled_from([BF16, F16]))
    graph = draw(random_graphs(max_nodes=8, ops=RANDOM_OPS, input_dtypes=[np.dtype(np.float32)], min_dim=0))
    return with_dtypes(graph, {np.dtype(np.float32): dtype})


@pytest.mark.fuzz
@settings(fuzz_settings(60), suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(low_float_graphs(), st.integers(0, 2**16))
def test_random_16_bit_graphs_equal_their_rounded_float32_twin(graph, seed):
    if graph is None:
        return
    inputs = random_inputs(graph, seed)
    want, bounds = quiet(rounded_float32_run_with_bounds, graph, inputs)
    assert_same_bits(flatten(quiet(graphc.evaluate, graph, *inputs))[0], want)
    # the executor, on the graph as it is and as optimized (no pass may move a rounding point)
    assert_within_bounds(quiet(Executable(graph).run_flat, inputs), want, bounds)
    assert_within_bounds(quiet(Executable(graphc.optimize(graph, verify=True)).run_flat, inputs), want, bounds)


@needs_mpi
@pytest.mark.parametrize(
    "dtype", [pytest.param("bf16", id="bf16"), pytest.param("f16", id="f16", marks=pytest.mark.slow)]
)
def test_mlp_value_and_grad_under_mpiexec_n_4_gives_the_threaded_bits(tmp_path_factory, monkeypatch, dtype):
    base = tmp_path_factory.mktemp("mpi")  # the cache the threaded run fills and the ranks read
    env = dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(base / "cache"), GRAPHC_PROFILE=str(base / "no-profile.json")
    )
    monkeypatch.setenv("GRAPHC_CACHE_DIR", env["GRAPHC_CACHE_DIR"])
    monkeypatch.setenv("GRAPHC_PROFILE", env["GRAPHC_PROFILE"])
    params, x, labels = mlp_case(BF16 if dtype == "bf16" else F16)
    threaded = flatten(graphc.parallelize(graphc.value_and_grad(mlp.loss), mesh="dp=2,tp=2")(params, x, labels))[0]
    out = base / "out.npz"
    res = mpirun(4, sys.executable, JOBS, "low_float", dtype, "dp=2,tp=2", str(out), env=env)
    assert res.returncode == 0, res.stderr
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", res.stdout)) == [0, 1, 2, 3], res.stdout
    got = np.load(out)
    for i, want in enumerate(threaded):
        want = np.asarray(want)
        assert got[f"leaf_{i}"].tobytes() == want.view(np.uint16).tobytes(), f"leaf {i}: other bits than threads"


# under mpi: 12 s loaded (bfloat16 under mpiexec runs in the full run: test_mlp_value_and_grad_under_mpiexec_n_4...)
@pytest.mark.parametrize("backend", ["threads", pytest.param("mpi", marks=[needs_mpi, pytest.mark.long])])
def test_graphc_run_checks_a_bfloat16_model_against_the_interpreter(tmp_path, backend):
    env = dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json")
    )
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    target = ("models/mlp.py:train_step", "--example", "example_train_args_bf16", "--mesh", "dp=2,tp=2")
    cli = [sys.executable, "-m", "graphc.cli", "run", *target, "--repeat", "1"]
    if backend == "mpi":
        assert MPIEXEC is not None
        cli = [MPIEXEC, "-n", "4", *cli, "--backend", "mpi"]
    res = subprocess.run(cli, cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "result equals graphc's interpreter: yes" in res.stdout


@pytest.mark.parametrize("dtype", LOW)
def test_a_16_bit_einsum_contraction_is_a_float32_gemm_rounded(dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((8, 64, 48)).astype(dtype)
    b = rng.standard_normal((8, 48, 40)).astype(dtype)

    def contract(a, b):
        return np.einsum("bij,bjk->bik", a, b)

    got = graphc.jit(contract)(a, b)
    want = np.einsum("bij,bjk->bik", a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    assert got.dtype == dtype
    # BLAS adds the 48 products in an order of its own: 2 gamma_48 |a| @ |b| apart before rounding
    (oracle,), (bound,) = rounded_float32_run_with_bounds(graphc.trace(contract, a, b), [a, b])
    assert_same_bits(oracle, want)
    assert_within_bounds([got], [want], [bound])
    assert ulps(got, want).max() <= 1 and bound.max() > 0  # one rounding: at most the one boundary
    types = [TensorType(a.shape, dtype), TensorType(b.shape, dtype)]
    assert isinstance(einsum_step("bij,bjk->bik", types), BlasEinsum)


@needs_mpi
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_every_collective_on_16_bit_floats_gives_the_threaded_bits_under_mpiexec(dtype):
    res = mpirun(4, sys.executable, JOBS, "collectives", dtype, env=dict(os.environ), timeout=120)
    assert res.returncode == 0, res.stderr
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", res.stdout)) == [0, 1, 2, 3], res.stdout
