"""Generated Numba kernels: fused GELU / softmax / layer norm against numpy, including special
values (the vectorizable math they call is tested in tests/runtime/test_fastmath.py)."""

import numpy as np
import pytest

import graphc
from graphc.bench import kernels as bench

TINY = np.finfo(np.float32).tiny
EPS = float(np.finfo(np.float32).eps)


def layer_norm_error_bound(x, g, b):
    """How far two float32 computations of ``bench.layer_norm`` may be apart, elementwise. Each
    side's mean and variance are sums of n terms in its own order (the kernel adds blocks of
    ROW_SUM_BLOCK elements in float32 across vector lanes, numpy pairwise): each within (k - 1) *
    eps of the sum of the terms' magnitudes, k = min(n, ROW_SUM_BLOCK). The mean's error moves
    every x - mean; the variance's (of nonnegative terms) scales the result by half its relative
    error; then a few roundings of g * (x - mean) * r + b."""
    from graphc.runtime.fastmath import ROW_SUM_BLOCK

    k = min(x.shape[-1], ROW_SUM_BLOCK)
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    dev = np.abs(x64 - mean)
    r = 1.0 / np.sqrt((dev**2).mean(-1, keepdims=True) + 1e-5)
    scaled = np.abs(g) * dev * r
    d_mean = k * EPS * np.abs(x64).mean(-1, keepdims=True)
    return 2 * (np.abs(g) * r * d_mean + scaled * (k + 4) * EPS + 4 * EPS * (scaled + np.abs(b)))


@pytest.mark.parametrize("name", ["gelu", "softmax", "layer_norm"])
def test_fused_kernels_match_numpy(name):
    fn = getattr(bench, name)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 257)) * 3).astype(np.float32)
    x[0, :5] = [0.0, -0.0, 12.0, -12.0, 50.0]
    args = (
        (x,)
        if name != "layer_norm"
        else (x, rng.standard_normal(257).astype(np.float32), rng.standard_normal(257).astype(np.float32))
    )
    compiled = graphc.jit(fn).compile(*args)
    assert compiled.stats()["fused_kernels"] == 1  # the whole function is one kernel
    got = compiled(*args)
    want = fn(*args)
    assert got.dtype == want.dtype == np.float32
    if name == "layer_norm":  # its row sums: rounding of 257 terms in two orders
        assert np.all(np.abs(got.astype(np.float64) - want) <= layer_norm_error_bound(*args))
    else:  # exp and tanh within 2.5e-7 of numpy's (runtime/fastmath.py), a few roundings more
        assert bench.max_rel_error(got, want) <= 1e-6


def test_fused_kernels_propagate_nan_and_inf():
    x = np.array([[1.0, np.nan, 2.0], [np.inf, 0.0, 1.0], [-np.inf, 0.0, 1.0]], np.float32)
    with np.errstate(all="ignore"):
        for fn in (bench.softmax, bench.gelu):
            got = graphc.jit(fn)(x)
            want = fn(x)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            finite = np.isfinite(want)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["gelu", "softmax", "layer_norm"])
@pytest.mark.parametrize("rows", [512, 513])
def test_threaded_kernels_equal_single_threaded(name, rows):
    """A kernel over >= PARALLEL_MIN_ELEMENTS elements splits its rows over threads (also an odd
    number of rows); the result is bitwise the one-thread result."""
    from graphc.core.ir import walk
    from graphc.runtime import codegen, threads

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, 1024)) * 3).astype(np.float32)
    assert x.size >= codegen.PARALLEL_MIN_ELEMENTS
    g, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    args = (x, g, b) if name == "layer_norm" else (x,)
    compiled = graphc.jit(getattr(bench, name)).compile(*args)
    (node,) = [n for n in walk(compiled.graph.nodes) if n.op.name == "fused"]
    calls = []
    kernel = codegen.CompiledKernel(node, [a.shape for a in args])
    real = kernel.func
    kernel.func = lambda *a: (calls.append(a[-3:-1]), real(*a))
    threads._threads_local.threads = 2
    try:
        threaded = kernel(*args)[0]
    finally:
        del threads._threads_local.threads
    assert sorted(calls) == [(0, rows // 2), (rows // 2, rows)]
    calls.clear()
    with threads.single_threaded():
        single = kernel(*args)[0]
    assert calls == [(0, rows)]
    np.testing.assert_array_equal(threaded, single)
    want = getattr(bench, name)(*args)
    if name == "layer_norm":  # its row sums: rounding of 1,024 terms in two orders
        assert np.all(np.abs(threaded.astype(np.float64) - want) <= layer_norm_error_bound(*args))
    else:
        np.testing.assert_allclose(threaded, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("shape", [(1,), (1, 1), (3, 1), (1, 4), (2, 1, 1), (1, 1, 5)])
def test_row_reductions_of_size_one_rows_and_batches(shape):
    """A kernel whose iteration space has size-1 dims (a batch of one): the operand a reduction
    reads is a row even when all its dims are 1 (it was passed as a scalar: KeyError 'scalar')."""
    fns = [
        lambda x: np.sum(x, axis=-1) + 1.0,
        lambda x: np.max(x, axis=-1, keepdims=True) - x,
        lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True),
        lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
        lambda x: np.sum(x * x, axis=-1) * 2.0,
    ]
    x = (np.arange(np.prod(shape)).reshape(shape) % 5 - 2.5).astype(np.float32)
    for fn in fns:
        got, want = graphc.jit(fn)(x), fn(x)
        assert np.asarray(got).dtype == np.asarray(want).dtype and np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    i = np.arange(np.prod(shape), dtype=np.int64).reshape(shape)
    np.testing.assert_array_equal(graphc.jit(lambda i: np.max(i, axis=-1) * 2)(i), np.max(i, axis=-1) * 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_power_by_a_scalar_exponent_takes_numpys_fast_paths(dtype):
    """numpy's float power loop with a scalar (stride-0) exponent computes -1, 0, 0.5, 1 and 2 as
    1/x, 1, sqrt(x), x and x*x: sqrt(-0.0) is -0.0 and sqrt(-inf) nan where pow gives 0.0 and inf.
    A fused kernel does the same; with an exponent array of the result's shape it is pow."""
    x = np.array([-0.0, 0.0, -np.inf, np.inf, np.nan, -1.0, 4.0, 1e-30], dtype)
    with np.errstate(all="ignore"):
        for e in (0.5, -1.0, 2.0, 1.0, 0.0, 3.0, -0.5):
            c = np.asarray(e, dtype)
            fns = [
                lambda v, e=e: np.exp(v * 0.0) * v**e,  # a Python float: 0-d, stride 0
                lambda v, c=c: (v + 0.0) ** c + 0.0,  # a 0-d array
                lambda v, c=c: np.power(v * 1.0, c.reshape(1, 1)) * 1.0,  # size 1, broadcast: stride 0
                lambda v, c=c: np.power(v * 1.0, np.full(v.shape, c)) * 1.0,  # the result's shape: pow
                lambda v, c=c: np.power(v[:1] * 1.0, c.reshape(1)) * 1.0,  # (1,) with (1,): walked, pow
            ]
            for fn in fns:
                got, want = graphc.jit(fn)(x), fn(x)
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"** {e}")
                real = ~np.isnan(want)  # (the sign of a nan is not numpy's to promise)
                np.testing.assert_array_equal(np.signbit(got[real]), np.signbit(want[real]), err_msg=f"** {e}")
                np.testing.assert_allclose(got, want, rtol=4e-7 if dtype == np.float32 else 1e-15, err_msg=f"** {e}")


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32])
def test_a_float_out_of_an_integers_range_wraps_as_numpys_cast(dtype):
    """numpy's cast of a float to a narrower integer goes through a wider one and wraps on x86-64
    (-1.0 to uint8 is 255, 300.0 is 44), without a warning; a fused kernel gave 0 in its vectorized
    loop and the wrapped value in the tail (Numba's direct conversion is undefined out of range;
    found by the long fuzz run, np.subtract.at on a uint8 array). Values within int32's range,
    where numpy does not warn; 37 elements to have both a vectorized part and a tail."""
    u = (np.arange(37) % 5).astype(dtype)
    v = np.linspace(-300.0, 300.0, 37).astype(np.float32)

    def fn(u, v):
        return (u.astype(np.float32) - v).astype(dtype)

    compiled = graphc.jit(fn).compile(u, v)
    assert compiled.stats()["fused_kernels"] == 1
    want = fn(u, v)
    np.testing.assert_array_equal(compiled(u, v), want)
    np.testing.assert_array_equal(graphc.evaluate(graphc.trace(fn, u, v), u, v), want)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32, np.int8])
def test_integer_arithmetic_wraps_as_numpys(dtype):
    """numpy's integer +, - and * wrap. Numba compiles int64 arithmetic with LLVM's ``nsw`` flag,
    which makes a signed overflow undefined, and LLVM then folds ``x + x == 0`` to ``x == 0`` and
    ``x - 1 > x`` to False: the fused kernel of ``(x + x) // (x + x)`` at the most negative int64
    gave -1 where numpy's 0 // 0 is 0 (found by the long fuzz run, dp2). uint32 * uint32 overflows
    int64, the type Numba computes it in. Values at the dtype's extremes, in a vectorized part and
    a tail (37 elements)."""
    info = np.iinfo(dtype)
    x = np.resize(np.array([info.min, info.max, info.min + 1, info.max - 1, 0, 1], dtype), 37)

    def fn(x):
        one = dtype(1)
        return (x + x == 0, x - one > x, (x * dtype(2)) == 0, x * x, -x < 0)

    compiled = graphc.jit(fn).compile(x)
    assert compiled.stats()["fused_kernels"] >= 1
    for got, want in zip(compiled(x), fn(x)):
        np.testing.assert_array_equal(got, want)
