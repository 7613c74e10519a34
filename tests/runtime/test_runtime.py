"""The single-device executor and graphc.jit against the reference interpreter and numpy."""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphc
from graphc.runtime.executor import Executable
from tests.graphgen import random_graphs, random_inputs
from tests.helpers import assert_adam_step_close, assert_arrays_close, assert_product_close, assert_same_pytree, quiet

MODELS = [
    ("graphc.models.mlp", "mlp", "example_args"),
    ("graphc.models.mlp", "train_step", "example_train_args"),
    ("graphc.models.gpt", "gpt", "example_args"),
    ("graphc.models.gpt", "lm_loss", "example_loss_args"),
    ("graphc.models.cnn", "cnn", "example_args"),
    ("graphc.models.cnn", "train_step", "example_train_args"),
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
    from graphc.models import gpt

    args, kwargs = gpt.example_train_args()
    jitted = graphc.jit(gpt.train_step, static_argnames=("n_head",))
    compiled = jitted.compile(*args, **kwargs)
    kw = {k: v for k, v in kwargs.items() if k != "n_head"}  # the traced graph has n_head baked in
    want = graphc.evaluate(compiled.traced, *args, **kw)
    got = jitted(*args, **kwargs)
    assert_adam_step_close(got, want, lr=kwargs["lr"], terms=4 * 64)  # the longest sum: the MLP's 4d products


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
    np.testing.assert_array_equal(jitted(x, 3.0), x * 3)  # a Python float is traced: no recompile
    assert len(calls) == 1
    jitted(x, 3)  # a Python int is static: a new value
    jitted(np.ones(4, np.float32), 2.0)  # a new shape
    jitted(np.ones(3), 2.0)  # a new dtype
    np.testing.assert_array_equal(jitted(x, 2.0, mode="b"), x - 2.0)  # a new static string
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
    # relative, elementwise: the kernel's exp is within 2.5e-7 of numpy's (runtime/fastmath.py), in
    # the numerator and in the sum's terms; each side's sum of 7 positive terms and its division
    # round at most 7 times
    rtol = 2 * 2.5e-7 + 2 * 7 * np.finfo(np.float32).eps
    np.testing.assert_allclose(softmax(x), want / want.sum(-1, keepdims=True), rtol=rtol)


@settings(max_examples=60, deadline=None)
@given(
    random_graphs(
        max_nodes=10,
        ops=[
            "add",
            "mul",
            "sub",
            "div",
            "exp",
            "tanh",
            "maximum",
            "where",
            "compare",
            "convert",
            "reduce_sum",
            "reduce_max",
            "sqrt",
            "neg",
            "abs",
            "reshape",
            "transpose",
            "slice",
            "pad",
            "concatenate",
            "split",
            "broadcast_to",
            "matmul",
            "constant",
        ],
        input_dtypes=[np.dtype(np.float32), np.dtype(np.float64)],
    ),
    st.integers(0, 100),
)
def test_executor_matches_interpreter_on_random_graphs(graph, seed):
    optimized = graphc.optimize(graph, verify=True)
    inputs = random_inputs(graph, seed)
    want = quiet(graphc.evaluate, graph, *inputs)
    got = quiet(Executable(optimized).run_flat, inputs)
    assert_arrays_close(got, want, 2e-5, 1e-5)


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
    from graphc.models import gpt

    # MLP activations of 2 MiB: pooled (the forward alone writes most kernel results over their
    # dying operands instead: test_kernel_results_take_over_dying_operands)
    args, kwargs = gpt.example_loss_args(batch=4, seq=64, d=512)
    compiled = graphc.jit(graphc.value_and_grad(gpt.lm_loss), static_argnames=("n_head",)).compile(*args, **kwargs)
    # The first call is no baseline: Numba compiles its kernels then (unless its cache has them),
    # which holds references to their operands, so fewer results are written in place, the peak
    # it records is higher and the pool trims less afterwards; how many buffers it allocates
    # depends on that cache. Compare two runs of the same warmed program instead: one from an
    # empty pool, then one from the buffers that run freed.
    compiled(*args, **kwargs)
    pool = compiled.executable.pool
    pool.trim(0)
    before = pool.allocated
    compiled(*args, **kwargs)
    from_empty = pool.allocated - before
    allocated, reused = pool.allocated, pool.reused
    compiled(*args, **kwargs)
    assert pool.reused > reused
    assert pool.allocated - allocated < from_empty  # the warm run allocates less


def _gelu(h):
    return 0.5 * h * (1.0 + np.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))


def test_kernel_results_take_over_dying_operands(monkeypatch):
    """A kernel whose operand dies at it, in a buffer nothing else looks into, writes its result
    over that operand (runtime/executor.py ``_call_in_place``); the values are numpy's."""
    from graphc.runtime.codegen import CompiledKernel

    given = []
    real = CompiledKernel.call_into

    def spy(self, arrays, out):
        given.extend((id(arrays[i]), id(out.get(k))) for i, k in self.in_place if k in out)
        return real(self, arrays, out)

    monkeypatch.setattr(CompiledKernel, "call_into", spy)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((512, 128)).astype(np.float32), rng.standard_normal((128, 512)).astype(np.float32)

    def mlp(x, w):
        h = x @ w  # [512, 512] float32: 1 MiB, a counted buffer (smaller programs run straight-line)
        return _gelu(h) @ w.T

    got = graphc.jit(mlp)(x, w)
    h = x @ w
    # the kernel's tanh is within ~2.5e-7 relative of numpy's (runtime/fastmath.py): 1e-6 of the scale
    assert_product_close(got, mlp(x, w), _gelu(h), w.T, extra_rel=1e-6)
    assert given and all(a == b for a, b in given)  # the operand itself became the result

    def held(x, w):
        h = x @ w
        view = h[:, :4]  # a view of h made before the kernel and read after it: h is not the kernel's
        return _gelu(h) @ w.T, view * 2.0

    given.clear()
    got = graphc.jit(held)(x, w)
    want = held(x, w)
    assert_product_close(got[0], want[0], _gelu(h), w.T, extra_rel=1e-6)
    assert_product_close(got[1], want[1], x, 2.0 * w[:, :4])
    assert not given


def test_small_arrays_skip_the_pool():
    # below executor.SMALL_BYTES the allocator recycles memory itself: no pooling, no counting
    from graphc.runtime.executor import SMALL_BYTES

    jitted = graphc.jit(lambda x, w: np.tanh(x @ w) * 2.0 + x)
    x = np.ones((8, 8), np.float32)
    assert x.nbytes < SMALL_BYTES
    compiled = jitted.compile(x, x)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x, x), np.tanh(x @ x) * 2.0 + x, rtol=1e-6)
    assert compiled.executable.pool.allocated == 0 and compiled.executable.program.high_water == 0


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
        "k = c.executable.program.kernels[0].func\n"
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


# --- regressions found in review ---------------------------------------------------------------


def test_pool_never_reuses_a_view_of_the_callers_input():
    def f(x):
        y, _ = graphc.while_loop(lambda y, i: i < 3, lambda y, i: (y * 2.0 + 1.0, i + 1), (x, np.int64(0)))
        w = x[1:] * 3.0 + 1.0
        u = w[::-1] * 5.0 + 2.0
        return y[1:] + u

    jitted = graphc.jit(f)
    for _ in range(6):
        x = np.arange(8.0).reshape(4, 2)
        jitted(x)
        np.testing.assert_array_equal(x, np.arange(8.0).reshape(4, 2))


def test_reduction_without_keepdims_is_not_a_per_row_value():
    x = np.arange(9.0).reshape(3, 3)
    np.testing.assert_array_equal(graphc.jit(lambda x: x - x.sum(-1))(x), x - x.sum(-1))
    a, y = np.ones((2, 3, 4)), np.arange(3.0).reshape(3, 1)
    f = lambda x, y: np.exp(x - (x.max(-1, keepdims=True) + y))  # noqa: E731
    np.testing.assert_allclose(graphc.jit(f)(a, y), f(a, y))


def test_static_values_are_keyed_by_type_and_bits():
    x = np.arange(3)
    jitted = graphc.jit(lambda x, s: x * s, static_argnames="s")
    assert jitted(x, 2).dtype == np.int64 and jitted(x, 2.0).dtype == np.float64
    div = graphc.jit(lambda x, s: x / s)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(div(np.ones(2), 0.0), [np.inf, np.inf])
        np.testing.assert_array_equal(div(np.ones(2), -0.0), [-np.inf, -np.inf])


def test_kernels_with_infinite_constants_zero_size_and_float16():
    f = lambda x: np.where(x > 0, x, -np.inf) + 1.0  # noqa: E731
    np.testing.assert_array_equal(graphc.jit(f)(np.array([1.0, -1.0])), [2.0, -np.inf])
    assert graphc.jit(lambda x: x * 2.0 + 1.0)(np.zeros((0, 3))).shape == (0, 3)
    h = graphc.jit(lambda x: x * np.float16(2) + np.float16(1))(np.ones(3, np.float16))
    assert h.dtype == np.float16 and (h == 3).all()


def test_products_of_constants_are_not_regrouped():
    x = np.full(2, 1e30, np.float32)
    np.testing.assert_allclose(
        graphc.jit(lambda x: x * np.float32(1e-30) * np.float32(1e-30))(x), [1e-30, 1e-30], rtol=1e-6
    )


def test_negative_integer_powers_raise_like_numpy():
    with pytest.raises(ValueError, match="negative integer powers"):
        graphc.jit(lambda a, b: a**b)(np.array([2, 3]), np.array([-1, -2]))


def test_runtime_errors_name_the_line():
    with pytest.raises(IndexError) as info:
        graphc.jit(lambda t, i: t[i])(np.ones(3), np.array([9]))
    assert any("graphc: in gather at tests/runtime/test_runtime.py:" in note for note in info.value.__notes__)


def test_constant_results_are_writeable_copies():
    a, b = graphc.jit(lambda x: (x + 1, np.arange(3.0)))(np.ones(2))
    b[0] = 5.0  # must not change the constant inside the compiled function
    _, b2 = graphc.jit(lambda x: (x + 1, np.arange(3.0)))(np.ones(2))
    assert b2[0] == 0.0


def test_jitted_function_inside_a_trace_is_inlined():
    g = graphc.jit(lambda x: np.sum(np.tanh(x)))
    np.testing.assert_allclose(graphc.grad(g)(np.ones(3)), 1 - np.tanh(1.0) ** 2)


def test_a_training_step_with_results_in_place_equals_the_interpreter(monkeypatch):
    """A GPT loss and gradients whose activations are counted buffers (1 MiB and more): most of
    its kernels write over dying operands, and every gradient equals the reference interpreter's."""
    from graphc.core.pytree import flatten
    from graphc.models import gpt
    from graphc.runtime.codegen import CompiledKernel

    in_place = []
    real = CompiledKernel.call_into

    def spy(self, arrays, given):
        in_place.append(bool(given))
        return real(self, arrays, given)

    monkeypatch.setattr(CompiledKernel, "call_into", spy)
    args, kw = gpt.example_loss_args(batch=4, seq=64, n_vocab=256, d=256, n_layer=1, n_head=4)
    fn = graphc.value_and_grad(gpt.lm_loss)
    jitted = graphc.jit(fn, static_argnames=("n_head",))
    jitted(*args, **kw)
    got = jitted(*args, **kw)  # warm: the pool's buffers in play too
    want = graphc.evaluate(graphc.trace(fn, *args, **kw), *args, **kw)
    for a, b in zip(flatten(got)[0], flatten(want)[0]):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
    assert sum(in_place) >= 4, in_place
