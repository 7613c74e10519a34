"""The single-device executor and graphc.jit against the reference interpreter and numpy."""

import importlib
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphc
from runtime.executor import Executable
from tests.graphgen import random_graphs, random_inputs
from tests.helpers import assert_same_pytree

MODELS = [
    ("models.mlp", "mlp", "example_args"),
    ("models.mlp", "train_step", "example_train_args"),
    ("models.gpt", "gpt", "example_args"),
    ("models.gpt", "lm_loss", "example_loss_args"),
    ("models.cnn", "cnn", "example_args"),
    ("models.cnn", "train_step", "example_train_args"),
]


@pytest.mark.parametrize("module, func, example", MODELS)
def test_jit_matches_numpy_on_models(module, func, example):
    mod = importlib.import_module(module)
    fn = getattr(mod, func)
    args, kwargs = getattr(mod, example)()
    jitted = graphc.jit(fn)
    assert_same_pytree(jitted(*args, **kwargs), fn(*args, **kwargs))
    assert jitted.compile(*args, **kwargs).stats()["fused_kernels"] > 0


def test_jit_gpt_train_step_matches_the_interpreter():
    from models import gpt

    args, kwargs = gpt.example_train_args()
    jitted = graphc.jit(gpt.train_step, static_argnames=("n_head",))
    compiled = jitted.compile(*args, **kwargs)
    kw = {k: v for k, v in kwargs.items() if k != "n_head"}  # the traced graph has n_head baked in
    want = graphc.evaluate(compiled.traced, *args, **kw)
    got = jitted(*args, **kwargs)
    assert float(got[-1]) == pytest.approx(float(want[-1]), rel=1e-5)
    np.testing.assert_allclose(got[0]["blocks"][0]["mlp"]["c_fc"]["w"], want[0]["blocks"][0]["mlp"]["c_fc"]["w"],
                               rtol=1e-4, atol=1e-6)


def test_jit_caches_by_shape_dtype_and_static_values():
    calls = []

    def f(x, scale, mode="a"):
        calls.append(1)
        return x * scale if mode == "a" else x - scale

    jitted = graphc.jit(f)
    x = np.ones(3, np.float32)
    jitted(x, 2.0)
    jitted(x + 1, 2.0)
    assert len(calls) == 1
    jitted(x, 3.0)  # a new static value
    jitted(np.ones(4, np.float32), 2.0)  # a new shape
    jitted(np.ones(3), 2.0)  # a new dtype
    np.testing.assert_array_equal(jitted(x, 2.0, mode="b"), x - 2.0)
    assert len(calls) == 5


def test_static_argnames_make_array_arguments_static():
    def f(x, n):
        return x * n if n > 2 else x

    jitted = graphc.jit(f, static_argnames="n")
    x = np.arange(3.0)
    np.testing.assert_array_equal(jitted(x, np.int64(3)), x * 3)
    np.testing.assert_array_equal(jitted(x, n=1), x)
    with pytest.raises(graphc.GraphcError, match="has no parameter 'm'"):
        graphc.jit(f, static_argnames=("m",))(x, 1)


def test_decorator_form():
    @graphc.jit
    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    want = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(softmax(x), want / want.sum(-1, keepdims=True), rtol=1e-6)


def quiet(fn, *args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args)


@settings(max_examples=60, deadline=None)
@given(random_graphs(max_nodes=10, ops=["add", "mul", "sub", "div", "exp", "tanh", "maximum", "where", "compare",
                                        "convert", "reduce_sum", "reduce_max", "sqrt", "neg", "abs", "reshape",
                                        "matmul", "constant"], input_dtypes=[np.dtype(np.float32), np.dtype(np.float64)]),
       st.integers(0, 100))
def test_executor_matches_interpreter_on_random_graphs(graph, seed):
    optimized = graphc.optimize(graph, verify=True)
    inputs = random_inputs(graph, seed)
    want = quiet(graphc.evaluate, graph, *inputs)
    got = quiet(Executable(optimized).run_flat, inputs)
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5, equal_nan=True)
        else:
            np.testing.assert_array_equal(a, b)


def test_control_flow_runs_on_the_executor():
    def f(x, n):
        for i in range(n):
            if x.sum() > 0:
                x = np.tanh(x) * 2.0 - i
            else:
                x = x + 1.0
        return x

    jitted = graphc.jit(f)
    x = np.array([0.5, -0.2, 0.1])
    for n in (0, 1, 4):
        np.testing.assert_allclose(jitted(x, np.int64(n)), f(x, n), rtol=1e-12)


def test_buffers_are_reused_on_warm_runs():
    from models import gpt

    args, kwargs = gpt.example_args()
    compiled = graphc.jit(gpt.gpt, static_argnames=("n_head",)).compile(*args, **kwargs)
    compiled(*args, **kwargs)
    pool = compiled.executable.pool
    allocated = pool.allocated
    compiled(*args, **kwargs)
    assert pool.reused > 0
    assert pool.allocated - allocated < allocated  # the warm run allocates less than the first


def test_results_are_not_recycled_between_calls():
    jitted = graphc.jit(lambda x: (np.tanh(x) * 2.0, np.exp(x) + 1.0))
    a1, b1 = jitted(np.ones(5))
    a1_copy = a1.copy()
    jitted(np.zeros(5))
    np.testing.assert_array_equal(a1, a1_copy)


def test_second_process_loads_kernels_from_the_disk_cache(tmp_path):
    script = (
        "import numpy as np, graphc\n"
        "f = graphc.jit(lambda x: np.tanh(x * 3.0 + 1.0) * x)\n"
        "c = f.compile(np.ones((4, 8), np.float32))\n"
        "c(np.ones((4, 8), np.float32))\n"
        "k = c.executable.program.steps[0][0].func\n"
        "print(k.stats.cache_hits.__len__() if hasattr(k.stats.cache_hits, '__len__') else 0, sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n"
    )
    env = dict(os.environ, GRAPHC_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    _, hits1, misses1 = map(int, first.stdout.split())
    _, hits2, misses2 = map(int, second.stdout.split())
    assert hits1 == 0 and misses1 >= 1  # compiled in the first process
    assert hits2 >= 1 and misses2 == 0  # loaded from the cache in the second
