"""Real-model styles of issue 32 items 7 and 8 (tests/models/real_models/): a CNN written with
Python loops over windows (Numpy-CNN), whose max-pool backward uses np.nanargmax and
np.unravel_index; and KV-cache generation loops that must not re-plan for every token."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profiles import MachineProfile
from graphc.passes import partition
from tests.models.real_models import kv_cache, kv_cache_masked, numpy_cnn

pytestmark = pytest.mark.filterwarnings("ignore::graphc.PromotionWarning")


def close(got, want, rtol=1e-9, atol=1e-12):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)
    assert np.asarray(got).shape == np.asarray(want).shape and np.asarray(got).dtype == np.asarray(want).dtype


# --- a CNN from loops over windows ----------------------------------------------------------------


def cnn_data(size=8, seed=1):
    params = numpy_cnn.make_params(n_f=2, size=size)
    rng = np.random.default_rng(seed)
    image = rng.standard_normal((1, size, size))
    pooled = (size - 3 + 1) // 2
    return params, image, rng.standard_normal((2, pooled, pooled))


@pytest.mark.slow
def test_cnn_from_windows_forward_and_pool_backward_equal_numpys():
    params, image, dpool = cnn_data()
    close(graphc.jit(numpy_cnn.forward)(image, params), numpy_cnn.forward(image, params))
    want = numpy_cnn.pool_gradient(image, params, dpool)
    assert np.count_nonzero(want) > 0
    np.testing.assert_array_equal(graphc.jit(numpy_cnn.pool_gradient)(image, params, dpool), want)
    # a window with a NaN: nanargmax skips it, as numpy's does
    image[0, 0, 0] = np.nan
    got = graphc.jit(numpy_cnn.pool_gradient)(image, params, dpool)
    np.testing.assert_array_equal(got, numpy_cnn.pool_gradient(image, params, dpool))


def test_cnn_from_windows_gradient_and_mesh():
    params, image, _ = cnn_data(size=6)

    def loss(params, image):
        return -np.log(numpy_cnn.forward(image, params)[3, 0])

    value, grads = graphc.value_and_grad(loss)(params, image)
    close(value, loss(params, image))
    eps, w = 1e-6, params[2]
    direction = np.random.default_rng(5).standard_normal(w.shape)
    plus = [*params[:2], w + eps * direction, params[3]]
    minus = [*params[:2], w - eps * direction, params[3]]
    numeric = (loss(plus, image) - loss(minus, image)) / (2 * eps)
    np.testing.assert_allclose(np.sum(grads[2] * direction), numeric, rtol=1e-6)
    on_mesh = graphc.parallelize(
        numpy_cnn.forward, mesh=Mesh({"dp": 2, "tp": 2}, profile=MachineProfile.default()), cache=False
    )
    close(on_mesh(image, params), numpy_cnn.forward(image, params), rtol=1e-12, atol=1e-15)


# --- KV-cache generation without re-planning every token -------------------------------------------

PROMPT = np.array([[1, 5, 7], [2, 3, 9]])


def counting_solver(monkeypatch) -> list[int]:
    """Counts the calls of the sharding ILP's solver (every plan that is not reused calls it once)."""
    calls = [0]
    solve = partition.solve_problem

    def counted(*args, **kwargs):
        calls[0] += 1
        return solve(*args, **kwargs)

    monkeypatch.setattr(partition, "solve_problem", counted)
    return calls


def test_growing_cache_slices_reuse_the_plan_without_the_solver(monkeypatch):
    """llama3.np's ``cache[:B, : start_pos + L]``: a new specialization every token, equal to the
    last up to dim sizes: the prompt and the first token are solved, the rest reuse their choices."""
    calls = counting_solver(monkeypatch)
    weights = kv_cache.make_weights(kv_cache.ARGS)
    want = kv_cache.Llama(weights, kv_cache.ARGS).generate(PROMPT, 8)
    model = kv_cache.Llama(weights, kv_cache.ARGS)
    step = graphc.parallelize(model.forward, mesh={"tp": 2}, cache=False, static_argnames=("start_pos",))
    np.testing.assert_array_equal(model.generate(PROMPT, 8, forward=step), want)
    assert calls[0] <= 2
    reused = step.plan(PROMPT[:, :1], 9)
    assert reused.solver.status == "reused" and calls[0] <= 2
    assert reused.graph_hash != step.plan(PROMPT[:, :1], 8).graph_hash  # another graph, same choices


def test_reused_choices_are_rechecked_for_divisibility_and_memory(monkeypatch):
    """A choice that no longer divides (a dim sharded on tp=2 becomes odd) or no longer fits the
    memory limit is solved again, never reused."""
    calls = counting_solver(monkeypatch)

    def layer(x, w):
        return np.tanh(x @ w) @ w.T

    w = np.random.default_rng(0).standard_normal((8, 64))
    step = graphc.parallelize(layer, mesh={"tp": 2}, cache=False)
    x = np.ones((4, 8))
    first = step.plan(x, w)
    assert calls[0] == 1 and first.node_choices()[0].strategy == "m@tp"  # x's rows sharded on tp
    again = step.plan(np.ones((6, 8)), w)
    assert again.solver.status == "reused" and calls[0] == 1
    assert again.node_choices()[0].strategy == "m@tp" and again.memory.peak_bytes > first.memory.peak_bytes
    close(step(np.ones((6, 8)), w), layer(np.ones((6, 8)), w))
    odd = np.random.default_rng(1).standard_normal((5, 8))  # 5 rows do not divide by 2
    plan = step.plan(odd, w)
    assert plan.solver.status == "optimal" and calls[0] == 2
    close(step(odd, w), layer(odd, w), rtol=1e-12, atol=1e-12)
    # a memory limit the reused choices do not fit
    tight = graphc.parallelize(layer, mesh={"tp": 2}, cache=False, memory_limit=first.memory.peak_bytes[0] * 4)
    tight.plan(x, w)
    assert calls[0] == 3
    big = np.ones((4096, 8))
    try:
        plan = tight.plan(big, w)
    except graphc.PlanError:  # nothing fits: the solver says so
        plan = None
    assert calls[0] == 4 and (plan is None or plan.solver.status != "reused")
    assert step.plan(big, w).solver.status == "reused" and calls[0] == 4  # without the limit: reused


def test_a_reused_plan_says_so_with_the_figures_of_the_solve_it_came_from():
    """``step(x)`` then ``step.plan(x)`` without a plan cache: the second plan reuses the first's
    choices; its summary says the solver did not run and gives that solve's figures (it printed
    "reused, ..., gap 100.00%, ? variables / ? constraints", which read like a failed solve)."""

    def layer(x, w):
        return np.tanh(x @ w) @ w.T

    x, w = np.ones((4, 8)), np.random.default_rng(0).standard_normal((8, 64))
    step = graphc.parallelize(layer, mesh={"tp": 2}, cache=False)
    first = step.plan(x, w)
    again = step.plan(x, w)
    assert first.solver.status == "optimal" and again.solver.status == "reused"
    line = next(ln for ln in again.summary().splitlines() if ln.startswith("solver"))
    sizes = first.solver.sizes
    assert "not run" in line and "reused" in line and "?" not in line, line
    assert f"that solve: optimal, gap {first.solver.gap:.2%}, {sizes['variables']} variables / " in line, line
    assert f"{sizes['constraints']} constraints" in line, line
    third = step.plan(np.ones((6, 8)), w)  # reused again: still the first solve's figures
    assert third.solver.status == "reused" and f"{sizes['variables']} variables" in third.summary()


def test_full_length_cache_under_a_mask_plans_once_for_every_decode_step(monkeypatch):
    """kv_cache_masked.py: ``start_pos`` only places the new keys and masks the rest, so after the
    prompt (``start_pos`` 0, static on the first call) the int is traced: one plan for every
    decode step, and numpy's tokens and caches."""
    calls = counting_solver(monkeypatch)
    weights = kv_cache.make_weights(kv_cache.ARGS)
    theirs = kv_cache_masked.Llama(weights, kv_cache.ARGS)
    want = theirs.generate(PROMPT, 8)
    np.testing.assert_array_equal(want, kv_cache.Llama(weights, kv_cache.ARGS).generate(PROMPT, 8))
    model = kv_cache_masked.Llama(weights, kv_cache.ARGS)
    step = graphc.parallelize(model.forward, mesh={"tp": 2}, cache=False)
    np.testing.assert_array_equal(model.generate(PROMPT, 8, forward=step), want)
    assert calls[0] == 2 and len(step._compiled) == 2 and step.static.traced_ints == {"start_pos"}
    for mine, numpys in zip(model.layers, theirs.layers):
        close(mine.attention.cache_k, numpys.attention.cache_k, 1e-5, 1e-6)
    jitted_model = kv_cache_masked.Llama(weights, kv_cache.ARGS)
    jitted = graphc.jit(jitted_model.forward)
    np.testing.assert_array_equal(jitted_model.generate(PROMPT, 8, forward=jitted), want)
    assert len(jitted._cache) == 2
    # a position past the cache: numpy writes into an empty slice (nothing); the traced start
    # cannot give that shape, and raises when the graph runs rather than write somewhere else
    with pytest.raises(IndexError):
        jitted(PROMPT[:, :1], kv_cache.ARGS["max_seq_len"])


def test_growing_cache_slices_keep_start_pos_static():
    """llama3.np's ``cache[:B, : start_pos + L]`` needs start_pos as a Python int (a shape): the
    traced attempt fails and it stays static, with numpy's tokens."""
    weights = kv_cache.make_weights(kv_cache.ARGS)
    model = kv_cache.Llama(weights, kv_cache.ARGS)
    jitted = graphc.jit(model.forward)
    want = kv_cache.Llama(weights, kv_cache.ARGS).generate(PROMPT, 5)
    np.testing.assert_array_equal(model.generate(PROMPT, 5, forward=jitted), want)
    assert jitted.static.static_ints == {"start_pos"} and len(jitted._cache) == 5
