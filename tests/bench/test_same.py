"""``same`` (graphc/bench/timing.py), the check behind "result equals ..." of ``graphc run`` and the
benches, with the bounds the computation gives (``result_bounds``, graphc/bench/bounds.py) instead
of fixed tolerances. Before, a 16-bit result was allowed 8 ulps at its leaf's largest magnitude and
a float32 one 1e-4: a correct bfloat16 run returning ``np.sum(g)`` of gradients whose terms are far
larger than their cancelling sum was called "no", and a float32 result of 1e-6 could be 50% off and
called "yes". Each test runs a step on a mesh as ``graphc run`` does and compares it with its
baseline: correct runs say "yes", runs with a realistic mistake injected (a dropped partial sum, a
wrong sharding, a swapped operand) say "no"."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.bench import bounds
from graphc.bench.timing import result_bounds, same
from graphc.core.dtypes import is_low_float
from graphc.core.pytree import flatten
from graphc.core.traits import Collective, DeviceLocal
from graphc.models import gpt, mlp
from graphc.ops import REGISTRY

BF16 = np.dtype(graphc.bfloat16)
DTYPES = [
    pytest.param(BF16, id="bf16"),
    pytest.param(np.dtype(np.float16), id="f16"),
    pytest.param(np.dtype(np.float32), id="f32"),
    pytest.param(np.dtype(np.float64), id="f64"),
]


def loss(w, x, v):  # w [d, d], x [B, d], v [B, d]
    return np.sum(np.tanh(x @ w) * v)


def grad_step(w, x, v):
    """The gradient and its sum: a sum over the batch (split over dp) of terms that cancel."""
    g = graphc.grad(loss)(w, x, v)
    return g, np.sum(g)


def value_and_grad_step(w, x, v):
    return graphc.value_and_grad(loss)(w, x, v)


def example(dtype, batch=64, d=32, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((d, d)) / np.sqrt(max(d, 1))).astype(dtype)
    x = rng.standard_normal((batch, d)).astype(dtype)
    v = rng.standard_normal((batch, d)).astype(dtype)
    return w, x, v


def run(fn, args, mesh="dp=2", **options):
    """(the run's results, the baseline's, their bounds) as ``graphc run`` gets them: the baseline is
    the function called directly, or graphc's interpreter on the graph for a 16-bit step."""
    pf = graphc.parallelize(fn, mesh=mesh, cache=False, **options)
    compiled = pf.compile(*args)
    limits = result_bounds(compiled.graph, args, {}, pf.mesh.shape, getattr(compiled.plan, "m", 1))
    got = [np.asarray(a.gather(0) if isinstance(a, graphc.ShardedArray) else a) for a in flatten(pf(*args))[0]]
    low = any(is_low_float(np.asarray(a).dtype) for a in args)
    want = [np.asarray(a) for a in flatten(graphc.evaluate(compiled.graph, *args) if low else fn(*args))[0]]
    return got, want, limits


def interpreted(fn, *args):
    return [np.asarray(a) for a in flatten(graphc.evaluate(graphc.trace(fn, *args), *args))[0]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_correct_run_with_a_cancelling_sum_says_yes_and_injected_mistakes_say_no(dtype):
    w, x, v = example(dtype)
    got, want, limits = run(grad_step, (w, x, v))
    g, total = (a.astype(np.float64) for a in want)
    assert abs(total) < np.abs(g).sum() / 50  # the sum cancels: its terms are far larger than it
    assert same(got, want, limits) == "yes"
    half = x.copy()
    half[len(x) // 2 :] = 0  # one device's partial gradient, the other's dropped
    mistakes = {
        "dropped partial sum": interpreted(grad_step, w, half, v),
        "wrong sharding": [np.roll(want[0], len(w) // 2, axis=0), want[1]],  # the two row halves swapped
        "swapped operand": interpreted(grad_step, w.T.copy(), x, v),
    }
    for what, wrong in mistakes.items():
        assert same(wrong, want, limits).startswith("no (max abs diff"), what


@pytest.mark.parametrize("dtype", [pytest.param(BF16, id="bf16"), pytest.param(np.dtype(np.float32), id="f32")])
@pytest.mark.parametrize("batch, d", [(2, 1), (64, 1), (0, 4), (4, 0)])
def test_size_0_and_size_1_dims(dtype, batch, d):
    got, want, limits = run(grad_step, example(dtype, batch, d))
    assert same(got, want, limits) == "yes"
    assert all(b.shape == np.shape(w) for b, w in zip(limits, want))


@pytest.mark.parametrize("dtype", DTYPES[:3])
@pytest.mark.parametrize("mesh, microbatches", [("dp=2", 2), ("pp=2", 4)])
def test_micro_batched_steps(dtype, mesh, microbatches):
    got, want, limits = run(value_and_grad_step, example(dtype), mesh, microbatches=microbatches)
    assert same(got, want, limits) == "yes"
    wrong = [want[0], (want[1].astype(np.float64) * 2).astype(dtype)]  # a gradient summed twice
    assert same(wrong, want, limits).startswith("no (max abs diff")


def test_a_16_bit_sum_split_over_devices_needs_the_partial_sums_rounding():
    """Without the rounding of each device's partial sum (Freedom.split_levels) a correct bfloat16
    MLP gradient on tp=2 would be called wrong: that term is not slack."""
    (params, x, labels), _ = mlp.example_loss_args(batch=64)
    params = {"layers": [{k: a.astype(BF16) for k, a in layer.items()} for layer in params["layers"]]}
    args = (params, x.astype(BF16), labels)
    vg = graphc.value_and_grad(mlp.loss)
    pf = graphc.parallelize(vg, mesh="tp=2", cache=False)
    compiled = pf.compile(*args)
    got = [np.asarray(a.gather(0) if isinstance(a, graphc.ShardedArray) else a) for a in flatten(pf(*args))[0]]
    want = [np.asarray(a) for a in flatten(graphc.evaluate(compiled.graph, *args))[0]]
    arrays = flatten(args)[0]
    split = bounds.reference_with_spreads(compiled.graph, arrays, bounds.freedom_of_run(pf.mesh.shape, 1))[1]
    one_device = bounds.reference_with_spreads(compiled.graph, arrays, bounds.Freedom(op_eps=bounds.REGROUPED_OP_EPS))
    assert same(got, want, split) == "yes"
    assert same(got, want, one_device[1]).startswith("no (max abs diff")


def test_a_long_float32_reduction_and_a_small_result():
    """float32 dot products of 65,536 terms of size 300: split over two devices they move by far
    more than the old 1e-4, as numerical analysis says they may (about sqrt(K) eps sum|terms|);
    the same sums scaled to results near 1e-7 are held to their own scale, where 1e-4 hid a
    result 50% off."""

    def dot(a, b):  # [K, n], [K, n] -> [n]
        return np.sum(a * b, axis=0)

    rng = np.random.default_rng(0)
    a = (rng.standard_normal((1 << 16, 4)) * 300).astype(np.float32)
    b = rng.standard_normal((1 << 16, 4)).astype(np.float32)
    got, want, limits = run(dot, (a, b))
    assert same(got, want, limits) == "yes"
    a_half = a.copy()
    a_half[len(a) // 2 :] = 0
    assert same([dot(a_half, b)], want, limits).startswith("no (max abs diff")  # a dropped partial sum
    small = (a * np.float32(1e-5), b * np.float32(1e-5))
    got, want, limits = run(dot, small)
    assert np.abs(want[0]).max() < 1e-4
    assert same(got, want, limits) == "yes"
    wrong = [got[0] * np.float32(1.5)]
    assert np.allclose(wrong[0], want[0], rtol=1e-4, atol=1e-4)  # the old tolerance called it "yes"
    assert same(wrong, want, limits).startswith("no (max abs diff")


def test_same_compares_only_floats_and_says_why_not():
    ints = np.arange(4)
    zero = [np.zeros(4)]
    assert same([ints + 1], [ints], zero) == "yes"  # as before: integers are not compared
    assert same([np.ones(3, np.float32)], [np.ones(4, np.float32)], zero) == "no (float32(3,) vs float32(4,))"
    nan = np.array([np.nan, 1.0])
    assert same([nan], [nan], [np.zeros(2)]) == "yes"  # NaN where the baseline has NaN
    verdict = same([np.array([1.0, 1.0])], [nan], [np.zeros(2)])
    assert verdict.startswith("no (max abs diff") and "1 of 2 elements of result 0" in verdict
    assert same([np.ones(2), np.ones(2)], [np.ones(2)], zero) == "no (2 results vs 1)"


def test_every_op_of_a_single_device_graph_has_a_bound_rule():
    """Only a device program's ops (collectives, a device's own piece) have none: a run is
    checked against the graph before partitioning."""
    device_only = {name for name, op in REGISTRY.items() if not bounds.has_bound_rule(op)}
    assert all(REGISTRY[name].has(Collective) or REGISTRY[name].has(DeviceLocal) for name in device_only)
    assert "all_reduce" in device_only and "matmul" not in device_only


def test_the_functions_with_formulas_of_their_own_are_the_fused_kernels_fast_functions():
    """bounds.OWN_FORMULAS names runtime/fastmath.py's functions (not imported there: numba)."""
    from graphc.runtime import fastmath

    assert bounds.OWN_FORMULAS == set(fastmath.FUNCTIONS)


def test_control_flow_carries_the_bounds_through_its_regions():
    def f(x, n):
        for _ in range(n):
            x = x @ x.T / 4.0 if x.sum() > 0 else x * 2.0
        return x

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    graph = graphc.trace(f, x, np.int64(3))
    assert any(node.regions for node in graph.nodes)
    values, limits = bounds.reference_with_spreads(graph, [x, np.asarray(3)], bounds.freedom_of_run((2,), 1))
    np.testing.assert_array_equal(values[0], graphc.evaluate(graph, x, np.int64(3)))
    assert (limits[0] > 0).all()  # the matmuls inside the loop reorder their sums


def test_a_float32_gpt_gradient_on_dp2_tp2_keeps_bounds_that_tell_every_leaf_halved():
    """Through a transformer's backward the bounds stay far below the values: a sum's magnitude
    twin starts again at each contraction (carried through them all, it grew as the product of
    |W| over the layers and allowed any value in half of the gradient's leaves)."""
    (params, tokens, targets), kwargs = gpt.example_loss_args()
    vg = graphc.value_and_grad(gpt.lm_loss)
    pf = graphc.parallelize(vg, mesh="dp=2,tp=2", static_argnames=tuple(kwargs), cache=False)
    compiled = pf.compile(params, tokens, targets, **kwargs)
    dyn_args, dyn_kwargs, _ = pf.split_static((params, tokens, targets), kwargs)
    limits = result_bounds(compiled.graph, dyn_args, dyn_kwargs, pf.mesh.shape, 1)
    run = pf(params, tokens, targets, **kwargs)
    got = [np.asarray(a.gather(0) if isinstance(a, graphc.ShardedArray) else a) for a in flatten(run)[0]]
    want = [np.asarray(a) for a in flatten(vg(params, tokens, targets, **kwargs))[0]]
    assert same(got, want, limits) == "yes"
    for i, w in enumerate(want):  # a gradient (or the loss) half what it is: a dropped partial sum
        wrong = [*want[:i], (w.astype(np.float64) * 0.5).astype(w.dtype), *want[i + 1 :]]
        assert same(wrong, want, limits).startswith("no (max abs diff"), i
